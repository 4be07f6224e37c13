"""Training and measuring the small GPT of notebooks 10 and 11 on *The Devil's Dictionary*.

The corpus ships in ``data/devils_dictionary.txt`` (provenance, licence and
sha256 in ``data/README.md``); nothing is downloaded. Character-level tokens.
The training recipe: AdamW (Loshchilov & Hutter 2019) with weight decay on the
matrices only, a linear warm-up then cosine decay of the learning rate,
dropout, gradient clipping, in a loop written out in notebook 10 (the same code as
:func:`train_language_model`). :func:`attention_weights` reads
every head's attention pattern, for the search for induction heads (Olsson et
al. 2022, arXiv:2209.11895).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from course_utils.blocks.attention import masked_softmax, scaled_scores
from course_utils.blocks.gpt import GPT, GPTConfig, generate, generate_with_cache, next_token_loss
from course_utils.blocks.masks import causal_mask
from course_utils.blocks.multihead import split_heads
from course_utils.experiments.data import DATA_DIR
from course_utils.experiments.loop import num_threads, record_training, training_steps

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
    """How a ``GPT`` is trained in notebook 10."""

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
    steps: int


def train_language_model(model: GPT, train_data: torch.Tensor, config: LMTrainConfig, label: str = "GPT") -> LMTrainResult:
    """Train ``model`` on random windows of ``train_data``: AdamW, warm-up then cosine decay, clipping (notebook 10).

    Args:
        model: Trained in place; left in eval mode.
        train_data: (N,) int64 token ids.
        config: The recipe.
        label: How ``make bench`` names the run.

    Returns:
        An :class:`LMTrainResult`, with the gradient norm of every step before clipping.
    """
    steps = training_steps(config)  # config.steps (3 when the grading tests only check that the notebook runs)
    generator = torch.Generator().manual_seed(config.seed)  # draws the windows
    optimizer = adamw_for(model, config.peak_lr, config.weight_decay)
    warmup = max(1, min(config.warmup_steps, steps // 2))
    losses, grad_norms, lrs = [], [], []
    model.train()  # dropout on
    start = time.perf_counter()
    for step in range(steps):
        lr = warmup_cosine(step, steps, config.peak_lr, warmup, config.min_lr)
        for group in optimizer.param_groups:
            group["lr"] = lr
        windows = random_windows(train_data, config.batch_size, config.length, generator)  # (B, T + 1)
        loss = next_token_loss(model, windows)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        norm = nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip or math.inf)  # returns the norm before
        optimizer.step()
        losses.append(loss.item())
        grad_norms.append(norm.item())
        lrs.append(lr)
    record_training(label, time.perf_counter() - start)
    model.eval()  # dropout off
    return LMTrainResult(losses=tuple(losses), grad_norms=tuple(grad_norms), lrs=tuple(lrs), steps=steps)


def time_generation(model: GPT, num_tokens: int, use_cache: bool, repeats: int = 3) -> float:
    """Fastest of ``repeats`` runs: seconds per generated token when greedily generating ``num_tokens`` after one token.

    With ``use_cache`` it times ``generate_with_cache``, without it ``generate``, which runs the whole text again at
    every step.
    """
    prompt = torch.zeros(1, 1, dtype=torch.long)
    sample = generate_with_cache if use_cache else generate
    best = float("inf")
    model.eval()
    for _ in range(repeats):
        start = time.perf_counter()
        sample(model, prompt, num_tokens, temperature=0.0)
        best = min(best, time.perf_counter() - start)
    return best / num_tokens


def decode_madds(num_tokens: int, d_model: int, num_layers: int, d_ff: int, vocab_size: int, use_cache: bool,
                 num_groups_fraction: float = 1.0) -> int:
    """Multiply-adds to generate ``num_tokens`` tokens after one, with or without the KV cache (notebook 11).

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
    """The attention weights of every head of every block of ``model`` on ``tokens`` (notebook 11, induction heads).

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


def devils_dictionary_ids() -> tuple[list[str], torch.Tensor, torch.Tensor]:
    """The characters of the shipped text (sorted: the vocabulary), and its ids split 90% / 10% (notebooks 10, 11).

    Returns:
        ``(chars, train_ids, val_ids)``: ``chars[i]`` is token ``i``; the two splits are (N,) int64.
    """
    text = load_devils_dictionary()
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    data = torch.tensor([stoi[c] for c in text])  # (N,) int64
    n_train = int(0.9 * len(data))
    return chars, data[:n_train], data[n_train:]


def save_checkpoint(model: GPT, path: str | Path) -> None:
    """Write ``model``'s sizes and float32 weights to ``path`` (plain tensors and ints: ``torch.load(weights_only=True)`` reads it)."""
    config = {name: getattr(model.config, name) for name in model.config.__dataclass_fields__}
    state = {name: tensor.detach().to(torch.float32).contiguous() for name, tensor in model.state_dict().items()}
    torch.save({"config": config, "state_dict": state}, path)


