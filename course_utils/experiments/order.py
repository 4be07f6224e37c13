"""Two order-sensitive tasks as per-token classification (notebook 06).

Reversal (an absolute rule: output i is input T - 1 - i) and copying the token
``back`` places back under a causal mask (a relative rule), trained at one length and
tested at a longer one. The same model (one attention block, or ``num_layers``
of them) is trained with each kind of position information (none, sinusoidal,
learned, concatenated, rotary) on the same data. Notebook 06 shows
``RotarySelfAttention`` and ``OrderModel`` in its cells.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from course_utils.blocks.attention import scaled_dot_product_attention
from course_utils.blocks.masks import causal_mask
from course_utils.blocks.multihead import MultiHeadAttention, merge_heads, split_heads
from course_utils.blocks.positional import apply_rotary, sinusoidal_positional_encoding
from course_utils.core.errors import InputError
from course_utils.experiments.loop import TrainResult, fit, training_steps


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
    max_len: int = 12  # rows of the position tables: the longest input the model takes (at least T)
    causal: bool = False  # True: query i attends to keys 0 .. i only
    steps: int = 400  # AdamW steps, a fresh batch each
    batch_size: int = 64  # sequences per step
    lr: float = 3e-3  # learning rate after warm-up
    warmup: int = 50  # steps of linear learning-rate warm-up
    test_size: int = 2000  # held-out sequences


@dataclass(frozen=True)
class CopyConfig:
    """Copy back: at position i the token at i - back, causal; train at length T, test at T_test (notebook 06)."""

    T: int = 12  # training length
    T_test: int = 24  # test length: positions T .. T_test - 1 are never seen in training
    back: int = 3  # how far back the token to copy sits; positions 0 .. back - 1 have no target
    V: int = 16  # vocabulary; tokens are drawn independently, repeats allowed
    D: int = 32  # model width
    num_heads: int = 4  # attention heads
    num_layers: int = 1  # attention blocks, one after the other
    d_ff: int = 64  # hidden width of the feed-forward layer
    concat_dim: int = 16  # "concat": width of the sinusoidal part (unused by the copy experiment)
    max_len: int = 24  # rows of the position tables; a learned table's rows T .. max_len - 1 are never trained
    causal: bool = True  # query i attends to keys 0 .. i only, as in a language model
    steps: int = 200  # AdamW steps, a fresh batch each
    batch_size: int = 64  # sequences per step
    lr: float = 3e-3  # learning rate after warm-up
    warmup: int = 50  # steps of linear learning-rate warm-up
    test_size: int = 2000  # held-out sequences, of length T_test


def make_reversal_batch(config: ReversalConfig, batch_size: int,
                        generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Random sequences of T distinct tokens and their reversals.

    Returns:
        x (B, T) int64 and y (B, T) int64 with ``y[:, i] = x[:, T - 1 - i]``.
    """
    x = torch.rand(batch_size, config.V, generator=generator).argsort(dim=-1)[:, : config.T]  # (B, T), distinct
    return x, x.flip(-1)


IGNORE = -100  # a target that ``cross_entropy`` skips (its default ``ignore_index``)


