"""The checkers accept the reference and reject known-buggy answers with a message naming the bug."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from course_utils.blocks import attention, masks
from course_utils.checks import (
    CheckError,
    call,
    check_close,
    check_masked_softmax,
    check_padding_mask,
    check_pairwise_scores,
    check_tensor,
    expect_failure,
)

DIMS = {"B": 2, "T": 4, "S": 6}


# --- generic helpers -------------------------------------------------------


def test_check_tensor_accepts_right_tensor():
    t = torch.zeros(2, 4, 6)
    assert check_tensor(t, name="w", shape="B T S", dims=DIMS, dtype=torch.float32) is t


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        (None, "got None: did you forget to `return` it?"),
        (np.zeros((2, 4, 6)), "to be a torch.Tensor"),
        ([1, 2], "to be a torch.Tensor"),
        (torch.zeros(2, 6, 4), "expected w of shape (B, T, S) = (2, 4, 6), got (2, 6, 4): the right sizes in the wrong order"),
        (torch.zeros(2, 4), "2 dimensions instead of 3"),
        (torch.zeros(2, 4, 6, dtype=torch.float64), "with dtype torch.float32, got torch.float64"),
        (torch.full((2, 4, 6), float("nan")), "NaN/inf value(s), the first at index (0, 0, 0)"),
    ],
)
def test_check_tensor_messages(value, fragment):
    with pytest.raises(CheckError) as err:
        check_tensor(value, name="w", shape="B T S", dims=DIMS, dtype=torch.float32)
    assert fragment in str(err.value)


def test_check_tensor_uses_shape_hint():
    with pytest.raises(CheckError, match="did you transpose k"):
        check_tensor(torch.zeros(2, 6, 4), name="w", shape="B T S", dims=DIMS, hints={(2, 6, 4): "did you transpose k?"})


def test_check_close_names_a_known_mistake_and_locates_unknown_ones():
    expected = torch.arange(6.0).reshape(2, 3)
    with pytest.raises(CheckError, match="forgot the minus"):
        check_close(-expected, expected, name="x", suspects={"forgot the minus": -expected})
    wrong = expected.clone()
    wrong[1, 2] = 99.0
    with pytest.raises(CheckError, match=r"1 of 6 entries differ from the reference, the most at index \(1, 2\), where you returned 99\.0000") as err:
        check_close(wrong, expected, name="x")
    assert "5.0" not in str(err.value), "the expected value (an answer-key entry) is never printed"
    check_close(expected + 1e-7, expected, name="x")  # within tolerance


def test_call_turns_missing_and_broken_answers_into_messages():
    def unwritten(x):
        raise NotImplementedError()

    def broken(x):
        return x @ x  # (2, 3) @ (2, 3) fails

    with pytest.raises(CheckError, match="unwritten is not written yet"):
        call(unwritten, torch.zeros(2, 3))
    with pytest.raises(CheckError) as err:
        call(broken, torch.zeros(2, 3), expected="a (2, 2) tensor")
    message = str(err.value)
    assert "broken raised RuntimeError" in message
    assert "called with: a tensor of shape (2, 3)" in message
    assert "return x @ x" in message  # points at the learner's line
    with pytest.raises(CheckError, match="expected a function"):
        call(None, 1, name="masked_softmax")


def test_expect_failure_raises_when_the_check_passes(capsys):
    with pytest.raises(AssertionError, match="accepted an answer it should reject"):
        expect_failure(check_masked_softmax, attention.masked_softmax)
    message = expect_failure(check_masked_softmax, lambda s, m: None)
    assert "got None" in message
    assert "check failed, as it should" in capsys.readouterr().out


# --- exercise checkers: reference passes, every known bug is named ----------


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_checkers_accept_the_reference(seed, capsys):
    check_padding_mask(masks.padding_mask, seed=seed)
    check_pairwise_scores(attention.pairwise_scores, seed=seed)
    check_masked_softmax(attention.masked_softmax, seed=seed)
    assert capsys.readouterr().out.count("all checks passed") == 3


def _inplace_mask(lengths, S):
    lengths.clamp_(max=S)
    lengths -= 0  # noqa: PLW0127
    lengths[0] = 0
    return masks.padding_mask(lengths, S)


PADDING_BUGS = [
    (lambda lengths, S: None, "got None"),
    (lambda lengths, S: (torch.arange(S)[None, :] >= lengths[:, None])[:, None, :], "True marks the padding"),
    (lambda lengths, S: (torch.arange(S)[None, :] <= lengths[:, None])[:, None, :], "off by one"),
    (lambda lengths, S: torch.arange(S)[None, :] < lengths[:, None], "the query axis is missing"),
    (lambda lengths, S: (torch.arange(S)[None, :] < lengths[:, None])[:, :, None], "singleton axis is in the wrong place"),
    (lambda lengths, S: (torch.arange(S)[None, :] < lengths[:, None])[:, None, :].float(), "expected a bool mask"),
    (lambda lengths, S: torch.arange(S) < lengths, "padding_mask raised RuntimeError"),
    (_inplace_mask, "changed `lengths` in place"),
]


@pytest.mark.parametrize(("buggy", "fragment"), PADDING_BUGS)
def test_check_padding_mask_names_the_bug(buggy, fragment):
    with pytest.raises(CheckError) as err:
        check_padding_mask(buggy)
    assert fragment in str(err.value)


def _first_batch_only(q, k):
    return (q[:1] @ k[:1].transpose(-2, -1)).expand(q.shape[0], -1, -1)


def _inplace_scores(q, k):
    q.mul_(1.0)
    q[0, 0, 0] += 1.0
    return q @ k.transpose(-2, -1)


SCORE_BUGS = [
    (lambda q, k: k @ q.transpose(-2, -1), "did you compute k @ q^T"),
    (lambda q, k: q * k.sum(1, keepdim=True), "that is the shape of q"),
    (lambda q, k: q[:, :, None, :] * k[:, None, :, :], "were not summed over the features"),
    (lambda q, k: q[0] @ k[0].T, "the batch dimension is gone"),
    (_first_batch_only, "only the first batch element is right"),
    (lambda q, k: q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5, "divided by √D"),
    (lambda q, k: q @ k, "pairwise_scores raised RuntimeError"),
    (_inplace_scores, "changed q or k in place"),
    # right for (B, T, D) inputs, wrong once a head axis is added
    (lambda q, k: q @ k.transpose(1, 2), "any number of leading (batch) axes"),
    (lambda q, k: torch.einsum("btd,bsd->bts", q, k), "any number of leading (batch) axes"),
    (lambda q, k: q @ k.permute(0, 2, 1), "any number of leading (batch) axes"),
]


@pytest.mark.parametrize(("buggy", "fragment"), SCORE_BUGS)
def test_check_pairwise_scores_names_the_bug(buggy, fragment):
    with pytest.raises(CheckError) as err:
        check_pairwise_scores(buggy)
    assert fragment in str(err.value)


def _nan_rows(scores, mask):
    return torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)


def _inplace_softmax(scores, mask):
    scores.masked_fill_(~mask, float("-inf"))
    return attention.masked_softmax(scores, mask)


def _uniform_empty_rows(scores, mask):
    return torch.softmax(scores.masked_fill(~mask, -1e9), dim=-1)


SOFTMAX_BUGS = [
    (lambda s, m: None, "got None"),
    (lambda s, m: torch.softmax(s.masked_fill(~m, float("-inf")), dim=-2).nan_to_num(0.0), "ran over the queries"),
    (lambda s, m: torch.softmax(s, dim=-1), "the mask was ignored"),
    (lambda s, m: attention.masked_softmax(s, ~m), "the mask is inverted"),
    (lambda s, m: torch.softmax(s.masked_fill(~m, 0.0), dim=-1), "fill them with -inf"),
    (lambda s, m: torch.softmax(s, dim=-1) * m, "zeroed after the softmax"),
    (_nan_rows, "rows of the sequence whose keys are all masked are NaN"),
    (_uniform_empty_rows, "rows with no allowed key must be all zeros"),
    (_inplace_softmax, "changed `scores` in place"),
    (lambda s, m: torch.softmax(s, dim=-1).sum(1, keepdim=True), "the T queries are gone"),
    (lambda s, m: attention.masked_softmax(s * 0.5, m), "wrong values"),
]


@pytest.mark.parametrize(("buggy", "fragment"), SOFTMAX_BUGS)
def test_check_masked_softmax_names_the_bug(buggy, fragment):
    with pytest.raises(CheckError) as err:
        check_masked_softmax(buggy)
    assert fragment in str(err.value)


def test_buggy_answers_used_for_grading_are_rejected_by_the_checkers():
    """The buggy answers of tests/buggy_answers.py fail the visible checks that grade them."""
    from buggy_answers import BUGGY

    from course_utils import checks

    rejected = 0
    for answers in BUGGY.values():
        for grade_id, source in answers.items():
            namespace = {"torch": torch}
            exec(source, namespace)  # noqa: S102 - test fixture code
            checker = getattr(checks, f"check_{grade_id}")
            with pytest.raises(CheckError):
                checker(namespace[grade_id])
            rejected += 1
    assert rejected >= 8


def test_a_failed_check_in_a_notebook_shows_only_its_message():
    """In a kernel, setup() shortens a CheckError to its message; the cell still fails (nbgrader scores 0)."""
    from nbclient import NotebookClient
    from nbformat.v4 import new_code_cell, new_notebook

    nb = new_notebook(cells=[
        new_code_cell("from course_utils import setup\nfrom course_utils.checks import check_masked_softmax\nsetup()"),
        new_code_cell("check_masked_softmax(lambda scores, mask: scores.softmax(-1) * mask)"),
        new_code_cell("print('after')"),
    ])
    NotebookClient(nb, kernel_name="python3", allow_errors=True, timeout=60).execute()
    (error,) = nb.cells[1].outputs
    assert error.output_type == "error" and error.ename == "CheckError"
    assert len(error.traceback) == 1 and "checks.py" not in error.traceback[0]
    assert "zeroed after the softmax" in error.traceback[0]
    assert nb.cells[2].outputs[0].text == "after\n"


# --- notebooks 01 and 02 ------------------------------------------------------

from course_utils.blocks import scorers, seq2seq  # noqa: E402
from course_utils.experiments import training  # noqa: E402
from course_utils.checks import (  # noqa: E402
    check_additive_scores,
    check_attend,
    check_attention_step,
    check_bilinear_scores,
    check_final_states,
    check_sequence_exact_match,
)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_seq2seq_checkers_accept_the_reference(seed, capsys):
    check_final_states(seq2seq.final_states, seed=seed)
    check_sequence_exact_match(training.sequence_exact_match, seed=seed)
    check_additive_scores(scorers.additive_scores, seed=seed)
    check_additive_scores(scorers.additive_scores, seed=seed, B=4, S=4)
    check_attend(scorers.attend, seed=seed)
    check_bilinear_scores(scorers.bilinear_scores, seed=seed)
    check_bilinear_scores(scorers.bilinear_scores, seed=seed, R=4, Dk=4)
    assert capsys.readouterr().out.count("all checks passed") == 7


def assert_no_answer_in(message):
    """Notebook 01's checkers name the bug in words: no solution code, no entry of the expected answer."""
    if "raised" in message:  # the message then quotes the learner's own line, which may hold any code
        return
    for code in ("torch.arange", "lengths - 1]", "lengths[b] - 1", ".all(", "!= pad", "expected -", "expected 0",
                 "expected 1"):
        assert code not in message, f"{code!r} in {message!r}"


