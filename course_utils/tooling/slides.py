"""Lecture slides: every notebook as a reveal.js deck (``make slides``), and the slide metadata heuristic.

Each notebook's cells carry ``metadata.slideshow.slide_type`` (committed in the
notebooks, set by ``assign_slide_types``): every ``#``/``##`` section starts a
slide, every ``###`` heading and every figure a sub-slide, and the rest
continues the current slide, so a deck has a few dozen slides rather than one
per cell. The decks use reveal.js 4.0.2 (the version nbconvert's template is
written for) and require.js, fetched once from the npm registry into
``build/cache`` and checked against pinned sha256 sums, and the local MathJax
of ``make site``; once fetched, the decks build and display offline.
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import nbformat
from nbconvert import SlidesExporter

from course_utils.tooling.site import NOTEBOOK_DIR, ROOT, render_offline, syllabus

SLIDES_DIR = ROOT / "build" / "slides"
CACHE_DIR = ROOT / "build" / "cache"
# (name, version, sha256 of the npm tarball): nbconvert's reveal template is written for reveal.js 4.0.2 and
# loads it with require.js.
REVEAL = ("reveal.js", "4.0.2", "0c234d5bfe539606c1af4bcc031f0d21ed99e264d90b7859abad34f7e3a0c587")
REQUIRE = ("requirejs", "2.1.22", "963a65233141280c18c125afd8e164b8c45eb270554e0ff3b9737bd78d824ea5")


def assign_slide_types(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """Set ``metadata.slideshow.slide_type`` on every cell (in place) and return the notebook.

    A markdown cell with a ``# `` or ``## `` heading starts a slide; one with a
    ``### `` heading starts a sub-slide; a code cell whose stored outputs
    include a figure starts a sub-slide (a figure needs the room); every other
    cell continues the slide it follows ("-").
    """
    for cell in nb.cells:
        kind = "-"
        if cell.cell_type == "markdown":
            lines = cell.source.splitlines()
            if any(line.startswith(("# ", "## ")) for line in lines):
                kind = "slide"
            elif any(line.startswith("### ") for line in lines):
                kind = "subslide"
        elif cell.cell_type == "code" and any("image/png" in o.get("data", {}) for o in cell.get("outputs", [])):
            kind = "subslide"
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


def build_slides(out: Path = SLIDES_DIR, notebooks: Path = NOTEBOOK_DIR) -> list[Path]:
    """Write one reveal.js deck per notebook (``NN_name.slides.html``) into ``out``, with reveal.js and MathJax.

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
    exporter = SlidesExporter()
    exporter.reveal_url_prefix = "reveal.js"
    exporter.reveal_theme = "simple"
    exporter.reveal_scroll = True  # long code cells scroll instead of overflowing
    exporter.require_js_url = "require.js"  # the local copy: the deck loads reveal.js through require.js
    decks = []
    for entry in syllabus():
        nb = nbformat.read(Path(notebooks) / entry.file, as_version=4)
        body = render_offline(exporter, nb, entry.title, out)
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
