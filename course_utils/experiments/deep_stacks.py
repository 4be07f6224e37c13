"""Deep stacks of encoder blocks: gradients at initialisation, training with and without warm-up, and one Adam step
(notebook 08).

A pre-LN stack ends with a final LayerNorm, as in the course's transformer, in
GPT-2 and in Xiong et al. (2020): without it the un-normalised residual stream
reaches the loss directly and the gradients are not comparable with post-LN's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from course_utils.blocks.positional import sinusoidal_positional_encoding
from course_utils.blocks.transformer import LayerNorm, TransformerEncoderBlock
from course_utils.experiments.loop import fit, training_steps


def adam_step(param: torch.Tensor, grad: torch.Tensor, m: torch.Tensor, v: torch.Tensor, t: int, lr: float,
              betas: tuple[float, float] = (0.9, 0.999),
              eps: float = 1e-8) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One Adam update of a tensor of parameters (Kingma and Ba 2015, Algorithm 1), as torch.optim.Adam takes it.

    Notebook 08's exercise. ``eps`` is added to the square root of the bias-corrected ``v``, as PyTorch adds it.

    Args:
        param: The parameters before the step, any shape.
        grad: Their gradient g_t, the shape of ``param``.
        m, v: The running averages m_{t-1} and v_{t-1} (zeros before step 1), the shape of ``param``.
        t: The number of this step, counted from 1.
        lr: The learning rate.
        betas: beta1 and beta2, the decay rates of m and v.
        eps: Added to the denominator.

    Returns:
        New tensors (the inputs are left unchanged): the parameters after the step, m_t and v_t.
    """
    beta1, beta2 = betas
    m = beta1 * m + (1 - beta1) * grad  # average of the gradients
    v = beta2 * v + (1 - beta2) * grad ** 2  # average of their squares
    m_hat = m / (1 - beta1 ** t)  # both averages start at 0: divide out that bias
    v_hat = v / (1 - beta2 ** t)
    return param - lr * m_hat / (v_hat.sqrt() + eps), m, v


class WithoutResidual(nn.Module):
    """An encoder block with its two residual additions removed: each sublayer's output replaces its input."""

    def __init__(self, block: TransformerEncoderBlock) -> None:
        super().__init__()
        self.block = block

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b = self.block
        if b.norm_first:
            return b.feed_forward(b.norm2(b.self_attn(b.norm1(x))))  # pre-LN without the additions
        return b.norm2(b.feed_forward(b.norm1(b.self_attn(x))))  # post-LN without the additions


def gradient_norms_by_layer(num_layers: int, norm_first: bool, d_model: int = 64, num_heads: int = 4, d_ff: int = 128,
                            B: int = 8, T: int = 16, seed: int = 0, final_norm: bool | None = None) -> list[float]:
    """Gradient norm of each block's parameters at initialisation, for a stack of encoder blocks (notebook 08).

    The loss is the mean squared error between the stack's output and a random target.

    Args:
        num_layers: N, the number of blocks.
        norm_first: Pre-LN (True) or post-LN (False).
        d_model, num_heads, d_ff: Block sizes.
        B, T: Batch size and sequence length of the random input.
        seed: Seed for the weights, input and target.
        final_norm: Apply a LayerNorm to the stack's output before the loss;
            ``None`` (default) means yes for pre-LN stacks, no for post-LN ones,
            whose last block already ends with one.

    Returns:
        N gradient norms, from block 0 (nearest the input) to block N - 1.
    """
    torch.manual_seed(seed)
    blocks = nn.ModuleList(TransformerEncoderBlock(d_model, num_heads, d_ff, norm_first=norm_first)
                           for _ in range(num_layers))
    final = nn.LayerNorm(d_model) if (norm_first if final_norm is None else final_norm) else nn.Identity()
    x, target = torch.randn(B, T, d_model), torch.randn(B, T, d_model)  # (B, T, D) each
    h = x
    for block in blocks:
        h = block(h)  # (B, T, D) -> (B, T, D)
    loss = ((final(h) - target) ** 2).mean()
    names, params = zip(*blocks.named_parameters())  # "0.self_attn.q_proj.weight", ...
    grads = torch.autograd.grad(loss, params)  # one gradient per parameter
    squares = [0.0] * num_layers
    for name, grad in zip(names, grads):
        squares[int(name.split(".")[0])] += float((grad ** 2).sum())  # "11.self_attn..." -> block 11
    return [math.sqrt(s) for s in squares]  # G_l: all of block l's gradients taken as one vector