FINAL_BUGS = [
    (lambda states, lengths: states[:, -1], "a padding position"),
    (lambda states, lengths: states[torch.arange(states.shape[0]), (lengths - 2).clamp(min=0)], "one position before"),
    (lambda states, lengths: states[:, 0], "the first position"),
    (lambda states, lengths: states.mean(1), "averages over positions"),
    (lambda states, lengths: states[:, lengths - 1], "of *every* row"),
    (lambda states, lengths: states[torch.arange(states.shape[0]), lengths], "raised IndexError"),
    (lambda states, lengths: None, "got None"),
    # right values, but through numpy: no gradient reaches the encoder
    (lambda states, lengths: torch.tensor(states.detach().numpy()[range(states.shape[0]), (lengths - 1).numpy()]),
     "cut off from autograd"),
]


@pytest.mark.parametrize(("buggy", "fragment"), FINAL_BUGS)
def test_check_final_states_names_the_bug(buggy, fragment):
    with pytest.raises(CheckError) as err:
        check_final_states(buggy)
    assert fragment in str(err.value)
    assert_no_answer_in(str(err.value))


MATCH_BUGS = [
    (lambda tokens, targets: (tokens == targets).all(dim=1), "Padding positions were compared"),
    (lambda tokens, targets: ((tokens == targets) & (targets != 0)).any(dim=1), "a single right token"),
    (lambda tokens, targets: (tokens == targets).float().mean(dim=1), "fraction of right tokens"),
    (lambda tokens, targets: (tokens == targets) | (targets == 0), "one value per token"),
    (lambda tokens, targets: ((tokens == targets) | (targets == 0)).all(dim=0), "reduced over the batch"),
    (lambda tokens, targets: ((tokens == targets) | (targets == 0)).all(), "a single value"),
    (lambda tokens, targets: ((tokens == targets) | (targets == 0)).all(dim=1).int(), "expected a bool tensor"),
    (lambda tokens, targets: ((tokens == targets) | (targets == 0) | (targets == 2)).all(dim=1), "<eos> position was skipped"),
    # the last column is never compared
    (lambda tokens, targets: ((tokens == targets) | (targets == 0))[:, :-1].all(dim=1), "the last column"),
]


