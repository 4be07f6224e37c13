"""Grading fails closed under plain nbgrader, as most nbgrader courses grade.

An instructor who takes a notebook of this course into an nbgrader course of
their own runs nbgrader's own commands, with nbgrader's defaults and without
the course's sandbox (``make grade``). For every notebook, in a fresh nbgrader
course: ``nbgrader generate_assignment``, then ``nbgrader autograde`` of the
instructor version and of the untouched release, then ``nbgrader export``. The
instructor version must get every autograded point and the untouched release
none: an open exercise fails its check in any kernel, whoever runs it.
``nbgrader validate``, which a learner or a JupyterHub's assignment list runs,
must report the untouched release as failing.

The kernels train for a few steps only (``course_utils.experiments.loop.SMOKE_ENV``):
graded cells never depend on a trained model.
"""

from __future__ import annotations

import csv
import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from conftest import NOTEBOOKS
from course_utils.experiments import loop
from course_utils.tooling.autograder import exercises

BIN = Path(sys.executable).parent  # nbgrader shells out to alembic: the environment's bin/ must be on PATH


def _nbgrader(course: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", **{loop.SMOKE_ENV: "1"})
    done = subprocess.run([str(BIN / "nbgrader"), *args], cwd=course, env=env, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, f"nbgrader {' '.join(args)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def _course(tmp_path: Path, path: Path) -> Path:
    """A plain nbgrader course (nbgrader's defaults, no config file) whose one assignment is ``path``."""
    course = tmp_path / "plain course"  # a space in the path, as in a home folder
    (course / "source" / path.stem).mkdir(parents=True)
    shutil.copy(path, course / "source" / path.stem / path.name)
    return course


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_plain_nbgrader_gives_the_instructor_full_marks_and_the_untouched_release_zero(path, tmp_path):
    course = _course(tmp_path, path)
    stem = path.stem
    _nbgrader(course, "generate_assignment", stem, "--force")
    released = course / "release" / stem / path.name
    assert released.is_file()
    for student, source in (("instructor", path), ("untouched", released)):
        target = course / "submitted" / student / stem / path.name
        target.parent.mkdir(parents=True)
        shutil.copy(source, target)
    # the timeout an instructor sets for a notebook that trains; nbgrader's default is 30 s per cell
    _nbgrader(course, "autograde", stem, "--force", "--ExecutePreprocessor.timeout=300")
    _nbgrader(course, "export", "--to", "grades.csv")
    with open(course / "grades.csv", newline="", encoding="utf-8") as f:
        rows = {row["student_id"]: row for row in csv.DictReader(f)}
    possible = sum(ex.points for ex in exercises(path))
    autograded_points = {s: float(rows[s]["raw_score"]) for s in ("instructor", "untouched")}
    # the written question is graded by hand: autograding leaves it at 0 for both
    assert autograded_points["instructor"] == possible, f"{path.name}: the instructor version must get every point"
    assert autograded_points["untouched"] == 0, (
        f"{path.name}: the untouched release got {autograded_points['untouched']} of {possible} points "
        "under plain nbgrader: an open exercise must fail its check in any kernel")
    # and the graded cells of the untouched release show why: the check says the exercise is open
    graded = nbformat.read(course / "autograded" / "untouched" / stem / path.name, as_version=4)
    for cell in graded.cells:
        if cell.cell_type == "code" and cell.metadata.get("nbgrader", {}).get("grade"):
            errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
            grade_id = cell.metadata["nbgrader"]["grade_id"]
            assert errors and errors[0]["ename"] == "ExerciseOpen", f"{path.name}, {grade_id}: {errors[:1]}"
            assert "Exercise still open" in errors[0]["evalue"]


@pytest.mark.slow
def test_nbgrader_validate_reports_the_untouched_release_as_failing(tmp_path):
    path = NOTEBOOKS[0]
    course = _course(tmp_path, path)
    _nbgrader(course, "generate_assignment", path.stem, "--force")
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    released = course / "release" / path.stem / path.name
    done = subprocess.run([str(BIN / "nbgrader"), "validate", str(released)], cwd=course, env=env,
                          capture_output=True, text=True, timeout=600)
    assert "VALIDATION FAILED" in done.stdout, done.stdout[-2000:]
    assert "Exercise still open" in done.stdout, done.stdout[-2000:]
    # the instructor version validates
    done = subprocess.run([str(BIN / "nbgrader"), "validate", str(path)], cwd=course, env=env,
                          capture_output=True, text=True, timeout=600)
    assert "Success! Your notebook passes all the tests." in done.stdout, done.stdout[-2000:]
