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

from course_utils import attention, efficiency, masks, multihead, positional, seq2seq, training, transformer
from course_utils.errors import CheckError


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
            raise CheckError(f"{name}: right shape, wrong values: {mistake}")
    diff = (got - expected).abs().nan_to_num(float("inf"))
    index = tuple(int(i) for i in torch.unravel_index(diff.argmax(), diff.shape))
    raise CheckError(
        f"{name}: right shape, wrong values: at index {index} expected "
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


# ---------------------------------------------------------------------------
# Exercise checkers, notebook 01
# ---------------------------------------------------------------------------


def check_final_states(fn: Callable[[torch.Tensor, torch.Tensor], Any], seed: int = 0,
                       B: int = 4, S: int = 6, H: int = 3) -> None:
    """Check a learner's ``final_states(states, lengths) -> (B, H)`` (notebook 01, exercise 1).

    Raises:
        CheckError: Naming the likely bug.
    """
    __tracebackhide__ = True  # noqa: F841
    g = torch.Generator().manual_seed(seed)
    states = torch.randn(B, S, H, generator=g)
    lengths = torch.randint(1, S + 1, (B,), generator=g)
    lengths[0] = S  # a full-length sequence
    lengths[-1] = 1  # and a one-token one
    states_copy, lengths_copy = states.clone(), lengths.clone()
    got = call(fn, states, lengths, name="final_states", expected=f"a (B, H) = {(B, H)} tensor",
               error_hint="the last real token of row b is at position lengths[b] - 1 (positions start at 0)")
    if not (torch.equal(states, states_copy) and torch.equal(lengths, lengths_copy)):
        raise CheckError("final_states changed its inputs in place: index them, do not modify them")
    expected = seq2seq.final_states(states, lengths)
    rows = torch.arange(B)
    suspects = {
        "this is states[:, -1], a padding position for every sequence shorter than S: "
        "take position lengths[b] - 1 of each row b": states[:, -1],
        "this is position lengths[b] - 2: the last real token is at lengths[b] - 1": states[rows, (lengths - 2).clamp(min=0)],
        "this is the first position: a left-to-right RNN has read the whole sequence only at its last real token":
            states[:, 0],
        "this averages over positions (padding included): take the state at the last real token": states.mean(1),
    }
    hints = {
        (B, B, H): "indexing with [:, lengths - 1] takes those positions from *every* row; pair each row with "
                   "its own position: states[torch.arange(B), lengths - 1]",
        (B, S): "the H state dimension is gone: index the position, do not reduce over H",
    }
    check_close(got, expected, name="the final states", shape="B H", dims={"B": B, "H": H}, hints=hints,
                suspects=suspects, hint="row b must be states[b, lengths[b] - 1]")
    _passed("final_states")


def check_sequence_exact_match(fn: Callable[[torch.Tensor, torch.Tensor], Any], seed: int = 0,
                               B: int = 6, T: int = 7) -> None:
    """Check a learner's ``sequence_exact_match(tokens, targets) -> (B,) bool`` (notebook 01, exercise 2).

    Raises:
        CheckError: Naming the likely bug.
    """
    __tracebackhide__ = True  # noqa: F841
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, T + 1, (B,), generator=g)  # real target tokens, <eos> included
    lengths[0], lengths[1] = T, 2
    targets = torch.randint(3, 9, (B, T), generator=g)
    targets[torch.arange(B), lengths - 1] = 2  # <eos>
    targets[torch.arange(T)[None, :] >= lengths[:, None]] = 0  # padding
    tokens = targets.clone()
    tokens[targets == 0] = torch.randint(3, 9, (int((targets == 0).sum()),), generator=g)  # anything after <eos>
    wrong = torch.arange(B) % 3 == 2  # every third row gets one wrong symbol
    for b in wrong.nonzero().flatten().tolist():
        position = int(torch.randint(0, int(lengths[b]) - 1, (1,), generator=g))
        tokens[b, position] = 9
    tokens[1, lengths[1] - 1] = 3  # row 1: every symbol right, but no <eos> (the model did not stop)
    tokens_copy, targets_copy = tokens.clone(), targets.clone()
    got = call(fn, tokens, targets, name="sequence_exact_match", expected=f"a (B,) = ({B},) bool tensor")
    if not (torch.equal(tokens, tokens_copy) and torch.equal(targets, targets_copy)):
        raise CheckError("sequence_exact_match changed its inputs in place: compare them, do not modify them")
    expected = training.sequence_exact_match(tokens, targets)
    hints = {
        (B, T): "one value per token: reduce over the T positions with .all(dim=1) to get one per sequence",
        (T,): "you reduced over the batch (dim 0): reduce over positions, dim=1",
        (): "a single number for the whole batch: return one bool per sequence, (B,)",
    }
    got_t = check_tensor(got, name="the result", shape="B", dims={"B": B}, hints=hints)
    if got_t.dtype != torch.bool:
        mean = (tokens == targets).float().mean(dim=1)
        if got_t.is_floating_point() and torch.allclose(got_t, mean):
            raise CheckError("this is the fraction of right tokens per sequence; exact match asks whether *all* "
                             "real tokens are right: a bool per sequence")
        raise CheckError(f"expected a bool tensor (True = the whole sequence is right), got dtype {got_t.dtype}")
    suspects = {
        "padding positions were compared too: after <eos> a model may write anything; "
        "compare only where targets != pad": (tokens == targets).all(dim=1),
        "any() accepts a sequence with a single right token; every real token must match: all()":
            ((tokens == targets) & (targets != 0)).any(dim=1),
        "the <eos> position was skipped: a prediction that does not stop in the right place is wrong":
            ((tokens == targets) | (targets == 0) | (targets == 2)).all(dim=1),
    }
    check_close(got_t.float(), expected.float(), name="the result", shape="B", dims={"B": B},
                suspects={k: v.float() for k, v in suspects.items()},
                hint="row b is True exactly when tokens[b, t] == targets[b, t] at every t where targets[b, t] != 0")
    _passed("sequence_exact_match")


# ---------------------------------------------------------------------------
# Exercise checkers, notebook 02
# ---------------------------------------------------------------------------


