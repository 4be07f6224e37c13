"""Checkers for notebook 01: the encoder's final states, exact-match accuracy."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from course_utils.blocks import seq2seq
from course_utils.checks.core import call, check_close, check_tensor, passed
from course_utils.core.errors import CheckError
from course_utils.experiments import training


def check_final_states(fn: Callable[[torch.Tensor, torch.Tensor], Any], seed: int = 0,
                       B: int = 4, S: int = 6, R: int = 3) -> None:
    """Check a learner's ``final_states(states, lengths) -> (B, R)`` (notebook 01, exercise 1).

    Raises:
        CheckError: Naming the likely bug.
    """
    __tracebackhide__ = True  # noqa: F841
    g = torch.Generator().manual_seed(seed)
    states = torch.randn(B, S, R, generator=g)
    lengths = torch.randint(1, S + 1, (B,), generator=g)
    lengths[0] = S  # a full-length sequence
    lengths[-1] = 1  # and a one-token one
    states_copy, lengths_copy = states.clone(), lengths.clone()
    got = call(fn, states, lengths, name="final_states", expected=f"a (B, R) = {(B, R)} tensor",
               error_hint="the last real token of row b is at position lengths[b] - 1 (positions start at 0)")
    if not (torch.equal(states, states_copy) and torch.equal(lengths, lengths_copy)):
        raise CheckError("final_states changed its inputs in place: index them, do not modify them")
    expected = seq2seq.final_states(states, lengths)
    rows = torch.arange(B)
    suspects = {
        "this is states[:, -1], a padding position for every sequence shorter than S: "
        "take position lengths[b] - 1 of each row b": states[:, -1],
        "this is position lengths[b] - 2: the last real token is at lengths[b] - 1": states[rows, (lengths - 2).clamp(min=0)],
        "this is the first position: a left-to-right RNN has read the whole sequence only at its last real token":
            states[:, 0],
        "this averages over positions (padding included): take the state at the last real token": states.mean(1),
    }
    hints = {
        (B, B, R): "indexing with [:, lengths - 1] takes those positions from *every* row; pair each row with "
                   "its own position: states[torch.arange(B), lengths - 1]",
        (B, S): "the R state dimension is gone: index the position, do not reduce over R",
    }
    check_close(got, expected, name="the final states", shape="B R", dims={"B": B, "R": R}, hints=hints,
                suspects=suspects, hint="row b must be states[b, lengths[b] - 1]")
    passed("final_states")


def check_sequence_exact_match(fn: Callable[[torch.Tensor, torch.Tensor], Any], seed: int = 0,
                               B: int = 6, T: int = 7) -> None:
    """Check a learner's ``sequence_exact_match(tokens, targets) -> (B,) bool`` (notebook 01, exercise 2).

    Raises:
        CheckError: Naming the likely bug.
    """
    __tracebackhide__ = True  # noqa: F841
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, T + 1, (B,), generator=g)  # real target tokens, <eos> included
    lengths[0], lengths[1] = T, 2
    targets = torch.randint(3, 9, (B, T), generator=g)
    targets[torch.arange(B), lengths - 1] = 2  # <eos>
    targets[torch.arange(T)[None, :] >= lengths[:, None]] = 0  # padding
    tokens = targets.clone()
    tokens[targets == 0] = torch.randint(3, 9, (int((targets == 0).sum()),), generator=g)  # anything after <eos>
    wrong = torch.arange(B) % 3 == 2  # every third row gets one wrong symbol
    for b in wrong.nonzero().flatten().tolist():
        position = int(torch.randint(0, int(lengths[b]) - 1, (1,), generator=g))
        tokens[b, position] = 9
    tokens[1, lengths[1] - 1] = 3  # row 1: every symbol right, but no <eos> (the model did not stop)
    tokens_copy, targets_copy = tokens.clone(), targets.clone()
    got = call(fn, tokens, targets, name="sequence_exact_match", expected=f"a (B,) = ({B},) bool tensor")
    if not (torch.equal(tokens, tokens_copy) and torch.equal(targets, targets_copy)):
        raise CheckError("sequence_exact_match changed its inputs in place: compare them, do not modify them")
    expected = training.sequence_exact_match(tokens, targets)
    hints = {
        (B, T): "one value per token: reduce over the T positions with .all(dim=1) to get one per sequence",
        (T,): "you reduced over the batch (dim 0): reduce over positions, dim=1",
        (): "a single number for the whole batch: return one bool per sequence, (B,)",
    }
    got_t = check_tensor(got, name="the result", shape="B", dims={"B": B}, hints=hints)
    if got_t.dtype != torch.bool:
        mean = (tokens == targets).float().mean(dim=1)
        if got_t.is_floating_point() and torch.allclose(got_t, mean):
            raise CheckError("this is the fraction of right tokens per sequence; exact match asks whether *all* "
                             "real tokens are right: a bool per sequence")
        raise CheckError(f"expected a bool tensor (True = the whole sequence is right), got dtype {got_t.dtype}")
    suspects = {
        "padding positions were compared too: after <eos> a model may write anything; "
        "compare only where targets != pad": (tokens == targets).all(dim=1),
        "any() accepts a sequence with a single right token; every real token must match: all()":
            ((tokens == targets) & (targets != 0)).any(dim=1),
        "the <eos> position was skipped: a prediction that does not stop in the right place is wrong":
            ((tokens == targets) | (targets == 0) | (targets == 2)).all(dim=1),
    }
    check_close(got_t.float(), expected.float(), name="the result", shape="B", dims={"B": B},
                suspects={k: v.float() for k, v in suspects.items()},
                hint="row b is True exactly when tokens[b, t] == targets[b, t] at every t where targets[b, t] != 0")
    passed("sequence_exact_match")
