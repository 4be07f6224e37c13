"""Wrong answers two reviewers ran against the checkers of 02, 04, 05 and 07: each message names the real bug.

Every answer here was rejected before as well, but with a message about another mistake (or none). Each
test asserts the words that name the bug, and that the message gives no answer away.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from buggy_answers import _DECODER_LAYER
from course_utils.blocks import attention, masks, multihead, scorers
from course_utils.checks import (
    CheckError,
    check_additive_attention,
    check_attend,
    check_attention_entropy,
    check_decoder_layer_forward,
    check_multi_head_attention,
)
from course_utils.core.errors import InputError
from helpers import assert_no_answer_in

# Code that would fix the bug; a message names the bug in words instead.
FIXES = ("[:, None", "None, :]", "[:, :, None]", "unsqueeze(", "squeeze(", "bmm", "einsum", ".sum(", "dim=",
         "masked_fill", "-inf", "@ v", "@ v_a", "v_a @", "mask[:, 0]", "sqrt(q.shape", "shape[-1]")


def _message(check, fn, **sizes) -> str:
    with pytest.raises(CheckError) as err:
        check(fn, **sizes)
    return str(err.value)


# --- notebook 07: a memory_mask without its head axis -----------------------------------------------------------

_NO_HEAD_AXIS = _DECODER_LAYER.replace("memory_mask[:, None]", "memory_mask")


def _decoder_without_head_axis():
    namespace = {"torch": torch, "math": math, "F": F}
    exec(_NO_HEAD_AXIS, namespace)  # noqa: S102 - test fixture code
    return namespace["decoder_layer_forward"]


def test_a_padding_mask_without_head_axis_is_told_which_shape_goes_with_which_scores():
    q, k, v = torch.randn(2, 4, 3, 8), torch.randn(2, 4, 5, 8), torch.randn(2, 4, 5, 8)  # B = 2, H = 4
    pad = masks.padding_mask(torch.tensor([5, 2]), 5)  # (B, 1, S)
    with pytest.raises(InputError) as err:
        attention.scaled_dot_product_attention(q, k, v, pad)
    assert "(B, 1, 1, S) for (B, H, T, S) scores" in str(err.value)
    assert "(B, 1, S) for (B, T, S) scores" in str(err.value)


def test_check_decoder_layer_forward_names_a_memory_mask_without_head_axis_when_it_raises():
    message = _message(check_decoder_layer_forward, _decoder_without_head_axis())  # B = 2, H = 4: it raises
    assert "(B, 1, 1, S) for (B, H, T, S) scores" in message, message
    assert "likely cause: it runs without a mask and fails with one" in message, message
    assert "state maps names" not in message, message  # the likely cause of another bug
    assert_no_answer_in(message, FIXES, solution=("07_transformer_block", "decoder_layer_forward"))


def test_check_decoder_layer_forward_names_a_memory_mask_without_head_axis_when_b_equals_h():
    # the hidden test's sizes: with B = H the (B, 1, S) mask broadcasts, its batch axis read as the heads
    message = _message(check_decoder_layer_forward, _decoder_without_head_axis(), seed=1, B=3, T=6, S=2, D=12, H=3)
    assert "without a head axis" in message, message
    assert_no_answer_in(message, FIXES, solution=("07_transformer_block", "decoder_layer_forward"))


# --- notebook 05: a head axis added to a mask that has one ------------------------------------------------------

def _mha_extra_head_axis(query, key, value, q_proj, k_proj, v_proj, out_proj, H, mask=None):
    q, k, v = (multihead.split_heads(p(t), H) for p, t in ((q_proj, query), (k_proj, key), (v_proj, value)))
    if mask is not None:
        mask = mask.unsqueeze(1)  # the mask handed in is already (B, 1, 1, S)
    context, weights = attention.scaled_dot_product_attention(q, k, v, mask)
    return out_proj(multihead.merge_heads(context)), weights


def test_check_multi_head_attention_names_a_second_head_axis_on_the_mask():
    message = _message(check_multi_head_attention, _mha_extra_head_axis)
    assert "already has its head axis" in message, message
    assert "take their length from their own shape" not in message, message  # the likely cause of another bug
    assert_no_answer_in(message, FIXES, solution=("05_multi_head_attention", "multi_head_attention"))


# --- notebook 02: attend and additive_attention -------------------------------------------------------------------

def _weights(scores, mask):
    return scorers.attend(scores, torch.zeros(*scores.shape, 1), mask)[1]


def _attend_matrix_product(scores, values, mask):
    weights = _weights(scores, mask)
    return weights @ values, weights  # (B, S) @ (B, S, Dk) -> (B, B, Dk)


def _attend_summed_over_features(scores, values, mask):
    weights = _weights(scores, mask)
    return (weights[:, :, None] * values).sum(-1), weights  # (B, S)


def _attend_softmax_then_zero(scores, values, mask):
    weights = torch.softmax(scores, dim=-1) * (torch.ones_like(scores, dtype=torch.bool) if mask is None else mask)
    return (weights[:, :, None] * values).sum(1), weights


@pytest.mark.parametrize(("buggy", "fragment"), [
    (_attend_matrix_product, "every sequence's weights met every sequence's values"),
    (_attend_summed_over_features, "summed over the Dk features of each value"),
    (_attend_softmax_then_zero, "the padded weights were then set to 0"),
])
def test_check_attend_names_the_bug(buggy, fragment):
    message = _message(check_attend, buggy)
    assert fragment in message, message
    assert_no_answer_in(message, FIXES)  # attend is no longer an exercise of 02: no solution cell to compare with


def _v_a_on_the_wrong_side(query, projected_keys, values, mask, W_q, v_a):
    weights = attention.masked_softmax(v_a @ torch.tanh((query @ W_q.T)[:, None] + projected_keys), mask)
    return (weights[:, None] @ values)[:, 0], weights


def test_check_additive_attention_names_v_a_on_the_wrong_side():
    message = _message(check_additive_attention, _v_a_on_the_wrong_side)
    assert "v_a (A,) weighs the A hidden units" in message, message
    assert_no_answer_in(message, FIXES, solution=("02_bahdanau_attention", "additive_attention"))


# --- notebook 04: Categorical's entropy ---------------------------------------------------------------------------

def test_check_attention_entropy_accepts_categorical(capsys):
    """Categorical renormalises the weights: the same values, and a gradient that differs only by a constant per
    row, which no loss sees through the softmax (or any normalisation) that made the weights."""
    check_attention_entropy(lambda w: torch.distributions.Categorical(probs=w).entropy())
    check_attention_entropy(lambda w: torch.distributions.Categorical(probs=w).entropy(), seed=1, B=3, T=1, S=7)
    assert capsys.readouterr().out.count("all checks passed") == 2


def test_check_attention_entropy_still_rejects_a_detached_weight():
    message = _message(check_attention_entropy, lambda w: -(w.detach() * w.clamp(min=1e-30).log()).sum(-1))
    assert "not the right gradient" in message, message


def test_check_beam_search_asks_about_the_state_when_a_beam_does_not_follow_its_parents():
    """A reviewer's wrong answer: each kept extension takes the state at its own place in the beam, not its parent's.

    When it changes a score, the message must point at the state, not only say the scores are wrong.
    """
    import inspect
    import textwrap

    from course_utils.blocks import decoding
    from course_utils.checks import check_beam_search

    source = textwrap.dedent(inspect.getsource(decoding.beam_search))
    assert "state[parent]" in source
    namespace = dict(vars(decoding))
    exec(source.replace("@torch.no_grad()\n", "").replace("state[parent]", "state[torch.arange(len(parent)) % state.shape[0]]"), namespace)
    # The designed Markov decoders keep their state fixed, so they cannot show this bug; the decoders whose logits
    # read only their state (beam._STATE_CASES) do, whatever the seed.
    with pytest.raises(CheckError, match="state of the prefix it") as err:
        check_beam_search(namespace["beam_search"], seed=9)
    assert_no_answer_in(str(err.value), ["state[parent]"])
