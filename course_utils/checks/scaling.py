"""Checkers for notebook 04: attention entropy, per-head scaled scores."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from course_utils.blocks import attention, masks
from course_utils.checks.core import call, check_close, passed
from course_utils.core.errors import CheckError


def check_attention_entropy(fn: Callable[[torch.Tensor], Any], seed: int = 0, B: int = 2, T: int = 3,
                            S: int = 5) -> None:
    """Check a learner's ``attention_entropy(weights) -> (B, T)`` in nats (notebook 04, exercise 1).

    The weights include one-hot rows and zeros (masked keys), where 0 · log 0
    must count as 0.

    Raises:
        CheckError: Naming the likely bug.
    """
    __tracebackhide__ = True  # noqa: F841
    g = torch.Generator().manual_seed(seed)
    scores = 2 * torch.randn(B, T, S, generator=g)
    mask = masks.padding_mask(torch.tensor([S] + [max(1, S - 2)] * (B - 1)), S)  # (B, 1, S): some keys masked
    weights = attention.masked_softmax(scores, mask)  # (B, T, S), zeros on masked keys
    weights[0, 0] = torch.nn.functional.one_hot(torch.tensor(1), S).float()  # a one-hot row: entropy 0
    weights_copy = weights.clone()
    got = call(fn, weights, name="attention_entropy", expected=f"entropies of shape (B, T) = {(B, T)}")
    if not torch.equal(weights, weights_copy):
        raise CheckError("attention_entropy changed `weights` in place: use out-of-place operations")
    expected = attention.attention_entropy(weights)
    if isinstance(got, torch.Tensor) and tuple(got.shape) == (B, T) and torch.isnan(got).any():
        raise CheckError("some entropies are NaN: a weight of exactly 0 gives 0 * log(0) = 0 * (-inf) = NaN. "
                         "Count those terms as 0, e.g. log of weights.clamp(min=1e-30), or torch.special.xlogy")
    suspects = {
        "the minus sign is missing: entropy is -Σ_j w_ij log w_ij, which is >= 0": -expected,
        "this is in bits (log2): the course measures entropy in nats, with the natural log torch.log":
            expected / torch.log(torch.tensor(2.0)),
        "this is a mean over the keys: the entropy is the sum over j": expected / S,
    }
    hints = {
        (B, S): "you summed over the queries (dim=-2): the entropy of query i sums over its keys, dim=-1",
        (B, T, S): "the terms -w log w are not yet summed over the keys: .sum(dim=-1)",
        (): "a single number: return one entropy per query, (B, T)",
    }
    check_close(got, expected, name="entropies", shape="B T", dims={"B": B, "T": T}, hints=hints,
                suspects=suspects,
                hint="entropy[b, i] = -sum over j of weights[b, i, j] * log(weights[b, i, j]), with 0 log 0 = 0")
    passed("attention_entropy")


def check_scaled_scores(fn: Callable[[torch.Tensor, torch.Tensor], Any], seed: int = 0, B: int = 2, H: int = 4,
                        T: int = 3, S: int = 5, Dh: int = 6) -> None:
    """Check a learner's ``scaled_scores(q, k) -> (B, H, T, S)`` (notebook 04, exercise 2).

    Raises:
        CheckError: Naming the likely bug, in particular a scale by the model
            width D = H · Dh instead of the per-head key width Dh.
    """
    __tracebackhide__ = True  # noqa: F841
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, T, Dh, generator=g)
    k = torch.randn(B, H, S, Dh, generator=g)
    copies = (q.clone(), k.clone())
    got = call(fn, q, k, name="scaled_scores", expected=f"scores of shape (B, H, T, S) = {(B, H, T, S)}")
    if not (torch.equal(q, copies[0]) and torch.equal(k, copies[1])):
        raise CheckError("scaled_scores changed q or k in place: use out-of-place operations")
    expected = attention.scaled_scores(q, k)
    raw = q @ k.transpose(-2, -1)
    D = H * Dh
    suspects = {
        "the scores were not scaled: divide by sqrt(Dh) = sqrt(q.shape[-1])": raw,
        f"the scores were scaled by the model width, sqrt(D) = sqrt(H · Dh) = sqrt({D}): each head's dot product "
        f"sums over Dh = {Dh} numbers, so its variance is Dh; use q.shape[-1]": raw / D**0.5,
        f"the scores were divided by Dh = {Dh}, not by its square root": raw / Dh,
        "the scores were multiplied by sqrt(Dh) instead of divided": raw * Dh**0.5,
        f"the scores were scaled by sqrt(H) = sqrt({H}), the number of heads: use the key width q.shape[-1]":
            raw / H**0.5,
        f"the scores were scaled by sqrt(T) = sqrt({T}), the number of queries: use the key width q.shape[-1]":
            raw / T**0.5,
    }
    hints = {
        (B, H, S, T): "did you compute k @ q^T? Queries index the rows: q @ k.transpose(-2, -1)",
        (B, H, T, Dh): "that is the shape of q: the dot product sums over Dh",
    }
    check_close(got, expected, name="scores", shape="B H T S", dims={"B": B, "H": H, "T": T, "S": S}, hints=hints,
                suspects=suspects, hint="scores = q @ k.transpose(-2, -1) / sqrt(Dh)")
    passed("scaled_scores")
