"""Helpers shared by the checker tests: the notebooks' own solutions, and the rule that a message gives no answer away."""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path
from typing import Any

import nbformat

ROOT = Path(__file__).resolve().parent.parent
SOLUTION = re.compile(r"### BEGIN SOLUTION\n(.*?)### END SOLUTION", re.S)


@cache
def _cells(stem: str) -> tuple[Any, ...]:
    return tuple(nbformat.read(ROOT / "notebooks" / f"{stem}.ipynb", as_version=4).cells)


def _switches_to_reference(node: ast.stmt, namespace: dict[str, Any]) -> bool:
    """``name = module.name`` with ``module`` imported: the line after an exercise that goes on with the reference."""
    if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
            and isinstance(node.value, ast.Attribute) and node.value.attr == node.targets[0].id):
        return False
    root = node.value
    while isinstance(root, ast.Attribute):
        root = root.value
    return isinstance(root, ast.Name) and root.id in namespace


def exercises() -> list[tuple[str, str]]:
    """``(notebook stem, grade_id)`` of every nbgrader solution cell (code) of every notebook, in order."""
    stems = sorted(p.stem for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    return [(stem, c.metadata["nbgrader"]["grade_id"]) for stem in stems for c in _cells(stem)
            if c.cell_type == "code" and c.metadata.get("nbgrader", {}).get("solution")]


def notebook_namespace(stem: str, grade_id: str) -> dict[str, Any]:
    """The names in scope after the instructor's solution cell ``grade_id`` of notebook ``stem`` has run.

    The cell runs in a namespace made of the imports, function and class definitions of every code
    cell before it, and of the lines that switch to a reference after an exercise
    (``split_heads = multihead.split_heads``), as in the notebook. New objects on every call.
    """
    namespace: dict[str, Any] = {}
    for cell in _cells(stem):
        if cell.cell_type != "code":
            continue
        if cell.metadata.get("nbgrader", {}).get("grade_id") == grade_id:
            exec(compile(cell.source, f"<{stem}: {grade_id}>", "exec"), namespace)  # noqa: S102 - the course's own code
            return namespace
        for node in ast.parse(cell.source).body:
            if isinstance(node, (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.ClassDef)) or _switches_to_reference(node, namespace):
                exec(compile(ast.Module(body=[node], type_ignores=[]), f"<{stem}>", "exec"), namespace)  # noqa: S102
    raise KeyError(f"{stem} has no solution cell {grade_id!r}")


def notebook_solution(stem: str, grade_id: str) -> Any:
    """What the instructor's solution cell ``grade_id`` of notebook ``stem`` defines: the name ``grade_id``."""
    return notebook_namespace(stem, grade_id)[grade_id]


def graded_test_cell(stem: str, grade_id: str) -> str:
    """The source of the graded test cell of exercise ``grade_id`` (``<grade_id>_tests``), hidden tests included."""
    return next(c.source for c in _cells(stem) if c.metadata.get("nbgrader", {}).get("grade_id") == f"{grade_id}_tests")


def solution_lines(stem: str, grade_id: str) -> list[str]:
    """The code lines (comments dropped) between the solution markers of cell ``grade_id``, 8+ characters each."""
    cell = next(c for c in _cells(stem) if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id)
    lines = (line.split("  #")[0].strip() for block in SOLUTION.findall(cell.source) for line in block.splitlines())
    return [line for line in lines if len(line) >= 8 and not line.startswith("#")]


def _checkers_words(message: str) -> str:
    """The message without what the learner wrote: the text of an exception their function raised, their line."""
    message = re.sub(r" raised (\w+): .*?\n  called with:", r" raised \1\n  called with:", message, flags=re.S)
    return re.sub(r"\n  look at [^\n]*", "", message)


def assert_no_answer_in(message: str, code: tuple[str, ...] = (), solution: tuple[str, str] | None = None) -> None:
    """A checker's message names the bug: no solution code, and no value of the expected answer.

    Args:
        message: The message of a ``CheckError``.
        code: Fragments of solution code that must not appear (the notebook's own list).
        solution: ``(notebook stem, grade_id)``: no line of that solution cell may appear either.

    The learner's own text (an exception their function raised, the line it points at) is
    left out. A number with three or more decimals is allowed only as what the learner
    returned ("where you returned 0.1234", "returned a float (0.1234)"): the checkers never
    print an expected value.
    """
    words = _checkers_words(message)
    leaked = [fragment for fragment in code if fragment in words]
    if solution is not None:
        leaked += [line for line in solution_lines(*solution) if line in words]
    assert not leaked, f"the message prints solution code {leaked}: {message}"
    assert not re.search(r"expected -?\d", words), f"the message prints an expected value: {message}"
    for number in re.finditer(r"-?\d+\.\d{3,}", words):  # "where you returned 0.1234", "returned a float (0.1234)"
        assert re.search(r"(you returned |returned an? \w+ \()$", words[:number.start()]), (
            f"the message prints {number.group()}, which is not what the learner returned: {message}")
