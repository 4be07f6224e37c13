"""The checkers accept the reference and reject known-buggy answers with a message naming the bug."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from buggy_answers import CHECKER_ONLY_KINDS, NEW_KINDS
from course_utils.blocks import attention, masks
from course_utils.checks import (
    CheckError,
    call,
    check_close,
    check_masked_softmax,
    check_padding_mask_for,
    check_pairwise_scores,
    check_tensor,
    expect_failure,
)
from helpers import assert_no_answer_in, exercises, graded_test_cell, notebook_namespace, notebook_solution

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
    with pytest.raises(CheckError, match=r"1 of 6 entries differ from the reference, by up to 94; the first is at index "
                                         r"\(1, 2\), where you returned 99\.0000") as err:
        check_close(wrong, expected, name="x")
    assert "5.0" not in str(err.value), "the expected value (an answer-key entry) is never printed"
    # near-equal differences: the message names the first wrong entry in reading order, not the largest, so a
    # last-bit change on another CPU that swaps which difference is largest leaves it unchanged
    tie = expected.clone()
    tie[0, 1] += 0.5
    tie[1, 0] += 0.5 + 1e-6
    with pytest.raises(CheckError, match=r"2 of 6 entries differ from the reference, by up to 0\.5; the first is at "
                                         r"index \(0, 1\)"):
        check_close(tie, expected, name="x")
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
        expect_failure(check_masked_softmax, notebook_solution("00_orientation", "masked_softmax"))
    message = expect_failure(check_masked_softmax, lambda s, m: None)
    assert "got None" in message
    assert "check failed, as it should" in capsys.readouterr().out


# --- exercise checkers: reference passes, every known bug is named ----------


@pytest.mark.parametrize(("stem", "grade_id"), exercises(), ids=[g for _, g in exercises()])
def test_checkers_accept_the_notebook_solution(stem, grade_id, capsys):
    """The instructor's solution passes its graded test cell, visible and hidden tests, as nbgrader runs it."""
    namespace = notebook_namespace(stem, grade_id)
    source = graded_test_cell(stem, grade_id)
    exec(compile(source, f"<{grade_id}_tests>", "exec"), namespace)  # noqa: S102 - the notebook's own test cell
    assert capsys.readouterr().out.count("all checks passed") == source.count("check_") >= 2


def _inplace_mask(lengths, scores):
    lengths.clamp_(max=scores.shape[-1])
    lengths[0] = 0
    return masks.padding_mask_for(lengths, scores)


def _shaped(real, lengths, scores):
    return real.view(len(lengths), *[1] * (scores.dim() - 2), scores.shape[-1])


PADDING_BUGS = [
    (lambda lengths, scores: None, "got None"),
    (lambda lengths, scores: _shaped(torch.arange(scores.shape[-1]) >= lengths[:, None], lengths, scores),
     "True marks the padding"),
    (lambda lengths, scores: _shaped(torch.arange(scores.shape[-1]) <= lengths[:, None], lengths, scores),
     "off by one"),
    (lambda lengths, scores: torch.arange(scores.shape[-1])[None, :] < lengths[:, None], "axes between B and S are missing"),
    (lambda lengths, scores: (torch.arange(scores.shape[-1])[None, :] < lengths[:, None])[:, None, :],
     "its B meets the heads"),
    (lambda lengths, scores: (torch.arange(scores.shape[-1]) < lengths[:, None])[:, :, None],
     "size-1 axis is in the wrong place"),
    (lambda lengths, scores: _shaped(torch.arange(scores.shape[-1]) < lengths[:, None], lengths, scores).expand(
        scores.shape), "full shape of the scores"),
    (lambda lengths, scores: _shaped(torch.arange(scores.shape[-1]) < lengths[:, None], lengths, scores).float(),
     "expected a bool mask"),
    (lambda lengths, scores: torch.arange(scores.shape[-1]) < lengths, "padding_mask_for raised RuntimeError"),
    (_inplace_mask, "changed `lengths` or `scores` in place"),
]


@pytest.mark.parametrize(("buggy", "fragment"), PADDING_BUGS)
def test_check_padding_mask_for_names_the_bug(buggy, fragment):
    with pytest.raises(CheckError) as err:
        check_padding_mask_for(buggy)
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
    check_additive_attention,
    check_attend,
    check_attention_step,
    check_bilinear_scores,
    check_final_states,
    check_sequence_exact_match,
)


NOTEBOOK_01_CODE = ("torch.arange", "lengths - 1]", "lengths[b] - 1", ".all(", "!= pad", "expected -", "expected 0",
                    "expected 1")  # notebook 01's checkers name the bug in words: none of its solution code


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
    assert_no_answer_in(str(err.value), NOTEBOOK_01_CODE)


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
    assert_no_answer_in(str(err.value), NOTEBOOK_01_CODE)


# Notebook 02's checkers name the bug in words: no indexing, operator or call that fixes it.
NOTEBOOK_02_CODE = ("[:, None", "None, :]", "[:, :, None]", "unsqueeze(", "squeeze(1)", "@ v", "@ W", "bmm", "einsum",
                    ".sum(", "dim=", "masked_fill", "-inf", "q_proj[", "query[b]", "keys[b", ".T")


def _not_broadcast(query, projected_keys, values, mask, W_q, v_a):
    """Query b added to source position b of every sequence: raises unless B == S (or B == 1)."""
    weights = attention.masked_softmax(torch.tanh(query @ W_q.T + projected_keys) @ v_a, mask)
    return (weights[:, None, :] @ values)[:, 0], weights


@pytest.mark.parametrize(("kind", "source", "fragment"), NEW_KINDS["additive_attention"],
                         ids=[kind for kind, _, _ in NEW_KINDS["additive_attention"]])
def test_check_additive_attention_names_the_bug_in_words(kind, source, fragment):
    namespace = {"torch": torch}
    exec(source, namespace)  # noqa: S102 - test fixture code
    with pytest.raises(CheckError) as err:
        check_additive_attention(namespace["additive_attention"])
    assert fragment in str(err.value)
    assert_no_answer_in(str(err.value), NOTEBOOK_02_CODE)


def test_check_additive_attention_rejects_a_query_not_broadcast_when_B_equals_S():
    """With B == S (a hidden test's sizes) the query that is not broadcast over the positions raises nothing."""
    with pytest.raises(CheckError, match="query was not broadcast") as err:
        check_additive_attention(_not_broadcast, seed=3, B=4, S=4, R=5, Dk=3, A=5)
    assert_no_answer_in(str(err.value), NOTEBOOK_02_CODE)
    with pytest.raises(CheckError, match="of its own sequence"):
        check_additive_attention(_not_broadcast)  # B != S: it raises, and the message says why


def _another_right_answer(query, projected_keys, values, mask, W_q, v_a):
    q_proj = query @ W_q.T  # (B, A)
    hidden = torch.tanh(q_proj[:, None, :] + projected_keys)  # (B, S, A)
    weights = attention.masked_softmax(hidden @ v_a, mask)  # (B, S)
    return (weights[:, :, None] * values).sum(dim=1), weights  # a sum instead of a batched product: also right


def test_check_additive_attention_passes_a_right_answer_at_the_hidden_tests_sizes(capsys):
    for kwargs in ({}, dict(seed=1, B=5, S=8, R=6, Dk=3, A=2), dict(seed=2, B=1, S=9, R=5, Dk=4, A=7),
                   dict(seed=3, B=4, S=4, R=5, Dk=3, A=5)):
        check_additive_attention(_another_right_answer, **kwargs)
    assert capsys.readouterr().out.count("all checks passed") == 4


def test_the_attention_decoder_and_the_length_experiment_run_on_the_function_they_are_given():
    """Build, then use (notebook 02): the learner's additive_attention is what AdditiveScore.attend calls, and so
    what every step of the attention decoder runs; its scores are those of AdditiveScore.score."""
    calls = []

    def spy(query, projected_keys, values, mask, W_q, v_a):
        calls.append(tuple(projected_keys.shape))
        return scorers.additive_attention(query, projected_keys, values, mask, W_q, v_a)

    query, keys = torch.randn(2, 4), torch.randn(2, 5, 6)
    mask = torch.arange(5)[None, :] < torch.tensor([[5], [2]])  # (B, S)
    torch.manual_seed(0)
    reference = scorers.AdditiveScore(4, 6, 3)
    torch.manual_seed(0)
    given = scorers.AdditiveScore(4, 6, 3, attention=spy)
    want = reference.attend(query, reference.precompute(keys), keys, mask)
    torch.testing.assert_close(given.attend(query, given.precompute(keys), keys, mask), want)
    torch.testing.assert_close(scorers.attend(reference.score(query, reference.precompute(keys)), keys, mask), want)
    assert calls == [(2, 5, 3)]
    decoder = seq2seq.AttentionDecoder(7, 3, 4, 6, given)
    decoder(torch.randint(3, 7, (2, 4)), keys, torch.randn(2, 6), mask)  # 4 teacher-forced steps
    assert len(calls) == 1 + 4
    from course_utils.blocks.seq2seq import Seq2SeqConfig
    from course_utils.experiments.training import run_length_experiment
    with pytest.raises(ValueError, match="only by an attention decoder"):
        run_length_experiment(Seq2SeqConfig(steps=1), decoder="plain", additive_attention=spy)


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
    assert_no_answer_in(str(err.value), NOTEBOOK_02_CODE)


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
    assert_no_answer_in(str(err.value), NOTEBOOK_02_CODE)


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
    assert_no_answer_in(str(err.value), NOTEBOOK_02_CODE)


