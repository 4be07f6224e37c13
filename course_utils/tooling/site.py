"""Render the executed notebooks to a static HTML site, offline (``make site``).

Every notebook becomes ``build/site/NN_name.html`` with its outputs, links
between notebooks point at the HTML pages, each page has previous / index /
next links, and ``index.html`` lists the notebooks in syllabus order with the
README's concepts, prerequisites and minutes. Maths is rendered by a local copy
of MathJax 2 (from the ``jupyter-server-mathjax`` package), so the site
builds and displays without a network. The site is built, not committed.
"""

from __future__ import annotations

import argparse
import html
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import nbformat
from nbconvert import HTMLExporter
from nbformat.v4 import new_markdown_cell

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK_DIR = ROOT / "notebooks"
SITE_DIR = ROOT / "build" / "site"
MATHJAX_URL = "mathjax/MathJax.js?config=TeX-AMS-MML_HTMLorMML-full,Safe"  # configs shipped by jupyter-server-mathjax
# jupyter-server-mathjax ships the STIX-Web fonts only (no TeX fonts): tell MathJax to use them.
_MATHJAX_FONTS = """<script type="text/x-mathjax-config">
MathJax.Hub.Config({"HTML-CSS": {availableFonts: [], preferredFont: null, webFont: "STIX-Web", imageFont: null}});
</script>
"""
_EMPTY_SCRIPT = re.compile(r'<script src="">\s*</script>\n?')
_ROW = re.compile(r"^\|\s*\[(?P<title>[^\]]+)\]\(notebooks/(?P<file>[^)]+\.ipynb)\)\s*\|(?P<concepts>[^|]*)\|"
                  r"(?P<prereqs>[^|]*)\|(?P<minutes>[^|]*)\|\s*$")
_LINK = re.compile(r"\]\((?:notebooks/)?(\d\d_[a-z0-9_]+)\.ipynb\)")


@dataclass(frozen=True)
class Entry:
    """One row of the README's syllabus table."""

    title: str  # "03 · Self-attention from scratch"
    file: str  # "03_self_attention.ipynb"
    concepts: str  # what the notebook covers (markdown)
    prerequisites: str  # earlier notebooks
    minutes: str  # measured CPU minutes

    @property
    def page(self) -> str:
        """The HTML page's file name."""
        return self.file.replace(".ipynb", ".html")


def syllabus(readme: Path = ROOT / "README.md") -> list[Entry]:
    """The syllabus table of README.md, in order."""
    entries = []
    for line in readme.read_text(encoding="utf-8").splitlines():
        match = _ROW.match(line)
        if match:
            entries.append(Entry(match["title"].strip(), match["file"].strip(), match["concepts"].strip(),
                                 match["prereqs"].strip(), match["minutes"].strip()))
    return entries


def _mathjax_source() -> Path:
    import jupyter_server_mathjax

    return Path(jupyter_server_mathjax.__file__).parent / "static"


def render_offline(exporter: HTMLExporter, nb: nbformat.NotebookNode, title: str, out: Path) -> str:
    """Export ``nb`` with local MathJax (copied into ``out/mathjax`` once) and no script from a CDN.

    Used by the site and by the slides (``SlidesExporter`` is an ``HTMLExporter``).
    """
    if not (out / "mathjax").is_dir():
        shutil.copytree(_mathjax_source(), out / "mathjax")
    exporter.mathjax_url = MATHJAX_URL
    exporter.jquery_url = ""  # not used by the pages
    body, _ = exporter.from_notebook_node(nb, resources={"metadata": {"name": title}})
    body = body.replace("<!-- Load mathjax -->", _MATHJAX_FONTS + "<!-- Load mathjax -->", 1)
    return _EMPTY_SCRIPT.sub("", body)  # template slots left empty on purpose (no CDN)


def _navigation(entries: list[Entry], i: int) -> str:
    parts = []
    if i > 0:
        parts.append(f"[← {entries[i - 1].title}]({entries[i - 1].page})")
    parts.append("[index](index.html)")
    if i + 1 < len(entries):
        parts.append(f"[{entries[i + 1].title} →]({entries[i + 1].page})")
    return " · ".join(parts)


def _markdown_inline(text: str) -> str:
    """The little markdown the syllabus uses (`code`), as HTML."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(text))


def _index_page(entries: list[Entry]) -> str:
    rows = "\n".join(
        f'<tr><td><a href="{e.page}">{html.escape(e.title)}</a></td><td>{_markdown_inline(e.concepts)}</td>'
        f"<td>{html.escape(e.prerequisites)}</td><td>{html.escape(e.minutes)}</td></tr>"
        for e in entries
    )
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Attention, from the RNN bottleneck to the transformer block</title>
<style>
body {{ font-family: system-ui, sans-serif; max-width: 70rem; margin: 2rem auto; padding: 0 1rem; line-height: 1.5; }}
table {{ border-collapse: collapse; }} th, td {{ border: 1px solid #999; padding: 0.4rem 0.6rem; vertical-align: top; }}
th {{ background: #eee; text-align: left; }} a {{ color: #0b5394; }}
</style>
</head>
<body>
<main>
<h1>Attention, from the RNN bottleneck to the transformer block</h1>
<p>The course's notebooks, executed, in the order they are meant to be read. Each page shows the code and every
output as the tests check them; to run them yourself, clone the repository and run <code>make lab</code>.</p>
<h2>Syllabus</h2>
<table>
<thead><tr><th scope="col">notebook</th><th scope="col">concepts</th><th scope="col">prerequisites</th>
<th scope="col">CPU minutes</th></tr></thead>
<tbody>
{rows}
</tbody>
</table>
</main>
</body>
</html>
"""


def build_site(out: Path = SITE_DIR, notebooks: Path = NOTEBOOK_DIR) -> list[Path]:
    """Render every notebook of the syllabus, an index and a local MathJax into ``out``.

    Returns:
        The written HTML files, index first.

    Raises:
        FileNotFoundError: If a notebook listed in the README is missing.
    """
    entries = syllabus()
    out = Path(out)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    exporter = HTMLExporter(template_name="lab")
    exporter.require_js_url = ""  # no widgets: nothing to load
    written = [out / "index.html"]
    written[0].write_text(_index_page(entries), encoding="utf-8")
    for i, entry in enumerate(entries):
        nb = nbformat.read(Path(notebooks) / entry.file, as_version=4)
        for cell in nb.cells:
            if cell.cell_type == "markdown":
                cell.source = _LINK.sub(r"](\1.html)", cell.source)
        navigation = _navigation(entries, i)
        nb.cells.insert(0, new_markdown_cell(navigation))
        nb.cells.append(new_markdown_cell(navigation))
        body = render_offline(exporter, nb, entry.title, out)
        page = out / entry.page
        page.write_text(body, encoding="utf-8")
        written.append(page)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=SITE_DIR, help="output folder (default: build/site)")
    args = parser.parse_args(argv)
    pages = build_site(args.out)
    print(f"wrote {len(pages)} pages to {args.out}; open {args.out / 'index.html'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
