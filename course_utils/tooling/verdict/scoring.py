"""Running each exercise's checks in the grading process, and combining the verdict with nbgrader's scores."""

from __future__ import annotations

import ast
import contextlib
import io
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nbformat
import torch

from course_utils.tooling import sandbox
from course_utils.tooling.verdict.cells import Check, as_python, plan
from course_utils.tooling.verdict.proxies import Child, ChildFailure, RemoteObject, proxy

REASON_CHARS = 300  # of a reason in the grade table


@dataclass(frozen=True)
class Outcome:
    """The out-of-kernel verdict on one exercise."""

    score: float | None  # points earned; None when the exercise cannot be checked out of the kernel
    reason: str = ""  # why it lost points, or why it was not checked


def _short(text: str) -> str:
    line = " ".join(str(text).split())
    return line if len(line) <= REASON_CHARS else line[:REASON_CHARS - 1] + "…"


def _partial(value: Any, points: float) -> float:
    """nbgrader's score for a test cell whose last expression gave ``value`` (as its text would show)."""
    if value is None:
        return points
    from nbgrader.utils import get_partial_grade

    try:
        return float(get_partial_grade({"data": {"text/plain": repr(value)}}, points))
    except ValueError:  # above the maximum: nbgrader refuses the cell
        return 0.0


