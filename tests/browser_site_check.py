"""The course site and the slides in a real browser (``make browser-test``, after ``make site`` and ``make slides``).

``build/`` is served on localhost and visited in headless Chromium driven by
Playwright: every page of the site and every slide of every deck. Checked:
Sphinx's search finds "softmax"; every formula is typeset by the local MathJax
without an error; no request leaves the machine; "next" and "previous" walk the
notebooks in syllabus order; the download buttons give the notebook and its
student version (no solutions); the colour-mode switch gives dark mode; no
slide's content overflows the slide area (what is taller than a slide scrolls
inside it, figures are scaled to fit), each slide measured once MathJax has
typeset it; a slide scrolls only when shrunk to ``slides.MIN_ZOOM``.

Needs Debian's ``chromium`` (``apt install chromium``; Playwright's own browser
download is not used). Set ``CHROMIUM`` to use another Chromium binary. Not
part of ``make test``.
"""

from __future__ import annotations

import functools
import http.server
import os
import shutil
import threading
from pathlib import Path
from urllib.parse import urljoin, urlsplit

import nbformat
import pytest

from course_utils.tooling import site, slides

ROOT = Path(__file__).resolve().parent.parent
BUILD = site.SITE_DIR.parent  # served: site/ and slides/
ENTRIES = site.syllabus()
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
SPHINX_MATHS = "span.math.notranslate, div.math.notranslate"  # Sphinx's formulas (MathJax's own spans are .math too)
LOCAL_SCHEMES = ("data:", "blob:", "about:")  # never leave the machine (MathJax 2 declares an about:blank font)

# Before MathJax 2 loads: count its error messages (TeX parse errors, failures while typesetting).
MATHJAX_HOOKS = """window.mathErrors = [];
window.MathJax = {AuthorInit: function () {
  for (const kind of ["TeX Jax - parse error", "Math Processing Error", "file failed to load"]) {
    MathJax.Hub.Register.MessageHook(kind, function (message) { window.mathErrors.push(String(message)); });
  }
}};"""
# After MathJax has typeset the page: formulas found, formulas rendered, error marks.
MATHJAX_RESULT = """() => new Promise(resolve => MathJax.Hub.Queue(() => {
  const formulas = [...document.querySelectorAll(FORMULAS)];
  resolve({formulas: formulas.length, typeset: MathJax.Hub.getAllJax().length,
           rendered: formulas.filter(e => e.querySelector('.MathJax, .MathJax_Display')).length,
           marked: document.querySelectorAll('.MathJax_Error, merror, .merror').length,
           messages: window.mathErrors});
}))"""
# One slide in the slide area: what lies outside it, what is cut off, what is too tall to show whole.
SLIDE_PROBLEMS = """() => {
  const slide = Reveal.getCurrentSlide(), scale = Reveal.getScale();
  const area = document.querySelector('.reveal .slides').getBoundingClientRect();
  const box = slide.getBoundingClientRect(), problems = [];
  const outside = (r, b) => Math.max(b.top - r.top, r.bottom - b.bottom, b.left - r.left, r.right - b.right) / scale;
  const scrolls = (e, axis) => ['auto', 'scroll'].includes(getComputedStyle(e)['overflow' + axis]);
  const inScroller = e => { for (let a = e.parentElement; a && a !== slide; a = a.parentElement)
                              if (scrolls(a, 'X')) return true;
                            return false; };
  if (outside(box, area) > 1)
    problems.push(`the slide reaches ${Math.round(outside(box, area))} px outside the slide area`);
  if (slide.scrollHeight > slide.clientHeight + 1 && !scrolls(slide, 'Y'))
    problems.push('content below the slide is cut off');
  for (const e of slide.querySelectorAll('*')) {
    const r = e.getBoundingClientRect();
    if (r.width === 0 || e.closest('.MJX_Assistive_MathML')) continue;  // MathJax's copy for screen readers, hidden
    if ((r.left < box.left - 1 || r.right > box.right + 1) && !inScroller(e))
      problems.push(`<${e.tagName.toLowerCase()} class="${e.className}"> sticks out of the slide sideways`);
    if (e.scrollWidth > e.clientWidth + 1 && ['hidden', 'clip'].includes(getComputedStyle(e).overflowX))
      problems.push(`<${e.tagName.toLowerCase()} class="${e.className}"> cuts its content off sideways`);
    if (e.tagName === 'IMG' && r.height > slide.clientHeight * scale + 1)
      problems.push('a figure is taller than the slide');
  }
  // a formula MathJax has (re-)typeset has its output next to its source (the slide is measured with its maths)
  const untypeset = [...slide.querySelectorAll('script[type^="math/tex"]')]
    .filter(s => !document.getElementById(s.id + '-Frame')).length;
  if (untypeset) problems.push(`${untypeset} formulas are not typeset when the slide is measured`);
  return {problems: [...new Set(problems)], scrolls: slide.scrollHeight > slide.clientHeight + 1,
          zoom: parseFloat(slide.style.zoom || "1")};
}"""


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def server():
    for built, command in ((site.SITE_DIR / "index.html", "make site"), (slides.SLIDES_DIR, "make slides")):
        assert built.exists(), f"{built} is missing: run `{command}` (make browser-test does)"
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(BUILD)))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_port}/"
    httpd.shutdown()


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    chromium = os.environ.get("CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    assert chromium, "the browser test needs Debian's chromium: apt install chromium (or set CHROMIUM=/path)"
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=ARGS)
        yield browser
        browser.close()


