"""``make bench-grading``: how long grading takes, per student, per notebook, and with two jobs against one.

A class is made of copies of the instructor notebooks (every answer right, so
every exercise's checks run to the end, as for a good student). It is graded

1. one student alone (``JOBS=1``): the seconds for one full submission, and the
   split per notebook (each notebook's kernel, its out-of-kernel verdict and
   its feedback page);
2. ``--students`` students with ``JOBS=1``, then with ``JOBS=2``: the speed-up.

Every run must give full marks. The first run also records the peaks of each
notebook's budget (``budget.Budget``: memory, processes and threads, bytes
written, its kernel's sandbox and its verdict child's together). The table goes
into the instructor guide, between its ``grading-bench`` markers (not with
``--no-guide``). The command exits with status 1 when one student takes more
than ``NOTEBOOK_BUDGET`` seconds per notebook, two jobs are less than
``SPEEDUP_FLOOR`` times faster than one, or a notebook used more than
``BUDGET_SHARE`` of a budget. ``--peaks`` measures only the peaks, as the
budgets were chosen.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

from course_utils.tooling.autograder import NOTEBOOKS, ROOT, course_notebooks, exercises
from course_utils.tooling.grading import autograde
from course_utils.tooling.limits import BUDGET_LOG_ENV, MiB, Limits, size_text

GUIDE = ROOT / "docs" / "instructor_guide.md"
BEGIN, END = "<!-- BEGIN GENERATED: grading-bench -->", "<!-- END GENERATED: grading-bench -->"
NOTEBOOK_BUDGET = 11.6  # seconds per notebook for one student: half of the 232 s ten notebooks took before
SPEEDUP_FLOOR = 1.3  # JOBS=2 against JOBS=1 on a 2-core machine, where one job already keeps about 1.25 cores busy
BUDGET_SHARE = 0.5  # an honest notebook may use at most this share of each budget of limits.Limits


def _class(folder: Path, students: int, notebooks: list[Path]) -> Path:
    for i in range(students):
        (folder / f"student{i:02d}").mkdir(parents=True)
        for nb in notebooks:
            shutil.copy(nb, folder / f"student{i:02d}" / nb.name)
    return folder


def _full_marks(results) -> None:
    points = {nb.stem: {ex.grade_id: ex.points for ex in exercises(nb)} for nb in course_notebooks()}
    wrong = [(r.student, r.notebook, r.failed or r.scores) for r in results
             if r.failed or {g: s for g, s in r.scores.items() if g in points[r.notebook]} != points[r.notebook]]
    if wrong:
        raise SystemExit(f"grading the instructor notebooks did not give full marks: {wrong[:3]}")


def _busy() -> float:
    """CPU seconds the whole machine has spent busy so far (Linux /proc/stat; 0 elsewhere)."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    except OSError:
        return 0.0
    user, nice, system, idle, iowait, irq, softirq = (int(v) for v in fields[:7])
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def _timed(submissions: Path, out: Path, jobs: int) -> tuple[float, list, float]:
    """Seconds to grade, the results, and the cores busy on average meanwhile (the whole machine)."""
    started, busy = time.monotonic(), _busy()
    results = autograde(submissions, course=out, jobs=jobs, progress=lambda line: print("  " + line, flush=True))
    seconds = time.monotonic() - started
    _full_marks(results)
    return seconds, results, (_busy() - busy) / seconds


@contextlib.contextmanager
def _peaks_logged(log: Path):
    """Every budget (one per graded notebook) appends its peaks to ``log`` meanwhile."""
    previous = os.environ.get(BUDGET_LOG_ENV)
    os.environ[BUDGET_LOG_ENV] = str(log)
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(BUDGET_LOG_ENV, None)
        else:
            os.environ[BUDGET_LOG_ENV] = previous


def _read_peaks(log: Path) -> dict[str, dict]:
    """Notebook stem -> the largest peaks of its budgets in ``log`` (memory and disk in bytes, tasks)."""
    found: dict[str, dict] = {}
    for line in log.read_text(encoding="utf-8").splitlines() if log.is_file() else []:
        entry = json.loads(line)
        stem = entry["label"].rsplit("/", 1)[-1]
        mine = found.setdefault(stem, {"memory": 0, "tasks": 0, "disk": 0, "mode": entry["mode"]})
        for key in ("memory", "tasks", "disk"):
            mine[key] = max(mine[key], entry[key])
    return found


