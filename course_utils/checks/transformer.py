"""Checkers for notebook 07: layer normalisation, residual connections."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from course_utils.blocks import transformer
from course_utils.checks.core import call, check_close, passed
from course_utils.core.errors import CheckError


def check_layer_norm(fn: Callable[..., Any], seed: int = 0, B: int = 2, T: int = 3, D: int = 6) -> None:
    """Check a learner's ``layer_norm(x, weight, bias, eps=1e-5) -> (B, T, D)`` (notebook 07, exercise 1).

    One token has a tiny variance (1e-6), so where eps goes matters.

    Raises:
        CheckError: Naming the likely bug.
    """
    __tracebackhide__ = True  # noqa: F841
    g = torch.Generator().manual_seed(seed)
    x = 3.0 + 2.0 * torch.randn(B, T, D, generator=g)
    x[0, 0] = 1e-3 * torch.randn(D, generator=g)  # a token with variance ~1e-6 (centred: no cancellation)
    weight = 1.0 + 0.5 * torch.randn(D, generator=g)
    bias = 0.5 * torch.randn(D, generator=g)
    inputs = (x, weight, bias)
    copies = tuple(t.clone() for t in inputs)
    got = call(fn, x, weight, bias, 1e-5, name="layer_norm", expected=f"a (B, T, D) = {(B, T, D)} tensor")
    if not all(torch.equal(a, b) for a, b in zip(inputs, copies)):
        raise CheckError("layer_norm changed an input in place: use out-of-place operations")
    expected = transformer.layer_norm(x, weight, bias, 1e-5)
    mean = x.mean(-1, keepdim=True)
    var = x.var(-1, keepdim=True, unbiased=False)
    normalised = (x - mean) / torch.sqrt(var + 1e-5)
    suspects = {
        "the variance was divided by D - 1 (torch.var's default, unbiased=True): LayerNorm divides by D, "
        "use x.var(-1, keepdim=True, unbiased=False) or the mean of squared deviations":
            (x - mean) / torch.sqrt(x.var(-1, keepdim=True) + 1e-5) * weight + bias,
        "eps was added to the standard deviation: it goes inside the square root, sqrt(var + eps)":
            (x - mean) / (torch.sqrt(var) + 1e-5) * weight + bias,
        "the statistics were taken over the tokens (dim=-2): LayerNorm normalises each token over its D "
        "features, dim=-1": (x - x.mean(-2, keepdim=True)) / torch.sqrt(x.var(-2, keepdim=True, unbiased=False) + 1e-5)
        * weight + bias,
        "weight (gamma) and bias (beta) are missing: scale by weight and add bias after normalising": normalised,
        "weight and bias are swapped: normalised * weight + bias": normalised * bias + weight,
        "the weight (gamma) is missing: multiply the normalised input by weight before adding bias": normalised + bias,
    }
    check_close(got, expected, name="the normalised tokens", shape="B T D", dims={"B": B, "T": T, "D": D},
                suspects=suspects, hint="(x - mean) / sqrt(variance + eps) * weight + bias, statistics over the last "
                                        "dimension, variance divided by D")
    passed("layer_norm")


def check_residual(fn: Callable[..., Any], seed: int = 0, B: int = 2, T: int = 3, D: int = 4) -> None:
    """Check a learner's ``residual(x, sublayer, norm, norm_first)`` for both placements (notebook 07, exercise 2).

    Raises:
        CheckError: Naming the likely bug (pre- and post-LN swapped, the
            residual missing or concatenated, the residual path normalised).
    """
    __tracebackhide__ = True  # noqa: F841
    g = torch.Generator().manual_seed(seed)
    x = 2.0 + torch.randn(B, T, D, generator=g)
    W = torch.randn(D, D, generator=g)
    norm = transformer.LayerNorm(D)
    with torch.no_grad():
        norm.weight.copy_(1.0 + 0.5 * torch.randn(D, generator=g))
        norm.bias.copy_(0.5 * torch.randn(D, generator=g))

    def sublayer(h: torch.Tensor) -> torch.Tensor:
        return torch.tanh(h @ W)

    x_copy = x.clone()
    for norm_first in (False, True):
        label = "pre-LN, norm_first=True" if norm_first else "post-LN, norm_first=False"
        with torch.no_grad():
            got = call(fn, x, sublayer, norm, norm_first, name="residual", expected=f"a (B, T, D) = {(B, T, D)} tensor",
                       error_hint="a residual connection adds x and sublayer(...), both (B, T, D); concatenating "
                                  "them doubles the width, which the norm cannot take")
            if not torch.equal(x, x_copy):
                raise CheckError("residual changed x in place (e.g. x += ...): use x + ... instead")
            expected = transformer.residual(x, sublayer, norm, norm_first)
            other = transformer.residual(x, sublayer, norm, not norm_first)
            suspects = {
                f"this is {'post' if norm_first else 'pre'}-LN: with norm_first={norm_first} the block should compute "
                + ("x + sublayer(norm(x))" if norm_first else "norm(x + sublayer(x))"): other,
                "the residual connection is missing: add x": (sublayer(norm(x)) if norm_first else norm(sublayer(x))),
                "the residual path was normalised too: x itself is added unchanged, norm only feeds the sublayer":
                    norm(x) + sublayer(norm(x)),
                "the norm was applied to the sublayer's output: pre-LN normalises the sublayer's input":
                    x + norm(sublayer(x)),
            }
        check_close(got, expected, name=f"the output ({label})", shape="B T D", dims={"B": B, "T": T, "D": D},
                    suspects=suspects,
                    hints={(B, T, 2 * D): "twice as wide: residual connections add (x + sublayer), they do not "
                                          "concatenate"},
                    hint="pre-LN: x + sublayer(norm(x)); post-LN: norm(x + sublayer(x))")
    passed("residual")
