"""`make site`: Sphinx + MyST-NB + sphinx-book-theme, built from the committed outputs, offline.

Static checks of a site built into a temporary folder: pages and sidebar in
the README's syllabus order (the lectures, then the lab book), local maths,
nothing loaded from the network, download files (the notebook, and a lecture's
student version), launch buttons, widget outputs shown as their still image,
evidence cells left out of the pages. The README's lab book column is checked
against notebooks/lab/, and the lab book's machinery on a small site of its own. tests/browser_site_check.py (``make
browser-test``) checks the same site in a browser.
"""

from __future__ import annotations

import posixpath
import re

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from course_utils.tooling import site

from conftest import LAB, NOTEBOOKS, ROOT

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
PNG = ("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==")
# A <script>, <link> or <img> that loads from elsewhere, a module import, or a stylesheet import from the network.
CELL = re.compile(r'class="cell(?: tag_[^"]*)? docutils container"')  # a code cell MyST-NB rendered
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


def _sidebar(text: str) -> tuple[list[str], list[str]]:
    """The sidebar's captions and its first-level links, in order."""
    nav = text[text.index("bd-docs-nav"):text.index("</nav>", text.index("bd-docs-nav"))]
    captions = re.findall(r'<span class="caption-text">([^<]+)</span>', nav)
    return captions, re.findall(r'<li class="toctree-l1[^"]*"><a class="[^"]*" href="([^"]+)"', nav)


def _lab_pages(entries):
    return [file.replace(".ipynb", ".html") for e in entries for file in e.lab]


def test_every_notebook_has_a_page_and_the_sidebar_and_index_list_them_in_syllabus_order(built):
    out, pages = built
    entries = site.syllabus()
    assert [e.file for e in entries] == [p.name for p in NOTEBOOKS], "the README's syllabus lists every notebook in order"
    lab = _lab_pages(entries)
    assert [p.relative_to(out).as_posix() for p in pages] == ["index.html"] + [e.page for e in entries] + lab
    assert sorted(lab) == [f"lab/{p.stem}.html" for p in LAB], "every lab notebook has a page"
    index = (out / "index.html").read_text(encoding="utf-8")
    table = index[index.index("<table"):index.index("</table>")]
    assert re.findall(r'href="(\d\d_[a-z0-9_]+\.html)"', table) == [e.page for e in entries], "index: syllabus table"
    assert re.findall(r'href="(lab/\d\d_[a-z0-9_]+\.html)"', table) == lab, "index: the lab book column links its pages"
    assert "<th class=\"head\"><p>lab book</p></th>" in table
    for page in pages:
        name = page.relative_to(out).as_posix()
        captions, links = _sidebar(page.read_text(encoding="utf-8"))
        here = posixpath.dirname(name) or "."
        expected = [("#" if target == name else posixpath.relpath(target, here)) for target in [e.page for e in entries] + lab]
        assert links == expected, f"{name}: the sidebar lists the lectures, then the lab book, in syllabus order"
        assert captions == (["Lectures", "Lab book"] if lab else ["Lectures"]), f"{name}: the sidebar's sections"
    for entry, page in zip(entries, pages[1:]):
        text = page.read_text(encoding="utf-8")
        assert re.search(rf"<h1>{re.escape(entry.title[:4])}", text), f"{page.name}: titled {entry.title[:4]}…"
        assert "bd-sidebar-secondary" in text and text.count('class="reference internal nav-link"') >= 5, \
            f"{page.name}: in-page contents (the theme's secondary sidebar) list the sections"
        assert "data:image/png;base64" not in text and re.search(r'<img alt="[^"]*" src="_images/', text), \
            f"{page.name}: figures are rendered as image files"
        assert "theme-switch-button" in text, f"{page.name}: the colour-mode (dark mode) switch"


def test_the_syllabus_links_each_lab_notebook_from_its_lectures_row_once():
    entries = site.syllabus()
    assert site.lab_problems(entries) == []
    for path in LAB:
        rows = [e.number for e in entries if f"lab/{path.name}" in e.lab]
        assert rows == [path.name[:2]], f"lab/{path.name} is linked from the rows {rows}, not once from its lecture's"
    for entry in entries:
        for file in entry.lab:
            assert (ROOT / "notebooks" / file).is_file(), f"{entry.file}'s row links notebooks/{file}: missing"
    rows = [line for line in (ROOT / "README.md").read_text(encoding="utf-8").splitlines() if line.startswith("| [")]
    assert len(rows) == len(entries), "every row of the syllabus has its five columns, the lab book's last"


