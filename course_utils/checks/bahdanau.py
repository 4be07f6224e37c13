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
    """Check a learner's ``additive_scores(q_proj, k_proj, v_a) -> (B, S)`` (notebook 02, exercise 1).

    With ``B == S`` a query that is not broadcast over the source positions
    runs without error and gives wrong numbers; the check recognises that too.
    The messages name the bug in words and never show the indexing or the
    operator that fixes it.

    Raises:
        CheckError: Naming the likely bug.
    """
    __tracebackhide__ = True  # noqa: F841
    g = torch.Generator().manual_seed(seed)
    q_proj = torch.randn(B, A, generator=g)
    k_proj = torch.randn(B, S, A, generator=g)
    v_a = torch.randn(A, generator=g)
    inputs = (q_proj, k_proj, v_a)
    copies = tuple(t.clone() for t in inputs)
    got = call(fn, *inputs, name="additive_scores", expected=f"scores of shape (B, S) = {(B, S)}",
               error_hint="q_proj (B, A) holds one projected query per sequence, and each one must meet every "
                          "source position of its own sequence in k_proj (B, S, A)")
    if not all(torch.equal(a, b) for a, b in zip(inputs, copies)):
        raise CheckError("additive_scores changed an input in place, so use out-of-place operations")
    expected = scorers.additive_scores(q_proj, k_proj, v_a)
    suspects = {
        "the tanh is missing. Without it the score is linear, v_a^T W_q s + v_a^T W_k h_j, and the query term "
        "is the same for every position, so it cannot change which source position wins":
            (q_proj[:, None, :] + k_proj) @ v_a,
        "tanh was applied after v_a, but it belongs to the hidden layer, v_a^T tanh(W_q s + W_k h_j + b)":
            torch.tanh((q_proj[:, None, :] + k_proj) @ v_a),
        "the hidden layer was summed over A instead of weighted by v_a": torch.tanh(q_proj[:, None, :] + k_proj).sum(-1),
        "these are weights, not scores (the softmax comes later, in attend)": torch.softmax(expected, dim=-1),
    }
    if B == S:
        suspects["the query was not broadcast over the source positions, so query b was added to source "
                 "position b of every sequence"] = torch.tanh(q_proj[None, :, :] + k_proj) @ v_a
    hints = {
        (B, S, A): "the A axis is still there, so the hidden layer was not reduced with v_a",
        (B, S, 1): "one size-1 axis too many at the end",
    }
    check_close(got, expected, name="scores", shape="B S", dims={"B": B, "S": S}, hints=hints, suspects=suspects,
                hint="work out one score by hand, for one sequence and one source position, and compare")
    passed("additive_scores")


def check_attend(fn: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], Any], seed: int = 0,
                 B: int = 3, S: int = 5, Dk: int = 4) -> None:
    """Check a learner's ``attend(scores, values, mask) -> (context, weights)`` (notebook 02, exercise 2).

    ``values`` is (B, S, Dk) (the encoder states) and ``mask`` (B, S) bool, True on real tokens.

    Raises:
        CheckError: Naming the likely bug.
    """
    __tracebackhide__ = True  # noqa: F841
    g = torch.Generator().manual_seed(seed)
    scores = 2 * torch.randn(B, S, generator=g)
    values = torch.randn(B, S, Dk, generator=g)
    lengths = torch.randint(1, S + 1, (B,), generator=g)
    lengths[0], lengths[-1] = S, max(1, S - 2)
    mask = torch.arange(S)[None, :] < lengths[:, None]  # (B, S)
    inputs = (scores, values, mask)
    copies = tuple(t.clone() for t in inputs)
    got = call(fn, *inputs, name="attend", expected=f"a tuple (context (B, Dk) = {(B, Dk)}, weights (B, S) = {(B, S)})")
    if not all(torch.equal(a, b) for a, b in zip(inputs, copies)):
        raise CheckError("attend changed an input in place (e.g. with masked_fill_), so use out-of-place operations")
    if not isinstance(got, tuple) or len(got) != 2:
        raise CheckError(f"expected attend to return a tuple (context, weights), got {describe(got)}")
    context, weights = got
    if (isinstance(context, torch.Tensor) and isinstance(weights, torch.Tensor)
            and tuple(context.shape) == (B, S) and tuple(weights.shape) == (B, Dk)):
        raise CheckError("context and weights came back in the wrong order; return (context, weights)")
    expected_context, expected_weights = scorers.attend(scores, values, mask)
    weight_suspects = {
        "the softmax ran over the batch instead of over the source positions of each row":
            attention.masked_softmax(scores.masked_fill(~mask, float("-inf")).T).T.nan_to_num(0.0),
        "padding was not masked, so padded source positions get weight": torch.softmax(scores, dim=-1),
        "the mask is inverted (True marks the real tokens, the ones that may be attended to)":
            attention.masked_softmax(scores, ~mask),
    }
    check_close(weights, expected_weights, name="weights", shape="B S", dims={"B": B, "S": S},
                suspects=weight_suspects, hint="each row should be a softmax over its real (mask True) source positions")
    context_suspects = {
        "the context sums the values without the weights": values.sum(1),
        "the context averages the values uniformly instead of weighting them by the attention weights": values.mean(1),
    }
    check_close(context, expected_context, name="context", shape="B Dk", dims={"B": B, "Dk": Dk},
                suspects=context_suspects,
                hints={(B, S, Dk): "the weighted values were not yet summed over the source positions (the S axis)",
                       (B, 1, Dk): "one size-1 axis too many in the middle"},
                hint="the context of a sequence is its values weighted by that sequence's attention weights, summed")
    passed("attend")