class Visitor:
    """A browser tab that records every request it makes and every JavaScript error."""

    def __init__(self, browser, server: str):
        self.server = server
        self.page = browser.new_page(viewport={"width": 1400, "height": 900})
        self.requests: list[str] = []
        self.errors: list[str] = []
        self.page.on("request", lambda request: self.requests.append(request.url))
        self.page.on("pageerror", lambda error: self.errors.append(f"{self.page.url}: {error}"))
        self.page.add_init_script(MATHJAX_HOOKS)

    def open(self, path: str):
        self.page.goto(urljoin(self.server, path))
        self.page.wait_for_load_state("load")
        return self.page

    def maths(self, formulas: str) -> dict:
        self.page.wait_for_function("() => window.MathJax && MathJax.isReady === true", timeout=60_000)
        return self.page.evaluate(MATHJAX_RESULT.replace("FORMULAS", repr(formulas)))

    def remote_requests(self) -> list[str]:
        host = urlsplit(self.server).netloc
        return sorted({u for u in self.requests if not u.startswith(LOCAL_SCHEMES) and urlsplit(u).netloc != host})


@pytest.fixture(scope="module")
def site_visit(browser, server):
    """Every page of the site, loaded once: MathJax's results per page, and the tab's requests and errors."""
    visitor = Visitor(browser, server)
    maths = {}
    for name in ["index.html"] + [e.page for e in ENTRIES]:
        visitor.open(f"site/{name}")
        maths[name] = visitor.maths(SPHINX_MATHS)
    yield visitor, maths
    visitor.page.close()


def test_search_finds_softmax_in_the_notebooks(browser, server):
    page = Visitor(browser, server).open("site/search.html?q=softmax")
    page.wait_for_selector("#search-results ul.search li a", timeout=30_000)
    found = page.eval_on_selector_all("#search-results ul.search li a", "els => els.map(e => e.getAttribute('href'))")
    pages = {href.split("?")[0].split("#")[0] for href in found}
    assert len(pages & {e.page for e in ENTRIES}) >= 5, f"'softmax' is in most notebooks, not only in {sorted(pages)}"


def test_every_formula_is_typeset_without_an_error(site_visit):
    _, maths = site_visit
    for name, result in maths.items():
        assert not result["messages"] and not result["marked"], f"{name}: MathJax errors {result}"
        missing = result["formulas"] - result["rendered"]
        assert not missing, f"{name}: {missing} formulas left as TeX source"
        if name != "index.html":
            assert result["formulas"] > 5, f"{name}: the notebook's formulas are on the page ({result})"


def test_no_request_leaves_the_machine_and_no_script_fails(site_visit):
    visitor, _ = site_visit
    assert len(visitor.requests) > 10 * len(ENTRIES), "requests were recorded"
    assert not visitor.remote_requests(), f"requests to other hosts: {visitor.remote_requests()}"
    assert not visitor.errors, f"JavaScript errors: {visitor.errors}"


def test_next_and_previous_walk_the_notebooks_in_syllabus_order(browser, server):
    visitor = Visitor(browser, server)
    page = visitor.open(f"site/{ENTRIES[0].page}")
    # the lectures in syllabus order ("03 ·"), then the lab book's notebooks in the order of their lectures ("Lab 01")
    titles = [e.title[:4] for e in ENTRIES] + [f"Lab {Path(f).name[:2]}" for e in ENTRIES for f in e.lab]

    def heading() -> str:
        text = page.inner_text("article h1")
        return text[:6] if text.startswith("Lab ") else text[:4]

    seen = [heading()]
    while page.locator("a.right-next").count():
        page.click("a.right-next")
        page.wait_for_load_state("load")
        seen.append(heading())
        assert len(seen) <= len(titles), f"'next' goes past the last notebook: {seen}"
    assert seen == titles, "'next' from the first notebook visits every lecture in syllabus order, then the lab book"
    back = [seen[-1]]
    while len(back) < len(titles):
        page.click("a.left-prev")
        page.wait_for_load_state("load")
        back.append(heading())
    assert back == titles[::-1], "'previous' walks back in the same order"
    assert not visitor.remote_requests() and not visitor.errors


