"""Graded exercises with nbgrader: the student release and autograding.

Usage (through the Makefile)::

    make release                         # student notebooks -> build/release/
    make grade SUBMISSIONS=folder        # one sub-folder per student

A submissions folder holds one folder per student, each with that student's
notebooks under their course names (``alice/00_orientation.ipynb``; nbgrader's
``alice/00_orientation/00_orientation.ipynb`` works too). Grading works on
copies in ``build/grading``, where the autograded notebooks, one HTML feedback
page per student and notebook (``feedback/``) and ``grades.csv`` (one row per
student, notebook and exercise) stay; neither the submitted files nor the
instructor notebooks are ever modified.

A submission is reported as failed, with the reason, and not scored when it is
not valid notebook JSON, when a graded test cell was deleted or edited, or
when a cell ran past the per-cell time limit; the others are graded as usual.
A student without one of the notebooks being graded gets a MISSING row, and a
submitted symbolic link is never followed.

What is graded is rebuilt from the release: the instructor's cells, in the
instructor's order, with only the student's solution cells (matched by their
nbgrader ``grade_id``) taken from the submission. Anything else a student
changed or added is ignored. Each notebook then runs in a sandbox
(``course_utils.tooling.sandbox``: bubblewrap and prlimit, no network, a
read-only file system with the instructor's files hidden, resource limits),
and nbgrader computes the scores outside it. Solution cells that do what no
answer needs (import the course's reference code, ``exec``, ``get_ipython``,
subprocesses, files, sockets) are flagged for a human in the table and in
``grades.csv``, as is any manual score or extra credit in the gradebook.

Because nbgrader's verdict comes from the kernel the student's code ran in,
every exercise is checked out of that kernel too (``course_utils.tooling.verdict``):
the instructor's test cells run in this process on the student's functions,
which live in a second sandboxed process. An exercise scores the lower of the
two, and a kernel that said more is flagged as possible tampering.

Every notebook in ``notebooks/`` is one nbgrader assignment of the same name.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import hashlib
import io
import json
import logging
import os
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import nbformat

from course_utils.tooling.submissions import Result, assemble, find_submissions, static_flags, validate
from course_utils.tooling import written as written_questions

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"
BUILD = ROOT / "build"
COURSE_ID = "attention-course"
DEFAULT_TIMEOUT = 180  # seconds per cell when autograding


@dataclass(frozen=True)
class Exercise:
    """One graded test cell of a notebook."""

    notebook: str  # notebook stem, e.g. "00_orientation" (= nbgrader assignment)
    grade_id: str  # nbgrader grade_id of the test cell, e.g. "masked_softmax_tests"
    points: float  # points it is worth


def _env_for_nbgrader() -> None:
    # nbgrader shells out to `alembic`, which lives beside this interpreter.
    bin_dir = str(Path(sys.executable).parent)
    if bin_dir not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = bin_dir + os.pathsep + os.environ.get("PATH", "")
    os.environ.pop("MPLBACKEND", None)


def course_notebooks(notebooks_dir: Path = NOTEBOOKS) -> list[Path]:
    """The course notebooks, in order."""
    return sorted(Path(notebooks_dir).glob("[0-9][0-9]_*.ipynb"))


def exercises(notebook: Path) -> list[Exercise]:
    """The graded test cells of an instructor notebook, in order."""
    nb = nbformat.read(notebook, as_version=4)
    found = []
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader", {})
        if meta.get("grade") and cell.cell_type == "code":
            found.append(Exercise(notebook.stem, meta["grade_id"], float(meta["points"])))
    return found


def _gradable(notebook: Path) -> list[Exercise]:
    """Every graded item of a notebook: the autograded test cells, then the written questions."""
    return exercises(notebook) + [Exercise(notebook.stem, q.grade_id, q.points)
                                  for q in written_questions.questions(notebook)]


_SANDBOXED_EXECUTE = None


def _sandboxed_execute():
    """nbgrader's Execute step, run in the sandbox (built lazily: nbgrader is slow to import)."""
    global _SANDBOXED_EXECUTE
    if _SANDBOXED_EXECUTE is not None:
        return _SANDBOXED_EXECUTE
    from nbgrader.preprocessors import NbGraderPreprocessor
    from traitlets import Integer, List, Unicode

    from course_utils.tooling import sandbox

    class SandboxedExecute(NbGraderPreprocessor):
        """Execute the notebook in the sandbox; a run that does not finish raises ``SandboxFailure``."""

        timeout = Integer(DEFAULT_TIMEOUT, help="seconds allowed per cell").tag(config=True)
        hide = List(Unicode(), help="folders the notebook must not see").tag(config=True)

        def preprocess(self, nb, resources):
            executed, reason = sandbox.execute(nb, hide=[Path(p) for p in self.hide], cell_timeout=self.timeout)
            if executed is None:
                raise SandboxFailure(reason)
            for cell in executed.cells:
                if any(out.get("ename") == "CellTimeoutError" for out in cell.get("outputs", [])):
                    raise SandboxFailure(f"a cell ran longer than the {self.timeout} s limit per cell")
            return executed, resources

    _SANDBOXED_EXECUTE = SandboxedExecute
    return SandboxedExecute


