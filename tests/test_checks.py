"""The checkers accept the reference and reject known-buggy answers with a message naming the bug."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from course_utils import attention, masks
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
    with pytest.raises(CheckError, match=r"at index \(1, 2\) expected 5\.0000, got 99\.0000 \(1 of 6 entries differ\)"):
        check_close(wrong, expected, name="x")
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
    (lambda q, k: q[:, :, None, :] * k[:, None, :, :], "were not summed over D"),
    (lambda q, k: q[0] @ k[0].T, "the batch dimension is gone"),
    (_first_batch_only, "only the first batch element is right"),
    (lambda q, k: q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5, "divided by √D"),
    (lambda q, k: q @ k, "pairwise_scores raised RuntimeError"),
    (_inplace_scores, "changed q or k in place"),
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
    """The buggy answers of tests/buggy_answers.py fail the visible checks too."""
    from buggy_answers import BUGGY

    checkers = {"padding_mask": check_padding_mask, "pairwise_scores": check_pairwise_scores,
                "masked_softmax": check_masked_softmax}
    for grade_id, source in BUGGY["00_orientation"].items():
        namespace = {"torch": torch}
        exec(source, namespace)  # noqa: S102 - test fixture code
        with pytest.raises(CheckError):
            checkers[grade_id](namespace[grade_id])


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
