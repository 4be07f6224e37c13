"""An order-sensitive task: reversal as per-token classification (notebook 06).

The same model (one attention block, or ``num_layers`` of them) is trained with
each kind of position information (none, sinusoidal, learned, concatenated,
rotary) on the same data. Notebook 06 shows ``RotarySelfAttention`` and
``OrderModel`` in its cells.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from course_utils.blocks.attention import scaled_dot_product_attention
from course_utils.blocks.multihead import MultiHeadAttention, merge_heads, split_heads
from course_utils.blocks.positional import apply_rotary, sinusoidal_positional_encoding
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
    num_layers: int = 1  # attention blocks, one after the other
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


class RotarySelfAttention(nn.Module):
    """Multi-head self-attention with RoPE on each head's queries and keys (Su et al. 2021; notebook 06).

    Args:
        D: Model width.
        num_heads: H; each head has Dh = D // H features, turned pair by pair.
        rotate: The rotation, ``apply_rotary`` (the paper's adjacent pairs) unless given.
    """

    def __init__(self, D: int, num_heads: int, rotate: Callable[[torch.Tensor], torch.Tensor] | None = None) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.rotate = apply_rotary if rotate is None else rotate
        self.q_proj, self.k_proj = nn.Linear(D, D), nn.Linear(D, D)
        self.v_proj, self.out_proj = nn.Linear(D, D), nn.Linear(D, D)

    def forward(self, x: torch.Tensor, return_weights: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """(B, T, D) -> (B, T, D), and with ``return_weights`` the (B, H, T, T) weights."""
        q = self.rotate(split_heads(self.q_proj(x), self.num_heads))  # (B, T, D) -> (B, H, T, Dh), row i turned by i
        k = self.rotate(split_heads(self.k_proj(x), self.num_heads))  # (B, T, D) -> (B, H, T, Dh), row j turned by j
        v = split_heads(self.v_proj(x), self.num_heads)  # (B, T, D) -> (B, H, T, Dh): values are not turned
        context, weights = scaled_dot_product_attention(q, k, v)  # e_ij = q_i . k_j depends on j - i only
        out = self.out_proj(merge_heads(context))  # (B, H, T, Dh) -> (B, T, D) -> (B, T, D)
        return (out, weights) if return_weights else out


class OrderBlock(nn.Module):
    """One attention block: x + attention(LayerNorm(x)), then h + feed_forward(LayerNorm(h)) (notebook 06).

    Notebook 07 builds this block and explains where its LayerNorms go.
    """

    def __init__(self, config: ReversalConfig, rotary: bool) -> None:
        super().__init__()
        D = config.D
        self.norm1 = nn.LayerNorm(D)
        self.attention = RotarySelfAttention(D, config.num_heads) if rotary else MultiHeadAttention(D, config.num_heads)
        self.norm2 = nn.LayerNorm(D)
        self.feed_forward = nn.Sequential(nn.Linear(D, config.d_ff), nn.GELU(), nn.Linear(config.d_ff, D))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """(B, T, D) -> (B, T, D)."""
        h = h + self.attention(self.norm1(h))  # (B, T, D)
        return h + self.feed_forward(self.norm2(h))  # (B, T, D)


class OrderModel(nn.Module):
    """Embeddings (+ positions), ``config.num_layers`` attention blocks, a per-token classifier (notebook 06).

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
            self.register_buffer("pe", sinusoidal_positional_encoding(config.T, config.concat_dim))  # (T, concat_dim)
        elif positions == "learned":
            self.position_embedding = nn.Embedding(config.T, D)  # (T, D), trained
        self.blocks = nn.ModuleList(OrderBlock(config, rotary=positions == "rotary") for _ in range(config.num_layers))
        self.norm_out = nn.LayerNorm(D)
        self.classifier = nn.Linear(D, config.V)

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """(B, T) int64 tokens -> (B, T, D): token embeddings with the positions added or concatenated."""
        h = self.token_embedding(tokens)  # (B, T, D), or (B, T, D - concat_dim) for "concat"
        if self.positions == "sinusoidal":
            h = h + self.pe  # (B, T, D) + (T, D)
        elif self.positions == "learned":
            h = h + self.position_embedding.weight  # (B, T, D) + (T, D)
        elif self.positions == "concat":
            h = torch.cat([h, self.pe.expand(h.shape[0], -1, -1)], dim=-1)  # (B, T, D - concat_dim) | (B, T, concat_dim)
        return h  # "rotary" and "none": the tokens alone

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """(B, T) int64 tokens -> (B, T, V) logits."""
        h = self.embed(tokens)  # (B, T, D)
        for block in self.blocks:
            h = block(h)  # (B, T, D)
        return self.classifier(self.norm_out(h))  # (B, T, D) -> (B, T, V)


@dataclass(frozen=True)
class OrderResult:
    """What ``train_order_model`` measured."""

    losses: list[float]  # training loss at every step
    accuracy: float  # held-out per-token accuracy
    seconds: float  # wall time of the training loop
    parameters: int  # number of trained parameters
    position_accuracy: list[float]  # held-out accuracy of output position i, i = 0 .. T - 1
    model: nn.Module  # the trained OrderModel, in eval mode


def train_order_model(config: ReversalConfig = ReversalConfig(), positions: str = "sinusoidal",
                      seed: int = 0, model_class: Callable[[ReversalConfig, str], nn.Module] | None = None) -> OrderResult:
    """Train an ``OrderModel`` on reversal; same seed, same data for every kind of position.

    After the warm-up the learning rate is constant, so the first k steps of a
    run do not depend on ``config.steps``: a shorter run is a prefix of a longer one.

    Args:
        config: Sizes and budget.
        positions: One of ``POSITION_KINDS``.
        seed: Initial weights, batches and held-out set.
        model_class: Builds the model from (config, positions); ``OrderModel`` unless given
            (notebook 06 passes the class defined in its cell).

    Returns:
        An ``OrderResult``.
    """
    torch.manual_seed(seed)
    model = (OrderModel if model_class is None else model_class)(config, positions)
    x_test, y_test = make_reversal_batch(config, config.test_size, torch.Generator().manual_seed(10_000 + seed))
    generator = torch.Generator().manual_seed(seed)

    def step_loss(step: int) -> torch.Tensor:
        x, y = make_reversal_batch(config, config.batch_size, generator)
        return nn.functional.cross_entropy(model(x).reshape(-1, config.V), y.reshape(-1))

    result = fit(model, torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=0.0), step_loss,
                 training_steps(config), f"order model, {positions} positions, {config.num_layers} block(s), seed {seed}",
                 lr_at=lambda step: config.lr * min(1.0, (step + 1) / config.warmup))  # linear warm-up
    model.eval()
    with torch.no_grad():
        correct = (model(x_test).argmax(dim=-1) == y_test).float()  # (test_size, T)
    return OrderResult(losses=list(result.losses), accuracy=correct.mean().item(), seconds=result.seconds,
                       parameters=sum(p.numel() for p in model.parameters() if p.requires_grad),
                       position_accuracy=correct.mean(dim=0).tolist(), model=model)
