"""Checkers for notebook 02: additive attention, bilinear scores, the context vector, Bahdanau's decoder step.

Luong's decoder step, the side exercise of 02, is checked in :mod:`course_utils.checks.luong`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from course_utils.blocks import attention, scorers, seq2seq
from course_utils.blocks.attention import masked_softmax
from course_utils.checks.core import (call, check_close, check_gradients, describe, passed, reference_guard,
                                     shape_cases, sweep)
from course_utils.checks.inspection import has_python_loop
from course_utils.core.errors import CheckError
from course_utils.checks.flow import exercise_check


@exercise_check
def check_additive_attention(fn: Callable[..., Any], seed: int = 0, B: int = 3, S: int = 5, R: int = 4, Dk: int = 7,
                             A: int = 6) -> None:
    """Check a learner's ``additive_attention(query, projected_keys, values, mask, W_q, v_a)`` (notebook 02, section 2).

    The whole attention step of Bahdanau's decoder for a batch: the scores
    ``e_j = v_a^T tanh(W_q s + W_k h_j + b)`` (``W_k h_j + b`` arrives projected), the
    softmax over the real source positions and the context ``c = sum_j w_j h_j``,
    returned as ``(context (B, Dk), weights (B, S))``. Values and gradients (with
    respect to the query, the projected keys, the values, ``W_q`` and ``v_a``) are
    compared with :func:`course_utils.blocks.scorers.additive_attention`, at the sizes
    asked for (all different by default), then at B = 1, S = 1 and a larger batch;
    in every batch of two or more one source has the full length and one a single
    real token, and the padded positions hold values that must not count. Each case
    is tried again with scores of several hundred, where an unguarded ``exp``
    overflows. The messages name the bug in words and never show the code that fixes it.

    Raises:
        CheckError: Naming the likely bug.
    """
    __tracebackhide__ = True  # noqa: F841
    sizes = {"B": B, "S": S, "R": R, "Dk": Dk, "A": A}
    cases = shape_cases(sizes, ones=("B", "S"), distinct={"B": 3, "S": 5, "R": 4, "Dk": 7, "A": 6})
    cases.append((f"a larger batch, B = {B + 3}", {**sizes, "B": B + 3}, "a batch of another size"))
    with reference_guard(fn, scorers.additive_attention, scorers.attend):
        sweep(lambda B, S, R, Dk, A: _additive_attention_once(fn, seed, B, S, R, Dk, A), cases)
        if has_python_loop(fn):
            raise CheckError("the context and the weights are right, but your function has a Python loop (a `for` or "
                             "`while` loop, or a comprehension), which the exercise rules out (\"No loops\"): every "
                             "operation of the step takes the whole batch, and every source position, at once")
    passed("additive_attention")


_ATTENTION_OUTPUTS = "a tuple (context (B, Dk), weights (B, S))"
_ATTENTION_SHAPES = ("check the shapes: query (B, R) is one decoder state per sequence; W_q (A, R) is stored like "
                     "the weight of an nn.Linear from R features to A, so it maps the query's R features to A; "
                     "projected_keys (B, S, A) holds S keys for each sequence, and each sequence's projected query "
                     "must meet every source position of its own sequence; v_a (A,) weighs the A hidden units; "
                     "values (B, S, Dk) are averaged over the S positions")


def _additive_attention_inputs(g: torch.Generator, B: int, S: int, R: int, Dk: int,
                               A: int) -> tuple[torch.Tensor, ...]:
    """query, projected_keys, values, mask, W_q, v_a: lengths from 1 to S, values that are not 0 on padding."""
    query = torch.tanh(torch.randn(B, R, generator=g))  # s_{i-1}, in (-1, 1) like a GRU state
    projected_keys = torch.randn(B, S, A, generator=g)
    values = torch.randn(B, S, Dk, generator=g)  # not zero on padding: padding that counts changes the context
    lengths = torch.randint(1, S + 1, (B,), generator=g)
    lengths[0] = S
    if B > 1:
        lengths[-1] = 1
    mask = torch.arange(S)[None, :] < lengths[:, None]  # (B, S), True on real tokens
    W_q = torch.randn(A, R, generator=g) / R**0.5
    v_a = 2 * torch.randn(A, generator=g)
    return query, projected_keys, values, mask, W_q, v_a


def _additive_attention_once(fn: Callable[..., Any], seed: int, B: int, S: int, R: int, Dk: int, A: int) -> None:
    __tracebackhide__ = True  # noqa: F841
    g = torch.Generator().manual_seed(seed)
    inputs = _additive_attention_inputs(g, B, S, R, Dk, A)
    copies = tuple(t.clone() for t in inputs)
    got = _call_additive_attention(fn, inputs, B, S, Dk, A, g)
    if not all(torch.equal(a, b) for a, b in zip(inputs, copies)):
        raise CheckError("additive_attention changed an input in place (e.g. with masked_fill_), so use out-of-place "
                         "operations")
    _compare_attention(got, inputs, B, S, Dk, A, label="")
    check_gradients(fn, inputs, scorers.additive_attention, name="additive_attention",
                    wrt={0: "query", 1: "projected_keys", 2: "values", 4: "W_q", 5: "v_a"},
                    what="the context and the weights", seed=seed)

    # Scores of several hundred: a softmax written as exp(e) / sum exp(e) overflows to inf / inf = NaN.
    query, projected_keys, values, mask, W_q, v_a = inputs
    large = (query, projected_keys, values, mask, W_q, 300 * v_a)
    got = call(fn, *large, name="additive_attention", expected=f"{_ATTENTION_OUTPUTS}, for large scores")
    if (isinstance(got, tuple) and len(got) == 2 and isinstance(got[1], torch.Tensor) and got[1].is_floating_point()
            and not torch.isfinite(got[1]).all()):
        raise CheckError("with scores of several hundred the weights contain NaN or inf: the exponential of a large "
                         "score overflows, and inf / inf is NaN. A softmax that is safe for any scores (notebook 00's "
                         "masked softmax, or torch's) shifts each row by its largest score first")
    _compare_attention(got, large, B, S, Dk, A, label="for scores of several hundred")


def _call_additive_attention(fn: Callable[..., Any], inputs: tuple[torch.Tensor, ...], B: int, S: int, Dk: int, A: int,
                             g: torch.Generator) -> Any:
    """The learner's output; if it raises, find out whether it runs with R = A (the query projection's side)."""
    __tracebackhide__ = True  # noqa: F841
    try:
        return call(fn, *inputs, name="additive_attention", expected=_ATTENTION_OUTPUTS, error_hint=_ATTENTION_SHAPES)
    except CheckError as err:
        # Does it run when R = A? Then the query met W_q, or the keys, along the wrong axis.
        square = _additive_attention_inputs(g, B, S, A, Dk, A)
        query, projected_keys, values, mask, W_q, v_a = square
        try:
            got = call(fn, *square, name="additive_attention")
        except CheckError:
            raise err from None
        weights = got[1] if isinstance(got, tuple) and len(got) == 2 else got
        want = scorers.additive_attention(*square)[1]
        unprojected = scorers.additive_attention(query, projected_keys, values, mask, torch.eye(A), v_a)[1]
        if isinstance(weights, torch.Tensor) and weights.shape == want.shape and torch.allclose(weights, unprojected,
                                                                                              atol=1e-5):
            raise CheckError("it runs only when R = A, and then it matches a query that was never projected: the "
                             "score compares W_q s (A features) with the projected keys, not s itself (R features)"
                             ) from None
        raise CheckError("it runs only when R = A, the width of the query equals that of the projected keys, so the "
                         "query projection runs along the wrong axis of W_q. W_q (A, R) is stored like the weight of "
                         "an nn.Linear from R features to A: it must turn the R features of each query into A "
                         "features") from None


def _compare_attention(got: Any, inputs: tuple[torch.Tensor, ...], B: int, S: int, Dk: int, A: int,
                       label: str) -> None:
    """Compare the learner's (context, weights) with the reference's, naming the known mistakes."""
    __tracebackhide__ = True  # noqa: F841
    query, projected_keys, values, mask, W_q, v_a = inputs
    where = f" {label}" if label else ""
    if not isinstance(got, tuple) or len(got) != 2:
        raise CheckError(f"expected additive_attention to return {_ATTENTION_OUTPUTS}{where}, got {describe(got)}")
    context, weights = got
    if (isinstance(context, torch.Tensor) and isinstance(weights, torch.Tensor)
            and tuple(context.shape) == (B, S) and tuple(weights.shape) == (B, Dk) and S != Dk):
        raise CheckError("the context and the weights came back in the wrong order; return (context, weights)")
    want_context, want_weights = scorers.additive_attention(*inputs)
    q_proj = query @ W_q.T  # (B, A)
    pre = q_proj[:, None, :] + projected_keys  # (B, S, A), the hidden layer before its tanh
    scores = torch.tanh(pre) @ v_a  # (B, S)
    masked = scores.masked_fill(~mask, float("-inf"))
    weight_suspects = {
        "the softmax ran over the batch (one source position across all sequences) instead of over the source "
        "positions of each sequence": torch.softmax(masked, dim=0).nan_to_num(0.0),
        "padding was not masked, so the padded source positions get weight": torch.softmax(scores, dim=-1),
        "the mask is inverted: True marks the real tokens, the ones that may be attended to, and the padding must "
        "get zero weight": masked_softmax(scores, ~mask),
        "the padded scores were set to 0, but a score of 0 is not left out of the softmax: exp(0) = 1, so the padding "
        "still takes weight. A padded position must get zero weight": torch.softmax(scores * mask, dim=-1),
        "the softmax ran over every position, padding included, and the padded weights were then set to 0: the "
        "weights of the real positions no longer sum to 1. The padding must be left out before the softmax, not "
        "after": torch.softmax(scores, dim=-1) * mask,
        "these are the scores, not the weights: the weights are a softmax of the scores over the real positions, "
        "positive and summing to 1 in each row": scores,
        "these are the masked scores, not the weights: the softmax is missing": scores * mask,
        "the weights are not normalised: each row must sum to 1 over its real positions (the softmax divides by the "
        "row's sum)": torch.exp(scores) * mask,
        "the tanh is missing. Without it the score is linear, v_a^T W_q s + v_a^T (W_k h_j + b), and the query's "
        "part is the same for every position, so it cannot change which source position wins":
            masked_softmax(pre @ v_a, mask),
        "tanh was applied after v_a, but it belongs to the hidden layer, v_a^T tanh(W_q s + W_k h_j + b)":
            masked_softmax(torch.tanh(pre @ v_a), mask),
        "the hidden layer was summed over its A units instead of weighted by v_a":
            masked_softmax(torch.tanh(pre).sum(-1), mask),
    }
    if B == S:  # then a query that is not broadcast over the positions runs without error
        weight_suspects["the query was not broadcast over the source positions, so query b was added to source "
                        "position b of every sequence. Each sequence's projected query must meet every source "
                        "position of its own sequence"] = masked_softmax(torch.tanh(q_proj[None, :, :] + projected_keys)
                                                                         @ v_a, mask)
    weight_hints = {
        (B, S, A): "the A axis is still there, so the hidden layer was not reduced with v_a",
        (B, S, 1): "one size-1 axis too many at the end",
        (B, 1, S): "one size-1 axis too many in the middle",
    }
    check_close(weights, want_weights, name=f"weights{where}", shape="B S", dims={"B": B, "S": S},
                suspects=weight_suspects, hints=weight_hints,
                hint="work out one sequence's weights by hand: its scores, then a softmax over its real positions only")
    context_suspects, context_hints = _context_suspects_and_hints(values, want_weights, B, S, Dk)
    context_suspects["the context was weighted by the softmax over every position, padding included, not by the "
                     "weights returned"] = (torch.softmax(scores, dim=-1)[:, None, :] @ values)[:, 0]
    context_hints[(B, A)] = ("the context averages the projected keys W_k h_j + b instead of the encoder states h_j, "
                             "which are the values")
    check_close(context, want_context, name=f"context{where}", shape="B Dk", dims={"B": B, "Dk": Dk},
                suspects=context_suspects, hints=context_hints,
                hint="c = sum over j of w_j h_j: each sequence's values weighted by that sequence's weights, summed "
                     "over the source positions")


def _context_suspects_and_hints(values: torch.Tensor, weights: torch.Tensor, B: int, S: int,
                                Dk: int) -> tuple[dict[str, torch.Tensor], dict[tuple[int, ...], str]]:
    """The wrong contexts a learner writes from (B, S) weights and (B, S, Dk) values, and the shapes they come in."""
    over_features = ("each weight was multiplied into its value and the product summed over the Dk features of each "
                     "value: that gives one number per source position. The context is a sum over the source "
                     "positions (the S axis), one vector of Dk features per sequence")
    suspects = {
        "the context sums the values without the weights": values.sum(1),
        "the context averages the values uniformly instead of weighting them by the attention weights": values.mean(1),
    }
    if S == Dk:  # then the sum over the features has the context's shape
        suspects[over_features] = (weights[:, :, None] * values).sum(-1)
    hints = {  # a later key wins where two shapes coincide (B = S, or B = 1)
        (B, B, Dk): "every sequence's weights met every sequence's values: a matrix product of the (B, S) weights "
                    "with the (B, S, Dk) values gives the weights of all B sequences for each sequence's values. "
                    "Sequence b's weights must meet only sequence b's values",
        (B, S): over_features,
        (B, S, Dk): "the weighted values were not yet summed over the source positions (the S axis)",
        (B, 1, Dk): "one size-1 axis too many in the middle",
    }
    return suspects, hints


def _run_scorer(fn: Callable[..., Any], reference: Callable[..., torch.Tensor], inputs: tuple[torch.Tensor, ...],
                B: int, S: int, error_hint: str) -> tuple[Any, torch.Tensor]:
    """The learner's scores and the reference's, after making sure the learner left its inputs as they were."""
    __tracebackhide__ = True  # noqa: F841
    name = reference.__name__
    copies = tuple(t.clone() for t in inputs)
    got = call(fn, *inputs, name=name, expected=f"scores of shape (B, S) = {(B, S)}", error_hint=error_hint)
    if not all(torch.equal(a, b) for a, b in zip(inputs, copies)):
        raise CheckError(f"{name} changed an input in place, so use out-of-place operations")
    return got, reference(*inputs)


@exercise_check
def check_attend(fn: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], Any], seed: int = 0,
                 B: int = 3, S: int = 5, Dk: int = 4) -> None:
    """Check an ``attend(scores, values, mask) -> (context, weights)`` (02's ``scorers.attend``, not an exercise).

    ``values`` is (B, S, Dk) (the encoder states) and ``mask`` (B, S) bool, True on real tokens,
    or None (no padding). Also a row with no real position (zero weights, not NaN), scores of
    about ±1e4 and a backward pass; at the sizes asked for, then at B = 1, S = 1, Dk = 1 and
    sizes that all differ.

    Raises:
        CheckError: Naming the likely bug.
    """
    __tracebackhide__ = True  # noqa: F841
    with reference_guard(fn, scorers.attend):
        sweep(lambda B, S, Dk: _attend_once(fn, seed, B, S, Dk),
              shape_cases({"B": B, "S": S, "Dk": Dk}, ones=("B", "S", "Dk"), distinct={"B": 3, "S": 5, "Dk": 4}))
    passed("attend")


def _attend_once(fn: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], Any], seed: int, B: int, S: int,
                 Dk: int) -> None:
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
        "the softmax ran over every position, padding included, and the padded weights were then set to 0: the "
        "weights of the real positions no longer sum to 1. The padding must be left out before the softmax, not after":
            torch.softmax(scores, dim=-1) * mask,
    }
    check_close(weights, expected_weights, name="weights", shape="B S", dims={"B": B, "S": S},
                suspects=weight_suspects, hint="each row should be a softmax over its real (mask True) source positions")
    context_suspects, hints = _context_suspects_and_hints(values, expected_weights, B, S, Dk)
    check_close(context, expected_context, name="context", shape="B Dk", dims={"B": B, "Dk": Dk},
                suspects=context_suspects, hints=hints,
                hint="the context of a sequence is its values weighted by that sequence's attention weights, summed")

    def compare(label: str, scores_: torch.Tensor, mask_: torch.Tensor | None, weights_hint: str, context_hint: str,
                not_finite: tuple[Any, str] | None = None) -> None:
        """Call attend on other inputs and compare; ``not_finite``: (where NaN or inf is looked for, the message)."""
        __tracebackhide__ = True  # noqa: F841
        got_ = call(fn, scores_, values, mask_, name="attend",
                    expected=f"a tuple (context (B, Dk) = {(B, Dk)}, weights (B, S) = {(B, S)}) {label}",
                    error_hint="mask may be None, which means no padding: every source position is real"
                    if mask_ is None else "")
        if not isinstance(got_, tuple) or len(got_) != 2:
            raise CheckError(f"{label}: expected attend to return a tuple (context, weights), got {describe(got_)}")
        context, weights = got_
        want_context, want_weights = scorers.attend(scores_, values, mask_)
        if (not_finite is not None and isinstance(weights, torch.Tensor) and tuple(weights.shape) == (B, S)
                and not torch.isfinite(weights[not_finite[0]]).all()):
            raise CheckError(not_finite[1])
        check_close(weights, want_weights, name=f"weights {label}", shape="B S", dims={"B": B, "S": S},
                    hint=weights_hint)
        check_close(context, want_context, name=f"context {label}", shape="B Dk", dims={"B": B, "Dk": Dk},
                    hint=context_hint)

    # A sequence with no real position (every key masked): zero weights and a zero context, not NaN.
    empty = mask.clone()
    empty[0] = False
    compare("for a row with no real position", scores, empty,
            "a row whose mask is all False gets zero weights, the other rows as before",
            "zero weights give a zero context",
            not_finite=(0, "the weights of a row with no real position (every source position masked) are NaN: a "
                           "softmax over a row with nothing left to weigh is 0/0. Such a row must get zero weights, "
                           "and so a zero context"))
    no_padding = "mask=None means no padding: every source position may be attended to"
    compare("with mask=None", scores, None, no_padding, no_padding)
    # Scores of about ±1e4: exp overflows float32 above about 88 unless each row's maximum is subtracted first.
    compare("for large scores (about ±1e4)", 1e4 * torch.randn(B, S, generator=g), mask,
            "the weights must depend only on the differences between the scores",
            "the context is the values weighted by the weights, summed",
            not_finite=(..., "the weights are NaN or inf for large scores (about ±1e4): exp overflows float32 above "
                             "about 88. Subtract each row's largest score before exp (torch.softmax does), which "
                             "leaves the weights unchanged"))
    check_gradients(fn, inputs, scorers.attend, name="attend", wrt={0: "scores", 1: "values"},
                    what="the context and the weights", seed=seed)


@exercise_check
def check_bilinear_scores(fn: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], Any], seed: int = 0,
                          B: int = 2, S: int = 5, R: int = 3, Dk: int = 4) -> None:
    """Check a ``bilinear_scores(query, keys, W) -> (B, S)`` (notebook 02, section 3; no longer an exercise).

    ``query`` is (B, R), ``keys`` (B, S, Dk) and ``W`` (R, Dk). Forward and backward,
    at the sizes asked for, then at B = 1, S = 1 and sizes that all differ.

    Raises:
        CheckError: Naming the likely bug.
    """
    __tracebackhide__ = True  # noqa: F841
    with reference_guard(fn, scorers.bilinear_scores):
        sweep(lambda B, S, R, Dk: _bilinear_scores_once(fn, seed, B, S, R, Dk),
              shape_cases({"B": B, "S": S, "R": R, "Dk": Dk}, ones=("B", "S"),
                          distinct={"B": 2, "S": 5, "R": 3, "Dk": 4}))
    passed("bilinear_scores")


def _bilinear_scores_once(fn: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], Any], seed: int, B: int, S: int,
                          R: int, Dk: int) -> None:
    __tracebackhide__ = True  # noqa: F841
    g = torch.Generator().manual_seed(seed)
    query = torch.randn(B, R, generator=g)
    keys = torch.randn(B, S, Dk, generator=g)
    W = torch.randn(R, Dk, generator=g)
    inputs = (query, keys, W)
    got, expected = _run_scorer(fn, scorers.bilinear_scores, inputs, B, S,
                                error_hint="the query is (B, R), W is (R, Dk) and the keys are (B, S, Dk); check "
                                           "which axes each of your products contracts")
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
    check_gradients(fn, inputs, scorers.bilinear_scores, name="bilinear_scores", wrt={0: "query", 1: "keys", 2: "W"},
                    what="the scores", seed=seed)


@exercise_check
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
