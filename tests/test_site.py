"""`make site`: Sphinx + MyST-NB + sphinx-book-theme, built from the committed outputs, offline.

Static checks of a site built into a temporary folder: pages and sidebar in
the README's syllabus order, local maths, nothing loaded from the network,
download files (the notebook and its student version), launch buttons, widget
outputs shown as their still image. tests/browser_site_check.py (``make
browser-test``) checks the same site in a browser.
"""

from __future__ import annotations

import re

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from course_utils.tooling import site

from conftest import NOTEBOOKS

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
PNG = ("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==")
# A <script>, <link> or <img> that loads from elsewhere, a module import, or a stylesheet import from the network.
NETWORK = re.compile(r"<(?:script|link|img|iframe)\b[^>]*\b(?:src|href)=[\"']?(?:https?:)?//"
                     r"|\bimport\b[^;\n]*\bfrom\s*[\"'](?:https?:)?//|@import\s+(?:url\()?[\"']?(?:https?:)?//")


@pytest.fixture(scope="module")
def built(tmp_path_factory, monkeypatch_module):
    monkeypatch_module.setenv(site.REPOSITORY_URL_VARIABLE, "https://github.com/a-lecturer/their-course")
    monkeypatch_module.setenv(site.JUPYTERHUB_URL_VARIABLE, "https://hub.example.edu")
    out = tmp_path_factory.mktemp("site")
    pages = site.build_site(out, src=tmp_path_factory.mktemp("site-src"))
    return out, pages


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        yield patch


def test_every_notebook_has_a_page_and_the_sidebar_and_index_list_them_in_syllabus_order(built):
    out, pages = built
    entries = site.syllabus()
    assert [e.file for e in entries] == [p.name for p in NOTEBOOKS], "the README's syllabus lists every notebook in order"
    assert [p.name for p in pages] == ["index.html"] + [e.page for e in entries]
    index = (out / "index.html").read_text(encoding="utf-8")
    table = index[index.index("<table"):index.index("</table>")]
    assert re.findall(r'href="(\d\d_[a-z0-9_]+\.html)"', table) == [e.page for e in entries], "index: syllabus table"
    for page in pages:
        text = page.read_text(encoding="utf-8")
        nav = text[text.index("bd-docs-nav"):text.index("</nav>", text.index("bd-docs-nav"))]
        links = re.findall(r'<li class="toctree-l1[^"]*"><a class="[^"]*" href="([^"]+)"', nav)
        expected = [("#" if e.page == page.name else e.page) for e in entries]
        assert links == expected, f"{page.name}: the sidebar lists the notebooks in syllabus order"
    for entry, page in zip(entries, pages[1:]):
        text = page.read_text(encoding="utf-8")
        assert re.search(rf"<h1>{re.escape(entry.title[:4])}", text), f"{page.name}: titled {entry.title[:4]}…"
        assert "bd-sidebar-secondary" in text and text.count('class="reference internal nav-link"') >= 5, \
            f"{page.name}: in-page contents (the theme's secondary sidebar) list the sections"
        assert "data:image/png;base64" not in text and re.search(r'<img alt="[^"]*" src="_images/', text), \
            f"{page.name}: figures are rendered as image files"
        assert "theme-switch-button" in text, f"{page.name}: the colour-mode (dark mode) switch"


def test_maths_comes_from_the_local_mathjax_and_nothing_from_the_network(built):
    out, pages = built
    for page in pages + [out / "search.html"]:
        text = page.read_text(encoding="utf-8")
        assert f'src="_static/mathjax/MathJax.js?config={site.MATHJAX_CONFIG}"' in text, f"{page.name}: local MathJax"
        assert '"webFont": "STIX-Web"' in text, f"{page.name}: MathJax told to use the fonts it ships with"
        assert not NETWORK.search(text), f"{page.name}: loads {NETWORK.search(text)[0]!r} from the network"
    for page in pages[1:]:
        assert page.read_text(encoding="utf-8").count('class="math notranslate nohighlight"') > 5, \
            f"{page.name}: the notebook's maths is marked up for MathJax"
    assert (out / "_static" / "mathjax" / "MathJax.js").is_file()
    assert (out / "_static" / "mathjax" / "config" / f"{site.MATHJAX_CONFIG.split(',')[0]}.js").is_file()
    for sheet in list(out.glob("_static/**/*.css")) + list(out.glob("_static/**/*.js")):
        text = sheet.read_text(encoding="utf-8", errors="replace")
        assert not re.search(r"@import\s+(?:url\()?[\"']?(?:https?:)?//|url\([\"']?https?://", text), \
            f"{sheet.relative_to(out)} loads a stylesheet or font from the network"
    assert "softmax" in (out / "searchindex.js").read_text(encoding="utf-8"), "Sphinx's full-text search index"


