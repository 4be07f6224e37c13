"""Do heads specialise? A task that needs two different lookups (notebook 05).

Each position is labelled with the pair (left neighbour, right neighbour) of a
circular sequence. Two heads can fetch one neighbour each; one head has to blend
both neighbours into one weighted average (notebook 05 trains both).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
from torch import nn

from course_utils.blocks.multihead import MultiHeadAttention, ablate_head
from course_utils.experiments.loop import fit, training_steps


@dataclass(frozen=True)
class NeighbourConfig:
    """Label each position with the pair (left neighbour, right neighbour) of a circular sequence (notebook 05)."""

    V: int = 8  # vocabulary; the label is a pair of tokens, so V * V classes
    T: int = 12  # sequence length; circular: the left neighbour of position 0 is position T - 1
    d_model: int = 32  # width of the embeddings and of the attention layer
    num_heads: int = 2  # heads: 2 in the main run, 1 in the single-head control
    d_ff: int = 64  # hidden width of the classifier
    batch_size: int = 128  # sequences per step, a fresh batch each
    steps: int = 600  # Adam steps
    lr: float = 3e-3  # learning rate
    test_size: int = 2000  # held-out sequences


def make_neighbour_batch(config: NeighbourConfig, batch_size: int,
                         generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Random circular sequences and their labels.

    Returns:
        x (B, T) int64 tokens; y (B, T) int64 labels ``x[i - 1] * V + x[i + 1]`` (indices mod T).
    """
    x = torch.randint(0, config.V, (batch_size, config.T), generator=generator)  # (B, T)
    left = torch.roll(x, shifts=1, dims=1)  # left[:, i] = x[:, i - 1]
    right = torch.roll(x, shifts=-1, dims=1)  # right[:, i] = x[:, i + 1]
    return x, left * config.V + right


class NeighbourModel(nn.Module):
    """Token + learned position embeddings, one multi-head self-attention layer with a residual, a classifier."""

    def __init__(self, config: NeighbourConfig) -> None:
        super().__init__()
        self.token_embedding = nn.Embedding(config.V, config.d_model)
        self.position_embedding = nn.Embedding(config.T, config.d_model)
        self.attention = MultiHeadAttention(config.d_model, config.num_heads)
        self.classifier = nn.Sequential(nn.LayerNorm(config.d_model), nn.Linear(config.d_model, config.d_ff), nn.ReLU(),
                                        nn.Linear(config.d_ff, config.V * config.V))

    def forward(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, T) tokens -> logits (B, T, V * V) and attention weights (B, H, T, T)."""
        x = self.token_embedding(tokens) + self.position_embedding.weight  # (B, T, D) + (T, D)
        attended, weights = self.attention(x, return_weights=True)  # (B, T, D), (B, H, T, T)
        return self.classifier(x + attended), weights  # (B, T, V * V)


@dataclass
class NeighbourResult:
    """What ``train_neighbour_model`` measured, and the trained model."""

    losses: list[float]  # training loss at every step
    accuracy: float  # held-out per-position accuracy, all heads on
    seconds: float  # wall time of the training loop
    model: NeighbourModel  # the trained model, for ablations and heatmaps


def neighbour_test_set(config: NeighbourConfig, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The held-out sequences for ``seed``.

    They come from their own generator (seeded ``10_000 + seed``), not from the
    training stream. A test sequence can still equal one drawn in training by
    chance, but that is unlikely: with the default config there are
    V ** T = 8 ** 12 (about 7e10) possible sequences, and training draws
    600 * 128 (about 8e4) of them.
    """
    return make_neighbour_batch(config, config.test_size, torch.Generator().manual_seed(10_000 + seed))


def neighbour_accuracy(model: NeighbourModel, config: NeighbourConfig, seed: int = 0,
                       ablated_head: int | None = None) -> float:
    """Held-out accuracy, optionally with one head removed (``ablate_head``)."""
    x, y = neighbour_test_set(config, seed)
    model.eval()
    with torch.no_grad(), (ablate_head(model.attention, ablated_head) if ablated_head is not None
                           else contextlib.nullcontext()):
        logits, _ = model(x)
    return (logits.argmax(dim=-1) == y).float().mean().item()


def train_neighbour_model(config: NeighbourConfig = NeighbourConfig(), seed: int = 0) -> NeighbourResult:
    """Train a ``NeighbourModel`` from seed ``seed``.

    Returns:
        A ``NeighbourResult``.
    """
    torch.manual_seed(seed)
    model = NeighbourModel(config)
    generator = torch.Generator().manual_seed(seed)

    def step_loss(step: int) -> torch.Tensor:
        x, y = make_neighbour_batch(config, config.batch_size, generator)
        logits, _ = model(x)
        return nn.functional.cross_entropy(logits.reshape(-1, config.V * config.V), y.reshape(-1))

    result = fit(model, torch.optim.Adam(model.parameters(), lr=config.lr), step_loss, training_steps(config),
                 f"neighbour model, H = {config.num_heads}, seed {seed}")
    return NeighbourResult(losses=list(result.losses), accuracy=neighbour_accuracy(model, config, seed),
                           seconds=result.seconds, model=model)


def head_offset_profile(model: NeighbourModel, config: NeighbourConfig, seed: int = 0) -> tuple[list[int], torch.Tensor]:
    """Average attention weight of each head by offset (key position - query position, circular).

    Returns:
        (offsets, profile): offsets -T/2 .. T/2 - 1, and profile (H, T) with
        ``profile[h, c]`` the mean weight head h gives to the key at offset ``offsets[c]``.
    """
    x, _ = neighbour_test_set(config, seed)
    model.eval()
    with torch.no_grad():
        _, weights = model(x)  # (N, H, T, T)
    mean = weights.mean(dim=0)  # (H, T, T)
    T = config.T
    offset = (torch.arange(T)[None, :] - torch.arange(T)[:, None]) % T  # (T, T): key j - query i, mod T
    profile = torch.zeros(mean.shape[0], T)
    profile.index_add_(1, offset.flatten(), mean.reshape(mean.shape[0], -1))  # (H, T), summed over queries
    profile = torch.roll(profile / T, shifts=T // 2, dims=1)  # column c <-> offset c - T/2
    return list(range(-(T // 2), T - T // 2)), profile
