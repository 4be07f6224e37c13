"""Notebook hygiene, and agreement between the notebooks and course_utils.

nbval (``--nbval`` in the test command) re-executes every notebook and compares
every output; these tests check what nbval does not.
"""

from __future__ import annotations

import ast
import importlib
import json
import pkgutil
import re
from pathlib import Path

import nbformat
import pytest

import course_utils
from course_utils.checks import hints
from course_utils.tooling import written

from conftest import LAB, NOTEBOOKS

# Pitfalls come after the exercises, so that they give no answer away; a lecture may leave them to its lab book.
SECTIONS = ["## Learning objectives", "## Setup", "## Notation", "## Exercises", "## Common pitfalls",
            "## Summary", "## Further reading"]
OPTIONAL = {"## Common pitfalls"}
EVERY = NOTEBOOKS + LAB  # lectures and the lab book's notebooks
MACHINE_PATH = re.compile(r"(/(root|tmp|work|home|Users|private/var)/|[A-Z]:\\\\)")
ADDRESS = re.compile(r"0x[0-9a-fA-F]{6,}")
VOLATILE = re.compile(r"it/s\]|s/it\]|\d{4}-\d\d-\d\dT\d\d:\d\d")


def _ids(paths):
    return [p.stem for p in paths]


def _read(path: Path):
    return nbformat.read(path, as_version=4)


def _tags(cell) -> list[str]:
    return cell.metadata.get("tags", [])


def _output_text(output) -> str:
    parts = [output.get("text", ""), output.get("ename", ""), output.get("evalue", "")]
    parts += output.get("traceback", [])
    for mime, value in output.get("data", {}).items():
        if not mime.startswith("image/png"):
            parts.append(value if isinstance(value, str) else json.dumps(value))
    return "\n".join(parts)


@pytest.mark.parametrize("path", LAB, ids=_ids(LAB))
def test_a_lab_notebook_backs_its_lecture_and_is_never_graded(path):
    nb = _read(path)
    lecture = [p for p in NOTEBOOKS if p.name[:2] == path.name[:2]]
    assert lecture, f"{path.name}: no lecture {path.name[:2]} for this lab notebook"
    first = nb.cells[0].source
    assert re.match(rf"# Lab {path.name[:2]} · \S", first), "first cell starts with '# Lab NN · Title'"
    assert "*Lab book, optional.*" in first and "*Runtime:*" in first
    assert not [c for c in nb.cells if "nbgrader" in c.metadata], "the lab book is never graded"
    text = "\n".join(c.source for c in _read(lecture[0]).cells if c.cell_type == "markdown")
    assert f"lab/{path.name}" in text, f"{lecture[0].name} points to its lab notebook lab/{path.name}"


def test_there_are_notebooks():
    assert NOTEBOOKS, "no notebooks/NN_name.ipynb found"
    numbers = [p.name[:2] for p in NOTEBOOKS]
    assert len(set(numbers)) == len(numbers), "a notebook number is used twice"
    assert numbers[0] == "00"


@pytest.mark.parametrize("path", EVERY, ids=_ids(EVERY))
def test_name_size_and_format(path):
    assert re.fullmatch(r"\d\d_[a-z0-9_]+\.ipynb", path.name), "names are NN_snake_case.ipynb"
    assert path.stat().st_size < 2_000_000, f"{path.name} is {path.stat().st_size / 1e6:.1f} MB; keep it under 2 MB"
    nb = _read(path)
    nbformat.validate(nb)
    assert nb.metadata["kernelspec"]["name"] == "python3"


@pytest.mark.parametrize("path", EVERY, ids=_ids(EVERY))
def test_executed_top_to_bottom_in_one_kernel(path):
    counts = [c.execution_count for c in _read(path).cells if c.cell_type == "code"]
    assert None not in counts, "some code cells were never executed: run `make execute`"
    assert counts == list(range(1, len(counts) + 1)), "cells were not run top to bottom in one fresh kernel"


