"""Common core of every checker: tensor and closeness checks, running a learner's
function, and messages that name the likely bug."""

from __future__ import annotations

import traceback
from collections.abc import Callable, Mapping
from typing import Any

import torch

from course_utils.core.errors import CheckError


def describe(x: Any) -> str:
    """Short description of a value for a message: type, shape, dtype."""
    if x is None:
        return "None"
    if isinstance(x, torch.Tensor):
        return f"a tensor of shape {tuple(x.shape)} and dtype {x.dtype}"
    shape = getattr(x, "shape", None)
    if shape is not None:
        return f"a {type(x).__module__.split('.')[0]} {type(x).__name__} of shape {tuple(shape)}"
    if isinstance(x, (tuple, list)):
        return f"a {type(x).__name__} of {len(x)} item(s)"
    return f"a {type(x).__name__} ({x!r:.40})"


def _format_shape(letters: str, dims: Mapping[str, int]) -> str:
    names = letters.split()
    return f"({', '.join(names)}) = {tuple(dims[n] for n in names)}"


def _learner_line(exc: BaseException) -> str:
    """The last traceback line that is not inside torch or course_utils, as 'line N: code'."""
    frames = traceback.extract_tb(exc.__traceback__)
    for frame in reversed(frames):
        fname = frame.filename.replace("\\", "/")
        if "/torch/" in fname or "/course_utils/" in fname:
            continue
        code = (frame.line or "").strip()
        return f"line {frame.lineno} of {frame.name}(): `{code}`" if code else f"line {frame.lineno} of {frame.name}()"
    return "the first line of your function"


def call(fn: Callable[..., Any], *args: Any, name: str | None = None, expected: str = "a tensor",
         error_hint: str = "") -> Any:
    """Call a learner's function; turn a missing answer or an exception into a ``CheckError``.

    Args:
        fn: The learner's function.
        *args: Arguments to pass.
        name: Name used in messages (defaults to ``fn.__name__``).
        expected: What the function should return, for the message.
        error_hint: Added to the message when ``fn`` raises (the likely cause).

    Returns:
        Whatever ``fn`` returned (not checked here).

    Raises:
        CheckError: If ``fn`` is not callable, is not written yet, or raises.
    """
    __tracebackhide__ = True  # noqa: F841  (IPython and pytest hide this frame)
    name = name or getattr(fn, "__name__", "your function")
    if fn is None or not callable(fn):
        raise CheckError(f"expected a function for {name}, got {describe(fn)}: pass the function itself, without calling it")
    try:
        return fn(*args)
    except NotImplementedError:
        raise CheckError(
            f"{name} is not written yet: replace `raise NotImplementedError()` with your code. "
            f"It should return {expected}."
        ) from None
    except Exception as exc:  # noqa: BLE001 - any learner exception becomes a message
        shapes = ", ".join(describe(a) for a in args)
        raise CheckError(
            f"{name} raised {type(exc).__name__}: {exc}\n"
            f"  called with: {shapes}\n"
            f"  expected it to return {expected}\n"
            f"  look at {_learner_line(exc)}"
            + (f"\n  likely cause: {error_hint}" if error_hint else "")
        ) from None


