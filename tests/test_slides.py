"""`make slides`: one reveal.js deck per lecture, with committed slide breaks, local reveal.js and maths.

The lab book has no decks, and cells tagged ``evidence`` are left out of them.

tests/browser_site_check.py (``make browser-test``) visits every slide in a browser.
"""

from __future__ import annotations

import re

import nbformat
import pytest

from course_utils.tooling import slides

from conftest import LAB, NOTEBOOKS
from test_site import NETWORK, WIDGET_VIEW, widget_notebook


def test_notebooks_carry_sensible_slide_metadata():
    for path in NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        kinds = [c.metadata.get("slideshow", {}).get("slide_type") for c in nb.cells]
        assert None not in kinds, f"{path.name}: every cell has slideshow metadata (run slides.assign_slide_types)"
        assert kinds[0] == "slide", f"{path.name}: the title starts the deck"
        assert 8 <= kinds.count("slide") <= 40, f"{path.name}: {kinds.count('slide')} slides for {len(kinds)} cells"
        expected = [c.metadata["slideshow"]["slide_type"] for c in slides.assign_slide_types(nb).cells]
        assert kinds == expected, f"{path.name}: slide metadata differs from the heuristic; re-run assign_slide_types"


@pytest.fixture(scope="module")
def decks(tmp_path_factory):
    out = tmp_path_factory.mktemp("slides")
    return out, slides.build_slides(out)


def test_one_deck_per_notebook_with_local_assets(decks):
    out, written = decks
    assert [d.name for d in written] == [p.stem + ".slides.html" for p in NOTEBOOKS]
    assert sorted(p.name for p in out.rglob("*.slides.html")) == sorted(d.name for d in written), \
        f"the lectures' decks and no others (the lab book {[p.name for p in LAB]} has none)"
    assert (out / "reveal.js" / "dist" / "reveal.js").is_file() and (out / "require.js").is_file()
    assert (out / "mathjax" / "MathJax.js").is_file()
    for deck in written:
        text = deck.read_text(encoding="utf-8")
        assert '"reveal.js/dist/reveal.js"' in text and 'src="require.js"' in text
        assert 'src="mathjax/MathJax.js' in text
        assert not NETWORK.search(text), f"{deck.name}: loads {NETWORK.search(text)[0]!r} from the network"
        assert text.count("<section") >= 8, f"{deck.name}: has its slides"
        theme = re.search(r'<link href="(reveal.js/dist/theme/[a-z]+\.css)"', text)
        assert theme, f"{deck.name}: links a reveal.js theme"
        theme_css = (out / theme[1]).read_text(encoding="utf-8")
        assert not NETWORK.search(theme_css), f"{theme[1]} loads fonts from the network"


def test_a_widget_output_shows_its_still_image_and_no_widget_javascript():
    body, _ = slides.exporter().from_notebook_node(widget_notebook())
    assert re.search(r'<img[^>]+src="data:image/png;base64,', body), "the widget's still image is shown"
    assert WIDGET_VIEW not in body and "html-manager" not in body, "no widget view, no widget JavaScript"
    assert not NETWORK.search(body)


def test_a_deck_starts_reveal_once_and_fits_a_slide_after_mathjax_has_typeset_it():
    from nbformat.v4 import new_markdown_cell, new_notebook

    body, _ = slides.exporter().from_notebook_node(new_notebook(cells=[new_markdown_cell("# Title $x^2$")]))
    assert body.count("Reveal.initialize(") == 1, "the template's start-up replaces nbconvert's (footer_js)"
    assert "width: 960, height: 700" in body and "plugins: [RevealNotes]" in body, "with nbconvert's options"
    # MathJax.Hub.Rerender runs on a queue of its own, in 50 ms steps: a fit at the same time measures the slide
    # without its formulas (tests/browser_site_check.py checks that every formula is typeset when measured).
    assert "MathJax.Hub.Rerender(" not in body, "the slide is re-typeset only through MathJax.Hub.Queue"
    assert '["Rerender", MathJax.Hub, slide]' in body, "the slide shown is re-typeset (it was typeset hidden)"


