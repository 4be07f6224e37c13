"""One student's notebooks through nbgrader, each run in the sandbox (the unit of work of ``make grade``).

:func:`grade_student` takes one student's submitted files, a course folder
built once for the class (:func:`build_course`: the instructor's notebooks,
their release and nbgrader's gradebook) and the grading folder. It grades in a
fresh copy of that course, so that students graded at the same time, in other
processes or on other machines, never share a gradebook (nbgrader's gradebook
is one SQLite file and nbgrader grades one submission at a time). It keeps
what the instructor reads (the autograded notebooks, the feedback pages, the
student's gradebook) and returns one :class:`~course_utils.tooling.submissions.Result`
per notebook.

What runs in the notebook's kernel is what grading needs: the ``## Setup``
cells, the cells tagged ``grading-context``, the ``## Exercises`` section,
the solution cells, the test cells, and the cells that only import and define
(the same context the out-of-kernel verdict's child runs, and the definitions
its checks use: :attr:`course_utils.tooling.verdict.Plan.kernel`). The
experiments that fill the rest of a notebook (training runs, sweeps, figures)
do not run: no test cell reads them, and the verdict, which never ran them,
already scores any exercise that would need one as 0. In the feedback those
cells appear without outputs.
"""

from __future__ import annotations

import contextlib
import copy
import html
import io
import logging
import os
import re
import shutil
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from course_utils.tooling import written as written_questions
from course_utils.tooling.submissions import Result, assemble, static_flags, validate

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"
LAB = "lab"  # the lab book's folder, inside the notebooks' folder and inside a release
COURSE_ID = "attention-course"
DEFAULT_TIMEOUT = 180  # seconds per cell when autograding
MAX_SUBMISSION_BYTES = 50 * 2**20


@dataclass(frozen=True)
class Exercise:
    """One graded test cell of a notebook."""

    notebook: str  # notebook stem, e.g. "00_orientation" (= nbgrader assignment)
    grade_id: str  # nbgrader grade_id of the test cell, e.g. "masked_softmax_tests"
    points: float  # points it is worth


def course_notebooks(notebooks_dir: Path = NOTEBOOKS) -> list[Path]:
    """The course notebooks (the lectures) in a folder, in order."""
    return sorted(Path(notebooks_dir).glob("[0-9][0-9]_*.ipynb"))


def lab_notebooks(notebooks_dir: Path = NOTEBOOKS) -> list[Path]:
    """The lab book's notebooks (``lab/NN_name.ipynb``, NN the lecture they back), in order: optional, never graded."""
    return sorted((Path(notebooks_dir) / LAB).glob("[0-9][0-9]_*.ipynb"))


def exercises(notebook: Path) -> list[Exercise]:
    """The graded test cells of an instructor notebook, in order."""
    nb = nbformat.read(notebook, as_version=4)
    found = []
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader", {})
        if meta.get("grade") and cell.cell_type == "code":
            found.append(Exercise(notebook.stem, meta["grade_id"], float(meta["points"])))
    return found


def gradable(notebook: Path) -> list[Exercise]:
    """Every graded item of a notebook: the autograded test cells, then the written questions."""
    return exercises(notebook) + [Exercise(notebook.stem, q.grade_id, q.points)
                                  for q in written_questions.questions(notebook)]


class SandboxFailure(RuntimeError):
    """A submission's run in the sandbox did not finish; the message says why."""


_SANDBOXED_EXECUTE = None


def _sandboxed_execute():
    """nbgrader's Execute step, run in the sandbox (built lazily: nbgrader is slow to import)."""
    global _SANDBOXED_EXECUTE
    if _SANDBOXED_EXECUTE is not None:
        return _SANDBOXED_EXECUTE
    from nbgrader.preprocessors import NbGraderPreprocessor
    from traitlets import Integer, List, Unicode

    from course_utils.tooling import sandbox
    from course_utils.tooling.verdict.cells import plan

    class SandboxedExecute(NbGraderPreprocessor):
        """Execute the cells grading needs in the sandbox; a run that does not finish raises ``SandboxFailure``."""

        timeout = Integer(DEFAULT_TIMEOUT, help="seconds allowed per cell").tag(config=True)
        hide = List(Unicode(), help="folders the notebook must not see").tag(config=True)

        def preprocess(self, nb, resources):
            keep = plan(nb, nb).kernel  # from the instructor's cells only: a solution cell cannot change it
            run = copy.deepcopy(nb)
            run.cells = [run.cells[i] for i in keep]
            executed, reason = sandbox.execute(run, hide=[Path(p) for p in self.hide], cell_timeout=self.timeout)
            if executed is None:
                raise SandboxFailure(reason)
            if [c.source for c in executed.cells] != [c.source for c in run.cells]:
                raise SandboxFailure("the sandbox returned other cells than it was given")
            for cell in executed.cells:
                if any(out.get("ename") == "CellTimeoutError" for out in cell.get("outputs", [])):
                    raise SandboxFailure(f"a cell ran longer than the {self.timeout} s limit per cell")
            graded = copy.deepcopy(nb)
            for index, cell in zip(keep, executed.cells):
                graded.cells[index] = cell
            return graded, resources

    _SANDBOXED_EXECUTE = SandboxedExecute
    return SandboxedExecute