def check_tensor(
    got: Any,
    *,
    name: str,
    shape: str | None = None,
    dims: Mapping[str, int] | None = None,
    dtype: torch.dtype | None = None,
    hints: Mapping[tuple[int, ...], str] | None = None,
    allow_nan: bool = False,
) -> torch.Tensor:
    """Check type, shape, dtype and finiteness of a learner's tensor.

    Args:
        got: The value to check.
        name: Its name in messages, e.g. ``"weights"``.
        shape: Expected shape as dimension letters, e.g. ``"B T S"``.
        dims: Size of each letter, e.g. ``{"B": 2, "T": 4, "S": 6}``.
        dtype: Expected dtype, or None for any.
        hints: Likely cause for a wrong shape, keyed by that wrong shape.
        allow_nan: Accept NaN / inf values.

    Returns:
        ``got``, now known to be a tensor of the right shape and dtype.

    Raises:
        CheckError: With expected vs got and the likely cause.
    """
    __tracebackhide__ = True  # noqa: F841
    want = _format_shape(shape, dims) if shape is not None and dims is not None else "a tensor"
    if got is None:
        raise CheckError(f"expected {name} of shape {want}, got None: did you forget to `return` it?")
    if not isinstance(got, torch.Tensor):
        raise CheckError(f"expected {name} to be a torch.Tensor of shape {want}, got {describe(got)}")
    if shape is not None and dims is not None:
        expected_shape = tuple(dims[n] for n in shape.split())
        if tuple(got.shape) != expected_shape:
            message = f"expected {name} of shape {want}, got {tuple(got.shape)}"
            hint = (hints or {}).get(tuple(got.shape))
            if hint is None and sorted(got.shape) == sorted(expected_shape) and got.dim() == len(expected_shape):
                hint = "the right sizes in the wrong order: check which dimensions you transposed or permuted"
            if hint is None and got.dim() != len(expected_shape):
                hint = f"{got.dim()} dimensions instead of {len(expected_shape)}: check which dimension you summed over, squeezed or added"
            raise CheckError(message + (f": {hint}" if hint else ""))
    if dtype is not None and got.dtype != dtype:
        raise CheckError(f"expected {name} with dtype {dtype}, got {got.dtype}")
    if not allow_nan and got.is_floating_point() and not torch.isfinite(got).all():
        bad = (~torch.isfinite(got)).nonzero()
        first = tuple(bad[0].tolist())
        raise CheckError(
            f"{name} contains {len(bad)} NaN/inf value(s), the first at index {first}: "
            "look for a softmax over a row whose scores are all -inf, or a division by zero"
        )
    return got


def check_close(
    got: Any,
    expected: torch.Tensor,
    *,
    name: str,
    shape: str | None = None,
    dims: Mapping[str, int] | None = None,
    suspects: Mapping[str, torch.Tensor] | None = None,
    hints: Mapping[tuple[int, ...], str] | None = None,
    hint: str = "",
    atol: float = 1e-5,
    rtol: float = 1e-4,
) -> None:
    """Compare a learner's tensor with the expected one; recognise known mistakes.

    Args:
        got: The learner's value.
        expected: The right answer.
        name: Its name in messages.
        shape: Dimension letters of the expected shape, e.g. ``"B T S"``.
        dims: Size of each letter.
        suspects: ``{description of a mistake: what that mistake returns}``;
            when ``got`` matches one, the message names that mistake.
        hints: Likely cause for a wrong shape, keyed by that wrong shape.
        hint: What to look at when the values are wrong for an unknown reason.
        atol: Absolute tolerance.
        rtol: Relative tolerance.

    Raises:
        CheckError: With the mistake recognised, or where the values differ (never the expected value).
    """
    __tracebackhide__ = True  # noqa: F841
    if shape is None:
        shape = " ".join(f"d{i}" for i in range(expected.dim()))
        dims = {f"d{i}": n for i, n in enumerate(expected.shape)}
    check_tensor(got, name=name, shape=shape, dims=dims, dtype=expected.dtype, hints=hints,
                 allow_nan=not torch.isfinite(expected).all().item())
    if torch.allclose(got, expected, atol=atol, rtol=rtol, equal_nan=True):
        return
    for mistake, value in (suspects or {}).items():
        if value.shape == got.shape and torch.allclose(got, value, atol=atol, rtol=rtol, equal_nan=True):
            raise CheckError(f"{name}: right shape, wrong values: {mistake}")
    diff = (got - expected).abs().nan_to_num(float("inf"))
    index = tuple(int(i) for i in torch.unravel_index(diff.argmax(), diff.shape))
    # Where, and how many, but never the expected value: a checker names the bug, it does not hand out answers.
    raise CheckError(
        f"{name}: right shape, wrong values. {int((diff > atol + rtol * expected.abs()).sum())} of {diff.numel()} "
        f"entries differ from the reference, the most at index {index}, where you returned {got[index].item():.4f}."
        + (f" Hint: {hint}" if hint else "")
    )


def expect_failure(check: Callable[..., Any], *args: Any, **kwargs: Any) -> str:
    """Run a check that should fail on a buggy answer; print its message.

    Used in the "Common pitfalls" sections to show a check catching a bug
    without leaving an error (and a traceback) in the notebook.

    Returns:
        The check's message.

    Raises:
        AssertionError: If the check passed although it should have failed.
    """
    try:
        check(*args, **kwargs)
    except CheckError as err:
        message = str(err)
        print(f"check failed, as it should:\n  {message}")
        return message
    raise AssertionError(f"{getattr(check, '__name__', 'the check')} accepted an answer it should reject")


def passed(what: str) -> None:
    print(f"✓ {what}: all checks passed")