def test_download_buttons_give_the_notebook_and_its_student_version(browser, server):
    visitor = Visitor(browser, server)
    for entry in ENTRIES:
        page = visitor.open(f"site/{entry.page}")
        page.click(".dropdown-download-buttons button.dropdown-toggle")
        links = {}
        for label in ("source", "release"):
            link = page.locator(f".dropdown-download-buttons a.btn-download-{label}-button")
            assert link.is_visible(), f"{entry.page}: the download menu shows the {label} button"
            response = page.request.get(urljoin(page.url, link.get_attribute("href")))
            assert response.ok, f"{entry.page}: the {label} download gives {response.status}"
            links[label] = response.text()
        notebook, student = (nbformat.reads(links[label], as_version=4) for label in ("source", "release"))
        nbformat.validate(notebook)
        nbformat.validate(student)
        assert "BEGIN SOLUTION" not in links["release"] and "HIDDEN TESTS" not in links["release"], \
            f"{entry.page}: the student version has no solutions and no hidden tests"
        assert len(student.cells) == len(notebook.cells), f"{entry.page}: the student version has every cell"
        assert all(not c.get("outputs") for c in student.cells if c.cell_type == "code"), "and no outputs"
        stubs = [c.source for c in student.cells
                 if c.cell_type == "code" and c.metadata.get("nbgrader", {}).get("solution")]
        assert stubs and all("raise NotImplementedError()" in stub or "# YOUR CODE HERE" in stub for stub in stubs), \
            f"{entry.page}: the student version's exercise cells are nbgrader's stubs"
        assert links["source"].encode() == (ROOT / "notebooks" / entry.file).read_bytes(), \
            f"{entry.page}: the .ipynb download is the committed notebook (rebuild the site after changing it)"


def test_the_colour_mode_switch_gives_dark_mode(browser, server):
    page = Visitor(browser, server).open(f"site/{ENTRIES[0].page}")
    page.locator("button.theme-switch-button:visible").first.click()
    page.locator("button.theme-change-button[data-mode='dark']:visible").first.click()
    assert page.get_attribute("html", "data-theme") == "dark"
    background = page.evaluate("() => getComputedStyle(document.body).backgroundColor")
    assert sum(int(c) for c in background[background.index("(") + 1:-1].split(",")[:3]) < 3 * 80, \
        f"a dark background in dark mode, found {background}"


def test_no_slide_overflows_and_decks_load_nothing_from_the_network(browser, server):
    visitor = Visitor(browser, server)
    problems, slide_count, scrolling, zooms = [], 0, 0, []
    for entry in ENTRIES:
        deck = entry.file.replace(".ipynb", ".slides.html")
        page = visitor.open(f"slides/{deck}")
        page.wait_for_function("() => window.require && require.defined('reveal.js/dist/reveal.js')"
                               " && require('reveal.js/dist/reveal.js').isReady()", timeout=30_000)
        page.evaluate("() => { window.Reveal = require('reveal.js/dist/reveal.js');"
                      " Reveal.configure({transition: 'none', backgroundTransition: 'none'}); }")
        maths = visitor.maths(SPHINX_MATHS)  # none: nbconvert leaves the TeX to MathJax's own search
        assert not maths["messages"] and not maths["marked"] and maths["typeset"] > 5, f"{deck}: MathJax {maths}"
        stacks = page.evaluate("() => Reveal.getHorizontalSlides().map(s => s.querySelectorAll(':scope > section')"
                               ".length || 1)")
        assert sum(stacks) == page.evaluate("() => Reveal.getTotalSlides()"), f"{deck}: every slide is visited"
        for h, count in enumerate(stacks):
            for v in range(count):
                page.evaluate(f"() => Reveal.slide({h}, {v})")
                page.evaluate("() => new Promise(r => MathJax.Hub.Queue(r))")  # typeset, then fitted again
                page.wait_for_function("() => [...Reveal.getCurrentSlide().querySelectorAll('img')]"
                                       ".every(i => i.complete)")  # figures decoded (and the slide refitted)
                page.wait_for_timeout(20)
                result = page.evaluate(SLIDE_PROBLEMS)
                if result["scrolls"] and result["zoom"] > slides.MIN_ZOOM:
                    result["problems"].append(f"scrolls although shrunk only to zoom {result['zoom']:.3f}, "
                                              f"not to slides.MIN_ZOOM = {slides.MIN_ZOOM}")
                problems += [f"{deck} slide {h}.{v}: {p}" for p in result["problems"]]
                scrolling += result["scrolls"]
                zooms.append(result["zoom"])
        slide_count += sum(stacks)
    assert slide_count >= 10 * len(ENTRIES), f"only {slide_count} slides"
    assert not problems, "slides overflow (see course_utils/tooling/slides.py, _TEMPLATE):\n" + "\n".join(problems)
    # slides.assign_slide_types packs cells by their estimated height, and a slide that is still too tall is
    # shrunk to fit (down to slides.MIN_ZOOM): only a few slides may still scroll, all at slides.MIN_ZOOM (checked
    # above). Measured: 1 of 539 (00's notation table).
    assert scrolling <= 0.01 * slide_count, f"{scrolling} of {slide_count} slides scroll: re-fit estimated_height"
    assert sum(z < 1 for z in zooms) <= 0.25 * slide_count, "most slides must fit at full size"
    assert not visitor.remote_requests(), f"the decks load from other hosts: {visitor.remote_requests()}"
    assert not visitor.errors, f"JavaScript errors in the decks: {visitor.errors}"