def check_additive_scores(fn: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], Any], seed: int = 0,
                          B: int = 3, S: int = 5, A: int = 4) -> None:
    """Check a learner's ``additive_scores(q_proj, k_proj, v) -> (B, S)`` (notebook 02, exercise 1).

    With ``B == S`` a query that is not broadcast over the source positions
    runs without error and gives wrong numbers; the check recognises that too.

    Raises:
        CheckError: Naming the likely bug.
    """
    __tracebackhide__ = True  # noqa: F841
    g = torch.Generator().manual_seed(seed)
    q_proj = torch.randn(B, A, generator=g)
    k_proj = torch.randn(B, S, A, generator=g)
    v = torch.randn(A, generator=g)
    inputs = (q_proj, k_proj, v)
    copies = tuple(t.clone() for t in inputs)
    got = call(fn, *inputs, name="additive_scores", expected=f"scores of shape (B, S) = {(B, S)}",
               error_hint="to add the query to every source position, give it a size-1 source axis: "
                          "q_proj[:, None, :] has shape (B, 1, A) and broadcasts against k_proj (B, S, A)")
    if not all(torch.equal(a, b) for a, b in zip(inputs, copies)):
        raise CheckError("additive_scores changed an input in place: use out-of-place operations")
    expected = seq2seq.additive_scores(q_proj, k_proj, v)
    suspects = {
        "the tanh is missing: without it the score is linear, v^T W_q s + v^T W_k h_j, and the query term is "
        "the same for every position, so it cannot change which source position wins":
            (q_proj[:, None, :] + k_proj) @ v,
        "tanh was applied after v: it goes on the hidden layer, v^T tanh(q + k_j)": torch.tanh((q_proj[:, None, :] + k_proj) @ v),
        "the hidden layer was summed instead of weighted by v: multiply by v": torch.tanh(q_proj[:, None, :] + k_proj).sum(-1),
        "these are weights, not scores: the softmax comes later, in attend": torch.softmax(expected, dim=-1),
    }
    if B == S:
        suspects["the query was not broadcast over the source positions: q_proj + k_proj adds query b to "
                 "position b of every sequence; use q_proj[:, None, :]"] = torch.tanh(q_proj[None, :, :] + k_proj) @ v
    hints = {
        (B, S, A): "the A dimension is still there: take the dot product with v, (B, S, A) @ (A,) -> (B, S)",
        (B, S, 1): "drop the trailing size-1 axis: (B, S, 1) -> (B, S)",
    }
    check_close(got, expected, name="scores", shape="B S", dims={"B": B, "S": S}, hints=hints, suspects=suspects,
                hint="scores[b, j] = v · tanh(q_proj[b] + k_proj[b, j])")
    _passed("additive_scores")


def check_attend(fn: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], Any], seed: int = 0,
                 B: int = 3, S: int = 5, Dv: int = 4) -> None:
    """Check a learner's ``attend(scores, values, mask) -> (context, weights)`` (notebook 02, exercise 2).

    ``mask`` is (B, S) bool, True on real source tokens.

    Raises:
        CheckError: Naming the likely bug.
    """
    __tracebackhide__ = True  # noqa: F841
    g = torch.Generator().manual_seed(seed)
    scores = 2 * torch.randn(B, S, generator=g)
    values = torch.randn(B, S, Dv, generator=g)
    lengths = torch.randint(1, S + 1, (B,), generator=g)
    lengths[0], lengths[-1] = S, max(1, S - 2)
    mask = torch.arange(S)[None, :] < lengths[:, None]  # (B, S)
    inputs = (scores, values, mask)
    copies = tuple(t.clone() for t in inputs)
    got = call(fn, *inputs, name="attend", expected=f"a tuple (context (B, Dv) = {(B, Dv)}, weights (B, S) = {(B, S)})")
    if not all(torch.equal(a, b) for a, b in zip(inputs, copies)):
        raise CheckError("attend changed an input in place (e.g. masked_fill_): use out-of-place operations")
    if not isinstance(got, tuple) or len(got) != 2:
        raise CheckError(f"expected attend to return a tuple (context, weights), got {describe(got)}")
    context, weights = got
    if (isinstance(context, torch.Tensor) and isinstance(weights, torch.Tensor)
            and tuple(context.shape) == (B, S) and tuple(weights.shape) == (B, Dv)):
        raise CheckError("context and weights came back in the wrong order: return (context, weights)")
    expected_context, expected_weights = seq2seq.attend(scores, values, mask)
    weight_suspects = {
        "the softmax ran over the batch (dim=0): it must run over the source positions, dim=-1":
            attention.masked_softmax(scores.masked_fill(~mask, float("-inf")).T).T.nan_to_num(0.0),
        "padding was not masked: padded source positions get weight; fill their scores with -inf before the softmax":
            torch.softmax(scores, dim=-1),
        "the mask is inverted: True marks real tokens that may be attended to": attention.masked_softmax(scores, ~mask),
    }
    check_close(weights, expected_weights, name="weights", shape="B S", dims={"B": B, "S": S},
                suspects=weight_suspects, hint="a softmax over the real (mask True) source positions of each row")
    context_suspects = {
        "the context sums the values without the weights": values.sum(1),
        "the context averages the values uniformly: weight them by the attention weights": values.mean(1),
    }
    check_close(context, expected_context, name="context", shape="B Dv", dims={"B": B, "Dv": Dv},
                suspects=context_suspects,
                hints={(B, S, Dv): "weighted values not yet summed over the source positions: .sum(dim=1)",
                       (B, 1, Dv): "drop the size-1 axis: (B, 1, Dv) -> (B, Dv)"},
                hint="context[b] = sum over j of weights[b, j] * values[b, j]")
    _passed("attend")


def check_bilinear_scores(fn: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], Any], seed: int = 0,
                          B: int = 2, S: int = 5, Dq: int = 3, Dk: int = 4) -> None:
    """Check a learner's ``bilinear_scores(query, keys, W) -> (B, S)`` (notebook 02, exercise 3).

    Raises:
        CheckError: Naming the likely bug.
    """
    __tracebackhide__ = True  # noqa: F841
    g = torch.Generator().manual_seed(seed)
    query = torch.randn(B, Dq, generator=g)
    keys = torch.randn(B, S, Dk, generator=g)
    W = torch.randn(Dq, Dk, generator=g)
    inputs = (query, keys, W)
    copies = tuple(t.clone() for t in inputs)
    got = call(fn, *inputs, name="bilinear_scores", expected=f"scores of shape (B, S) = {(B, S)}",
               error_hint="s^T W h_j: query (B, Dq) @ W (Dq, Dk) gives (B, Dk), which is then dotted with each key")
    if not all(torch.equal(a, b) for a, b in zip(inputs, copies)):
        raise CheckError("bilinear_scores changed an input in place: use out-of-place operations")
    expected = seq2seq.bilinear_scores(query, keys, W)
    suspects = {}
    if Dq == Dk:
        suspects["W is transposed: the score is s^T W h_j, so the query multiplies W from the left"] = (
            seq2seq.bilinear_scores(query, keys, W.T))
        suspects["W was left out: that is the dot-product score s^T h_j"] = (keys @ query[:, :, None])[:, :, 0]
    hints = {
        (B, S, 1): "drop the trailing size-1 axis: (B, S, 1) -> (B, S)",
        (B, S, Dk): "the products were not summed over Dk: finish the dot product with each key",
        (B, B, S): "every query was scored against every sequence's keys: keep batch element b's query with its own keys",
    }
    check_close(got, expected, name="scores", shape="B S", dims={"B": B, "S": S}, hints=hints, suspects=suspects,
                hint="scores[b, j] = query[b] @ W @ keys[b, j]")
    _passed("bilinear_scores")



# ---------------------------------------------------------------------------
# Exercise checkers, notebook 03
# ---------------------------------------------------------------------------


