"""Lecture slides: every lecture as a reveal.js deck (``make slides``), and the slide metadata heuristic.

Each notebook's cells carry ``metadata.slideshow.slide_type`` (committed in the
notebooks, set by ``assign_slide_types``): every ``#``/``##`` section starts a
slide, every ``###`` heading a sub-slide, and the rest continues the current
slide until the next cell would not fit, when it starts a sub-slide. A slide
still taller than the slide area is shrunk in the browser, once MathJax has
typeset it, down to ``MIN_ZOOM``; only what is taller still scrolls.

The decks are the lectures of the README's syllabus; the lab book
(``notebooks/lab/``) has none. Cells tagged ``evidence`` (collapsed checks of
a lecture's claims) are left out of the decks (``DropEvidence``); a slide or
sub-slide that one of them started starts at the next cell instead.

The decks use reveal.js 4.0.2 (the version nbconvert's template is written
for) and require.js, fetched once from the npm registry into ``build/cache``
and checked against pinned sha256 sums, and the same local MathJax 2 as
``make site``; once fetched, the decks build and display offline, and a deck
loads nothing from the network (see ``_TEMPLATE``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import nbformat
from nbconvert import SlidesExporter
from nbconvert.preprocessors import Preprocessor
from traitlets.config import Config

from course_utils.tooling.lecture_form import EVIDENCE
from course_utils.tooling.site import MATHJAX_CONFIG, MATHJAX_HUB_CONFIG, NOTEBOOK_DIR, ROOT, mathjax_source, syllabus

SLIDES_DIR = ROOT / "build" / "slides"
CACHE_DIR = ROOT / "build" / "cache"
# (name, version, sha256 of the npm tarball): nbconvert's reveal template is written for reveal.js 4.0.2 and
# loads it with require.js.
REVEAL = ("reveal.js", "4.0.2", "0c234d5bfe539606c1af4bcc031f0d21ed99e264d90b7859abad34f7e3a0c587")
REQUIRE = ("requirejs", "2.1.22", "963a65233141280c18c125afd8e164b8c45eb270554e0ff3b9737bd78d824ea5")
MATHJAX_URL = f"mathjax/MathJax.js?config={MATHJAX_CONFIG}"  # the local MathJax 2, copied beside the decks
MIN_ZOOM = 0.6  # a slide is shrunk at most this much to fit; a taller one scrolls
WIDTH, HEIGHT = 960, 700  # the slide area reveal.js scales to the screen (nbconvert's defaults)
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
# nbconvert's reveal template, offline and fitted to the slide: no jQuery and no mermaid from a CDN (the decks
# use neither), no widget JavaScript (a widget output shows its still image instead), MathJax told to use the
# STIX-Web fonts of the local copy, and CSS that keeps every slide inside the slide area: figures are scaled
# to fit, long code and long outputs scroll inside their box, and a slide with more than fits scrolls. Its own
# start-up script (footer_js) replaces nbconvert's: it shrinks a tall slide to fit after MathJax has typeset it.
_TEMPLATE = """{%- extends 'index.html.j2' -%}
{% block html_head_js_jquery %}{% endblock html_head_js_jquery %}
{% block html_head_js_mermaidjs %}{% endblock html_head_js_mermaidjs %}
{% block jupyter_widgets %}{% endblock jupyter_widgets %}
{% block html_head_js_mathjax %}
<script type="text/x-mathjax-config">MathJax.Hub.Config(@HUB@);</script>
{{ super() }}
{% endblock html_head_js_mathjax %}
{% block html_head_css %}
<style type="text/css">
.reveal .slides > section, .reveal .slides > section > section {
  box-sizing: border-box; max-height: @HEIGHT@px; overflow-y: auto; }
