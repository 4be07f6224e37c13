"""Attention building blocks, each written from scratch in the notebook named in its docstring.

Shapes: B batch, T queries, S keys, D width, Dk key width, Dv value width.
Masks are boolean, True = may attend (the convention of
``torch.nn.functional.scaled_dot_product_attention``).
"""

from __future__ import annotations

import math

import torch

from course_utils.core.errors import InputError


def pairwise_scores(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Dot product of every query with every key, batched over any leading axes (notebook 00, section 3).

    Args:
        q: (..., T, Dk) float queries, e.g. (B, T, Dk) or (B, H, T, Dk).
        k: (..., S, Dk) float keys.

    Returns:
        (..., T, S) float, ``scores[..., i, j] = q[..., i, :] · k[..., j, :]``.
    """
    return q @ k.transpose(-2, -1)  # (..., T, Dk) @ (..., Dk, S) -> (..., T, S)


def masked_softmax(scores: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Softmax over the keys (last dim); masked keys get weight exactly 0 (notebook 00, exercise 2).

    A row whose keys are all masked gets all-zero weights instead of NaN.

    Args:
        scores: (..., T, S) float.
        mask: bool broadcastable to ``scores``, True = may attend; None = all keys.

    Returns:
        (..., T, S) float weights; each row sums to 1 (0 if fully masked).
    """
    if mask is None:
        return torch.softmax(scores, dim=-1)  # (..., T, S)
    scores = scores.masked_fill(~mask, float("-inf"))  # (..., T, S)
    weights = torch.softmax(scores, dim=-1)  # (..., T, S); NaN where a row is fully masked
    any_key = mask.any(dim=-1, keepdim=True)  # (..., T or 1, 1)
    return weights.masked_fill(~any_key, 0.0)  # fully-masked rows -> 0 instead of NaN


def validate_attention_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                              mask: torch.Tensor | None = None) -> None:
    """Reject inputs that attention cannot use, with a message that says what to look at (notebook 03).

    Args:
        q: (..., T, Dk) float queries.
        k: (..., S, Dk) float keys.
        v: (..., S, Dv) float values.
        mask: None, or bool broadcastable to (..., T, S), True = may attend.

    Raises:
        InputError: If an input is not a tensor, not floating point, has too
            few dimensions or NaN/inf values, if the widths or lengths do not
            match, or if the mask is not bool or does not broadcast.
    """
    for name, x, letters in (("q", q, "(..., T, Dk)"), ("k", k, "(..., S, Dk)"), ("v", v, "(..., S, Dv)")):
        if not isinstance(x, torch.Tensor):
            got = "None: did a function forget to `return`?" if x is None else f"a {type(x).__name__}"
            raise InputError(f"attention expects {name} to be a tensor of shape {letters}, got {got}")
        if x.dim() < 2:
            raise InputError(f"attention expects {name} of shape {letters} (at least 2 dimensions), got shape "
                             f"{tuple(x.shape)}: a single vector needs a length-1 axis, e.g. {name}[None, :]")
        if not x.is_floating_point():
            raise InputError(f"attention expects float {name}, got dtype {x.dtype}: convert with {name}.float()")
        if not torch.isfinite(x).all():
            raise InputError(f"{name} contains NaN or inf: look at where {name} was computed (an earlier softmax "
                             "over a fully masked row? a division by zero?)")
    if not (q.dtype == k.dtype == v.dtype):
        raise InputError(f"q, k and v must share a dtype, got {q.dtype}, {k.dtype} and {v.dtype}")
    if q.shape[-1] != k.shape[-1]:
        raise InputError(f"queries and keys must have the same width Dk for the dot product: q is {tuple(q.shape)} "
                         f"(Dk = {q.shape[-1]}), k is {tuple(k.shape)} (Dk = {k.shape[-1]}). "
                         "Is one of them transposed, or projected to another width?")
    if k.shape[-2] != v.shape[-2]:
        raise InputError(f"keys and values must have the same length S (one value per key): k is {tuple(k.shape)} "
                         f"(S = {k.shape[-2]}), v is {tuple(v.shape)} (S = {v.shape[-2]}). Is v transposed?")
    try:
        batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    except RuntimeError:
        raise InputError(f"the leading (batch/head) dimensions do not match: q {tuple(q.shape)}, k {tuple(k.shape)}, "
                         f"v {tuple(v.shape)}") from None
    if mask is None:
        return
    if not isinstance(mask, torch.Tensor):
        raise InputError(f"mask must be None or a bool tensor, got a {type(mask).__name__}")
    if mask.dtype != torch.bool:
        raise InputError(f"mask must be bool (True = may attend), got dtype {mask.dtype}: for a 0/1 mask use "
                         "mask.bool(); for an additive float mask (0 = keep, -inf = drop) use mask == 0")
    T, S = q.shape[-2], k.shape[-2]
    try:
        torch.broadcast_shapes(mask.shape, (*batch, T, S))
    except RuntimeError:
        raise InputError(f"mask of shape {tuple(mask.shape)} does not broadcast to the scores' shape "
                         f"{(*batch, T, S)} (..., T, S): a padding mask is (B, 1, S) for (B, T, S) scores and "
                         "(B, 1, 1, S) for (B, H, T, S) scores (an axis of size 1 for the heads); a causal mask "
                         "is (T, S) for both") from None


