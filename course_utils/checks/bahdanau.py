"""Checkers for notebook 02: additive and bilinear scores, the context vector, the attention decoder step."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from course_utils.blocks import attention, scorers, seq2seq
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


def check_attention_step(step: Callable[..., Any], seed: int = 0, B: int = 3, S: int = 5) -> None:
    """Check a decoder step written like ``AttentionDecoder.step`` (notebook 02, common pitfalls).

    ``step(decoder, y_prev, state, enc_states, keys, mask)`` gets the decoder as its first
    argument (as a method gets ``self``) and must return ``(state, context, emb, weights)``:
    the new state ``s_i`` (B, R), the context ``c_i`` (B, Dk), the embedding of ``y_{i-1}``
    (B, E) and the weights ``w_i`` (B, S), with the scores computed from ``s_{i-1}``, before
    the GRU update. ``mask`` is (B, S) bool, True on real source tokens.

    Raises:
        CheckError: Naming the likely bug.
    """
    __tracebackhide__ = True  # noqa: F841
    E, R, Dk, A, V = 4, 6, 8, 5, 9
    with torch.random.fork_rng():  # the learner's global random state is left alone
        torch.manual_seed(seed)
        decoder = seq2seq.AttentionDecoder(V, E, R, Dk, scorers.AdditiveScore(R, Dk, A))
    g = torch.Generator().manual_seed(seed)
    y_prev = torch.randint(3, V, (B,), generator=g)  # (B,)
    state = torch.randn(B, R, generator=g)  # s_{i-1}
    lengths = torch.randint(1, S + 1, (B,), generator=g)
    lengths[0], lengths[-1] = S, max(1, S - 2)
    mask = torch.arange(S)[None, :] < lengths[:, None]  # (B, S), True on real tokens
    enc_states = torch.randn(B, S, Dk, generator=g) * mask[:, :, None]  # zeros on padding, as the encoder gives
    with torch.no_grad():
        keys = decoder.scorer.precompute(enc_states)  # (B, S, A)
        inputs = (y_prev, state, enc_states, keys, mask)
        copies = tuple(t.clone() for t in inputs)
        got = call(step, decoder, *inputs, name="step",
                   expected=f"a tuple (state (B, R) = {(B, R)}, context (B, Dk) = {(B, Dk)}, "
                            f"emb (B, E) = {(B, E)}, weights (B, S) = {(B, S)})",
                   error_hint="check the widths: the GRU cell takes [emb(y_{i-1}); c_i], of width E + Dk, and "
                              "c_i averages the encoder states (the values, width Dk), not the projected keys (width A)")
        if not all(torch.equal(a, b) for a, b in zip(inputs, copies)):
            raise CheckError("step changed an input in place: use out-of-place operations")
        if not isinstance(got, tuple) or len(got) != 4:
            raise CheckError(f"expected step to return a tuple (state, context, emb, weights), got {describe(got)}")
        new_state, context, emb, weights = got
        expected_state, expected_context, expected_emb, expected_weights = decoder.step(*inputs)
        scores = decoder.scorer.score(state, keys)  # (B, S), from s_{i-1}
        weight_suspects = {
            "the mask was not passed to attend: padded source positions get weight (attend's mask "
            "defaults to None, which means no padding)": scorers.attend(scores, enc_states, None)[1],
            "the scores came from the updated state s_i: this decoder (Bahdanau's) queries with s_{i-1}, "
            "before the GRU update": scorers.attend(decoder.scorer.score(expected_state, keys), enc_states, mask)[1],
        }
        check_close(weights, expected_weights, name="weights", shape="B S", dims={"B": B, "S": S},
                    suspects=weight_suspects, hint="w_i = masked softmax over j of score(s_{i-1}, h_j)")
        check_close(context, expected_context, name="context", shape="B Dk", dims={"B": B, "Dk": Dk},
                    hints={(B, A): "the context averages the projected keys W_k h_j: average the encoder states "
                                   "h_j (the values) instead"},
                    hint="c_i = sum over j of w_ij h_j")
        swapped = decoder.cell(torch.cat([expected_context, expected_emb], dim=-1), state)  # wrong order
        state_suspects = {
            "the step returned s_{i-1}: the GRU's new state was not returned, so the next step queries with "
            "the same state again": state,
        }
        if not torch.allclose(swapped, expected_state):
            state_suspects["the GRU input is [emb(y_{i-1}); c_i], in that order: swapping the two parts feeds "
                           "each input weight the wrong feature"] = swapped
        check_close(new_state, expected_state, name="state", shape="B R", dims={"B": B, "R": R},
                    suspects=state_suspects, hint="s_i = GRU([emb(y_{i-1}); c_i], s_{i-1})")
        check_close(emb, expected_emb, name="emb", shape="B E", dims={"B": B, "E": E},
                    hint="the embedding of the previous output token y_prev")
    passed("attention decoder step")