.reveal .slides section :is(h1, h2, h3, h4) { text-transform: none; }  /* as written: maths keeps its case */
.reveal .slides section img { max-width: 100%; max-height: @FIGURE@px; width: auto; height: auto; }
.reveal .slides section pre { box-sizing: border-box; max-height: @CODE@px; overflow: auto; }
.reveal .slides section .jp-OutputArea-output { overflow-x: auto; }
</style>
{% endblock html_head_css %}
{% block footer_js %}
<script>
// nbconvert's start-up of the deck, except for MathJax: nbconvert re-typesets the slide shown with
// MathJax.Hub.Rerender, which runs on a queue of its own in 50 ms steps, so a slide measured at once lacks its
// formulas. Here the slide is re-typeset through MathJax's main queue and fitted after it.
require(["reveal.js/dist/reveal.js", "reveal.js/plugin/notes/notes.js"], function (Reveal, RevealNotes) {
  Reveal.initialize({controls: true, progress: true, history: true, transition: "{{ reveal_transition }}",
                     slideNumber: "{{ reveal_number }}", plugins: [RevealNotes],
                     width: {{ reveal_width }}, height: {{ reveal_height }}});
  // Shrink a slide whose cells are taller than the slide until it fits (CSS zoom, down to @MINZOOM@); what still
  // does not fit scrolls. A zoomed slide is laid out wider (its width is the slide area's, @WIDTH@ / zoom CSS
  // pixels), so its text re-wraps and a figure held to the width grows: it is measured again at each zoom.
  function fit(slide) {
    slide.style.zoom = ""; slide.style.maxHeight = "none";
    var zoom = 1;
    // each step shrinks the zoom by at least 1% (the headroom against rounding) or ends at @MINZOOM@
    while (zoom > @MINZOOM@ && slide.scrollHeight * zoom > @HEIGHT@) {
      zoom = Math.max(@MINZOOM@, 0.99 * @HEIGHT@ / slide.scrollHeight);
      slide.style.zoom = String(zoom);
    }
    slide.style.zoom = zoom < 1 ? String(zoom) : "";
    slide.style.maxHeight = (@HEIGHT@ / zoom) + "px";
    Reveal.layout();
  }
  function show() {
    var slide = Reveal.getCurrentSlide();
    fit(slide);
    MathJax.Hub.Queue(["Rerender", MathJax.Hub, slide], [fit, slide]);
    slide.querySelectorAll("img").forEach(function (img) {  // a figure has its height once decoded
      if (!img.complete) img.addEventListener("load", function () { fit(slide); }, {once: true});
    });
  }
  Reveal.on("ready", show);
  Reveal.on("slidechanged", show);
});
</script>
{% endblock footer_js %}
"""


def _template() -> str:
    values = {"@HUB@": json.dumps(MATHJAX_HUB_CONFIG), "@HEIGHT@": str(HEIGHT),
              "@FIGURE@": str(HEIGHT * 6 // 10), "@CODE@": str(HEIGHT // 2),
              "@MINZOOM@": str(MIN_ZOOM), "@WIDTH@": str(WIDTH)}
    return re.sub("|".join(values), lambda m: values[m[0]], _TEMPLATE)


def estimated_height(cell) -> float:
    """About how many pixels of a 960 x 700 slide a cell fills in a deck.

    A linear fit to every cell of the course, each measured alone on a slide in
    Chromium (``tests/browser_site_check.py`` measures the result): markdown by
    its wrapped lines, headings and table rows; code by its lines (long code
    scrolls inside its box), its text output lines and its figures.
    """
    if cell.cell_type == "markdown":
        lines = cell.source.splitlines()
        wrapped = sum(max(1, -(-len(line) // 75)) for line in lines
                      if line.strip() and not line.startswith(("#", "|", "$$")))
        headings = sum(line.startswith("#") for line in lines)
        table_rows = sum(line.startswith("|") for line in lines)
        return 58 + 28 * wrapped + 86 * headings + 58 * table_rows
    if cell.cell_type != "code":
        return 0.0
    outputs = cell.get("outputs", [])
    figures = sum("image/png" in o.get("data", {}) for o in outputs)
    text_lines = sum(len((o.get("text", "") if o.get("output_type") == "stream"
                          else o.get("data", {}).get("text/plain", "")).splitlines())
                     for o in outputs if "image/png" not in o.get("data", {}))
    return 173 + 11 * min(len(cell.source.splitlines()), 30) + 34 * text_lines + 449 * figures


SLIDE_BUDGET = 700  # estimated pixels of cells per slide before the next cell starts a sub-slide


def assign_slide_types(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """Set ``metadata.slideshow.slide_type`` on every cell (in place) and return the notebook.

    A markdown cell with a ``# `` or ``## `` heading starts a slide; one with a
    ``### `` heading starts a sub-slide; any other cell continues the slide it
    follows ("-") while the slide's cells fit in ``SLIDE_BUDGET``
    (``estimated_height``), and otherwise starts a sub-slide. A cell taller
    than a slide on its own gets a slide to itself, which scrolls.
    """
    filled = 0.0
    for cell in nb.cells:
        height = estimated_height(cell)
        kind = "-"
        lines = cell.source.splitlines() if cell.cell_type == "markdown" else []
        if any(line.startswith(("# ", "## ")) for line in lines):
            kind = "slide"
        elif any(line.startswith("### ") for line in lines) or (filled and filled + height > SLIDE_BUDGET):
            kind = "subslide"
        filled = height if kind != "-" else filled + height
        cell.metadata["slideshow"] = {"slide_type": kind}
    return nb


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def npm_package(name: str, version: str, sha256: str, cache: Path = CACHE_DIR) -> Path:
    """The unpacked npm package ``name@version``, fetched with ``npm pack`` on first use and checksummed.

    Raises:
        RuntimeError: If npm is missing or the tarball's sha256 is not the pinned one.
    """
    folder = cache / f"{name}-{version}"
    if (folder / "package.json").is_file():
        return folder
    cache.mkdir(parents=True, exist_ok=True)
    tarball = cache / f"{name}-{version}.tgz"
    if not tarball.is_file():
        npm = shutil.which("npm")
        if npm is None:
            raise RuntimeError(f"`make slides` needs npm to fetch {name} once (apt install npm), or put "
                               f"{tarball.name} into {cache}")
        subprocess.run([npm, "pack", f"{name}@{version}", "--silent"], cwd=cache, check=True, capture_output=True)
    if _sha256(tarball) != sha256:
        raise RuntimeError(f"{tarball} does not have the pinned sha256 {sha256}: delete it and run again")
    unpacked = cache / f"unpacked-{name}"
    shutil.rmtree(unpacked, ignore_errors=True)
    with tarfile.open(tarball) as archive:
        archive.extractall(unpacked, filter="data")
    shutil.rmtree(folder, ignore_errors=True)
    (unpacked / "package").rename(folder)
    shutil.rmtree(unpacked)
    return folder


_BREAKS = {"slide": 2, "subslide": 1}  # how strongly a slide type breaks the deck; any other type continues it


class DropEvidence(Preprocessor):
    """Leave out the cells tagged ``evidence``; a slide break one of them made moves to the next cell shown.

    The committed slide metadata counts the evidence cells (``assign_slide_types``):
    a cell that started a slide or sub-slide hands its break to the next cell
    that is shown (not ``skip`` or ``notes``) unless that one breaks as much already.
    """

    def preprocess(self, nb, resources):
        kept, carried = [], "-"
        for cell in nb.cells:
            kind = cell.metadata.get("slideshow", {}).get("slide_type", "-")
            if EVIDENCE in cell.metadata.get("tags", []):
                carried = max(carried, kind, key=lambda k: _BREAKS.get(k, 0))
                continue
            kept.append(cell)
            if kind in ("skip", "notes"):
                continue
            if _BREAKS.get(carried, 0) > _BREAKS.get(kind, 0):
                cell.metadata["slideshow"] = {**cell.metadata.get("slideshow", {}), "slide_type": carried}
            carried = "-"
        nb.cells = kept
        return nb, resources


def exporter() -> SlidesExporter:
    """nbconvert's reveal.js exporter, set up for decks that display offline (see ``_TEMPLATE``), without evidence."""
    priority = [m for m in SlidesExporter().default_config.NbConvertBase.display_data_priority if m != WIDGET_VIEW]
    config = Config({"NbConvertBase": {"display_data_priority": priority}})
    return SlidesExporter(config=config, raw_template=_template(), reveal_url_prefix="reveal.js",
                          preprocessors=[DropEvidence],  # before the template's reveal metadata step
                          reveal_theme="white",  # its font is bundled (most other themes load Google fonts)
                          reveal_width=str(WIDTH), reveal_height=str(HEIGHT), mathjax_url=MATHJAX_URL,
                          require_js_url="require.js")  # the local copy: the deck loads reveal.js through it