def env_for_nbgrader() -> None:
    """nbgrader shells out to ``alembic``, which lives beside this interpreter."""
    bin_dir = str(Path(sys.executable).parent)
    if bin_dir not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = bin_dir + os.pathsep + os.environ.get("PATH", "")
    os.environ.pop("MPLBACKEND", None)


def _api(course: Path, timeout: int, hide: list[Path] = ()):
    from nbconvert.preprocessors import ClearMetadataPreprocessor, CoalesceStreamsPreprocessor
    from nbgrader.apps import NbGraderAPI
    from nbgrader.coursedir import CourseDirectory
    from nbgrader.preprocessors import (AssignLatePenalties, CheckCellMetadata, IgnorePattern, LimitOutput,
                                        SaveAutoGrades)
    from traitlets.config import Config

    config = Config()
    config.CourseDirectory.root = str(course)
    config.CourseDirectory.course_id = COURSE_ID
    # The student's code runs only in the sandbox; nbgrader reads its outputs and scores them out here.
    execute = _sandboxed_execute()
    # One stream output where the kernel flushed twice: the feedback does not depend on timing.
    config.Autograde.autograde_preprocessors = [execute, CoalesceStreamsPreprocessor, IgnorePattern,
                                                ClearMetadataPreprocessor, LimitOutput, SaveAutoGrades,
                                                AssignLatePenalties, CheckCellMetadata]
    config.SandboxedExecute.timeout = timeout
    config.SandboxedExecute.hide = [str(p) for p in hide]
    coursedir = CourseDirectory(config=config)
    return NbGraderAPI(coursedir=coursedir, config=config)


@contextlib.contextmanager
def quiet():
    """Silence nbgrader's and the kernel's chatter on stderr."""
    buffer = io.StringIO()
    previous = logging.root.level
    logging.root.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stderr(buffer):
            yield buffer
    finally:
        logging.root.setLevel(previous)


def build_course(notebooks: list[Path], course: Path, timeout: int = DEFAULT_TIMEOUT, hide: list[Path] = ()):
    """Make a fresh nbgrader course folder and generate the release of each notebook.

    Args:
        notebooks: Instructor notebooks (copied, never modified).
        course: Folder to (re)create.
        timeout: Seconds allowed per cell when autograding.
        hide: Folders a student's notebook must not see when autograding.

    Returns:
        The ``NbGraderAPI`` of the course.

    Raises:
        RuntimeError: If nbgrader cannot generate a release (bad cell metadata).
    """
    env_for_nbgrader()
    if course.exists():
        shutil.rmtree(course)
    for nb in notebooks:
        (course / "source" / nb.stem).mkdir(parents=True)
        shutil.copy2(nb, course / "source" / nb.stem / nb.name)
    api = _api(course, timeout, hide)
    for nb in notebooks:
        with quiet():
            result = api.generate_assignment(nb.stem, force=True)
        if not result["success"]:
            raise RuntimeError(f"nbgrader could not generate the release of {nb.name}:\n{result.get('error', '')}")
        _open_answers_run(course / "release" / nb.stem / nb.name)
        _drop_execution_stamps(course / "release" / nb.stem / nb.name)
    return api


STUB = "raise NotImplementedError()"


STAMP_KEY = "course"  # the cell metadata key of those stamps (course_utils.tooling.execute writes it)


def _drop_execution_stamps(path: Path) -> None:
    """Remove the stamps ``make execute`` leaves on cells whose output nbval ignores (``execute.stamp_ignored_outputs``).

    They say which source made the instructor's committed output; the release has no outputs, so they mean nothing
    in a learner's copy.
    """
    nb = nbformat.read(path, as_version=4)
    stamped = [cell for cell in nb.cells if STAMP_KEY in cell.metadata]
    for cell in stamped:
        cell.metadata.pop(STAMP_KEY)
    if stamped:
        nbformat.write(nb, path)


