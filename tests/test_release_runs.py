"""Run All on the untouched student version runs to the end, on the course's reference.

Each release notebook (no solutions, no outputs) is executed top to bottom in a
fresh kernel, as a learner's Run All would (nbclient, like JupyterLab, goes on
past a cell tagged ``raises-exception``). Every exercise is left open, so each
graded check cell must end in ``ExerciseOpen`` (which any grader scores 0), no
other cell may raise, and the notebook must say that it goes on with the
course's version.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

from course_utils.tooling import grading
from course_utils.tooling.autograder import NOTEBOOKS, course_notebooks, exercises
from course_utils.tooling.execute import execute_notebook

PATHS = course_notebooks(NOTEBOOKS)


@pytest.fixture(scope="module")
def released(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("learner copy")  # a space in the path, as in a learner's home folder
    grading.release(out=out, quiet=True)
    return out


def _text(nb: nbformat.NotebookNode) -> str:
    return "\n".join(out.get("text", "") for c in nb.cells if c.cell_type == "code" for out in c.get("outputs", [])
                     if out.get("output_type") == "stream")


@pytest.mark.parametrize("path", PATHS, ids=[p.stem for p in PATHS])
def test_run_all_on_the_untouched_release_runs_to_the_end(path, released):
    notebook = released / path.name
    execute_notebook(notebook, timeout=300)  # raises CellExecutionError if a cell not tagged raises-exception fails
    executed = nbformat.read(notebook, as_version=4)
    text = _text(executed)
    failed = {c.metadata.get("nbgrader", {}).get("grade_id", f"cell {i}"): o["ename"]
              for i, c in enumerate(executed.cells) if c.cell_type == "code"
              for o in c.get("outputs", []) if o.get("output_type") == "error"}
    expected = {ex.grade_id: "ExerciseOpen" for ex in exercises(path)}
    # a value answer left open raises NotImplementedError in its own tagged cell
    solutions = {k: v for k, v in failed.items() if k not in expected}
    assert {k: v for k, v in failed.items() if k in expected} == expected, f"{path.name}: {failed}"
    assert set(solutions.values()) <= {"NotImplementedError"}, f"{path.name}: a cell failed: {solutions}"
    assert "uses the course's" in text, f"{path.name}: the notebook says it goes on with the course's version"
    assert "From here on the notebook uses your" not in text
