"""Checkers for notebook 04: attention entropy, per-head scaled scores, the effective scale of attention code."""

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


def check_attention_scale(fn: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], Any], seed: int = 0, B: int = 2,
                          H: int = 3, T: int = 4, S: int = 5, Dk: int = 16, Dv: int = 7) -> None:
    """Check that attention code ``fn(q, k, v) -> out`` (or ``(out, weights)``) scales the scores by 1/sqrt(Dk).

    Notebook 04, common pitfalls: attention written around a library call can
    end up with another effective scale (scaled twice, ``scale=`` given the
    divisor, the scale applied after the softmax), or with a softmax that
    overflows. Two calls: ordinary inputs (q, k, v of shapes (B, H, T, Dk),
    (B, H, S, Dk), (B, H, S, Dv)), where each of those mistakes gives a
    different output; then queries and keys ten times larger, so that even the
    scaled scores reach about 100, where exp overflows in float32.

    Raises:
        CheckError: Naming the effective scale, or the overflow.
    """
    __tracebackhide__ = True  # noqa: F841
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, T, Dk, generator=g)
    k = torch.randn(B, H, S, Dk, generator=g)
    v = torch.randn(B, H, S, Dv, generator=g)
    dims = {"B": B, "H": H, "T": T, "Dv": Dv}
    for label, factor in (("", 1.0), (" for large scores (queries and keys 10 times larger)", 10.0)):
        qs, ks = factor * q, factor * k
        got = call(fn, qs, ks, v, name="attention", expected=f"out of shape (B, H, T, Dv) = {(B, H, T, Dv)}")
        out = got[0] if isinstance(got, tuple) and len(got) == 2 else got
        expected, _ = attention.scaled_dot_product_attention(qs, ks, v)
        if (factor > 1 and isinstance(out, torch.Tensor) and tuple(out.shape) == (B, H, T, Dv)
                and not torch.isfinite(out).all()):
            raise CheckError(
                f"out is NaN or inf{label}: exp overflows float32 for scores above about 88, even after the "
                "1/sqrt(Dk) scale. Subtract each row's largest score before exp (torch.softmax does), "
                "which leaves the weights unchanged")
        raw = qs @ ks.transpose(-2, -1)  # (B, H, T, Dk) @ (B, H, Dk, S) -> (B, H, T, S)

        def out_with(scores: torch.Tensor) -> torch.Tensor:
            return torch.softmax(scores, dim=-1) @ v  # (B, H, T, S) @ (B, H, S, Dv) -> (B, H, T, Dv)

        suspects = {
            "the scores were not scaled: multiply them by 1/sqrt(Dk)": out_with(raw),
            f"the scores were divided by Dk = {Dk} in all, not by sqrt(Dk): were they scaled twice, e.g. q divided "
            "by sqrt(Dk) and then passed to a function that scales by 1/sqrt(Dk) again? (μP divides by Dk on "
            "purpose, with its own initialisation and learning rates; this attention is meant to use 1/sqrt(Dk))":
                out_with(raw / Dk),
            f"the scores were multiplied by sqrt(Dk) = {Dk**0.5:g}: `scale=` (in F.scaled_dot_product_attention and "
            "in the course's attention) is the factor that multiplies the scores, so pass 1/sqrt(Dk) or leave it None":
                out_with(raw * Dk**0.5),
            f"the scores were scaled by the model width, 1/sqrt(H · Dk) = 1/sqrt({H * Dk}): each head's dot product "
            f"sums over Dk = {Dk} numbers": out_with(raw / (H * Dk) ** 0.5),
            "the scale was applied after the softmax (to the weights or to out): the weights then sum to "
            "1/sqrt(Dk) and are as sharp as unscaled ones. The scale belongs on the scores, before the softmax":
                out_with(raw) / Dk**0.5,
            "the scale was applied after the softmax as well as before it: out is sqrt(Dk) times too small":
                expected / Dk**0.5,
        }
        check_close(out, expected, name=f"out{label}", shape="B H T Dv", dims=dims, suspects=suspects,
                    hint="out = softmax(q @ k^T / sqrt(Dk)) @ v, with the softmax over the keys")
    passed("attention scale")
