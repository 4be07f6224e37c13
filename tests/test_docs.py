"""The instructor guide stays in step with the notebooks (and names the lab book's); headings, alt text and colour maps
are accessible, in the lectures and the lab book."""

from __future__ import annotations

import re

import nbformat

from course_utils.experiments import plotting
from course_utils.tooling import guide

from conftest import LAB, NOTEBOOKS, ROOT

# Colour maps that stay readable with the common colour-vision deficiencies (perceptually uniform, or ColorBrewer
# diverging maps chosen for colour-blind readers).
SAFE_CMAPS = {"viridis", "cividis", "magma", "inferno", "plasma", "PuOr", "BrBG"}


def test_instructor_guide_is_up_to_date():
    text = guide.GUIDE.read_text(encoding="utf-8")
    block = text.split(guide.BEGIN, 1)[1].split(guide.END, 1)[0].strip()
    assert block == guide.render(), "docs/instructor_guide.md is stale: run `python -m course_utils.tooling.guide`"
    for path in NOTEBOOKS:
        assert f"`notebooks/{path.name}`" in block


def test_the_guide_names_each_lab_notebook_in_its_lectures_evidence(tmp_path):
    block = guide.GUIDE.read_text(encoding="utf-8").split(guide.BEGIN, 1)[1].split(guide.END, 1)[0]
    sections = block.split("\n### ")
    for path in LAB:
        (section,) = [s for s in sections if f"`notebooks/lab/{path.name}`" in s]
        assert f"`notebooks/{path.name[:2]}_" in section, f"lab/{path.name} is named under lecture {path.name[:2]}"
        heading = guide.first_heading(nbformat.read(path, as_version=4))
        assert heading and f"`notebooks/lab/{path.name}`: {heading} (" in section.split("Evidence:", 1)[1]
    lab = tmp_path / "lab"
    lab.mkdir()
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("import torch"),
                                         nbformat.v4.new_markdown_cell("Intro.\n\n# Lab 03 · Long keys, $D_k$\n\n## More"),
                                         nbformat.v4.new_code_cell("assert 1 < 2\nfor i in range(2):\n    assert i < 2")])
    nbformat.write(nb, lab / "03_long_keys.ipynb")
    nbformat.write(nb, lab / "03_more.ipynb")
    lines = guide.lab_lines(("lab/03_long_keys.ipynb", "lab/03_more.ipynb"), tmp_path)
    assert lines[0].startswith("* In the lab book (optional, never graded;") and len(lines) == 3
    assert lines[1:] == ["  * `notebooks/lab/03_long_keys.ipynb`: Lab 03 · Long keys, $D_k$ (2 `assert` statements)",
                         "  * `notebooks/lab/03_more.ipynb`: Lab 03 · Long keys, $D_k$ (2 `assert` statements)"]
    assert guide.lab_lines((), tmp_path) == [], "a lecture without a lab book: no line"


def _headings(markdown: str) -> list[int]:
    markdown = re.sub(r"```.*?```", "", markdown, flags=re.S)
    return [len(m.group(1)) for m in re.finditer(r"^(#{1,6}) \S", markdown, re.M)]


def test_headings_are_in_order_one_title_no_skipped_levels():
    documents = {p.name: "\n\n".join(c.source for c in nbformat.read(p, as_version=4).cells if c.cell_type == "markdown")
                 for p in NOTEBOOKS + LAB}
    documents["README.md"] = (ROOT / "README.md").read_text(encoding="utf-8")
    documents["instructor_guide.md"] = guide.GUIDE.read_text(encoding="utf-8")
    for name, text in documents.items():
        levels = _headings(text)
        assert levels and levels[0] == 1 and levels.count(1) == 1, f"{name}: one level-1 title, first"
        for before, after in zip(levels, levels[1:]):
            assert after <= before + 1, f"{name}: a heading skips from level {before} to {after}"


def test_images_in_markdown_have_alt_text():
    sources = [c.source for p in NOTEBOOKS + LAB for c in nbformat.read(p, as_version=4).cells
               if c.cell_type == "markdown"]
    sources += [(ROOT / "README.md").read_text(encoding="utf-8"), guide.GUIDE.read_text(encoding="utf-8")]
    for text in sources:
        assert not re.search(r"!\[\s*\]\(", text), "a markdown image without alt text"
        for tag in re.findall(r"<img\b[^>]*>", text):
            assert re.search(r'\balt="[^"]+"', tag), f"an <img> without alt text: {tag}"


def test_figures_use_colour_blind_safe_colour_maps():
    assert plotting.ATTENTION_CMAP in SAFE_CMAPS
    code = (ROOT / "course_utils" / "experiments" / "plotting.py").read_text(encoding="utf-8")
    used = set(re.findall(r'cmap="([A-Za-z_]+)"', code))
    assert used <= SAFE_CMAPS, f"colour maps outside the safe set: {used - SAFE_CMAPS}"
    rc = (ROOT / "course_utils" / "matplotlibrc").read_text(encoding="utf-8")
    assert re.search(r"^image\.cmap\s*:\s*viridis", rc, re.M)
    for path in NOTEBOOKS + LAB:
        code = "\n".join(c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code")
        assert not re.search(r"cmap\s*=\s*['\"](jet|rainbow|hsv|RdYlGn|gist_rainbow)", code), f"{path.name}: unsafe colour map"
