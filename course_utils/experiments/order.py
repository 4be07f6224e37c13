"""An order-sensitive task: reversal as per-token classification (notebook 06).

The same one-block model is trained with each kind of position information
(none, sinusoidal, learned, concatenated, rotary) on the same data.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from course_utils.blocks.multihead import MultiHeadAttention
from course_utils.blocks.positional import sinusoidal_positional_encoding
from course_utils.core.errors import InputError
from course_utils.experiments.loop import fit, training_steps


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

        if positions not in POSITION_KINDS:
            raise InputError(f"positions must be one of {POSITION_KINDS}, got {positions!r}")
        self.positions = positions
        D = config.D
        token_width = D - config.concat_dim if positions == "concat" else D
        self.token_embedding = nn.Embedding(config.V, token_width)
        if positions == "sinusoidal":
            self.register_buffer("pe", sinusoidal_positional_encoding(config.T, D))  # (T, D), fixed
        elif positions == "concat":
            self.register_buffer("pe", sinusoidal_positional_encoding(config.T, config.concat_dim))  # (T, concat_dim), fixed
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
        h = self.token_embedding(tokens)  # (B, T, D), or (B, T, D - concat_dim) for "concat"
        if self.positions == "sinusoidal":
            h = h + self.pe  # (B, T, D) + (T, D)
        elif self.positions == "learned":
            h = h + self.position_embedding.weight  # (B, T, D) + (T, D)
        elif self.positions == "concat":
            h = torch.cat([h, self.pe.expand(h.shape[0], -1, -1)], dim=-1)  # (B, T, D - concat_dim) | (B, T, concat_dim) -> (B, T, D)
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
    position_accuracy: list[float]  # held-out accuracy of output position i, i = 0 .. T - 1
    model: OrderModel  # the trained model, in eval mode


def train_order_model(config: ReversalConfig = ReversalConfig(), positions: str = "sinusoidal",
                      seed: int = 0) -> OrderResult:
    """Train an ``OrderModel`` on reversal; same seed, same data for every kind of position.

    After the warm-up the learning rate is constant, so the first k steps of a
    run do not depend on ``config.steps``: a shorter run is a prefix of a longer one.

    Returns:
        An ``OrderResult``.
    """
    torch.manual_seed(seed)
    model = OrderModel(config, positions)
    x_test, y_test = make_reversal_batch(config, config.test_size, torch.Generator().manual_seed(10_000 + seed))
    generator = torch.Generator().manual_seed(seed)

    def step_loss(step: int) -> torch.Tensor:
        x, y = make_reversal_batch(config, config.batch_size, generator)
        return nn.functional.cross_entropy(model(x).reshape(-1, config.V), y.reshape(-1))

    result = fit(model, torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=0.0), step_loss,
                 training_steps(config), f"order model, {positions} positions, seed {seed}",
                 lr_at=lambda step: config.lr * min(1.0, (step + 1) / config.warmup))  # linear warm-up
    model.eval()
    with torch.no_grad():
        correct = (model(x_test).argmax(dim=-1) == y_test).float()  # (test_size, T)
    return OrderResult(losses=list(result.losses), accuracy=correct.mean().item(), seconds=result.seconds,
                       parameters=sum(p.numel() for p in model.parameters() if p.requires_grad),
                       position_accuracy=correct.mean(dim=0).tolist(), model=model)
