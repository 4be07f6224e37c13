"""Checks with messages a learner can act on (introduced in notebook 00).

Two layers:

* generic helpers: ``check_tensor`` (type, shape, dtype, NaN), ``check_close``
  (values, with a list of known mistakes to recognise), ``call`` (runs a
  learner's function and turns ``None``, ``NotImplementedError`` or any other
  exception into a short message), ``expect_failure`` (shows a check catching
  a bug, for the "Common pitfalls" sections);
* exercise checkers, named after the concept they check
  (``check_padding_mask``, ``check_pairwise_scores``, ``check_masked_softmax``),
  each taking the learner's function and raising ``CheckError`` whose message
  says what was expected, what came back and what to look at.

Every checker is tested against known-buggy answers in ``tests/test_checks.py``.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable, Mapping
from typing import Any

import torch

from course_utils import attention, masks


class CheckError(AssertionError):
    """A failed check. The message says what was expected, what came back and what to look at."""


# ---------------------------------------------------------------------------
# Generic helpers
# ---------------------------------------------------------------------------


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


def call(fn: Callable[..., Any], *args: Any, name: str | None = None, expected: str = "a tensor") -> Any:
    """Call a learner's function; turn a missing answer or an exception into a ``CheckError``.

    Args:
        fn: The learner's function.
        *args: Arguments to pass.
        name: Name used in messages (defaults to ``fn.__name__``).
        expected: What the function should return, for the message.

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
        CheckError: With the mistake recognised, or the first wrong entry.
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
            raise CheckError(f"{name} has the right shape but wrong values: {mistake}")
    diff = (got - expected).abs().nan_to_num(float("inf"))
    index = tuple(int(i) for i in torch.unravel_index(diff.argmax(), diff.shape))
    raise CheckError(
        f"{name} has the right shape but wrong values: at index {index} expected "
        f"{expected[index].item():.4f}, got {got[index].item():.4f} "
        f"({int((diff > atol + rtol * expected.abs()).sum())} of {diff.numel()} entries differ)"
        + (f": {hint}" if hint else "")
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


def _passed(what: str) -> None:
    print(f"✓ {what}: all checks passed")


# ---------------------------------------------------------------------------
# Exercise checkers, notebook 00
# ---------------------------------------------------------------------------


def check_padding_mask(fn: Callable[[torch.Tensor, int], Any], seed: int = 0, B: int = 4, S: int = 6) -> None:
    """Check a learner's ``padding_mask(lengths, S) -> (B, 1, S) bool`` (notebook 00, exercise 1).

    Raises:
        CheckError: Naming the likely bug.
    """
    __tracebackhide__ = True  # noqa: F841
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, S + 1, (B,), generator=g)
    lengths[0] = S  # one full-length sequence
    lengths[-1] = 1  # and a very short one
    if B > 2:
        lengths[1] = 0  # and an empty one
    lengths_copy = lengths.clone()
    got = call(fn, lengths, S, name="padding_mask", expected="a (B, 1, S) bool tensor")
    if not torch.equal(lengths, lengths_copy):
        raise CheckError("padding_mask changed `lengths` in place: build a new tensor instead")
    dims = {"B": B, "S": S}
    expected = masks.padding_mask(lengths, S)
    hints = {
        (B, S): "the query axis is missing: index with [:, None, :] (or unsqueeze(1)) so the mask broadcasts against (B, T, S) scores",
        (B, S, 1): "the singleton axis is in the wrong place: the mask must be (B, 1, S) to broadcast over the T queries",
        (S, B): "rows and columns are swapped: compare positions[None, :] with lengths[:, None]",
    }
    got_t = check_tensor(got, name="the mask", shape="B 1 S", dims={**dims, "1": 1}, hints=hints)
    if got_t.dtype != torch.bool:
        raise CheckError(
            f"expected a bool mask, got dtype {got_t.dtype}: a comparison such as `positions < lengths` already "
            "gives bool; masked_fill and torch.where need bool"
        )
    positions = torch.arange(S)
    suspects = {
        "True marks the padding here; in this course True = may attend (a real token)": ~expected,
        "off by one: position j is real when j < length, not j <= length": (positions[None, :] <= lengths[:, None])[:, None, :],
        "off by one: position j is real when j < length, not j < length - 1": (positions[None, :] < lengths[:, None] - 1)[:, None, :],
    }
    check_close(got_t.float(), expected.float(), name="the mask", shape="B 1 S", dims={**dims, "1": 1},
                suspects={k: v.float() for k, v in suspects.items()},
                hint="position j of sequence b is real exactly when j < lengths[b]")
    _passed("padding_mask")


