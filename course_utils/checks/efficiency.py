"""Checker for notebook 08: one step of the online softmax."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from course_utils.checks.core import call, check_close, check_tensor, describe, passed
from course_utils.core.errors import CheckError
from course_utils.experiments import efficiency


def _fold(update: Callable[..., Any], blocks: list[tuple[torch.Tensor, torch.Tensor]], T: int,
          Dv: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    m, l, acc = torch.full((T, 1), float("-inf")), torch.zeros(T, 1), torch.zeros(T, Dv)
    for scores, v in blocks:
        m, l, acc = update(m, l, acc, scores, v)
    return m, l, acc


def check_online_softmax_update(fn: Callable[..., Any], seed: int = 0, T: int = 3, Dv: int = 4,
                                block_sizes: tuple[int, ...] = (2, 3, 2)) -> None:
    """Check a learner's ``online_softmax_update(m, l, acc, scores, v) -> (m, l, acc)`` (notebook 08, exercise 1).

    Folds several blocks of keys (the second raises the running maximum, the
    third does not), then compares the final ``acc / l`` with softmax over all
    keys, and every intermediate state with the reference.

    Raises:
        CheckError: Naming the likely bug.
    """
    __tracebackhide__ = True  # noqa: F841
    g = torch.Generator().manual_seed(seed)
    offsets = [0.0, 4.0, -3.0] + [0.0] * max(0, len(block_sizes) - 3)
    blocks = [(2.0 * torch.randn(T, n, generator=g) + offsets[i], torch.randn(n, Dv, generator=g))
              for i, n in enumerate(block_sizes)]
    all_scores = torch.cat([s for s, _ in blocks], dim=-1)  # (T, S)
    all_values = torch.cat([v for _, v in blocks], dim=0)  # (S, Dv)
    expected_out = torch.softmax(all_scores, dim=-1) @ all_values  # (T, Dv)

    def no_acc_rescale(m, l, acc, scores, v):
        m_new = torch.maximum(m, scores.amax(-1, keepdim=True))
        p = torch.exp(scores - m_new)
        return m_new, l * torch.exp(m - m_new) + p.sum(-1, keepdim=True), acc + p @ v

    def no_rescale(m, l, acc, scores, v):
        m_new = torch.maximum(m, scores.amax(-1, keepdim=True))
        p = torch.exp(scores - m_new)
        return m_new, l + p.sum(-1, keepdim=True), acc + p @ v

    def inverted(m, l, acc, scores, v):
        m_new = torch.maximum(m, scores.amax(-1, keepdim=True))
        p = torch.exp(scores - m_new)
        c = torch.exp(m_new - m).nan_to_num(0.0, posinf=0.0)
        return m_new, l * c + p.sum(-1, keepdim=True), acc * c + p @ v

    suspects = {}
    for message, variant in [
        ("acc was not rescaled: when the maximum grows, multiply the old acc by exp(m_old - m_new), as for l",
         no_acc_rescale),
        ("the old sums were not rescaled: when a block raises the maximum, multiply l and acc by exp(m_old - m_new)",
         no_rescale),
        ("the correction is inverted: old sums are multiplied by exp(m_old - m_new) <= 1, not exp(m_new - m_old)",
         inverted),
    ]:
        _, l_v, acc_v = _fold(variant, blocks, T, Dv)
        suspects[message] = acc_v / l_v

    state = (torch.full((T, 1), float("-inf")), torch.zeros(T, 1), torch.zeros(T, Dv))
    states = []
    for i, (scores, v) in enumerate(blocks):
        inputs = (*state, scores, v)
        copies = tuple(t.clone() for t in inputs)
        got = call(fn, *inputs, name="online_softmax_update", expected="a tuple (m, l, acc)",
                   error_hint="m and l are (T, 1), acc is (T, D), scores (T, C) for a block of C keys, v (C, D)")
        if not all(torch.equal(a, b) for a, b in zip(inputs, copies)):
            raise CheckError("online_softmax_update changed an input in place: return new tensors")
        if not isinstance(got, tuple) or len(got) != 3 or not all(isinstance(t, torch.Tensor) for t in got):
            raise CheckError(f"expected a tuple of three tensors (m, l, acc), got {describe(got)}")
        if i == 0 and not torch.isfinite(got[2]).all():
            raise CheckError("after the first block acc has NaN/inf: exp(scores - m) with the old maximum m = -inf is "
                             "inf. The new maximum has to be known before anything is exponentiated")
        states.append(got)
        state = got
    m, l, acc = state
    check_tensor(l, name="l after the last block", shape="T 1", dims={"T": T, "1": 1})
    check_tensor(acc, name="acc after the last block", shape="T Dv", dims={"T": T, "Dv": Dv})
    check_close(acc / l, expected_out, name="acc / l after the last block", shape="T Dv", dims={"T": T, "Dv": Dv},
                suspects=suspects, hint="acc / l must equal softmax(all scores) @ all values")
    ref = (torch.full((T, 1), float("-inf")), torch.zeros(T, 1), torch.zeros(T, Dv))
    for i, ((scores, v), got) in enumerate(zip(blocks, states)):
        ref = efficiency.online_softmax_update(*ref, scores, v)
        check_close(got[0], ref[0], name=f"m after block {i + 1}", shape="T 1", dims={"T": T, "1": 1},
                    hint="m is the running maximum of every score seen so far: a block with smaller scores must not lower it")
        check_close(got[1], ref[1], name=f"l after block {i + 1}", shape="T 1", dims={"T": T, "1": 1},
                    hint="l is the running sum of exp(score - running maximum): what was summed before must be rescaled to the new maximum")
        check_close(got[2], ref[2], name=f"acc after block {i + 1}", shape="T Dv", dims={"T": T, "Dv": Dv},
                    hint="acc is the running sum of exp(score - running maximum) times the values, rescaled like l")
    # A first block whose keys are all masked for query 0 (its scores are -inf), then an ordinary block.
    masked_first = torch.randn(T, 2, generator=g)
    masked_first[0] = float("-inf")
    later = 2.0 * torch.randn(T, 3, generator=g)
    values = (torch.randn(2, Dv, generator=g), torch.randn(3, Dv, generator=g))
    start = (torch.full((T, 1), float("-inf")), torch.zeros(T, 1), torch.zeros(T, Dv))
    got = call(fn, *start, masked_first, values[0], name="online_softmax_update", expected="a tuple (m, l, acc)")
    if not (isinstance(got, tuple) and len(got) == 3) or not all(
            isinstance(t, torch.Tensor) and not torch.isnan(t).any() for t in got[1:]):
        raise CheckError(
            "a block whose scores are all -inf for one query (every key masked) gave NaN in l or acc: with m = -inf "
            "and m_new = -inf, exp(m - m_new) is exp(-inf + inf) = exp(nan). Such a row has summed nothing yet, so "
            "its l and acc must stay 0"
        )
    m, l, acc = call(fn, *got, later, values[1], name="online_softmax_update", expected="a tuple (m, l, acc)")
    all_scores = torch.cat([masked_first, later], dim=-1)  # (T, 5)
    expected_out = torch.softmax(all_scores, dim=-1) @ torch.cat(values, dim=0)  # (T, Dv); row 0 uses `later` only
    check_close(acc / l, expected_out, name="acc / l after a fully masked first block", shape="T Dv",
                dims={"T": T, "Dv": Dv},
                hint="a masked block must contribute nothing: the later blocks alone decide that query's output")
    passed("online_softmax_update")

