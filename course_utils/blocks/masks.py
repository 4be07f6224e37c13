"""Boolean attention masks. Convention everywhere in the course: True = may attend.

This is the convention of ``torch.nn.functional.scaled_dot_product_attention``.
``torch.nn.MultiheadAttention``'s ``key_padding_mask`` and ``attn_mask`` use the
opposite one (True = ignore): pass ``~mask`` there.

Introduced in notebook 00 (padding masks); the causal mask in notebook 03.
"""

from __future__ import annotations

import torch


def padding_mask(lengths: torch.Tensor, S: int) -> torch.Tensor:
    """Mask of the real (non-padding) key positions of each sequence.

    Args:
        lengths: (B,) int64, the true length of each sequence, each in [0, S].
        S: Padded length of the key sequences.

    Returns:
        (B, 1, S) bool, True where position j < lengths[b] (a real token),
        ready to broadcast against scores of shape (B, T, S).
    """
    positions = torch.arange(S, device=lengths.device)  # (S,)
    return (positions[None, :] < lengths[:, None])[:, None, :]  # (1, S) < (B, 1) -> (B, S) -> (B, 1, S)


def padding_mask_for(lengths: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
    """Padding mask shaped to broadcast against ``scores``, whatever the axes between the batch and the keys.

    Args:
        lengths: (B,) int64, the true length of each sequence, each in [0, S].
        scores: (B, T, S), or (B, H, T, S) with heads, or any (B, ..., S).

    Returns:
        (B, 1, S) bool for (B, T, S) scores, (B, 1, 1, S) for (B, H, T, S): True where
        key j < lengths[b], with one size-1 axis for each axis between B and S.
    """
    B, S = scores.shape[0], scores.shape[-1]
    real = torch.arange(S, device=lengths.device) < lengths[:, None]  # (S,) < (B, 1) -> (B, S)
    return real.view(B, *[1] * (scores.dim() - 2), S)  # (B, 1, ..., 1, S)


def causal_mask(T: int, S: int | None = None) -> torch.Tensor:
    """Lower-triangular mask: query i may attend to keys j <= i.

    Args:
        T: Number of queries.
        S: Number of keys (defaults to T).

    Returns:
        (T, S) bool, True on and below the diagonal.
    """
    S = T if S is None else S
    return torch.ones(T, S, dtype=torch.bool).tril()  # (T, S)