@pytest.mark.parametrize(("buggy", "fragment"), MATCH_BUGS)
def test_check_sequence_exact_match_names_the_bug(buggy, fragment):
    with pytest.raises(CheckError) as err:
        check_sequence_exact_match(buggy)
    assert fragment in str(err.value)
    assert_no_answer_in(str(err.value))


def assert_no_code_in(message):
    """Notebook 02's checkers name the bug in words: no indexing, operator or call that fixes it."""
    learner_line = message.split("look at ", 1)[1].split("\n", 1)[0] if "look at " in message else ""
    message = message.replace(learner_line, "")  # a raised error quotes the learner's own line, which may hold any code
    for code in ("[:, None", "None, :]", "[:, :, None]", "unsqueeze", "squeeze", "@ v", "@ W", "bmm", "einsum",
                 ".sum(", "dim=", "masked_fill", "-inf", "q_proj[", "query[b]", "keys[b", ".T"):
        assert code not in message, f"{code!r} in {message!r}"


ADDITIVE_BUGS = [
    (lambda q, k, v: (q[:, None, :] + k) @ v, {}, "the tanh is missing"),
    (lambda q, k, v: torch.tanh((q[:, None, :] + k) @ v), {}, "tanh was applied after v_a"),
    (lambda q, k, v: torch.tanh(q[:, None, :] + k).sum(-1), {}, "summed over A instead of weighted by v_a"),
    (lambda q, k, v: torch.softmax(torch.tanh(q[:, None, :] + k) @ v, -1), {}, "these are weights, not scores"),
    (lambda q, k, v: torch.tanh(q[:, None, :] + k), {}, "not reduced with v_a"),
    (lambda q, k, v: torch.tanh(q + k) @ v, {}, "every source position of its own sequence"),  # B != S: raises
    (lambda q, k, v: torch.tanh(q + k) @ v, {"B": 4, "S": 4}, "query was not broadcast"),  # B == S: silent
    (lambda q, k, v: (torch.tanh(q[:, None, :] + k) @ v)[:, :, None], {}, "one size-1 axis too many"),
]


