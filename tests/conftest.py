"""Shared test fixtures (the settings every run needs are in the repository's top-level conftest.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))  # the lectures
LAB = sorted((ROOT / "notebooks" / "lab").glob("[0-9][0-9]_*.ipynb"))  # the lab book: optional, never graded


@pytest.fixture(scope="session")
def root() -> Path:
    return ROOT
