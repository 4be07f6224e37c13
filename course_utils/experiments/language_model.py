"""Training and measuring the small GPT of notebook 09 on *The Devil's Dictionary*.

The corpus ships in ``data/devils_dictionary.txt`` (provenance, licence and
sha256 in ``data/README.md``); nothing is downloaded. Character-level tokens.
The training recipe: AdamW (Loshchilov & Hutter 2019) with weight decay on the
matrices only, a linear warm-up then cosine decay of the learning rate,
dropout, gradient clipping; every step goes through the course's one loop,
:func:`course_utils.experiments.loop.fit`. :func:`attention_weights` reads
every head's attention pattern, for the search for induction heads (Olsson et
al. 2022, arXiv:2209.11895).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch
from torch import nn

from course_utils.blocks.attention import masked_softmax, scaled_scores
from course_utils.blocks.gpt import GPT, generate, next_token_loss
from course_utils.blocks.masks import causal_mask
from course_utils.blocks.multihead import split_heads
from course_utils.experiments.data import DATA_DIR
from course_utils.experiments.loop import fit, training_steps

CORPUS = DATA_DIR / "devils_dictionary.txt"
"""Ambrose Bierce, *The Devil's Dictionary* (1911), entries ABASEMENT to ZOOLOGY, runs of spaces collapsed."""


def load_devils_dictionary() -> str:
    """The shipped text, exactly as committed (ASCII, one newline per line)."""
    return CORPUS.read_text(encoding="ascii")


def random_windows(data: torch.Tensor, batch_size: int, length: int, generator: torch.Generator) -> torch.Tensor:
    """``batch_size`` windows of ``length + 1`` consecutive tokens at random offsets.

    Args:
        data: (N,) int64 token ids.
        batch_size: B.
        length: T, the tokens the model reads; each window has one more, the last target.
        generator: Draws the offsets.

    Returns:
        (B, T + 1) int64.
    """
    starts = torch.randint(0, len(data) - length, (batch_size,), generator=generator)  # (B,)
    return torch.stack([data[s:s + length + 1] for s in starts.tolist()])  # (B, T + 1)


def evaluation_windows(data: torch.Tensor, length: int) -> torch.Tensor:
    """The whole of ``data`` cut into windows of ``length + 1`` tokens that overlap by one (every token but the first is a target once).

    Returns:
        (N', T + 1) int64; a last incomplete window is dropped.
    """
    count = (len(data) - 1) // length
    return torch.stack([data[i * length:i * length + length + 1] for i in range(count)])  # (N', T + 1)


@torch.no_grad()
def evaluate(model: nn.Module, windows: torch.Tensor, batch_size: int = 128) -> float:
    """Mean next-token loss (nats per token) of ``model`` over ``windows`` (N, T + 1), in eval mode."""
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    for i in range(0, len(windows), batch_size):
        chunk = windows[i:i + batch_size]  # (b, T + 1)
        total += next_token_loss(model, chunk).item() * len(chunk)  # every window has T predictions
        count += len(chunk)
    model.train(was_training)
    return total / count


def warmup_cosine(step: int, steps: int, peak_lr: float, warmup_steps: int, min_lr: float) -> float:
    """Learning rate of step ``step`` (from 0): linear warm-up to ``peak_lr``, then cosine decay to ``min_lr``."""
    if step < warmup_steps:
        return peak_lr * (step + 1) / warmup_steps  # never 0: the first step already moves
    progress = (step - warmup_steps) / max(1, steps - warmup_steps)  # 0 -> 1 over the rest of training
    return min_lr + 0.5 * (peak_lr - min_lr) * (1 + math.cos(math.pi * progress))


def adamw_for(model: nn.Module, lr: float, weight_decay: float) -> torch.optim.AdamW:
    """AdamW with weight decay on the weight matrices only; biases, LayerNorm gains and shifts are not decayed."""
    matrices = [p for p in model.parameters() if p.dim() >= 2]
    others = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": matrices, "weight_decay": weight_decay}, {"params": others, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95))


@dataclass(frozen=True)
class LMTrainConfig:
    """How a ``GPT`` is trained in notebook 09."""

    steps: int = 300  # optimizer steps (COURSE_UTILS_SMOKE=1: 3)
    batch_size: int = 32  # B windows per step
    length: int = 64  # T tokens read per window (the model's max_len)
    peak_lr: float = 3e-3  # learning rate after the warm-up
    warmup_steps: int = 30  # linear warm-up
    min_lr: float = 3e-4  # learning rate at the end of the cosine decay
    weight_decay: float = 0.1  # AdamW's decoupled decay, on the weight matrices
    grad_clip: float = 1.0  # largest global gradient norm
    seed: int = 0  # the windows drawn


@dataclass(frozen=True)
class LMTrainResult:
    """What ``train_language_model`` measured."""

    losses: tuple[float, ...]  # training loss at every step
    grad_norms: tuple[float, ...]  # global gradient norm at every step, before clipping
    lrs: tuple[float, ...]  # learning rate of every step
    seconds: float  # wall time of the loop
    steps: int