def check_pairwise_scores(fn: Callable[[torch.Tensor, torch.Tensor], Any], seed: int = 0,
                          B: int = 2, T: int = 4, S: int = 6, D: int = 3) -> None:
    """Check a learner's ``pairwise_scores(q, k) -> (B, T, S)`` (notebook 00, exercise 2).

    Raises:
        CheckError: Naming the likely bug.
    """
    __tracebackhide__ = True  # noqa: F841
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, D, generator=g)
    k = torch.randn(B, S, D, generator=g)
    q_copy, k_copy = q.clone(), k.clone()
    got = call(fn, q, k, name="pairwise_scores", expected=f"scores of shape (B, T, S) = {(B, T, S)}")
    if not (torch.equal(q, q_copy) and torch.equal(k, k_copy)):
        raise CheckError("pairwise_scores changed q or k in place: use out-of-place operations")
    dims = {"B": B, "T": T, "S": S, "D": D}
    expected = attention.pairwise_scores(q, k)
    hints = {
        (B, S, T): "did you compute k @ q^T? Queries index the rows: q @ k.transpose(-2, -1)",
        (B, T, D): "that is the shape of q: the dot product must sum over D, leaving one score per (query, key) pair",
        (B, T, S, D): "the products were not summed over D: add .sum(-1), or use q @ k.transpose(-2, -1)",
        (T, S): "the batch dimension is gone: keep B, e.g. with q @ k.transpose(-2, -1) (batched matmul)",
    }
    suspects = {
        "only the first batch element is right: loop over (or broadcast across) every batch element":
            expected[:1].expand_as(expected),
        "the scores are divided by √D: this exercise asks for the plain dot product (the scaling comes in notebook 04)":
            expected / D**0.5,
    }
    check_close(got, expected, name="scores", shape="B T S", dims=dims, hints=hints, suspects=suspects,
                hint="scores[b, i, j] must be the dot product of query i and key j of batch element b")
    _passed("pairwise_scores")


def check_masked_softmax(fn: Callable[[torch.Tensor, torch.Tensor], Any], seed: int = 0,
                         B: int = 3, T: int = 4, S: int = 5) -> None:
    """Check a learner's ``masked_softmax(scores, mask) -> weights`` (notebook 00, exercise 3).

    ``mask`` is (B, 1, S) bool, True = may attend; a row with no allowed key
    must come back as zeros, not NaN.

    Raises:
        CheckError: Naming the likely bug.
    """
    __tracebackhide__ = True  # noqa: F841
    g = torch.Generator().manual_seed(seed)
    scores = 2 * torch.randn(B, T, S, generator=g)
    lengths = torch.tensor([S, S - 2, 0][:B] + [S] * max(0, B - 3))  # full, padded, and fully masked
    mask = masks.padding_mask(lengths, S)  # (B, 1, S)
    scores_copy = scores.clone()
    got = call(fn, scores, mask, name="masked_softmax", expected=f"weights of shape (B, T, S) = {(B, T, S)}")
    if not torch.equal(scores, scores_copy):
        raise CheckError(
            "masked_softmax changed `scores` in place (e.g. masked_fill_ with a trailing underscore): "
            "use scores.masked_fill(...), which returns a new tensor"
        )
    dims = {"B": B, "T": T, "S": S}
    expected = attention.masked_softmax(scores, mask)
    if isinstance(got, torch.Tensor) and tuple(got.shape) == (B, T, S) and got.is_floating_point():
        nan_rows = torch.isnan(got).any(-1)  # (B, T)
        if nan_rows.any() and not torch.isnan(got[lengths > 0]).any():
            raise CheckError(
                "the rows of the sequence whose keys are all masked are NaN: softmax over only -inf is 0/0. "
                "Set the weights of rows with no allowed key to 0 (e.g. masked_fill where mask.any(-1) is False)"
            )
    plain = torch.softmax(scores, dim=-1)
    filled_zero = torch.softmax(scores.masked_fill(~mask, 0.0), dim=-1)
    suspects = {
        "the softmax ran over the queries (dim=-2), so columns sum to 1; it must run over the keys, dim=-1":
            torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-2).nan_to_num(0.0),
        "the mask was ignored: padded keys still get weight": plain,
        "the mask is inverted: True means may attend, so fill the scores where ~mask": attention.masked_softmax(scores, ~mask),
        "masked scores were set to 0, which still gets weight exp(0): fill them with -inf": filled_zero,
        "the weights were zeroed after the softmax, so rows no longer sum to 1: mask the scores before the softmax":
            plain * mask,
        "rows with no allowed key must be all zeros (this one is uniform)":
            torch.where(mask.any(-1, keepdim=True), expected, torch.full_like(expected, 1.0 / S)),
    }
    check_close(got, expected, name="weights", shape="B T S", dims=dims, suspects=suspects,
                hints={(B, 1, S): "the T queries are gone: keep scores' shape, the mask broadcasts over T"},
                hint="each row must be a softmax over the allowed keys (True in the mask) and 0 elsewhere")
    _passed("masked_softmax")


__all__ = [
    "CheckError",
    "call",
    "check_close",
    "check_masked_softmax",
    "check_padding_mask",
    "check_pairwise_scores",
    "check_tensor",
    "describe",
    "expect_failure",
]
