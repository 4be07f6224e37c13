"""A real-browser test of the course in JupyterLab (``make browser-test``; not part of ``make test``).

It starts JupyterLab with the README's own command (``make lab``, plus
``LAB_ARGS`` for a port, a token and throw-away settings: no autosave, so the
committed notebook is never rewritten, and every cell kept in the page), opens
notebook 00 in headless Chromium driven by Playwright, clears all outputs, runs
all cells through the menus, and asserts that every code cell ran, no cell
shows an error, and attention heatmaps are rendered as images.

Needs Debian's ``chromium`` (``apt install chromium``; Playwright's own browser
download is not used). Set ``CHROMIUM`` to use another Chromium binary.
"""

from __future__ import annotations

import json
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
    server = subprocess.Popen(["make", "lab", f"LAB_ARGS={lab_args}"], cwd=ROOT, stdout=subprocess.DEVNULL,
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
        yield f"http://127.0.0.1:{port}/lab/tree/{NOTEBOOK}?token={token}"
    finally:
        os.killpg(server.pid, 15)
        server.wait(30)


def test_notebook_00_runs_in_jupyterlab_without_errors_and_shows_heatmaps(jupyterlab):
    from playwright.sync_api import sync_playwright

    chromium = os.environ.get("CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    assert chromium, "the browser test needs Debian's chromium: apt install chromium (or set CHROMIUM=/path)"
    committed = (ROOT / NOTEBOOK).read_bytes()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        page.goto(jupyterlab)
        page.wait_for_selector(".jp-Notebook .jp-CodeCell", state="attached", timeout=120_000)
        page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", state="attached", timeout=120_000)
        page.click("li.lm-MenuBar-item:has-text('Edit')")
        page.click("li.lm-Menu-item:has-text('Clear Outputs of All Cells')")
        assert page.locator(".jp-OutputArea-output img").count() == 0, "outputs were cleared before running"
        page.click("li.lm-MenuBar-item:has-text('Run')")
        page.click("li.lm-Menu-item:has-text('Run All Cells')")
        deadline = time.time() + 180
        while True:
            prompts = page.eval_on_selector_all(".jp-CodeCell .jp-InputPrompt", "els => els.map(e => e.textContent.trim())")
            errors = page.eval_on_selector_all(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']",
                                               "els => els.map(e => e.textContent.slice(0, 300))")
            if errors or (prompts and all(p[1:-2].isdigit() for p in prompts)):  # "[12]:" for every code cell
                break
            assert time.time() < deadline, f"not every cell ran within 3 minutes: {prompts}"
            time.sleep(1)
        images = page.eval_on_selector_all(".jp-OutputArea-output img", "els => els.map(e => e.getAttribute('src'))")
        browser.close()
    assert not errors, f"error output in the browser: {errors}"
    assert [int(p[1:-2]) for p in prompts] == list(range(1, len(prompts) + 1)), "cells ran top to bottom, once each"
    assert len(images) >= 3 and all(src.startswith("data:image/png") for src in images), "the heatmaps are rendered"
    assert (ROOT / NOTEBOOK).read_bytes() == committed, "the browser test changed the committed notebook"
