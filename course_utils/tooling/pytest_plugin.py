"""Settings for every test run in this repository, wherever pytest collects from (a pytest plugin).

The notebook kernels that nbval starts inherit this process's environment, so
the settings `make execute` uses, the pinned CPU code paths included, are put
in place before any kernel starts. ``pyproject.toml`` loads this plugin for
every pytest run in the repository (``addopts = "-p ..."``), so the settings
apply as well when a contributor checks one notebook
(``pytest --nbval notebooks/03_self_attention.ipynb``), which never loads
``tests/conftest.py``.

Where the committed outputs cannot match to the last digit (ARM, macOS, an
x86 CPU without AVX2), the notebooks still run and every assert in them is
checked, but their outputs are not compared (nbval's lax mode); the header of
the test run says which applies.
"""

from __future__ import annotations

import pytest

from course_utils.core.portable import describe_platform, platform_matches
from course_utils.tooling.execute import kernel_environment

kernel_environment()


def pytest_configure(config: pytest.Config) -> None:
    if not platform_matches() and getattr(config.option, "nbval", False):
        config.option.nbval_lax = True


def pytest_report_header(config: pytest.Config) -> str:
    return f"course platform: {describe_platform()}"