def test_lab_problems_names_each_disagreement_between_the_readme_and_notebooks_lab(tmp_path):
    (tmp_path / "lab").mkdir()
    for name in ("01_x.ipynb", "02_y.ipynb", "02_z.ipynb", "03_w.ipynb"):
        nbformat.write(new_notebook(cells=[new_markdown_cell("# Lab")]), tmp_path / "lab" / name)
    row = "| [{n} · T](notebooks/{n}_t.ipynb) | c | p | 0.1 | {lab} |\n"
    readme = tmp_path / "README.md"
    readme.write_text("# A course\n\n| notebook | concepts | prerequisites | CPU minutes | lab book |\n"
                      "| --- | --- | --- | --- | --- |\n"
                      + row.format(n="01", lab="[lab](notebooks/lab/01_x.ipynb), [lab](notebooks/lab/02_y.ipynb)")
                      + row.format(n="02", lab="[lab](notebooks/lab/02_y.ipynb), [more](notebooks/lab/02_gone.ipynb)")
                      + row.format(n="03", lab="—"), encoding="utf-8")
    entries = site.syllabus(readme)
    assert [e.lab for e in entries] == [("lab/01_x.ipynb", "lab/02_y.ipynb"), ("lab/02_y.ipynb", "lab/02_gone.ipynb"), ()]
    assert sorted(site.lab_problems(entries, tmp_path)) == sorted([
        "01_t.ipynb's row links notebooks/lab/02_y.ipynb, which is lecture 02's",
        "02_t.ipynb's row links notebooks/lab/02_gone.ipynb, which does not exist",
        "notebooks/lab/02_y.ipynb is linked 2 times from the syllabus (once is right)",
        "notebooks/lab/02_z.ipynb is linked 0 times from the syllabus (once is right)",
        "notebooks/lab/03_w.ipynb is linked 0 times from the syllabus (once is right)"])
    with pytest.raises(ValueError, match="02_z.ipynb is linked 0 times"):
        site.stage(tmp_path / "src", entries, tmp_path)
    readme.write_text(row.format(n="01", lab="see the lab"), encoding="utf-8")
    with pytest.raises(ValueError, match="lab book cell 'see the lab' is neither"):
        site.syllabus(readme)


def test_evidence_cells_are_left_out_of_the_pages_and_kept_in_the_downloads(built):
    out, pages = built
    for path in NOTEBOOKS + LAB:
        name = path.relative_to(ROOT / "notebooks").with_suffix("").as_posix()
        nb = nbformat.read(out / "_sources" / f"{name}.ipynb", as_version=4)  # the notebook the page was built from
        code = [c for c in nb.cells if c.cell_type == "code" and c.source.strip()]
        evidence = [c for c in code if "evidence" in c.metadata.get("tags", [])]
        text = (out / f"{name}.html").read_text(encoding="utf-8")
        assert "tag_evidence" not in text, f"{name}: an evidence cell is on the page"
        assert len(CELL.findall(text)) == len(code) - len(evidence), f"{name}: every other code cell is on the page"
    assert any("evidence" in c.metadata.get("tags", []) for p in NOTEBOOKS for c in nbformat.read(p, as_version=4).cells), \
        "no lecture has an evidence cell any more: this test checks nothing"


def test_maths_comes_from_the_local_mathjax_and_nothing_from_the_network(built):
    out, pages = built
    for page in pages + [out / "search.html"]:
        text = page.read_text(encoding="utf-8")
        up = "../" * len(page.relative_to(out).parent.parts)  # a lab book page is one folder down
        assert f'src="{up}_static/mathjax/MathJax.js?config={site.MATHJAX_CONFIG}"' in text, f"{page.name}: local MathJax"
        assert '"webFont": "STIX-Web"' in text, f"{page.name}: MathJax told to use the fonts it ships with"
        assert not NETWORK.search(text), f"{page.name}: loads {NETWORK.search(text)[0]!r} from the network"
    for page in pages[1:1 + len(NOTEBOOKS)]:
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
        "release/ holds the lectures' student notebooks and nothing else"
    for path in LAB:
        text = (out / "lab" / f"{path.stem}.html").read_text(encoding="utf-8")
        assert f'href="../_sources/lab/{path.name}"' in text, f"lab/{path.name}: download button for the .ipynb"
        assert (out / "_sources" / "lab" / path.name).read_bytes() == path.read_bytes()
        assert "release/" not in text and "download-release-button" not in text, f"lab/{path.name}: no student version"


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