@pytest.mark.parametrize(("buggy", "kwargs", "fragment"), ADDITIVE_BUGS)
def test_check_additive_scores_names_the_bug(buggy, kwargs, fragment):
    with pytest.raises(CheckError) as err:
        check_additive_scores(buggy, **kwargs)
    assert fragment in str(err.value)
    assert_no_code_in(str(err.value))


def _attend_wrong_dim(scores, values, mask):
    weights = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=0).nan_to_num(0.0)
    return (weights[:, None, :] @ values)[:, 0], weights


def _attend_no_mask(scores, values, mask):
    weights = torch.softmax(scores, dim=-1)
    return (weights[:, None, :] @ values)[:, 0], weights


def _attend_swapped(scores, values, mask):
    context, weights = scorers.attend(scores, values, mask)
    return weights, context


def _attend_unsummed(scores, values, mask):
    _, weights = scorers.attend(scores, values, mask)
    return weights[:, :, None] * values, weights


ATTEND_BUGS = [
    (_attend_wrong_dim, "ran over the batch"),
    (_attend_no_mask, "padding was not masked"),
    (lambda s, v, m: scorers.attend(s, v, ~m), "the mask is inverted"),
    (_attend_swapped, "wrong order"),
    (_attend_unsummed, "not yet summed over the source positions"),
    (lambda s, v, m: (v.mean(1), scorers.attend(s, v, m)[1]), "averages the values uniformly"),
    (lambda s, v, m: scorers.attend(s, v, m)[0], "to return a tuple (context, weights)"),
]


@pytest.mark.parametrize(("buggy", "fragment"), ATTEND_BUGS)
def test_check_attend_names_the_bug(buggy, fragment):
    with pytest.raises(CheckError) as err:
        check_attend(buggy)
    assert fragment in str(err.value)
    assert_no_code_in(str(err.value))