class _GradNorms:
    """Accumulates the squared gradient norm of every step as the gradients arrive, before any clipping."""

    def __init__(self, model: nn.Module) -> None:
        self.norms: list[float] = []
        self.current = 0.0
        self.handles = [p.register_post_accumulate_grad_hook(self.add) for p in model.parameters() if p.requires_grad]

    def add(self, p: torch.Tensor) -> None:
        self.current += float(p.grad.detach().pow(2).sum())

    def next_step(self) -> None:
        if self.current:
            self.norms.append(self.current**0.5)
        self.current = 0.0

    def close(self) -> list[float]:
        self.next_step()
        for handle in self.handles:
            handle.remove()
        return self.norms


def train_language_model(model: GPT, train_data: torch.Tensor, config: LMTrainConfig = LMTrainConfig(),
                         label: str = "09 GPT") -> LMTrainResult:
    """Train ``model`` on random windows of ``train_data`` with AdamW, warm-up and cosine decay, clipping.

    Args:
        model: Trained in place; left in eval mode.
        train_data: (N,) int64 token ids.
        config: The recipe.
        label: How ``make bench`` names the run.

    Returns:
        An :class:`LMTrainResult`.
    """
    steps = training_steps(config)
    generator = torch.Generator().manual_seed(config.seed)
    optimizer = adamw_for(model, config.peak_lr, config.weight_decay)
    recorder = _GradNorms(model)

    def lr_at(step: int) -> float:
        return warmup_cosine(step, steps, config.peak_lr, max(1, min(config.warmup_steps, steps // 2)), config.min_lr)

    def step_loss(step: int) -> torch.Tensor:
        recorder.next_step()
        return next_token_loss(model, random_windows(train_data, config.batch_size, config.length, generator))

    try:
        result = fit(model, optimizer, step_loss, steps, label, lr_at=lr_at, grad_clip=config.grad_clip)
    finally:
        norms = recorder.close()
    return LMTrainResult(losses=result.losses, grad_norms=tuple(norms), lrs=tuple(lr_at(k) for k in range(steps)),
                         seconds=result.seconds, steps=steps)


def time_generation(model: GPT, num_tokens: int, use_cache: bool, repeats: int = 3) -> float:
    """Fastest of ``repeats`` runs: seconds per generated token when greedily generating ``num_tokens`` after one token."""
    prompt = torch.zeros(1, 1, dtype=torch.long)
    best = float("inf")
    model.eval()
    for _ in range(repeats):
        start = time.perf_counter()
        generate(model, prompt, num_tokens, temperature=0.0, use_cache=use_cache)
        best = min(best, time.perf_counter() - start)
    return best / num_tokens


def decode_madds(num_tokens: int, d_model: int, num_layers: int, d_ff: int, vocab_size: int, use_cache: bool,
                 num_groups_fraction: float = 1.0) -> int:
    """Multiply-adds to generate ``num_tokens`` tokens after one, with or without the KV cache (notebook 09).

    Per block and per position that goes through the model: the q and out
    projections (2 D^2), the k and v projections (2 D^2 times G / H), the
    feed-forward network (2 D d_ff); per query, the scores and the weighted
    sum over the S keys it sees (2 S D); and the output layer (D V). Without
    the cache, step t runs all t positions again; with it, one.
    """
    per_position = num_layers * (2 * d_model**2 + 2 * d_model**2 * num_groups_fraction + 2 * d_model * d_ff) \
        + d_model * vocab_size
    total = 0
    for t in range(1, num_tokens + 1):  # step t: the text has t tokens, the model predicts token t
        if use_cache:
            total += per_position + num_layers * 2 * t * d_model  # one new query over t keys
        else:
            total += t * per_position + num_layers * 2 * d_model * t * (t + 1) // 2  # query i sees i + 1 keys
    return int(total)


@torch.no_grad()
def attention_weights(model: GPT, tokens: torch.Tensor) -> torch.Tensor:
    """The attention weights of every head of every block of ``model`` on ``tokens`` (notebook 09, induction heads).

    ``GroupedQueryAttention`` returns no weights, so each block's are
    recomputed from its own projections of what it reads, the normalised
    residual stream: ``softmax(q_i k_j / sqrt(Dh))`` under the causal mask,
    query head h reading key group h // (H / G).

    Args:
        model: A ``GPT`` in eval mode (no dropout).
        tokens: (B, T) int64 ids, T <= ``max_len``.

    Returns:
        (B, L, H, T, T) float: ``[b, l, h, i, j]`` is the weight of key j for
        query i in head h of block l; each row sums to 1 over j <= i.
    """
    B, T = tokens.shape
    x = model.token_embedding(tokens) + model.position_embedding(torch.arange(T, device=tokens.device))  # (B, T, D)
    maps = []
    for block in model.blocks:
        attn = block.self_attn
        h = block.norm1(x)  # (B, T, D): what the attention reads (pre-LN)
        q = split_heads(attn.q_proj(h), attn.num_heads)  # (B, T, D) -> (B, H, T, Dh)
        k = split_heads(attn.k_proj(h), attn.num_groups)  # (B, T, G*Dh) -> (B, G, T, Dh)
        k = k.repeat_interleave(attn.num_heads // attn.num_groups, dim=1)  # (B, G, T, Dh) -> (B, H, T, Dh)
        maps.append(masked_softmax(scaled_scores(q, k), causal_mask(T)))  # (B, H, T, T)
        x = block(x)[0]  # (B, T, D): into the next block
    return torch.stack(maps, dim=1)  # (B, L, H, T, T)
