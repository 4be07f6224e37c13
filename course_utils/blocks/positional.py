"""Positions for self-attention (notebook 06).

Self-attention without positions is permutation-equivariant: it cannot tell
"dog bites man" from "man bites dog". Three ways to add order:

* sinusoidal encodings added to the embeddings, Vaswani et al. 2017, §3.5;
* learned position embeddings (``nn.Embedding(max_len, D)``), same paper, Table 3 row (E);
* rotary embeddings (RoPE) applied to queries and keys, Su et al. 2021, arXiv:2104.09864.
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
    """The D/2 angular frequencies w_i = base^(-2i/D), i = 0 .. D/2 - 1, from fast to slow.

    Returns:
        (D/2,) float32.
    """
    return base ** (-torch.arange(0, D, 2, dtype=torch.float32) / D)  # (D/2,)


def sinusoidal_positional_encoding(T: int, D: int) -> torch.Tensor:
    """PE[p, 2i] = sin(p w_i), PE[p, 2i + 1] = cos(p w_i), w_i = 10000^(-2i/D) (notebook 06, exercise 1).

    Vaswani et al. 2017, §3.5. Pair i of every row is a point on a circle that
    turns with frequency w_i as the position p grows.

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


def shift_matrix(k: int, D: int, base: float = 10000.0) -> torch.Tensor:
    """The fixed linear map M_k with PE[p + k] = PE[p] @ M_k for every position p (notebook 06).

    Block-diagonal: the 2x2 block of pair i is [[cos k w_i, -sin k w_i], [sin k w_i, cos k w_i]],
    a rotation by the angle k w_i. It depends on the offset k, not on p.

    Returns:
        (D, D) float32.
    """
    validate_positions(max(k, 0) + 1, D)
    angles = k * frequencies(D, base)  # (D/2,)
    M = torch.zeros(D, D)
    M[0::2, 0::2] = torch.diag(torch.cos(angles))  # sin part keeps cos(k w) of itself
    M[1::2, 0::2] = torch.diag(torch.sin(angles))  # ... and takes sin(k w) of the cos part
    M[0::2, 1::2] = torch.diag(-torch.sin(angles))
    M[1::2, 1::2] = torch.diag(torch.cos(angles))
    return M


def apply_rotary(x: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
    """Rotary position embedding: rotate pair (2i, 2i+1) of the token at position p by p w_i (notebook 06, exercise 2).

    Su et al. 2021. Applied to queries and keys, it makes q_m · k_n depend on
    the positions only through n - m.

    Args:
        x: (..., T, D) float, D even (queries or keys; per head: D = Dh).
        positions: (T,) int64 positions of the T tokens; None = 0 .. T - 1.

    Returns:
        (..., T, D) float, the rotated x.

    Raises:
        InputError: If D is odd or ``positions`` does not have T entries.
    """
    T, D = x.shape[-2], x.shape[-1]
    validate_positions(T, D)
    positions = torch.arange(T) if positions is None else positions
    if positions.shape != (T,):
        raise InputError(f"positions must have shape (T,) = ({T},), got {tuple(positions.shape)}")
    angles = positions[:, None].to(x.dtype) * frequencies(D).to(x.dtype)[None, :]  # (T, 1) * (1, D/2) -> (T, D/2)
    cos, sin = torch.cos(angles), torch.sin(angles)  # (T, D/2) each
    even, odd = x[..., 0::2], x[..., 1::2]  # (..., T, D/2) each
    out = torch.empty_like(x)
    out[..., 0::2] = even * cos - odd * sin  # rotate each pair (even, odd) by its angle
    out[..., 1::2] = even * sin + odd * cos
    return out
