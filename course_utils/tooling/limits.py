"""The limits of one student's notebook in grading: its sandboxes' work folder and what they may use together.

:class:`Limits` holds the numbers (with the measurements they were chosen from); ``course_utils.tooling.budget``
enforces the budgets among them, ``course_utils.tooling.sandbox`` the per-process ones.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, fields, replace
from pathlib import Path

WORK = Path("/sandbox")  # the work folder inside every sandbox (HOME and the kernel's folder): a tmpfs
LIMITS_ENV = "COURSE_GRADING_LIMITS"  # e.g. "memory_budget=2GiB,process_budget=128,watchdog=1" (see Limits.from_env)
BUDGET_LOG_ENV = "COURSE_GRADING_BUDGET_LOG"  # a file: each budget appends its peaks there (make bench-grading)
MiB, GiB = 2**20, 2**30


@dataclass(frozen=True)
class Limits:
    """Resource limits of one student's notebook (its kernel's sandbox and its verdict child's, together).

    The budgets come from measurement. Grading the instructor's notebooks as
    a submission on the 2-core course machine (``python -m
    course_utils.tooling.bench_grading --peaks``; cgroup v1, the kernel's
    ``memory.max_usage_in_bytes`` and ``pids.peak`` of the budget: the
    notebook's kernel, its runner and its verdict child together, page cache
    included), the same with ``COURSE_UTILS_SMOKE=1`` and without (grading
    runs no training, so both gave the same numbers):

    =============================  ===========  ===========  =========
    notebook                       peak memory  peak tasks   written
    =============================  ===========  ===========  =========
    10_small_gpt                   654 MiB      28           0.1 MiB
    11_gpt_inference               654 MiB      28           0.1 MiB
    03_self_attention (heaviest)   752 MiB      30           0.1 MiB
    the nine others                618-693 MiB  28           0.1 MiB
    =============================  ===========  ===========  =========

    A whole notebook run in one sandbox, its training at full length
    included (more than grading ever runs): 10 664 MiB and 25 tasks, 11 644
    MiB and 25, 03 637 MiB, 26 and 1 MiB written, 09 (the heaviest) 1,454 MiB
    and 28. The budgets leave a margin on all of these: memory 4 GiB (5.4
    times grading's peak, 2.8 times a whole 09), 256 processes and threads
    (8.5 times), 512 MiB written (a thousand times: room for a learner's own
    files and checkpoints). With ``JOBS=2`` two budgets take at most 8 GiB
    of the course machine's 24 GiB. ``make bench-grading`` prints the peaks
    again and fails when a notebook uses more than half of a budget.
    """

    # The student's notebook in all: every process of its sandboxes, tmpfs pages included.
    memory_budget: int = 4 * GiB  # resident memory (cgroup memory.max; the watchdog sums PSS and tmpfs)
    process_budget: int = 256  # processes and threads alive at once (cgroup pids.max)
    disk_budget: int = 512 * MiB  # bytes in its work folders, /tmp and /dev/shm, all sandboxes together
    watchdog: bool = False  # use the watchdog even where a cgroup can be made (tests, or a machine that prefers it)
    # Each process (prlimit), a second line.
    memory_bytes: int = 6 * GiB  # address space of each process (MemoryError beyond it)
    extra_processes: int = 512  # processes and threads on top of what the grader's user already runs
    cpu_seconds: int = 1200  # CPU time of each process
    file_bytes: int = 256 * MiB  # largest file the notebook may write
    tmp_bytes: int = 256 * MiB  # size of the sandbox's /tmp and /dev/shm (each; all count in disk_budget)
    wall_seconds: int = 1800  # the whole run, kernel start to shutdown

    @classmethod
    def from_env(cls, environ: dict | None = None) -> Limits:
        """The default limits, changed by ``COURSE_GRADING_LIMITS`` (``name=value,...``; sizes as 512MiB, 4GiB)."""
        text = (os.environ if environ is None else environ).get(LIMITS_ENV, "").strip()
        limits = cls()
        if not text:
            return limits
        known = {f.name: f for f in fields(cls)}
        changes = {}
        for item in filter(None, (part.strip() for part in text.split(","))):
            name, _, value = item.partition("=")
            name = name.strip()
            if name not in known:
                raise ValueError(f"{LIMITS_ENV}: unknown limit {name!r}; the limits are {', '.join(known)}")
            if name == "watchdog":
                changes[name] = value.strip().lower() in ("1", "true", "yes", "on")
            else:
                changes[name] = _parse_size(value, f"{LIMITS_ENV}: {name}")
        return replace(limits, **changes)


def _parse_size(text: str, what: str) -> int:
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(|k|kib|m|mib|g|gib)\s*", text.lower())
    if not match:
        raise ValueError(f"{what}: {text!r} is not a number or a size such as 512MiB or 4GiB")
    scale = {"": 1, "k": 2**10, "kib": 2**10, "m": MiB, "mib": MiB, "g": GiB, "gib": GiB}[match.group(2)]
    return int(float(match.group(1)) * scale)


def size_text(n: int) -> str:
    """512 MiB, 4 GiB, 1.5 GiB: a size as the limits' messages say it."""
    if n >= GiB:
        return f"{n / GiB:.3g} GiB"
    if n >= MiB:
        return f"{n / MiB:.3g} MiB"
    return f"{n / 2**10:.3g} KiB"
