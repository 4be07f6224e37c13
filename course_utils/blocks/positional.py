"""Positions for self-attention (notebook 06).

Self-attention without positions is permutation-equivariant: it cannot tell
"dog bites man" from "man bites dog". Three ways to add order:

* sinusoidal encodings added to the embeddings, Vaswani et al. 2017, §3.5;
* learned position embeddings (``nn.Embedding(max_len, D)``), same paper, Table 3 row (E);
* rotary embeddings (RoPE) applied to queries and keys, Su et al. 2021, arXiv:2104.09864.

Notation (notebook 06): p is a position and f a feature-pair index, both from 0;
pair f of a vector of width D is the features (2f, 2f + 1) and turns with the
angular frequency theta_f = 10000^(-2f/D). Code that pairs feature f with
f + D/2 instead ("rotate half", GPT-NeoX and Hugging Face's LLaMA) is
``apply_rotary_half``; ``to_rotate_half`` converts a checkpoint to it.
"""

from __future__ import annotations


import torch

from course_utils.core.errors import InputError


def validate_positions(T: int, D: int) -> None:
    """Reject a length or width that an encoding cannot use (notebook 06).

    Raises:
        InputError: If T is not a positive int or D is not a positive even int.
    """
    for name, n in (("T", T), ("D", D)):
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise InputError(f"{name} must be a positive int, got {n!r}")
    if D % 2:
        raise InputError(f"D = {D} is odd: sinusoidal and rotary encodings work on pairs of features, so D must be even")


def frequencies(D: int, base: float = 10000.0) -> torch.Tensor:
    """The D/2 angular frequencies theta_f = base^(-2f/D), f = 0 .. D/2 - 1, from fast to slow.

    Returns:
        (D/2,) float32.
    """
    return base ** (-torch.arange(0, D, 2, dtype=torch.float32) / D)  # (D/2,)


def sinusoidal_positional_encoding(T: int, D: int) -> torch.Tensor:
    """PE[p, 2f] = sin(p theta_f), PE[p, 2f + 1] = cos(p theta_f), theta_f = 10000^(-2f/D) (notebook 06).

    Vaswani et al. 2017, §3.5. Pair f of every row is a point on a circle that
    turns with frequency theta_f as the position p grows.

    Args:
        T: Number of positions (0 .. T - 1).
        D: Width, even.

    Returns:
        (T, D) float32.

    Raises:
        InputError: If T or D is not a positive int or D is odd.
    """
    validate_positions(T, D)  # clear messages for a bad T or an odd D (given)
    positions = torch.arange(T, dtype=torch.float32)[:, None]  # (T, 1)
    angles = positions * frequencies(D)[None, :]  # (T, 1) * (1, D/2) -> (T, D/2)
    pe = torch.zeros(T, D)
    pe[:, 0::2] = torch.sin(angles)  # even features
    pe[:, 1::2] = torch.cos(angles)  # odd features
    return pe


def shift_matrix(offset: int, D: int, base: float = 10000.0) -> torch.Tensor:
    """The fixed linear map M_Delta with PE[p + Delta] = PE[p] @ M_Delta for every position p (notebook 06).

    Block-diagonal: the 2x2 block of pair f is [[cos Delta theta_f, -sin Delta theta_f],
    [sin Delta theta_f, cos Delta theta_f]], a rotation by the angle Delta theta_f, where
    Delta = ``offset``. It depends on the offset, not on p.

    Returns:
        (D, D) float32.
    """
    validate_positions(max(offset, 0) + 1, D)
    angles = offset * frequencies(D, base)  # (D/2,)
    M = torch.zeros(D, D)
    M[0::2, 0::2] = torch.diag(torch.cos(angles))  # sin part keeps cos(Delta theta) of itself
    M[1::2, 0::2] = torch.diag(torch.sin(angles))  # ... and takes sin(Delta theta) of the cos part
    M[0::2, 1::2] = torch.diag(-torch.sin(angles))
    M[1::2, 1::2] = torch.diag(torch.cos(angles))
    return M


