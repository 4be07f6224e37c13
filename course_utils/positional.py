"""Positions for self-attention (notebook 06).

Self-attention without positions is permutation-equivariant: it cannot tell
"dog bites man" from "man bites dog". Three ways to add order:

* sinusoidal encodings added to the embeddings, Vaswani et al. 2017, §3.5;
* learned position embeddings (``nn.Embedding(max_len, D)``), same paper, Table 3 row (E);
* rotary embeddings (RoPE) applied to queries and keys, Su et al. 2021, arXiv:2104.09864.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch import nn

from course_utils.errors import InputError
from course_utils.benchlog import record_training


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


# ---------------------------------------------------------------------------
# An order-sensitive task: reversal as per-token classification
# ---------------------------------------------------------------------------

POSITION_KINDS = ("none", "sinusoidal", "learned", "concat", "rotary")


@dataclass(frozen=True)
class ReversalConfig:
    """Reverse T distinct tokens, one classification per position (notebook 06)."""

    T: int = 12  # sequence length; even, so no position is its own mirror
    V: int = 16  # vocabulary; each sequence holds T distinct tokens
    D: int = 32  # model width
    num_heads: int = 4  # attention heads
    d_ff: int = 64  # hidden width of the feed-forward layer
    concat_dim: int = 16  # "concat": width of the sinusoidal part; the token embedding gets D - concat_dim
    steps: int = 400  # AdamW steps, a fresh batch each
    batch_size: int = 64  # sequences per step
    lr: float = 3e-3  # learning rate after warm-up
    warmup: int = 50  # steps of linear learning-rate warm-up
    test_size: int = 2000  # held-out sequences


def make_reversal_batch(config: ReversalConfig, batch_size: int,
                        generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Random sequences of T distinct tokens and their reversals.

    Returns:
        x (B, T) int64 and y (B, T) int64 with ``y[:, i] = x[:, T - 1 - i]``.
    """
    x = torch.rand(batch_size, config.V, generator=generator).argsort(dim=-1)[:, : config.T]  # (B, T), distinct
    return x, x.flip(-1)


class OrderModel(nn.Module):
    """Embeddings (+ positions), one pre-LN attention block, per-token classifier (notebook 06).

    Args:
        config: Sizes.
        positions: One of ``POSITION_KINDS``: "none"; "sinusoidal" or "learned",
            added to the token embeddings; "concat", sinusoidal features
            concatenated to narrower token embeddings (same width D); "rotary",
            RoPE on each head's queries and keys.
    """

    def __init__(self, config: ReversalConfig, positions: str) -> None:
        super().__init__()
        from course_utils.multihead import MultiHeadAttention  # multihead imports this module

        if positions not in POSITION_KINDS:
            raise InputError(f"positions must be one of {POSITION_KINDS}, got {positions!r}")
        self.positions = positions
        D = config.D
        token_width = D - config.concat_dim if positions == "concat" else D
        self.token_embedding = nn.Embedding(config.V, token_width)
        if positions == "sinusoidal":
            self.register_buffer("pe", sinusoidal_positional_encoding(config.T, D))  # (T, D), fixed
        elif positions == "concat":
            self.register_buffer("pe", sinusoidal_positional_encoding(config.T, config.concat_dim))  # (T, P), fixed
        elif positions == "learned":
            self.position_embedding = nn.Embedding(config.T, D)  # (T, D), trained
        self.norm1 = nn.LayerNorm(D)
        self.attention = MultiHeadAttention(D, config.num_heads, rotary=positions == "rotary")
        self.norm2 = nn.LayerNorm(D)
        self.feed_forward = nn.Sequential(nn.Linear(D, config.d_ff), nn.GELU(), nn.Linear(config.d_ff, D))
        self.norm_out = nn.LayerNorm(D)
        self.classifier = nn.Linear(D, config.V)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """(B, T) int64 tokens -> (B, T, V) logits."""
        h = self.token_embedding(tokens)  # (B, T, D), or (B, T, D - P) for "concat"
        if self.positions == "sinusoidal":
            h = h + self.pe  # (B, T, D) + (T, D)
        elif self.positions == "learned":
            h = h + self.position_embedding.weight  # (B, T, D) + (T, D)
        elif self.positions == "concat":
            h = torch.cat([h, self.pe.expand(h.shape[0], -1, -1)], dim=-1)  # (B, T, D - P) | (B, T, P) -> (B, T, D)
        h = h + self.attention(self.norm1(h))  # (B, T, D)
        h = h + self.feed_forward(self.norm2(h))  # (B, T, D)
        return self.classifier(self.norm_out(h))  # (B, T, D) -> (B, T, V)


@dataclass(frozen=True)
class OrderResult:
    """What ``train_order_model`` measured."""

    losses: list[float]  # training loss at every step
    accuracy: float  # held-out per-token accuracy
    seconds: float  # wall time of the training loop
    parameters: int  # number of trained parameters


def train_order_model(config: ReversalConfig = ReversalConfig(), positions: str = "sinusoidal",
                      seed: int = 0) -> OrderResult:
    """Train an ``OrderModel`` on reversal; same seed, same data for every kind of position.

    Returns:
        An ``OrderResult``.
    """
    from course_utils.training import training_steps

    torch.manual_seed(seed)
    model = OrderModel(config, positions)
    x_test, y_test = make_reversal_batch(config, config.test_size, torch.Generator().manual_seed(10_000 + seed))
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / config.warmup))
    generator = torch.Generator().manual_seed(seed)
    losses = []
    start = time.perf_counter()
    for _ in range(training_steps(config)):
        x, y = make_reversal_batch(config, config.batch_size, generator)
        loss = nn.functional.cross_entropy(model(x).reshape(-1, config.V), y.reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
        losses.append(loss.item())
    seconds = time.perf_counter() - start
    record_training(f"order model, {positions} positions, seed {seed}", seconds)
    model.eval()
    with torch.no_grad():
        accuracy = (model(x_test).argmax(dim=-1) == y_test).float().mean().item()
    return OrderResult(losses=losses, accuracy=accuracy, seconds=seconds,
                       parameters=sum(p.numel() for p in model.parameters() if p.requires_grad))