def _open_answers_run(path: Path) -> None:
    """Let Run All go past an answer left open at the top level of a cell (not inside a function).

    nbgrader's stub, ``raise NotImplementedError()``, stops Run All when it stands
    at the top level of a solution cell (an answer that is a value, such as a set
    of statement numbers). There the stub line is dropped, so the value written
    above the solution (an empty set) stands, and the check says the exercise is
    open. Inside a function the stub stays: it raises only when the function is called.
    """
    nb = nbformat.read(path, as_version=4)
    changed = False
    for cell in nb.cells:
        if cell.cell_type == "code" and cell.metadata.get("nbgrader", {}).get("solution"):
            lines = cell.source.splitlines()
            kept = [line for line in lines if line != STUB]
            if kept != lines:
                cell.source, changed = "\n".join(kept), True
    if changed:
        nbformat.write(nb, path)


def scores(gradebook: Path, stem: str, student: str, exs: list[Exercise]) -> tuple[dict[str, float], list[str]]:
    """The automatic score of every exercise, and a flag for any manual score or extra credit in the gradebook."""
    from nbgrader.api import Gradebook

    flags = []
    with Gradebook(f"sqlite:///{gradebook}") as book:
        notebook = book.find_submission_notebook(stem, stem, student)
        by_cell = {}
        for grade in notebook.grades:
            by_cell[grade.cell.name] = grade.auto_score
            if grade.manual_score is not None:
                flags.append(f"{grade.cell.name}: a manual score ({grade.manual_score:g}) that autograding did not set")
            if grade.extra_credit:
                flags.append(f"{grade.cell.name}: extra credit ({grade.extra_credit:g}) that autograding did not set")
    return {ex.grade_id: float(by_cell.get(ex.grade_id) or 0.0) for ex in exs}, flags


@dataclass(frozen=True)
class Job:
    """One student's notebooks to grade (plain values: it goes to another process as it is)."""

    student: str
    files: dict[str, str]  # notebook stem -> submitted file
    template: str  # the course built once for the class (build_course)
    out: str  # the grading folder: autograded/, feedback/, gradebooks/ are kept there
    timeout: int = DEFAULT_TIMEOUT
    hide: list[str] = field(default_factory=list)


def grade_student(job: Job) -> tuple[list[Result], float]:
    """Grade one student's notebooks in a fresh copy of the class's course.

    Returns:
        One ``Result`` per submitted notebook (hand marks not applied), and the
        seconds it took. The autograded notebooks and the feedback pages go to
        ``out/autograded/<student>/`` and ``out/feedback/<student>/``, the
        student's gradebook to ``out/gradebooks/<student>.db``.
    """
    from course_utils.tooling import verdict  # torch, only when grading

    started = time.monotonic()
    env_for_nbgrader()
    out, template, hide = Path(job.out), Path(job.template), [Path(p) for p in job.hide]
    course = out / "work" / job.student
    if course.exists():
        shutil.rmtree(course)
    shutil.copytree(template, course)
    api = _api(course, job.timeout, hide)
    results = []
    for stem, path in sorted(job.files.items()):
        began = time.monotonic()
        results.append(_grade_notebook(api, course, out, job.student, stem, Path(path), hide, job.timeout, verdict))
        results[-1].seconds = round(time.monotonic() - began, 1)
    for kind in ("autograded", "feedback"):
        kept = course / kind / job.student
        if kept.is_dir():
            target = out / kind / job.student
            if target.exists():
                shutil.rmtree(target)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(kept, target)
    (out / "gradebooks").mkdir(parents=True, exist_ok=True)
    shutil.move(course / "gradebook.db", out / "gradebooks" / f"{job.student}.db")
    shutil.rmtree(course)
    return results, time.monotonic() - started