BILINEAR_BUGS = [
    (lambda q, k, W: scorers.bilinear_scores(q, k, W.T), {"R": 4, "Dk": 4}, "W is transposed"),
    (lambda q, k, W: (k @ q[:, :, None])[:, :, 0], {"R": 4, "Dk": 4}, "W was left out"),
    (lambda q, k, W: k @ (q @ W)[:, :, None], {}, "one size-1 axis too many"),
    (lambda q, k, W: (q @ W) @ k.transpose(-2, -1), {}, "every query was scored against the keys of every sequence"),
    (lambda q, k, W: k * (q @ W)[:, None, :], {}, "not summed over Dk"),
    (lambda q, k, W: k @ (W @ q), {}, "raised RuntimeError"),
]


@pytest.mark.parametrize(("buggy", "kwargs", "fragment"), BILINEAR_BUGS)
def test_check_bilinear_scores_names_the_bug(buggy, kwargs, fragment):
    with pytest.raises(CheckError) as err:
        check_bilinear_scores(buggy, **kwargs)
    assert fragment in str(err.value)
    assert_no_code_in(str(err.value))


def _step_variant(query_after_update=False, mask=True, return_old_state=False, swap_inputs=False, values="states"):
    """AttentionDecoder.step with one deliberate change (notebook 02's common pitfalls)."""

    def step(self, y_prev, state, enc_states, keys, mask_):
        emb = self.embedding(y_prev)
        if query_after_update:  # Luong's order: the GRU first (with no context yet), then the query
            new_state = self.cell(torch.cat([emb, torch.zeros_like(enc_states[:, 0])], dim=-1), state)
            context, weights = scorers.attend(self.scorer.score(new_state, keys), enc_states, mask_)
            return new_state, context, emb, weights
        context, weights = scorers.attend(self.scorer.score(state, keys), enc_states if values == "states" else keys,
                                          mask_ if mask else None)
        parts = [context, emb] if swap_inputs else [emb, context]
        new_state = self.cell(torch.cat(parts, dim=-1), state)
        return (state if return_old_state else new_state), context, emb, weights

    return step


STEP_BUGS = [
    (_step_variant(mask=False), "the mask was not passed to attend"),
    (_step_variant(query_after_update=True), "queries with s_{i-1}"),
    (_step_variant(return_old_state=True), "the step returned s_{i-1}"),
    (_step_variant(swap_inputs=True), "are swapped"),
    (_step_variant(values="keys"), "not the projected keys"),
    (lambda self, *args: seq2seq.AttentionDecoder.step(self, *args)[:3], "a tuple (state, context, emb, weights)"),
]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_check_attention_step_accepts_the_reference(seed, capsys):
    check_attention_step(seq2seq.AttentionDecoder.step, seed=seed)
    check_attention_step(seq2seq.AttentionDecoder.step, seed=seed, B=1, S=1)
    check_attention_step(_step_variant(), seed=seed)  # the helper itself, unchanged, is right
    assert capsys.readouterr().out.count("all checks passed") == 3


@pytest.mark.parametrize(("buggy", "fragment"), STEP_BUGS)
def test_check_attention_step_names_the_bug(buggy, fragment):
    with pytest.raises(CheckError) as err:
        check_attention_step(buggy)
    assert fragment in str(err.value)
    assert_no_code_in(str(err.value))


def test_check_attention_step_leaves_the_global_random_state_alone():
    torch.manual_seed(123)
    before = torch.random.get_rng_state()
    check_attention_step(seq2seq.AttentionDecoder.step)
    assert torch.equal(torch.random.get_rng_state(), before)


# --- notebooks 03 and 04 ------------------------------------------------------

import math  # noqa: E402
import re  # noqa: E402

from course_utils.checks import (  # noqa: E402
    WORKED_EXAMPLE_WRONG,
    check_attention_entropy,
    check_attention_scale,
    check_scaled_dot_product_attention,
    check_scaled_scores,
    check_spot_the_error,
    explain_worked_example,
)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_self_attention_checkers_accept_the_reference(seed, capsys):
    check_scaled_dot_product_attention(attention.scaled_dot_product_attention, seed=seed)
    check_scaled_dot_product_attention(attention.scaled_dot_product_attention, seed=seed, B=1, H=1, T=2, S=3, Dk=4, Dv=5)
    check_attention_entropy(attention.attention_entropy, seed=seed)
    check_scaled_scores(attention.scaled_scores, seed=seed)
    check_spot_the_error(set(WORKED_EXAMPLE_WRONG))
    check_spot_the_error(sorted(WORKED_EXAMPLE_WRONG))  # any iterable of the numbers
    assert capsys.readouterr().out.count("all checks passed") == 6


