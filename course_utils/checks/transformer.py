"""Checkers for notebook 07: layer normalisation, telling pre-LN from post-LN."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from course_utils.blocks import transformer
from course_utils.checks.core import call, check_close, describe, passed
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
        "the variance was divided by D - 1 (torch.var's default, unbiased=True); LayerNorm's variance divides by D":
            (x - mean) / torch.sqrt(x.var(-1, keepdim=True) + 1e-5) * weight + bias,
        "eps was added to the standard deviation, after the square root; in LayerNorm it is added to the variance":
            (x - mean) / (torch.sqrt(var) + 1e-5) * weight + bias,
        "the statistics were taken over the tokens; LayerNorm normalises each token over its own D features":
            (x - x.mean(-2, keepdim=True)) / torch.sqrt(x.var(-2, keepdim=True, unbiased=False) + 1e-5) * weight + bias,
        "weight (gamma) and bias (beta) are missing: the tokens are normalised but neither scaled nor shifted": normalised,
        "weight and bias are swapped: the gain gamma is added and the shift beta multiplies": normalised * bias + weight,
        "the weight (gamma) is missing: the tokens are shifted but not scaled": normalised + bias,
        "the bias (beta) is missing: the tokens are scaled but not shifted": normalised * weight,
        "the bias (beta) is subtracted: the shift has the wrong sign": normalised * weight - bias,
    }
    check_close(got, expected, name="the normalised tokens", shape="B T D", dims={"B": B, "T": T, "D": D},
                suspects=suspects, hint="compare the mean, the variance, eps, the gain and the shift with section 1's "
                                        "equation, one at a time")
    passed("layer_norm")


def _black_box_blocks(D: int) -> list[tuple[str, bool, bool, Callable[[torch.Tensor], torch.Tensor]]]:
    """(description, pre-LN?, LayerNorms changed?, the block as a plain function of x) for ``check_is_pre_ln``."""
    memory = torch.randn(2, 7, D)  # (B, S, D), what the decoder blocks read
    cases = []
    for norm_first in (False, True):
        kind = "pre-LN" if norm_first else "post-LN"
        for learned in (False, True):
            encoder = transformer.TransformerEncoderBlock(D, 2, 2 * D, norm_first=norm_first).eval()
            decoder = transformer.TransformerDecoderBlock(D, 2, 2 * D, norm_first=norm_first).eval()
            if learned:
                with torch.no_grad():
                    for module in list(encoder.modules()) + list(decoder.modules()):
                        if isinstance(module, transformer.LayerNorm):
                            module.weight.copy_(1.0 + 0.5 * torch.randn(D))
                            module.bias.copy_(0.5 * torch.randn(D))
            norms = "gain and shift not 1 and 0" if learned else "gain 1, shift 0"
            cases.append((f"a {kind} encoder block ({norms})", norm_first, learned,
                          lambda x, block=encoder: block(x)))
            cases.append((f"a {kind} decoder block ({norms})", norm_first, learned,
                          lambda x, block=decoder: block(x, memory)))
        theirs = torch.nn.TransformerEncoderLayer(D, 2, 2 * D, dropout=0.0, batch_first=True,
                                                  norm_first=norm_first).eval()
        cases.append((f"a {kind} nn.TransformerEncoderLayer", norm_first, False, lambda x, block=theirs: block(x)))
    return cases


def check_is_pre_ln(fn: Callable[..., Any], seed: int = 0, D: int = 16) -> None:
    """Check a learner's ``is_pre_ln(block, D) -> bool`` on black-box blocks (notebook 07, exercise 2).

    The blocks are plain functions from (B, T, D) to (B, T, D): encoder and
    decoder blocks of the course and of PyTorch, pre-LN and post-LN, with
    LayerNorms whose gain and shift are the defaults (1 and 0) or random.

    Raises:
        CheckError: Naming the blocks that were misjudged and, where it can, the likely bug.
    """
    __tracebackhide__ = True  # noqa: F841
    with torch.random.fork_rng(devices=[]):  # the learner's random state is left as it was
        torch.manual_seed(seed)
        cases = _black_box_blocks(D)
    wrong, answers = [], []
    for description, pre_ln, learned, block in cases:
        got = call(fn, block, D, name="is_pre_ln", expected="True (pre-LN) or False (post-LN)",
                   error_hint="block is a plain function from (B, T, D) to (B, T, D): you can call it, "
                              "but it has no attributes to read")
        if isinstance(got, np.bool_) or (isinstance(got, torch.Tensor) and got.numel() == 1 and got.dtype == torch.bool):
            got = bool(got)
        if not isinstance(got, bool):
            raise CheckError(f"is_pre_ln returned {describe(got)} for {description}: return True (pre-LN) or "
                             "False (post-LN)")
        answers.append(got)
        if got != pre_ln:
            wrong.append((description, pre_ln, learned))
    if not wrong:
        passed("is_pre_ln")
        return
    if len(set(answers)) == 1:
        raise CheckError(f"is_pre_ln returned {answers[0]} for every block, pre-LN and post-LN alike: it has to "
                         "tell them apart by what the block does to an input")
    if len(wrong) == len(cases):
        raise CheckError("is_pre_ln has the placements the wrong way round: it said post-LN for every pre-LN block "
                         "and pre-LN for every post-LN block")
    said = ", ".join(f"{description} (your answer: {'pre' if not pre_ln else 'post'}-LN)"
                     for description, pre_ln, _ in wrong)
    if all(not pre_ln and learned for _, pre_ln, learned in wrong):
        raise CheckError(f"is_pre_ln misjudged {said}. It judged the post-LN blocks right only while their last "
                         "LayerNorm had gain 1 and shift 0. With another gain and shift, a post-LN block's output "
                         "tokens need not have mean 0 and variance 1, so a test of the output's statistics "
                         "cannot tell the placements apart")
    raise CheckError(f"is_pre_ln misjudged {said}")