def test_check_attention_step_leaves_the_global_random_state_alone():
    torch.manual_seed(123)
    before = torch.random.get_rng_state()
    check_attention_step(seq2seq.AttentionDecoder.step)
    assert torch.equal(torch.random.get_rng_state(), before)


# --- notebooks 03 and 04 ------------------------------------------------------

import math  # noqa: E402
import re  # noqa: E402

from course_utils.checks import (  # noqa: E402
    check_attention_entropy,
    check_attention_scale,
    check_head_scale_runs,
    check_scaled_dot_product_attention,
    check_top_keys,
)


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


def test_check_top_keys_accepts_right_answers_written_otherwise(capsys):
    """Notebook 03, exercise 2: the argmax of the scores (the weights' order) and a loop over the sentences pass too."""
    from buggy_answers import _TOP_KEYS

    from course_utils.experiments import embeddings

    def by_scores(x, lengths, W_q=None, W_k=None):
        q = x if W_q is None else x @ W_q
        k = x if W_k is None else x @ W_k
        real = torch.arange(x.shape[1]) < lengths[:, None]  # (B, T)
        top = (q @ k.transpose(-2, -1)).masked_fill(~real[:, None, :], float("-inf")).argmax(dim=-1)
        return torch.where(real, top, -1)

    def per_sentence(x, lengths, W_q=None, W_k=None):
        rows = []
        for sentence, n in zip(x, lengths.tolist()):
            top = torch.full((x.shape[1],), -1)
            if n:
                q = sentence[:n] if W_q is None else sentence[:n] @ W_q
                k = sentence[:n] if W_k is None else sentence[:n] @ W_k
                top[:n] = (q @ k.T).argmax(dim=-1)
            rows.append(top)
        return torch.stack(rows)

    namespace = {"torch": torch}
    exec(_TOP_KEYS, namespace)  # noqa: S102 - test fixture code
    for fn in (by_scores, per_sentence, namespace["top_keys"]):
        for kwargs in ({}, {"seed": 1, "B": 1, "T": 2, "D": 3, "Dk": 5}, {"seed": 2, "B": 4, "T": 7, "D": 5, "Dk": 5}):
            check_top_keys(fn, **kwargs)
    assert capsys.readouterr().out.count("all checks passed") == 9
    assert embeddings.top_keys.__module__ == "course_utils.experiments.embeddings"


def test_check_top_keys_ships_no_answer_key():
    """Issue 35: notebook 03's old exercise 2 had an importable answer key. Its checker now computes every expected
    answer from random inputs: the module holds no tensor and no collection of numbers, and a buggy answer's message
    names the bug without printing a row of the expected keys."""
    from buggy_answers import CHECKER_ONLY_KINDS, NEW_KINDS

    from course_utils.checks import self_attention

    for name, value in vars(self_attention).items():
        assert not isinstance(value, torch.Tensor), f"self_attention.{name} is a stored tensor"
        if isinstance(value, (list, tuple, set, frozenset, dict)) and not name.startswith("__"):
            assert not any(isinstance(item, (int, float)) for item in value), f"self_attention.{name} stores numbers"
    for seed in (0, 3):
        for kind, source, fragment in NEW_KINDS["top_keys"][1:]:
            namespace = {"torch": torch}
            exec(source, namespace)  # noqa: S102 - test fixture code
            with pytest.raises(CheckError) as err:
                check_top_keys(namespace["top_keys"], seed=seed)
            message = str(err.value)
            assert fragment in message, (kind, message)
            assert not re.search(r"tensor\(\[|\[-?\d+, -?\d+, -?\d+, -?\d+", message.split("lengths [")[0]), message


# Notebook 04's checkers name the bug in words: no code of the solution, no technique that fixes it.
NOTEBOOK_04_CODE = ("q.shape[-1]", "clamp", "xlogy", "finfo", "transpose(-2, -1)", "dim=-1", ".sum(", "1e-30",
                    "/ sqrt(Dh)", "divide by sqrt")


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
    assert_no_answer_in(str(err.value), NOTEBOOK_04_CODE)