@pytest.mark.parametrize("path", EVERY, ids=_ids(EVERY))
def test_outputs_are_clean(path):
    for i, cell in enumerate(_read(path).cells):
        if cell.cell_type != "code":
            continue
        ignored = "nbval-ignore-output" in _tags(cell)
        for output in cell.outputs:
            if output.output_type == "error":
                assert "raises-exception" in _tags(cell), f"cell {i} has an error output ({output.ename})"
            text = _output_text(output)
            assert not MACHINE_PATH.search(text), f"cell {i} output shows a machine path"
            assert not ADDRESS.search(text), f"cell {i} output shows a memory address"
            if not ignored:
                assert not VOLATILE.search(text), f"cell {i} output has a rate or timestamp that changes every run"
            assert "image/svg+xml" not in output.get("data", {}), f"cell {i}: SVG output changes every run; use PNG"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_skeleton(path):
    nb = _read(path)
    markdown = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    first = nb.cells[0].source
    assert re.match(rf"# {path.name[:2]} · \S", first), "first cell starts with '# NN · Title'"
    assert "*Prerequisites:*" in first and "*Runtime:*" in first
    positions = []
    for section in SECTIONS:
        present = re.search(rf"^{re.escape(section)}\s*$", markdown, re.M)
        assert present or section in OPTIONAL, f"missing section '{section}'"
        if present:
            positions.append(markdown.index(section))
    assert positions == sorted(positions), f"sections out of order; expected {SECTIONS}"
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    assert re.search(r"^setup\(", code, re.M), "the Setup section calls setup()"
    assert not re.search(r"^\s*from \S+ import \*", code, re.M), "no star imports"
    objectives = markdown.split("## Learning objectives", 1)[1].split("\n## ", 1)[0]
    bullets = [line for line in objectives.splitlines() if line.startswith("* ")]
    assert 3 <= len(bullets) <= 5, "3-5 learning objectives"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_exercises_are_graded_and_followed_by_the_reference(path):
    """Each solution cell has a graded test cell after it; then the notebook goes on with course_utils."""
    cells = _read(path).cells
    solutions = [i for i, c in enumerate(cells) if c.metadata.get("nbgrader", {}).get("solution")
                 and c.cell_type == "code"]
    assert solutions, "each notebook has graded exercises"
    for i in solutions:
        grade_id = cells[i].metadata["nbgrader"]["grade_id"]
        assert "### BEGIN SOLUTION" in cells[i].source and "### END SOLUTION" in cells[i].source
        test = cells[i + 1]
        meta = test.metadata.get("nbgrader", {})
        assert meta.get("grade") and meta.get("locked") and meta.get("points", 0) > 0, f"{grade_id}: next cell is a graded test cell"
        assert "### BEGIN HIDDEN TESTS" in test.source, f"{grade_id}: the test cell has hidden tests"
        # Grading fails closed: an open exercise raises in its test cell under any grader, and the tag lets Run All
        # (JupyterLab, nbclient, nbgrader) go on past it. The instructor's solution passes: no error is committed.
        assert "raises-exception" in _tags(test), f"{grade_id}: the graded test cell is tagged raises-exception"
        for cell in (cells[i], test):
            assert not [o for o in cell.get("outputs", []) if o.output_type == "error"], \
                f"{grade_id}: the instructor's solution fails its own check"
        assert re.search(r"check_\w+\(", test.source.split("### BEGIN HIDDEN TESTS")[0]), f"{grade_id}: visible tests use a checker"
        if not re.search(r"^(def|class) ", cells[i].source, re.M):
            continue  # a value answer: nothing follows from it, and no answer key ships to replace it
        fallback = cells[i + 2].source
        assert re.search(rf"^{grade_id} = [\w.]+", fallback, re.M), f"{grade_id}: the cell after the test switches to the reference"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_one_written_question_graded_by_hand_with_a_rubric(path):
    """One written question per notebook, after the exercises, with a model answer and a rubric for the marker."""
    cells = _read(path).cells
    answers = [i for i, c in enumerate(cells) if written.is_written(c)]
    assert len(answers) == 1, f"one hand-graded written answer cell (markdown, nbgrader solution + grade), found {len(answers)}"
    i = answers[0]
    meta = cells[i].metadata["nbgrader"]
    assert meta["grade_id"].startswith("written_") and meta.get("points", 0) > 0 and not meta.get("locked")
    assert meta["grade_id"] not in {m["grade_id"] for c in cells[:i] + cells[i + 1:]
                                    for m in [c.metadata.get("nbgrader", {})] if "grade_id" in m}
    assert not written.check_answer_cell(cells[i].source), (
        f"the answer cell needs {' and '.join(written.check_answer_cell(cells[i].source))}")
    question = cells[i - 1]
    assert question.cell_type == "markdown" and question.source.startswith("### Question"), (
        "the cell before the answer asks the question, under a '### Question' heading")
    assert f"{meta['points']:g} point" in question.source, "the question says what it is worth"
    headings = [(j, c.source) for j, c in enumerate(cells) if c.cell_type == "markdown"]
    exercises_at = next(j for j, src in headings if src.startswith("## Exercises"))
    after = next(j for j, src in headings if src.startswith(("## Common pitfalls", "## Summary")))
    assert exercises_at < i < after, "the written question belongs to the Exercises section"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_every_exercise_has_hints_in_steps_that_stop_short_of_the_solution(path):
    """``hint("name")`` gives at least three steps for every exercise, and no step contains a line of its solution."""
    cells = _read(path).cells
    solutions = {c.metadata["nbgrader"]["grade_id"]: c.source for c in cells
                 if c.metadata.get("nbgrader", {}).get("solution") and c.cell_type == "code"}
    known = {name: h for name, h in hints.all_hints().items() if h.notebook == path.stem}
    assert set(known) == set(solutions), (f"course_utils/checks/hint_texts/{path.stem}.toml must have hints for exactly the exercises "
                                          f"of {path.stem}: missing {sorted(set(solutions) - set(known))}, "
                                          f"unknown {sorted(set(known) - set(solutions))}")
    for name, source in solutions.items():
        steps = known[name].steps
        assert len(steps) >= 3, f"{name}: at least three hints, from a nudge to one just short of the solution"
        answer = source.split("### BEGIN SOLUTION")[1].split("### END SOLUTION")[0]
        lines = {re.sub(r"\s+", "", line.split("#")[0]) for line in answer.splitlines()}
        lines = {line for line in lines if len(line) >= 12}
        text = re.sub(r"\s+", "", "\n".join(steps))
        leaked = sorted(line for line in lines if line in text)
        assert not leaked, f"{name}: a hint gives away a line of the solution: {leaked}"
    exercises_text = "\n".join(c.source for c in cells if c.cell_type == "markdown")
    assert "hint(" in exercises_text, "the Exercises section tells the learner how to ask for a hint"


