"""Shared test settings.

The notebook kernels that nbval starts inherit this process's environment, so
the settings `make execute` uses, the pinned CPU code paths included, are put
in place before any kernel starts.

Where the committed outputs cannot match to the last digit (ARM, macOS, an
x86 CPU without AVX2), the notebooks still run and every assert in them is
checked, but their outputs are not compared (nbval's lax mode); the header of
the test run says which applies.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from course_utils.tooling.execute import kernel_environment
from course_utils.core.portable import describe_platform, platform_matches

kernel_environment()

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def pytest_configure(config: pytest.Config) -> None:
    if not platform_matches() and getattr(config.option, "nbval", False):
        config.option.nbval_lax = True


def pytest_report_header(config: pytest.Config) -> str:
    return f"course platform: {describe_platform()}"


@pytest.fixture(scope="session")
def root() -> Path:
    return ROOT
