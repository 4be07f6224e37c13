"""Checkers for notebook 00: pairwise scores, a padding mask for any number of axes, a masked softmax."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from course_utils.blocks import attention, masks
from course_utils.checks.core import (call, check_close, check_gradients, check_tensor, passed, reference_guard,
                                     shape_cases, sweep)
from course_utils.checks.inspection import has_python_loop, torch_calls
from course_utils.core.errors import CheckError
from course_utils.checks.flow import exercise_check


@exercise_check
def check_padding_mask_for(fn: Callable[[torch.Tensor, torch.Tensor], Any], seed: int = 0, B: int = 2, H: int = 4,
                           T: int = 3, S: int = 5) -> None:
    """Check a learner's ``padding_mask_for(lengths, scores)`` (notebook 00, exercise 1).

    The mask must be bool, True exactly at the real keys j < lengths[b], with
    the shape (B, 1, S) for (B, T, S) scores and (B, 1, 1, S) for (B, H, T, S)
    scores: one size-1 axis for each axis between B and S. Tried with scores
    of both ranks (and five axes), at the sizes asked for, at B = 1, S = 1, at
    B = H (where a (B, 1, S) mask broadcasts against heads without an error,
    pairing head b with sequence b's lengths) and at sizes that all differ;
    the lengths include 0, 1 and S.

    Raises:
        CheckError: Naming the likely bug.
    """
    __tracebackhide__ = True  # noqa: F841
    cases = shape_cases({"B": B, "H": H, "T": T, "S": S}, ones=("B", "S"), distinct={"B": 2, "H": 4, "T": 3, "S": 5})
    cases.insert(1, (f"B = H = {B + 1}", {"B": B + 1, "H": B + 1, "T": T, "S": S},
                     "with as many heads as sequences a (B, 1, S) mask broadcasts against (B, H, T, S) scores "
                     "without an error, and pairs head b with the lengths of sequence b"))
    with reference_guard(fn, masks.padding_mask_for, masks.padding_mask):
        sweep(lambda B, H, T, S: _padding_mask_for_once(fn, seed, B, H, T, S), cases)
    passed("padding_mask_for")


def _padding_mask_for_once(fn: Callable[[torch.Tensor, torch.Tensor], Any], seed: int,
                           B: int, H: int, T: int, S: int) -> None:
    __tracebackhide__ = True  # noqa: F841
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, S + 1, (B,), generator=g)
    lengths[0] = S  # one full-length sequence
    lengths[-1] = 1  # and a very short one
    if B > 2:
        lengths[1] = 0  # and an empty one
    positions = torch.arange(S)
    real = positions[None, :] < lengths[:, None]  # (B, S)
    for shape in ((B, T, S), (B, H, T, S), (B, H, 2, T, S)):
        scores = torch.randn(shape, generator=g)
        lengths_copy, scores_copy = lengths.clone(), scores.clone()
        letters = {3: "B T S", 4: "B H T S", 5: "B H 2 T S"}[len(shape)]
        expected_shape = (B,) + (1,) * (len(shape) - 2) + (S,)
        got = call(fn, lengths, scores, name="padding_mask_for",
                   expected=f"a bool mask of shape {expected_shape} for scores of shape ({', '.join(letters.split())})"
                            f" = {shape}",
                   error_hint="the mask's shape depends on how many axes the scores have: read it from "
                              "`scores.dim()` or `scores.shape`, never assume three")
        if not (torch.equal(lengths, lengths_copy) and torch.equal(scores, scores_copy)):
            raise CheckError("padding_mask_for changed `lengths` or `scores` in place: build a new tensor instead")
        middle = len(shape) - 2
        hints = {
            (B, S): "the axes between B and S are missing: the mask needs a size-1 axis for each of them, so that it "
                    "broadcasts over the queries (and the heads)",
            (B, 1, S): f"a (B, 1, S) mask fits (B, T, S) scores, but these scores have {len(shape)} axes: aligned from "
                       "the right, its B meets the heads, not the sequences. Give it one size-1 axis for each axis "
                       "between B and S",
            (B, S, 1): "the size-1 axis is in the wrong place: the keys, S, must stay last, where the scores have them",
            (S, B): "rows and columns are swapped: the first axis must be the sequences (B) and the last the keys (S)",
            tuple(shape): "the mask has the full shape of the scores: keep a size-1 axis wherever the scores have "
                          "queries or heads, so the same mask is shared by all of them (broadcasting repeats it)",
        }
        dims = {"B": B, "S": S, "1": 1}
        got_t = check_tensor(got, name="the mask", shape=" ".join(["B"] + ["1"] * middle + ["S"]), dims=dims,
                             hints={k: v for k, v in hints.items() if k != expected_shape})
        if got_t.dtype != torch.bool:
            raise CheckError(f"expected a bool mask, got dtype {got_t.dtype}: a comparison such as `<` already gives "
                             "bool, and masked_fill and torch.where need bool")
        expected = real.view(expected_shape)
        suspects = {
            "True marks the padding here; in this course True = may attend (a real token)": ~expected,
            "off by one: key j is real when j < length, not j <= length":
                (positions[None, :] <= lengths[:, None]).view(expected_shape),
            "off by one: key j is real when j < length, not j < length - 1":
                (positions[None, :] < lengths[:, None] - 1).view(expected_shape),
        }
        check_close(got_t.float(), expected.float(), name="the mask", shape=" ".join(["B"] + ["1"] * middle + ["S"]),
                    dims=dims, suspects={k: v.float() for k, v in suspects.items()},
                    hint="key j of sequence b is real exactly when j < lengths[b], the same for every query and head")


@exercise_check
def check_pairwise_scores(fn: Callable[[torch.Tensor, torch.Tensor], Any], seed: int = 0,
                          B: int = 2, T: int = 4, S: int = 6, D: int = 3) -> None:
    """Check a learner's ``pairwise_scores(q, k) -> (..., T, S)`` (notebook 00 shows it failing a version written with ``.T``).

    Tried on (B, T, D) and (B, S, D) inputs, then on (B, H, T, D) and
    (B, H, S, D) inputs with a head axis, forward and backward; at the sizes
    asked for, then at B = 1, at H = 1 and at sizes that all differ.
    The exercise asks for ``@`` and no loops: a function that never calls ``@``
    (nor ``torch.matmul``, ``bmm``), such as a broadcast product summed over the
    features, is rejected, as is one with a Python loop, and ``einsum`` is ruled
    out by name.

    Raises:
        CheckError: Naming the likely bug.
    """
    __tracebackhide__ = True  # noqa: F841
    cases = shape_cases({"B": B, "T": T, "S": S, "D": D}, distinct={"B": 2, "T": 4, "S": 6, "D": 3})
    cases.insert(1 + (B != 1), ("H = 1 (one head)", {"B": B, "T": T, "S": S, "D": D, "H": 1},
                     "the head axis of size 1 disappeared: a `.squeeze()` without a dimension drops every size-1 axis"))
    with reference_guard(fn, attention.pairwise_scores, ruled_out={
            torch.einsum: "your function calls torch.einsum, which this exercise rules out: write it with `@`"}):
        sweep(lambda B, T, S, D, H=None: _pairwise_scores_once(fn, seed, B, T, S, D, H), cases)
        g = torch.Generator().manual_seed(seed)
        _, names = torch_calls(fn, torch.randn(B, T, D, generator=g), torch.randn(B, S, D, generator=g),
                               name="pairwise_scores", expected=f"scores of shape (B, T, S) = {(B, T, S)}")
        if names is not None and "einsum" not in names and not names & _MATRIX_PRODUCTS:
            raise CheckError("the scores are right, but your function computes them without `@` (or torch.matmul), "
                             "which the exercise asks for: a product of q and k broadcast against each other and "
                             "summed over the features gives the same numbers, but only after it has built a "
                             "(..., T, S, Dk) tensor, Dk times the size of the scores")
        if has_python_loop(fn):
            raise CheckError("the scores are right, but your function has a Python loop (a `for` or `while` loop, or "
                             "a comprehension), which the exercise rules out (\"no loops\"): one `@` computes the "
                             "scores of every batch element and head at once")
    passed("pairwise_scores")


_MATRIX_PRODUCTS = {"matmul", "__matmul__", "__rmatmul__", "__imatmul__", "bmm", "mm"}  # `@` and its spellings


def _pairwise_scores_once(fn: Callable[[torch.Tensor, torch.Tensor], Any], seed: int, B: int, T: int, S: int, D: int,
                          H: int | None) -> None:
    __tracebackhide__ = True  # noqa: F841
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, D, generator=g)
    k = torch.randn(B, S, D, generator=g)
    q_copy, k_copy = q.clone(), k.clone()
    got = call(fn, q, k, name="pairwise_scores", expected=f"scores of shape (B, T, S) = {(B, T, S)}",
               error_hint="the shapes do not line up for a batched product: `@` needs (..., T, Dk) @ (..., Dk, S). "
                          "Note that k.T on a 3-D tensor reverses all three axes")
    if not (torch.equal(q, q_copy) and torch.equal(k, k_copy)):
        raise CheckError("pairwise_scores changed q or k in place: use out-of-place operations")
    dims = {"B": B, "T": T, "S": S, "D": D}
    expected = attention.pairwise_scores(q, k)
    hints = {
        (B, S, T): "did you compute k @ q^T? Queries index the rows of the scores, keys the columns",
        (B, T, D): "that is the shape of q: the dot product must sum over the features, leaving one score per (query, key) pair",
        (B, T, S, D): "the products were not summed over the features: a dot product is one number per (query, key) pair",
        (T, S): "the batch dimension is gone: every batch element needs its own (T, S) scores",
    }
    suspects = {
        "only the first batch element is right: every batch element needs its scores (`@` treats the leading axes "
        "as batch axes)":
            expected[:1].expand_as(expected),
        "the scores are divided by √D: this exercise asks for the plain dot product (the scaling comes in notebook 04)":
            expected / D**0.5,
    }
    check_close(got, expected, name="scores", shape="B T S", dims=dims, hints=hints, suspects=suspects,
                hint="scores[b, i, j] must be the dot product of query i and key j of batch element b")
    check_gradients(fn, (q, k), attention.pairwise_scores, name="pairwise_scores", wrt={0: "q", 1: "k"},
                    what="the scores", seed=seed)
    # The same function must serve multi-head attention: (B, H, T, D) queries against (B, H, S, D) keys.
    H = H if H is not None else 3 if 3 not in (B, T, S, D) else 5
    q4 = torch.randn(B, H, T, D, generator=g)
    k4 = torch.randn(B, H, S, D, generator=g)
    got4 = call(fn, q4, k4, name="pairwise_scores",
                expected=f"scores of shape (B, H, T, S) = {(B, H, T, S)} for (B, H, T, D) and (B, H, S, D) inputs",
                error_hint="the function must work for any number of leading (batch) axes, e.g. (B, H, T, Dk) "
                           "with heads: swap only the last two axes of k, never hard-code three dimensions")
    dims4 = {**dims, "H": H}
    hints4 = {
        (D, S, H, B): "k.T reverses *all* axes of a 4-D tensor: only the last two axes of k may be swapped",
        (B, H, T, H): "the wrong axes of k were swapped: swap the last two (S and D), whatever the number of leading axes",
        (B, T, S): "the head axis is gone: the function must keep every leading axis of its inputs",
    }
    check_close(got4, attention.pairwise_scores(q4, k4), name="scores with a head axis", shape="B H T S",
                dims=dims4, hints=hints4,
                hint="for 4-D inputs scores[b, h, i, j] is the dot product of query i and key j of head h")
    check_gradients(fn, (q4, k4), attention.pairwise_scores, name="pairwise_scores", wrt={0: "q", 1: "k"},
                    what="the scores with a head axis", seed=seed)


@exercise_check
def check_masked_softmax(fn: Callable[[torch.Tensor, torch.Tensor], Any], seed: int = 0,
                         B: int = 3, T: int = 4, S: int = 5) -> None:
    """Check a learner's ``masked_softmax(scores, mask) -> weights`` (notebook 00, exercise 2).

    ``mask`` is bool, True = may attend, and broadcastable to the (B, T, S)
    scores (and last to (B, H, T, S) scores, with a (B, 1, 1, S) mask): tried as (B, 1, S) (with a sequence whose keys are all masked),
    (B, T, S) (with one query whose keys are all masked) and (T, S). A row with
    no allowed key must come back as zeros, not NaN. Then scores of about ±1e4
    (exp overflows without subtracting the row's maximum) and a backward pass;
    all at the sizes asked for, at B = 1, T = 1 and at sizes that all differ.
    Last, at the sizes asked for: ``mask=None`` (every key allowed, a plain
    softmax), and a NaN in the scores at an allowed key, which must come out as
    NaN: only the rows with no allowed key are repaired, so a NaN patched after
    the softmax (``nan_to_num``) is rejected.

    Raises:
        CheckError: Naming the likely bug.
    """
    __tracebackhide__ = True  # noqa: F841
    with reference_guard(fn, attention.masked_softmax):
        sweep(lambda B, T, S: _masked_softmax_once(fn, seed, B, T, S),
              shape_cases({"B": B, "T": T, "S": S}, ones=("B", "T"), distinct={"B": 3, "T": 4, "S": 5}))
        _masked_softmax_no_mask_and_nan(fn, seed, B, T, S)
        _masked_softmax_with_heads(fn, seed, B, T, S)
    passed("masked_softmax")


def _masked_softmax_with_heads(fn: Callable[[torch.Tensor, torch.Tensor], Any], seed: int,
                               B: int, T: int, S: int) -> None:
    """Scores with a head axis, (B, H, T, S), and the (B, 1, 1, S) padding mask: the notebook calls it so."""
    __tracebackhide__ = True  # noqa: F841
    g = torch.Generator().manual_seed(seed + 1)
    H = 2 if B != 2 else 3  # a head count unlike the batch size, so that a misaligned axis raises
    scores = 2 * torch.randn(B, H, T, S, generator=g)
    lengths = torch.tensor([S, 0][:B] + [max(1, S - 2)] * max(0, B - 2))  # full, fully masked, padded
    mask = masks.padding_mask(lengths, S)[:, None]  # (B, 1, 1, S)
    got = call(fn, scores, mask, name="masked_softmax", expected=f"weights of shape (B, H, T, S) = {(B, H, T, S)}",
               error_hint="scores may have a head axis, (B, H, T, S), as the end of the notebook and notebook 05 "
                          "use them: work along the last axis (dim=-1), and do not unpack the shape into three "
                          "letters")
    check_close(got, attention.masked_softmax(scores, mask), name="weights of scores with a head axis",
                shape="B H T S", dims={"B": B, "H": H, "T": T, "S": S},
                hint="with a head axis the weights are the same softmax over the allowed keys, in every head, and "
                     "zeros for a query with no allowed key")


def _masked_softmax_no_mask_and_nan(fn: Callable[[torch.Tensor, torch.Tensor], Any], seed: int,
                                    B: int, T: int, S: int) -> None:
    """``mask=None`` is a plain softmax; a NaN in the scores at an allowed key stays NaN (only empty rows are repaired)."""
    __tracebackhide__ = True  # noqa: F841
    g = torch.Generator().manual_seed(seed)
    dims = {"B": B, "T": T, "S": S}
    scores = 2 * torch.randn(B, T, S, generator=g)
    got = call(fn, scores, None, name="masked_softmax", expected=f"weights of shape (B, T, S) = {(B, T, S)}",
               error_hint="mask=None means that every key may be attended to: then the weights are a plain softmax "
                          "over the keys (the exercise's signature has mask=None as its default)")
    check_close(got, attention.masked_softmax(scores, None), name="weights with mask=None", shape="B T S", dims=dims,
                hint="with mask=None every key is allowed: each row is a plain softmax over the keys")

    lengths = torch.tensor([S, 0][:B] + [S] * max(0, B - 2))  # a full sequence, and one whose keys are all masked
    mask = masks.padding_mask(lengths, S)  # (B, 1, S)
    scores[0, 0, 0] = float("nan")  # at an allowed key of the first query: a bug upstream of the softmax
    got = call(fn, scores, mask, name="masked_softmax", expected=f"weights of shape (B, T, S) = {(B, T, S)}")
    expected = attention.masked_softmax(scores, mask)  # NaN in the first query's row only
    got = check_tensor(got, name="weights for scores with a NaN", shape="B T S", dims=dims, dtype=scores.dtype,
                       allow_nan=True)
    if not torch.isnan(got[0, 0]).any():
        raise CheckError("the scores had a NaN at a key that may be attended to, and it vanished: that row of your "
                         "weights has no NaN. Patching NaN after the softmax (nan_to_num, or torch.where on isnan) "
                         "also hides a NaN that came in with the scores, a bug further up that must stay visible. "
                         "Repair only the rows with no allowed key, and find them from the mask")
    first = torch.zeros(B, T, 1, dtype=torch.bool)
    first[0, 0] = True  # the row with the NaN
    check_close(got.masked_fill(first, 0.0), expected.masked_fill(first, 0.0), name="weights for scores with a NaN",
                shape="B T S", dims=dims, hint="only the row whose scores hold the NaN may change: every other row "
                                               "is a softmax over its allowed keys, or zeros when it has none")


def _masked_softmax_once(fn: Callable[[torch.Tensor, torch.Tensor], Any], seed: int, B: int, T: int, S: int) -> None:
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

    # Other mask shapes the text allows: (B, T, S) with one query that may attend to nothing, and (T, S).
    per_query = torch.rand(B, T, S, generator=g) < 0.6
    per_query[..., 0] = True  # every query may attend to key 0 ...
    per_query[0, T - 1] = False  # ... except the last query of sequence 0, which may attend to nothing
    for label, other in ((f"a (B, T, S) = {(B, T, S)} mask in which one query may attend to nothing", per_query),
                         (f"a (T, S) = {(T, S)} mask (the same for every sequence)", masks.causal_mask(T, S))):
        other_copy = other.clone()
        got = call(fn, scores, other, name="masked_softmax", expected=f"weights of shape (B, T, S) = {(B, T, S)}",
                   error_hint="the mask may have any shape that broadcasts to the scores, (B, 1, S), (B, T, S) or "
                              "(T, S): work with it as it comes, without indexing or reshaping its axes")
        if not torch.equal(other, other_copy):
            raise CheckError("masked_softmax changed `mask` in place: build new tensors instead")
        check_close(got, attention.masked_softmax(scores, other), name=f"weights with {label}", shape="B T S",
                    dims=dims, hint="each row must be a softmax over its own allowed keys and all zeros when it has "
                                    "none, whatever the shape of the mask (it broadcasts to the scores)")

    # Large scores: exp overflows float32 above about 88 unless the row's maximum is subtracted first.
    big = 1e4 * torch.randn(B, T, S, generator=g)
    got = call(fn, big, mask, name="masked_softmax", expected=f"weights of shape (B, T, S) = {(B, T, S)}")
    expected_big = attention.masked_softmax(big, mask)
    if (isinstance(got, torch.Tensor) and tuple(got.shape) == (B, T, S) and got.is_floating_point()
            and not torch.isfinite(got[lengths > 0]).all()):
        raise CheckError("the weights are NaN or inf for large scores (about ±1e4): exp overflows float32 above "
                         "about 88. Subtract each row's largest score before exp (torch.softmax does), which leaves "
                         "the weights unchanged")
    check_close(got, expected_big, name="weights for large scores (about ±1e4)", shape="B T S", dims=dims,
                hint="the weights must not depend on how large the scores are, only on their differences")

    check_gradients(fn, (scores, mask), attention.masked_softmax, name="masked_softmax", wrt={0: "scores"},
                    what="the weights", seed=seed,
                    not_finite=" (at a row whose keys are all masked?): the backward pass goes through that row too")