def load_checkpoint(path: str | Path) -> GPT:
    """The ``GPT`` saved by :func:`save_checkpoint`, in eval mode.

    The weights are stored as float32 numbers and read back bit for bit on any
    CPU (``map_location="cpu"``, no code is unpickled); what a forward pass then
    computes can differ in the last bits from one CPU to another, as for any model.
    """
    saved = torch.load(path, map_location="cpu", weights_only=True)
    model = GPT(GPTConfig(**saved["config"]))
    model.load_state_dict(saved["state_dict"])
    return model.eval()


def make_checkpoint(path: str | Path, steps: int = 500, batch_size: int = 16, num_groups: int | None = None,
                    dropout: float = 0.0, seed: int = 0) -> float:
    """Train the GPT of notebook 10 (D = 96, H = 4, L = 3, context 64) on the dictionary and save it; return its validation loss.

    The recipe is notebook 10's (peak learning rate 6e-3 after 30 warm-up steps, cosine decay to 6e-4, weight decay
    0.1, clipping at 1); ``torch.manual_seed(seed)`` before the model, ``seed`` also draws the windows. With the
    defaults it is notebook 10's own run; ``data/README.md`` gives the command for each shipped checkpoint.
    """
    chars, train_ids, val_ids = devils_dictionary_ids()
    torch.manual_seed(seed)
    model = GPT(GPTConfig(vocab_size=len(chars), max_len=64, d_model=96, num_heads=4, num_groups=num_groups,
                          num_layers=3, d_ff=384, dropout=dropout))
    config = LMTrainConfig(steps=steps, batch_size=batch_size, length=64, peak_lr=6e-3, warmup_steps=30, min_lr=6e-4,
                           weight_decay=0.1, grad_clip=1.0, seed=seed)
    train_language_model(model, train_ids, config, label=f"checkpoint {Path(path).name}")
    save_checkpoint(model, path)
    return evaluate(model, evaluation_windows(val_ids, 64))


def multi_query_pairs(seeds: range | list[int], folder: str | Path) -> dict[int, tuple[float, float]]:
    """Notebook 10's run with multi-head (G = H) and with multi-query attention (G = 1), from each seed (lab 11).

    Returns ``{seed: (multi-head validation loss, multi-query validation loss)}``; each pair shares its seed, so the
    two models read the same windows (their initial weights differ: the smaller key and value projections draw fewer
    random numbers). The checkpoints are written
    into ``folder`` and overwritten by the next seed. ``data/gpt_mqa_seeds.json`` holds seeds 0 to 7. Training runs on
    one thread, as in the notebooks (``setup()``), so that the float path, and with it the losses, match theirs.
    """
    folder = Path(folder)
    with num_threads(1):
        return {seed: (make_checkpoint(folder / "mha.pt", seed=seed),
                       make_checkpoint(folder / "mqa.pt", num_groups=1, seed=seed)) for seed in seeds}


@dataclass(frozen=True)
class InductionConfig:
    """A two-block model trained on random tokens in which a segment comes back (notebook 11)."""

    steps: int = 3000  # optimizer steps (COURSE_UTILS_SMOKE=1: 3)
    batch_size: int = 64  # B sequences per step
    min_n: int = 2  # the repeated segment's length n is drawn from min_n .. max_n for each sequence
    max_n: int = 10
    max_gap: int = 4  # the gap between the two copies: 0 .. max_gap tokens, drawn for each sequence
    length: int = 24  # T, the tokens a model reads (2 max_n + max_gap <= T + 1)
    vocab_size: int = 32  # V
    rule_share: float = 0.5  # the share of tokens set by the rule, which reads the two tokens before them
    d_model: int = 32  # D
    num_heads: int = 2  # H
    lr: float = 3e-3  # constant after a warm-up of 30 steps; AdamW without weight decay, clipping at 1
    eval_every: int = 100  # steps between two measurements of the loss
    seed: int = 0  # the model's initial weights and the sequences drawn


