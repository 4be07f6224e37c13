"""Checker for notebook 02's side exercise: Luong et al.'s (2015, §3) decoder step, in their order."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from course_utils.blocks import scorers, seq2seq
from course_utils.checks.core import (call, check_close, check_gradients, describe, passed, reference_guard,
                                     shape_cases, sweep)
from course_utils.checks.inspection import has_python_loop
from course_utils.core.errors import CheckError
from course_utils.checks.flow import exercise_check


_LUONG_OUTPUTS = "a tuple (state s_i (B, R), context c_i (B, Dk), attentional s~_i (B, R), weights w_i (B, S))"


@exercise_check
def check_luong_step(fn: Callable[..., Any], seed: int = 0, B: int = 3, S: int = 5, R: int = 6, Dk: int = 8,
                     score: scorers.ScoreKind = "additive") -> None:
    """Check a learner's ``luong_step(emb, state, enc_states, projected_keys, mask, cell, score, W_c)`` (02, Exercises).

    Luong et al.'s (2015, §3) order: ``s_i = GRU(emb, s_{i-1})``, weights from ``score(s_i, h_j)``
    over the real positions, ``c_i = sum_j w_ij h_j``, ``s~_i = tanh(W_c [c_i; s_i])``; the step
    returns ``(s_i, c_i, s~_i, w_i)``. The keys handed in are not computed from the values, so a
    step that scores against ``enc_states`` is caught. Each output and the gradients with respect
    to ``emb``, ``state``, ``enc_states``, ``projected_keys`` and ``W_c`` are compared with
    :func:`course_utils.blocks.seq2seq.luong_step`; at the sizes asked for, then at B = 1, S = 1
    and sizes that all differ, with one source of a single real token in every batch of two or more.

    Args:
        fn: The learner's function.
        seed: Seeds the modules and the inputs.
        B: Batch size.
        S: Source length.
        R: Width of the decoder state (the query).
        Dk: Width of the encoder states (the values).
        score: Whose ``score`` method is handed in: ``"additive"``, ``"concat"``, ``"bilinear"`` or ``"dot"``
            (which needs ``R == Dk``).

    Raises:
        CheckError: Naming the likely bug.
        ValueError: If ``score="dot"`` with ``R != Dk`` (a mistake in the test, not in the answer).
    """
    __tracebackhide__ = True  # noqa: F841
    if score == "dot" and R != Dk:
        raise ValueError(f"the dot score needs R == Dk, got R = {R} and Dk = {Dk}")
    distinct = None if score == "dot" else {"B": 3, "S": 5, "R": 6, "Dk": 8}  # the dot score keeps R == Dk
    with reference_guard(fn, seq2seq.luong_step):
        sweep(lambda B, S, R, Dk: _luong_step_once(fn, seed, B, S, R, Dk, score),
              shape_cases({"B": B, "S": S, "R": R, "Dk": Dk}, ones=("B", "S"), distinct=distinct))
        if has_python_loop(fn):
            raise CheckError("the step is right, but your function has a Python loop (a `for` or `while` loop, or a "
                             "comprehension), which the exercise rules out (\"No loops\"): every operation of the "
                             "step takes the whole batch at once")
    passed("luong_step")


def _luong_step_once(fn: Callable[..., Any], seed: int, B: int, S: int, R: int, Dk: int,
                     score: scorers.ScoreKind) -> None:
    __tracebackhide__ = True  # noqa: F841
    embed_size, A = 4, Dk + 1  # A differs from Dk, so keys of width A cannot pass for values
    with torch.random.fork_rng():  # the learner's global random state is left alone
        torch.manual_seed(seed)
        cell = torch.nn.GRUCell(embed_size, R)
        scorer = scorers.make_scorer(score, R, Dk, A)
    g = torch.Generator().manual_seed(seed)
    W_c = torch.randn(R, Dk + R, generator=g) / (Dk + R) ** 0.5  # (R, Dk + R)
    emb = torch.randn(B, embed_size, generator=g)  # emb(y_{i-1})
    state = torch.tanh(torch.randn(B, R, generator=g))  # s_{i-1}, in (-1, 1) like a GRU state
    lengths = torch.randint(1, S + 1, (B,), generator=g)
    lengths[0] = S
    if B > 1:
        lengths[-1] = 1  # a source of one real token: all its weight on position 0
    mask = torch.arange(S)[None, :] < lengths[:, None]  # (B, S), True on real tokens
    enc_states = torch.randn(B, S, Dk, generator=g) * mask[:, :, None]  # the values, zeros on padding
    key_states = torch.randn(B, S, Dk, generator=g) * mask[:, :, None]  # other states, so that keys != values
    with torch.no_grad():
        projected_keys = scorer.precompute(key_states).clone()  # (B, S, A) for the additive score, else (B, S, Dk)
    inputs = (emb, state, enc_states, projected_keys, mask, cell, scorer.score, W_c)
    tensors = (emb, state, enc_states, projected_keys, mask, W_c)
    copies = tuple(t.clone() for t in tensors)
    parameters = [p.detach().clone() for p in (*cell.parameters(), *scorer.parameters())]
    with torch.no_grad():
        got = call(fn, *inputs, name="luong_step", expected=_LUONG_OUTPUTS,
                   error_hint="check the widths. The cell reads emb(y_{i-1}) alone (width embed_size), with no "
                              "context (that would be input feeding); `score` takes the query (B, R) and "
                              "projected_keys; attend averages enc_states (B, S, Dk), the values; and W_c is "
                              "(R, Dk + R), as the weight of an nn.Linear from Dk + R features to R")
        if not all(torch.equal(a, b) for a, b in zip(tensors, copies)):
            raise CheckError("luong_step changed an input in place, so use out-of-place operations")
        if not all(torch.equal(a, b.detach()) for a, b in zip(parameters, (*cell.parameters(), *scorer.parameters()))):
            raise CheckError("luong_step changed a parameter of the cell or the scorer: a step only reads its parts")
        if not isinstance(got, tuple) or len(got) != 4:
            raise CheckError(f"expected luong_step to return {_LUONG_OUTPUTS}, got {describe(got)}")
        new_state, context, attentional, weights = got
        if (R != Dk and all(isinstance(t, torch.Tensor) for t in got)
                and tuple(context.shape) == (B, R) and tuple(attentional.shape) == (B, Dk)):
            raise CheckError("the context and the attentional state came back in the wrong order; return "
                             "(state, context, attentional, weights)")
        want_state, want_context, want_attentional, want_weights = seq2seq.luong_step(*inputs)

        state_suspects = {
            "the step returned s_{i-1}, so the GRU's new state is lost and the next step starts from the same "
            "state again": state,
            "the step returned the attentional state s~_i as the new state. The recurrence carries s_i, the "
            "GRU's output; s~_i only feeds the output layer": want_attentional,
        }
        check_close(new_state, want_state, name="state", shape="B R", dims={"B": B, "R": R}, suspects=state_suspects,
                    hint="s_i = GRU(emb(y_{i-1}), s_{i-1}): the cell reads the embedding, and no context")

        old_query = scorers.attend(scorer.score(state, projected_keys), enc_states, mask)[1]
        weight_suspects = {
            "the weights come from s_{i-1}, the state before the GRU update. That is Bahdanau's order (section "
            "4's AttentionDecoder.step); Luong's step updates the state first and queries with the new state "
            "s_i": old_query,
            "the mask was not passed to attend, so padded source positions get weight (attend's mask defaults "
            "to None, which means no padding)": scorers.attend(scorer.score(want_state, projected_keys),
                                                               enc_states, None)[1],
        }
        if score != "additive":  # these scores also accept the (B, S, Dk) encoder states as keys
            weight_suspects["the scores were computed from enc_states, not from the keys handed in, projected_keys. "
                            "The keys are computed once per sequence, before the first step; a step scores its "
                            "query against them"] = scorers.attend(scorer.score(want_state, enc_states), enc_states,
                                                                   mask)[1]
        check_close(weights, want_weights, name="weights", shape="B S", dims={"B": B, "S": S},
                    suspects=weight_suspects,
                    hint="w_i = masked softmax over j of score(s_i, k_j), with the keys k_j in projected_keys")

        context_suspects = {}
        if projected_keys.shape[-1] == Dk:
            context_suspects["the context averages the keys (projected_keys) instead of the values (enc_states)"] = (
                scorers.attend(scorer.score(want_state, projected_keys), projected_keys, mask)[0])
        if R == Dk:
            context_suspects["this is the attentional state s~_i: return (state, context, attentional, weights), in "
                             "that order"] = want_attentional
        check_close(context, want_context, name="context", shape="B Dk", dims={"B": B, "Dk": Dk},
                    hints={(B, A): "the context averages the keys (projected_keys) instead of the values "
                                   "(enc_states)"},
                    suspects=context_suspects,
                    hint="c_i = sum over j of w_ij h_j, with the values h_j in enc_states")

        attentional_suspects = {
            "the tanh is missing: the attentional layer is tanh of W_c times [c_i; s_i]":
                torch.cat([want_context, want_state], dim=-1) @ W_c.T,
            "the attentional layer read s_{i-1}, the state before the update; it combines c_i with the new "
            "state s_i": torch.tanh(torch.cat([want_context, state], dim=-1) @ W_c.T),
        }
        attentional_suspects["the two parts of [c_i; s_i] are swapped. The first Dk columns of W_c multiply the "
                             "context, the last R the state"] = (
            torch.tanh(torch.cat([want_state, want_context], dim=-1) @ W_c.T))
        check_close(attentional, want_attentional, name="attentional", shape="B R", dims={"B": B, "R": R},
                    suspects=attentional_suspects,
                    hint="s~_i = tanh(W_c [c_i; s_i]), the context first; W_c is (R, Dk + R), like the weight of "
                         "an nn.Linear")
    check_gradients(fn, inputs, seq2seq.luong_step, name="luong_step",
                    wrt={0: "emb", 1: "state", 2: "enc_states", 3: "projected_keys", 7: "W_c"},
                    what="the state, context, attentional state and weights", seed=seed)
