"""``make bench-grading``: how long grading takes, per student, per notebook, and with two jobs against one.

A class is made of copies of the instructor notebooks (every answer right, so
every exercise's checks run to the end, as for a good student). It is graded

1. one student alone (``JOBS=1``): the seconds for one full submission, and the
   split per notebook (each notebook's kernel, its out-of-kernel verdict and
   its feedback page);
2. ``--students`` students with ``JOBS=1``, then with ``JOBS=2``: the speed-up.

Every run must give full marks. The table goes into the instructor guide,
between its ``grading-bench`` markers. The command exits with status 1 when
one student takes more than ``NOTEBOOK_BUDGET`` seconds per notebook or two jobs are less
than ``SPEEDUP_FLOOR`` times faster than one.
"""

from __future__ import annotations

import argparse
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

GUIDE = ROOT / "docs" / "instructor_guide.md"
BEGIN, END = "<!-- BEGIN GENERATED: grading-bench -->", "<!-- END GENERATED: grading-bench -->"
NOTEBOOK_BUDGET = 11.6  # seconds per notebook for one student: half of the 232 s ten notebooks took before
SPEEDUP_FLOOR = 1.3  # JOBS=2 against JOBS=1 on a 2-core machine, where one job already keeps about 1.25 cores busy


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


def measure(students: int = 4) -> dict:
    """Grade the class three ways; return the seconds."""
    notebooks = course_notebooks(NOTEBOOKS)
    with tempfile.TemporaryDirectory(prefix="bench-grading-", dir=ROOT / "build") as tmp:
        base = Path(tmp)
        print("one student, JOBS=1")
        one, results, one_busy = _timed(_class(base / "one", 1, notebooks), base / "out-one", 1)
        split = {r.notebook: r.seconds for r in results}
        klass = _class(base / "class", students, notebooks)
        print(f"{students} students, JOBS=1")
        serial, _, serial_busy = _timed(klass, base / "out-serial", 1)
        print(f"{students} students, JOBS=2")
        parallel, _, parallel_busy = _timed(klass, base / "out-parallel", 2)
    return {"one": one, "split": split, "students": students, "serial": serial, "parallel": parallel,
            "busy": {"one": one_busy, "serial": serial_busy, "parallel": parallel_busy}}


def table(m: dict) -> str:
    lines = [f"Measured by `make bench-grading` on {platform.machine()} with {_cores()} cores: the instructor "
             "notebooks graded as submissions (full marks each time).", "",
             "| what | seconds | cores busy on average |", "|---|---|---|",
             f"| one student's {len(m['split'])} notebooks, `JOBS=1` | {m['one']:.0f} | {m['busy']['one']:.2f} |"]
    lines += [f"| · {stem} | {seconds:.1f} | |" for stem, seconds in sorted(m["split"].items())]
    lines += [f"| {m['students']} students, `JOBS=1` | {m['serial']:.0f} | {m['busy']['serial']:.2f} |",
              f"| {m['students']} students, `JOBS=2` | {m['parallel']:.0f} | {m['busy']['parallel']:.2f} |",
              f"| speed-up of `JOBS=2` over `JOBS=1` | {m['serial'] / m['parallel']:.2f}× | |"]
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
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--students", type=int, default=4, help="students in the class for the speed-up")
    args = parser.parse_args(argv)
    (ROOT / "build").mkdir(exist_ok=True)
    m = measure(args.students)
    text = table(m)
    print(text)
    update_guide(text)
    problems = failures(m)
    for problem in problems:
        print(f"FAILED: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
