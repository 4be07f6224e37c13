"""The one training loop every experiment uses, and what it reports to ``make bench``.

:func:`fit` takes a model, an optimizer and a function that returns the loss
of step ``k``; each notebook's experiment (``training``, ``scaling``,
``neighbours``, ``order``) brings its own data and loss and calls it.

Notebooks never assert on elapsed time: a slow laptop or a busy shared core
must not stop Run All. Instead :func:`fit` calls :func:`record_training`,
which, only when ``make bench`` set ``COURSE_BENCH_LOG``, appends one JSON
line (label, seconds) to that file; the benchmark holds each run to its budget.
Claims about measured time ("the cache saves more than half the time") go
through :func:`timing_claim` the same way, and the benchmark checks them.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

import torch

BENCH_LOG_ENV = "COURSE_BENCH_LOG"

SMOKE_ENV = "COURSE_UTILS_SMOKE"
"""Set to 1 only by the grading round-trip tests: every training run takes
SMOKE_STEPS steps, so a notebook is checked to *run* under the autograder in
seconds. nbval always runs the full budget, and the notebooks' asserts on
accuracy then fail in ungraded cells, which grading ignores."""
SMOKE_STEPS = 3


class HasSteps(Protocol):
    """Any experiment config: it states its number of optimizer steps."""

    steps: int


def training_steps(config: HasSteps) -> int:
    """``config.steps``, or :data:`SMOKE_STEPS` when ``COURSE_UTILS_SMOKE=1``."""
    return SMOKE_STEPS if os.environ.get(SMOKE_ENV) == "1" else config.steps


def record_training(label: str, seconds: float) -> None:
    """Append ``{"label": label, "seconds": seconds}`` to ``$COURSE_BENCH_LOG``, if it is set."""
    path = os.environ.get(BENCH_LOG_ENV)
    if not path:
        return
    with open(path, "a", encoding="utf-8") as log:
        log.write(json.dumps({"label": label, "seconds": round(seconds, 3)}) + "\n")


def timing_claim(statement: str, holds: bool) -> bool:
    """Hand a claim about measured time to ``make bench`` instead of asserting it in the notebook.

    A notebook that says "the batched run is more than three times faster" writes
    ``timing_claim("the batched run is more than 3x faster", sequential > 3 * batched)``.
    Run All never stops on it (a slow or busy machine may time things differently);
    when ``make bench`` set ``$COURSE_BENCH_LOG``, one JSON line
    ``{"claim": statement, "holds": holds}`` is appended to that file, and the
    benchmark fails on the reference machine if the claim did not hold.

    Args:
        statement: The claim in words, as the prose beside it makes it.
        holds: Whether it held in this run.

    Returns:
        ``holds``, so the notebook can print it.
    """
    if not isinstance(statement, str) or not statement.strip():
        raise TypeError(f"timing_claim: the statement must be a non-empty string, got {statement!r}")
    holds = bool(holds)
    path = os.environ.get(BENCH_LOG_ENV)
    if path:
        with open(path, "a", encoding="utf-8") as log:
            log.write(json.dumps({"claim": statement, "holds": holds}) + "\n")
    return holds


def timing_claims(claims: dict[str, bool]) -> None:
    """:func:`timing_claim` for each ``statement: holds`` pair, printing whether it held on this machine."""
    for statement, holds in claims.items():
        print("✓ held in this run:" if timing_claim(statement, holds) else "✗ did not hold in this run:", statement)


@contextlib.contextmanager
def num_threads(n: int | None) -> Iterator[None]:
    """Temporarily run torch's CPU kernels on ``n`` threads (``None``: leave as is)."""
    before = torch.get_num_threads()
    if n is not None:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@dataclass(frozen=True)
class TrainResult:
    """What :func:`fit` measured.

    Attributes:
        losses: Training loss at every step.
        seconds: Wall time of the loop (excludes building the model and the test data).
        steps: Number of optimizer steps taken.
    """

    losses: tuple[float, ...]
    seconds: float
    steps: int


def fit(model: torch.nn.Module, optimizer: torch.optim.Optimizer, step_loss: Callable[[int], torch.Tensor],
        steps: int, label: str, *, lr_at: Callable[[int], float] | None = None, grad_clip: float = 0.0,
        threads: int | None = None, log_every: int = 0) -> TrainResult:
    """Run ``steps`` optimizer steps: loss, backward, optional clipping, update.

    Args:
        model: Trained in place; left in eval mode.
        optimizer: Over ``model``'s parameters.
        step_loss: ``step_loss(k)`` draws the batch of step ``k`` and returns its scalar loss.
        steps: Number of steps (pass :func:`training_steps` of the config).
        label: How ``make bench`` names this run.
        lr_at: Learning rate of step ``k`` (0-based); ``None`` keeps the optimizer's.
        grad_clip: Largest global gradient norm; 0 = no clipping.
        threads: ``torch.set_num_threads`` during the loop; ``None`` = unchanged.
        log_every: If > 0, print ``step <k>  loss <x.xxx>`` (mean of the last
            ``log_every`` losses; deterministic text, no times).

    Returns:
        A :class:`TrainResult`.
    """
    losses: list[float] = []
    model.train()
    with num_threads(threads):
        start = time.perf_counter()
        for step in range(steps):
            if lr_at is not None:
                for group in optimizer.param_groups:
                    group["lr"] = lr_at(step)
            loss = step_loss(step)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
            optimizer.step()
            losses.append(loss.item())
            if log_every > 0 and ((step + 1) % log_every == 0 or step + 1 == steps):
                recent = losses[-log_every:]
                print(f"step {step + 1:5d}  loss {sum(recent) / len(recent):.3f}")
        seconds = time.perf_counter() - start
    model.eval()
    record_training(label, seconds)
    return TrainResult(losses=tuple(losses), seconds=seconds, steps=steps)