def check_bilinear_scores(fn: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], Any], seed: int = 0,
                          B: int = 2, S: int = 5, R: int = 3, Dk: int = 4) -> None:
    """Check a learner's ``bilinear_scores(query, keys, W) -> (B, S)`` (notebook 02, exercise 3).

    ``query`` is (B, R), ``keys`` (B, S, Dk) and ``W`` (R, Dk).

    Raises:
        CheckError: Naming the likely bug.
    """
    __tracebackhide__ = True  # noqa: F841
    g = torch.Generator().manual_seed(seed)
    query = torch.randn(B, R, generator=g)
    keys = torch.randn(B, S, Dk, generator=g)
    W = torch.randn(R, Dk, generator=g)
    inputs = (query, keys, W)
    copies = tuple(t.clone() for t in inputs)
    got = call(fn, *inputs, name="bilinear_scores", expected=f"scores of shape (B, S) = {(B, S)}",
               error_hint="the query is (B, R), W is (R, Dk) and the keys are (B, S, Dk); check which axes each "
                          "of your products contracts")
    if not all(torch.equal(a, b) for a, b in zip(inputs, copies)):
        raise CheckError("bilinear_scores changed an input in place, so use out-of-place operations")
    expected = scorers.bilinear_scores(query, keys, W)
    suspects = {}
    if R == Dk:
        suspects["W is transposed (in s^T W h_j the query meets the rows of W, the keys its columns)"] = (
            scorers.bilinear_scores(query, keys, W.T))
        suspects["W was left out, which gives the dot-product score s^T h_j"] = (keys @ query[:, :, None])[:, :, 0]
    hints = {
        (B, S, 1): "one size-1 axis too many at the end",
        (B, S, Dk): "the products were not summed over Dk, so the dot product with each key is unfinished",
        (B, B, S): "every query was scored against the keys of every sequence, not only against its own",
    }
    check_close(got, expected, name="scores", shape="B S", dims={"B": B, "S": S}, hints=hints, suspects=suspects,
                hint="work out one score s^T W h_j by hand, for one sequence and one source position, and compare")
    passed("bilinear_scores")


