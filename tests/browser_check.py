"""Real-browser tests of the course in JupyterLab (``make browser-test``; not part of ``make test``).

They start JupyterLab with the README's own command (``make lab``, plus
``LAB_ARGS`` for a port, a token and throw-away settings: no autosave, so the
committed notebooks are never rewritten, and every cell kept in the page) and
drive it in headless Chromium with Playwright. Notebook 00: clear all outputs,
run all cells through the menus, and assert that every code cell ran, no cell
shows an error, and attention heatmaps are rendered as images. Notebook 05: run
all cells, then use the attention explorer's controls (the temperature slider
with the keyboard, the scale checkbox with the mouse) and assert that its
heatmap changes each time, with the widget extension served by JupyterLab
itself (no request leaves the machine).

Needs Debian's ``chromium`` (``apt install chromium``; Playwright's own browser
download is not used). Set ``CHROMIUM`` to use another Chromium binary.
"""

from __future__ import annotations

import json
import re
import os
import secrets
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = "notebooks/00_orientation.ipynb"
EXPLORER_NOTEBOOK = "notebooks/05_multi_head_attention.ipynb"
LEARNER = "build/browser-test-learner"  # `make lab` writes the learner's copy (the untouched release) here


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _settings(folder: Path) -> Path:
    for plugin, values in {"docmanager-extension/plugin": {"autosave": False},
                           "notebook-extension/tracker": {"windowingMode": "none"},
                           "apputils-extension/notification": {"fetchNews": "false", "checkForUpdates": False}}.items():
        path = folder / "@jupyterlab" / f"{plugin}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values), encoding="utf-8")
    return folder