class SandboxFailure(RuntimeError):
    """A submission's run in the sandbox did not finish; the message says why."""


def _api(course: Path, timeout: int, hide: list[Path] = ()):
    from nbconvert.preprocessors import ClearMetadataPreprocessor
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
    config.Autograde.autograde_preprocessors = [execute, IgnorePattern, ClearMetadataPreprocessor, LimitOutput,
                                                SaveAutoGrades, AssignLatePenalties, CheckCellMetadata]
    config.SandboxedExecute.timeout = timeout
    config.SandboxedExecute.hide = [str(p) for p in hide]
    coursedir = CourseDirectory(config=config)
    return NbGraderAPI(coursedir=coursedir, config=config)


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
    _env_for_nbgrader()
    if course.exists():
        shutil.rmtree(course)
    for nb in notebooks:
        (course / "source" / nb.stem).mkdir(parents=True)
        shutil.copy2(nb, course / "source" / nb.stem / nb.name)
    api = _api(course, timeout, hide)
    for nb in notebooks:
        with _quiet():
            result = api.generate_assignment(nb.stem, force=True)
        if not result["success"]:
            raise RuntimeError(f"nbgrader could not generate the release of {nb.name}:\n{result.get('error', '')}")
    return api


@contextlib.contextmanager
def _quiet():
    """Silence nbgrader's and the kernel's chatter on stderr."""
    buffer = io.StringIO()
    previous = logging.root.level
    logging.root.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stderr(buffer):
            yield buffer
    finally:
        logging.root.setLevel(previous)


def release(out: Path = BUILD / "release", notebooks_dir: Path = NOTEBOOKS) -> list[Path]:
    """Write the student version of every notebook (no solutions, no hidden tests, no outputs).

    A learner works in these files, so a file changed since it was released is
    kept, never overwritten; delete it to get a fresh copy. What was released
    is recorded in ``out/.released.json`` (sha256 per notebook).

    Args:
        out: Folder for the student notebooks.
        notebooks_dir: Folder of instructor notebooks.

    Returns:
        The student notebooks written (kept ones are not included).
    """
    notebooks = course_notebooks(notebooks_dir)
    course = BUILD / "nbgrader-release"
    build_course(notebooks, course)
    out.mkdir(parents=True, exist_ok=True)
    manifest_path = out / ".released.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    written = []
    for nb in notebooks:
        target = out / nb.name
        if target.exists() and _sha256(target) != manifest.get(nb.name):
            print(f"kept {target.name}: you changed it since it was released (delete it for a fresh copy)")
            continue
        shutil.copyfile(course / "release" / nb.stem / nb.name, target)
        manifest[nb.name] = _sha256(target)
        written.append(target)
    manifest_path.write_text(json.dumps(manifest, indent=1, sort_keys=True))
    return written


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