def build_slides(out: Path = SLIDES_DIR, notebooks: Path = NOTEBOOK_DIR) -> list[Path]:
    """Write one reveal.js deck per lecture (``NN_name.slides.html``) into ``out``, with reveal.js and MathJax.

    The lectures are the README syllabus's (never the lab book's); cells
    tagged ``evidence`` are left out (``exporter``).

    Returns:
        The written decks, in syllabus order.
    """
    out = Path(out)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    reveal = npm_package(*REVEAL)
    for part in ("dist", "plugin"):
        shutil.copytree(reveal / part, out / "reveal.js" / part)
    shutil.copy2(npm_package(*REQUIRE) / "require.js", out / "require.js")
    shutil.copytree(mathjax_source(), out / "mathjax")
    deck_exporter = exporter()
    decks = []
    for entry in syllabus():
        nb = nbformat.read(Path(notebooks) / entry.file, as_version=4)
        body, _ = deck_exporter.from_notebook_node(nb, resources={"metadata": {"name": entry.title}})
        deck = out / entry.file.replace(".ipynb", ".slides.html")
        deck.write_text(body, encoding="utf-8")
        decks.append(deck)
    return decks


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=SLIDES_DIR, help="output folder (default: build/slides)")
    args = parser.parse_args(argv)
    decks = build_slides(args.out)
    print(f"wrote {len(decks)} decks to {args.out}; open one of them, e.g. {decks[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