@pytest.fixture
def jupyterlab(tmp_path):
    port, token = _free_port(), secrets.token_hex(16)
    settings = _settings(tmp_path / "settings")
    lab_args = (f"--no-browser --port={port} --IdentityProvider.token={token} "
                f"--LabApp.user_settings_dir={settings} --LabApp.workspaces_dir={tmp_path / 'workspaces'}")
    shutil.rmtree(ROOT / LEARNER, ignore_errors=True)  # a fresh, untouched release
    server = subprocess.Popen(["make", "lab", f"LAB_ARGS={lab_args}", f"LEARNER={LEARNER}"], cwd=ROOT, stdout=subprocess.DEVNULL,
                              stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.time() + 300  # make lab may first set up the environment
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert server.poll() is None, "`make lab` exited before JupyterLab started"
                assert time.time() < deadline, "JupyterLab did not start within 5 minutes"
                time.sleep(0.5)
        yield lambda notebook: f"http://127.0.0.1:{port}/lab/tree/{notebook}?token={token}"
    finally:
        os.killpg(server.pid, 15)
        server.wait(30)


def _chromium() -> str:
    chromium = os.environ.get("CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    assert chromium, "the browser test needs Debian's chromium: apt install chromium (or set CHROMIUM=/path)"
    return chromium


def _open_when_idle(page, url: str) -> None:
    page.goto(url)
    page.wait_for_selector(".jp-Notebook .jp-CodeCell", state="attached", timeout=120_000)
    page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", state="attached", timeout=120_000)
    page.wait_for_selector(".jp-StatusBar-Item:has-text('Python 3 (ipykernel) | Idle')", timeout=120_000)  # connected


def _ran_in_order(prompts: list[str]) -> bool:
    """Every code cell ran once, top to bottom: the shown prompts count up to the number of code cells (collapsed
    evidence cells run too, but show no prompt)."""
    shown = [(i + 1, int(p[1:-2])) for i, p in enumerate(prompts) if p]  # (position, execution count)
    return bool(shown) and all(position == count for position, count in shown)


def _committed_stderr(notebook: str) -> set[str]:
    """The starts of the stderr outputs the committed notebook shows on purpose (e.g. a warning in a pitfall)."""
    cells = json.loads((ROOT / notebook).read_text(encoding="utf-8"))["cells"]
    return {_warning_text("".join(output["text"])) for cell in cells for output in cell.get("outputs", [])
            if output.get("name") == "stderr"}


def _warning_text(text: str) -> str:
    """A stderr output without where it came from: the committed notebooks name the cell <IPY-INPUT>, while a
    learner's kernel (`make lab` unsets IPYKERNEL_CELL_NAME) names a file of its own."""
    return re.sub(r"^\S+:\d+: (?=\w*Warning)", "", text)[:250]


def _clear_and_run_all_cells(page, notebook: str, seconds: int, screenshot: Path, stop_on_error: bool = True
                             ) -> tuple[list[str], list[str]]:
    """Clear all outputs, run all cells through the menus, and wait until every code cell ran or (if
    ``stop_on_error``) one showed an error or a warning that the committed notebook does not show.
    Returns (prompts, errors).

    If the cells do not all run in ``seconds`` (or none has started after two minutes), the page is saved to
    ``screenshot`` and the test fails with the cells' prompts."""
    expected = _committed_stderr(notebook)
    page.click("li.lm-MenuBar-item:has-text('Edit')")
    page.click("li.lm-Menu-item:has-text('Clear Outputs of All Cells')")
    assert page.locator(".jp-OutputArea-output").count() == 0, "outputs were cleared before running"
    page.click("li.lm-MenuBar-item:has-text('Run')")
    page.click("li.lm-Menu-item:has-text('Run All Cells')")
    start = time.time()
    while True:
        prompts = page.eval_on_selector_all(".jp-CodeCell .jp-InputPrompt", "els => els.map(e => e.textContent.trim())")
        errors = page.eval_on_selector_all(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']",
                                           "els => els.map(e => e.textContent.slice(0, 300))")
        errors = [error for error in errors if _warning_text(error) not in expected]
        shown = [p for p in prompts if p]  # a collapsed evidence cell shows no prompt
        if (errors and stop_on_error) or (shown and all(p[1:-2].isdigit() for p in shown)):  # "[12]:" for every cell
            return prompts, errors
        waited = time.time() - start
        if waited > seconds or (waited > 120 and all(p in ("[ ]:", "") for p in prompts)):
            page.screenshot(path=str(screenshot))
            raise AssertionError(f"not every cell ran within {waited:.0f} s (page saved to {screenshot}): {prompts}")
        time.sleep(1)


def test_notebook_00_runs_in_jupyterlab_without_errors_and_shows_heatmaps(jupyterlab, tmp_path):
    from playwright.sync_api import sync_playwright

    committed = (ROOT / NOTEBOOK).read_bytes()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=_chromium(), args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        _open_when_idle(page, jupyterlab(NOTEBOOK))
        prompts, errors = _clear_and_run_all_cells(page, NOTEBOOK, 180, tmp_path / "page.png")
        images = page.eval_on_selector_all(".jp-OutputArea-output img", "els => els.map(e => e.getAttribute('src'))")
        browser.close()
    assert not errors, f"error output in the browser: {errors}"
    assert _ran_in_order(prompts), f"cells ran top to bottom, once each: {prompts}"
    assert len(images) >= 3 and all(src.startswith("data:image/png") for src in images), "the heatmaps are rendered"
    assert (ROOT / NOTEBOOK).read_bytes() == committed, "the browser test changed the committed notebook"


def test_run_all_on_the_untouched_release_goes_to_the_end_with_every_exercise_open(jupyterlab, tmp_path):
    """The learner's copy that `make lab` opens: every graded check cell ends in ExerciseOpen (a grader scores it
    0), JupyterLab's Run All goes on past it (the cell is tagged raises-exception), and no other cell fails."""
    from playwright.sync_api import sync_playwright

    notebook = f"{LEARNER}/00_orientation.ipynb"
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=_chromium(), args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        _open_when_idle(page, jupyterlab(notebook))
        prompts, errors = _clear_and_run_all_cells(page, notebook, 180, tmp_path / "page.png", stop_on_error=False)
        texts = page.eval_on_selector_all(".jp-OutputArea-output", "els => els.map(e => e.textContent)")
        browser.close()
    graded = [c for c in json.loads((ROOT / notebook).read_text(encoding="utf-8"))["cells"]
              if c.get("metadata", {}).get("nbgrader", {}).get("grade") and c["cell_type"] == "code"]
    assert _ran_in_order(prompts), "Run All went to the end"
    opened = [e for e in errors if e.startswith("ExerciseOpen: Exercise still open.")]
    assert len(opened) == len(graded), errors
    others = [e for e in errors if e not in opened and _warning_text(e) not in _committed_stderr(NOTEBOOK)]  # on purpose
    assert not others, f"a cell failed that is not an open exercise's check: {others}"
    assert sum("uses the course's" in t for t in texts) >= len(graded), "each open exercise goes on with the reference"


# The explorer's heatmap is an ipywidgets Image: its <img> shows a blob: URL that changes with every update,
# so the test compares what the URL holds (the PNG's bytes), not the URL.
_IMAGE_DIGEST = """async img => {
    const bytes = new Uint8Array(await (await fetch(img.src)).arrayBuffer());
    const digest = new Uint8Array(await crypto.subtle.digest("SHA-256", bytes));
    const png = [137, 80, 78, 71].every((b, i) => bytes[i] === b);
    return (png ? "png:" : "not a png:") + Array.from(digest, b => b.toString(16).padStart(2, "0")).join("");
}"""


def _wait_for_new_image(page, image, before: str, what: str, seconds: int = 60) -> str:
    """Wait until the image differs from ``before`` and then stops changing (the kernel idle, the same bytes
    twice a second apart), so that a later change cannot be the tail of this one. Returns the image's digest."""
    deadline = time.time() + seconds
    last = before
    while True:
        now = image.evaluate(_IMAGE_DIGEST)
        idle = page.locator(".jp-StatusBar-Item:has-text('| Idle')").count() == 1
        if now != before and now == last and idle:
            assert now.startswith("png:"), f"after {what}, the explorer's image is not a PNG"
            return now
        assert time.time() < deadline, f"the explorer's heatmap did not change and settle within {seconds} s after {what}"
        last = now
        time.sleep(1)


def test_the_attention_explorer_of_notebook_05_answers_its_controls_in_jupyterlab(jupyterlab, tmp_path):
    from playwright.sync_api import sync_playwright

    committed = (ROOT / EXPLORER_NOTEBOOK).read_bytes()
    requests: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=_chromium(), args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        page.on("request", lambda request: requests.append(request.url))
        _open_when_idle(page, jupyterlab(EXPLORER_NOTEBOOK))
        prompts, errors = _clear_and_run_all_cells(page, EXPLORER_NOTEBOOK, 600, tmp_path / "page.png")
        assert not errors, f"error output in the browser: {errors}"
        explorer = page.locator(".jp-OutputArea-output", has=page.locator(".widget-image"))
        assert explorer.count() == 1, "one output shows the explorer as a live widget"
        explorer.scroll_into_view_if_needed()
        image = explorer.locator("img.widget-image")
        first = image.evaluate(_IMAGE_DIGEST)
        assert first.startswith("png:"), "the explorer shows its heatmap as a PNG"

        readout = explorer.locator(".widget-slider .widget-readout")
        # τ is the whole divisor (as in notebooks 03-04) and starts at √D_k = 4, the slider's step 10 ** 0.6
        assert readout.first.text_content().strip() == "3.98", "the temperature starts at √D_k"
        explorer.locator(".widget-slider .noUi-handle").first.focus()
        for _ in range(6):  # six steps of 0.05 in log10(τ): τ = 10 ** 0.9, about 8
            page.keyboard.press("ArrowRight")
        warmer = _wait_for_new_image(page, image, first, "moving the temperature slider")
        assert readout.first.text_content().strip() == "7.94", "six steps right on the slider: τ = 10 ** 0.9"
        for _ in range(18):  # down to τ = 1: the scores without the scale
            page.keyboard.press("ArrowLeft")
        unscaled = _wait_for_new_image(page, image, warmer, "moving the temperature slider to 1")
        assert readout.first.text_content().strip() == "1.00", "eighteen steps left: τ = 1, no scale"
        assert unscaled != first
        widget_errors = explorer.get_by_text("Error displaying widget").count()
        browser.close()
    assert widget_errors == 0
    assert _ran_in_order(prompts), f"cells ran top to bottom, once each: {prompts}"
    outside = sorted({url for url in requests if not url.startswith(("http://127.0.0.1:", "data:", "blob:"))})
    assert not outside, f"JupyterLab or the widget extension fetched from outside the machine: {outside}"
    assert any("@jupyter-widgets/jupyterlab-manager" in url for url in requests), \
        "the widget extension (jupyterlab_widgets) is served by JupyterLab itself"
    assert (ROOT / EXPLORER_NOTEBOOK).read_bytes() == committed, "the browser test changed the committed notebook"
