"""Why several heads? A task one head cannot solve and two heads can (notebook 05).

Each position of a circular sequence must report two tokens: its left
neighbour and its right neighbour, as two separate answers. The model has one
attention layer and a linear readout, with no MLP after attention, so whatever
it answers is a linear function of what attention returned. One softmax puts
weight w and 1 - w on the two neighbours and returns one average of their
values; two heads can copy one neighbour each (notebook 05 trains both, at the
same width D and so with the same parameters).
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
    """Report the left and the right neighbour of every position of a circular sequence (notebook 05)."""

    V: int = 8  # vocabulary; each answer is one of V tokens
    T: int = 12  # sequence length; circular: the left neighbour of position 0 is position T - 1
    d_model: int = 32  # width D of the embeddings and of the attention layer, whatever the number of heads
    num_heads: int = 2  # heads H, each of width D / H: 2 or 1
    batch_size: int = 128  # sequences per step, a fresh batch each
    steps: int = 250  # Adam steps
    lr: float = 3e-3  # learning rate
    test_size: int = 2000  # held-out sequences


def make_neighbour_batch(config: NeighbourConfig, batch_size: int,
                         generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Random circular sequences and their two answers.

    Returns:
        x (B, T) int64 tokens; y (B, T, 2) int64, ``y[:, i, 0] = x[:, i - 1]`` (the left
        neighbour) and ``y[:, i, 1] = x[:, i + 1]`` (the right one), indices mod T.
    """
    x = torch.randint(0, config.V, (batch_size, config.T), generator=generator)  # (B, T)
    left = torch.roll(x, shifts=1, dims=1)  # left[:, i] = x[:, i - 1]
    right = torch.roll(x, shifts=-1, dims=1)  # right[:, i] = x[:, i + 1]
    return x, torch.stack([left, right], dim=-1)  # (B, T, 2)


class NeighbourModel(nn.Module):
    """Token and position embeddings, one multi-head self-attention layer with a residual, a linear readout."""

    def __init__(self, config: NeighbourConfig) -> None:
        super().__init__()
        self.token_embedding = nn.Embedding(config.V, config.d_model)
        self.position_embedding = nn.Embedding(config.T, config.d_model)
        self.attention = MultiHeadAttention(config.d_model, config.num_heads)
        self.readout = nn.Linear(config.d_model, 2 * config.V)  # no MLP: the answers are linear in x + attended

    def forward(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, T) tokens -> logits (B, T, 2, V) for the left and the right neighbour, weights (B, H, T, T)."""
        x = self.token_embedding(tokens) + self.position_embedding.weight  # (B, T, D) + (T, D)
        attended, weights = self.attention(x, return_weights=True)  # (B, T, D), (B, H, T, T)
        logits = self.readout(x + attended)  # (B, T, D) -> (B, T, 2V)
        return logits.unflatten(-1, (2, -1)), weights  # (B, T, 2, V)


@dataclass
class NeighbourResult:
    """What ``train_neighbour_model`` measured, and the trained model."""

    losses: list[float]  # training loss at every step (mean over both answers)
    accuracy: tuple[float, float]  # held-out accuracy on the left and on the right neighbour, all heads on
    model: NeighbourModel  # the trained model, for ablations and heatmaps


def neighbour_test_set(config: NeighbourConfig, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The held-out sequences for ``seed``, from their own generator (seeded ``10_000 + seed``).

    A test sequence can equal one drawn in training only by chance: there are
    V ** T = 8 ** 12 (about 7e10) possible sequences, and training draws
    250 * 128 (about 3e4) of them.
    """
    return make_neighbour_batch(config, config.test_size, torch.Generator().manual_seed(10_000 + seed))


def neighbour_accuracy(model: NeighbourModel, config: NeighbourConfig, seed: int = 0,
                       ablated_head: int | None = None) -> tuple[float, float]:
    """Held-out accuracy on the left and on the right neighbour, optionally with one head removed (``ablate_head``)."""
    x, y = neighbour_test_set(config, seed)
    model.eval()
    with torch.no_grad(), (ablate_head(model.attention, ablated_head) if ablated_head is not None
                           else contextlib.nullcontext()):
        logits, _ = model(x)  # (N, T, 2, V)
    correct = (logits.argmax(dim=-1) == y).float()  # (N, T, 2)
    return correct[..., 0].mean().item(), correct[..., 1].mean().item()


def train_neighbour_model(config: NeighbourConfig = NeighbourConfig(), seed: int = 0) -> NeighbourResult:
    """Train a ``NeighbourModel`` from seed ``seed``: the same seed gives the same start and the same batches."""
    torch.manual_seed(seed)
    model = NeighbourModel(config)
    generator = torch.Generator().manual_seed(seed)

    def step_loss(step: int) -> torch.Tensor:
        x, y = make_neighbour_batch(config, config.batch_size, generator)  # (B, T), (B, T, 2)
        logits, _ = model(x)  # (B, T, 2, V)
        return nn.functional.cross_entropy(logits.reshape(-1, config.V), y.reshape(-1))  # both answers

    result = fit(model, torch.optim.Adam(model.parameters(), lr=config.lr), step_loss, training_steps(config),
                 f"neighbour model, H = {config.num_heads}, seed {seed}")
    return NeighbourResult(losses=list(result.losses), accuracy=neighbour_accuracy(model, config, seed), model=model)


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