def test_each_page_offers_the_notebook_and_its_student_version_for_download(built):
    out, pages = built
    for path, page in zip(NOTEBOOKS, pages[1:]):
        text = page.read_text(encoding="utf-8")
        assert f'href="_sources/{path.name}"' in text, f"{page.name}: download button for the .ipynb"
        assert f'href="release/{path.name}"' in text, f"{page.name}: download button for the student version"
        assert (out / "_sources" / path.name).read_bytes() == path.read_bytes(), "the .ipynb is the committed notebook"
        student = (out / "release" / path.name).read_text(encoding="utf-8")
        nbformat.validate(nbformat.reads(student, as_version=4))
        assert "BEGIN SOLUTION" not in student and "HIDDEN TESTS" not in student, f"release/{path.name}: no solutions"
    assert sorted(p.name for p in (out / "release").iterdir()) == [p.name for p in NOTEBOOKS], \
        "release/ holds the student notebooks and nothing else"


def test_launch_buttons_point_at_the_configured_repository_and_hub(built):
    out, pages = built
    text = pages[1].read_text(encoding="utf-8")
    name = NOTEBOOKS[0].name
    assert f'href="https://mybinder.org/v2/gh/a-lecturer/their-course/main?urlpath=lab/tree/notebooks/{name}"' in text
    hub = "https://hub.example.edu/hub/user-redirect/git-pull"
    assert f'href="{hub}?repo=https%3A//github.com/a-lecturer/their-course' \
           f'&urlpath=lab/tree/their-course/notebooks/{name}&branch=main"' in text
    assert 'href="https://github.com/a-lecturer/their-course"' in text, "repository button"


def widget_notebook():
    """A notebook whose one output is a widget with a still PNG beside it (as notebook 05's explorer)."""
    nb = new_notebook(metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
                                "widgets": {WIDGET_STATE: {"state": {"f00d": {"model_name": "VBoxModel"}},
                                                           "version_major": 2, "version_minor": 0}}})
    nb.cells = [new_markdown_cell("# 00 · An explorer\n\nThe weights $w_{ij}$, live."),
                new_code_cell("explorer", execution_count=1, outputs=[new_output(
                    "display_data", data={"image/png": PNG, "text/plain": "VBox(...)",
                                          WIDGET_VIEW: {"model_id": "f00d", "version_major": 2, "version_minor": 0}})]),
                new_code_cell('print("run " + "now")', execution_count=2, outputs=[new_output(
                    "stream", name="stdout", text="the committed output\n")])]
    return nb


def test_a_widget_output_shows_its_still_image_and_loads_no_widget_javascript(tmp_path):
    nbformat.write(widget_notebook(), tmp_path / "00_explorer.ipynb")
    entry = site.Entry("00 · An explorer", "00_explorer.ipynb", "widgets", "none", "0.0")
    pages = site.build_site(tmp_path / "out", notebooks=tmp_path, entries=[entry], src=tmp_path / "src")
    text = pages[1].read_text(encoding="utf-8")
    assert re.search(r'<img alt="[^"]*" src="_images/', text), "the widget's still image is shown"
    assert WIDGET_VIEW not in text, "the widget view is not rendered (it would need the widget JavaScript)"
    assert not NETWORK.search(text), f"loads {NETWORK.search(text)[0]!r} from the network"
    assert "html-manager" not in text and "require.min.js" not in text, "no widget manager or require.js"
    assert "the committed output" in text and "run now" not in text, "outputs are rendered as committed, not re-run"


def test_a_sphinx_warning_fails_the_build(tmp_path):
    nb = widget_notebook()
    nb.cells[0].source += "\n\nSee {ref}`a-label-that-does-not-exist`."
    nbformat.write(nb, tmp_path / "00_explorer.ipynb")
    entry = site.Entry("00 · An explorer", "00_explorer.ipynb", "widgets", "none", "0.0")
    with pytest.raises(RuntimeError, match="a-label-that-does-not-exist"):
        site.build_site(tmp_path / "out", notebooks=tmp_path, entries=[entry], src=tmp_path / "src")