MAX_SUBMISSION_BYTES = 50 * 2**20


def autograde(
    submissions: Path,
    notebooks_dir: Path = NOTEBOOKS,
    course: Path = BUILD / "grading",
    timeout: int = DEFAULT_TIMEOUT,
    expected: list[str] | None = None,
    marks: Path | None = None,
) -> list[Result]:
    """Autograde every student's notebooks in a folder of submissions.

    Args:
        submissions: One sub-folder per student (never modified).
        notebooks_dir: Instructor notebooks (never modified).
        course: Work folder (recreated); autograded notebooks stay in its ``autograded/``.
        timeout: Seconds allowed per cell; a submission with a slower cell fails.
        expected: Notebook stems every student should have submitted (default:
            every notebook that any student submitted); each one a student
            lacks gets a MISSING result.
        marks: A marks file for the written questions (``course_utils.tooling.written``);
            without it every written answer is "to mark". Marking sheets are
            written to ``course/written/`` either way.

    Returns:
        One ``Result`` per (student, notebook), sorted by student then notebook.

    Raises:
        FileNotFoundError: If ``submissions`` is not a folder.
        ValueError: If ``expected`` names a notebook that is not in the course,
            or the marks file names an unknown question or gives impossible points.
        sandbox.SandboxUnavailable: If bubblewrap is missing (student code never runs outside the sandbox).
    """
    from course_utils.tooling import sandbox, verdict  # torch, only when grading

    submissions = Path(submissions)
    if not submissions.is_dir():
        raise FileNotFoundError(f"no submissions folder at {submissions}: expected one sub-folder per student")
    sandbox.bwrap_path()  # fail before any work when the sandbox cannot run
    notebooks = course_notebooks(notebooks_dir)
    stems = {nb.stem for nb in notebooks}
    unknown = sorted(set(expected or []) - stems)
    if unknown:
        raise ValueError(f"not course notebooks: {', '.join(unknown)}; the course has {', '.join(sorted(stems))}")
    found, results, students = find_submissions(submissions, stems)
    wanted = set(expected) if expected else {stem for _, stem in found}
    for student in students:
        for stem in sorted(wanted):
            if (student, stem) not in found and not any(r.student == student and r.notebook == stem for r in results):
                results.append(Result(student, stem, missing=True,
                                      failed=f"no {stem}.ipynb in {student}/ (name the file exactly as released)"))
    needed = sorted({stem for _, stem in found})
    # The student's notebook sees none of: the instructor's notebooks, this grading folder, the submissions.
    hide = [Path(notebooks_dir).resolve(), Path(course).resolve(), submissions.resolve(), BUILD.resolve()]
    api = build_course([nb for nb in notebooks if nb.stem in needed], course, timeout, hide)
    points = {nb.stem: exercises(nb) for nb in notebooks if nb.stem in needed}
    asked = {nb.stem: written_questions.questions(nb) for nb in notebooks if nb.stem in needed}
    hand_marks = written_questions.read_marks(marks, asked) if marks is not None else {}
    for (student, stem), path in sorted(found.items()):
        release_nb = course / "release" / stem / f"{stem}.ipynb"
        size = path.stat().st_size
        if size > MAX_SUBMISSION_BYTES:
            results.append(Result(student, stem, failed=f"the file is {size / 2**20:.0f} MB, over the "
                                                        f"{MAX_SUBMISSION_BYTES // 2**20} MB limit: clear the outputs "
                                                        "(Edit > Clear Outputs of All Cells) and save"))
            continue
        reason = validate(path, release_nb, course / "source" / stem / f"{stem}.ipynb")
        if reason:
            results.append(Result(student, stem, failed=reason))
            continue
        submitted = nbformat.read(path, as_version=4)
        released = nbformat.read(release_nb, as_version=4)
        flags = static_flags(submitted, released)
        target = course / "submitted" / student / stem / f"{stem}.ipynb"
        target.parent.mkdir(parents=True, exist_ok=True)
        graded_nb = assemble(submitted, released)
        nbformat.write(graded_nb, target)
        judge = verdict.Judge(graded_nb, nbformat.read(course / "source" / stem / f"{stem}.ipynb", as_version=4),
                              hide=hide, timeout=timeout)
        judge.start()  # its child runs the notebook's context while nbgrader runs the kernel
        with _quiet():
            outcome = api.autograde(stem, student, force=True, create=True)
        log = outcome.get("log", "") + outcome.get("error", "")
        failure = re.search(r"SandboxFailure: (.*)", log)
        if failure or not outcome["success"]:
            judge.close()
        if failure:
            results.append(Result(student, stem, failed=failure.group(1).strip(), flags=flags))
        elif not outcome["success"]:
            last = (outcome.get("error") or log).strip().splitlines()[-1:] or ["unknown error"]
            results.append(Result(student, stem, flags=flags,
                                  failed=f"nbgrader could not grade it ({last[0]}); ask the instructor to look at "
                                         f"{course / 'autograded' / student / stem}"))
        else:
            scores, gradebook_flags = _scores(course, stem, student, points[stem])
            scores, verdict_flags = verdict.combine(scores, judge.run())  # the score cannot exceed the verdict's
            unmarked = []
            for q in asked[stem]:
                if (student, stem, q.grade_id) in hand_marks:
                    scores[q.grade_id] = hand_marks[(student, stem, q.grade_id)]
                else:
                    unmarked.append(q.grade_id)
            results.append(Result(student, stem, scores=scores, flags=flags + gradebook_flags + verdict_flags,
                                  written=written_questions.answers(graded_nb), unmarked=unmarked))
            with _quiet():  # the student's copy with a score and a comment under every graded cell
                api.generate_feedback(stem, student, force=True)
    results = sorted(results, key=lambda r: (r.student, r.notebook))
    written_questions.write_marking_sheets(results, asked, Path(course) / "written", safe=_csv_safe)
    return results