def test_a_tampered_download_is_rejected(tmp_path):
    name, version, _ = slides.REQUIRE
    (tmp_path / f"{name}-{version}.tgz").write_bytes(b"not the real tarball")
    with pytest.raises(RuntimeError, match="pinned sha256"):
        slides.npm_package(name, version, slides.REQUIRE[2], cache=tmp_path)


def test_cells_are_packed_by_estimated_height():
    from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

    short = "One short paragraph."
    figure = new_code_cell("plot()", outputs=[nbformat.v4.new_output("display_data", data={"image/png": "iVBOR"})])
    nb = new_notebook(cells=[new_markdown_cell("## A section"), new_markdown_cell(short), new_markdown_cell(short),
                             figure, new_markdown_cell(short), new_markdown_cell("### Sub"), new_markdown_cell(short)])
    kinds = [c.metadata["slideshow"]["slide_type"] for c in slides.assign_slide_types(nb).cells]
    assert kinds == ["slide", "-", "-", "subslide", "subslide", "subslide", "-"], kinds  # the figure fills its own
    assert slides.estimated_height(figure) > slides.SLIDE_BUDGET / 2 > slides.estimated_height(nb.cells[1])


def _kinds(nb) -> list[str]:
    return [c.metadata.get("slideshow", {}).get("slide_type", "-") for c in nb.cells]


def test_the_decks_leave_out_the_evidence_cells_and_keep_the_slide_breaks(decks):
    out, written = decks
    assert any("evidence" in c.metadata.get("tags", []) for p in NOTEBOOKS for c in nbformat.read(p, as_version=4).cells), \
        "no lecture has an evidence cell any more: this test checks nothing"
    for path, deck in zip(NOTEBOOKS, written):
        nb = nbformat.read(path, as_version=4)
        text = deck.read_text(encoding="utf-8")
        assert "celltag_evidence" not in text, f"{deck.name}: an evidence cell is in the deck"
        shown = [c for c in nb.cells if "evidence" not in c.metadata.get("tags", [])]
        assert text.count("jp-Cell jp-CodeCell") == sum(c.cell_type == "code" for c in shown), \
            f"{deck.name}: every other code cell is in the deck"
        kinds = _kinds(slides.DropEvidence().preprocess(nb, {})[0])
        assert kinds[0] == "slide" and text.count("<section") == 2 * kinds.count("slide") + kinds.count("subslide"), \
            f"{deck.name}: two <section>s per slide (it starts a sub-slide), one per sub-slide"


def test_an_evidence_cell_hands_its_slide_break_to_the_next_cell_shown():
    from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

    def cell(kind, evidence=False, source="x = 1"):
        return new_code_cell(source, metadata={"slideshow": {"slide_type": kind},
                                               "tags": ["evidence"] if evidence else []})

    nb = new_notebook(cells=[new_markdown_cell("# T", metadata={"slideshow": {"slide_type": "slide"}}),
                             cell("-"), cell("subslide", True), cell("-"),  # the sub-slide starts at the next cell
                             cell("-", True), cell("fragment"),  # nothing to hand on
                             cell("slide", True), cell("subslide", True), cell("notes"), cell("-"),  # past the notes
                             cell("subslide", True), cell("slide"),  # the next cell breaks more already
                             cell("-", source="the last")])
    kept, _ = slides.DropEvidence().preprocess(nb, {})
    assert _kinds(kept) == ["slide", "-", "subslide", "fragment", "notes", "slide", "slide", "-"]
    assert kept.cells[-1].source == "the last"
    body, _ = slides.exporter().from_notebook_node(new_notebook(cells=[
        new_markdown_cell("# Title"), cell("-", True, "assert 'EVIDENCE' + 'SOURCE'"), cell("-", source="shown_cell = 2")]))
    assert "EVIDENCE" not in body and "shown_cell" in body, "the exporter leaves evidence out"
