"""``make bench``: time every notebook and training run against the course's budgets, and check its timing claims.

Time is never asserted inside a notebook: on a slow laptop, a shared Binder
core or a lecture machine that is also driving a projector, Run All must not
stop on a stopwatch. The budgets live here instead, measured on the course's
2-core reference machine:

* each notebook runs top to bottom in under ``NOTEBOOK_BUDGET`` seconds, and
  under the runtime its first cell states (``*Runtime:* under N CPU minutes``);
* the whole series (the lectures) runs in under ``SERIES_BUDGET`` seconds;
* each of the lab book's notebooks (``notebooks/lab/``: optional, outside the
  learner's hour) runs in under ``LAB_BUDGET`` seconds and under the runtime
  its first cell states; they do not count in the series, have no minutes in
  the README, and are reported in lines of their own;
* each training run (every call of a training function in ``course_utils``,
  which reports itself through ``course_utils.experiments.loop``) takes under
  ``TRAINING_BUDGET`` seconds;
* every timing claim holds. A notebook that says something about measured
  time ("the batched run is more than three times faster", "the slope lies
  between 1.6 and 2.4") does not assert it: it calls
  ``course_utils.experiments.loop.timing_claim(statement, holds)``, which
  never stops Run All, and which, when this command runs the notebook,
  appends ``{"claim": statement, "holds": holds}`` to the same log as the
  training runs. The report lists every claim, held or not, and a claim that
  did not hold on the reference machine fails the benchmark: the prose says
  what happens on that machine, so it must keep happening there.

Each notebook is executed in a fresh kernel with the same settings as
``make execute`` and ``make test``, in memory: the committed notebooks are not
touched. The lectures' measured minutes go into the README's syllabus table and the
instructor guide. The
command exits with status 1 when any budget is exceeded or any timing claim did not hold.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from course_utils.experiments.loop import BENCH_LOG_ENV
from course_utils.tooling.execute import (LAB_BUDGET, NOTEBOOK_BUDGET, README, ROOT, display_name, execute_notebook,
                                          is_lab, notebook_paths, update_readme_minutes)

SERIES_BUDGET = 360.0  # seconds for all the lectures (the lab book is not in the series)
TRAINING_BUDGET = 60.0  # seconds per training run

RUNTIME_LINE = re.compile(r"\*Runtime:\*\s*under\s+(\d+(?:\.\d+)?)\s+CPU minutes?")


@dataclass
class NotebookTiming:
    """What ``make bench`` measured for one notebook."""

    name: str
    seconds: float
    stated_seconds: float | None  # from the notebook's "*Runtime:* under N CPU minutes" line
    runs: list[tuple[str, float]] = field(default_factory=list)  # (label, seconds) per training run
    claims: list[tuple[str, bool]] = field(default_factory=list)  # (statement, held) per timing_claim call
    lab: bool = False  # a lab book notebook: its own budget, not in the series

    @property
    def budget(self) -> float:
        """The smaller of the notebook's budget (``NOTEBOOK_BUDGET``, ``LAB_BUDGET``) and its stated runtime."""
        cap = LAB_BUDGET if self.lab else NOTEBOOK_BUDGET
        return min(cap, self.stated_seconds or cap)


def stated_runtime(path: Path) -> float | None:
    """Seconds promised by the notebook's first cell (``*Runtime:* under N CPU minutes``), or None."""
    nb = json.loads(path.read_text(encoding="utf-8"))
    first = "".join(nb["cells"][0]["source"]) if nb["cells"] else ""
    match = RUNTIME_LINE.search(first)
    return 60 * float(match.group(1)) if match else None


def read_log(text: str) -> tuple[list[tuple[str, float]], list[tuple[str, bool]]]:
    """The training runs and the timing claims a notebook wrote to ``$COURSE_BENCH_LOG``, in order.

    Args:
        text: The log, one JSON object a line: ``{"label", "seconds"}`` from
            ``record_training``, ``{"claim", "holds"}`` from ``timing_claim``.

    Returns:
        ``(runs, claims)``: ``(label, seconds)`` per training run, ``(statement, held)`` per claim.

    Raises:
        ValueError: A line that is neither, naming it and the two functions that write the log.
    """
    runs, claims = [], []
    for number, line in enumerate(text.splitlines(), 1):
        entry = json.loads(line)
        if isinstance(entry, dict) and entry.keys() == {"label", "seconds"}:
            runs.append((str(entry["label"]), float(entry["seconds"])))
        elif isinstance(entry, dict) and entry.keys() == {"claim", "holds"} and isinstance(entry["holds"], bool):
            claims.append((str(entry["claim"]), entry["holds"]))
        else:
            raise ValueError(f"{BENCH_LOG_ENV} line {number} is {line!r}: expected {{\"label\", \"seconds\"}} "
                             "(course_utils.experiments.loop.record_training) or {\"claim\", \"holds\": true/false} "
                             "(course_utils.experiments.loop.timing_claim)")
    return runs, claims