def _sdpa(scale_fn=None, dim=-1, weights_fn=None, mask_fn=None, order=None):
    """A scaled dot-product attention with one deliberate mistake."""

    def fn(q, k, v, mask=None, scale=None):
        s = q @ k.transpose(-2, -1)
        s = s * (scale_fn(q, k, v) if scale_fn else (scale if scale is not None else q.shape[-1] ** -0.5))
        m = mask_fn(mask) if mask_fn and mask is not None else mask
        if weights_fn:
            w = weights_fn(s, m)
        else:
            w = torch.softmax(s if m is None else s.masked_fill(~m, float("-inf")), dim=dim).nan_to_num(0.0)
        out = w @ v
        return (w, out) if order == "swapped" else (out, w)

    return fn


def _sdpa_transposed(q, k, v, mask=None, scale=None):
    w = torch.softmax(k @ q.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1)
    return w.transpose(-2, -1) @ v, w


def _sdpa_nan(q, k, v, mask=None, scale=None):
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    w = torch.softmax(s if mask is None else s.masked_fill(~mask, float("-inf")), dim=-1)
    return w @ v, w


def _sdpa_inplace(q, k, v, mask=None, scale=None):
    q.mul_(1.0)
    q[0, 0, 0, 0] += 1
    return attention.scaled_dot_product_attention(q, k, v, mask, scale)


SDPA_BUGS = [
    (_sdpa(scale_fn=lambda q, k, v: 1.0), "were not scaled"),
    (_sdpa(scale_fn=lambda q, k, v: 1 / q.shape[-1]), "not by its square root"),
    (_sdpa(scale_fn=lambda q, k, v: v.shape[-1] ** -0.5), "scaled by sqrt(Dv)"),
    (_sdpa(scale_fn=lambda q, k, v: k.shape[-2] ** -0.5), "scaled by sqrt(S)"),
    (_sdpa(scale_fn=lambda q, k, v: q.shape[-2] ** -0.5), "scaled by sqrt(T)"),
    (_sdpa(scale_fn=lambda q, k, v: q.shape[-1] ** 0.5), "multiplied by sqrt(Dk)"),
    (_sdpa(dim=-2), "the softmax ran over the queries"),
    (_sdpa(mask_fn=lambda m: ~m), "the mask is inverted"),
    (_sdpa(mask_fn=lambda m: None), "the mask was ignored"),
    (_sdpa(weights_fn=lambda s, m: torch.sigmoid(s) * (1 if m is None else m)), "sigmoid"),
    (_sdpa(weights_fn=lambda s, m: torch.exp(s) * (1 if m is None else m)), "without the division by their row sum"),
    (_sdpa(weights_fn=lambda s, m: torch.softmax(s if m is None else s.masked_fill(~m, 0.0), -1)), "set to 0"),
    (_sdpa(weights_fn=lambda s, m: torch.softmax(s, -1) * (1 if m is None else m)), "masked after the softmax"),
    (_sdpa(order="swapped"), "wrong order"),
    (_sdpa_transposed, "did you compute k @ q^T"),
    (_sdpa_nan, "weights are NaN"),
    (_sdpa_inplace, "changed an input in place"),
    (lambda q, k, v, mask=None, scale=None: attention.scaled_dot_product_attention(q, k, v, mask), "`scale` argument was ignored"),
    (lambda q, k, v, mask=None, scale=None: None, "expected a tuple (out, weights), got None"),
    (lambda q, k, v: attention.scaled_dot_product_attention(q, k, v), "raised TypeError"),
    (lambda q, k, v, mask=None, scale=None: (v.sum(-2, keepdim=True).expand(*q.shape[:-1], v.shape[-1]),
                                             attention.scaled_dot_product_attention(q, k, v, mask, scale)[1]),
     "unweighted sum of the values"),
]


@pytest.mark.parametrize(("buggy", "fragment"), SDPA_BUGS)
def test_check_scaled_dot_product_attention_names_the_bug(buggy, fragment):
    with pytest.raises(CheckError) as err:
        check_scaled_dot_product_attention(buggy)
    assert fragment in str(err.value)


@pytest.mark.parametrize(
    ("answer", "fragment"),
    [
        (None, "got None"),
        (3, "expected a set of statement numbers"),
        ({"1"}, "'1' is not a statement number"),
        ({1, 9}, "9 is not a statement number"),
        (set(), "4 of the 8 statements misjudged"),
        (set(WORKED_EXAMPLE_WRONG) - {5}, "1 of the 8 statements misjudged. Look again at\n  the scores and their scale"),
        (set(WORKED_EXAMPLE_WRONG) | {7}, "1 of the 8 statements misjudged. Look again at\n  the weights"),
    ],
)
def test_check_spot_the_error_names_the_mistake(answer, fragment):
    with pytest.raises(CheckError) as err:
        check_spot_the_error(answer)
    assert fragment in str(err.value)


