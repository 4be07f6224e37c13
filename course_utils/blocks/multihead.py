"""Multi-head attention, Vaswani et al. 2017, §3.2.2 (notebook 05).

H heads of width Dh = D / H each attend with their own slice of the
projections; their outputs are concatenated and mixed by ``out_proj``. With
heads counted from 0, as everywhere in the course:

    MultiHead(Q, K, V) = Concat(head_0, ..., head_{H-1}) W_O,
    head_h = Attention(Q W_Q^h, K W_K^h, V W_V^h).

(Vaswani et al. count the heads from 1 and write h for their number.)

Masks are boolean, True = may attend, as everywhere in the course.
``torch.nn.MultiheadAttention`` uses the opposite convention for its
``key_padding_mask`` and boolean ``attn_mask`` (True = ignore): pass ``~mask``.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator

import torch
from torch import nn

from course_utils.blocks.attention import masked_softmax, validate_attention_inputs
from course_utils.core.errors import InputError
from course_utils.blocks.positional import apply_rotary


def split_heads(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Split the last dimension into heads (notebook 05, exercise 1).

    Args:
        x: (B, T, D) float, D divisible by ``num_heads``.
        num_heads: H.

    Returns:
        (B, H, T, Dh) float with Dh = D // H; head h holds features h*Dh ... (h+1)*Dh - 1 of every token.
    """
    B, T, D = x.shape
    Dh = D // num_heads
    return x.view(B, T, num_heads, Dh).transpose(1, 2)  # (B, T, D) -> (B, T, H, Dh) -> (B, H, T, Dh)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """Undo ``split_heads``: concatenate the heads of every token (notebook 05, exercise 2).

    Args:
        x: (B, H, T, Dh) float.

    Returns:
        (B, T, H * Dh) float; features h*Dh ... (h+1)*Dh - 1 of token t come from head h.
    """
    B, H, T, Dh = x.shape
    return x.transpose(1, 2).reshape(B, T, H * Dh)  # (B, H, T, Dh) -> (B, T, H, Dh) -> (B, T, D)


def multi_head_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                         q_proj: Callable[[torch.Tensor], torch.Tensor],
                         k_proj: Callable[[torch.Tensor], torch.Tensor],
                         v_proj: Callable[[torch.Tensor], torch.Tensor],
                         out_proj: Callable[[torch.Tensor], torch.Tensor],
                         num_heads: int, mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Project, split into heads, attend per head, merge, project back (notebook 05, exercise 3).

    Args:
        query: (B, T, D) float, the sequence that asks.
        key: (B, S, D) float, the sequence that is looked at (``query`` itself for self-attention).
        value: (B, S, D) float, usually the same tensor as ``key``.
        q_proj, k_proj, v_proj, out_proj: maps (..., D) -> (..., D), e.g. ``nn.Linear(D, D)``.
        num_heads: H; D must be divisible by H.
        mask: bool broadcastable to (B, H, T, S), True = may attend; None = every key.

    Returns:
        (out, weights): out (B, T, D); weights (B, H, T, S), one attention pattern per head.
    """
    q = split_heads(q_proj(query), num_heads)  # (B, T, D) -> (B, H, T, Dh)
    k = split_heads(k_proj(key), num_heads)  # (B, S, D) -> (B, H, S, Dh)
    v = split_heads(v_proj(value), num_heads)  # (B, S, D) -> (B, H, S, Dh)
    validate_attention_inputs(q, k, v, mask)  # clear messages for wrong shapes, dtypes, NaN (notebook 03, given)
    scale = 1 / math.sqrt(q.shape[-1])  # Dk = Dh: each score sums Dh products, one head's width (notebook 04)
    scores = (q @ k.transpose(-2, -1)) * scale  # (B, H, T, Dh) @ (B, H, Dh, S) -> (B, H, T, S)
    weights = masked_softmax(scores, mask)  # (B, H, T, S); mask broadcasts, True = may attend
    out = out_proj(merge_heads(weights @ v))  # (B, H, T, S) @ (B, H, S, Dh) -> (B, H, T, Dh) -> (B, T, D) -> (B, T, D)
    return out, weights


