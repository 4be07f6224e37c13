"""Where training runs report their wall time for ``make bench`` (nothing else reads it).

Notebooks never assert on elapsed time: a slow laptop or a busy shared core
must not stop Run All. Instead every training function calls
``record_training``, which, only when ``make bench`` set ``COURSE_BENCH_LOG``,
appends one JSON line (label, seconds) to that file; the benchmark then holds
each run to its budget.
"""

from __future__ import annotations

import json
import os

BENCH_LOG_ENV = "COURSE_BENCH_LOG"


def record_training(label: str, seconds: float) -> None:
    """Append ``{"label": label, "seconds": seconds}`` to ``$COURSE_BENCH_LOG``, if it is set."""
    path = os.environ.get(BENCH_LOG_ENV)
    if not path:
        return
    with open(path, "a", encoding="utf-8") as log:
        log.write(json.dumps({"label": label, "seconds": round(seconds, 3)}) + "\n")