def _sdpa_suspects(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   mask: torch.Tensor | None) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Known mistakes in scaled dot-product attention: {message: (out, weights) that mistake gives}."""
    Dk, Dv, T, S = q.shape[-1], v.shape[-1], q.shape[-2], k.shape[-2]
    raw = q @ k.transpose(-2, -1)  # (..., T, S)
    full = torch.ones(T, S, dtype=torch.bool) if mask is None else mask

    def attend(weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return weights @ v, weights

    suspects = {
        "the scores were not scaled: divide q·k by sqrt(Dk) = sqrt(q.shape[-1])":
            attend(attention.masked_softmax(raw, mask)),
        f"the scores were divided by Dk = {Dk}, not by its square root: the standard deviation of q·k is sqrt(Dk)":
            attend(attention.masked_softmax(raw / Dk, mask)),
        f"the scores were scaled by sqrt(Dv) = sqrt({Dv}): the scale uses the key width Dk = q.shape[-1], the "
        "width the dot product sums over": attend(attention.masked_softmax(raw / Dv**0.5, mask)),
        f"the scores were scaled by sqrt(S) = sqrt({S}), the number of keys: the scale uses the key width "
        "Dk = q.shape[-1]": attend(attention.masked_softmax(raw / S**0.5, mask)),
        f"the scores were scaled by sqrt(T) = sqrt({T}), the number of queries: the scale uses the key width "
        "Dk = q.shape[-1]": attend(attention.masked_softmax(raw / T**0.5, mask)),
        "the scores were multiplied by sqrt(Dk) instead of divided": attend(attention.masked_softmax(raw * Dk**0.5, mask)),
        "the softmax ran over the queries (dim=-2): each query's weights must sum to 1 over the keys, dim=-1":
            attend(torch.softmax((raw / Dk**0.5).masked_fill(~full, float("-inf")), dim=-2).nan_to_num(0.0)),
        "each score went through a sigmoid (or exp) on its own: the weights must be a softmax, normalised over "
        "all keys of one query so that every row sums to 1":
            attend(torch.sigmoid(raw / Dk**0.5) * full),
        "the weights are exp(scores) without the division by their row sum: normalise over the keys":
            attend(torch.exp(raw / Dk**0.5) * full),
    }
    if mask is not None:
        suspects.update({
            "the mask was ignored: masked keys still get weight": attend(torch.softmax(raw / Dk**0.5, dim=-1)),
            "the mask is inverted: True = may attend, so fill the scores where ~mask with -inf":
                attend(attention.masked_softmax(raw / Dk**0.5, ~mask)),
            "masked scores were set to 0, which still gets weight exp(0): fill them with -inf":
                attend(torch.softmax((raw / Dk**0.5).masked_fill(~mask, 0.0), dim=-1)),
            "the weights were masked after the softmax, so rows no longer sum to 1: mask the scores before it":
                attend(torch.softmax(raw / Dk**0.5, dim=-1) * mask),
        })
    return suspects


def check_scaled_dot_product_attention(fn: Callable[..., Any], seed: int = 0, B: int = 2, H: int = 3, T: int = 4,
                                       S: int = 5, Dk: int = 6, Dv: int = 7) -> None:
    """Check a learner's ``scaled_dot_product_attention(q, k, v, mask=None, scale=None) -> (out, weights)``.

    Notebook 03, exercise 1. Inputs are (B, H, T, Dk), (B, H, S, Dk), (B, H, S, Dv)
    with all sizes different, so a transposed product or a scale by the wrong
    dimension cannot pass by accident. Four calls: no mask; a padding-and-causal
    mask; a mask with a fully masked row (zeros expected, not NaN); an explicit
    ``scale``.

    Raises:
        CheckError: Naming the likely bug.
    """
    __tracebackhide__ = True  # noqa: F841
    g = torch.Generator().manual_seed(seed)
    q = 1.5 * torch.randn(B, H, T, Dk, generator=g)
    k = 1.5 * torch.randn(B, H, S, Dk, generator=g)
    v = torch.randn(B, H, S, Dv, generator=g)
    dims = {"B": B, "H": H, "T": T, "S": S, "Dv": Dv}
    lengths = torch.full((B,), S)
    lengths[-1] = max(1, S - 2)
    mask = masks.padding_mask(lengths, S)[:, None] & masks.causal_mask(T, S)  # (B, 1, 1, S) & (T, S) -> (B, 1, T, S)
    mask[..., 0] = True  # every query may attend to key 0
    empty = mask.clone()
    empty[0, 0, 1] = False  # query 1 of sequence 0 may attend to nothing
    cases = [("without a mask", (q, k, v), None), ("with a mask", (q, k, v, mask), mask),
             ("with a query whose keys are all masked", (q, k, v, empty), empty)]
    expected_scale = 0.5
    cases.append((f"with scale={expected_scale}", (q, k, v, None, expected_scale), None))
    copies = (q.clone(), k.clone(), v.clone(), mask.clone())
    for label, args, case_mask in cases:
        got = call(fn, *args, name="scaled_dot_product_attention",
                   expected=f"a tuple (out (B, H, T, Dv) = {(B, H, T, Dv)}, weights (B, H, T, S) = {(B, H, T, S)})",
                   error_hint="q @ k.transpose(-2, -1) multiplies the last two dimensions; the mask must be bool "
                              "and broadcast to (..., T, S)")
        if not all(torch.equal(a, b) for a, b in zip((q, k, v, mask), copies)):
            raise CheckError("scaled_dot_product_attention changed an input in place (e.g. masked_fill_ with a "
                             "trailing underscore): use out-of-place operations")
        if not isinstance(got, tuple) or len(got) != 2:
            raise CheckError(f"{label}: expected a tuple (out, weights), got {describe(got)}: return out, weights")
        out, weights = got
        if (isinstance(out, torch.Tensor) and tuple(out.shape) == (B, H, T, S)
                and isinstance(weights, torch.Tensor) and tuple(weights.shape) == (B, H, T, Dv)):
            raise CheckError(f"{label}: out and weights came back in the wrong order: return (out, weights)")
        scale = args[4] if len(args) > 4 else None
        expected_out, expected_weights = attention.scaled_dot_product_attention(q, k, v, case_mask, scale)
        if (label.startswith("with a query") and isinstance(weights, torch.Tensor)
                and tuple(weights.shape) == (B, H, T, S) and torch.isnan(weights[0, :, 1]).any()):
            raise CheckError(
                f"{label}: that query's weights are NaN (a softmax over only -inf is 0/0). Give a query with no "
                "allowed key zero weights: e.g. the masked_softmax of notebook 00"
            )
        if scale is not None:
            suspects = {"the `scale` argument was ignored: use it when it is given, 1/sqrt(Dk) only when it is None":
                        attention.scaled_dot_product_attention(q, k, v, None)}
        else:
            suspects = _sdpa_suspects(q, k, v, case_mask)
        hints = {
            (B, H, S, T): "the weights are (..., S, T): did you compute k @ q^T? Queries index the rows: "
                          "q @ k.transpose(-2, -1)",
            (B, H, T, Dk): "this has the width of q: did you multiply q by the weights instead of the values?",
            (B, H, T): "one number per query: the weights keep one entry per key, (..., T, S)",
        }
        check_close(weights, expected_weights, name=f"weights ({label})", shape="B H T S", dims=dims, hints=hints,
                    suspects={m: w for m, (_, w) in suspects.items()},
                    hint="weights = softmax over the keys of (q @ k^T) * scale, with -inf where the mask is False")
        check_close(out, expected_out, name=f"out ({label})", shape="B H T Dv", dims=dims,
                    suspects={"out is the unweighted sum of the values: multiply by the weights": (
                        v.sum(-2, keepdim=True).expand(B, H, T, Dv)),
                        "out averages the values uniformly: weight them by the attention weights": (
                        v.mean(-2, keepdim=True).expand(B, H, T, Dv))},
                    hints={(B, H, S, Dv): "out has one row per key: it needs one per query, weights @ v",
                           (B, H, T, S): "that is the shape of the weights: out = weights @ v"},
                    hint="out = weights @ v, one weighted average of the values per query")
    _passed("scaled_dot_product_attention")


# The "spot the error" exercise of notebook 03: statements about a worked example
# (3 tokens, D = 4 features, Dk = Dv = 3), some right and some wrong.
WORKED_EXAMPLE_STATEMENTS: dict[int, str] = {
    1: "W_Q has shape 3 × 4: one row for each of the 3 query features.",
    2: "q_1 = x_1 W_Q is a vector of 3 numbers.",
    3: "The score of key j for query i is s_ij = q_i · k_j.",
    4: "The weight of key j for query i is w_ij = 1 / (1 + exp(-s_ij)), so every weight lies between 0 and 1.",
    5: "The scores are divided by √4 = 2, because each token has D = 4 features.",
    6: "The output for token i is z_i = Σ_j w_ij v_i.",
    7: "Each row of the 3 × 3 weight matrix sums to 1.",
    8: "Without a mask, the output z_1 depends on all three tokens.",
}
_STATEMENT_FEEDBACK: dict[int, str] = {
    1: "x_1 has 4 entries and q_1 has 3, so x_1 W_Q needs W_Q of shape 4 × 3 (D × Dk)",
    2: "a (4,) row times a 4 × 3 matrix is a (3,) vector",
    3: "one score per (query i, key j) pair",
    4: "a sigmoid treats each score alone; the weights of one query must be a softmax over all its keys, "
       "so that they sum to 1",
    5: "the scale is √Dk, the width of a key (3 here), not the number of features of a token",
    6: "z_i mixes the values of all tokens j: Σ_j w_ij v_j",
    7: "the softmax runs over the keys of each query, so each row sums to 1",
    8: "every weight of a softmax is positive, so every value contributes",
}
WORKED_EXAMPLE_WRONG = frozenset({1, 4, 5, 6})


def check_spot_the_error(answer: Any) -> None:
    """Check the set of wrong statement numbers of notebook 03's "spot the error" exercise.

    Raises:
        CheckError: Saying which statements were judged wrongly, and what to look at.
    """
    __tracebackhide__ = True  # noqa: F841
    if answer is None:
        raise CheckError("expected a set of statement numbers, e.g. {2, 3}, got None: assign the set to `spot_the_error`")
    if isinstance(answer, (int, str)) or not hasattr(answer, "__iter__"):
        raise CheckError(f"expected a set of statement numbers, e.g. {{2, 3}}, got {describe(answer)}")
    items = list(answer)
    numbers = set()
    for item in items:
        if isinstance(item, bool) or not isinstance(item, int) or item not in WORKED_EXAMPLE_STATEMENTS:
            raise CheckError(f"{item!r} is not a statement number: use the integers 1 to "
                             f"{len(WORKED_EXAMPLE_STATEMENTS)}")
        numbers.add(item)
    missed = sorted(WORKED_EXAMPLE_WRONG - numbers)
    flagged_right = sorted(numbers - WORKED_EXAMPLE_WRONG)
    if missed or flagged_right:
        lines = [f"statement {n} is wrong too; look again: it says \"{WORKED_EXAMPLE_STATEMENTS[n]}\"" for n in missed]
        lines += [f"statement {n} is right: {_STATEMENT_FEEDBACK[n]}" for n in flagged_right]
        raise CheckError(f"{len(numbers & WORKED_EXAMPLE_WRONG)} of the {len(WORKED_EXAMPLE_WRONG)} wrong statements "
                         "found\n  " + "\n  ".join(lines))
    _passed("spot the error")


def explain_worked_example() -> str:
    """What is right or wrong in each statement of the worked example, as markdown (for after the exercise)."""
    return "\n".join(
        f"{n}. {'**wrong**' if n in WORKED_EXAMPLE_WRONG else 'right'}: {_STATEMENT_FEEDBACK[n]}."
        for n in WORKED_EXAMPLE_STATEMENTS
    )


# ---------------------------------------------------------------------------
# Exercise checkers, notebook 04
# ---------------------------------------------------------------------------


def check_attention_entropy(fn: Callable[[torch.Tensor], Any], seed: int = 0, B: int = 2, T: int = 3,
                            S: int = 5) -> None:
    """Check a learner's ``attention_entropy(weights) -> (B, T)`` in nats (notebook 04, exercise 1).

    The weights include one-hot rows and zeros (masked keys), where 0 · log 0
    must count as 0.

    Raises:
        CheckError: Naming the likely bug.
    """
    __tracebackhide__ = True  # noqa: F841
    g = torch.Generator().manual_seed(seed)
    scores = 2 * torch.randn(B, T, S, generator=g)
    mask = masks.padding_mask(torch.tensor([S] + [max(1, S - 2)] * (B - 1)), S)  # (B, 1, S): some keys masked
    weights = attention.masked_softmax(scores, mask)  # (B, T, S), zeros on masked keys
    weights[0, 0] = torch.nn.functional.one_hot(torch.tensor(1), S).float()  # a one-hot row: entropy 0
    weights_copy = weights.clone()
    got = call(fn, weights, name="attention_entropy", expected=f"entropies of shape (B, T) = {(B, T)}")
    if not torch.equal(weights, weights_copy):
        raise CheckError("attention_entropy changed `weights` in place: use out-of-place operations")
    expected = attention.attention_entropy(weights)
    if isinstance(got, torch.Tensor) and tuple(got.shape) == (B, T) and torch.isnan(got).any():
        raise CheckError("some entropies are NaN: a weight of exactly 0 gives 0 * log(0) = 0 * (-inf) = NaN. "
                         "Count those terms as 0, e.g. log of weights.clamp(min=1e-30), or torch.special.xlogy")
    suspects = {
        "the minus sign is missing: entropy is -Σ_j w_ij log w_ij, which is >= 0": -expected,
        "this is in bits (log2): the course measures entropy in nats, with the natural log torch.log":
            expected / torch.log(torch.tensor(2.0)),
        "this is a mean over the keys: the entropy is the sum over j": expected / S,
    }
    hints = {
        (B, S): "you summed over the queries (dim=-2): the entropy of query i sums over its keys, dim=-1",
        (B, T, S): "the terms -w log w are not yet summed over the keys: .sum(dim=-1)",
        (): "a single number: return one entropy per query, (B, T)",
    }
    check_close(got, expected, name="entropies", shape="B T", dims={"B": B, "T": T}, hints=hints,
                suspects=suspects,
                hint="entropy[b, i] = -sum over j of weights[b, i, j] * log(weights[b, i, j]), with 0 log 0 = 0")
    _passed("attention_entropy")


def check_scaled_scores(fn: Callable[[torch.Tensor, torch.Tensor], Any], seed: int = 0, B: int = 2, H: int = 4,
                        T: int = 3, S: int = 5, Dh: int = 6) -> None:
    """Check a learner's ``scaled_scores(q, k) -> (B, H, T, S)`` (notebook 04, exercise 2).

    Raises:
        CheckError: Naming the likely bug, in particular a scale by the model
            width D = H · Dh instead of the per-head key width Dh.
    """
    __tracebackhide__ = True  # noqa: F841
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, T, Dh, generator=g)
    k = torch.randn(B, H, S, Dh, generator=g)
    copies = (q.clone(), k.clone())
    got = call(fn, q, k, name="scaled_scores", expected=f"scores of shape (B, H, T, S) = {(B, H, T, S)}")
    if not (torch.equal(q, copies[0]) and torch.equal(k, copies[1])):
        raise CheckError("scaled_scores changed q or k in place: use out-of-place operations")
    expected = attention.scaled_scores(q, k)
    raw = q @ k.transpose(-2, -1)
    D = H * Dh
    suspects = {
        "the scores were not scaled: divide by sqrt(Dh) = sqrt(q.shape[-1])": raw,
        f"the scores were scaled by the model width, sqrt(D) = sqrt(H · Dh) = sqrt({D}): each head's dot product "
        f"sums over Dh = {Dh} numbers, so its variance is Dh; use q.shape[-1]": raw / D**0.5,
        f"the scores were divided by Dh = {Dh}, not by its square root": raw / Dh,
        "the scores were multiplied by sqrt(Dh) instead of divided": raw * Dh**0.5,
        f"the scores were scaled by sqrt(H) = sqrt({H}), the number of heads: use the key width q.shape[-1]":
            raw / H**0.5,
        f"the scores were scaled by sqrt(T) = sqrt({T}), the number of queries: use the key width q.shape[-1]":
            raw / T**0.5,
    }
    hints = {
        (B, H, S, T): "did you compute k @ q^T? Queries index the rows: q @ k.transpose(-2, -1)",
        (B, H, T, Dh): "that is the shape of q: the dot product sums over Dh",
    }
    check_close(got, expected, name="scores", shape="B H T S", dims={"B": B, "H": H, "T": T, "S": S}, hints=hints,
                suspects=suspects, hint="scores = q @ k.transpose(-2, -1) / sqrt(Dh)")
    _passed("scaled_scores")



# ---------------------------------------------------------------------------
# Exercise checkers, notebook 05
# ---------------------------------------------------------------------------


def check_split_heads(fn: Callable[[torch.Tensor, int], Any], seed: int = 0, B: int = 2, T: int = 3, H: int = 4,
                      Dh: int = 5) -> None:
    """Check a learner's ``split_heads(x, num_heads) -> (B, H, T, Dh)`` (notebook 05, exercise 1).

    Raises:
        CheckError: Naming the likely bug, in particular a ``view`` straight to
            the head shape, which scrambles tokens across heads.
    """
    __tracebackhide__ = True  # noqa: F841
    g = torch.Generator().manual_seed(seed)
    D = H * Dh
    x = torch.randn(B, T, D, generator=g)
    x_copy = x.clone()
    got = call(fn, x, H, name="split_heads", expected=f"a (B, H, T, Dh) = {(B, H, T, Dh)} tensor",
               error_hint="x.view(B, T, H, Dh) needs D = H * Dh; then .transpose(1, 2)")
    if not torch.equal(x, x_copy):
        raise CheckError("split_heads changed x in place: view and transpose return new tensors")
    expected = multihead.split_heads(x, H)
    suspects = {
        "the view went straight to (B, H, T, Dh): that cuts x's memory into blocks of T * Dh numbers, so one "
        "'head' holds features of several tokens. Split the features of each token first, "
        "x.view(B, T, H, Dh), then .transpose(1, 2)": x.reshape(B, H, T, Dh),
        "head h takes every H-th feature (h, h + H, ...): split into contiguous blocks, view(B, T, H, Dh)":
            x.view(B, T, Dh, H).permute(0, 3, 1, 2),
    }
    hints = {
        (B * H, T, Dh): "keep B and H as two dimensions, (B, H, T, Dh); and a view straight to the head shape "
                        "mixes tokens: x.view(B, T, H, Dh).transpose(1, 2)",
        (B, T, H, Dh): "the heads are split but still after the tokens: add .transpose(1, 2) to get (B, H, T, Dh)",
        (T, B * H, Dh): "a view to (T, B * H, Dh) reinterprets memory and mixes batch elements and positions: "
                        "x.view(B, T, H, Dh).transpose(1, 2)",
    }
    check_close(got, expected, name="the heads", shape="B H T Dh", dims={"B": B, "H": H, "T": T, "Dh": Dh},
                hints=hints, suspects=suspects, hint="head h of token t must be x[b, t, h*Dh:(h+1)*Dh]")
    _passed("split_heads")


def check_merge_heads(fn: Callable[[torch.Tensor], Any], seed: int = 0, B: int = 2, H: int = 4, T: int = 3,
                      Dh: int = 5) -> None:
    """Check a learner's ``merge_heads(x) -> (B, T, H * Dh)`` (notebook 05, exercise 2).

    Raises:
        CheckError: Naming the likely bug, in particular a reshape without the transpose back.
    """
    __tracebackhide__ = True  # noqa: F841
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, H, T, Dh, generator=g)
    x_copy = x.clone()
    got = call(fn, x, name="merge_heads", expected=f"a (B, T, D) = {(B, T, H * Dh)} tensor",
               error_hint="after transpose(1, 2) the memory is not contiguous, so .view fails: use .reshape(B, T, D) "
                          "(or .contiguous().view(B, T, D))")
    if not torch.equal(x, x_copy):
        raise CheckError("merge_heads changed x in place: use out-of-place operations")
    expected = multihead.merge_heads(x)
    suspects = {
        "the heads were reshaped to (B, T, D) without transposing back first: that mixes tokens. "
        "x.transpose(1, 2).reshape(B, T, D)": x.reshape(B, T, H * Dh),
        "the features are interleaved (head index last): concatenate head blocks, x.transpose(1, 2).reshape(B, T, D)":
            x.permute(0, 2, 3, 1).reshape(B, T, H * Dh),
    }
    hints = {
        (B, T, H, Dh): "the heads are transposed back but not concatenated: .reshape(B, T, H * Dh)",
        (B * H, T, Dh): "merge means concatenating the H heads of each token: (B, T, H * Dh)",
    }
    check_close(got, expected, name="the merged heads", shape="B T D", dims={"B": B, "T": T, "D": H * Dh},
                hints=hints, suspects=suspects, hint="out[b, t, h*Dh:(h+1)*Dh] must be x[b, h, t]")
    _passed("merge_heads")


def _mha_variant(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, projections: tuple[Any, ...],
                 H: int, mask: torch.Tensor | None, *, bad_split: bool = False, bad_merge: bool = False,
                 scale_by_model_width: bool = False, no_out_proj: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Multi-head attention with one chosen mistake (for the checker's suspects)."""
    q_proj, k_proj, v_proj, out_proj = projections
    B, T, D = query.shape
    Dh = D // H

    def split(x: torch.Tensor) -> torch.Tensor:
        return x.reshape(B, H, x.shape[1], Dh) if bad_split else multihead.split_heads(x, H)

    q, k, v = split(q_proj(query)), split(k_proj(key)), split(v_proj(value))
    context, weights = attention.scaled_dot_product_attention(q, k, v, mask, D**-0.5 if scale_by_model_width else None)
    merged = context.reshape(B, T, D) if (bad_merge or bad_split) else multihead.merge_heads(context)
    return (merged if no_out_proj else out_proj(merged)), weights


