"""`make site`: every notebook rendered to HTML with its outputs, an index in syllabus order, local maths."""

from __future__ import annotations

import re

import pytest

from course_utils.tooling import site

from conftest import NOTEBOOKS


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("site")
    pages = site.build_site(out)
    return out, pages


def test_every_notebook_has_a_page_and_the_index_lists_them_in_order(built):
    out, pages = built
    entries = site.syllabus()
    assert [e.file for e in entries] == [p.name for p in NOTEBOOKS], "the README's syllabus lists every notebook in order"
    assert pages[0].name == "index.html" and [p.name for p in pages[1:]] == [e.page for e in entries]
    index = (out / "index.html").read_text(encoding="utf-8")
    links = re.findall(r'href="([^"]+\.html)"', index)
    assert links == [e.page for e in entries]
    assert '<html lang="en">' in index and "<h1>" in index


def test_pages_have_outputs_local_maths_and_working_links(built):
    out, pages = built
    for page in pages[1:]:
        text = page.read_text(encoding="utf-8")
        assert "data:image/png;base64" in text, f"{page.name}: figures are embedded"
        assert 'src="mathjax/MathJax.js' in text and "STIX-Web" in text, f"{page.name}: maths from the local MathJax"
        assert not re.search(r'<script[^>]+src="https?://', text), f"{page.name}: no script from the network"
        assert ".ipynb)" not in text and 'href="notebooks/' not in text
        for link in set(re.findall(r'href="(\d\d_[a-z0-9_]+\.html|index\.html)"', text)):
            assert (out / link).is_file(), f"{page.name} links to a missing page {link}"
    assert (out / "mathjax" / "MathJax.js").is_file()
    assert (out / "mathjax" / "config" / "TeX-AMS-MML_HTMLorMML-full.js").is_file()
    first = pages[1].read_text(encoding="utf-8")
    assert "index.html" in first and pages[2].name in first  # navigation: index and next