def test_check_spot_the_error_does_not_reveal_the_key():
    """Over all 256 answers, the message depends only on how many statements are misjudged in each topic.

    Every topic holds one wrong and one right statement, so an answer that misses the wrong one and an
    answer that flags the right one get the same message: no message says which statements are wrong.
    """
    import itertools
    import re

    from course_utils.checks.self_attention import _TOPICS, WORKED_EXAMPLE_STATEMENTS

    assert sorted(n for members in _TOPICS.values() for n in members) == sorted(WORKED_EXAMPLE_STATEMENTS)
    assert all(len(set(members) & WORKED_EXAMPLE_WRONG) == 1 and len(members) == 2 for members in _TOPICS.values())
    by_pattern: dict[tuple[int, ...], set[str]] = {}
    for size in range(9):
        for answer in itertools.combinations(range(1, 9), size):
            misjudged = set(answer) ^ WORKED_EXAMPLE_WRONG
            try:
                check_spot_the_error(set(answer))
                message = "passed"
            except CheckError as err:
                message = str(err)
            assert not re.search(r"statement \d", message), message
            assert not any(text in message for text in WORKED_EXAMPLE_STATEMENTS.values()), message
            pattern = tuple(len(misjudged & set(members)) for members in _TOPICS.values())
            by_pattern.setdefault(pattern, set()).add(message)
    assert all(len(messages) == 1 for messages in by_pattern.values()), "a message depends on more than the topics"
    with pytest.raises(CheckError) as missed_one:
        check_spot_the_error(set(WORKED_EXAMPLE_WRONG) - {4})  # the wrong statement of a topic not flagged ...
    with pytest.raises(CheckError) as flagged_one:
        check_spot_the_error(set(WORKED_EXAMPLE_WRONG) | {7})  # ... or its right statement flagged: one message
    assert str(missed_one.value) == str(flagged_one.value)


def test_worked_example_explanation_covers_every_statement():
    lines = explain_worked_example().splitlines()
    assert len(lines) == 8 and sum("**wrong**" in line for line in lines) == len(WORKED_EXAMPLE_WRONG)


def assert_no_solution_in_04(message):
    """Notebook 04's checkers name the bug in words: no code of the solution, no technique that fixes it."""
    learner_line = message.split("look at ", 1)[1].split("\n", 1)[0] if "look at " in message else ""
    message = message.replace(learner_line, "")  # a raised error quotes the learner's own line
    for code in ("q.shape[-1]", "clamp", "xlogy", "finfo", "transpose(-2, -1)", "dim=-1", ".sum(", "1e-30",
                 "/ sqrt(Dh)", "divide by sqrt"):
        assert code not in message, f"{code!r} in {message!r}"
    assert not re.search(r"expected -?\d", message), message  # no entry of the expected answer


ENTROPY_BUGS = [
    (lambda w: -(w * w.log()).sum(-1), "NaN"),
    (lambda w: (w * w.clamp(min=1e-30).log()).sum(-1), "minus sign is missing"),
    (lambda w: -(w * w.clamp(min=1e-30).log2()).sum(-1), "in bits"),
    (lambda w: -(w * w.clamp(min=1e-30).log()).mean(-1), "mean over the keys"),
    (lambda w: -(w * w.clamp(min=1e-30).log()).sum(-2), "you summed over the queries"),
    (lambda w: -(w * w.clamp(min=1e-30).log()), "not yet summed over the keys"),
    (lambda w: -(w * w.clamp(min=1e-30).log()).sum(), "a single number"),
    # the reviewer's two: right values, NaN gradient at the masked keys (the backward pass still takes log 0)
    (lambda w: -torch.nan_to_num(w * torch.log(w)).sum(-1), "gradient with respect to the weights is NaN or inf"),
    (lambda w: -torch.where(w > 0, w * w.log(), torch.zeros_like(w)).sum(-1),
     "gradient with respect to the weights is NaN or inf"),
    (lambda w: -torch.special.xlogy(w, w).sum(-1), "the backward pass still goes through log 0"),
    # right values through NumPy: no gradient at all
    (lambda w: torch.tensor(-(w.detach().numpy() * w.detach().clamp(min=1e-30).log().numpy()).sum(-1)),
     "cut off from autograd"),
    (lambda w: -(w.detach() * w.clamp(min=1e-30).log()).sum(-1), "not the right gradient"),
]


