"""How a learner's function is written: Python loops, the torch functions it calls.

What the exercise text rules out ("No Python loops", a product other than ``@``)
is read from the function's bytecode (:func:`has_python_loop`) or from the torch
calls it makes (:func:`torch_calls`). Neither looks at the course's own functions
(:func:`course_function`), such as the out-of-kernel grader's proxy of a student's
function.
"""

from __future__ import annotations

import dis
import inspect
from collections.abc import Callable
from pathlib import Path
from types import CodeType
from typing import Any

from torch.overrides import TorchFunctionMode

from course_utils.checks.core import call


# --- what the exercise text rules out: Python loops, a product other than `@` --------------------

_PACKAGE = Path(__file__).resolve().parents[1]  # course_utils/


def course_function(fn: Any) -> bool:
    """Whether ``fn`` is a Python function of the course's own package, not code a learner wrote.

    The out-of-kernel grader (:mod:`course_utils.tooling.verdict`) hands the checkers a
    proxy of the student's function, defined in this package: its code is the proxy's,
    and the student's code runs in another process. Like the reference guard, the checks
    of how a function is written then have nothing to look at, and are left to the
    kernel's run of the same checker.
    """
    code = getattr(inspect.unwrap(fn), "__code__", None)
    if not isinstance(code, CodeType):
        return False
    try:
        return Path(code.co_filename).resolve().is_relative_to(_PACKAGE)
    except (OSError, ValueError):
        return False


_JUMPS = frozenset(dis.hasjrel) | frozenset(dis.hasjabs)


def has_python_loop(fn: Any) -> bool:
    """Whether a learner's function has a ``for`` or ``while`` loop or a comprehension (read from its bytecode).

    Only the function's own code is read (nested functions and comprehensions
    included, not the functions it calls); a callable without Python code, or one
    of the course's own (:func:`course_function`), counts as loop-free.
    """
    code = getattr(inspect.unwrap(fn), "__code__", None)
    if not isinstance(code, CodeType) or course_function(fn):
        return False

    def loops(code: CodeType) -> bool:
        for instruction in dis.get_instructions(code):
            backward = (instruction.opcode in _JUMPS and isinstance(instruction.argval, int)
                        and instruction.argval < instruction.offset and "NO_INTERRUPT" not in instruction.opname)
            if instruction.opname == "FOR_ITER" or backward:
                return True  # an iteration, or a jump back to the top of a loop (while)
        return any(loops(const) for const in code.co_consts if isinstance(const, CodeType))

    return loops(code)


class _TorchCalls(TorchFunctionMode):
    """Records the name of every torch function and tensor method called while it is active."""

    def __init__(self) -> None:
        super().__init__()
        self.names: set[str] = set()
        self.count = 0

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: Any = None) -> Any:
        self.names.add(getattr(func, "__name__", ""))
        self.count += 1
        return func(*args, **(kwargs or {}))


def _recorded(fn: Callable[..., Any], *args: Any, **call_kwargs: Any) -> tuple[Any, _TorchCalls | None]:
    """:func:`call` ``fn`` with its torch calls recorded; no record for one of the course's own functions."""
    __tracebackhide__ = True  # noqa: F841
    if course_function(fn):
        return call(fn, *args, **call_kwargs), None
    with _TorchCalls() as recorder:
        result = call(fn, *args, **call_kwargs)
    return result, recorder


def torch_calls(fn: Callable[..., Any], *args: Any, **call_kwargs: Any) -> tuple[Any, set[str] | None]:
    """:func:`call` ``fn``, recording the names of the torch functions and tensor methods it calls.

    Returns:
        What ``fn`` returned, and the names (``"matmul"`` for ``@``), or None when
        ``fn`` is one of the course's own functions (:func:`course_function`, e.g.
        the out-of-kernel grader's proxy, whose torch calls are not the student's).
    """
    __tracebackhide__ = True  # noqa: F841
    result, recorder = _recorded(fn, *args, **call_kwargs)
    return result, None if recorder is None else recorder.names


def torch_call_count(fn: Callable[..., Any], *args: Any, **call_kwargs: Any) -> tuple[Any, int | None]:
    """:func:`call` ``fn``, counting its calls of torch functions and tensor methods.

    Called twice with inputs that differ in one size only, a function whose count
    grows with that size loops over it (a loop over heads makes one product per head).

    Returns:
        What ``fn`` returned, and the count, or None for one of the course's own
        functions (:func:`course_function`).
    """
    __tracebackhide__ = True  # noqa: F841
    result, recorder = _recorded(fn, *args, **call_kwargs)
    return result, None if recorder is None else recorder.count