def gradient_norms_without_residual(num_layers: int, norm_first: bool, d_model: int = 64, num_heads: int = 4,
                                    d_ff: int = 128, B: int = 8, T: int = 16, seed: int = 0) -> list[float]:
    """``gradient_norms_by_layer``'s measurement with the residual additions removed (lab 08).

    The same blocks, input and target as ``gradient_norms_by_layer`` with the same arguments (the same draws
    in the same order), each block wrapped in ``WithoutResidual``; a pre-LN stack keeps its final LayerNorm.

    Returns:
        N gradient norms, from block 0 (nearest the input) to block N - 1.
    """
    torch.manual_seed(seed)
    blocks = nn.ModuleList(WithoutResidual(TransformerEncoderBlock(d_model, num_heads, d_ff, norm_first=norm_first))
                           for _ in range(num_layers))
    final = nn.LayerNorm(d_model) if norm_first else nn.Identity()
    x, target = torch.randn(B, T, d_model), torch.randn(B, T, d_model)  # (B, T, D) each
    h = x
    for block in blocks:
        h = block(h)  # (B, T, D) -> (B, T, D)
    loss = ((final(h) - target) ** 2).mean()
    names, params = zip(*blocks.named_parameters())  # "0.block.self_attn.q_proj.weight", ...
    grads = torch.autograd.grad(loss, params)
    squares = [0.0] * num_layers
    for name, grad in zip(names, grads):
        squares[int(name.split(".")[0])] += float((grad ** 2).sum())
    return [math.sqrt(s) for s in squares]


@dataclass(frozen=True)
class WarmupConfig:
    """A deep stack of encoder blocks learning to reverse sequences of distinct symbols (notebook 08)."""

    num_layers: int = 6  # N: encoder blocks
    d_model: int = 32  # D
    num_heads: int = 4  # H
    d_ff: int = 64  # hidden width of the feed-forward networks
    T: int = 8  # tokens per sequence, all distinct (drawn as in notebook 06)
    V: int = 10  # vocabulary size
    batch_size: int = 16  # B: sequences per step, drawn fresh at every step
    steps: int = 100  # optimizer steps
    lr: float = 1e-2  # peak learning rate
    warmup_steps: int = 50  # linear warm-up from lr / warmup_steps to lr, then constant; 0 = no warm-up
    grad_clip: float = 1.0  # largest global gradient norm, as in the seq2seq training
    optimizer: str = "adam"  # "adam" or "radam" (Liu et al. 2020)
    n_test: int = 512  # fresh test sequences