def _grade_notebook(api, course: Path, out: Path, student: str, stem: str, path: Path, hide: list[Path],
                    timeout: int, verdict) -> Result:
    source_nb = course / "source" / stem / f"{stem}.ipynb"
    release_nb = course / "release" / stem / f"{stem}.ipynb"
    size = path.stat().st_size
    if size > MAX_SUBMISSION_BYTES:
        return Result(student, stem, failed=f"the file is {size / 2**20:.0f} MB, over the "
                                            f"{MAX_SUBMISSION_BYTES // 2**20} MB limit: clear the outputs "
                                            "(Edit > Clear Outputs of All Cells) and save")
    reason = validate(path, release_nb, source_nb)
    if reason:
        return Result(student, stem, failed=reason)
    submitted = nbformat.read(path, as_version=4)
    released = nbformat.read(release_nb, as_version=4)
    flags = static_flags(submitted, released)
    target = course / "submitted" / student / stem / f"{stem}.ipynb"
    target.parent.mkdir(parents=True, exist_ok=True)
    graded_nb = assemble(submitted, released)
    nbformat.write(graded_nb, target)
    from course_utils.tooling import sandbox

    # One budget for the notebook's kernel and its verdict's child together (they run at the same time).
    with sandbox.Budget(sandbox.Limits.from_env(), label=f"{student}/{stem}") as budget, sandbox.shared(budget):
        judge = verdict.Judge(graded_nb, nbformat.read(source_nb, as_version=4), hide=hide, timeout=timeout,
                              budget=budget)
        judge.start()  # its child runs the notebook's context while nbgrader runs the kernel
        with quiet():
            outcome = api.autograde(stem, student, force=True, create=True)
        log = outcome.get("log", "") + outcome.get("error", "")
        unavailable = re.search(r"SandboxUnavailable: (.*)", log)
        if unavailable:  # not this student's doing: stop grading the class with the reason
            judge.close()
            raise sandbox.SandboxUnavailable(unavailable.group(1).strip())
        failure = re.search(r"SandboxFailure: (.*)", log)
        if failure or not outcome["success"]:
            judge.close()
        if budget.check():  # over the budget: every process of both sandboxes was killed
            return _stopped(course, student, stem, budget.breach, flags)
        if failure:
            return _stopped(course, student, stem, failure.group(1).strip(), flags)
        if not outcome["success"]:
            last = (outcome.get("error") or log).strip().splitlines()[-1:] or ["unknown error"]
            saved = out / "logs" / f"{student}-{stem}.log"
            saved.parent.mkdir(parents=True, exist_ok=True)
            saved.write_text(log, encoding="utf-8")
            return Result(student, stem, flags=flags, failed=f"nbgrader could not grade it ({last[0]}); ask the "
                                                             f"instructor to read {saved}")
        # The feedback page (the student's copy with a score and a comment under every graded cell) is
        # written here while the verdict's child runs the checks: two cores busy instead of one in turn.
        feedback = _Feedback(api, course, student, stem)
        with quiet():
            feedback.start()
            try:
                outcomes = judge.run()
            finally:
                feedback.join()
        if budget.check():
            return _stopped(course, student, stem, budget.breach, flags)
    points, gradebook_flags = scores(course / "gradebook.db", stem, student, exercises(source_nb))
    points, verdict_flags = verdict.combine(points, outcomes)  # the score cannot exceed the verdict's
    return Result(student, stem, scores=points, flags=flags + gradebook_flags + verdict_flags,
                  written=written_questions.answers(graded_nb),
                  unmarked=[q.grade_id for q in written_questions.questions(source_nb)])


class _Feedback(threading.Thread):
    """nbgrader's feedback page of one graded notebook, written in a thread; ``join`` re-raises its error."""

    def __init__(self, api, course: Path, student: str, stem: str) -> None:
        super().__init__(name=f"feedback {student}/{stem}", daemon=True)
        self.api, self.course, self.student, self.stem = api, course, student, stem
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            _coalesce_streams(self.course / "autograded" / self.student / self.stem / f"{self.stem}.ipynb")
            self.api.generate_feedback(self.stem, self.student, force=True)
        except BaseException as exc:  # noqa: BLE001 - handed to the grading thread by join()
            self.error = exc

    def join(self, timeout: float | None = None) -> None:
        super().join(timeout)
        if self.error is not None:
            raise self.error


def _coalesce_streams(path: Path) -> None:
    """Join each cell's consecutive prints into one output, as Jupyter shows them.

    The kernel sends what a cell prints in pieces, cut wherever its output
    buffer happened to be flushed, so on a busy machine one print can land in
    two outputs. Joined, the autograded notebook and its feedback page depend
    only on what was printed, not on when.
    """
    from nbconvert.preprocessors import CoalesceStreamsPreprocessor

    nb = nbformat.read(path, as_version=4)
    CoalesceStreamsPreprocessor().preprocess(nb, {})
    nbformat.write(nb, path)


def _stopped(course: Path, student: str, stem: str, reason: str, flags: list[str]) -> Result:
    """A notebook whose run did not finish: FAILED with the reason (0 points), and a feedback page that says why."""
    page = course / "feedback" / student / stem / f"{stem}.html"
    page.parent.mkdir(parents=True, exist_ok=True)
    page.write_text(f"<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>{html.escape(stem)}</title></head>"
                    f"<body><h1>{html.escape(stem)}: 0 points</h1><p>Not graded: {html.escape(reason)}.</p>"
                    "<p>Grading did not get to the end of this notebook, so none of its exercises was scored; "
                    "fix what the reason says and hand it in again.</p></body></html>\n", encoding="utf-8")
    return Result(student, stem, failed=reason, flags=flags)