def copy_task(batch_size: int, config: InductionConfig,
              generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random tokens, some set by a fixed rule, in which a segment of random length comes back (notebook 11).

    Each row holds ``length + 1`` tokens. A token is random, or with probability ``rule_share`` set by a fixed rule
    from the two tokens before it: after a, b comes ``rule[a, b]``. Then a segment of n tokens (n drawn from
    ``min_n .. max_n`` for each row), starting at a random position, comes back after a gap of 0 to ``max_gap``
    tokens. Neither the place of the copies nor the distance between them is fixed, so no fixed look-back reaches the
    token to copy: a model must find the earlier occurrence of the current token and read what followed it. The
    rule gives a previous-token head a use of its own, as the statistics of words do in a real text.

    Returns:
        ``(tokens, copyable, lag)``: tokens (B, length + 1) int64; copyable (B, length) bool, True at the positions
        whose next token is the copy of a known one (the second copy's first n - 1 positions); lag (B,) int64, how
        far the second copy sits after the first (n + gap), so that query i's induction position is i - lag + 1.
    """
    V, T = config.vocab_size, config.length
    rule = torch.randint(0, V, (V, V), generator=torch.Generator().manual_seed(12345))  # (V, V): after a, b
    tokens = torch.randint(0, V, (batch_size, T + 1), generator=generator)  # (B, T + 1) random tokens
    follows = torch.rand(batch_size, T + 1, generator=generator) < config.rule_share  # (B, T + 1)
    for i in range(2, T + 1):
        tokens[:, i] = torch.where(follows[:, i], rule[tokens[:, i - 2], tokens[:, i - 1]], tokens[:, i])  # (B,)
    n = torch.randint(config.min_n, config.max_n + 1, (batch_size,), generator=generator)  # (B,): segment lengths
    gaps = torch.randint(0, config.max_gap + 1, (batch_size,), generator=generator)  # (B,)
    lag = n + gaps  # (B,): how far the second copy sits after the first
    starts = (torch.rand(batch_size, generator=generator) * (T + 2 - n - lag)).long()  # (B,): both copies fit
    position = torch.arange(T + 1)  # (T + 1,)
    begin = (starts + lag)[:, None]  # (B, 1): where the second copy begins
    in_copy = (position >= begin) & (position < begin + n[:, None])  # (B, T + 1)
    tokens = tokens.gather(1, torch.where(in_copy, position - lag[:, None], position))  # (B, T + 1)
    copyable = in_copy[:, :T] & (position[:T] < begin + n[:, None] - 1)  # (B, T): the next token is a copy
    return tokens, copyable, lag


@torch.no_grad()
def copy_loss(model: nn.Module, tokens: torch.Tensor, positions: torch.Tensor) -> float:
    """Mean next-token loss (nats) of ``model`` at the marked ``positions`` (B, T) of ``tokens`` (B, T + 1)."""
    logits = model(tokens[:, :-1])  # (B, T, V)
    losses = F.cross_entropy(logits.transpose(1, 2), tokens[:, 1:], reduction="none")  # (B, T)
    return losses[positions].mean().item()


def train_on_repeats(config: InductionConfig,
                     label: str = "induction") -> tuple[GPT, list[int], dict[str, list[float]]]:
    """Train a two-block ``GPT`` on :func:`copy_task` and measure its loss on the copyable positions and the others.

    Returns:
        The model (eval mode), the steps at which the loss was measured, and that loss on 256 held-out sequences,
        ``{"copyable positions": [...], "other positions": [...]}``.
    """
    torch.manual_seed(config.seed)
    model = GPT(GPTConfig(vocab_size=config.vocab_size, max_len=config.length, d_model=config.d_model,
                          num_heads=config.num_heads, num_layers=2, d_ff=4 * config.d_model, dropout=0.0))
    generator = torch.Generator().manual_seed(config.seed)
    tokens, copyable, _ = copy_task(256, config, torch.Generator().manual_seed(10_000))  # held out
    optimizer = adamw_for(model, config.lr, weight_decay=0.0)
    steps, measured, losses = training_steps(config), [], {"copyable positions": [], "other positions": []}
    start = time.perf_counter()
    for step in range(steps):
        for group in optimizer.param_groups:
            group["lr"] = warmup_cosine(step, steps, config.lr, 30, config.lr)  # min_lr = peak: constant after warm-up
        loss = next_token_loss(model, copy_task(config.batch_size, config, generator)[0])  # every position
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if (step + 1) % config.eval_every == 0 or step + 1 == steps:
            model.eval()
            measured.append(step + 1)
            losses["copyable positions"].append(copy_loss(model, tokens, copyable))
            losses["other positions"].append(copy_loss(model, tokens, ~copyable))
            model.train()
    record_training(label, time.perf_counter() - start)
    return model.eval(), measured, losses


def loss_without_head(model: GPT, block: int, head: int, tokens: torch.Tensor, positions: torch.Tensor) -> float:
    """:func:`copy_loss` of ``model`` with one head removed (the ablation of Olsson et al. 2022; notebook 11).

    A head reaches the residual stream only through its D_h columns of its block's ``out_proj``: they are set to
    zero for the measurement, then restored.
    """
    weight = model.blocks[block].self_attn.out_proj.weight  # (D, D): column block h is head h's way out
    Dh = weight.shape[1] // model.config.num_heads
    kept = weight.detach().clone()
    with torch.no_grad():
        weight[:, head * Dh:(head + 1) * Dh] = 0.0  # head h's output no longer reaches the residual stream
    try:
        return copy_loss(model, tokens, positions)
    finally:
        with torch.no_grad():
            weight.copy_(kept)  # the head back, also if the measurement fails
