"""Shared test settings.

The notebook kernels that nbval starts inherit this process's environment, so
the settings `make execute` uses are put in place before any kernel starts.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from course_utils.execute import kernel_environment

kernel_environment()

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


@pytest.fixture(scope="session")
def root() -> Path:
    return ROOT