def check_attention_step(step: Callable[..., Any], seed: int = 0, B: int = 3, S: int = 5) -> None:
    """Check a decoder step written like ``AttentionDecoder.step`` (notebook 02, common pitfalls).

    ``step(decoder, y_prev, state, enc_states, projected_keys, mask)`` gets the decoder as its
    first argument (as a method gets ``self``) and must return ``(state, context, emb, weights)``:
    the new state ``s_i`` (B, R), the context ``c_i`` (B, Dk), the embedding of ``y_{i-1}``
    (B, embed_size) and the weights ``w_i`` (B, S), with the scores computed from ``s_{i-1}``,
    before the GRU update. ``mask`` is (B, S) bool, True on real source tokens.

    Raises:
        CheckError: Naming the likely bug.
    """
    __tracebackhide__ = True  # noqa: F841
    embed_size, R, Dk, A, V = 4, 6, 8, 5, 9
    with torch.random.fork_rng():  # the learner's global random state is left alone
        torch.manual_seed(seed)
        decoder = seq2seq.AttentionDecoder(V, embed_size, R, Dk, scorers.AdditiveScore(R, Dk, A))
    g = torch.Generator().manual_seed(seed)
    y_prev = torch.randint(3, V, (B,), generator=g)  # (B,)
    state = torch.randn(B, R, generator=g)  # s_{i-1}
    lengths = torch.randint(1, S + 1, (B,), generator=g)
    lengths[0], lengths[-1] = S, max(1, S - 2)
    mask = torch.arange(S)[None, :] < lengths[:, None]  # (B, S), True on real tokens
    enc_states = torch.randn(B, S, Dk, generator=g) * mask[:, :, None]  # zeros on padding, as the encoder gives
    with torch.no_grad():
        projected_keys = decoder.scorer.precompute(enc_states)  # (B, S, A)
        inputs = (y_prev, state, enc_states, projected_keys, mask)
        copies = tuple(t.clone() for t in inputs)
        got = call(step, decoder, *inputs, name="step",
                   expected=f"a tuple (state (B, R) = {(B, R)}, context (B, Dk) = {(B, Dk)}, "
                            f"emb (B, embed_size) = {(B, embed_size)}, weights (B, S) = {(B, S)})",
                   error_hint="check the widths. The GRU cell takes [emb(y_{i-1}); c_i], of width embed_size + Dk, "
                              "and c_i averages the encoder states (the values, width Dk), not the projected keys "
                              "(width A)")
        if not all(torch.equal(a, b) for a, b in zip(inputs, copies)):
            raise CheckError("step changed an input in place, so use out-of-place operations")
        if not isinstance(got, tuple) or len(got) != 4:
            raise CheckError(f"expected step to return a tuple (state, context, emb, weights), got {describe(got)}")
        new_state, context, emb, weights = got
        expected_state, expected_context, expected_emb, expected_weights = decoder.step(*inputs)
        scores = decoder.scorer.score(state, projected_keys)  # (B, S), from s_{i-1}
        # Luong's order tried in this decoder: update the GRU first (it has no c_i yet, so it gets zeros in
        # its place), then query with the updated state.
        updated_first = decoder.cell(torch.cat([expected_emb, torch.zeros(B, Dk)], dim=-1), state)  # (B, R)
        weight_suspects = {
            "the mask was not passed to attend, so padded source positions get weight (attend's mask "
            "defaults to None, which means no padding)": scorers.attend(scores, enc_states, None)[1],
            "the weights come from a state updated before attending. This decoder (Bahdanau's) queries with "
            "s_{i-1}, before the GRU update, and feeds what it read into that update":
                scorers.attend(decoder.scorer.score(updated_first, projected_keys), enc_states, mask)[1],
        }
        check_close(weights, expected_weights, name="weights", shape="B S", dims={"B": B, "S": S},
                    suspects=weight_suspects, hint="w_i = masked softmax over j of score(s_{i-1}, h_j)")
        check_close(context, expected_context, name="context", shape="B Dk", dims={"B": B, "Dk": Dk},
                    hints={(B, A): "the context averages the projected keys W_k h_j + b instead of the encoder "
                                   "states h_j, which are the values"},
                    hint="c_i = sum over j of w_ij h_j")
        swapped = decoder.cell(torch.cat([expected_context, expected_emb], dim=-1), state)  # wrong order
        state_suspects = {
            "the step returned s_{i-1}, so the GRU's new state is lost and the next step queries with the "
            "same state again": state,
        }
        if not torch.allclose(swapped, expected_state):
            state_suspects["the two parts of the GRU input are swapped. The order is [emb(y_{i-1}); c_i], and "
                           "swapping them feeds each input weight the wrong feature"] = swapped
        check_close(new_state, expected_state, name="state", shape="B R", dims={"B": B, "R": R},
                    suspects=state_suspects, hint="s_i = GRU([emb(y_{i-1}); c_i], s_{i-1})")
        check_close(emb, expected_emb, name="emb", shape="B embed_size", dims={"B": B, "embed_size": embed_size},
                    hint="the embedding of the previous output token y_prev")
    passed("attention decoder step")
