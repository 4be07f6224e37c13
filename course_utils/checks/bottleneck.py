"""Checkers for notebook 01: the encoder's final states, exact-match accuracy.

The checker of exercise 3, beam search, is in :mod:`course_utils.checks.beam`.

The messages name the likely bug in words. They never print code that solves
the exercise, nor an entry of the expected answer.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from course_utils.blocks import seq2seq
from course_utils.checks.core import call, check_tensor, passed, reference_guard, shape_cases, sweep
from course_utils.checks.inspection import has_python_loop
from course_utils.core.errors import CheckError
from course_utils.experiments import training
from course_utils.checks.flow import exercise_check


def _compare_rows(got: torch.Tensor, expected: torch.Tensor, name: str, suspects: Mapping[str, torch.Tensor],
                  hint: str) -> None:
    """Compare row by row; name a recognised mistake, or the wrong rows, never the expected values."""
    __tracebackhide__ = True  # noqa: F841
    close = torch.isclose(got.float(), expected.float(), atol=1e-5, rtol=1e-4)  # (B, ...) elementwise
    if close.all():
        return
    for mistake, value in suspects.items():
        if value.shape == got.shape and torch.allclose(got.float(), value.float(), atol=1e-5, rtol=1e-4):
            raise CheckError(f"{name} have the right shape but wrong values. {mistake}")
    wrong = (~close).reshape(close.shape[0], -1).any(dim=1).nonzero().flatten().tolist()  # (B,) -> rows
    raise CheckError(f"{name} have the right shape, but rows {wrong} of {close.shape[0]} are wrong. {hint}")


@exercise_check
def check_final_states(fn: Callable[[torch.Tensor, torch.Tensor], Any], seed: int = 0,
                       B: int = 4, S: int = 6, R: int = 3) -> None:
    """Check a learner's ``final_states(states, lengths) -> (B, R)`` (notebook 01, exercise 1).

    Runs it forward on a batch with a full-length and a one-token sequence, and
    backward: the gradient must reach the state after each row's last real
    token, and nothing else. At the sizes asked for, then at B = 1, R = 1 and
    sizes that all differ. Last, the exercise's "No Python loops": the function's
    own code may have no ``for`` or ``while`` loop and no comprehension.

    Raises:
        CheckError: Naming the likely bug.
    """
    __tracebackhide__ = True  # noqa: F841
    with reference_guard(fn, seq2seq.final_states):
        sweep(lambda B, S, R: _final_states_once(fn, seed, B, S, R),
              shape_cases({"B": B, "S": S, "R": R}, ones=("B", "R"), distinct={"B": 4, "S": 6, "R": 3}))
        if has_python_loop(fn):
            raise CheckError("the final states are right, but final_states has a Python loop (a `for` or `while` "
                             "loop, or a comprehension), and the exercise says \"No Python loops\": select every "
                             "row's state at once with tensor operations, which cost one call however large B is")
    passed("final_states")


def _final_states_once(fn: Callable[[torch.Tensor, torch.Tensor], Any], seed: int, B: int, S: int, R: int) -> None:
    __tracebackhide__ = True  # noqa: F841
    g = torch.Generator().manual_seed(seed)
    values = torch.randn(B, S, R, generator=g)
    lengths = torch.randint(1, S + 1, (B,), generator=g)
    lengths[0] = S  # a full-length sequence
    lengths[-1] = 1  # and a one-token one
    states = values.clone().requires_grad_()  # a leaf, so the backward check can read its gradient
    lengths_copy = lengths.clone()
    got = call(fn, states, lengths, name="final_states", expected=f"a (B, R) = {(B, R)} tensor",
               error_hint="a sequence of L_b real tokens has them at positions 0 to L_b - 1 (positions count from 0)")
    if not (torch.equal(states.detach(), values) and torch.equal(lengths, lengths_copy)):
        raise CheckError("final_states changed its inputs in place. Read from them, do not modify them.")
    expected = seq2seq.final_states(values, lengths)
    rows = torch.arange(B)
    suspects = {
        "This is the state at the last column, a padding position for every sequence shorter than S. "
        "Each row needs the position of its own last real token.": values[:, -1],
        "This is the state one position before the last real token (positions count from 0).":
            values[rows, (lengths - 2).clamp(min=0)],
        "This is the first position, but a left-to-right RNN has read the whole sequence only at its last "
        "real token.": values[:, 0],
        "This averages over positions, padding included. The context vector is the state at one position.":
            values.mean(1),
    }
    hints = {
        (B, B, R): "each row was indexed at the lengths of *every* row. Each row needs only its own length.",
        (B, S): "the R state dimension is gone: index a position, do not reduce over R",
    }
    got = check_tensor(got, name="the final states", shape="B R", dims={"B": B, "R": R}, dtype=expected.dtype,
                       hints=hints)
    _compare_rows(got.detach(), expected, "the final states", suspects,
                  "Row b must be the state after the last real token of sequence b.")
    if not got.requires_grad:
        raise CheckError("the final states have the right values but are cut off from autograd (`.detach()`, "
                         "`torch.no_grad()`, `.data`, or a copy through numpy or torch.tensor(...)), so no gradient "
                         "would reach the encoder. Select from the tensor itself.")
    weights = torch.randn(B, R, generator=g)
    (grad,) = torch.autograd.grad((got * weights).sum(), states)  # d(sum w * out) / d states
    expected_grad = torch.zeros(B, S, R)
    expected_grad[rows, lengths - 1] = weights
    if not torch.allclose(grad, expected_grad, atol=1e-5, rtol=1e-4):
        raise CheckError("the values are right, but the gradient reaches other positions of states than the "
                         "last real token of each row")


@exercise_check
def check_sequence_exact_match(fn: Callable[[torch.Tensor, torch.Tensor], Any], seed: int = 0,
                               B: int = 6, T: int = 7) -> None:
    """Check a learner's ``sequence_exact_match(tokens, targets) -> (B,) bool`` (notebook 01, exercise 2).

    Three probes: a random batch (right rows with anything written after their
    ``<eos>``, rows with one wrong symbol, a row that does not stop), a small
    batch whose only mistake sits in the last column, predictions that stop
    early (an ``<eos>``, or padding, before the target ends), and predictions
    that write padding after their ``<eos>``, as greedy decoding's padded outputs
    do (where counting the matching positions goes wrong). The random batch is
    tried at the sizes asked for, at B = 1 and at sizes with B != T.

    Raises:
        CheckError: Naming the likely bug.
    """
    __tracebackhide__ = True  # noqa: F841
    with reference_guard(fn, training.sequence_exact_match):
        sweep(lambda B, T: _exact_match_once(fn, seed, B, T),
              shape_cases({"B": B, "T": T}, ones=("B",), distinct={"B": 6, "T": 7}))
        _exact_match_early_stops(fn)
        _exact_match_padding_written(fn)
    passed("sequence_exact_match")


def _exact_match_once(fn: Callable[[torch.Tensor, torch.Tensor], Any], seed: int, B: int, T: int) -> None:
    __tracebackhide__ = True  # noqa: F841
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, T + 1, (B,), generator=g)  # real target tokens, <eos> included
    lengths[0] = T
    if B > 1:
        lengths[1] = 2
    targets = torch.randint(3, 9, (B, T), generator=g)
    targets[torch.arange(B), lengths - 1] = 2  # <eos>
    targets[torch.arange(T)[None, :] >= lengths[:, None]] = 0  # padding
    tokens = targets.clone()
    tokens[targets == 0] = torch.randint(3, 9, (int((targets == 0).sum()),), generator=g)  # anything after <eos>
    wrong = torch.arange(B) % 3 == 2  # every third row gets one wrong symbol
    for b in wrong.nonzero().flatten().tolist():
        position = int(torch.randint(0, int(lengths[b]) - 1, (1,), generator=g))
        tokens[b, position] = 9
    if B > 1:
        tokens[1, lengths[1] - 1] = 3  # row 1: every symbol right, but no <eos> (the model did not stop)
    tokens_copy, targets_copy = tokens.clone(), targets.clone()
    got = call(fn, tokens, targets, name="sequence_exact_match", expected=f"a (B,) = ({B},) bool tensor")
    if not (torch.equal(tokens, tokens_copy) and torch.equal(targets, targets_copy)):
        raise CheckError("sequence_exact_match changed its inputs in place. Compare them, do not modify them.")
    expected = training.sequence_exact_match(tokens, targets)
    hints = {
        (B, T): "one value per token, but exact match gives one value per sequence, True only if every real "
                "position matches",
        (T,): "you reduced over the batch (dim 0) instead of over the positions",
        (): "a single value for the whole batch, but exact match gives one bool per sequence, (B,)",
    }
    got_t = check_tensor(got, name="the result", shape="B", dims={"B": B}, hints=hints)
    if got_t.dtype != torch.bool:
        mean = (tokens == targets).float().mean(dim=1)
        if got_t.is_floating_point() and torch.allclose(got_t, mean):
            raise CheckError("this is the fraction of right tokens per sequence. Exact match asks whether all "
                             "real tokens are right, one bool per sequence.")
        raise CheckError(f"expected a bool tensor (True = the whole sequence is right), got dtype {got_t.dtype}")
    suspects = {
        "Padding positions were compared too, but after <eos> a model may write anything there.":
            (tokens == targets).all(dim=1),
        "A sequence with a single right token was accepted, but every real token must match.":
            ((tokens == targets) & (targets != 0)).any(dim=1),
        "The <eos> position was skipped, but a prediction that does not stop in the right place is wrong.":
            ((tokens == targets) | (targets == 0) | (targets == 2)).all(dim=1),
    }
    hint = ("Row b must be True exactly when the prediction equals the target at every output position i "
            "where the target is not padding.")
    _compare_rows(got_t, expected, "the results", suspects, hint)

    # Second probe: row 0 has all T positions real and its only mistake in the last one; row 1 is right.
    last = torch.randint(3, 9, (2, T), generator=g)
    last[0, T - 1] = 2  # row 0: T real tokens, <eos> in the last column
    last[1, 1], last[1, 2:] = 2, 0  # row 1: two real tokens, then padding
    guess = last.clone()
    guess[0, T - 1] = 3  # row 0 does not stop: its only mistake is in the last column
    guess[1, 2:] = 4  # row 1 writes anything after its <eos>
    got_last = call(fn, guess, last, name="sequence_exact_match", expected="a (B,) = (2,) bool tensor")
    got_last = check_tensor(got_last, name="the result", shape="B", dims={"B": 2}, dtype=torch.bool, hints=hints)
    if bool(got_last[0]):
        raise CheckError("a mistake in the last column was missed: every real position counts, the last one too")
    padding_compared = {next(iter(suspects)): (guess == last).all(dim=1)}  # the first suspect, on this probe
    _compare_rows(got_last, training.sequence_exact_match(guess, last), "the results", padding_compared, hint)


def _exact_match_early_stops(fn: Callable[[torch.Tensor, torch.Tensor], Any]) -> None:
    """Predictions that stop before the target ends: wrong, although every position they wrote is right."""
    __tracebackhide__ = True  # noqa: F841
    targets = torch.tensor([[5, 6, 7, 8, 2], [5, 6, 7, 2, 0], [5, 6, 2, 0, 0]])  # lengths 5, 4, 3 (<eos> = 2)
    tokens = torch.tensor([[5, 6, 2, 0, 0],  # row 0 writes <eos> two positions early
                           [5, 6, 0, 0, 0],  # row 1 writes padding instead of the rest (no <eos> at all)
                           [5, 6, 2, 4, 3]])  # row 2 is right: anything may follow its <eos>
    got = call(fn, tokens, targets, name="sequence_exact_match", expected="a (B,) = (3,) bool tensor")
    got = check_tensor(got, name="the result for predictions that stop early", shape="B", dims={"B": 3},
                       dtype=torch.bool)
    if bool(got[0]) or bool(got[1]):
        raise CheckError("a prediction that stops early was accepted. Every real position of the target must "
                         "match, also those after the prediction's own <eos> or padding: a model that stops too "
                         "soon is wrong")
    _compare_rows(got, training.sequence_exact_match(tokens, targets), "the results for predictions that stop early",
                  {}, "Row b must be True exactly when the prediction equals the target at every output position "
                      "i where the target is not padding.")


def _exact_match_padding_written(fn: Callable[[torch.Tensor, torch.Tensor], Any]) -> None:
    """Predictions that write padding (0) after their <eos>: it matches the target's padding, and must not count."""
    __tracebackhide__ = True  # noqa: F841
    targets = torch.tensor([[5, 6, 7, 2, 0, 0], [5, 6, 2, 0, 0, 0], [5, 2, 0, 0, 0, 0]])  # lengths 4, 3, 2 (<eos> = 2)
    tokens = torch.tensor([[5, 6, 7, 2, 0, 0],  # row 0 is right, then padding (as greedy decoding pads its outputs)
                           [5, 8, 2, 0, 0, 0],  # row 1 has one wrong token, then padding
                           [5, 2, 4, 0, 0, 0]])  # row 2 is right, then a token and padding
    got = call(fn, tokens, targets, name="sequence_exact_match", expected="a (B,) = (3,) bool tensor")
    got = check_tensor(got, name="the result for predictions padded after their <eos>", shape="B", dims={"B": 3},
                       dtype=torch.bool)
    matches, length = (tokens == targets).sum(dim=1), (targets != 0).sum(dim=1)  # (B,) each
    counted = ("Counting the positions where the prediction matches and comparing the count with the target's length "
               "goes wrong here: after <eos>, padding written by the model matches the target's padding and is "
               "counted too")
    if torch.equal(got, matches == length) or torch.equal(got, matches >= length):
        raise CheckError(f"the results for predictions that write padding (0) after their <eos> are wrong. {counted}. "
                         "What the model writes after its <eos>, padding included, must not count.")
    if not (bool(got[0]) and bool(got[2])):
        raise CheckError("a right prediction that writes padding (0) or other tokens after its <eos> was rejected: "
                         "what a model writes after its <eos>, padding included, does not count (greedy decoding "
                         "pads its outputs with 0)")
    if bool(got[1]):
        raise CheckError("a prediction with a wrong token was accepted because it writes padding (0) after its "
                         "<eos>: every real position of the target must match, and the positions after <eos> count "
                         "neither for nor against it")