class MultiHeadAttention(nn.Module):
    """Multi-head attention with separate q/k/v/out projections, Vaswani et al. 2017 §3.2.2 (notebook 05).

    Self-attention: ``mha(x)``; cross-attention: ``mha(x, memory)`` with keys
    and values from another sequence of length S.

    Args:
        d_model: D, the width of the inputs and the output.
        num_heads: H; each head has width Dh = D // H.
        bias: Whether the four projections have a bias.
        rotary: Rotate each head's queries and keys by their positions (RoPE, notebook 06).

    Raises:
        InputError: If ``d_model`` is not divisible by ``num_heads``.
    """

    def __init__(self, d_model: int, num_heads: int, bias: bool = True, rotary: bool = False) -> None:
        super().__init__()
        if num_heads < 1 or d_model % num_heads != 0:
            reason = (f"H = num_heads must be at least 1, got {num_heads}" if num_heads < 1 else
                      f"D = d_model = {d_model} is not divisible by H = num_heads = {num_heads}")
            raise InputError(
                f"{reason}: every head needs the same width Dh = D / H. Choose e.g. num_heads in "
                f"{[h for h in range(1, min(d_model, 16) + 1) if d_model % h == 0]}"
            )
        self.d_model, self.num_heads, self.head_dim = d_model, num_heads, d_model // num_heads
        self.q_proj: nn.Module = nn.Linear(d_model, d_model, bias=bias)
        self.k_proj: nn.Module = nn.Linear(d_model, d_model, bias=bias)
        self.v_proj = nn.Linear(d_model, d_model, bias=bias)
        if rotary:  # positions enter through the queries and keys only
            self.q_proj = RotaryProjection(self.q_proj, num_heads)
            self.k_proj = RotaryProjection(self.k_proj, num_heads)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)

    def forward(self, query: torch.Tensor, key: torch.Tensor | None = None, value: torch.Tensor | None = None,
                mask: torch.Tensor | None = None,
                return_weights: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Attend from ``query`` to ``key``/``value`` (both default to ``query``: self-attention).

        Args:
            query: (B, T, D) float.
            key: (B, S, D) float, or None for self-attention.
            value: (B, S, D) float, or None to use ``key``.
            mask: bool, True = may attend: (T, S), (B, 1, S) or (B, T, S) (a head axis is added), or
                anything broadcastable to (B, H, T, S).
            return_weights: Also return the per-head weights.

        Returns:
            out (B, T, D), and with ``return_weights`` the weights (B, H, T, S).

        Raises:
            InputError: If a width is not D or the batch sizes differ.
        """
        key = query if key is None else key
        value = key if value is None else value
        for name, x in (("query", query), ("key", key), ("value", value)):
            if not isinstance(x, torch.Tensor) or x.dim() != 3 or x.shape[-1] != self.d_model:
                got = f"shape {tuple(x.shape)}" if isinstance(x, torch.Tensor) else repr(type(x).__name__)
                raise InputError(f"{name} must be (B, length, D) with D = d_model = {self.d_model}, got {got}")
        if not (query.shape[0] == key.shape[0] == value.shape[0]) or key.shape[1] != value.shape[1]:
            raise InputError(f"query {tuple(query.shape)}, key {tuple(key.shape)} and value {tuple(value.shape)} "
                             "must share B, and key and value must share S")
        if mask is not None and mask.dim() == 3:
            mask = mask[:, None]  # (B, T or 1, S) -> (B, 1, T or 1, S): the same mask for every head
        out, weights = multi_head_attention(query, key, value, self.q_proj, self.k_proj, self.v_proj,
                                            self.out_proj, self.num_heads, mask)
        return (out, weights) if return_weights else out

    @classmethod
    def from_torch(cls, module: nn.MultiheadAttention) -> MultiHeadAttention:
        """Copy the weights of ``nn.MultiheadAttention(D, H, batch_first=True)`` into this class.

        PyTorch packs the three input projections into one ``in_proj_weight``
        of shape (3D, D): rows 0..D-1 for the queries, D..2D-1 for the keys,
        2D..3D-1 for the values (three separate matrices, stored together, not
        one shared projection). Like every ``nn.Linear`` weight, each block is
        stored as (out, in) and applied as x W^T, so in the course's convention
        q = x W_Q the rows 0..D-1 are W_Q^T (and likewise W_K^T, W_V^T; and
        ``out_proj.weight`` is W_O^T). They are copied into our ``nn.Linear``
        layers, which store their weights the same way.

        Raises:
            InputError: For settings this class does not model (separate key/value
                widths, ``add_bias_kv``, ``add_zero_attn``, ``batch_first=False``).
        """
        if not isinstance(module, nn.MultiheadAttention):
            raise InputError(f"expected an nn.MultiheadAttention, got {type(module).__name__}")
        if not module._qkv_same_embed_dim or module.bias_k is not None or module.add_zero_attn:
            raise InputError("from_torch supports nn.MultiheadAttention without kdim/vdim, add_bias_kv or add_zero_attn")
        if not module.batch_first:
            raise InputError("create the module with batch_first=True: this course's tensors are (B, T, D)")
        has_bias = module.in_proj_bias is not None
        ours = cls(module.embed_dim, module.num_heads, bias=has_bias)
        with torch.no_grad():
            for i, proj in enumerate((ours.q_proj, ours.k_proj, ours.v_proj)):
                rows = slice(i * module.embed_dim, (i + 1) * module.embed_dim)
                proj.weight.copy_(module.in_proj_weight[rows])  # (D, D)
                if has_bias:
                    proj.bias.copy_(module.in_proj_bias[rows])  # (D,)
            ours.out_proj.weight.copy_(module.out_proj.weight)
            if has_bias:
                ours.out_proj.bias.copy_(module.out_proj.bias)
        return ours


class RotaryProjection(nn.Module):
    """A projection followed by rotary position embedding of each head (Su et al. 2021; notebook 06).

    ``split_heads`` and ``merge_heads`` are exact inverses, so rotating inside
    the projection is the same as rotating each head's queries (or keys) after
    the split.
    """

    def __init__(self, linear: nn.Linear, num_heads: int) -> None:
        super().__init__()
        self.linear, self.num_heads = linear, num_heads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, D) -> (B, T, D): project, rotate pair (2i, 2i+1) of each head by position * w_i."""
        heads = split_heads(self.linear(x), self.num_heads)  # (B, H, T, Dh)
        return merge_heads(apply_rotary(heads))  # (B, H, T, Dh) -> (B, T, D)


@contextlib.contextmanager
def ablate_head(module: MultiHeadAttention, head: int) -> Iterator[None]:
    """Temporarily remove one head's contribution (zero its columns of ``out_proj.weight``).

    In the course's convention z = [z^0, ..., z^{H-1}] W_O, head h's output is
    multiplied by rows h*Dh ... (h+1)*Dh - 1 of W_O, and nothing else is.
    ``out_proj.weight`` stores W_O^T (as every ``nn.Linear`` does), so those rows
    are its columns h*Dh ... (h+1)*Dh - 1. Zeroing them is the same as zeroing
    that head's output; the weights are restored on exit.
    """
    if not 0 <= head < module.num_heads:
        raise InputError(f"head must be in 0 .. {module.num_heads - 1}, got {head}")
    columns = slice(head * module.head_dim, (head + 1) * module.head_dim)
    saved = module.out_proj.weight[:, columns].detach().clone()
    with torch.no_grad():
        module.out_proj.weight[:, columns] = 0.0
    try:
        yield
    finally:
        with torch.no_grad():
            module.out_proj.weight[:, columns] = saved


def attention_cost(T: int, S: int, d_model: int, num_heads: int) -> dict[str, int]:
    """Parameters and multiply-adds of the matrix products of one multi-head attention layer, for one sequence.

    The parameters include the biases; the multiply-adds are those of the matrix
    products only (what ``torch.utils.flop_counter.FlopCounterMode`` counts, at
    2 FLOPs each; notebook 05 checks the two agree). A batch of B sequences
    costs B times as much. What does grow with H is not counted here: the
    H * T * S scores per sequence, each scaled, masked, exponentiated,
    normalised and stored in the (B, H, T, S) weights.

    Returns:
        ``{"parameters", "projections", "scores", "weighted_sum", "total"}``: the
        multiply-adds of the four projections (T*D*D for q and out, S*D*D for k
        and v), of the H score matrices (H*T*S*Dh) and of the weighted sums of
        the values (H*T*S*Dh). None of them depends on H, since H * Dh = D.
    """
    if d_model % num_heads != 0:
        raise InputError(f"D = d_model = {d_model} is not divisible by H = num_heads = {num_heads}")
    Dh = d_model // num_heads
    projections = 2 * T * d_model * d_model + 2 * S * d_model * d_model
    scores = num_heads * T * S * Dh
    weighted_sum = num_heads * T * S * Dh
    return {"parameters": 4 * d_model * d_model + 4 * d_model, "projections": projections, "scores": scores,
            "weighted_sum": weighted_sum, "total": projections + scores + weighted_sum}