def _head_runs_written_otherwise(config, H, seed=0):
    """A right answer to notebook 04's exercise 3 written another way: the factors as powers, keyword order changed."""
    from course_utils.experiments.scaling import train_recall

    factors = {"model width": config.Dk ** -0.5, "head width": (config.Dk // H) ** -0.5}
    return {name: train_recall(config, scaled=False, heads=H, scale=factor, seed=seed).losses
            for name, factor in factors.items()}


@pytest.mark.parametrize("sizes", [{}, {"seed": 1, "H": 3, "Dh": 4}, {"seed": 2, "H": 2, "Dh": 9}])
def test_check_head_scale_runs_accepts_a_right_answer_written_otherwise(sizes, capsys):
    check_head_scale_runs(_head_runs_written_otherwise, **sizes)
    assert capsys.readouterr().out.count("all checks passed") == 1


def test_check_head_scale_runs_names_swapped_runs_without_saying_which_trains_faster():
    from buggy_answers import BUGGY

    namespace = {"torch": torch, "math": math}
    exec(BUGGY["04_scaling"]["head_scale_runs"], namespace)  # noqa: S102 - test fixture code
    with pytest.raises(CheckError) as err:
        check_head_scale_runs(namespace["head_scale_runs"])
    message = str(err.value)
    assert "swapped" in message, message
    assert not re.search(r"faster|slower|fewer|more steps", message), message
    assert_no_answer_in(message, solution=("04_scaling", "head_scale_runs"))


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


# --- issue 14: kinds of wrong answers the checkers used to accept ------------------------------------------

import sys  # noqa: E402

import torch.nn.functional as F  # noqa: E402

from course_utils import checks  # noqa: E402
from course_utils.blocks import decoding, gpt, multihead, positional, transformer  # noqa: E402
from course_utils.experiments import efficiency, embeddings, scaling  # noqa: E402

STEM = dict((grade_id, stem) for stem, grade_id in exercises())
FUNCTIONS = list(STEM)  # every exercise writes a function


def test_every_function_exercise_has_new_kinds_of_buggy_answers():
    assert set(NEW_KINDS) == set(FUNCTIONS)
    assert all(any(kind == "calls the reference" for kind, _, _ in kinds) for kinds in NEW_KINDS.values())


_KINDS = [(g, kind, source, fragment) for kinds_of in (NEW_KINDS, CHECKER_ONLY_KINDS)
          for g, kinds in kinds_of.items() for kind, source, fragment in kinds]


@pytest.mark.parametrize(("grade_id", "kind", "source", "fragment"), _KINDS,
                         ids=[f"{g}: {kind}" for g, kind, _, _ in _KINDS])
def test_new_kinds_of_buggy_answers_are_rejected_with_a_message_that_names_the_bug(grade_id, kind, source, fragment):
    """Every exercise's checker, and a checker a notebook runs without an exercise (CHECKER_ONLY_KINDS), names the bug."""
    namespace = {"torch": torch, "math": math, "F": F}
    exec(source, namespace)  # noqa: S102 - test fixture code
    with pytest.raises(CheckError) as err:
        getattr(checks, f"check_{grade_id}")(namespace[grade_id])
    message = str(err.value)
    assert fragment in message, message
    if grade_id in STEM:  # an exercise: its message must not give the notebook's solution away
        assert_no_answer_in(message, solution=(STEM[grade_id], grade_id))
    assert sys.getprofile() is None, "the reference guard left its profile hook behind"


# The course's own function for each exercise's job: a learner must not hand it in, nor call it.
REFERENCES = {
    "padding_mask_for": masks.padding_mask_for,
    "pairwise_scores": attention.pairwise_scores,
    "masked_softmax": attention.masked_softmax,
    "final_states": seq2seq.final_states,
    "sequence_exact_match": training.sequence_exact_match,
    "beam_search": decoding.beam_search,
    "additive_attention": scorers.additive_attention,
    "attend": scorers.attend,
    "bilinear_scores": scorers.bilinear_scores,
    "luong_step": seq2seq.luong_step,
    "scaled_dot_product_attention": attention.scaled_dot_product_attention,
    "top_keys": embeddings.top_keys,
    "attention_entropy": attention.attention_entropy,
    "head_scale_runs": scaling.head_scale_runs,
    "split_heads": multihead.split_heads,
    "merge_heads": multihead.merge_heads,
    "multi_head_attention": multihead.multi_head_attention,
    "sinusoidal_positional_encoding": positional.sinusoidal_positional_encoding,
    "to_rotate_half": positional.to_rotate_half,
    "apply_rotary": positional.apply_rotary,
    "layer_norm": transformer.layer_norm,
    "is_pre_ln": transformer.is_pre_ln,
    "decoder_layer_forward": transformer.decoder_layer_forward,
    "online_softmax_update": efficiency.online_softmax_update,
    "next_token_loss": gpt.next_token_loss,
    "filter_logits": gpt.filter_logits,
    "attend_with_cache": gpt.attend_with_cache,
}


@pytest.mark.parametrize("grade_id", FUNCTIONS)
def test_checkers_reject_the_reference_and_a_function_that_calls_it(grade_id):
    checker, reference = getattr(checks, f"check_{grade_id}"), REFERENCES[grade_id]
    dotted = f"`{reference.__module__}.{reference.__qualname__}`"
    with pytest.raises(CheckError, match="itself, not your function") as err:
        checker(reference)
    assert dotted in str(err.value)
    with pytest.raises(CheckError, match="calls the course's reference") as err:
        checker(lambda *args: reference(*args))
    assert dotted in str(err.value) and "write it yourself" in str(err.value)
    assert sys.getprofile() is None


def test_a_function_that_calls_the_reference_wrongly_is_told_its_real_bug():
    """The call is reported only when nothing else is wrong: notebook 00's pitfall calls the reference with ~mask."""
    with pytest.raises(CheckError, match="the mask is inverted"):
        check_masked_softmax(lambda scores, mask: attention.masked_softmax(scores, ~mask))


def test_the_reference_guard_leaves_a_running_profiler_alone(capsys):
    def profiler(frame, event, arg):
        return None

    solution = notebook_solution("00_orientation", "masked_softmax")
    sys.setprofile(profiler)
    try:
        check_masked_softmax(solution)
        check_masked_softmax(lambda scores, mask: attention.masked_softmax(scores, mask))  # not watched meanwhile
        assert sys.getprofile() is profiler
    finally:
        sys.setprofile(None)
    assert capsys.readouterr().out.count("all checks passed") == 2


def test_the_reference_guard_sees_through_decorators():
    """Every ``@torch.no_grad()`` wrapper shares one code object: the guard must compare the wrapped functions."""
    from course_utils.checks.core import describe, reference_guard
    from course_utils.checks.core import call as guarded_call

    @torch.no_grad()
    def reference(x):
        return 2 * x

    @torch.no_grad()
    def answer(x):
        return x + x

    with reference_guard(answer, reference):  # a decorated answer is not "the reference itself"
        guarded_call(answer, torch.ones(2))
    with pytest.raises(CheckError, match="itself, not your function"):
        with reference_guard(torch.no_grad()(reference.__wrapped__), reference):
            pass
    with pytest.raises(CheckError, match="calls the course's reference"):
        with reference_guard(lambda x: reference(x), reference):
            guarded_call(lambda x: reference(x), torch.ones(2))
    assert describe(torch.nn.Linear(2, 3)) == "a Linear module"  # one line, not the module's repr


# --- notebook 02, exercise 4: Luong's decoder step -------------------------------------------------

from course_utils.checks import check_luong_step  # noqa: E402


def _luong_variant(**change):
    """seq2seq.luong_step with one deliberate change; no change gives the reference's values."""

    def step(emb, state, enc_states, projected_keys, mask, cell, score, W_c):
        new = cell(emb, state)  # s_i
        query = state if change.get("query") == "old" else new
        keys = enc_states if change.get("keys") == "values" else projected_keys
        context, weights = scorers.attend(score(query, keys), enc_states, mask)
        attentional = torch.tanh(torch.cat([context, new], dim=-1) @ W_c.T)
        if change.get("order") == "attentional second":
            return new, attentional, context, weights
        return new, context, attentional, weights

    return step


@pytest.mark.parametrize(("score", "sizes"), [("additive", {}), ("concat", {"R": 3, "Dk": 9}),
                                              ("bilinear", {"B": 4, "S": 4, "R": 5, "Dk": 5}),
                                              ("dot", {"B": 1, "S": 7, "R": 6, "Dk": 6}), ("additive", {"S": 1})])
def test_check_luong_step_accepts_the_reference_with_every_scorer(score, sizes, capsys):
    check_luong_step(_luong_variant(), score=score, **sizes)  # the helper itself, unchanged, is right
    check_luong_step(notebook_solution("02_bahdanau_attention", "luong_step"), seed=1, score=score, **sizes)
    assert capsys.readouterr().out.count("all checks passed") == 2


@pytest.mark.parametrize("score", ["additive", "bilinear"])
def test_check_luong_step_names_bahdanaus_order(score):
    """The bug the exercise is about: querying with s_{i-1}, as section 4's decoder does."""
    with pytest.raises(CheckError, match="Bahdanau's order") as err:
        check_luong_step(_luong_variant(query="old"), score=score)
    assert_no_answer_in(str(err.value), solution=("02_bahdanau_attention", "luong_step"))


def test_check_luong_step_names_scores_against_the_values_when_the_widths_allow_it():
    with pytest.raises(CheckError, match="computed from enc_states, not from the keys handed in"):
        check_luong_step(_luong_variant(keys="values"), score="bilinear")


def test_check_luong_step_names_outputs_in_the_wrong_order():
    with pytest.raises(CheckError, match="wrong order"):
        check_luong_step(_luong_variant(order="attentional second"))  # R != Dk: caught by the shapes
    with pytest.raises(CheckError, match="this is the attentional state"):
        check_luong_step(_luong_variant(order="attentional second"), R=5, Dk=5)  # equal widths: by the values


def test_check_luong_step_refuses_a_dot_score_of_unequal_widths_and_leaves_the_random_state_alone():
    with pytest.raises(ValueError, match="R == Dk"):
        check_luong_step(_luong_variant(), score="dot", R=4, Dk=6)
    torch.manual_seed(123)
    before = torch.random.get_rng_state()
    check_luong_step(_luong_variant())
    assert torch.equal(torch.random.get_rng_state(), before)


# --- notebook 09, exercise 2: causal attention in tiles --------------------------------------------------------

from course_utils.checks import check_causal_tiled_attention  # noqa: E402

REFERENCES["causal_tiled_attention"] = efficiency.causal_tiled_attention


def _causal_by_strips(q, k, v, block_size):
    """Right values, but not what the exercise asks (issue 34): one ordinary softmax per query block over all the keys
    up to the end of the block, no key tiles, no online softmax, and the tile count by arithmetic."""
    T, outs = q.shape[-2], []
    for start in range(0, T, block_size):
        q_block = q[..., start:start + block_size, :]
        end = start + q_block.shape[-2]
        scores = q_block @ k[..., :end, :].transpose(-2, -1) / math.sqrt(q.shape[-1])  # (..., Cq, end)
        later = torch.arange(end)[None, :] > torch.arange(start, end)[:, None]  # (Cq, end)
        outs.append(torch.softmax(scores.masked_fill(later, float("-inf")), dim=-1) @ v[..., :end, :])
    n = len(outs)
    return torch.cat(outs, dim=-2), n * (n + 1) // 2


def _causal_into_one_output(q, k, v, block_size):
    """Right, written another way: the blocks written into one output tensor, the diagonal mask from triu."""
    T = q.shape[-2]
    out = torch.zeros(*q.shape[:-1], v.shape[-1])
    tiles = 0
    for start in range(0, T, block_size):
        q_block = q[..., start:start + block_size, :]
        Cq = q_block.shape[-2]
        m = torch.full((*q_block.shape[:-1], 1), float("-inf"))
        l, acc = torch.zeros_like(m), torch.zeros(*q_block.shape[:-1], v.shape[-1])
        for k_start in range(0, start + 1, block_size):
            scores = torch.einsum("...id,...jd->...ij", q_block, k[..., k_start:k_start + block_size, :])
            scores = scores * q.shape[-1] ** -0.5
            if k_start == start:
                scores = scores.masked_fill(torch.ones(Cq, Cq, dtype=torch.bool).triu(1), float("-inf"))
            m, l, acc = efficiency.online_softmax_update(m, l, acc, scores, v[..., k_start:k_start + block_size, :])
            tiles += 1
        out[..., start:start + Cq, :] = acc / l
    return out, tiles


@pytest.mark.parametrize("answer", [_causal_into_one_output])
def test_check_causal_tiled_attention_accepts_right_answers_written_another_way(answer, capsys):
    check_causal_tiled_attention(answer)
    check_causal_tiled_attention(answer, seed=1, B=1, H=2, T=7, Dk=3, Dv=4, block_size=3)
    assert capsys.readouterr().out.count("all checks passed") == 2


def _causal_by_strips_by_hand(q, k, v, block_size):
    """As _causal_by_strips, with the softmax written out as e ** (scores - max) (issue 37): no call of exp or
    softmax sees the scores, so only the width of the score products tells."""
    T, outs = q.shape[-2], []
    for start in range(0, T, block_size):
        q_block = q[..., start:start + block_size, :]
        end = start + q_block.shape[-2]
        scores = q_block @ k[..., :end, :].transpose(-2, -1) / math.sqrt(q.shape[-1])  # (..., Cq, end)
        later = torch.arange(end)[None, :] > torch.arange(start, end)[:, None]  # (Cq, end)
        scores = scores.masked_fill(later, float("-inf"))
        e = math.e ** (scores - scores.amax(dim=-1, keepdim=True))  # (..., Cq, end)
        outs.append(e / e.sum(dim=-1, keepdim=True) @ v[..., :end, :])
    n = len(outs)
    return torch.cat(outs, dim=-2), n * (n + 1) // 2


@pytest.mark.parametrize("answer", [_causal_by_strips, _causal_by_strips_by_hand])
@pytest.mark.parametrize("kwargs", [{}, {"seed": 1, "B": 1, "H": 2, "T": 7, "Dk": 3, "Dv": 4, "block_size": 3},
                                    {"seed": 2, "B": 3, "H": 1, "T": 16, "Dk": 8, "Dv": 2, "block_size": 5}])
def test_check_causal_tiled_attention_rejects_one_softmax_per_query_block(kwargs, answer):
    """Issues 34 and 37: the visible check and both hidden tests passed them; each one now names what is missing."""
    with pytest.raises(CheckError, match="a score tile wider than C") as err:
        check_causal_tiled_attention(answer, **kwargs)
    assert "works for" not in str(err.value)  # caught at the sizes asked for
    assert_no_answer_in(str(err.value), solution=("09_attention_at_scale", "causal_tiled_attention"))


def test_check_causal_tiled_attention_measures_the_work_not_only_the_values():
    """Every tile computed and the upper ones masked gives the right out and the right count: the multiply-adds tell."""
    def every_tile(q, k, v, block_size):
        T, outs = q.shape[-2], []
        for start in range(0, T, block_size):  # each query block against every key, the later ones masked
            q_block = q[..., start:start + block_size, :]
            scores = q_block @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (..., Cq, T)
            later = torch.arange(T)[None, :] > torch.arange(start, start + q_block.shape[-2])[:, None]  # (Cq, T)
            outs.append(torch.softmax(scores.masked_fill(later, float("-inf")), dim=-1) @ v)
        n = len(outs)
        return torch.cat(outs, dim=-2), n * (n + 1) // 2

    with pytest.raises(CheckError, match="times the multiply-adds of the tiles at or below the diagonal") as err:
        check_causal_tiled_attention(every_tile)
    assert "works for" not in str(err.value)  # caught at the sizes asked for, before any other shape
    assert sys.getprofile() is None


# --- notebook 07, exercise 3: PyTorch's decoder layer, computed from its saved weights --------------------------

from buggy_answers import _DECODER_LAYER, _LAST_LINE  # noqa: E402
from course_utils.checks import check_decoder_layer_forward  # noqa: E402


@pytest.fixture
def one_thread():
    """One intra-op thread, as setup() gives every notebook: tiny tensors are slow with two threads on a busy CPU."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _own_attention_decoder(state, x, memory, memory_mask, num_heads, norm_first, activation="relu"):
    """Another right answer: the heads, the attention and the LayerNorms written out with PyTorch's functions."""
    D, H = x.shape[-1], num_heads

    def attend(name, query, source, mask):
        w, b = state[f"{name}.in_proj_weight"], state[f"{name}.in_proj_bias"]
        q, k, v = (F.linear(t, w[i * D:(i + 1) * D], b[i * D:(i + 1) * D]) for i, t in enumerate((query, source, source)))
        q, k, v = (t.view(t.shape[0], t.shape[1], H, D // H).transpose(1, 2) for t in (q, k, v))  # (B, H, len, Dh)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # (B, H, T, Dh)
        return F.linear(out.transpose(1, 2).reshape(query.shape), state[f"{name}.out_proj.weight"],
                        state[f"{name}.out_proj.bias"])

    def norm(name, h):
        return F.layer_norm(h, (D,), state[f"{name}.weight"], state[f"{name}.bias"])

    def ffn(h):
        hidden = F.linear(h, state["linear1.weight"], state["linear1.bias"])
        return F.linear(F.gelu(hidden) if activation == "gelu" else F.relu(hidden), state["linear2.weight"],
                        state["linear2.bias"])

    causal = torch.ones(x.shape[1], x.shape[1], dtype=torch.bool).tril()
    pad = None if memory_mask is None else memory_mask[:, None]
    if norm_first:
        x = x + attend("self_attn", norm("norm1", x), norm("norm1", x), causal)
        x = x + attend("multihead_attn", norm("norm2", x), memory, pad)
        return x + ffn(norm("norm3", x))
    x = norm("norm1", x + attend("self_attn", x, x, causal))
    x = norm("norm2", x + attend("multihead_attn", x, memory, pad))
    return norm("norm3", x + ffn(x))


def _loaded_into_our_block(state, x, memory, memory_mask, num_heads, norm_first, activation="relu"):
    """Another right answer: section 6's decoder block, with the saved weights renamed and loaded by hand."""
    D = x.shape[-1]
    ours = transformer.TransformerDecoderBlock(D, num_heads, state["linear1.weight"].shape[0], norm_first=norm_first,
                                               activation=activation)
    renamed = {}
    for theirs, mine in (("self_attn", "self_attn"), ("multihead_attn", "cross_attn")):
        for i, proj in enumerate(("q_proj", "k_proj", "v_proj")):
            renamed[f"{mine}.{proj}.weight"] = state[f"{theirs}.in_proj_weight"][i * D:(i + 1) * D]
            renamed[f"{mine}.{proj}.bias"] = state[f"{theirs}.in_proj_bias"][i * D:(i + 1) * D]
        for part in ("weight", "bias"):
            renamed[f"{mine}.out_proj.{part}"] = state[f"{theirs}.out_proj.{part}"]
    for name, value in state.items():
        if name.startswith(("linear1.", "linear2.")):
            renamed[f"feed_forward.{name}"] = value
        elif name.startswith("norm"):
            renamed[name] = value
    return torch.func.functional_call(ours, renamed, (x, memory, memory_mask))  # gradients reach the saved weights


@pytest.mark.parametrize("answer", ["notebook", "own attention", "loaded into our block"])
def test_check_decoder_layer_forward_accepts_right_answers_and_keeps_the_random_state(answer, one_thread, capsys):
    fn = {"notebook": notebook_solution("07_transformer_block", "decoder_layer_forward"),
          "own attention": _own_attention_decoder, "loaded into our block": _loaded_into_our_block}[answer]
    torch.manual_seed(123)
    before = torch.random.get_rng_state()
    check_decoder_layer_forward(fn)
    check_decoder_layer_forward(fn, seed=1, B=3, T=6, S=2, D=12, H=3)
    check_decoder_layer_forward(fn, seed=2, B=1, T=5, S=7, D=8, H=1)
    if answer != "loaded into our block":  # that answer builds new modules, which draws random numbers itself
        assert torch.equal(torch.random.get_rng_state(), before), "the checker changed the learner's random state"
    assert capsys.readouterr().out.count("all checks passed") == 3


def _projections(source: str, q: str, k: str, v: str) -> str:
    """The answer with other projection functions (each a function of h, from w_q, b_q, ...)."""
    return (source.replace("lambda h: F.linear(h, w_q, b_q)", f"lambda h: {q}")
            .replace("lambda h: F.linear(h, w_k, b_k)", f"lambda h: {k}")
            .replace("lambda h: F.linear(h, w_v, b_v)", f"lambda h: {v}"))


DECODER_LAYER_BUGS = [
    ("no causal mask", _DECODER_LAYER.replace("h, h, causal)", "h, h, None)"), "is causal"),
    ("causal mask flipped", _DECODER_LAYER.replace("h, h, causal)", "h, h, ~causal)"), "causal mask is flipped"),
    ("memory_mask ignored", _DECODER_LAYER.replace("memory, cross_mask)", "memory, None)"), "padded source positions"),
    ("memory_mask flipped", _DECODER_LAYER.replace("memory, cross_mask)", "memory, None if cross_mask is None else ~cross_mask)"),
     "memory_mask is flipped"),
    ("queries and keys swapped", _DECODER_LAYER.replace("w_q, w_k, w_v =", "w_k, w_q, w_v =").replace("b_q, b_k, b_v =", "b_k, b_q, b_v ="),
     "the queries and the keys were projected with each other's block"),
    ("keys and values swapped", _DECODER_LAYER.replace("w_q, w_k, w_v =", "w_q, w_v, w_k =").replace("b_q, b_k, b_v =", "b_q, b_v, b_k ="),
     "the keys and the values were projected with each other's block"),
    ("queries and values swapped", _DECODER_LAYER.replace("w_q, w_k, w_v =", "w_v, w_k, w_q =").replace("b_q, b_k, b_v =", "b_v, b_k, b_q ="),
     "the queries and the values were projected with each other's block"),
    ("weights not transposed", _projections(_DECODER_LAYER, "h @ w_q + b_q", "h @ w_k + b_k", "h @ w_v + b_v"), "(out, in)"),
    ("no in_proj_bias", _projections(_DECODER_LAYER, "F.linear(h, w_q)", "F.linear(h, w_k)", "F.linear(h, w_v)"),
     "in_proj_bias is missing"),
    ("always post-LN", _DECODER_LAYER.replace(", norm_first)", ", False)"), "so it is pre-LN"),
    ("always pre-LN", _DECODER_LAYER.replace(", norm_first)", ", True)"), "so it is post-LN"),
    ("cross-attention over the target", _DECODER_LAYER.replace("h, memory, cross_mask)", "h, h, None)"), "target again"),
    ("no output projection", _DECODER_LAYER.replace("linear(name + '.out_proj'),", "lambda h: h,"), "out_proj) is missing"),
    ("ReLU for every layer", _DECODER_LAYER.replace("act(linear", "F.relu(linear"), "activation is GELU"),
    ("scores scaled by the model width", _DECODER_LAYER.replace(
        "    def attend(name, query, source, mask):\n",
        "    def multi_head_attention(query, key, value, q_proj, k_proj, v_proj, out_proj, H, mask):\n"
        "        from course_utils.blocks.attention import scaled_dot_product_attention\n"
        "        from course_utils.blocks.multihead import merge_heads, split_heads\n"
        "        q, k, v = (split_heads(p(t), H) for p, t in ((q_proj, query), (k_proj, key), (v_proj, value)))\n"
        "        context, weights = scaled_dot_product_attention(q, k, v, mask, scale=query.shape[-1] ** -0.5)\n"
        "        return out_proj(merge_heads(context)), weights\n"
        "    def attend(name, query, source, mask):\n"), "1/sqrt(D), D the model width"),
    ("x changed in place", _DECODER_LAYER.replace("    causal = causal_mask(x.shape[1])\n",
                                                  "    causal = causal_mask(x.shape[1])\n    x.add_(1.0).sub_(1.0)\n"
                                                  "    x.mul_(2.0)\n    x = x / 2.0\n"), "in place"),
    ("the weights changed", _DECODER_LAYER.replace("    causal = causal_mask(x.shape[1])\n",
                                                   "    causal = causal_mask(x.shape[1])\n"
                                                   "    state['norm1.bias'].data.mul_(0.5)\n"), "changed the weights in state"),
    ("the memory's length taken from x", _DECODER_LAYER.replace(
        "cross_mask = None if memory_mask is None else memory_mask[:, None]",
        "cross_mask = None if memory_mask is None else memory_mask[:, None, :, :x.shape[1]]"), "memory has its own length S"),
]


@pytest.mark.parametrize(("kind", "source", "fragment"), DECODER_LAYER_BUGS, ids=[kind for kind, _, _ in DECODER_LAYER_BUGS])
def test_check_decoder_layer_forward_names_the_bug(kind, source, fragment, one_thread):
    namespace = {"torch": torch, "math": math, "F": F}
    exec(source, namespace)  # noqa: S102 - test fixture code
    with pytest.raises(CheckError) as err:
        check_decoder_layer_forward(namespace["decoder_layer_forward"])
    message = str(err.value)
    assert fragment in message, message
    assert_no_answer_in(message, solution=("07_transformer_block", "decoder_layer_forward"))
    assert sys.getprofile() is None


@pytest.mark.parametrize(("stray", "fragment"), [
    ("from course_utils.blocks.transformer import TransformerDecoderBlock, block_from_torch\n"
     "    block_from_torch(torch.nn.TransformerDecoderLayer(8, 2, 16, batch_first=True), TransformerDecoderBlock)\n",
     "block_from_torch"),
    ("from course_utils.blocks.multihead import MultiHeadAttention\n"
     "    MultiHeadAttention.from_torch(torch.nn.MultiheadAttention(8, 2, batch_first=True))\n", "MultiHeadAttention.from_torch"),
])
def test_check_decoder_layer_forward_rejects_the_weight_copying_helpers(stray, fragment, one_thread):
    """Their copies cut the gradient, so a right answer that calls them at all is what reaches the guard."""
    source = _DECODER_LAYER.replace("    causal = causal_mask(x.shape[1])\n", f"    {stray}    causal = causal_mask(x.shape[1])\n")
    namespace = {"torch": torch, "math": math, "F": F}
    exec(source, namespace)  # noqa: S102 - test fixture code
    with pytest.raises(CheckError, match=f"your function calls {fragment}"):
        check_decoder_layer_forward(namespace["decoder_layer_forward"])


def test_the_buggy_answers_differ_from_the_right_one_only_where_they_say(one_thread):
    """Each buggy answer above is the right one (the checker accepts it) with one change."""
    namespace = {"torch": torch, "math": math, "F": F}
    exec(_DECODER_LAYER, namespace)  # noqa: S102 - test fixture code
    check_decoder_layer_forward(namespace["decoder_layer_forward"])
    assert _LAST_LINE in _DECODER_LAYER
    assert all(source != _DECODER_LAYER for _, source, _ in DECODER_LAYER_BUGS), "a replacement that changed nothing"


# --- notebook 04, exercise 2: a measurement, graded against the reference measurement on the same draws -------

from course_utils.checks import check_saturation_width  # noqa: E402
from course_utils.experiments import scaling as scaling_experiments  # noqa: E402

REFERENCES["saturation_width"] = scaling_experiments.saturation_width  # for the reference-guard test above
from course_utils.experiments import deep_stacks  # noqa: E402

REFERENCES["adam_step"] = deep_stacks.adam_step  # notebook 08

_WIDTH = (
    "def saturation_width(Dks, S, T, generator, threshold=0.9):\n"
    "    for Dk in Dks:\n"
    "        q = torch.randn(T, Dk, generator=generator)\n"
    "        k = torch.randn(S, Dk, generator=generator)\n"
    "        weights = torch.softmax(q @ k.T, dim=-1)\n"
    "        if weights.amax(dim=-1).mean() > threshold:\n"
    "            return Dk\n"
    "    return None\n"
)
_Q = "        q = torch.randn(T, Dk, generator=generator)\n"
_K = "        k = torch.randn(S, Dk, generator=generator)\n"


def _width_source(*replacements: tuple[str, str]) -> str:
    source = _WIDTH
    for old, new in replacements:
        assert old in source, old
        source = source.replace(old, new)
    return source


SATURATION_WIDTH_BUGS = [
    (_width_source(("q @ k.T", "q @ k.T / math.sqrt(Dk)")), "divided by sqrt(Dk)"),
    (_width_source((_Q + _K, _K + _Q)), "drawn before the queries"),
    (_width_source(("generator=generator)", "generator=generator, dtype=torch.float64)")), "float64"),
    (_width_source((_K, "        k = torch.randn(T, S, Dk, generator=generator)\n"),
                   ("torch.softmax(q @ k.T", "torch.softmax((q[:, None, :] * k).sum(-1)")), "keys of its own"),
    (_width_source(("dim=-1)\n", "dim=0)\n")), "over the queries"),
    (_width_source((".mean()", ".median()")), "median"),
    (_width_source(("weights.amax(dim=-1).mean()", "weights.max()")), "single largest weight of all queries"),
    (_width_source(("> threshold", ">= threshold")), "not `>=`"),
    (_width_source(("> threshold", "> 0.9")), "threshold passed in was not used"),
    (_width_source(("torch.softmax(q @ k.T, dim=-1)", "(q @ k.T).exp() / (q @ k.T).exp().sum(-1, keepdim=True)")),
     "overflowed"),
    (_width_source(("generator=generator", "")), "drew no numbers from `generator`"),
    (_width_source(("            return Dk\n", "            passing.append(Dk)\n"),
                   ("    for Dk in Dks:\n", "    passing = []\n    for Dk in Dks:\n"),
                   ("    return None\n", "    return passing[-1] if passing else None\n")), "the last width that passes"),
    (_width_source(("            return Dk\n", "            passing.append(Dk)\n"),
                   ("    for Dk in Dks:\n", "    passing = []\n    for Dk in Dks:\n"),
                   ("    return None\n", "    return passing[0] if passing else None\n")), "went on drawing"),
    (_width_source(("            return Dk\n", "            return before\n        before = Dk\n"),
                   ("    for Dk in Dks:\n", "    before = None\n    for Dk in Dks:\n")), "off by one width"),
    (_width_source(("return Dk", "return torch.tensor(Dk)")), "return the width itself"),
    (_width_source(("return Dk", "return weights.amax(dim=-1).mean().item()")), "returned a float"),
    (_width_source(("for Dk in Dks:", "for i, Dk in enumerate(Dks):"), ("return Dk", "return i")), "a position in Dks"),
    (_width_source(("    for Dk in Dks:\n", "    Dks.sort(reverse=True)\n    for Dk in Dks:\n")), "in place"),
    (_width_source(("    for Dk in Dks:\n", "    generator.manual_seed(0)\n    for Dk in Dks:\n")),
     "none of the usual mistakes"),
    (_width_source(("q @ k.T, dim=-1)", "(q @ k.T).squeeze(), dim=-1)")), "S = 1 key"),
    ("def saturation_width(Dks, S, T, generator, threshold=0.9):\n    raise NotImplementedError()\n", "not written yet"),
]


@pytest.mark.parametrize(("source", "fragment"), SATURATION_WIDTH_BUGS)
def test_check_saturation_width_names_the_bug(source, fragment):
    namespace = {"torch": torch, "math": math}
    exec(source, namespace)  # noqa: S102 - test fixture code
    for seed, S, T in [(0, 16, 48), (1, 5, 33), (2, 50, 7)]:  # the notebook's visible and hidden tests
        with pytest.raises(CheckError) as err:
            check_saturation_width(namespace["saturation_width"], seed=seed, S=S, T=T)
        message = str(err.value)
        assert fragment in message, message
        assert_no_answer_in(message, solution=("04_scaling", "saturation_width"))


@pytest.mark.parametrize("seed", range(6))
def test_check_saturation_width_accepts_the_reference_measurement_written_otherwise(seed, capsys):
    """Other code for the same draws and the same statistic passes: the scores as k @ q^T, an explicit mean."""

    def written_otherwise(Dks, S, T, generator, threshold=0.9):
        for Dk in Dks:
            queries = torch.randn(T, 1, Dk, generator=generator)  # the same numbers as (T, Dk)
            keys = torch.randn(1, S, Dk, generator=generator)
            weights = torch.softmax((queries * keys).sum(dim=-1), dim=1)  # (T, S)
            if float(weights.max(dim=1).values.sum()) / T > threshold:
                return Dk
        return None

    check_saturation_width(written_otherwise, seed=seed, S=3 + seed, T=20 + 7 * seed)
    assert capsys.readouterr().out.count("all checks passed") == 1


def test_check_saturation_width_leaves_the_global_random_state_alone():
    torch.manual_seed(123)
    before = torch.random.get_rng_state()
    check_saturation_width(notebook_solution("04_scaling", "saturation_width"))
    assert torch.equal(torch.random.get_rng_state(), before)


# --- notebook 01, exercise 3: beam search ------------------------------------------------------------------

import copy  # noqa: E402
import functools  # noqa: E402

from course_utils.checks import beam, check_beam_search  # noqa: E402


def _beam_search_written_otherwise(model, src, src_lengths, beam_size, max_len, sos_id=1, eos_id=2, noise=0.0):
    """A right answer written another way: lists of hypotheses, one decoder call per prefix, log(softmax) and
    torch.topk (whose order of ties is its own). ``noise`` first moves every weight of a copy of the model by about
    that much, as other hardware's arithmetic might."""
    if noise:
        model = copy.deepcopy(model)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(noise * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    answers, best = [], []
    with torch.no_grad():
        _, contexts = model.encoder(src, src_lengths)
        for b in range(src.shape[0]):
            context = contexts[b:b + 1]
            beam, finished = [([], 0.0, model.decoder.initial_state(context))], []
            for _ in range(max_len):
                candidates = []
                for tokens, score, state in beam:
                    logits, new_state = model.decoder.step(torch.tensor([tokens[-1] if tokens else sos_id]), state,
                                                           context)
                    log_p = torch.log(torch.softmax(logits[0], dim=-1))
                    candidates += [(tokens + [y], score + log_p[y], new_state) for y in range(len(log_p))]
                width = min(beam_size - len(finished), len(candidates))
                order = torch.topk(torch.stack([torch.as_tensor(c[1]) for c in candidates]), width).indices
                beam = []
                for i in order.tolist():
                    (finished if candidates[i][0][-1] == eos_id else beam).append(candidates[i])
                if not beam:
                    break
            tokens, score, _ = max(finished + beam, key=lambda c: float(c[1]))
            answers.append(torch.tensor(tokens))
            best.append(torch.as_tensor(score))
    return torch.nn.utils.rnn.pad_sequence(answers, batch_first=True), torch.stack(best)


NOTEBOOK_01_BEAM_CALLS = [{}, {"seed": 1, "B": 2, "S": 7, "V": 9, "k": 4, "max_len": 8},
                          {"seed": 2, "B": 5, "S": 3, "V": 6, "k": 2, "max_len": 5}]  # the notebook's test cell


@pytest.mark.parametrize("noise", [0.0, 1e-6])
@pytest.mark.parametrize("kwargs", NOTEBOOK_01_BEAM_CALLS + [{"seed": 3}, {"seed": 4, "B": 1, "k": 6}])
def test_check_beam_search_accepts_a_right_answer_written_otherwise(kwargs, noise, capsys):
    """Other code, other tie-breaking and weights a millionth off pass: no case of the checker hangs on a near-tie."""
    answer = functools.partial(_beam_search_written_otherwise, noise=noise)
    answer.__name__ = "beam_search"
    check_beam_search(answer, **kwargs)
    assert capsys.readouterr().out.count("all checks passed") == 1


def test_each_mistake_the_beam_search_checker_names_changes_an_answer_it_checks():
    """On the designed models, the checker's own search (written apart from the reference) gives the reference's
    answers, and each mistake it can name changes at least one of them: a learner who makes it is told."""
    src, lengths = torch.tensor([[3, 4, 5]]), torch.tensor([3])
    changed = set()
    for _, table, k, max_len in beam._DESIGNED:
        model = beam._markov_model(table)
        tokens, _ = decoding.beam_search(model, src, lengths, k, max_len)
        assert beam._search(model, src, lengths, k, max_len) == beam._rows(tokens)
        changed |= {change for change in beam._MISTAKES
                    if beam._search(model, src, lengths, k, max_len, change) != beam._rows(tokens)}
    assert changed == set(beam._MISTAKES)


def test_a_designed_model_is_the_markov_chain_of_its_table():
    table = {1: {3: 0.6, 2: 0.3}, 3: {4: 0.9}}
    model = beam._markov_model(table)
    y = torch.tensor([1, 3, 3])
    state = model.decoder.initial_state(torch.zeros(3, 4))
    logits, new_state = model.decoder.step(y, state, torch.zeros(3, 4))
    probs = logits.softmax(-1)
    torch.testing.assert_close(probs[0, [2, 3]], torch.tensor([0.3, 0.6]))
    torch.testing.assert_close(probs[1, 4], torch.tensor(0.9))
    torch.testing.assert_close(probs[0, 4:], torch.full((4,), 0.1 / 4))  # the 4 tokens not given share 0.1
    assert probs[:, :2].max() < 1e-12 and torch.equal(new_state, state)


def test_check_beam_search_leaves_the_global_random_state_alone():
    torch.manual_seed(123)
    before = torch.random.get_rng_state()
    check_beam_search(notebook_solution("01_seq2seq_bottleneck", "beam_search"))
    assert torch.equal(torch.random.get_rng_state(), before)


def test_check_beam_search_accepts_either_of_two_tied_answers(capsys):
    """On the models with two interchangeable tokens, an answer with the one token or the other passes."""
    swapped = []

    def beam_search(model, src, src_lengths, beam_size, max_len):
        tokens, scores = _beam_search_written_otherwise(model, src, src_lengths, beam_size, max_len)
        weights, bias = model.decoder.out.weight, model.decoder.out.bias
        if torch.equal(weights[3], weights[4]) and bias[3] == bias[4]:  # tokens 3 and 4 are interchangeable
            swapped.append(tokens.clone())
            tokens = torch.where(tokens == 3, 4, torch.where(tokens == 4, 3, tokens))
        return tokens, scores

    check_beam_search(beam_search)
    assert len(swapped) == 2 and all(((t == 3) | (t == 4)).any() for t in swapped), "both tie cases were answered"
    assert capsys.readouterr().out.count("all checks passed") == 1


def test_the_checks_of_how_a_function_is_written_skip_the_graders_proxy():
    """Out of the kernel a checker gets a proxy (defined in course_utils) of the student's function: its code and
    torch calls are not the student's, so "No Python loops" and "with `@`" are checked only in the kernel."""
    from course_utils.checks.inspection import course_function, has_python_loop, torch_calls
    from course_utils.tooling.verdict.proxies import proxy

    stand_in = proxy(None, ("export", "pairwise_scores_tests", "pairwise_scores"), "pairwise_scores")
    assert course_function(stand_in) and not course_function(lambda q, k: q @ k.mT)
    assert not has_python_loop(stand_in)
    assert has_python_loop(lambda x: [t for t in x]) and not has_python_loop(lambda x: x.sum())
    assert torch_calls(lambda q, k: q @ k.mT, torch.ones(1, 2, 3), torch.ones(1, 4, 3))[1] >= {"matmul"}
    assert torch_calls(attention.pairwise_scores, torch.ones(1, 2, 3), torch.ones(1, 4, 3))[1] is None


# --- issue 34: checkers that enforce what their exercise says, and accept every right way to do it -------------

from buggy_answers import _BEAM  # noqa: E402
from course_utils.blocks.attention import masked_softmax  # noqa: E402
from course_utils.checks import (  # noqa: E402
    check_adam_step,
    check_causal_tiled_attention,
    check_filter_logits,
    check_is_pre_ln,
    check_multi_head_attention,
    check_next_token_loss,
    check_split_heads,
)


def _named(fn, name):
    fn.__name__ = name
    return fn


SPLITS_WITHOUT_A_LOOP = {  # notebook 05, exercise 1: every vectorised split passes
    "view, transpose": lambda x, H: x.view(x.shape[0], x.shape[1], H, -1).transpose(1, 2),
    "reshape, permute": lambda x, H: x.reshape(*x.shape[:-1], H, x.shape[-1] // H).permute(0, 2, 1, 3),
    "unflatten, transpose, contiguous": lambda x, H: x.unflatten(-1, (H, -1)).transpose(1, 2).contiguous(),
    "movedim": lambda x, H: torch.movedim(x.view(*x.shape[:-1], H, -1), -2, 1),
    "einsum": lambda x, H: torch.einsum("bthd->bhtd", x.reshape(*x.shape[:-1], H, -1)),
    "swapaxes, clone": lambda x, H: x.reshape(x.shape[0], x.shape[1], H, -1).swapaxes(1, 2).clone(),
}


@pytest.mark.parametrize("how", list(SPLITS_WITHOUT_A_LOOP))
def test_check_split_heads_accepts_every_split_without_a_loop(how, capsys):
    answer = _named(SPLITS_WITHOUT_A_LOOP[how], "split_heads")
    check_split_heads(answer)
    check_split_heads(answer, seed=2, B=3, T=5, H=2, Dh=3)
    assert capsys.readouterr().out.count("all checks passed") == 2


def test_check_split_heads_counts_no_operations_of_the_graders_proxy():
    """Out of the kernel the student's operations run in another process: the count is left to the kernel."""
    from course_utils.checks.inspection import course_function
    from course_utils.checks.multihead import _split_without_a_loop
    from course_utils.tooling.verdict.proxies import proxy

    stand_in = proxy(None, ("export", "split_heads_tests", "split_heads"), "split_heads")
    assert course_function(stand_in)
    _split_without_a_loop(stand_in, 0)  # returns at once: nothing to count here


def _mha_parts(query, key, value, q_proj, k_proj, v_proj, num_heads):
    return (multihead.split_heads(p(t), num_heads) for p, t in ((q_proj, query), (k_proj, key), (v_proj, value)))


def _mha_einsum(query, key, value, q_proj, k_proj, v_proj, out_proj, num_heads, mask=None):
    q, k, v = _mha_parts(query, key, value, q_proj, k_proj, v_proj, num_heads)
    weights = masked_softmax(torch.einsum("bhtd,bhsd->bhts", q, k) / math.sqrt(q.shape[-1]), mask)
    return out_proj(multihead.merge_heads(torch.einsum("bhts,bhsd->bhtd", weights, v))), weights


def _mha_scaled_queries(query, key, value, q_proj, k_proj, v_proj, out_proj, num_heads, mask=None):
    q, k, v = _mha_parts(query, key, value, q_proj, k_proj, v_proj, num_heads)
    weights = masked_softmax((q * q.shape[-1] ** -0.5) @ k.mT, mask)  # the scale on q first: the same scores
    return out_proj(multihead.merge_heads(weights @ v)), weights


@pytest.mark.parametrize("answer", [_mha_einsum, _mha_scaled_queries])
def test_check_multi_head_attention_accepts_scores_written_out_in_other_ways(answer, capsys):
    check_multi_head_attention(_named(answer, "multi_head_attention"))
    assert capsys.readouterr().out.count("all checks passed") == 1


def test_check_multi_head_attention_names_scaled_dot_product_attention_at_any_depth():
    """Through nn.MultiheadAttention's functional form too: the fused call is seen wherever it is made."""
    def through_a_helper(query, key, value, q_proj, k_proj, v_proj, out_proj, num_heads, mask=None):
        q, k, v = _mha_parts(query, key, value, q_proj, k_proj, v_proj, num_heads)
        helper = {"attend": F.scaled_dot_product_attention}
        out = helper["attend"](q, k, v, attn_mask=mask)
        weights = masked_softmax(q @ k.mT / math.sqrt(q.shape[-1]), mask)
        return out_proj(multihead.merge_heads(out)), weights

    with pytest.raises(CheckError, match="rules out") as err:
        check_multi_head_attention(_named(through_a_helper, "multi_head_attention"))
    assert_no_answer_in(str(err.value), solution=("05_multi_head_attention", "multi_head_attention"))
    assert sys.getprofile() is None


def _probe(scale, threshold, B=2):
    def is_pre_ln(block, D):
        x = torch.randn(B, 5, D, generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            return bool(block(scale * x).norm() > threshold * block(x).norm())

    return is_pre_ln


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize(("scale", "threshold"), [(1000, 10), (100, 10), (1e4, 100)])
def test_check_is_pre_ln_accepts_probes_at_very_different_scales(seed, scale, threshold, capsys):
    for D in (8, 16, 48):
        check_is_pre_ln(_probe(scale, threshold), seed=seed, D=D)
    assert capsys.readouterr().out.count("all checks passed") == 3


def test_check_is_pre_ln_tries_large_and_small_gains_and_shifts():
    """Issue 34: "whatever the gains and shifts" — the blocks have gains 1, about 1, 5 and 0.2, with shifts."""
    from course_utils.checks.transformer import _black_box_blocks

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        blocks = _black_box_blocks(16)
    norms = {norms for _, _, norms, _ in blocks}
    assert {"gain 5, random shifts", "gain 0.2, random shifts"} <= norms
    assert {pre_ln for _, pre_ln, norms, _ in blocks if norms.startswith("gain 5")} == {False, True}
    with pytest.raises(CheckError, match="gains and shifts were small") as err:
        check_is_pre_ln(_probe(2, 1.5))  # twice the input: about twice the output only while the gains are small
    assert_no_answer_in(str(err.value), ("1000", ".norm()", "> 10"), solution=("07_transformer_block", "is_pre_ln"))


def _adam_with_torch_sqrt_and_addcdiv(param, grad, m, v, t, lr, betas=(0.9, 0.999), eps=1e-8):
    beta1, beta2 = betas
    m = torch.lerp(grad, m, beta1)  # beta1 * m + (1 - beta1) * grad, written another way
    v = torch.addcmul(beta2 * v, grad, grad, value=1 - beta2)
    denom = torch.sqrt(v) / math.sqrt(1 - beta2 ** t) + eps  # PyTorch's own order
    return torch.addcdiv(param, m, denom, value=-lr / (1 - beta1 ** t)), m, v


def _adam_on_python_numbers_per_entry(param, grad, m, v, t, lr, betas=(0.9, 0.999), eps=1e-8):
    beta1, beta2 = betas
    new_m, new_v = beta1 * m + (1 - beta1) * grad, beta2 * v + (1 - beta2) * grad * grad
    c1, c2 = 1 - beta1 ** t, 1 - beta2 ** t
    return param - lr * (new_m / c1) / ((new_v / c2) ** 0.5 + eps), new_m, new_v


@pytest.mark.parametrize("answer", [_adam_with_torch_sqrt_and_addcdiv, _adam_on_python_numbers_per_entry])
def test_check_adam_step_accepts_other_right_answers(answer, capsys):
    for seed, shape in [(0, (3, 4)), (1, ()), (2, (2, 3, 5))]:
        check_adam_step(_named(answer, "adam_step"), seed=seed, shape=shape)
    assert capsys.readouterr().out.count("all checks passed") == 3


def test_check_adam_step_compares_with_torch_optim_adam_and_leaves_the_random_state_alone():
    """The checker's expected values are torch.optim.Adam's; the reference takes the same steps over 50 steps."""
    torch.manual_seed(123)
    before = torch.rand(3)
    torch.manual_seed(123)
    check_adam_step(_named(_adam_on_python_numbers_per_entry, "adam_step"))
    assert torch.equal(torch.rand(3), before)
    p = torch.nn.Parameter(torch.randn(4, 5))
    q, m, v = p.detach().clone(), torch.zeros(4, 5), torch.zeros(4, 5)
    optimizer = torch.optim.Adam([p], lr=1e-2)
    for t in range(1, 51):
        p.grad = torch.randn(4, 5) * 10 ** (t % 5 - 2)
        q, m, v = deep_stacks.adam_step(q, p.grad, m, v, t, 1e-2)
        optimizer.step()
    torch.testing.assert_close(q, p.detach(), atol=1e-6, rtol=1e-5)


_CAUSAL_INLINE_UPDATE = (  # notebook 09, exercise 2, right, with the online softmax written inline
    "def causal_tiled_attention(q, k, v, block_size):\n"
    "    T, outs, tiles = q.shape[-2], [], 0\n"
    "    for start in range(0, T, block_size):\n"
    "        q_block = q[..., start:start + block_size, :]\n"
    "        rows = torch.arange(start, start + q_block.shape[-2])[:, None]\n"
    "        m = torch.full((*q_block.shape[:-1], 1), float('-inf'))\n"
    "        l, acc = torch.zeros_like(m), q_block.new_zeros(*q_block.shape[:-1], v.shape[-1])\n"
    "        for k_start in range(0, start + 1, block_size):\n"
    "            scores = torch.einsum('...qd,...kd->...qk', q_block, k[..., k_start:k_start + block_size, :])\n"
    "            scores = scores * q.shape[-1] ** -0.5\n"
    "            cols = torch.arange(k_start, k_start + scores.shape[-1])[None, :]\n"
    "            scores = torch.where(cols > rows, float('-inf'), scores)\n"
    "            m_new = torch.maximum(m, scores.amax(-1, keepdim=True))\n"
    "            p = torch.exp(scores - m_new)\n"
    "            correction = torch.exp(m - m_new)\n"
    "            l = l * correction + p.sum(-1, keepdim=True)\n"
    "            acc = acc * correction + p @ v[..., k_start:k_start + block_size, :]\n"
    "            m, tiles = m_new, tiles + 1\n"
    "        outs.append(acc / l)\n"
    "    return torch.cat(outs, dim=-2), tiles\n")


def test_check_causal_tiled_attention_accepts_the_online_softmax_written_inline(capsys):
    namespace = {"torch": torch}
    exec(_CAUSAL_INLINE_UPDATE, namespace)  # noqa: S102 - test fixture code
    answer = namespace["causal_tiled_attention"]
    check_causal_tiled_attention(answer)
    check_causal_tiled_attention(answer, seed=1, B=1, H=2, T=7, Dk=3, Dv=4, block_size=3)
    check_causal_tiled_attention(answer, seed=2, B=3, H=1, T=16, Dk=8, Dv=2, block_size=5)
    assert capsys.readouterr().out.count("all checks passed") == 3


def _causal_tiles_joined(q, k, v, block_size):
    """Tiles computed one by one, then joined and normalised by one ordinary softmax: no online softmax."""
    T, outs, tiles = q.shape[-2], [], 0
    for start in range(0, T, block_size):
        q_block = q[..., start:start + block_size, :]
        joined = []
        for k_start in range(0, start + 1, block_size):
            joined.append(q_block @ k[..., k_start:k_start + block_size, :].mT / math.sqrt(q.shape[-1]))
            tiles += 1
        scores = torch.cat(joined, dim=-1)  # (..., Cq, end)
        end = scores.shape[-1]
        later = torch.arange(end)[None, :] > torch.arange(start, start + q_block.shape[-2])[:, None]
        outs.append(torch.softmax(scores.masked_fill(later, float("-inf")), dim=-1) @ v[..., :end, :])
    return torch.cat(outs, dim=-2), tiles


def test_check_causal_tiled_attention_names_one_softmax_over_the_tiles_joined():
    with pytest.raises(CheckError, match="one tile at a time") as err:
        check_causal_tiled_attention(_named(_causal_tiles_joined, "causal_tiled_attention"))
    assert_no_answer_in(str(err.value), solution=("09_attention_at_scale", "causal_tiled_attention"))


NEXT_TOKEN_LOSSES = {  # notebook 10, exercise 1: right answers written in other ways
    "vocabulary on dimension 1": lambda model, t: F.cross_entropy(model(t[:, :-1]).transpose(1, 2), t[:, 1:]),
    "log_softmax and gather": lambda model, t: -model(t[:, :-1]).log_softmax(-1).gather(-1, t[:, 1:, None]).mean(),
    "narrow and flatten": lambda model, t: F.cross_entropy(model(t.narrow(1, 0, t.shape[1] - 1)).flatten(0, 1),
                                                           t.narrow(1, 1, t.shape[1] - 1).flatten()),
}


@pytest.mark.parametrize("how", list(NEXT_TOKEN_LOSSES))
def test_check_next_token_loss_accepts_other_right_answers(how, capsys):
    answer = _named(NEXT_TOKEN_LOSSES[how], "next_token_loss")
    for seed, shape in [(0, {}), (1, {"B": 1, "T": 1, "V": 3}), (2, {"B": 4, "T": 9, "V": 5})]:
        check_next_token_loss(answer, seed=seed, **shape)
    assert capsys.readouterr().out.count("all checks passed") == 3


def test_check_next_token_loss_gives_a_model_whose_context_is_what_it_reads():
    """The model the checker hands over holds T positions, as the notebook's 64 for windows of 65: reading the whole
    window raises there, and the checker names that instead of passing it."""
    seen = []

    def spy(model, tokens):
        seen.append((model.config.max_len, tokens.shape[1]))
        return NEXT_TOKEN_LOSSES["vocabulary on dimension 1"](model, tokens)

    check_next_token_loss(_named(spy, "next_token_loss"), B=2, T=6, V=5)
    assert seen and all(max_len == length - 1 for max_len, length in seen)


def _filter_with_probabilities_masked(logits, top_k=None, top_p=None):
    """Right, written otherwise: top-p on the probabilities of the kept logits, set to 0 outside them."""
    keep = torch.ones_like(logits, dtype=torch.bool)
    if top_k is not None:
        keep &= logits >= torch.topk(logits, top_k, dim=-1).values[..., -1:]
    if top_p is not None:
        probs = torch.softmax(logits.masked_fill(~keep, float("-inf")), dim=-1)
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        keep_sorted = sorted_probs.cumsum(-1) - sorted_probs < top_p
        keep &= torch.zeros_like(keep).scatter(-1, order, keep_sorted)
    return logits.masked_fill(~keep, float("-inf"))


def test_check_filter_logits_accepts_another_right_answer_and_tells_the_orders_apart(capsys):
    from course_utils.checks.gpt import _order_case

    for seed, shape in [(0, {}), (1, {"B": 1, "V": 3}), (2, {"B": 6, "V": 50})]:
        check_filter_logits(_named(_filter_with_probabilities_masked, "filter_logits"), seed=seed, **shape)
    assert capsys.readouterr().out.count("all checks passed") == 3
    for shape in [(3,), (4, 10), (2, 6, 50)]:
        logits, top_k, top_p = _order_case(shape, 0)
        assert top_p == round(top_p, 2)
        right = torch.isfinite(gpt.filter_logits(logits, top_k, top_p)).sum(-1)
        original = (torch.isfinite(gpt.filter_logits(logits, top_k=top_k))
                    & torch.isfinite(gpt.filter_logits(logits, top_p=top_p))).sum(-1)
        assert (right == 1).all() and (original == 2).all()


_ISSUE_37 = [("next_token_loss", "the model run on the whole window, its last position dropped"),
             ("filter_logits", "top-p on the original distribution"), ("filter_logits", "top-p before top-k")]


@pytest.mark.parametrize(("grade_id", "kind"), _ISSUE_37, ids=[f"{g}: {k}" for g, k in _ISSUE_37])
def test_each_hidden_test_of_notebook_10_alone_rejects_what_issue_37_found(grade_id, kind):
    """Issue 37: these passed 10's hidden tests (the whole window three times, the two orders of the filters);
    every hidden call of the notebook's graded cell now rejects each one by itself, naming the bug."""
    hidden = graded_test_cell("10_small_gpt", grade_id).split("### BEGIN HIDDEN TESTS")[1].split("### END HIDDEN TESTS")[0]
    calls = [line for line in hidden.splitlines() if line.startswith(f"check_{grade_id}(")]
    assert len(calls) == 2, hidden
    source, fragment = next((s, f) for k, s, f in NEW_KINDS[grade_id] if k == kind)
    namespace = {"torch": torch, "F": F}
    exec(source, namespace)  # noqa: S102 - test fixture code
    for call in calls:
        with pytest.raises(CheckError) as err:
            eval(call, {f"check_{grade_id}": getattr(checks, f"check_{grade_id}"), grade_id: namespace[grade_id]})  # noqa: S307
        assert fragment in str(err.value), (call, str(err.value))


def test_check_beam_search_calls_the_refilled_beam_of_the_cited_paper_another_variant():
    """Issue 34: the exercise cites Sutskever et al., whose beam is refilled to beam_size; the message says which
    variant this exercise asks for, and never calls the paper's search a mistake."""
    namespace = {"torch": torch}
    exec(_BEAM.replace("[: beam_size - len(finished)]", "[: beam_size]").replace(  # noqa: S102 - test fixture
        "if len(y) == 0:", "if len(y) == 0 or len(finished) >= beam_size:"), namespace)
    with pytest.raises(CheckError) as err:
        check_beam_search(namespace["beam_search"])
    message = str(err.value)
    assert "Sutskever" in message and "this exercise asks for the variant" in message, message
    assert not re.search(r"\bare wrong\b|mistake|must narrow", message), message
    assert_no_answer_in(message, solution=("01_seq2seq_bottleneck", "beam_search"))


# What an exercise's statement forbids, and the word a buggy answer's description uses for breaking it.
_INSTRUCTIONS = [
    (re.compile(r"\bno loops?\b|without (?:a |any )?(?:Python )?loops?\b|\bno loop over", re.I), "loop"),
    (re.compile(r"\bno `einsum`", re.I), "einsum"),
    (re.compile(r"\bwith `@`"), "`@`"),
    (re.compile(r"\bdo not call `([\w.]+)`", re.I), None),  # the function named
]


def _statements():
    """(notebook stem, grade_id, the markdown just above the solution cell) for every graded exercise."""
    import nbformat

    from conftest import NOTEBOOKS

    for path in NOTEBOOKS:
        above = ""
        for cell in nbformat.read(path, as_version=4).cells:
            if cell.cell_type == "markdown":
                above = cell.source
            elif cell.metadata.get("nbgrader", {}).get("solution"):
                yield path.stem, cell.metadata["nbgrader"]["grade_id"], above


def test_every_instruction_an_exercise_gives_is_enforced_by_its_checker():
    """An exercise that says "no loops", "no `einsum`", "with `@`" or "Do not call `f`" has a buggy answer doing it.

    test_new_kinds_of_buggy_answers_are_rejected_with_a_message_that_names_the_bug then requires that the checker
    rejects that answer: what the text forbids, the checker rejects."""
    found, missing = 0, []
    for stem, grade_id, text in _statements():
        kinds = " | ".join(kind for kind, _, _ in NEW_KINDS.get(grade_id, []))
        for pattern, word in _INSTRUCTIONS:
            for match in pattern.finditer(text):
                found += 1
                wanted = word or match.group(1).split(".")[-1]
                if wanted not in kinds:
                    missing.append(f"{stem} {grade_id}: says {match.group(0)!r}, and no buggy answer in "
                                   f"tests/buggy_answers.py NEW_KINDS[{grade_id!r}] mentions {wanted!r}")
    assert found >= 4, "expected the exercises' instructions to be found"
    assert not missing, "\n".join(missing)
