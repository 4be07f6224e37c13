"""The instructor guide stays in step with the notebooks; headings, alt text and colour maps are accessible."""

from __future__ import annotations

import re

import nbformat

from course_utils.experiments import plotting
from course_utils.tooling import guide

from conftest import NOTEBOOKS, ROOT

# Colour maps that stay readable with the common colour-vision deficiencies (perceptually uniform, or ColorBrewer
# diverging maps chosen for colour-blind readers).
SAFE_CMAPS = {"viridis", "cividis", "magma", "inferno", "plasma", "PuOr", "BrBG"}


def test_instructor_guide_is_up_to_date():
    text = guide.GUIDE.read_text(encoding="utf-8")
    block = text.split(guide.BEGIN, 1)[1].split(guide.END, 1)[0].strip()
    assert block == guide.render(), "docs/instructor_guide.md is stale: run `python -m course_utils.tooling.guide`"
    for path in NOTEBOOKS:
        assert f"`notebooks/{path.name}`" in block


def _headings(markdown: str) -> list[int]:
    markdown = re.sub(r"```.*?```", "", markdown, flags=re.S)
    return [len(m.group(1)) for m in re.finditer(r"^(#{1,6}) \S", markdown, re.M)]


def test_headings_are_in_order_one_title_no_skipped_levels():
    documents = {p.name: "\n\n".join(c.source for c in nbformat.read(p, as_version=4).cells if c.cell_type == "markdown")
                 for p in NOTEBOOKS}
    documents["README.md"] = (ROOT / "README.md").read_text(encoding="utf-8")
    documents["instructor_guide.md"] = guide.GUIDE.read_text(encoding="utf-8")
    for name, text in documents.items():
        levels = _headings(text)
        assert levels and levels[0] == 1 and levels.count(1) == 1, f"{name}: one level-1 title, first"
        for before, after in zip(levels, levels[1:]):
            assert after <= before + 1, f"{name}: a heading skips from level {before} to {after}"


def test_images_in_markdown_have_alt_text():
    sources = [c.source for p in NOTEBOOKS for c in nbformat.read(p, as_version=4).cells if c.cell_type == "markdown"]
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
    for path in NOTEBOOKS:
        code = "\n".join(c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code")
        assert not re.search(r"cmap\s*=\s*['\"](jet|rainbow|hsv|RdYlGn|gist_rainbow)", code), f"{path.name}: unsafe colour map"
