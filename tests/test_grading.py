"""nbgrader pipeline: the release hides solutions and hidden tests; autograding gives the right marks.

For every notebook: the instructor version gets full marks, the untouched
release gets zero without crashing, and a submission with one known-buggy
exercise (tests/buggy_answers.py) loses exactly that exercise's points.
Bad submissions are reported as failed with a reason while the rest are graded,
and grading never modifies its inputs.
"""

from __future__ import annotations

import json

import copy
import csv
import hashlib
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from buggy_answers import BUGGY
from conftest import LAB, NOTEBOOKS, ROOT
from helpers import SOLUTION
from course_utils.experiments import loop
from course_utils.tooling import grading, written

HIDDEN = re.compile(r"### BEGIN HIDDEN TESTS\n(.*?)### END HIDDEN TESTS", re.S)


def _ids(paths):
    return [p.stem for p in paths]


def _digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _with_answer(nb, grade_id: str, source: str):
    nb = copy.deepcopy(nb)
    cell = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id)
    cell.source = source
    return nb


@pytest.fixture(scope="module")
def released(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("release")
    before = _digest(ROOT / "notebooks")
    grading.release(out=out)
    assert _digest(ROOT / "notebooks") == before, "the release changed the instructor notebooks"
    return out


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_release_has_no_solutions_no_hidden_tests_no_outputs(path, released):
    instructor = nbformat.read(path, as_version=4)
    student = released / path.name
    text = student.read_text(encoding="utf-8")
    assert "BEGIN SOLUTION" not in text and "HIDDEN TESTS" not in text
    secret_lines, public_lines = set(), set()
    for cell in instructor.cells:
        for block in SOLUTION.findall(cell.source) + HIDDEN.findall(cell.source):
            secret_lines |= {line.strip() for line in block.splitlines() if len(line.strip()) > 8}
        public = HIDDEN.sub("", SOLUTION.sub("", cell.source))
        public_lines |= {line.strip() for line in public.splitlines()}
    secret_lines -= public_lines  # e.g. `B, T, D = x.shape` also appears in a visible pitfall cell
    assert secret_lines, "the instructor notebook has solutions and hidden tests"
    release_nb = nbformat.read(student, as_version=4)
    release_code = "\n".join(c.source for c in release_nb.cells)
    leaked = sorted(line for line in secret_lines if line in release_code)
    assert not leaked, f"solution or hidden-test lines left in the student release: {leaked}"
    assert all(not c.get("outputs") for c in release_nb.cells if c.cell_type == "code"), "the release has outputs"
    stubs = [c for c in release_nb.cells if c.metadata.get("nbgrader", {}).get("solution") and c.cell_type == "code"]
    assert stubs and all("    raise NotImplementedError()" in c.source or "# YOUR CODE HERE" in c.source for c in stubs)
    # the written question: its answer cell (model answer and rubric) is replaced by a stub
    rubrics = [c.source for c in instructor.cells if written.is_written(c)]
    answer_cells = [c.source for c in release_nb.cells if written.is_written(c)]
    assert rubrics and answer_cells == [written.STUB] * len(rubrics), "the release keeps each written-answer cell, empty"
    rubric_lines = {line.strip() for text in rubrics for line in text.splitlines() if len(line.strip()) > 20}
    release_text = "\n".join(c.source for c in release_nb.cells)
    assert not [line for line in rubric_lines if line in release_text], "a line of a model answer or rubric is in the release"


def test_every_exercise_has_a_known_buggy_answer():
    for path in NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        solutions = {c.metadata["nbgrader"]["grade_id"] for c in nb.cells
                     if c.metadata.get("nbgrader", {}).get("solution") and c.cell_type == "code"}
        assert solutions == set(BUGGY.get(path.stem, {})), f"tests/buggy_answers.py must cover every exercise of {path.name}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_autograde_round_trip(path, released, tmp_path, monkeypatch):
    # nbval already runs every notebook at its full training budget; here the
    # kernels train for a few steps only (course_utils.experiments.loop.SMOKE_ENV), so
    # each submission grades in seconds. Graded cells never depend on a trained model.
    monkeypatch.setenv(loop.SMOKE_ENV, "1")
    instructor = nbformat.read(path, as_version=4)
    exercises = grading.exercises(path)
    points = {ex.grade_id: ex.points for ex in exercises}
    submissions = tmp_path / "submissions"
    (submissions / "instructor").mkdir(parents=True)
    nbformat.write(instructor, submissions / "instructor" / path.name)
    (submissions / "untouched").mkdir()
    (submissions / "untouched" / path.name).write_bytes((released / path.name).read_bytes())
    # a solution cell and the test cell that grades it share a prefix: <name> / <name>_tests
    for grade_id, source in BUGGY[path.stem].items():
        (submissions / f"buggy-{grade_id}").mkdir()
        nbformat.write(_with_answer(instructor, grade_id, source), submissions / f"buggy-{grade_id}" / path.name)
    before = _digest(submissions)

    results = {r.student: r for r in grading.autograde(submissions, course=tmp_path / "course", timeout=300)}

    assert _digest(submissions) == before, "grading modified the submitted files"
    assert all(not r.failed for r in results.values()), {s: r.failed for s, r in results.items() if r.failed}
    assert results["instructor"].scores == points, "the instructor version must get full marks"
    assert results["untouched"].scores == {g: 0.0 for g in points}, "the untouched release must get zero"
    for grade_id in BUGGY[path.stem]:
        expected = dict(points, **{f"{grade_id}_tests": 0.0})
        assert results[f"buggy-{grade_id}"].scores == expected, f"a wrong {grade_id} must lose exactly its points"


def test_bad_submissions_fail_with_a_reason_and_the_rest_are_graded(released, tmp_path):
    path = NOTEBOOKS[0]
    instructor = nbformat.read(path, as_version=4)
    first_test = grading.exercises(path)[0].grade_id
    subs = tmp_path / "submissions"
    for student in ("good", "badjson", "deleted", "edited", "hangs", "extra"):
        (subs / student).mkdir(parents=True)
    nbformat.write(instructor, subs / "good" / path.name)
    (subs / "badjson" / path.name).write_text('{"cells": [', encoding="utf-8")
    deleted = copy.deepcopy(instructor)
    deleted.cells = [c for c in deleted.cells if c.metadata.get("nbgrader", {}).get("grade_id") != first_test]
    nbformat.write(deleted, subs / "deleted" / path.name)
    nbformat.write(_with_answer(instructor, first_test, "pass  # tests removed"), subs / "edited" / path.name)
    solution_id = next(iter(BUGGY[path.stem]))
    nbformat.write(_with_answer(instructor, solution_id, "import time\nwhile True:\n    time.sleep(0.1)\n"),
                   subs / "hangs" / path.name)
    nbformat.write(instructor, subs / "extra" / "99_not_in_course.ipynb")
    before_subs, before_nbs = _digest(subs), _digest(ROOT / "notebooks")

    results = {(r.student, r.notebook): r for r in grading.autograde(subs, course=tmp_path / "course", timeout=10)}

    stem = path.stem
    assert results[("good", stem)].failed == "" and results[("good", stem)].total == sum(
        ex.points for ex in grading.exercises(path))
    assert results[("badjson", stem)].failed.startswith("not valid notebook JSON")
    assert results[("deleted", stem)].failed == f"test cell '{first_test}' was deleted"
    assert results[("edited", stem)].failed == f"test cell '{first_test}' was edited"
    assert results[("hangs", stem)].failed == "a cell ran longer than the 10 s limit per cell"
    assert results[("extra", "99_not_in_course")].failed == "99_not_in_course.ipynb is not a course notebook"
    assert all(not r.scores for r in results.values() if r.failed)
    feedback = tmp_path / "course" / "feedback"
    assert (feedback / "good" / stem / f"{stem}.html").is_file(), "graded students get HTML feedback"
    assert not (feedback / "edited").exists(), "no feedback for a submission that failed validation"
    rows = list(csv.DictReader(grading.write_grades_csv(list(results.values()), tmp_path / "grades.csv").open()))
    good = [r for r in rows if r["student"] == "good"]
    auto = [ex.grade_id for ex in grading.exercises(path)]
    hand = [q.grade_id for q in written.questions(path)]
    assert [r["exercise"] for r in good] == auto + hand, "autograded exercises, then the written question"
    assert all(r["points"] == r["max_points"] for r in good if r["exercise"] in auto)
    assert all(r["points"] == "" for r in good if r["exercise"] in hand), "a written answer waits for its hand mark"
    assert all(r["status"] == "graded; to mark by hand: " + ", ".join(hand) for r in good)
    assert [r["status"] for r in rows if r["student"] == "edited"] == [f"FAILED: test cell '{first_test}' was edited"]
    assert _digest(subs) == before_subs and _digest(ROOT / "notebooks") == before_nbs, "grading modified its inputs"

    table = grading.format_table(list(results.values()))
    assert re.search(rf"good\s+.*to mark/3\s+{sum(ex.points for ex in grading.exercises(path)):g}/\S+ so far\s+graded; "
                     "to mark by hand: written_", table)
    assert "FAILED: test cell" in table


def test_grading_command_line_reports_a_missing_folder(tmp_path):
    run = subprocess.run([sys.executable, "-m", "course_utils.tooling.grading", "autograde", str(tmp_path / "nope")],
                         capture_output=True, text=True, cwd=ROOT)
    assert run.returncode == 2
    assert "no submissions folder" in run.stderr and "Traceback" not in run.stderr


def test_release_keeps_a_learners_edited_notebook(tmp_path):
    out = tmp_path / "release"
    first = grading.release(out=out)
    assert [p.relative_to(out).as_posix() for p in first] == [p.name for p in NOTEBOOKS] + [f"lab/{p.name}" for p in LAB]
    edited = out / NOTEBOOKS[0].name
    edited.write_text(edited.read_text(encoding="utf-8").replace("# YOUR CODE HERE", "# my attempt"), encoding="utf-8")
    mine = edited.read_bytes()
    second = grading.release(out=out)
    assert edited.read_bytes() == mine, "make release overwrote a learner's work"
    assert edited not in second
    manifest = json.loads((out / ".released.json").read_text())
    manifest["sources"] = {}  # as after the instructor notebooks changed: everything is released again ...
    (out / ".released.json").write_text(json.dumps(manifest))
    third = grading.release(out=out)
    assert edited.read_bytes() == mine and edited not in third, "... except the notebook the learner edited"
    assert len(third) == len(NOTEBOOKS) + len(LAB) - 1
    edited.unlink()
    assert edited in grading.release(out=out)  # deleted -> fresh copy
    assert "my attempt" not in edited.read_text(encoding="utf-8")


def test_the_lab_book_is_released_as_it_is_and_never_graded(released):
    for path in LAB:
        assert (released / "lab" / path.name).read_bytes() == path.read_bytes(), "a lab notebook is released as it is"
        nb = nbformat.read(path, as_version=4)
        assert not [c for c in nb.cells if "nbgrader" in c.metadata], f"{path.name}: the lab book is never graded"


def test_a_self_study_copy_shows_a_model_answer_only_once_the_learners_is_saved(tmp_path, monkeypatch):
    from IPython import display as ipython_display

    from course_utils.checks import show_model_answer

    graded, own = tmp_path / "release", tmp_path / "my notebooks"
    grading.release(out=graded)
    grading.release(out=own, self_study=True)
    assert not (graded / ".model_answers").exists(), "the graded release has no model answers"
    path = NOTEBOOKS[0]
    question = written.questions(path)[0]
    for folder, cells_after in ((graded, 0), (own, 1)):
        nb = nbformat.read(folder / path.name, as_version=4)
        calls = [c for c in nb.cells if "show_model_answer(" in c.source]
        assert len(calls) == cells_after * len(written.questions(path)), folder
    nb = nbformat.read(own / path.name, as_version=4)
    at = next(i for i, c in enumerate(nb.cells) if written.is_written(c))
    assert f"show_model_answer({path.stem!r}, {question.grade_id!r})" in nb.cells[at + 1].source
    shown = []
    monkeypatch.setattr(ipython_display, "display", lambda obj: shown.append(obj.data))
    monkeypatch.chdir(own)  # the kernel of a learner's notebook runs in its folder
    monkeypatch.delenv("JPY_SESSION_NAME", raising=False)
    show_model_answer(path.stem, question.grade_id)  # the answer still "YOUR ANSWER HERE": nothing shown
    assert shown == []
    nb.cells[at].source = "Masks keep the padding out of the softmax."
    nbformat.write(nb, own / path.name)
    monkeypatch.setenv("JPY_SESSION_NAME", str(own / path.name))
    show_model_answer(path.stem, question.grade_id)
    assert shown == [question.rubric], "once the answer is saved, the model answer and rubric are shown"


def test_a_print_cut_into_pieces_by_the_kernel_reads_as_one_output(tmp_path):
    """On a busy machine the kernel may flush one cell's prints in two pieces: feedback must not depend on it."""
    from course_utils.tooling import autograder

    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("print('a'); print('b')")
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="a\n"),
                    nbformat.v4.new_output("stream", name="stdout", text="b\n"),
                    nbformat.v4.new_output("stream", name="stderr", text="warn\n")]
    nb.cells.append(cell)
    path = tmp_path / "x.ipynb"
    nbformat.write(nb, path)
    autograder._coalesce_streams(path)
    outputs = nbformat.read(path, as_version=4).cells[0].outputs
    assert [(o.name, o.text) for o in outputs] == [("stdout", "a\nb\n"), ("stderr", "warn\n")]