@contextlib.contextmanager
def _threads(count: int):
    """Compute with ``count`` threads, as the notebook's kernel does after ``setup()`` (sums round alike)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


class Judge:
    """The out-of-kernel verdict on one notebook: start the child early, run the checks, stop it.

    Usage::

        with Judge(graded, source, hide=[...], timeout=180) as judge:  # the child starts here
            ...                                                         # e.g. nbgrader runs the kernel meanwhile
            outcomes = judge.run()                                      # grade_id -> Outcome
    """

    def __init__(self, graded: nbformat.NotebookNode, source: nbformat.NotebookNode, *, hide: list[Path] = (),
                 timeout: float = 180, limits: sandbox.Limits | None = None, budget: sandbox.Budget | None = None):
        """``budget``: the one the notebook's kernel runs in too (by default the judge's own, with ``limits``)."""
        self.plan = plan(graded, source)
        self.hide, self.timeout = list(hide), timeout
        self.limits = limits or (budget.limits if budget is not None else sandbox.Limits.from_env())
        self._own_budget = budget is None
        self.budget = budget if budget is not None else sandbox.Budget(self.limits, label="verdict")
        self.child: Child | None = None
        self.setup_failure = ""
        self.started = 0.0

    def __enter__(self) -> Judge:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        """Start the child (it runs the notebook's context while the caller does something else).

        Nothing starts once the budget is exceeded (every exercise then scores 0 with the reason).
        """
        if self.child is None and not self.budget.breach and any(not c.uncovered for c in self.plan.checks):
            try:
                self.child = Child(self.plan.steps, self.hide, self.limits, self.budget)
            except sandbox.BudgetExceeded:
                return
            self.started = time.monotonic()

    def _stop_child(self) -> None:
        if self.child is not None:
            self.child.kill(grace=2.0)
            self.child = None

    def close(self) -> None:
        """Stop the child (and end the judge's own budget, if it has one)."""
        self._stop_child()
        if self._own_budget:
            self.budget.close()

    def run(self) -> dict[str, Outcome]:
        """The verdict on every exercise of the notebook; the child is stopped at the end."""
        try:
            return {check.grade_id: self._run(check) for check in self.plan.checks}
        finally:
            self.close()

    def _setup_deadline(self) -> float:
        cells = sum(1 for s in self.plan.steps if "cell" in s)
        return self.started + min(self.limits.wall_seconds, self.timeout * max(1, cells))

    def _run(self, check: Check) -> Outcome:
        if check.uncovered:
            return Outcome(None, check.uncovered)
        if self.setup_failure:
            return Outcome(0.0, self.setup_failure)
        if self.budget.breach:
            return Outcome(0.0, self.budget.breach)
        self.start()
        child = self.child
        if child is None:  # the budget was exceeded meanwhile
            return Outcome(0.0, self.budget.breach or "the grading child could not be started")
        try:
            child.wait_ready(self._setup_deadline())
        except ChildFailure as exc:
            self.setup_failure = _short(str(exc))
            self._stop_child()
            return Outcome(0.0, self.setup_failure)
        child.deadline = time.monotonic() + self.timeout
        child.timeout_note = f" ({self.timeout:g} s for the checks of {check.grade_id}: a loop that never ends?)"
        try:
            namespace = self._namespace(check, child)
            value = self._execute(check, namespace)
            return Outcome(_partial(value, check.points))
        except ChildFailure as exc:
            self._stop_child()
            return Outcome(0.0, _short(str(exc)))
        except Exception as exc:  # noqa: BLE001 - a failed check, whatever raised it, scores 0
            return Outcome(0.0, _short(f"{type(exc).__name__}: {exc}"))
        finally:
            if self.child is not None:
                self.child.deadline = time.monotonic() + self.timeout
                try:
                    self.child.reset()
                except ChildFailure:
                    self._stop_child()

    def _namespace(self, check: Check, child: Child) -> dict[str, Any]:
        namespace: dict[str, Any] = {"__name__": "__verdict__"}
        for source in check.prelude:  # the instructor's imports and definitions
            exec(compile(source, "<instructor's notebook>", "exec"), namespace)  # noqa: S102 - instructor code
        objects, undefined = child.exports(check.grade_id)
        for name in check.student_names:
            if name in undefined:
                errors = [child.errors[c] for c in check.solution_cells if c in child.errors]
                raise NameError(f"the solution cell does not define `{name}`"
                                + (f": it raised {errors[0]}" if errors else ""))
            if name not in objects:
                raise ChildFailure(f"the grading child did not send `{name}`")
            value = objects[name]
            if isinstance(value, RemoteObject) and value._callable:
                value = proxy(child, ("export", check.grade_id, name), name)
            namespace[name] = value
        return namespace

    @staticmethod
    def _execute(check: Check, namespace: dict[str, Any]) -> Any:
        """Run the test cell here; the value of its last expression (nbgrader's partial credit), if any."""
        tree = ast.parse(as_python(check.source))
        last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
        with (contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings(),
              torch.random.fork_rng(devices=[]), torch.enable_grad(), _threads(1)):
            warnings.simplefilter("ignore")
            torch.manual_seed(0)
            exec(compile(tree, f"<test cell {check.grade_id}>", "exec"), namespace)  # noqa: S102 - instructor code
            if last is None:
                return None
            return eval(compile(ast.Expression(last.value), f"<test cell {check.grade_id}>", "eval"), namespace)  # noqa: S307


def judge(graded: nbformat.NotebookNode, source: nbformat.NotebookNode, **kwargs: Any) -> dict[str, Outcome]:
    """The out-of-kernel verdict on every exercise of a notebook (see :class:`Judge` for the arguments)."""
    with Judge(graded, source, **kwargs) as verdict:
        return verdict.run()


DISAGREES = "in-kernel result disagrees with the out-of-kernel check: possible tampering"


def combine(kernel: dict[str, float], outcomes: dict[str, Outcome]) -> tuple[dict[str, float], list[str]]:
    """The scores to report, and the flags for a human.

    An exercise gets the lower of nbgrader's score (from the kernel) and the
    out-of-kernel verdict's: the kernel can only be made to say more than the
    truth, and a check that runs only there (the checkers' reference guard)
    still counts. When the kernel said more, the row is flagged
    (:data:`DISAGREES`); an exercise that cannot be checked out of the kernel
    keeps nbgrader's score and is flagged too.
    """
    scores, flags = {}, []
    for grade_id, got in kernel.items():
        outcome = outcomes.get(grade_id, Outcome(None, "no test cell of that name in the instructor's notebook"))
        if outcome.score is None:
            scores[grade_id] = got
            flags.append(f"{grade_id}: not checked out of the kernel ({outcome.reason})")
            continue
        scores[grade_id] = min(got, outcome.score)
        if got > outcome.score:
            flags.append(f"{grade_id}: {DISAGREES} (out of the kernel: {outcome.reason or 'partial credit'})")
    return scores, flags


def coverage(notebooks: list[Path]) -> list[str]:
    """For each graded exercise: what runs out of the kernel, or why it cannot (``--coverage``)."""
    lines = []
    for path in notebooks:
        nb = nbformat.read(path, as_version=4)
        for check in plan(nb, nb).checks:
            what = (f"NOT COVERED: {check.uncovered}" if check.uncovered
                    else f"runs here on the child's {', '.join(check.student_names) or 'nothing'}")
            lines.append(f"{path.stem} {check.grade_id}: {what}")
    return lines
