"""Checkers for notebook 07: layer normalisation, telling pre-LN from post-LN, PyTorch's decoder layer from its weights."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from course_utils.blocks import attention, masks, multihead, transformer
from course_utils.checks.core import (call, check_close, check_gradients, describe, passed, reference_guard,
                                     shape_cases, sweep)
from course_utils.core.errors import CheckError
from course_utils.checks.flow import exercise_check


@exercise_check
def check_layer_norm(fn: Callable[..., Any], seed: int = 0, B: int = 2, T: int = 3, D: int = 6) -> None:
    """Check a learner's ``layer_norm(x, weight, bias, eps=1e-5) -> (B, T, D)`` (notebook 07, exercise 1).

    One token has a tiny variance (1e-6), so where eps goes matters; the same
    tokens with eps=0.5 catch an answer that ignores its eps. Then a
    token with all features equal (variance 0), a token far from 0 (mean 1000,
    spread 1: E[x²] - E[x]² loses every digit in float32) and a backward pass. At
    the sizes asked for, at B = 1, T = 1 and sizes that all differ, and on
    (T, D) and (B, H, T, D) inputs (the text allows any leading axes).
    ``nn.LayerNorm`` and ``F.layer_norm`` are ruled out by the exercise text.

    Raises:
        CheckError: Naming the likely bug.
    """
    __tracebackhide__ = True  # noqa: F841
    leading = "the code assumes 3-D x: the features are the last axis, whatever the number of leading axes"
    cases = shape_cases({"B": B, "T": T, "D": D}, ones=("B", "T"), distinct={"B": 2, "T": 3, "D": 6})
    cases += [(f"(T, D) = {(T, D)} x, without a batch axis", {"B": None, "T": T, "D": D}, leading),
              (f"(B, H, T, D) = {(B, 2, T, D)} x, with one more leading axis", {"B": B, "T": T, "D": D, "H": 2},
               leading)]
    ruled_out = "the exercise rules out nn.LayerNorm and F.layer_norm: write it yourself from what section 1 asks of it"
    with reference_guard(fn, transformer.layer_norm, ruled_out={F.layer_norm: ruled_out, torch.layer_norm: ruled_out}):
        sweep(lambda B, T, D, H=None: _layer_norm_once(fn, seed, tuple(n for n in (B, H) if n is not None), T, D),
              cases)
    passed("layer_norm")


def _layer_norm_once(fn: Callable[..., Any], seed: int, lead: tuple[int, ...], T: int, D: int) -> None:
    __tracebackhide__ = True  # noqa: F841
    g = torch.Generator().manual_seed(seed)
    letters = ("B", "H")[:len(lead)]
    shape, dims = " ".join(letters + ("T", "D")), {**dict(zip(letters, lead)), "T": T, "D": D}
    x = 3.0 + 2.0 * torch.randn(*lead, T, D, generator=g)
    x[(0,) * (len(lead) + 1)] = 1e-3 * torch.randn(D, generator=g)  # a token with variance ~1e-6 (centred: no cancellation)
    weight = 1.0 + 0.5 * torch.randn(D, generator=g)
    bias = 0.5 * torch.randn(D, generator=g)
    inputs = (x, weight, bias)
    copies = tuple(t.clone() for t in inputs)
    got = call(fn, x, weight, bias, 1e-5, name="layer_norm",
               expected=f"a ({', '.join(shape.split())}) = {tuple(x.shape)} tensor")
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
        "eps is missing: the token with a tiny variance is divided by its own tiny standard deviation. Dividing by "
        "the square root of variance + eps leaves it the variance the exercise asks for, variance / (variance + eps)":
            (x - mean) / torch.sqrt(var) * weight + bias,
        "the centred tokens were divided by the variance itself; dividing by a number s turns the variance into "
        "variance / s², so it is the square root of variance + eps that gives variance / (variance + eps)":
            (x - mean) / (var + 1e-5) * weight + bias,
        "the statistics were taken over the tokens; LayerNorm normalises each token over its own D features":
            (x - x.mean(-2, keepdim=True)) / torch.sqrt(x.var(-2, keepdim=True, unbiased=False) + 1e-5) * weight + bias,
        "the statistics were taken over the whole tensor, every token at once; LayerNorm normalises each token over "
        "its own D features (the last axis)":
            (x - x.mean()) / torch.sqrt(x.var(unbiased=False) + 1e-5) * weight + bias,
        "the statistics were taken over the first axis, across the batch, as batch normalisation does; LayerNorm "
        "normalises each token over its own D features (the last axis)":
            (x - x.mean(0, keepdim=True)) / torch.sqrt(x.var(0, keepdim=True, unbiased=False) + 1e-5) * weight + bias,
        "weight (gamma) and bias (beta) are missing: the tokens are normalised but neither scaled nor shifted": normalised,
        "weight and bias are swapped: the gain gamma is added and the shift beta multiplies": normalised * bias + weight,
        "the weight (gamma) is missing: the tokens are shifted but not scaled": normalised + bias,
        "the bias (beta) is missing: the tokens are scaled but not shifted": normalised * weight,
        "the bias (beta) is subtracted: the shift has the wrong sign": normalised * weight - bias,
    }
    check_close(got, expected, name="the normalised tokens", shape=shape, dims=dims,
                suspects=suspects, hint="check what section 1 asks of each token (its mean, its variance, where eps "
                                        "goes, the gain and the shift), one at a time")
    # Another eps, large enough to change every token: an answer that ignores its eps argument gives eps=1e-5's output.
    got = call(fn, x, weight, bias, 0.5, name="layer_norm",
               expected=f"a ({', '.join(shape.split())}) = {tuple(x.shape)} tensor")
    check_close(got, transformer.layer_norm(x, weight, bias, 0.5), name="the normalised tokens for eps=0.5",
                shape=shape, dims=dims,
                suspects={"layer_norm ignored its eps argument: called with eps=0.5, it returned what eps=1e-5 gives. "
                          "Use the eps it is given; 1e-5 is only the default": expected},
                hint="the output for eps=1e-5 was right, for eps=0.5 it is not: look at where eps goes")
    # Two boundary tokens: all features equal (variance 0: the output is the shift), and one far from 0.
    edge = torch.randn(*lead, T, D, generator=g)
    tokens = edge.view(-1, D)  # (number of tokens, D), a view of edge
    tokens[0] = 2.5  # variance 0
    far = tokens.shape[0] > 1
    if far:
        tokens[-1] = 1000.0 + torch.randn(D, generator=g)  # mean 1000, variance about 1
    got = call(fn, edge, weight, bias, 1e-5, name="layer_norm",
               expected=f"a ({', '.join(shape.split())}) = {tuple(x.shape)} tensor")
    want = transformer.layer_norm(edge, weight, bias, 1e-5)
    if far and isinstance(got, torch.Tensor) and got.shape == want.shape:
        got_tokens, want_tokens = got.reshape(-1, D), want.reshape(-1, D)
        if (not torch.allclose(got_tokens[-1], want_tokens[-1], atol=1e-4, rtol=1e-3)
                and torch.allclose(got_tokens[:-1], want_tokens[:-1], atol=1e-4, rtol=1e-3)):
            raise CheckError("the token far from 0 (its mean a thousand times its spread) is wrong: its variance lost "
                             "its precision. E[x²] - E[x]² subtracts two nearly equal numbers of about a million, "
                             "and float32 keeps only about 7 digits: subtract the mean before squaring")
    check_close(got, want, name="the normalised tokens (one with all features equal, one far from 0)",
                shape=shape, dims=dims, atol=1e-4, rtol=1e-3,
                hint="a token whose features are all equal has variance 0: eps keeps the division finite, and the "
                     "output is the shift")
    check_gradients(fn, (x, weight, bias), transformer.layer_norm, name="layer_norm",
                    wrt={0: "x", 1: "weight", 2: "bias"}, what="the normalised tokens", seed=seed, atol=1e-4, rtol=1e-3)


# The LayerNorms of the black-box blocks: (label, gain, spread of the random shifts). None: a new LayerNorm's 1 and 0;
# a float: every gain that value (5 makes what the sublayers add outweigh the input); a pair: gains mean ± spread.
_NORMS = (("gain 1, shift 0", None, 0.0), ("gains about 1, random shifts", (1.0, 0.5), 0.5),
          ("gain 5, random shifts", 5.0, 2.0), ("gain 0.2, random shifts", 0.2, 2.0))


def _set_norms(module: torch.nn.Module, D: int, gain: float | tuple[float, float] | None, shift: float) -> None:
    """Give every LayerNorm of ``module`` (the course's or PyTorch's) the gains and shifts of one row of ``_NORMS``."""
    if gain is None:
        return
    with torch.no_grad():
        for norm in module.modules():
            if isinstance(norm, (transformer.LayerNorm, torch.nn.LayerNorm)):
                norm.weight.copy_(gain[0] + gain[1] * torch.randn(D) if isinstance(gain, tuple)
                                  else torch.full((D,), gain))
                norm.bias.copy_(shift * torch.randn(D))


def _black_box_blocks(D: int) -> list[tuple[str, bool, str, Callable[[torch.Tensor], torch.Tensor]]]:
    """(description, pre-LN?, the LayerNorms' gains and shifts, the block as a plain function of x) for
    ``check_is_pre_ln``: the course's encoder and decoder blocks with every row of ``_NORMS``, and PyTorch's encoder
    layer with the default LayerNorms and with gain 5."""
    sources = torch.randn(2, 7, D)  # (2, S, D): what the decoder blocks read

    def memory(x: torch.Tensor) -> torch.Tensor:
        """(B, S, D) for an input of any batch size B: the two sources in turn."""
        return sources[torch.arange(x.shape[0]) % len(sources)] if x.dim() == 3 else sources[0]

    cases = []
    for norm_first in (False, True):
        kind = "pre-LN" if norm_first else "post-LN"
        for norms, gain, shift in _NORMS:
            encoder = transformer.TransformerEncoderBlock(D, 2, 2 * D, norm_first=norm_first).eval()
            decoder = transformer.TransformerDecoderBlock(D, 2, 2 * D, norm_first=norm_first).eval()
            _set_norms(encoder, D, gain, shift)
            _set_norms(decoder, D, gain, shift)
            cases.append((f"a {kind} encoder block ({norms})", norm_first, norms, lambda x, block=encoder: block(x)))
            cases.append((f"a {kind} decoder block ({norms})", norm_first, norms,
                          lambda x, block=decoder: block(x, memory(x))))
        for norms, gain, shift in (_NORMS[0], _NORMS[2]):
            theirs = torch.nn.TransformerEncoderLayer(D, 2, 2 * D, dropout=0.0, batch_first=True,
                                                      norm_first=norm_first).eval()
            _set_norms(theirs, D, gain, shift)
            cases.append((f"a {kind} nn.TransformerEncoderLayer ({norms})", norm_first, norms,
                          lambda x, block=theirs: block(x)))
    return cases


@exercise_check
def check_is_pre_ln(fn: Callable[..., Any], seed: int = 0, D: int = 16) -> None:
    """Check a learner's ``is_pre_ln(block, D) -> bool`` on black-box blocks (notebook 07, exercise 2).

    The blocks are plain functions from (B, T, D) to (B, T, D), for any B:
    encoder and decoder blocks of the course and of PyTorch, pre-LN and post-LN, with
    LayerNorms whose gain and shift are the defaults (1 and 0), random near 1, large
    (5, with random shifts: the sublayers then add more than the input carries) or
    small (0.2), as the exercise says "whatever the gains and shifts".

    Raises:
        CheckError: Naming the blocks that were misjudged and, where it can, the likely bug.
    """
    __tracebackhide__ = True  # noqa: F841
    with reference_guard(fn, transformer.is_pre_ln):
        _is_pre_ln_blocks(fn, seed, D)
    passed("is_pre_ln")


def _is_pre_ln_blocks(fn: Callable[..., Any], seed: int, D: int) -> None:
    __tracebackhide__ = True  # noqa: F841
    with torch.random.fork_rng(devices=[]):  # the learner's random state is left as it was
        torch.manual_seed(seed)
        cases = _black_box_blocks(D)
    wrong, answers = [], []
    for description, pre_ln, norms, block in cases:
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
            wrong.append((description, pre_ln, norms))
    if not wrong:
        return
    if len(set(answers)) == 1:
        raise CheckError(f"is_pre_ln returned {answers[0]} for every block, pre-LN and post-LN alike: it has to "
                         "tell them apart by what the block does to an input")
    if len(wrong) == len(cases):
        raise CheckError("is_pre_ln has the placements the wrong way round: it said post-LN for every pre-LN block "
                         "and pre-LN for every post-LN block")
    said = ", ".join(f"{description} (your answer: {'pre' if not pre_ln else 'post'}-LN)"
                     for description, pre_ln, _ in wrong)
    if all(not pre_ln and norms != _NORMS[0][0] for _, pre_ln, norms in wrong):
        raise CheckError(f"is_pre_ln misjudged {said}. It judged the post-LN blocks right only while their last "
                         "LayerNorm had gain 1 and shift 0. With another gain and shift, a post-LN block's output "
                         "tokens need not have mean 0 and variance 1, so a test of the output's statistics "
                         "cannot tell the placements apart")
    if all(pre_ln and norms != _NORMS[0][0] for _, pre_ln, norms in wrong):
        raise CheckError(f"is_pre_ln misjudged {said}. It judged the pre-LN blocks right only while their "
                         "LayerNorms' gains and shifts were small. With a gain of 5 (or large shifts) the sublayers "
                         "add more to the output than the input itself carries, and what they add does not grow with "
                         "the input (each reads a LayerNorm of it), so an input made a little larger leaves a pre-LN "
                         "block's output almost as it was, as a post-LN block's. The test must hold whatever the "
                         "gains and shifts")
    raise CheckError(f"is_pre_ln misjudged {said}")


# --- exercise 3: PyTorch's decoder layer, computed from its saved weights -------------------------------------

_LAYERS = (("a post-LN layer", False, "relu"), ("a pre-LN layer", True, "relu"),
           ("a post-LN layer with GELU", False, "gelu"), ("a pre-LN layer with GELU", True, "gelu"))
_COPIES = ("copies PyTorch's weights into the course's modules for you, and reading them is the exercise: take the "
           "blocks of in_proj_weight and in_proj_bias yourself")
_TANH_GELU = ("this layer's activation is the exact GELU, x·Φ(x) with Φ the normal distribution function, which is "
              "what activation='gelu' means in PyTorch's layer; your function uses its tanh approximation "
              "(approximate='tanh'), whose values and gradients differ slightly from it")
_ATTENTION = ("your function calls PyTorch's attention (nn.MultiheadAttention or F.multi_head_attention_forward), "
              "which reads in_proj_weight for you: compute the attention from the weights in state")


@exercise_check
def check_decoder_layer_forward(fn: Callable[..., Any], seed: int = 0, B: int = 2, T: int = 3, S: int = 5,
                                D: int = 28, H: int = 4) -> None:
    """Check ``decoder_layer_forward(state, x, memory, memory_mask, num_heads, norm_first, activation)`` (07, exercise 3).

    ``state`` is the ``state_dict()`` of an ``nn.TransformerDecoderLayer``, and the
    answer is compared with that layer itself, in evaluation mode: post-LN and
    pre-LN, ReLU and GELU, every parameter random (a new layer's attention
    biases are 0 and its LayerNorms' gains 1, which would hide a missing bias or
    a swapped LayerNorm), without a mask and with a padding mask in which one
    source has a single real position. Then the gradients with respect to ``x``,
    ``memory`` and every weight. At the sizes asked for (T != S), at B = 1,
    H = 1, T = 1 and S = 1, and at sizes that all differ. A function that runs
    PyTorch's layer or attention, or the course's weight-copying helpers, is
    rejected.

    Raises:
        CheckError: Naming the likely bug.
    """
    __tracebackhide__ = True  # noqa: F841
    ruled_out = {
        torch.nn.TransformerDecoderLayer.forward: "your function runs PyTorch's layer (nn.TransformerDecoderLayer."
                                                  "forward): compute the layer from the weights in state",
        torch.nn.MultiheadAttention.forward: _ATTENTION,
        F.multi_head_attention_forward: _ATTENTION,
        transformer.block_from_torch: f"your function calls block_from_torch, which {_COPIES}",
        multihead.MultiHeadAttention.from_torch: f"your function calls MultiHeadAttention.from_torch, which {_COPIES}",
    }
    with reference_guard(fn, transformer.decoder_layer_forward, ruled_out=ruled_out):
        sweep(lambda B, T, S, D, H: _decoder_layer_once(fn, seed, B, T, S, D, H),
              shape_cases({"B": B, "T": T, "S": S, "D": D, "H": H}, ones=("B", "H", "T", "S"),
                          distinct={"B": 2, "T": 3, "S": 5, "D": 28, "H": 4}))
    passed("decoder_layer_forward")


def _random_layer(seed: int, g: torch.Generator, D: int, H: int, norm_first: bool,
                  activation: str) -> torch.nn.TransformerDecoderLayer:
    with torch.random.fork_rng(devices=[]):  # the learner's random state is left as it was
        torch.manual_seed(seed)
        layer = torch.nn.TransformerDecoderLayer(D, H, 2 * D, dropout=0.0, batch_first=True, norm_first=norm_first,
                                                 activation=activation).eval()
    with torch.no_grad():
        for name, p in layer.named_parameters():
            if name.startswith("norm") and name.endswith("weight"):
                p.copy_(1.0 + 0.5 * torch.randn(p.shape, generator=g))  # a gain that is not 1
            elif name.endswith("bias"):
                p.copy_(0.5 * torch.randn(p.shape, generator=g))  # PyTorch starts the attention biases at 0
    return layer


def _torch_decoder(layer: torch.nn.Module, x: torch.Tensor, memory: torch.Tensor,
                   memory_mask: torch.Tensor | None, weights: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
    """PyTorch's own layer (with ``weights`` in place of its own, if given), given the course's masks the way it
    reads them (True = ignore)."""
    ignore = None if memory_mask is None else ~memory_mask[:, 0]  # (B, 1, S) -> (B, S)
    masks_ = {"tgt_mask": ~masks.causal_mask(x.shape[1]), "memory_key_padding_mask": ignore}
    if weights is None:
        return layer(x, memory, **masks_)
    return torch.func.functional_call(layer, weights, (x, memory), masks_)


def _decoder_variant(layer: Any, x: torch.Tensor, memory: torch.Tensor, memory_mask: torch.Tensor | None, *,
                     causal: str = "yes", pad: str = "yes", norm_memory: bool = False, blocks: tuple[int, ...] = (0, 1, 2),
                     transposed: bool = False, bias: bool = True, pre_ln: bool | None = None, width_scale: bool = False,
                     cross_reads_target: bool = False, out_proj: bool = True, relu: bool = False,
                     tanh_gelu: bool = False) -> torch.Tensor:
    """The layer's output with one deliberate mistake (the keyword that is not at its default)."""
    pre_ln = layer.norm_first if pre_ln is None else pre_ln
    T = x.shape[1]
    self_mask = {"yes": masks.causal_mask(T), "no": None, "flipped": ~masks.causal_mask(T)}[causal]
    cross_mask = None if memory_mask is None or pad == "no" else memory_mask[:, None]  # (B, 1, 1, S)
    if memory_mask is not None and pad == "no head axis":
        cross_mask = memory_mask  # (B, 1, S), read as (1, B, 1, S): it broadcasts only if B = H (or B = 1)
    if cross_mask is not None and pad == "flipped":
        cross_mask = ~cross_mask

    def attend(module: torch.nn.MultiheadAttention, query: torch.Tensor, source: torch.Tensor,
               mask: torch.Tensor | None) -> torch.Tensor:
        weights, biases = module.in_proj_weight.chunk(3), module.in_proj_bias.chunk(3)
        q, k, v = (multihead.split_heads(F.linear(t, weights[blocks[i]].T if transposed else weights[blocks[i]],
                                                  biases[blocks[i]] if bias else None), module.num_heads)
                   for i, t in enumerate((query, source, source)))  # (B, H, length, Dh) each
        scale = module.embed_dim ** -0.5 if width_scale else None
        context, _ = attention.scaled_dot_product_attention(q, k, v, mask, scale)  # guarded: a fully masked row is 0
        merged = multihead.merge_heads(context)  # (B, T, D)
        return module.out_proj(merged) if out_proj else merged

    def cross(h: torch.Tensor) -> torch.Tensor:
        if cross_reads_target:
            return attend(layer.multihead_attn, h, h, None)  # the target again, without the source's mask
        return attend(layer.multihead_attn, h, layer.norm2(memory) if norm_memory and pre_ln else memory, cross_mask)

    activation = F.relu if relu else _gelu_tanh if tanh_gelu else layer.activation
    h = transformer.residual(x, lambda h: attend(layer.self_attn, h, h, self_mask), layer.norm1, pre_ln)
    h = transformer.residual(h, cross, layer.norm2, pre_ln)
    return transformer.residual(h, lambda h: layer.linear2(activation(layer.linear1(h))), layer.norm3, pre_ln)


def _gelu_tanh(h: torch.Tensor) -> torch.Tensor:
    return F.gelu(h, approximate="tanh")


def _with_tanh_gelu(layer: torch.nn.TransformerDecoderLayer) -> torch.nn.TransformerDecoderLayer:
    """A copy of a GELU layer that uses the tanh approximation of GELU instead."""
    other = copy.deepcopy(layer)
    other.activation = _gelu_tanh
    return other


def _decoder_suspects(layer: Any, x: torch.Tensor, memory: torch.Tensor,
                      memory_mask: torch.Tensor | None) -> dict[str, torch.Tensor]:
    """{the mistake, in words: what a layer computed with it returns}."""
    kind = "pre-LN" if layer.norm_first else "post-LN"
    mistakes = {
        "the self-attention lets position i read the target positions after i: a decoder's self-attention is causal "
        "(section 6)": dict(causal="no"),
        "the causal mask is flipped: in this course True means 'may attend', so position i may read positions 0 to "
        "i; PyTorch's layer is the one that needs ~mask": dict(causal="flipped"),
        "the cross-attention also reads the padded source positions: apply memory_mask (True = may attend)":
            dict(pad="no"),
        "memory_mask is flipped: it is already in the course's convention (True = may attend); ~mask is what "
        "PyTorch's own layer needs, not your function": dict(pad="flipped"),
        "the memory was normalised too: in a pre-LN layer norm2 normalises the decoder's stream, which gives the "
        "queries; the keys and values come from the memory as it is": dict(norm_memory=True),
        "the queries and the keys were projected with each other's block of in_proj_weight and in_proj_bias":
            dict(blocks=(1, 0, 2)),
        "the keys and the values were projected with each other's block of in_proj_weight and in_proj_bias":
            dict(blocks=(0, 2, 1)),
        "the queries and the values were projected with each other's block of in_proj_weight and in_proj_bias":
            dict(blocks=(2, 1, 0)),
        "each projection applied its block W of in_proj_weight as h W, but PyTorch stores a weight as (out, in) and "
        "applies it as h W^T + b, as nn.Linear does": dict(transposed=True),
        "in_proj_bias is missing: each projection adds its own block of in_proj_bias": dict(bias=False),
        f"the normalisation is in the wrong place: this layer has norm_first={layer.norm_first}, so it is {kind} "
        "(section 3)": dict(pre_ln=not layer.norm_first),
        "the scores were scaled by 1/sqrt(D), D the model width; each head scales by 1/sqrt(Dh), Dh = D / H "
        "(notebook 05)": dict(width_scale=True),
        "the second attention attends to the target again: its keys and values come from memory (cross-attention)":
            dict(cross_reads_target=True),
        "the attention's output projection (out_proj) is missing": dict(out_proj=False),
        "this layer's activation is GELU (activation='gelu'), not ReLU": dict(relu=True),
    }
    if layer.activation is F.gelu:
        mistakes[_TANH_GELU] = dict(tanh_gelu=True)
    if memory_mask is not None and x.shape[0] == layer.self_attn.num_heads > 1:  # else it raises, or is right (B = 1)
        mistakes["memory_mask was used without a head axis. (B, 1, S) is the shape for (B, T, S) scores; against the "
                 "cross-attention's (B, H, T, S) scores its batch axis lines up with the heads (it runs only because "
                 "B = H here), so head h reads the padding of sequence h"] = dict(pad="no head axis")
    with torch.no_grad():
        return {mistake: _decoder_variant(layer, x, memory, memory_mask, **change)
                for mistake, change in mistakes.items()}


def _decoder_layer_once(fn: Callable[..., Any], seed: int, B: int, T: int, S: int, D: int, H: int) -> None:
    __tracebackhide__ = True  # noqa: F841
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T, D, generator=g)
    memory = 0.5 + 1.5 * torch.randn(B, S, D, generator=g)  # another scale than x: the memory is not the target
    lengths = torch.randint(1, S + 1, (B,), generator=g)
    lengths[0] = S if B > 1 else max(1, S - 1)
    lengths[-1] = 1 if B > 1 else lengths[-1]  # a source with a single real position
    pad = masks.padding_mask(lengths, S)  # (B, 1, S), True = may attend
    dims = {"B": B, "T": T, "D": D}
    expected_shape = f"a (B, T, D) = {(B, T, D)} tensor"
    error_hint = ("state maps names such as 'self_attn.in_proj_weight' to tensors (print its keys and shapes); memory "
                  "has its own length S, which need not be T")
    mask_hint = ("it runs without a mask and fails with one. memory_mask is (B, 1, S), the shape for (B, T, S) scores, "
                 "but the cross-attention's scores are (B, H, T, S); and memory has its own length S, which need not "
                 "be T")  # a call with the mask comes after the same layer ran right without it
    for description, norm_first, activation in _LAYERS:
        layer = _random_layer(seed, g, D, H, norm_first, activation)
        saved = {name: t.clone() for name, t in layer.state_dict().items()}
        for mask_label, mask in (("without a mask", None), (f"with a (B, 1, S) = {(B, 1, S)} padding mask", pad)):
            inputs = (x, memory) if mask is None else (x, memory, mask)
            copies = tuple(t.clone() for t in inputs)
            with torch.no_grad():
                got = call(fn, layer.state_dict(), x, memory, mask, H, norm_first, activation,
                           name="decoder_layer_forward", expected=expected_shape,
                           error_hint=error_hint if mask is None else mask_hint)
                expected = _torch_decoder(layer, x, memory, mask)
            if not all(torch.equal(a, b) for a, b in zip(inputs, copies)):
                raise CheckError("decoder_layer_forward changed x, memory or memory_mask in place: use operations that "
                                 "return new tensors")
            if any(not torch.equal(t, saved[name]) for name, t in layer.state_dict().items()):
                raise CheckError("decoder_layer_forward changed the weights in state: read them, never write to them")
            name = f"the output of {description} {mask_label}"
            if (isinstance(got, torch.Tensor) and tuple(got.shape) == (B, T, D) and got.is_floating_point()
                    and not torch.isfinite(got).all()):
                raise CheckError(f"{name} contains NaN or inf: a softmax over a row whose keys are all masked. In this "
                                 "course a mask's True means 'may attend' (section 6), the opposite of PyTorch's "
                                 "convention: did you flip the causal mask or memory_mask?")
            close = (isinstance(got, torch.Tensor) and tuple(got.shape) == (B, T, D) and got.dtype == expected.dtype
                     and torch.allclose(got, expected, atol=1e-4, rtol=1e-4))
            check_close(got, expected, name=name, shape="B T D", dims=dims, atol=1e-4, rtol=1e-4,
                        suspects=None if close else _decoder_suspects(layer, x, memory, mask),
                        hint="compare your layer with section 6's decoder block one sublayer at a time, and check "
                             "which rows of in_proj_weight you use for the queries, the keys and the values")
        names = list(saved)

        def learner(x: torch.Tensor, memory: torch.Tensor, *weights: torch.Tensor, norm_first: bool = norm_first,
                    activation: str = activation) -> Any:
            return fn(dict(zip(names, weights)), x, memory, pad, H, norm_first, activation)

        def reference(x: torch.Tensor, memory: torch.Tensor, *weights: torch.Tensor, layer: Any = layer) -> torch.Tensor:
            return _torch_decoder(layer, x, memory, pad, dict(zip(names, weights)))

        args = (x, memory, *saved.values())
        wrt = _with_a_gradient(reference, args, ["x", "memory", *names])
        try:
            check_gradients(learner, args, reference, name="decoder_layer_forward", wrt=wrt,
                            what=f"the outputs of {description}", seed=seed, atol=1e-4, rtol=1e-3)
        except CheckError:
            # The tanh approximation of GELU is within the tolerance in value, not in gradient: name it, if it is that.
            if activation != "gelu" or not _tanh_gelu_gradients(learner, args, layer, names, pad, wrt, seed):
                raise
            raise CheckError(f"the outputs of {description} are close in value, but not in gradient: {_TANH_GELU}") \
                from None