def evidence_cell(source: str, output: str):
    """A code cell as a lecture's collapsed check of a claim: tagged ``evidence``, its source hidden."""
    return new_code_cell(source, execution_count=None, metadata={"tags": ["evidence"], "jupyter": {"source_hidden": True}},
                         outputs=[new_output("stream", name="stdout", text=output)])


def test_a_lab_notebook_gets_a_page_in_the_lab_books_section_without_a_student_version_or_its_evidence(tmp_path):
    lecture = widget_notebook()
    lecture.cells.insert(2, evidence_cell("assert 'lecture' + 'claim'", "LECTURE-EVIDENCE-OUTPUT\n"))
    lab = widget_notebook()
    lab.metadata.pop("widgets")
    lab.cells = [new_markdown_cell("# Lab 00 · Deeper\n\nMore seeds for $w_{ij}$."),
                 new_code_cell('print("seed " + "sweep")', execution_count=1, outputs=[new_output(
                     "stream", name="stdout", text="the lab's output\n")]),
                 evidence_cell("assert 'lab' + 'claim'", "LAB-EVIDENCE-OUTPUT\n")]
    for i, cell in enumerate(c for c in lecture.cells + lab.cells if c.cell_type == "code"):
        cell.execution_count = i + 1
    nbformat.write(lecture, tmp_path / "00_explorer.ipynb")
    (tmp_path / "lab").mkdir()
    nbformat.write(lab, tmp_path / "lab" / "00_deeper.ipynb")
    entry = site.Entry("00 · An explorer", "00_explorer.ipynb", "widgets", "none", "0.0", ("lab/00_deeper.ipynb",))
    out = tmp_path / "out"
    pages = site.build_site(out, notebooks=tmp_path, entries=[entry], src=tmp_path / "src")
    assert [p.relative_to(out).as_posix() for p in pages] == ["index.html", "00_explorer.html", "lab/00_deeper.html"]
    index, page, lab_page = (p.read_text(encoding="utf-8") for p in pages)
    table = index[index.index("<table"):index.index("</table>")]
    assert re.findall(r'href="([^"]+)"', table) == ["00_explorer.html", "lab/00_deeper.html"], "index: the lab column"
    assert _sidebar(index) == (["Lectures", "Lab book"], ["00_explorer.html", "lab/00_deeper.html"])
    assert _sidebar(lab_page) == (["Lectures", "Lab book"], ["../00_explorer.html", "#"])
    assert "<h1>Lab 00 · Deeper" in lab_page and "the lab's output" in lab_page
    for text, name in ((page, "LECTURE"), (lab_page, "LAB")):
        assert f"{name}-EVIDENCE-OUTPUT" not in text and "claim" not in text and "tag_evidence" not in text, \
            f"{name.lower()}: the evidence cell is left out of the page"
        assert len(CELL.findall(text)) == (2 if name == "LECTURE" else 1), "the other code cells are on the page"
    assert (out / "_sources" / "00_explorer.ipynb").read_bytes() == (tmp_path / "00_explorer.ipynb").read_bytes()
    assert (out / "_sources" / "lab" / "00_deeper.ipynb").read_bytes() == (tmp_path / "lab" / "00_deeper.ipynb").read_bytes(), \
        "the lab notebook's download is the notebook, its evidence included"
    assert 'href="release/00_explorer.ipynb"' in page and "release/" not in lab_page, "a student version: lectures only"
    assert [p.name for p in (out / "release").iterdir()] == ["00_explorer.ipynb"]
    assert "urlpath=lab/tree/notebooks/lab/00_deeper.ipynb" in lab_page, "the launch button opens the lab notebook"
