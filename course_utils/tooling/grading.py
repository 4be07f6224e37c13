"""Graded exercises with nbgrader: the student release and autograding.

Usage (through the Makefile)::

    make release                         # student notebooks -> build/release/
    make grade SUBMISSIONS=folder        # one sub-folder per student

    make grade SUBMISSIONS=folder JOBS=4 # four students at once (default: one per core)
    make grade SUBMISSIONS=folder SHARD=0/8   # the first of eight shares, for a batch system
    make grade-merge                     # the eight shards' folders -> build/grading

A submissions folder holds one folder per student, each with that student's
notebooks under their course names (``alice/00_orientation.ipynb``; nbgrader's
``alice/00_orientation/00_orientation.ipynb`` works too). Grading works on
copies in ``build/grading``, where the autograded notebooks, one HTML feedback
page per student and notebook (``feedback/``) and ``grades.csv`` (one row per
student, notebook and exercise) stay; neither the submitted files nor the
instructor notebooks are ever modified.

Each student is graded in a fresh nbgrader course of their own
(:mod:`course_utils.tooling.autograder`), so students are graded in parallel
processes (``jobs``) or on other machines (``shard``) and the results are the
same as one after another; a line per student says how far it is and about
how long is left. :mod:`course_utils.tooling.grade_report` writes the table,
``grades.csv`` and the marking sheets, and merges shards.

A submission is reported as failed, with the reason, and not scored when it is
not valid notebook JSON, when a graded test cell was deleted or edited, or
when a cell ran past the per-cell time limit; the others are graded as usual.
A student without one of the notebooks being graded gets a MISSING row, and a
submitted symbolic link is never followed.

What is graded is rebuilt from the release: the instructor's cells, in the
instructor's order, with only the student's solution cells (matched by their
nbgrader ``grade_id``) taken from the submission. Anything else a student
changed or added is ignored. Each notebook then runs in a sandbox
(``course_utils.tooling.sandbox``: bubblewrap and prlimit, no network,
an allow-list of the file system, read-only, and one budget of memory, processes
and bytes written per student's notebook),
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
import hashlib
import json
import os
import shutil
import sys
import time
from pathlib import Path

import nbformat

from course_utils.checks.flow import MODEL_ANSWERS
from course_utils.tooling import written as written_questions
from course_utils.tooling.autograder import (DEFAULT_TIMEOUT, LAB, NOTEBOOKS, ROOT, Exercise, Job, build_course,
                                             course_notebooks, exercises, grade_student, lab_notebooks)
from course_utils.tooling.grade_report import (MergeError, finish, fingerprint, format_table, load_results, merge,
                                               save_results, write_grades_csv)
from course_utils.tooling.submissions import Result, find_submissions

BUILD = ROOT / "build"

__all__ = ["DEFAULT_TIMEOUT", "Exercise", "MergeError", "Shard", "autograde", "build_course", "course_notebooks",
           "exercises", "format_table", "merge", "release", "write_grades_csv"]


def release(out: Path = BUILD / "release", notebooks_dir: Path = NOTEBOOKS, quiet: bool = False,
            self_study: bool = False) -> list[Path]:
    """Write the student version of every notebook (no solutions, no hidden tests, no outputs), and the lab book.

    The lab book's notebooks (``lab/``: optional, never graded) are copied as
    they are, outputs included, into ``out/lab/``. A self-study copy (``make
    lab``) also gets, after each written question, a cell that shows the model
    answer and rubric once the learner's own answer is saved
    (``checks.show_model_answer``), and those answers in ``out/.model_answers/``;
    the graded release (``make release``) has neither.

    A learner works in these files, so a file changed since it was released is
    kept, never overwritten; delete it to get a fresh copy. What was released
    is recorded in ``out/.released.json`` (sha256 per notebook, and of the
    instructor notebooks it came from, so that nothing is rebuilt when they
    have not changed).

    Args:
        out: Folder for the student notebooks.
        notebooks_dir: Folder of instructor notebooks.
        quiet: Do not print which edited notebooks were kept.
        self_study: Add the written questions' model answers (a learner's own copy, never a graded release).

    Returns:
        The student notebooks written (kept ones are not included).
    """
    notebooks = course_notebooks(notebooks_dir)
    lab = lab_notebooks(notebooks_dir)
    manifest_path = out / ".released.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    sources = {name: _sha256(nb) for name, nb in _released_names(notebooks, lab).items()}
    sources["self_study"] = str(self_study)
    if manifest.get("sources") == sources and all((out / name).exists() for name in _released_names(notebooks, lab)):
        return []  # released from these very notebooks, and nothing deleted since
    course = BUILD / "nbgrader-release"
    build_course(notebooks, course)
    out.mkdir(parents=True, exist_ok=True)
    if self_study:
        (out / MODEL_ANSWERS).mkdir(exist_ok=True)
    written = []
    for name, source in _released_names(notebooks, lab).items():
        target = out / name
        if self_study and source in notebooks:  # the answers are rewritten even when the learner's copy is kept
            answers = {q.grade_id: q.rubric for q in written_questions.questions(source)}
            (out / MODEL_ANSWERS / f"{source.stem}.json").write_text(json.dumps(answers, indent=1), encoding="utf-8")
        if target.exists() and _sha256(target) != manifest.get(name):
            if not quiet:
                print(f"kept {name}: you changed it since it was released (delete it for a fresh copy)")
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        if source in notebooks:
            student = nbformat.read(course / "release" / source.stem / source.name, as_version=4)
            nbformat.write(_with_model_answer_cells(student, source.stem) if self_study else student, target)
        else:
            shutil.copyfile(source, target)
        manifest[name] = _sha256(target)
        written.append(target)
    manifest["sources"] = sources
    manifest_path.write_text(json.dumps(manifest, indent=1, sort_keys=True))
    return written


def _released_names(notebooks: list[Path], lab: list[Path]) -> dict[str, Path]:
    """Where each notebook goes in a release, relative to its folder: ``NN_name.ipynb``, ``lab/NN_name.ipynb``."""
    return {**{nb.name: nb for nb in notebooks}, **{f"{LAB}/{nb.name}": nb for nb in lab}}


def _with_model_answer_cells(nb: nbformat.NotebookNode, stem: str) -> nbformat.NotebookNode:
    """A self-study copy: after each written question's answer cell, a cell that shows its model answer."""
    cells = []
    for cell in nb.cells:
        cells.append(cell)
        if written_questions.is_written(cell):
            question = cell.metadata["nbgrader"]["grade_id"]
            cells.append(nbformat.v4.new_code_cell(
                "# Studying on your own? Write your answer in the cell above and save the notebook (Ctrl+S);\n"
                "# then this cell shows the model answer and the rubric a marker would use.\n"
                "from course_utils.checks import show_model_answer\n\n"
                f"show_model_answer({stem!r}, {question!r})"))
    nb.cells = cells
    return nb


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