def measure(students: int = 4) -> dict:
    """Grade the class three ways; return the seconds (and the peaks of one student's notebooks)."""
    notebooks = course_notebooks(NOTEBOOKS)
    with tempfile.TemporaryDirectory(prefix="bench-grading-", dir=ROOT / "build") as tmp:
        base = Path(tmp)
        print("one student, JOBS=1")
        with _peaks_logged(base / "peaks.jsonl"):
            one, results, one_busy = _timed(_class(base / "one", 1, notebooks), base / "out-one", 1)
        peaks = _read_peaks(base / "peaks.jsonl")
        split = {r.notebook: r.seconds for r in results}
        klass = _class(base / "class", students, notebooks)
        print(f"{students} students, JOBS=1")
        serial, _, serial_busy = _timed(klass, base / "out-serial", 1)
        print(f"{students} students, JOBS=2")
        parallel, _, parallel_busy = _timed(klass, base / "out-parallel", 2)
    return {"one": one, "split": split, "students": students, "serial": serial, "parallel": parallel,
            "busy": {"one": one_busy, "serial": serial_busy, "parallel": parallel_busy}, "peaks": peaks}


def _one_student() -> int:
    """``--one``: grade one student's notebooks alone; print the seconds, fail over :data:`NOTEBOOK_BUDGET` each."""
    notebooks = course_notebooks(NOTEBOOKS)
    with tempfile.TemporaryDirectory(prefix="bench-one-", dir=ROOT / "build") as tmp:
        base = Path(tmp)
        seconds, results, busy = _timed(_class(base / "one", 1, notebooks), base / "out", 1)
    for r in sorted(results, key=lambda r: r.notebook):
        print(f"{r.notebook:>28} {r.seconds:6.1f} s")
    budget = NOTEBOOK_BUDGET * len(results)
    print(f"one student's {len(results)} notebooks: {seconds:.0f} s ({busy:.2f} cores busy on average on the machine); "
          f"budget {budget:.0f} s")
    return 0 if seconds <= budget else 1


def measure_peaks(notebooks: list[Path]) -> dict[str, dict]:
    """Grade one student's copy of ``notebooks`` (every answer right); the peaks of each notebook's budget."""
    with tempfile.TemporaryDirectory(prefix="bench-peaks-", dir=ROOT / "build") as tmp:
        base = Path(tmp)
        with _peaks_logged(base / "peaks.jsonl"):
            _timed(_class(base / "one", 1, notebooks), base / "out", 1)
        return _read_peaks(base / "peaks.jsonl")


def peaks_table(peaks: dict[str, dict], limits: Limits | None = None) -> str:
    """The peaks of each notebook against the budgets of one student's notebook."""
    limits = limits or Limits.from_env()
    lines = ["| notebook | peak memory | peak processes and threads | peak written |", "|---|---|---|---|"]
    for stem, p in sorted(peaks.items()):
        lines.append(f"| {stem} | {p['memory'] / MiB:,.0f} MiB | {p['tasks']} | {p['disk'] / MiB:,.1f} MiB |")
    lines.append(f"| budget ({next(iter(peaks.values()))['mode'] if peaks else '-'}) | "
                 f"{size_text(limits.memory_budget)} | {limits.process_budget} | {size_text(limits.disk_budget)} |")
    return "\n".join(lines)


