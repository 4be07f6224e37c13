"""Checkers for notebook 02: additive and bilinear scores, the context vector."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from course_utils.blocks import attention, scorers
from course_utils.checks.core import call, check_close, describe, passed
from course_utils.core.errors import CheckError


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
    expected = scorers.additive_scores(q_proj, k_proj, v)
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
    passed("additive_scores")


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
    expected_context, expected_weights = scorers.attend(scores, values, mask)
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
    passed("attend")


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
    expected = scorers.bilinear_scores(query, keys, W)
    suspects = {}
    if Dq == Dk:
        suspects["W is transposed: the score is s^T W h_j, so the query multiplies W from the left"] = (
            scorers.bilinear_scores(query, keys, W.T))
        suspects["W was left out: that is the dot-product score s^T h_j"] = (keys @ query[:, :, None])[:, :, 0]
    hints = {
        (B, S, 1): "drop the trailing size-1 axis: (B, S, 1) -> (B, S)",
        (B, S, Dk): "the products were not summed over Dk: finish the dot product with each key",
        (B, B, S): "every query was scored against every sequence's keys: keep batch element b's query with its own keys",
    }
    check_close(got, expected, name="scores", shape="B S", dims={"B": B, "S": S}, hints=hints, suspects=suspects,
                hint="scores[b, j] = query[b] @ W @ keys[b, j]")
    passed("bilinear_scores")