def check_multi_head_attention(fn: Callable[..., Any], seed: int = 0, B: int = 2, T: int = 3, S: int = 4,
                               D: int = 12, H: int = 3) -> None:
    """Check a learner's ``multi_head_attention(query, key, value, q_proj, k_proj, v_proj, out_proj, num_heads, mask)``.

    Notebook 05, exercise 3. Two calls: self-attention without a mask, and
    cross-attention (S != T) with a padding mask of shape (B, 1, 1, S).

    Raises:
        CheckError: Naming the likely bug: the wrong split, a merge without
            the transpose, a scale by sqrt(D) instead of sqrt(Dh), a missing
            output projection, averaged weights.
    """
    __tracebackhide__ = True  # noqa: F841
    g = torch.Generator().manual_seed(seed)
    torch_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    projections = tuple(torch.nn.Linear(D, D) for _ in range(4))
    torch.random.set_rng_state(torch_state)
    x = torch.randn(B, T, D, generator=g)
    memory = torch.randn(B, S, D, generator=g)
    lengths = torch.full((B,), S)
    lengths[-1] = S - 1
    pad = masks.padding_mask(lengths, S)[:, None]  # (B, 1, 1, S)
    Dh = D // H
    for label, (query, key, value, mask) in [("self-attention", (x, x, x, None)),
                                             ("cross-attention with a padding mask", (x, memory, memory, pad))]:
        Tq, Sk = query.shape[1], key.shape[1]
        with torch.no_grad():
            got = call(fn, query, key, value, *projections, H, mask, name="multi_head_attention",
                       expected=f"a tuple (out (B, T, D) = {(B, Tq, D)}, weights (B, H, T, S) = {(B, H, Tq, Sk)})",
                       error_hint="split with .view(B, length, H, Dh).transpose(1, 2); key and value may be longer "
                                  "than query, so take their length from their own shape")
            expected_out, expected_weights = multihead.multi_head_attention(query, key, value, *projections, H, mask)
            variants = {
                "the heads were split with a view straight to (B, H, T, Dh), which scrambles tokens across heads: "
                "view(B, T, H, Dh).transpose(1, 2)": _mha_variant(query, key, value, projections, H, mask, bad_split=True),
                "the heads were merged with a reshape to (B, T, D) without transposing back: "
                "context.transpose(1, 2).reshape(B, T, D)": _mha_variant(query, key, value, projections, H, mask,
                                                                          bad_merge=True),
                f"the scores were scaled by sqrt(D) = sqrt({D}), the model width; each head's dot product sums over "
                f"Dh = {Dh} numbers: scale by sqrt(Dh)": _mha_variant(query, key, value, projections, H, mask,
                                                                      scale_by_model_width=True),
                "the output projection is missing: apply out_proj to the merged heads": _mha_variant(
                    query, key, value, projections, H, mask, no_out_proj=True),
                "the mask was ignored: padded keys get weight": _mha_variant(query, key, value, projections, H, None),
            }
        if not isinstance(got, tuple) or len(got) != 2:
            raise CheckError(f"{label}: expected a tuple (out, weights), got {describe(got)}")
        out, weights = got
        if isinstance(weights, torch.Tensor) and tuple(weights.shape) == (B, Tq, Sk):
            raise CheckError(f"{label}: the weights are averaged over the heads, (B, T, S); return one pattern per "
                             "head, (B, H, T, S) (nn.MultiheadAttention averages them unless average_attn_weights=False)")
        check_close(weights, expected_weights, name=f"weights ({label})", shape="B H T S",
                    dims={"B": B, "H": H, "T": Tq, "S": Sk}, suspects={m: w for m, (_, w) in variants.items()},
                    hints={(B, 1, Tq, Sk): "only one head: split the projections into H heads of width Dh = D // H"},
                    hint="each head's weights are softmax(q_h k_h^T / sqrt(Dh)) over the allowed keys")
        check_close(out, expected_out, name=f"out ({label})", shape="B T D", dims={"B": B, "T": Tq, "D": D},
                    suspects={m: o for m, (o, _) in variants.items()},
                    hints={(B, H, Tq, Dh): "the heads are not merged: transpose(1, 2).reshape(B, T, D), then out_proj"},
                    hint="out = out_proj(merge_heads(weights @ v))")
    _passed("multi_head_attention")