def time_notebook(path: Path, timeout: int = 600) -> NotebookTiming:
    """Execute ``path`` in memory and collect its wall time, the time of each training run and its timing claims."""
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "runs.jsonl"
        log.touch()
        previous = os.environ.get(BENCH_LOG_ENV)
        os.environ[BENCH_LOG_ENV] = str(log)  # the kernel inherits it
        try:
            seconds = execute_notebook(path, timeout=timeout, write=False)
        finally:
            if previous is None:
                os.environ.pop(BENCH_LOG_ENV, None)
            else:
                os.environ[BENCH_LOG_ENV] = previous
        runs, claims = read_log(log.read_text(encoding="utf-8"))
    return NotebookTiming(display_name(path), seconds, stated_runtime(path), runs, claims, lab=is_lab(path))


def budget_failures(timings: list[NotebookTiming]) -> list[str]:
    """One message per exceeded budget and per timing claim that did not hold (empty when all is well)."""
    failures = []
    for t in timings:
        if t.stated_seconds is None:
            failures.append(f"{t.name}: its first cell states no '*Runtime:* under N CPU minutes'")
        if t.seconds > t.budget:
            failures.append(f"{t.name}: {t.seconds:.1f} s, over its budget of {t.budget:.0f} s")
        for label, seconds in t.runs:
            if seconds > TRAINING_BUDGET:
                failures.append(f"{t.name}: training run '{label}' took {seconds:.1f} s, over {TRAINING_BUDGET:.0f} s")
        failures += [f"{t.name}: timing claim did not hold: {statement}" for statement, held in t.claims if not held]
    total = sum(t.seconds for t in timings if not t.lab)
    if total > SERIES_BUDGET:
        failures.append(f"the series: {total:.1f} s, over its budget of {SERIES_BUDGET:.0f} s")
    return failures


def _lines(t: NotebookTiming) -> list[str]:
    """A notebook's lines in the report: its time against its budget, its training runs, its timing claims."""
    lines = [f"{t.name:<58} {t.seconds:8.1f} {t.budget:7.0f}{'' if t.seconds <= t.budget else '  OVER'}"]
    for label, seconds in t.runs:
        mark = "" if seconds <= TRAINING_BUDGET else "  OVER"
        lines.append(f"  training: {label:<47} {seconds:8.1f} {TRAINING_BUDGET:7.0f}{mark}")
    return lines + [f"  claim {'held' if held else 'DID NOT HOLD'}: {statement}" for statement, held in t.claims]


def report(timings: list[NotebookTiming]) -> str:
    """The table ``make bench`` prints: each lecture, its training runs and timing claims, the series; the lab book."""
    lines = [f"{'notebook':<58} {'seconds':>8} {'budget':>7}"]
    for t in timings:
        lines += [] if t.lab else _lines(t)
    total = sum(t.seconds for t in timings if not t.lab)
    mark = "" if total <= SERIES_BUDGET else "  OVER"
    lines.append(f"{'the series':<58} {total:8.1f} {SERIES_BUDGET:7.0f}{mark}")
    lab = [t for t in timings if t.lab]
    if lab:
        lines += ["", f"{'lab book (not in the series)':<58} {'seconds':>8} {'budget':>7}"]
        for t in lab:
            lines += _lines(t)
        lines.append(f"{'the lab book, in all':<58} {sum(t.seconds for t in lab):8.1f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="*", default=[str(ROOT / "notebooks")], help="notebooks or folders")
    parser.add_argument("--timeout", type=int, default=600, help="seconds allowed per cell")
    parser.add_argument("--no-readme", action="store_true", help="do not write the minutes into README.md")
    args = parser.parse_args(argv)
    notebooks = notebook_paths(args.paths)  # a folder: its lectures, then its lab book
    if not notebooks:
        print(f"no notebooks found in {args.paths}", file=sys.stderr)
        return 1
    timings = []
    start = time.perf_counter()
    for path in notebooks:
        timings.append(time_notebook(path, timeout=args.timeout))
        print(f"{timings[-1].name}: {timings[-1].seconds:.1f} s", flush=True)
    print(f"\nmeasured in {time.perf_counter() - start:.0f} s; budgets in seconds (notebook: the smaller of "
          f"{NOTEBOOK_BUDGET:.0f}, {LAB_BUDGET:.0f} for the lab book, and its stated runtime)\n")
    print(report(timings))
    if not args.no_readme:
        from course_utils.tooling.guide import update as update_guide  # the guide's run times come from the README

        update_readme_minutes({t.name: t.seconds / 60 for t in timings if not t.lab}, README)  # lectures only
        update_guide()
        print(f"\nwrote the minutes into {README.relative_to(ROOT)} and docs/instructor_guide.md")
    failures = budget_failures(timings)
    for message in failures:
        print(f"BENCH FAILED: {message}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
