"""Re-execute notebooks in place, deterministically, and record how long each took.

Usage (through the Makefile)::

    make execute                                   # every notebook: the lectures, then the lab book
    make execute NB=notebooks/00_orientation.ipynb  # one notebook
    make execute NB=notebooks/lab                   # the lab book's notebooks
    make execute NB=notebooks/lab/01_seq2seq_bottleneck_lab.ipynb  # one of them

Each notebook runs top to bottom in a fresh kernel with the same environment
the tests use (``PYTHONHASHSEED=0``, ``IPYKERNEL_CELL_NAME``, no
``MPLBACKEND``), in the notebook's own folder (``notebooks/`` for a lecture,
``notebooks/lab/`` for the lab book, as nbval runs them); the notebook itself calls ``course_utils.setup()`` for seeds,
threads and figure style, and the kernel runs with the pinned CPU code paths
of ``course_utils.core.portable``. Timing against the budgets, and the README's
syllabus table, are ``make bench``'s job (``course_utils.tooling.bench``).

Every code cell tagged ``nbval-ignore-output`` gets, in its metadata, the hash
of the source its output came from (``stamp_ignored_outputs``): nbval does not
compare that output, and tests/test_portable.py uses the stamp to catch a
source edited after the last execution.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

from course_utils.core.portable import pin_environment
from course_utils.tooling.autograder import LAB, STAMP_KEY, course_notebooks, lab_notebooks

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"

# Settings shared by `make execute`, the nbval run (tests/conftest.py) and grading.
NOTEBOOK_BUDGET = 60.0  # seconds per notebook, kernel start included (``make bench`` holds every notebook to it)
LAB_BUDGET = 120.0  # seconds per lab book notebook (``make bench``; not in the series' budget)
KERNEL_ENV = {"PYTHONHASHSEED": "0", "IPYKERNEL_CELL_NAME": "<IPY-INPUT>"}
MINUTES_COLUMN = "CPU minutes"  # the README syllabus table's column that ``make bench`` writes
IGNORE_OUTPUT = "nbval-ignore-output"  # the tag of a cell whose output nbval does not compare
STAMP_FIELD = "source_sha256"  # cell.metadata[STAMP_KEY]["source_sha256"], STAMP_KEY = "course"
STAMP_COMMAND = ".venv/bin/python -m course_utils.tooling.execute {path}"  # (make execute NB={path}): re-run and stamp


def notebook_paths(paths: list[str | Path]) -> list[Path]:
    """The notebooks named by ``paths``: a file as it is; a folder's lectures, then its lab book's, in order.

    A folder's lectures are its ``NN_name.ipynb`` files and its lab book the
    same in its ``lab/`` folder, so ``notebooks`` gives every notebook of the
    course and ``notebooks/lab`` the lab book alone.
    """
    found: list[Path] = []
    for path in map(Path, paths):
        found += course_notebooks(path) + lab_notebooks(path) if path.is_dir() else [path]
    return found


def is_lab(path: Path) -> bool:
    """True for a lab book's notebook (``notebooks/lab/NN_name.ipynb``)."""
    return Path(path).parent.name == LAB


def display_name(path: Path) -> str:
    """How the commands name a notebook: ``03_self_attention.ipynb``, ``lab/03_long_keys.ipynb``."""
    return f"{LAB}/{Path(path).name}" if is_lab(path) else Path(path).name


def source_sha256(source: str) -> str:
    """The SHA-256 of a cell's source (UTF-8), as hex: the stamp an executed output carries."""
    return hashlib.sha256(source.encode("utf-8")).hexdigest()


