"""Attention building blocks, each written from scratch in the notebook named in its docstring.

Shapes: B batch, T queries, S keys, D width. Masks are boolean, True = may attend.
"""

from __future__ import annotations

import torch


def pairwise_scores(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Dot product of every query with every key, batched (notebook 00, exercise 2).

    Args:
        q: (B, T, D) float queries.
        k: (B, S, D) float keys.

    Returns:
        (B, T, S) float, ``scores[b, i, j] = q[b, i] · k[b, j]``.
    """
    return q @ k.transpose(-2, -1)  # (B, T, D) @ (B, D, S) -> (B, T, S)


def masked_softmax(scores: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Softmax over the keys (last dim); masked keys get weight exactly 0 (notebook 00, exercise 3).

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