def reversal_batch(config: WarmupConfig, batch_size: int,
                   generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Sequences of T distinct tokens out of V and their reversals, drawn as notebook 06 draws them.

    Returns:
        x (B, T) int64 and y (B, T) int64 with ``y[:, i] = x[:, T - 1 - i]``.
    """
    x = torch.rand(batch_size, config.V, generator=generator).argsort(dim=-1)[:, : config.T]  # (B, T), distinct
    return x, x.flip(-1)


@dataclass(frozen=True)
class StackRun:
    """What :func:`train_reversal_stack` measured.

    Attributes:
        losses: Training loss at every step.
        accuracy_at: ``{steps taken: fraction of the test tokens predicted right}``, at the
            steps asked for with ``eval_at`` and after the last step.
    """

    losses: tuple[float, ...]
    accuracy_at: dict[int, float]

    @property
    def accuracy(self) -> float:
        """The test accuracy after the last step."""
        return self.accuracy_at[max(self.accuracy_at)]


class ReversalStack(nn.Module):
    """Embeddings scaled by sqrt(D) plus sinusoidal positions, N encoder blocks, a final LayerNorm (pre-LN only),
    and a linear layer that predicts, at every position i, the token at position T - 1 - i (notebook 08)."""

    def __init__(self, config: WarmupConfig, norm_first: bool) -> None:
        super().__init__()
        D = config.d_model
        self.embedding = nn.Embedding(config.V, D)
        nn.init.normal_(self.embedding.weight, std=D**-0.5)  # times sqrt(D) below: entries of size ~1
        self.register_buffer("pe", sinusoidal_positional_encoding(config.T, D))  # (T, D)
        self.blocks = nn.ModuleList(TransformerEncoderBlock(D, config.num_heads, config.d_ff, norm_first=norm_first)
                                    for _ in range(config.num_layers))
        self.final_norm = LayerNorm(D) if norm_first else nn.Identity()
        self.out = nn.Linear(D, config.V)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embedding(tokens) * math.sqrt(self.embedding.embedding_dim) + self.pe  # (B, T, D)
        for block in self.blocks:
            h = block(h)  # (B, T, D)
        return self.out(self.final_norm(h))  # (B, T, D) -> (B, T, V)


def step_sizes(optimizer_class: type[torch.optim.Optimizer], config: WarmupConfig, steps: int = 30, seed: int = 0,
               **options: object) -> tuple[list[float], list[float]]:
    """The first steps of an optimizer on a post-LN :class:`ReversalStack` without warm-up (notebook 08, section 4).

    Args:
        optimizer_class: e.g. ``torch.optim.Adam`` or ``torch.optim.RAdam``.
        config: The task and its settings (learning rate ``config.lr``, clipping ``config.grad_clip``).
        steps: Optimizer steps to take.
        seed: Seed for the weights and the batches.
        **options: Passed on to the optimizer, e.g. ``betas=(0.0, 0.999)``.

    Returns:
        Two lists of ``steps`` floats: the mean absolute change of a parameter entry at each step, in units
        of the learning rate; and the norm of the whole gradient at each step, before clipping.
    """
    torch.manual_seed(seed)
    model = ReversalStack(config, norm_first=False)
    optimizer = optimizer_class(model.parameters(), lr=config.lr, **options)
    batches = torch.Generator().manual_seed(seed)
    sizes, norms = [], []
    for _ in range(steps):
        x, y = reversal_batch(config, config.batch_size, batches)  # (B, T) each
        loss = nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
        optimizer.zero_grad()
        loss.backward()
        norms.append(float(nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)))  # norm before clipping
        before = torch.cat([p.detach().flatten() for p in model.parameters()])  # every entry, one vector
        optimizer.step()
        after = torch.cat([p.detach().flatten() for p in model.parameters()])
        sizes.append(((after - before).abs().mean() / config.lr).item())
    return sizes, norms


def train_reversal_stack(norm_first: bool, config: WarmupConfig = WarmupConfig(), seed: int = 0,
                         eval_at: tuple[int, ...] = ()) -> StackRun:
    """Train a post-LN or pre-LN stack to reverse sequences, with or without a learning-rate warm-up (notebook 08).

    Every step draws a fresh batch, so the test accuracy measures learning, not
    memorising. Measuring at ``eval_at`` does not change the run.

    Returns:
        A :class:`StackRun`.
    """
    torch.manual_seed(seed)
    model = ReversalStack(config, norm_first)
    kind = {"adam": torch.optim.Adam, "radam": torch.optim.RAdam}[config.optimizer]
    optimizer = kind(model.parameters(), lr=config.lr)
    batches = torch.Generator().manual_seed(seed)
    test_x, test_y = reversal_batch(config, config.n_test, torch.Generator().manual_seed(10_000))  # (n_test, T)

    def step_loss(step: int) -> torch.Tensor:
        x, y = reversal_batch(config, config.batch_size, batches)  # (B, T) each, y = x reversed
        return nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())  # (B*T, V) against (B*T,)

    def lr_at(step: int) -> float:
        return config.lr * min(1.0, (step + 1) / config.warmup_steps) if config.warmup_steps > 0 else config.lr

    losses: list[float] = []
    accuracy_at: dict[int, float] = {}
    steps = training_steps(config)
    for stop in sorted({s for s in eval_at if 0 < s < steps} | {steps}):  # one run, measured on the way
        done = len(losses)
        result = fit(model, optimizer, lambda k, done=done: step_loss(done + k), stop - done,
                     f"{'pre' if norm_first else 'post'}-LN stack, warm-up {config.warmup_steps}, "
                     f"{config.optimizer}, seed {seed}, steps {done + 1}-{stop}",
                     lr_at=lambda k, done=done: lr_at(done + k), grad_clip=config.grad_clip, threads=1)
        losses += result.losses
        with torch.no_grad():
            accuracy_at[stop] = (model(test_x).argmax(-1) == test_y).float().mean().item()  # (n_test, T) -> scalar
    return StackRun(losses=tuple(losses), accuracy_at=accuracy_at)