def _tanh_gelu_gradients(learner: Callable[..., Any], args: tuple[torch.Tensor, ...], layer: Any, names: list[str],
                        pad: torch.Tensor, wrt: dict[int, str], seed: int) -> bool:
    """Whether the learner's gradients are those of the layer with the tanh approximation of GELU."""
    tanh_layer = _with_tanh_gelu(layer)

    def reference(x: torch.Tensor, memory: torch.Tensor, *weights: torch.Tensor) -> torch.Tensor:
        return _torch_decoder(tanh_layer, x, memory, pad, dict(zip(names, weights)))

    try:
        check_gradients(learner, args, reference, name="decoder_layer_forward", wrt=wrt, what="the outputs",
                        seed=seed, atol=1e-4, rtol=1e-3)
    except CheckError:
        return False
    return True


def _with_a_gradient(reference: Callable[..., torch.Tensor], args: tuple[torch.Tensor, ...],
                     names: list[str]) -> dict[int, str]:
    """The inputs the output depends on: ``{position: name}``. Some depend on the sizes: with S = 1 every query
    puts all its weight on the one key, so in a pre-LN layer the output does not depend on norm2 at all (its
    reference gradient is rounding noise, about 1e-7, which no answer needs to reproduce)."""
    with torch.enable_grad():
        leaves = [a.detach().clone().requires_grad_(True) for a in args]
        out = reference(*leaves)
        upstream = torch.randn(out.shape, generator=torch.Generator().manual_seed(0))
        grads = torch.autograd.grad((out * upstream).sum(), leaves, allow_unused=True)
    return {i: name for i, (name, grad) in enumerate(zip(names, grads))
            if grad is not None and grad.abs().max() > 1e-5}