_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def _csv_safe(value: object) -> str:
    """A cell a spreadsheet shows as text: a leading =, +, -, @, tab or CR would start a formula."""
    text = str(value)
    if text.startswith(_FORMULA_START) and not re.fullmatch(r"-?\d+(\.\d+)?", text):
        return "'" + text
    return text


def write_grades_csv(results: list[Result], path: Path, notebooks_dir: Path = NOTEBOOKS) -> Path:
    """Write the grades in long format: one row per student, notebook and exercise.

    Columns: student, notebook, exercise, points, max_points, status, flags.
    A written question not yet marked by hand has an empty ``points`` cell.
    A submission that could not be graded has one row with exercise "-" and
    status "FAILED: <reason>" (or "MISSING: ..."). ``flags`` lists what a human
    should look at, separated by "; ". Every cell that a spreadsheet would read
    as a formula is prefixed with an apostrophe.

    Returns:
        ``path``.
    """
    known = {nb.stem: nb for nb in course_notebooks(notebooks_dir)}
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["student", "notebook", "exercise", "points", "max_points", "status", "flags"])
        for r in results:
            flags = "; ".join(r.flags)
            if r.failed:
                writer.writerow([_csv_safe(v) for v in (r.student, r.notebook, "-", "", "", r.status, flags)])
                continue
            for ex in _gradable(known[r.notebook]):
                score = r.scores.get(ex.grade_id)
                shown = "" if score is None and ex.grade_id in r.unmarked else f"{score or 0.0:g}"
                writer.writerow([_csv_safe(v) for v in (r.student, r.notebook, ex.grade_id, shown, f"{ex.points:g}",
                                                        r.status, flags)])
    return Path(path)


def _scores(course: Path, stem: str, student: str, exs: list[Exercise]) -> tuple[dict[str, float], list[str]]:
    """The automatic score of every exercise, and a flag for any manual score or extra credit in the gradebook."""
    from nbgrader.api import Gradebook

    flags = []
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gradebook:
        notebook = gradebook.find_submission_notebook(stem, stem, student)
        by_cell = {}
        for grade in notebook.grades:
            by_cell[grade.cell.name] = grade.auto_score
            if grade.manual_score is not None:
                flags.append(f"{grade.cell.name}: a manual score ({grade.manual_score:g}) that autograding did not set")
            if grade.extra_credit:
                flags.append(f"{grade.cell.name}: extra credit ({grade.extra_credit:g}) that autograding did not set")
    return {ex.grade_id: float(by_cell.get(ex.grade_id) or 0.0) for ex in exs}, flags