@pytest.mark.parametrize(("buggy", "fragment"), ENTROPY_BUGS)
def test_check_attention_entropy_names_the_bug(buggy, fragment):
    with pytest.raises(CheckError) as err:
        check_attention_entropy(buggy)
    assert fragment in str(err.value)
    assert_no_solution_in_04(str(err.value))


SCALED_SCORE_BUGS = [
    (lambda q, k: q @ k.transpose(-2, -1) / math.sqrt(q.shape[1] * q.shape[-1]), "the model width"),
    (lambda q, k: q @ k.transpose(-2, -1), "were not scaled"),
    (lambda q, k: q @ k.transpose(-2, -1) / q.shape[-1], "not by its square root"),
    (lambda q, k: q @ k.transpose(-2, -1) * math.sqrt(q.shape[-1]), "multiplied by sqrt(Dh)"),
    (lambda q, k: q @ k.transpose(-2, -1) / math.sqrt(q.shape[1]), "the number of heads"),
    (lambda q, k: q @ k.transpose(-2, -1) / math.sqrt(q.shape[2]), "the number of queries"),
    (lambda q, k: k @ q.transpose(-2, -1) / math.sqrt(q.shape[-1]), "did you compute k @ q^T"),
]


SCALED_SCORE_BUGS += [
    # the reviewer's NumPy version: right values, not differentiable
    (lambda q, k: torch.from_numpy(np.matmul(q.detach().numpy(), np.swapaxes(k.detach().numpy(), -1, -2))
                                   / math.sqrt(q.shape[-1])), "cut off from autograd"),
    (lambda q, k: torch.from_numpy(np.matmul(q.numpy(), np.swapaxes(k.numpy(), -1, -2)) / math.sqrt(q.shape[-1])),
     "a detour through NumPy"),
    (lambda q, k: q @ k.detach().transpose(-2, -1) / math.sqrt(q.shape[-1]), "flow back through them to k"),
]


@pytest.mark.parametrize(("buggy", "fragment"), SCALED_SCORE_BUGS)
def test_check_scaled_scores_names_the_bug(buggy, fragment):
    with pytest.raises(CheckError) as err:
        check_scaled_scores(buggy)
    assert fragment in str(err.value)
    assert_no_solution_in_04(str(err.value))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_check_attention_scale_accepts_the_library_and_the_reference(seed, capsys):
    import torch.nn.functional as F

    check_attention_scale(lambda q, k, v: F.scaled_dot_product_attention(q, k, v), seed=seed)
    check_attention_scale(attention.scaled_dot_product_attention, seed=seed)  # returns (out, weights)
    check_attention_scale(lambda q, k, v: F.scaled_dot_product_attention(q, k, v), seed=seed, B=1, H=1, T=2, S=3,
                          Dk=9, Dv=2)
    assert capsys.readouterr().out.count("all checks passed") == 3


def _attention_with(scale_fn=None, after=1.0, naive=False):
    """Attention with one deliberate change of scale (notebook 04's common pitfalls)."""

    def fn(q, k, v):
        scores = q @ k.transpose(-2, -1) * (scale_fn(q) if scale_fn else q.shape[-1] ** -0.5)
        if naive:
            weights = torch.exp(scores) / torch.exp(scores).sum(dim=-1, keepdim=True)
        else:
            weights = torch.softmax(scores, dim=-1)
        return weights * after @ v

    return fn


ATTENTION_SCALE_BUGS = [
    (_attention_with(lambda q: 1 / q.shape[-1]), "scaled twice"),
    (_attention_with(lambda q: q.shape[-1] ** 0.5), "`scale=`"),
    (_attention_with(lambda q: 1.0), "were not scaled"),
    (_attention_with(lambda q: (q.shape[1] * q.shape[-1]) ** -0.5), "model width"),
    (_attention_with(lambda q: 1.0, after=16 ** -0.5), "applied after the softmax"),
    (_attention_with(after=16 ** -0.5), "as well as before"),
    (_attention_with(naive=True), "exp overflows"),
    (lambda q, k, v: None, "got None"),
    (lambda q, k, v: _attention_with()(q, k, v).detach(), "cut off from autograd"),
]


@pytest.mark.parametrize(("buggy", "fragment"), ATTENTION_SCALE_BUGS)
def test_check_attention_scale_names_the_bug(buggy, fragment):
    with pytest.raises(CheckError) as err:
        check_attention_scale(buggy)
    assert fragment in str(err.value)