def apply_rotary(x: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
    """RoPE: rotate pair (2f, 2f+1) of the row at position p by the angle p theta_f (notebook 06, exercise 1).

    Su et al. 2021 (the paper's interleaved pairs). Applied to queries and keys,
    it makes the score of query i and key j depend on the positions only
    through j - i. The angles are computed in float32 whatever x's dtype (in
    bfloat16, positions 1000, 1001 and 1002 would get the same angle); cos and
    sin are then cast to x's dtype.

    Args:
        x: (..., T, Dk) float, Dk even: queries or keys of one head (Dk = Dh).
        positions: (T,) int64 positions of the T rows of x; None = 0 .. T - 1.

    Returns:
        (..., T, Dk), the rotated x, in x's dtype.

    Raises:
        InputError: If Dk is odd or ``positions`` does not have T entries.
    """
    T, Dk = x.shape[-2], x.shape[-1]
    validate_positions(T, Dk)
    positions = torch.arange(T) if positions is None else positions
    if positions.shape != (T,):
        raise InputError(f"positions must have shape (T,) = ({T},), got {tuple(positions.shape)}")
    angles = positions[:, None].float() * frequencies(Dk)[None, :]  # (T, 1) * (1, Dk/2) -> (T, Dk/2), float32
    cos, sin = torch.cos(angles).to(x.dtype), torch.sin(angles).to(x.dtype)  # (T, Dk/2) each, in x's dtype
    even, odd = x[..., 0::2], x[..., 1::2]  # (..., T, Dk/2) each
    out = torch.empty_like(x)
    out[..., 0::2] = even * cos - odd * sin  # rotate each pair (even, odd) by its angle
    out[..., 1::2] = even * sin + odd * cos
    return out


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """(x1, x2) -> (-x2, x1) on the two halves of the last axis, as Hugging Face's LLaMA code writes it (notebook 06)."""
    first, second = x.chunk(2, dim=-1)  # (..., T, Dk/2) each: the two members of every pair
    return torch.cat([-second, first], dim=-1)  # (..., T, Dk)


def apply_rotary_half(x: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
    """RoPE with the pairs (f, f + Dk/2), written as Hugging Face's LLaMA writes it (every feature rotated)."""
    T, Dk = x.shape[-2:]
    positions = torch.arange(T) if positions is None else positions
    freqs = torch.outer(positions.float(), frequencies(Dk))  # (T, Dk/2): the angles p θ_f, float32
    emb = torch.cat([freqs, freqs], dim=-1)  # (T, Dk): features f and f + Dk/2 share the angle p θ_f
    return x * emb.cos().to(x.dtype) + rotate_half(x) * emb.sin().to(x.dtype)


def to_rotate_half(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Reorder a query or key projection from the paper's RoPE pairs to rotate-half (notebook 06, exercise 2).

    Within each head, output feature n of the result is feature ``perm[n]`` of
    the input, with ``perm = [0, 2, 4, ..., 1, 3, 5, ...]``: the two members of
    pair f, stored at 2f and 2f + 1, move to f and f + Dh/2. Attention that
    rotates with ``apply_rotary_half`` then computes the scores that
    ``apply_rotary`` computed with the original weights. It is the reordering
    that Hugging Face's script for Meta's LLaMA checkpoints calls "permute".

    Args:
        weight: (D, D_in) weight of an ``nn.Linear`` (one row per output feature)
            or its (D,) bias; the D outputs are H heads of Dh = D / H features.
        num_heads: H.

    Returns:
        A tensor of the same shape and dtype, its rows reordered within each head.
    """
    Dh = weight.shape[0] // num_heads
    perm = torch.cat([torch.arange(0, Dh, 2), torch.arange(1, Dh, 2)])  # (Dh,): slot n takes feature perm[n]
    rows = (torch.arange(num_heads)[:, None] * Dh + perm[None, :]).reshape(-1)  # (H, 1) + (1, Dh) -> (D,)
    return weight[rows]  # the same reordering inside every head