def format_table(results: list[Result], notebooks_dir: Path = NOTEBOOKS) -> str:
    """One table per notebook: a row per student, a column per exercise, total and status."""
    lines: list[str] = []
    by_notebook: dict[str, list[Result]] = {}
    for r in results:
        by_notebook.setdefault(r.notebook, []).append(r)
    known = {nb.stem: nb for nb in course_notebooks(notebooks_dir)}
    for stem, rows in sorted(by_notebook.items()):
        exs = _gradable(known[stem]) if stem in known else []
        headers = ["student"] + [ex.grade_id for ex in exs] + ["total", "status"]
        table = []
        for r in rows:
            if r.failed:
                cells = ["-"] * len(exs) + ["-", r.status]
            else:
                cells = [f"to mark/{ex.points:g}" if ex.grade_id in r.unmarked else
                         f"{r.scores.get(ex.grade_id, 0):g}/{ex.points:g}" for ex in exs]
                cells += [f"{r.total:g}/{sum(ex.points for ex in exs):g}" + (" so far" if r.unmarked else ""),
                          r.status]
            if r.flags:
                cells[-1] += "  FLAGGED: " + "; ".join(r.flags)
            table.append([r.student] + cells)
        widths = [max(len(str(row[i])) for row in [headers] + table) for i in range(len(headers))]
        lines.append(f"## {stem}")
        for row in [headers] + table:
            lines.append("  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip())
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Student release and autograding (nbgrader).")
    sub = parser.add_subparsers(dest="command", required=True)
    rel = sub.add_parser("release", help="write the student notebooks")
    rel.add_argument("--out", type=Path, default=BUILD / "release")
    grade = sub.add_parser("autograde", help="grade a folder of submissions (one sub-folder per student)")
    grade.add_argument("submissions", type=Path)
    grade.add_argument("--timeout", type=int, default=DEFAULT_TIMEOUT, help="seconds allowed per cell")
    grade.add_argument("--notebooks", nargs="*", default=None, metavar="STEM",
                       help="notebooks every student must submit (default: every notebook anyone submitted)")
    grade.add_argument("--marks", type=Path, default=None,
                       help="marks for the written questions (a filled-in copy of build/grading/written/marks-template.csv)")
    args = parser.parse_args(argv)
    if args.command == "release":
        for path in release(args.out):
            print(f"wrote {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
        return 0
    if not args.submissions.is_dir():
        print(f"no submissions folder at {args.submissions}: make one sub-folder per student, "
              "each with that student's notebooks", file=sys.stderr)
        return 2
    from course_utils.tooling.sandbox import SandboxUnavailable

    try:
        results = autograde(args.submissions, timeout=args.timeout, expected=args.notebooks, marks=args.marks)
    except (SandboxUnavailable, ValueError, FileNotFoundError) as exc:
        print(f"cannot grade: {exc}", file=sys.stderr)
        return 2
    if not results:
        print(f"no notebooks found under {args.submissions}/<student>/", file=sys.stderr)
        return 2
    print(format_table(results))
    grades = write_grades_csv(results, BUILD / "grading" / "grades.csv")
    print(f"grades (one row per student, notebook and exercise): {grades}")
    print(f"feedback for each student (HTML): {BUILD / 'grading' / 'feedback'}")
    print(f"autograded notebooks: {BUILD / 'grading' / 'autograded'}")
    if any(r.unmarked for r in results):
        print(f"written answers to mark by hand: {BUILD / 'grading' / 'written'} (marking sheets and "
              "marks-template.csv; fill it in, save it outside build/, and grade again with MARKS=file)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