def table(m: dict) -> str:
    lines = [f"Measured by `make bench-grading` on {platform.machine()} with {_cores()} cores: the instructor "
             "notebooks graded as submissions (full marks each time).", "",
             "| what | seconds | cores busy on average |", "|---|---|---|",
             f"| one student's {len(m['split'])} notebooks, `JOBS=1` | {m['one']:.0f} | {m['busy']['one']:.2f} |"]
    lines += [f"| · {stem} | {seconds:.1f} | |" for stem, seconds in sorted(m["split"].items())]
    lines += [f"| {m['students']} students, `JOBS=1` | {m['serial']:.0f} | {m['busy']['serial']:.2f} |",
              f"| {m['students']} students, `JOBS=2` | {m['parallel']:.0f} | {m['busy']['parallel']:.2f} |",
              f"| speed-up of `JOBS=2` over `JOBS=1` | {m['serial'] / m['parallel']:.2f}× | |"]
    if m.get("peaks"):
        heaviest = {key: max(m["peaks"].items(), key=lambda item: item[1][key]) for key in ("memory", "tasks", "disk")}
        lines += ["", "The most one notebook's sandboxes (its kernel and its out-of-kernel check together) used at "
                      "once, against the budget of each student's notebook:", "",
                  "| what | peak | notebook | budget |", "|---|---|---|---|",
                  f"| memory | {heaviest['memory'][1]['memory'] / MiB:,.0f} MiB | {heaviest['memory'][0]} | "
                  f"{size_text(Limits.from_env().memory_budget)} |",
                  f"| processes and threads | {heaviest['tasks'][1]['tasks']} | {heaviest['tasks'][0]} | "
                  f"{Limits.from_env().process_budget} |",
                  f"| bytes written | {heaviest['disk'][1]['disk'] / MiB:,.1f} MiB | {heaviest['disk'][0]} | "
                  f"{size_text(Limits.from_env().disk_budget)} |"]
    return "\n".join(lines)


def _cores() -> int:
    from course_utils.tooling.grading import default_jobs

    return default_jobs()


def update_guide(text: str, guide: Path = GUIDE) -> None:
    content = guide.read_text(encoding="utf-8")
    pattern = re.compile(re.escape(BEGIN) + r".*?" + re.escape(END), re.S)
    if not pattern.search(content):
        raise SystemExit(f"{guide} has no {BEGIN} ... {END} block for the table")
    guide.write_text(pattern.sub(lambda _: f"{BEGIN}\n\n{text}\n\n{END}", content), encoding="utf-8")


def failures(m: dict) -> list[str]:
    problems = []
    budget = NOTEBOOK_BUDGET * len(m["split"])
    if m["one"] > budget:
        problems.append(f"one student took {m['one']:.0f} s, over the {budget:.0f} s budget "
                        f"({NOTEBOOK_BUDGET} s for each of {len(m['split'])} notebooks)")
    if m["serial"] / m["parallel"] < SPEEDUP_FLOOR:
        problems.append(f"JOBS=2 was {m['serial'] / m['parallel']:.2f} times faster than JOBS=1, "
                        f"under {SPEEDUP_FLOOR}")
    limits = Limits.from_env()
    for stem, p in sorted(m.get("peaks", {}).items()):  # an honest notebook must stay well within its budget
        for key, budget in (("memory", limits.memory_budget), ("tasks", limits.process_budget),
                            ("disk", limits.disk_budget)):
            if p[key] > budget * BUDGET_SHARE:
                problems.append(f"{stem} used {p[key]:,} ({key}), more than {BUDGET_SHARE:.0%} of its budget "
                                f"({budget:,}): raise the budget in course_utils/tooling/limits.py, with the new measurement")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--students", type=int, default=4, help="students in the class for the speed-up")
    parser.add_argument("--peaks", nargs="*", metavar="STEM", default=None,
                        help="only measure the peaks (memory, processes, bytes written) of grading these notebooks "
                             "(default: all), as the budgets in limits.Limits were chosen")
    parser.add_argument("--no-guide", action="store_true", help="print the table, leave the instructor guide as it is")
    parser.add_argument("--one", action="store_true",
                        help="only grade one student (JOBS=1): the seconds per notebook, against the budget")
    args = parser.parse_args(argv)
    (ROOT / "build").mkdir(exist_ok=True)
    if args.one:
        return _one_student()
    if args.peaks is not None:
        chosen = [nb for nb in course_notebooks(NOTEBOOKS) if not args.peaks or any(nb.stem.startswith(s)
                                                                                    for s in args.peaks)]
        print(peaks_table(measure_peaks(chosen)))
        return 0
    m = measure(args.students)
    text = table(m)
    print(text)
    if not args.no_guide:
        update_guide(text)
    problems = failures(m)
    for problem in problems:
        print(f"FAILED: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