# --- a concept is written once: notebook code == course_utils code -----------


def _public_functions() -> dict[str, object]:
    """Public functions and classes of course_utils by name; a name defined twice is an error."""
    found: dict[str, object] = {}
    for info in pkgutil.walk_packages(course_utils.__path__, prefix="course_utils."):
        if info.ispkg or info.name.startswith("course_utils.tooling.") or info.name == "course_utils.core.portable":
            continue  # the course's tools are not concepts a notebook teaches
        module = importlib.import_module(info.name)
        for name, obj in vars(module).items():
            if not name.startswith("_") and callable(obj) and getattr(obj, "__module__", "") == module.__name__:
                assert name not in found, (
                    f"{name} is defined in both {found[name].__module__} and {module.__name__}: "
                    "define a concept once and import it"
                )
                found[name] = obj
    return found


def _normalised(node: ast.AST) -> str:
    """AST dump without docstrings (comments are already gone)."""
    node = ast.parse(ast.unparse(node))
    for sub in ast.walk(node):
        body = getattr(sub, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) and isinstance(body[0].value.value, str):
            sub.body = body[1:] or [ast.Pass()]
    return ast.dump(node)


def test_notebook_definitions_match_course_utils():
    """A function a notebook defines under the name of a course_utils function must be the same code."""
    import inspect

    library = _public_functions()
    compared = 0
    for path in NOTEBOOKS:
        for cell in _read(path).cells:
            if cell.cell_type != "code":
                continue
            try:
                tree = ast.parse(cell.source)
            except SyntaxError:
                continue
            for node in tree.body:
                if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name in library:
                    reference = ast.parse(inspect.getsource(library[node.name])).body[0]
                    assert _normalised(node) == _normalised(reference), (
                        f"{path.name} defines {node.name} differently from course_utils: keep them identical"
                    )
                    compared += 1
    assert compared >= 3, "expected the notebooks' exercise solutions to be compared with course_utils"