# ---------------------------------------------------------------------------
# Exercise checkers, notebook 06
# ---------------------------------------------------------------------------


def check_sinusoidal_positional_encoding(fn: Callable[[int, int], Any], T: int = 12, D: int = 8) -> None:
    """Check a learner's ``sinusoidal_positional_encoding(T, D) -> (T, D)`` (notebook 06, exercise 1).

    Raises:
        CheckError: Naming the likely bug (sin and cos swapped, one frequency
            per feature instead of per pair, the halves layout, positions from 1).
    """
    __tracebackhide__ = True  # noqa: F841
    got = call(fn, T, D, name="sinusoidal_positional_encoding", expected=f"a (T, D) = {(T, D)} float tensor")
    expected = positional.sinusoidal_positional_encoding(T, D)
    p = torch.arange(T, dtype=torch.float32)[:, None]  # (T, 1)
    w = positional.frequencies(D)  # (D/2,)
    per_feature = 10000.0 ** (-torch.arange(D, dtype=torch.float32) / D)  # (D,): a frequency per feature

    def interleave(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.stack([a, b], dim=-1).reshape(a.shape[0], -1)  # (T, D/2) x2 -> (T, D)

    suspects = {
        "sin and cos are swapped: even features (2i) take the sine, odd features (2i + 1) the cosine":
            interleave(torch.cos(p * w), torch.sin(p * w)),
        "each feature got its own frequency 10000^(-j/D); the two features of a pair (2i, 2i + 1) share "
        "w_i = 10000^(-2i/D)": torch.where(torch.arange(D) % 2 == 0, torch.sin(p * per_feature), torch.cos(p * per_feature)),
        "this is the 'halves' layout (all sines, then all cosines), used by some libraries; the paper, and this "
        "course, interleave them: PE[:, 0::2] = sin, PE[:, 1::2] = cos": torch.cat([torch.sin(p * w), torch.cos(p * w)], -1),
        "positions start at 1: the first token has position 0": interleave(torch.sin((p + 1) * w), torch.cos((p + 1) * w)),
        "the angle is p * 10000^(2i/D) (the exponent's sign is flipped): divide p by 10000^(2i/D)":
            interleave(torch.sin(p / w), torch.cos(p / w)),
    }
    hints = {(D, T): "rows are positions and columns features: (T, D)", (T, D // 2): "only D/2 columns: write the sines "
             "into the even columns and the cosines into the odd ones"}
    check_close(got, expected, name="the encoding", shape="T D", dims={"T": T, "D": D}, hints=hints, suspects=suspects,
                hint="PE[p, 2i] = sin(p / 10000^(2i/D)) and PE[p, 2i + 1] = cos(p / 10000^(2i/D))")
    _passed("sinusoidal_positional_encoding")


def check_apply_rotary(fn: Callable[[torch.Tensor, torch.Tensor | None], Any], seed: int = 0, B: int = 2, T: int = 5,
                       D: int = 8) -> None:
    """Check a learner's ``apply_rotary(x, positions=None)`` (notebook 06, exercise 2).

    Raises:
        CheckError: Naming the likely bug (rotation the wrong way, the halves
            pairing, one frequency per feature, ignored positions).
    """
    __tracebackhide__ = True  # noqa: F841
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T, D, generator=g)
    positions = torch.tensor([3, 0, 7, 1, 12][:T] + list(range(20, 20 + max(0, T - 5))))
    x_copy = x.clone()
    for label, args in [("default positions", (x, None)), ("given positions", (x, positions))]:
        got = call(fn, *args, name="apply_rotary", expected=f"a tensor shaped like x, {(B, T, D)}")
        if not torch.equal(x, x_copy):
            raise CheckError("apply_rotary changed x in place: build the output in a new tensor")
        pos = torch.arange(T) if args[1] is None else args[1]
        expected = positional.apply_rotary(x, args[1])
        angles = pos[:, None].float() * positional.frequencies(D)[None, :]  # (T, D/2)
        half = D // 2
        first, second = x[..., :half], x[..., half:]
        halves = torch.cat([first * angles.cos() - second * angles.sin(), first * angles.sin() + second * angles.cos()], -1)
        suspects = {
            "each pair is rotated the wrong way (by -p w_i): even' = even cos - odd sin, odd' = even sin + odd cos":
                positional.apply_rotary(x, -pos),
            "this pairs feature i with feature i + D/2 (the 'rotate half' layout of some libraries); this course "
            "rotates adjacent pairs (2i, 2i + 1), like the sinusoidal encoding": halves,
            "the positions were ignored: rotate token t by its own position": positional.apply_rotary(x, torch.zeros_like(pos)),
        }
        if args[1] is not None:
            suspects["the given positions were ignored: use 0 .. T - 1 only when positions is None"] = (
                positional.apply_rotary(x, None))
        check_close(got, expected, name=f"the rotated x ({label})", shape="B T D", dims={"B": B, "T": T, "D": D},
                    suspects=suspects, hint="pair (2i, 2i + 1) of token t is rotated by the angle positions[t] * w_i, "
                                            "w_i = 10000^(-2i/D)")
    _passed("apply_rotary")



# ---------------------------------------------------------------------------
# Exercise checkers, notebook 07
# ---------------------------------------------------------------------------


def check_layer_norm(fn: Callable[..., Any], seed: int = 0, B: int = 2, T: int = 3, D: int = 6) -> None:
    """Check a learner's ``layer_norm(x, weight, bias, eps=1e-5) -> (B, T, D)`` (notebook 07, exercise 1).

    One token has a tiny variance (1e-6), so where eps goes matters.

    Raises:
        CheckError: Naming the likely bug.
    """
    __tracebackhide__ = True  # noqa: F841
    g = torch.Generator().manual_seed(seed)
    x = 3.0 + 2.0 * torch.randn(B, T, D, generator=g)
    x[0, 0] = 1e-3 * torch.randn(D, generator=g)  # a token with variance ~1e-6 (centred: no cancellation)
    weight = 1.0 + 0.5 * torch.randn(D, generator=g)
    bias = 0.5 * torch.randn(D, generator=g)
    inputs = (x, weight, bias)
    copies = tuple(t.clone() for t in inputs)
    got = call(fn, x, weight, bias, 1e-5, name="layer_norm", expected=f"a (B, T, D) = {(B, T, D)} tensor")
    if not all(torch.equal(a, b) for a, b in zip(inputs, copies)):
        raise CheckError("layer_norm changed an input in place: use out-of-place operations")
    expected = transformer.layer_norm(x, weight, bias, 1e-5)
    mean = x.mean(-1, keepdim=True)
    var = x.var(-1, keepdim=True, unbiased=False)
    normalised = (x - mean) / torch.sqrt(var + 1e-5)
    suspects = {
        "the variance was divided by D - 1 (torch.var's default, unbiased=True): LayerNorm divides by D, "
        "use x.var(-1, keepdim=True, unbiased=False) or the mean of squared deviations":
            (x - mean) / torch.sqrt(x.var(-1, keepdim=True) + 1e-5) * weight + bias,
        "eps was added to the standard deviation: it goes inside the square root, sqrt(var + eps)":
            (x - mean) / (torch.sqrt(var) + 1e-5) * weight + bias,
        "the statistics were taken over the tokens (dim=-2): LayerNorm normalises each token over its D "
        "features, dim=-1": (x - x.mean(-2, keepdim=True)) / torch.sqrt(x.var(-2, keepdim=True, unbiased=False) + 1e-5)
        * weight + bias,
        "weight (gamma) and bias (beta) are missing: scale by weight and add bias after normalising": normalised,
        "weight and bias are swapped: normalised * weight + bias": normalised * bias + weight,
        "the weight (gamma) is missing: multiply the normalised input by weight before adding bias": normalised + bias,
    }
    check_close(got, expected, name="the normalised tokens", shape="B T D", dims={"B": B, "T": T, "D": D},
                suspects=suspects, hint="(x - mean) / sqrt(variance + eps) * weight + bias, statistics over the last "
                                        "dimension, variance divided by D")
    _passed("layer_norm")


def check_residual(fn: Callable[..., Any], seed: int = 0, B: int = 2, T: int = 3, D: int = 4) -> None:
    """Check a learner's ``residual(x, sublayer, norm, norm_first)`` for both placements (notebook 07, exercise 2).

    Raises:
        CheckError: Naming the likely bug (pre- and post-LN swapped, the
            residual missing or concatenated, the residual path normalised).
    """
    __tracebackhide__ = True  # noqa: F841
    g = torch.Generator().manual_seed(seed)
    x = 2.0 + torch.randn(B, T, D, generator=g)
    W = torch.randn(D, D, generator=g)
    norm = transformer.LayerNorm(D)
    with torch.no_grad():
        norm.weight.copy_(1.0 + 0.5 * torch.randn(D, generator=g))
        norm.bias.copy_(0.5 * torch.randn(D, generator=g))

    def sublayer(h: torch.Tensor) -> torch.Tensor:
        return torch.tanh(h @ W)

    x_copy = x.clone()
    for norm_first in (False, True):
        label = "pre-LN, norm_first=True" if norm_first else "post-LN, norm_first=False"
        with torch.no_grad():
            got = call(fn, x, sublayer, norm, norm_first, name="residual", expected=f"a (B, T, D) = {(B, T, D)} tensor",
                       error_hint="a residual connection adds x and sublayer(...), both (B, T, D); concatenating "
                                  "them doubles the width, which the norm cannot take")
            if not torch.equal(x, x_copy):
                raise CheckError("residual changed x in place (e.g. x += ...): use x + ... instead")
            expected = transformer.residual(x, sublayer, norm, norm_first)
            other = transformer.residual(x, sublayer, norm, not norm_first)
            suspects = {
                f"this is {'post' if norm_first else 'pre'}-LN: with norm_first={norm_first} the block should compute "
                + ("x + sublayer(norm(x))" if norm_first else "norm(x + sublayer(x))"): other,
                "the residual connection is missing: add x": (sublayer(norm(x)) if norm_first else norm(sublayer(x))),
                "the residual path was normalised too: x itself is added unchanged, norm only feeds the sublayer":
                    norm(x) + sublayer(norm(x)),
                "the norm was applied to the sublayer's output: pre-LN normalises the sublayer's input":
                    x + norm(sublayer(x)),
            }
        check_close(got, expected, name=f"the output ({label})", shape="B T D", dims={"B": B, "T": T, "D": D},
                    suspects=suspects,
                    hints={(B, T, 2 * D): "twice as wide: residual connections add (x + sublayer), they do not "
                                          "concatenate"},
                    hint="pre-LN: x + sublayer(norm(x)); post-LN: norm(x + sublayer(x))")
    _passed("residual")



# ---------------------------------------------------------------------------
# Exercise checker, notebook 08
# ---------------------------------------------------------------------------


def _fold(update: Callable[..., Any], blocks: list[tuple[torch.Tensor, torch.Tensor]], T: int,
          Dv: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    m, l, acc = torch.full((T, 1), float("-inf")), torch.zeros(T, 1), torch.zeros(T, Dv)
    for scores, v in blocks:
        m, l, acc = update(m, l, acc, scores, v)
    return m, l, acc


def check_online_softmax_update(fn: Callable[..., Any], seed: int = 0, T: int = 3, Dv: int = 4,
                                block_sizes: tuple[int, ...] = (2, 3, 2)) -> None:
    """Check a learner's ``online_softmax_update(m, l, acc, scores, v) -> (m, l, acc)`` (notebook 08, exercise 1).

    Folds several blocks of keys (the second raises the running maximum, the
    third does not), then compares the final ``acc / l`` with softmax over all
    keys, and every intermediate state with the reference.

    Raises:
        CheckError: Naming the likely bug.
    """
    __tracebackhide__ = True  # noqa: F841
    g = torch.Generator().manual_seed(seed)
    offsets = [0.0, 4.0, -3.0] + [0.0] * max(0, len(block_sizes) - 3)
    blocks = [(2.0 * torch.randn(T, n, generator=g) + offsets[i], torch.randn(n, Dv, generator=g))
              for i, n in enumerate(block_sizes)]
    all_scores = torch.cat([s for s, _ in blocks], dim=-1)  # (T, S)
    all_values = torch.cat([v for _, v in blocks], dim=0)  # (S, Dv)
    expected_out = torch.softmax(all_scores, dim=-1) @ all_values  # (T, Dv)

    def no_acc_rescale(m, l, acc, scores, v):
        m_new = torch.maximum(m, scores.amax(-1, keepdim=True))
        p = torch.exp(scores - m_new)
        return m_new, l * torch.exp(m - m_new) + p.sum(-1, keepdim=True), acc + p @ v

    def no_rescale(m, l, acc, scores, v):
        m_new = torch.maximum(m, scores.amax(-1, keepdim=True))
        p = torch.exp(scores - m_new)
        return m_new, l + p.sum(-1, keepdim=True), acc + p @ v

    def inverted(m, l, acc, scores, v):
        m_new = torch.maximum(m, scores.amax(-1, keepdim=True))
        p = torch.exp(scores - m_new)
        c = torch.exp(m_new - m).nan_to_num(0.0, posinf=0.0)
        return m_new, l * c + p.sum(-1, keepdim=True), acc * c + p @ v

    suspects = {}
    for message, variant in [
        ("acc was not rescaled: when the maximum grows, multiply the old acc by exp(m_old - m_new), as for l",
         no_acc_rescale),
        ("the old sums were not rescaled: when a block raises the maximum, multiply l and acc by exp(m_old - m_new)",
         no_rescale),
        ("the correction is inverted: old sums are multiplied by exp(m_old - m_new) <= 1, not exp(m_new - m_old)",
         inverted),
    ]:
        _, l_v, acc_v = _fold(variant, blocks, T, Dv)
        suspects[message] = acc_v / l_v

    state = (torch.full((T, 1), float("-inf")), torch.zeros(T, 1), torch.zeros(T, Dv))
    states = []
    for i, (scores, v) in enumerate(blocks):
        inputs = (*state, scores, v)
        copies = tuple(t.clone() for t in inputs)
        got = call(fn, *inputs, name="online_softmax_update", expected="a tuple (m, l, acc)",
                   error_hint="m and l are (T, 1), acc is (T, Dv), scores (T, Bk), v (Bk, Dv)")
        if not all(torch.equal(a, b) for a, b in zip(inputs, copies)):
            raise CheckError("online_softmax_update changed an input in place: return new tensors")
        if not isinstance(got, tuple) or len(got) != 3 or not all(isinstance(t, torch.Tensor) for t in got):
            raise CheckError(f"expected a tuple of three tensors (m, l, acc), got {describe(got)}")
        if i == 0 and not torch.isfinite(got[2]).all():
            raise CheckError("after the first block acc has NaN/inf: exp(scores - m) with the old maximum m = -inf is "
                             "inf. Compute m_new first and use exp(scores - m_new); exp(m_old - m_new) = exp(-inf) = 0")
        states.append(got)
        state = got
    m, l, acc = state
    check_tensor(l, name="l after the last block", shape="T 1", dims={"T": T, "1": 1})
    check_tensor(acc, name="acc after the last block", shape="T Dv", dims={"T": T, "Dv": Dv})
    check_close(acc / l, expected_out, name="acc / l after the last block", shape="T Dv", dims={"T": T, "Dv": Dv},
                suspects=suspects, hint="acc / l must equal softmax(all scores) @ all values")
    ref = (torch.full((T, 1), float("-inf")), torch.zeros(T, 1), torch.zeros(T, Dv))
    for i, ((scores, v), got) in enumerate(zip(blocks, states)):
        ref = efficiency.online_softmax_update(*ref, scores, v)
        check_close(got[0], ref[0], name=f"m after block {i + 1}", shape="T 1", dims={"T": T, "1": 1},
                    hint="m is the running maximum: m_new = maximum(m, scores.amax(-1, keepdim=True)); a block with "
                         "smaller scores must not lower it")
        check_close(got[1], ref[1], name=f"l after block {i + 1}", shape="T 1", dims={"T": T, "1": 1},
                    hint="l_new = l * exp(m - m_new) + exp(scores - m_new).sum(-1, keepdim=True)")
        check_close(got[2], ref[2], name=f"acc after block {i + 1}", shape="T Dv", dims={"T": T, "Dv": Dv},
                    hint="acc_new = acc * exp(m - m_new) + exp(scores - m_new) @ v")
    _passed("online_softmax_update")


__all__ = [
    "CheckError",
    "call",
    "check_additive_scores",
    "check_apply_rotary",
    "check_attention_entropy",
    "check_attend",
    "check_bilinear_scores",
    "check_close",
    "check_final_states",
    "check_sequence_exact_match",
    "check_sinusoidal_positional_encoding",
    "check_masked_softmax",
    "check_merge_heads",
    "check_multi_head_attention",
    "check_online_softmax_update",
    "check_layer_norm",
    "check_padding_mask",
    "check_pairwise_scores",
    "check_residual",
    "check_scaled_dot_product_attention",
    "check_scaled_scores",
    "check_spot_the_error",
    "check_split_heads",
    "check_tensor",
    "describe",
    "expect_failure",
    "explain_worked_example",
]