def scaled_dot_product_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                 mask: torch.Tensor | None = None,
                                 scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(q k^T / sqrt(Dk)) v, Vaswani et al. 2017, eq. (1) (notebook 03, exercise 1).

    The from-scratch reference for ``torch.nn.functional.scaled_dot_product_attention``,
    which it matches to float tolerance (tests/test_attention.py), and which
    also returns the weights.

    Args:
        q: (..., T, Dk) float queries.
        k: (..., S, Dk) float keys.
        v: (..., S, Dv) float values.
        mask: bool broadcastable to (..., T, S), True = may attend; None = every key.
        scale: Factor for the scores; None = 1 / sqrt(Dk), Dk = the width of one key (of one head).

    Returns:
        (out, weights): out (..., T, Dv), weights (..., T, S) with rows that sum
        to 1 over the keys (a query with no allowed key gets zero weights and out = 0).

    Raises:
        InputError: If the inputs do not fit together (see ``validate_attention_inputs``).
    """
    validate_attention_inputs(q, k, v, mask)  # clear messages for wrong shapes, dtypes, NaN (given)
    Dk = q.shape[-1]
    scale = 1.0 / math.sqrt(Dk) if scale is None else scale
    scores = (q @ k.transpose(-2, -1)) * scale  # (..., T, Dk) @ (..., Dk, S) -> (..., T, S)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))  # a masked key: exp(-inf) = 0
    weights = torch.softmax(scores, dim=-1)  # (..., T, S); a row of only -inf gives 0/0 = NaN
    if mask is not None:
        no_key = ~mask.any(dim=-1, keepdim=True)  # (..., T or 1, 1): True for a query with no allowed key
        weights = weights.masked_fill(no_key, 0.0)  # zero weights instead of NaN
    out = weights @ v  # (..., T, S) @ (..., S, Dv) -> (..., T, Dv)
    return out, weights


def attention_entropy(weights: torch.Tensor) -> torch.Tensor:
    """Entropy of each query's attention distribution, in nats (notebook 04, exercise 1).

    entropy_i = -sum_j w_ij ln w_ij, with 0 ln 0 = 0: ln(S) for uniform weights over
    S keys, 0 for a one-hot row.

    Args:
        weights: (..., T, S) float, rows sum to 1.

    Returns:
        (..., T) float entropies.
    """
    logs = torch.log(weights.clamp(min=torch.finfo(weights.dtype).tiny))  # (..., T, S); finite where w = 0
    return -(weights * logs).sum(dim=-1)  # (..., T, S) -> (..., T); 0 * finite = 0


def scaled_scores(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Dot-product scores of one head divided by sqrt of that head's key width (notebook 04, exercise 2).

    Args:
        q: (B, H, T, Dh) float queries, Dh the width of one head.
        k: (B, H, S, Dh) float keys.

    Returns:
        (B, H, T, S) float, ``q_i · k_j / sqrt(Dh)``: the scale uses the key
        width of a head, never the model width D = H * Dh.
    """
    Dh = q.shape[-1]
    return q @ k.transpose(-2, -1) / math.sqrt(Dh)  # (B, H, T, Dh) @ (B, H, Dh, S) -> (B, H, T, S)
