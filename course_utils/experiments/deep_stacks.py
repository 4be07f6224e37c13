"""Deep stacks of encoder blocks: gradients at initialisation, and training with and without warm-up (notebook 07).

A pre-LN stack ends with a final LayerNorm, as in the course's transformer, in
GPT-2 and in Xiong et al. (2020): without it the un-normalised residual stream
reaches the loss directly and the gradients are not comparable with post-LN's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import nn

from course_utils.blocks.positional import sinusoidal_positional_encoding
from course_utils.blocks.transformer import LayerNorm, TransformerEncoderBlock
from course_utils.experiments.loop import fit, training_steps


def gradient_norms_by_layer(depth: int, norm_first: bool, residual_connections: bool = True, d_model: int = 64,
                            num_heads: int = 4, d_ff: int = 128, B: int = 8, T: int = 16,
                            seed: int = 0, final_norm: bool | None = None) -> list[float]:
    """Gradient norm of each block's parameters at initialisation, for a stack of encoder blocks (notebook 07).

    The loss is the mean squared error against a random target. Without
    residual connections each sublayer's output replaces its input (post-LN:
    ``norm(sublayer(x))``; pre-LN: ``sublayer(norm(x))``).

    Args:
        depth: Number of blocks.
        norm_first: Pre-LN (True) or post-LN (False).
        residual_connections: Keep (True) or remove (False) the residual additions.
        d_model, num_heads, d_ff: Block sizes.
        B, T: Batch size and sequence length of the random input.
        seed: Seed for the weights, input and target.
        final_norm: Apply a LayerNorm to the stack's output before the loss;
            ``None`` (default) means yes for pre-LN stacks, no for post-LN ones,
            whose last block already ends with one.

    Returns:
        ``depth`` gradient norms, from the first block (nearest the input) to the last.
    """
    torch.manual_seed(seed)
    blocks = [TransformerEncoderBlock(d_model, num_heads, d_ff, norm_first=norm_first) for _ in range(depth)]
    final = torch.nn.LayerNorm(d_model) if (norm_first if final_norm is None else final_norm) else torch.nn.Identity()
    x = torch.randn(B, T, d_model)
    target = torch.randn(B, T, d_model)
    h = x
    for block in blocks:
        if residual_connections:
            h = block(h)
        elif norm_first:
            h = block.self_attn(block.norm1(h))
            h = block.feed_forward(block.norm2(h))
        else:
            h = block.norm1(block.self_attn(h))
            h = block.norm2(block.feed_forward(h))
    loss = ((final(h) - target) ** 2).mean()
    loss.backward()
    return [math.sqrt(sum(float((p.grad ** 2).sum()) for p in block.parameters() if p.grad is not None))
            for block in blocks]


@dataclass(frozen=True)
class WarmupConfig:
    """A deep stack of encoder blocks learning to reverse fixed-length sequences (notebook 07, the warm-up runs)."""

    depth: int = 6  # N: encoder blocks
    d_model: int = 32  # D
    num_heads: int = 4  # H
    d_ff: int = 64  # hidden width of the feed-forward networks
    length: int = 8  # T: tokens per sequence (all of the same length: no padding)
    n_symbols: int = 10  # V: vocabulary size; guessing gives 1 / V of the tokens right
    batch_size: int = 16  # B: sequences per step, drawn fresh at every step
    steps: int = 100  # Adam steps
    lr: float = 1e-2  # peak learning rate
    warmup_steps: int = 50  # linear warm-up from lr / warmup_steps to lr, then constant; 0 = no warm-up
    grad_clip: float = 1.0  # largest global gradient norm, as in the seq2seq training
    n_test: int = 512  # fresh test sequences


@dataclass(frozen=True)
class StackRun:
    """What :func:`train_reversal_stack` measured.

    Attributes:
        accuracy: Fraction of the test tokens predicted right (chance: 1 / V), after the last step.
        losses: Training loss at every step.
        accuracy_at: ``{steps taken: accuracy}`` at the earlier steps asked for with ``eval_at``.
    """

    accuracy: float
    losses: tuple[float, ...]
    accuracy_at: dict[int, float] = field(default_factory=dict)


class _ReversalStack(nn.Module):
    """Embeddings scaled by sqrt(D) plus sinusoidal positions, ``depth`` encoder blocks, (pre-LN) a final LayerNorm,
    and a linear layer that predicts, at every position i, the token at position T - 1 - i."""

    def __init__(self, config: WarmupConfig, norm_first: bool) -> None:
        super().__init__()
        D = config.d_model
        self.embedding = nn.Embedding(config.n_symbols, D)
        nn.init.normal_(self.embedding.weight, std=D**-0.5)
        self.register_buffer("pe", sinusoidal_positional_encoding(config.length, D))  # (T, D)
        self.blocks = nn.ModuleList(TransformerEncoderBlock(D, config.num_heads, config.d_ff, norm_first=norm_first)
                                    for _ in range(config.depth))
        self.final_norm = LayerNorm(D) if norm_first else nn.Identity()
        self.out = nn.Linear(D, config.n_symbols)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embedding(tokens) * math.sqrt(self.embedding.embedding_dim) + self.pe  # (B, T, D)
        for block in self.blocks:
            h = block(h)  # (B, T, D)
        return self.out(self.final_norm(h))  # (B, T, V)


def train_reversal_stack(norm_first: bool, config: WarmupConfig = WarmupConfig(), seed: int = 0,
                         eval_at: tuple[int, ...] = ()) -> StackRun:
    """Train a deep post-LN or pre-LN stack with Adam, with or without a learning-rate warm-up (notebook 07).

    The task: read T random symbols and write them reversed, one output per
    position (an encoder only: every position attends to every other). A
    fresh batch is drawn at every step, so the test accuracy measures learning,
    not memorising.

    Args:
        norm_first: Pre-LN (True; the stack ends with a final LayerNorm) or post-LN (False).
        config: Sizes, budget and warm-up (``warmup_steps=0``: the full rate from the first step).
        seed: Seeds the weights and the training batches; the test set is the same for every seed.
        eval_at: Also measure the test accuracy after these numbers of steps (those below
            ``config.steps``). The run itself is the same as without them: a run of 300 steps
            measured at 100 is, up to step 100, the run of 100 steps.

    Returns:
        A :class:`StackRun`.
    """
    torch.manual_seed(seed)
    model = _ReversalStack(config, norm_first)
    optimizer = torch.optim.Adam(model.parameters(), lr=config.lr)
    batches = torch.Generator().manual_seed(seed)
    V, T, B = config.n_symbols, config.length, config.batch_size
    test = torch.randint(0, V, (config.n_test, T), generator=torch.Generator().manual_seed(10_000))  # (n_test, T)

    def step_loss(step: int) -> torch.Tensor:
        tokens = torch.randint(0, V, (B, T), generator=batches)  # (B, T)
        logits = model(tokens)  # (B, T, V)
        return nn.functional.cross_entropy(logits.flatten(0, 1), tokens.flip(1).flatten())  # (B*T, V) vs (B*T,)

    def lr_at(step: int) -> float:
        return config.lr * min(1.0, (step + 1) / config.warmup_steps) if config.warmup_steps > 0 else config.lr

    @torch.no_grad()
    def test_accuracy() -> float:
        return (model(test).argmax(-1) == test.flip(1)).float().mean().item()  # (n_test, T, V) -> (n_test, T) -> scalar

    kind = "pre-LN" if norm_first else "post-LN"
    steps = training_steps(config)
    stops = sorted({s for s in eval_at if 0 < s < steps} | {steps})
    losses: list[float] = []
    accuracy_at: dict[int, float] = {}
    for stop in stops:  # train up to each stop in turn, with the same optimizer: one continuous run
        done = len(losses)
        result = fit(model, optimizer, lambda k, done=done: step_loss(done + k), stop - done,
                     f"{kind} stack of {config.depth}, warm-up {config.warmup_steps}, seed {seed}, steps {done + 1}-{stop}",
                     lr_at=lambda k, done=done: lr_at(done + k), grad_clip=config.grad_clip, threads=1)
        losses += result.losses
        if stop < steps:
            accuracy_at[stop] = test_accuracy()
    return StackRun(accuracy=test_accuracy(), losses=tuple(losses), accuracy_at=accuracy_at)