def make_copy_batch(config: CopyConfig, batch_size: int, T: int,
                    generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Random sequences of length T and, at each position i >= back, the token at i - back.

    Returns:
        x (B, T) int64 and y (B, T) int64 with ``y[:, i] = x[:, i - back]`` and ``y[:, :back] = IGNORE``.
    """
    x = torch.randint(config.V, (batch_size, T), generator=generator)  # (B, T)
    y = torch.full_like(x, IGNORE)  # (B, T)
    y[:, config.back:] = x[:, : T - config.back]  # position i gets the token back places earlier
    return x, y


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

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None,
                return_weights: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """(B, T, D) -> (B, T, D), and the (B, H, T, T) weights if asked; ``mask``: (T, T) bool, True = may attend."""
        q = self.rotate(split_heads(self.q_proj(x), self.num_heads))  # (B, T, D) -> (B, H, T, Dh), row i turned by i
        k = self.rotate(split_heads(self.k_proj(x), self.num_heads))  # (B, T, D) -> (B, H, T, Dh), row j turned by j
        v = split_heads(self.v_proj(x), self.num_heads)  # (B, T, D) -> (B, H, T, Dh): values are not turned
        context, weights = scaled_dot_product_attention(q, k, v, mask)  # e_ij = (q_i R_i) · (k_j R_j) depends on j - i only
        out = self.out_proj(merge_heads(context))  # (B, H, T, Dh) -> (B, T, D) -> (B, T, D)
        return (out, weights) if return_weights else out


class OrderBlock(nn.Module):
    """One attention block: x + attention(LayerNorm(x)), then h + feed_forward(LayerNorm(h)) (notebook 06).

    Notebook 07 builds this block and explains where its LayerNorms go.
    """

    def __init__(self, config: ReversalConfig | CopyConfig, rotary: bool) -> None:
        super().__init__()
        D = config.D
        self.causal = config.causal
        self.norm1 = nn.LayerNorm(D)
        self.attention = RotarySelfAttention(D, config.num_heads) if rotary else MultiHeadAttention(D, config.num_heads)
        self.norm2 = nn.LayerNorm(D)
        self.feed_forward = nn.Sequential(nn.Linear(D, config.d_ff), nn.GELU(), nn.Linear(config.d_ff, D))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """(B, T, D) -> (B, T, D)."""
        mask = causal_mask(h.shape[1]) if self.causal else None  # (T, T): query i sees keys 0 .. i
        h = h + self.attention(self.norm1(h), mask=mask)  # (B, T, D)
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

    def __init__(self, config: ReversalConfig | CopyConfig, positions: str) -> None:
        super().__init__()
        if positions not in POSITION_KINDS:
            raise InputError(f"positions must be one of {POSITION_KINDS}, got {positions!r}")
        if config.max_len < config.T:
            raise InputError(f"max_len = {config.max_len} must be at least the training length T = {config.T}")
        self.positions = positions
        D = config.D
        token_width = D - config.concat_dim if positions == "concat" else D
        self.token_embedding = nn.Embedding(config.V, token_width)
        if positions == "sinusoidal":
            self.register_buffer("pe", sinusoidal_positional_encoding(config.max_len, D))  # (max_len, D), fixed
        elif positions == "concat":
            self.register_buffer("pe", sinusoidal_positional_encoding(config.max_len, config.concat_dim))
        elif positions == "learned":
            self.position_embedding = nn.Embedding(config.max_len, D)  # (max_len, D), trained where used
        self.blocks = nn.ModuleList(OrderBlock(config, rotary=positions == "rotary") for _ in range(config.num_layers))
        self.norm_out = nn.LayerNorm(D)
        self.classifier = nn.Linear(D, config.V)

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """(B, T) int64 tokens -> (B, T, D): token embeddings with the positions added or concatenated."""
        B, T = tokens.shape
        h = self.token_embedding(tokens)  # (B, T, D), or (B, T, D - concat_dim) for "concat"
        if self.positions == "sinusoidal":
            h = h + self.pe[:T]  # (B, T, D) + (T, D)
        elif self.positions == "learned":
            h = h + self.position_embedding.weight[:T]  # (B, T, D) + (T, D): rows 0 .. T - 1
        elif self.positions == "concat":
            h = torch.cat([h, self.pe[:T].expand(B, -1, -1)], dim=-1)  # (B, T, D - concat_dim) | (B, T, concat_dim)
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


def _fit_with_warmup(model: nn.Module, config: ReversalConfig | CopyConfig, step_loss: Callable[[int], torch.Tensor],
                     label: str) -> TrainResult:
    """AdamW without weight decay, ``config.steps`` steps of ``step_loss``, a linear warm-up to ``config.lr``."""
    return fit(model, torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=0.0), step_loss,
               training_steps(config), label, lr_at=lambda step: config.lr * min(1.0, (step + 1) / config.warmup))


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

    result = _fit_with_warmup(model, config, step_loss,
                              f"order model, {positions} positions, {config.num_layers} block(s), seed {seed}")
    model.eval()
    with torch.no_grad():
        correct = (model(x_test).argmax(dim=-1) == y_test).float()  # (test_size, T)
    return OrderResult(losses=list(result.losses), accuracy=correct.mean().item(), seconds=result.seconds,
                       parameters=sum(p.numel() for p in model.parameters() if p.requires_grad),
                       position_accuracy=correct.mean(dim=0).tolist(), model=model)


@dataclass(frozen=True)
class CopyResult:
    """What ``train_copy_model`` measured."""

    losses: list[float]  # training loss at every step
    position_accuracy: list[float]  # held-out accuracy at position i = 0 .. T_test - 1 (NaN for i < back)
    seen: float  # held-out accuracy at the positions back .. T - 1 that training used
    unseen: float  # held-out accuracy at the positions T .. T_test - 1 that training never used
    model: nn.Module  # the trained OrderModel, in eval mode


def train_copy_model(config: CopyConfig = CopyConfig(), positions: str = "rotary", seed: int = 0,
                     model_class: Callable[[CopyConfig, str], nn.Module] | None = None) -> CopyResult:
    """Train an ``OrderModel`` to copy the token ``back`` places back at length T; test it at length T_test.

    Args:
        config: Sizes, lengths and budget.
        positions: One of ``POSITION_KINDS``.
        seed: Initial weights, batches and held-out set.
        model_class: Builds the model from (config, positions); ``OrderModel`` unless given.

    Returns:
        A ``CopyResult``.
    """
    torch.manual_seed(seed)
    model = (OrderModel if model_class is None else model_class)(config, positions)
    x_test, y_test = make_copy_batch(config, config.test_size, config.T_test, torch.Generator().manual_seed(10_000 + seed))
    generator = torch.Generator().manual_seed(seed)

    def step_loss(step: int) -> torch.Tensor:
        x, y = make_copy_batch(config, config.batch_size, config.T, generator)
        return nn.functional.cross_entropy(model(x).reshape(-1, config.V), y.reshape(-1), ignore_index=IGNORE)

    result = _fit_with_warmup(model, config, step_loss, f"copy model, {positions} positions, seed {seed}")
    model.eval()
    with torch.no_grad():
        correct = (model(x_test).argmax(dim=-1) == y_test).float()  # (test_size, T_test)
    per_position = correct.mean(dim=0)  # (T_test,)
    per_position[: config.back] = float("nan")  # no target there
    return CopyResult(losses=list(result.losses), position_accuracy=per_position.tolist(),
                      seen=per_position[config.back: config.T].mean().item(),
                      unseen=per_position[config.T:].mean().item(), model=model)