class Shard(tuple):
    """``i/N``: the i-th of N shares of a class (i from 0), as ``make grade SHARD=i/N`` gives it."""

    def __new__(cls, text: str):
        try:
            index, count = (int(part) for part in str(text).split("/"))
        except ValueError:
            raise ValueError(f"SHARD={text!r}: write i/N, e.g. 0/4 for the first of four shards") from None
        if count < 1 or not 0 <= index < count:
            raise ValueError(f"SHARD={text!r}: i runs from 0 to N-1 (0/{max(count, 1)} to "
                             f"{max(count, 1) - 1}/{max(count, 1)})")
        return super().__new__(cls, (index, count))

    def pick(self, students: list[str]) -> list[str]:
        """This shard's students: every N-th of the sorted list, from the i-th (the same on every machine)."""
        index, count = self
        return sorted(students)[index::count]


def default_jobs() -> int:
    """The cores this process may use."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def _writable(folder: Path) -> None:
    """Refuse, before anyone is graded, when the grading folder cannot be written (a read-only checkout)."""
    parent = next((p for p in [folder, *folder.parents] if p.exists()), Path("/"))
    if not os.access(parent, os.W_OK):
        raise PermissionError(f"cannot write the grading folder {folder} ({parent} is read-only): grade into a "
                              "writable folder with --out (make grade OUT=/path/to/folder)")


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(round(seconds)), 60)
    return f"{minutes} min {secs:02d} s" if minutes else f"{secs} s"


def autograde(
    submissions: Path,
    notebooks_dir: Path = NOTEBOOKS,
    course: Path = BUILD / "grading",
    timeout: int = DEFAULT_TIMEOUT,
    expected: list[str] | None = None,
    marks: Path | None = None,
    jobs: int = 1,
    shard: Shard | None = None,
    progress=None,
) -> list[Result]:
    """Autograde every student's notebooks in a folder of submissions.

    Args:
        submissions: One sub-folder per student (never modified).
        notebooks_dir: Instructor notebooks (never modified).
        course: The grading folder (recreated): ``grade_report`` lists what it holds.
        timeout: Seconds allowed per cell; a submission with a slower cell fails.
        expected: Notebook stems every student should have submitted (default:
            every notebook that any student submitted); each one a student
            lacks gets a MISSING result.
        marks: A marks file for the written questions (``course_utils.tooling.written``);
            without it every written answer is "to mark". Marking sheets are
            written to ``course/written/`` either way (not for a shard: the merge writes them).
        jobs: Students graded at once, each in its own process and sandboxes.
        shard: Grade only this share of the class (``Shard("i/N")``); merge the N folders with ``merge``.
        progress: Called with a line of text each time a student is done (default: print to stderr).

    Returns:
        One ``Result`` per (student, notebook) graded here, sorted by student then notebook,
        with the hand marks of ``marks`` counted.

    Raises:
        FileNotFoundError: If ``submissions`` is not a folder.
        PermissionError: If the grading folder cannot be written.
        ValueError: If ``expected`` names a notebook that is not in the course,
            or the marks file names an unknown question or gives impossible points.
        sandbox.SandboxUnavailable: If bubblewrap is missing (student code never runs outside the sandbox),
            or the course or its environment lies in a folder the sandbox hides.
    """
    from course_utils.tooling import sandbox

    submissions, course = Path(submissions), Path(course).absolute()
    if not submissions.is_dir():
        raise FileNotFoundError(f"no submissions folder at {submissions}: expected one sub-folder per student")
    sandbox.bwrap_path()  # fail before any work when the sandbox cannot run
    notebooks = course_notebooks(notebooks_dir)
    stems = {nb.stem for nb in notebooks}
    unknown = sorted(set(expected or []) - stems)
    if unknown:
        raise ValueError(f"not course notebooks: {', '.join(unknown)}; the course has {', '.join(sorted(stems))}")
    # The student's notebook sees none of: the instructor's notebooks, this grading folder, the submissions.
    hide = [Path(notebooks_dir).resolve(), course.resolve(), submissions.resolve(), BUILD.resolve()]
    sandbox.check_visible(hide)
    _writable(course)
    found, results, students = find_submissions(submissions, stems)
    wanted = set(expected) if expected else {stem for _, stem in found}
    for student in students:
        for stem in sorted(wanted):
            if (student, stem) not in found and not any(r.student == student and r.notebook == stem for r in results):
                results.append(Result(student, stem, missing=True,
                                      failed=f"no {stem}.ipynb in {student}/ (name the file exactly as released)"))
    everyone = sorted(set(students) | {r.student for r in results})
    mine = shard.pick(everyone) if shard else everyone
    needed = sorted({stem for _, stem in found})
    if course.exists():
        shutil.rmtree(course)
    course.mkdir(parents=True)
    info = {"students": everyone, "mine": mine, "notebooks": needed, "shard": list(shard or (0, 1)),
            "fingerprint": fingerprint(notebooks)}
    (course / "class.json").write_text(json.dumps(info, indent=1), encoding="utf-8")
    template = course / "template"
    build_course([nb for nb in notebooks if nb.stem in needed], template, timeout, hide)
    todo = [Job(student, {stem: str(path) for (who, stem), path in sorted(found.items()) if who == student},
                str(template), str(course), timeout, [str(p) for p in hide])
            for student in mine if any(who == student for who, _ in found)]
    for student in mine:
        save_results(course, student, [r for r in results if r.student == student])
    report = progress or (lambda line: print(line, file=sys.stderr, flush=True))
    started = time.monotonic()
    for done, (job, graded, seconds) in enumerate(_run(todo, jobs), start=1):
        save_results(course, job.student, sorted([r for r in results if r.student == job.student] + graded,
                                                 key=lambda r: r.notebook))
        elapsed = time.monotonic() - started
        left = elapsed / done * (len(todo) - done)
        report(f"graded {done}/{len(todo)}: {job.student} ({len(job.files)} notebooks, {_clock(seconds)}); "
               f"{_clock(elapsed)} so far" + (f", about {_clock(left)} left" if done < len(todo) else ""))
    shutil.rmtree(template)
    shutil.rmtree(course / "work", ignore_errors=True)
    if shard and shard[1] > 1:
        return [r for r in load_results(course)]
    return finish(course, notebooks_dir, marks)


def _run(todo: list[Job], jobs: int):
    """Grade each job, ``jobs`` at a time; yield (job, results, seconds) as each finishes."""
    if jobs <= 1 or len(todo) <= 1:
        for job in todo:
            yield (job, *grade_student(job))
        return
    import concurrent.futures
    import multiprocessing

    from course_utils.tooling import sandbox

    # Spawned workers (torch and threads do not survive a fork), whose temporary folders live in this
    # process's work root: every sandbox hides it, so no student's code sees another student's work folder.
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=min(jobs, len(todo)), mp_context=context,
                                                initializer=_worker_init, initargs=(str(sandbox.work_root()),)
                                                ) as pool:
        futures = {pool.submit(grade_student, job): job for job in todo}
        for future in concurrent.futures.as_completed(futures):
            yield (futures[future], *future.result())


def _worker_init(tmp: str) -> None:
    import tempfile

    tempfile.tempdir = tmp


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Student release and autograding (nbgrader).")
    sub = parser.add_subparsers(dest="command", required=True)
    rel = sub.add_parser("release", help="write the student notebooks")
    rel.add_argument("--out", type=Path, default=BUILD / "release")
    rel.add_argument("--quiet", action="store_true", help="print one line, not one per notebook")
    rel.add_argument("--self-study", action="store_true",
                     help="a learner's own copy (make lab): add each written question's model answer, shown once "
                          "the learner's answer is saved (never for a graded release)")
    grade = sub.add_parser("autograde", help="grade a folder of submissions (one sub-folder per student)")
    grade.add_argument("submissions", type=Path)
    grade.add_argument("--out", type=Path, default=None,
                       help="grading folder (default build/grading, or build/grading-shard-i-of-N for a shard)")
    grade.add_argument("--timeout", type=int, default=DEFAULT_TIMEOUT, help="seconds allowed per cell")
    grade.add_argument("--notebooks", nargs="*", default=None, metavar="STEM",
                       help="notebooks every student must submit (default: every notebook anyone submitted)")
    grade.add_argument("--marks", type=Path, default=None,
                       help="marks for the written questions (a filled-in copy of build/grading/written/marks-template.csv)")
    grade.add_argument("--jobs", type=int, default=None,
                       help=f"students graded at once (default: the cores of this machine, here {default_jobs()})")
    grade.add_argument("--shard", type=Shard, default=None, metavar="i/N",
                       help="grade the i-th of N shares of the class (i from 0), for a batch system; then merge")
    mrg = sub.add_parser("merge", help="merge the grading folders of a class's shards into one")
    mrg.add_argument("shards", type=Path, nargs="*",
                     help="the shards' grading folders (default: build/grading-shard-*)")
    mrg.add_argument("--out", type=Path, default=BUILD / "grading")
    mrg.add_argument("--marks", type=Path, default=None, help="marks for the written questions")
    args = parser.parse_args(argv)
    if args.command == "release":
        written = release(args.out, quiet=args.quiet, self_study=args.self_study)
        if args.quiet:
            print(f"your notebooks are in {args.out}/ ({len(written)} written or updated; those you edited are kept)")
        for path in [] if args.quiet else written:
            print(f"wrote {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
        return 0
    from course_utils.tooling.sandbox import SandboxUnavailable

    try:
        if args.command == "merge":
            shards = args.shards or sorted(BUILD.glob("grading-shard-*-of-*"))
            if not shards:
                print("no shard folders given, and none in build/: pass the folders `make grade SHARD=i/N` wrote",
                      file=sys.stderr)
                return 2
            out, results = args.out, merge(shards, args.out, NOTEBOOKS, marks=args.marks)
        else:
            if not args.submissions.is_dir():
                print(f"no submissions folder at {args.submissions}: make one sub-folder per student, "
                      "each with that student's notebooks", file=sys.stderr)
                return 2
            out = args.out or (BUILD / (f"grading-shard-{args.shard[0]}-of-{args.shard[1]}" if args.shard
                                        else "grading"))
            results = autograde(args.submissions, course=out, timeout=args.timeout, expected=args.notebooks,
                                marks=args.marks, jobs=args.jobs or default_jobs(), shard=args.shard)
    except (SandboxUnavailable, ValueError, FileNotFoundError, PermissionError) as exc:
        print(f"cannot grade: {exc}", file=sys.stderr)
        return 2
    if not results:
        print("no notebooks found under the submissions' <student>/ folders", file=sys.stderr)
        return 2
    if args.command == "autograde" and args.shard and args.shard[1] > 1:
        print(f"shard {args.shard[0]}/{args.shard[1]}: {len({r.student for r in results})} students graded into "
              f"{out}; when every shard is done, merge them: make grade-merge SHARDS='<the {args.shard[1]} folders>'")
        return 0
    print(format_table(results))
    print(f"grades (one row per student, notebook and exercise): {out / 'grades.csv'}")
    print(f"feedback for each student (HTML): {out / 'feedback'}")
    print(f"autograded notebooks: {out / 'autograded'}")
    if any(r.unmarked for r in results):
        print(f"written answers to mark by hand: {out / 'written'} (marking sheets and "
              "marks-template.csv; fill it in, save it outside build/, and grade again with MARKS=file)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