def stamp_ignored_outputs(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """Stamp every code cell tagged ``nbval-ignore-output`` with the hash of the source that made its output.

    nbval does not compare such a cell's output, so a source edited after the
    notebook was executed (a changed label, a changed seed) would leave an
    output that no longer belongs to it, and nothing would notice. The stamp,
    ``cell.metadata["course"]["source_sha256"]``, records which source the
    committed output came from; tests/test_portable.py fails when it is
    missing or differs from the source. Only executing the notebook writes it;
    a cell not tagged loses a stamp it may carry. In place; returns ``nb``.
    """
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        course = cell.metadata.get(STAMP_KEY, {})
        if IGNORE_OUTPUT in cell.metadata.get("tags", []):
            cell.metadata[STAMP_KEY] = {**course, STAMP_FIELD: source_sha256(cell.source)}
        elif STAMP_FIELD in course:
            course.pop(STAMP_FIELD)
            if not course:
                cell.metadata.pop(STAMP_KEY)
    return nb


def kernel_environment() -> None:
    """Put the shared kernel settings into this process's environment (kernels inherit it).

    Besides ``KERNEL_ENV``, these are the pinned code paths of ``course_utils.core.portable``
    that make outputs the same on every x86-64 machine with AVX2.
    """
    os.environ.update(KERNEL_ENV)
    pin_environment()
    os.environ.pop("MPLBACKEND", None)  # the inline backend must produce the figures nbval compares


def execute_notebook(path: Path, timeout: int = 600, write: bool = True) -> float:
    """Execute one notebook in a fresh kernel, in place unless ``write`` is False.

    Args:
        path: The .ipynb file.
        timeout: Seconds allowed per cell.
        write: Write the executed notebook back to ``path`` (``make bench`` does not).

    Returns:
        Wall-clock seconds the execution took (kernel start included).

    Raises:
        nbclient.exceptions.CellExecutionError: If a cell not tagged
            ``raises-exception`` raises.
    """
    kernel_environment()
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb,
        timeout=timeout,
        kernel_name="python3",
        record_timing=False,
        resources={"metadata": {"path": str(path.parent)}},
    )
    start = time.perf_counter()
    client.execute()
    seconds = time.perf_counter() - start
    nb.metadata.pop("widgets", None)
    stamp_ignored_outputs(nb)  # the source each ignored output came from
    if write:
        nbformat.write(nb, path)
    return seconds


def update_readme_minutes(minutes: dict[str, float], readme: Path = README) -> None:
    """Write measured CPU minutes into the syllabus table of README.md.

    A row belongs to a lecture when its first cell links to ``notebooks/<name>``;
    its "CPU minutes" cell (found by the table's header) gets the minutes,
    rounded to 0.1. The lab book has no minutes column: a name under ``lab/``
    is skipped, and so is any name no row links.

    Raises:
        ValueError: If a lecture's row comes before a header with a "CPU minutes" column.
    """
    lines = readme.read_text(encoding="utf-8").splitlines(keepends=True)
    column = None
    for i, line in enumerate(lines):
        cells = line.rstrip().split("|")
        if line.startswith("|") and MINUTES_COLUMN in (cell.strip() for cell in cells):
            column = [cell.strip() for cell in cells].index(MINUTES_COLUMN)
            continue
        match = re.match(r"\|\s*\[[^\]]*\]\(notebooks/([^)/]+\.ipynb)\)", line)
        if match and match.group(1) in minutes:
            if column is None:
                raise ValueError(f"{readme}: the syllabus row of {match.group(1)} has no {MINUTES_COLUMN!r} "
                                 "column in a header above it")
            value = minutes[match.group(1)]
            cells[column] = " < 0.1 " if value < 0.05 else f" {value:.1f} "  # never "0.0" minutes
            lines[i] = "|".join(cells) + "\n"
    readme.write_text("".join(lines), encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="*", default=["notebooks"],
                        help="notebooks, or folders of notebooks (a folder's lab/ too)")
    parser.add_argument("--timeout", type=int, default=600, help="seconds allowed per cell")
    args = parser.parse_args(argv)
    notebooks = notebook_paths(args.paths)
    if not notebooks:
        print(f"no notebooks found in {args.paths}", file=sys.stderr)
        return 1
    for path in notebooks:
        seconds = execute_notebook(path, timeout=args.timeout)
        print(f"{display_name(path)}: {seconds:.1f} s")
    print("(times against the course's budgets, and the README's syllabus table: make bench)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
