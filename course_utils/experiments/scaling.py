"""Why attention scores are divided by sqrt(Dk): the measurements of notebook 04.

Vaswani et al. 2017, §3.2.1 and footnote 4: if the components of q and k are
independent with mean 0 and variance 1, then q·k has mean 0 and variance Dk.
Unscaled scores therefore spread out as Dk grows, the softmax saturates
(one weight near 1, the rest near 0) and its gradients vanish. Each function
here measures one part of that argument, so a lecturer can re-run it with other
settings.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from course_utils.blocks.attention import attention_entropy, scaled_dot_product_attention
from course_utils.experiments.loop import fit, training_steps


def score_variance(d_ks: Sequence[int], n_pairs: int = 20_000, seed: int = 0) -> dict[int, float]:
    """Empirical Var(q·k) for q, k with independent N(0, 1) components, for each key width.

    Args:
        d_ks: Key widths Dk to measure.
        n_pairs: Number of (q, k) pairs drawn per width.
        seed: Seed of the generator.

    Returns:
        ``{Dk: variance of q·k}``; the theory says ``Dk``.
    """
    g = torch.Generator().manual_seed(seed)
    result = {}
    for d_k in d_ks:
        q = torch.randn(n_pairs, d_k, generator=g, dtype=torch.float64)  # (N, Dk)
        k = torch.randn(n_pairs, d_k, generator=g, dtype=torch.float64)  # (N, Dk)
        dots = (q * k).sum(dim=-1)  # (N, Dk) -> (N,)
        result[d_k] = dots.var().item()
    return result


def fit_slope(x: Sequence[float], y: Sequence[float], log: bool = False) -> float:
    """Least-squares slope of y against x (of log y against log x when ``log``)."""
    xs = torch.tensor(list(x), dtype=torch.float64)
    ys = torch.tensor(list(y), dtype=torch.float64)
    if log:
        xs, ys = xs.log(), ys.log()
    xc = xs - xs.mean()
    return float((xc * (ys - ys.mean())).sum() / (xc * xc).sum())


@dataclass(frozen=True)
class Saturation:
    """Softmax statistics against Dk, averaged over random queries (see ``softmax_saturation``)."""

    d_ks: list[int]  # the key widths measured
    entropy: dict[str, list[float]]  # {"scaled"/"unscaled": mean entropy of a query's weights, nats}
    max_weight: dict[str, list[float]]  # {"scaled"/"unscaled": mean largest weight of a query}
    grad_norm: dict[str, list[float]]  # {"scaled"/"unscaled": mean norm of the gradient w.r.t. the scores}
    num_keys: int  # S, keys per query; uniform weights have entropy ln(S)


def softmax_saturation(d_ks: Sequence[int], num_keys: int = 16, num_queries: int = 256,
                       seed: int = 0) -> Saturation:
    """Entropy, largest weight and gradient norm of the softmax, scaled and unscaled, against Dk.

    q and k have independent N(0, 1) components. The gradient is that of
    ``L = sum_j w_j u_j`` for a random upstream gradient u, with respect to the
    scores, computed by autograd: ``J u`` with ``J = diag(w) - w w^T``.

    Args:
        d_ks: Key widths Dk.
        num_keys: S, the number of keys each query attends over.
        num_queries: Queries averaged over.
        seed: Seed of the generator.

    Returns:
        A ``Saturation`` with one value per Dk for each statistic and variant.
    """
    g = torch.Generator().manual_seed(seed)
    stats: dict[str, dict[str, list[float]]] = {s: {"scaled": [], "unscaled": []} for s in ("entropy", "max", "grad")}
    for d_k in d_ks:
        q = torch.randn(num_queries, 1, d_k, generator=g)  # (N, 1, Dk): one query per row
        k = torch.randn(num_queries, num_keys, d_k, generator=g)  # (N, S, Dk)
        u = torch.randn(num_queries, 1, num_keys, generator=g)  # (N, 1, S): upstream gradient
        for variant, scale in (("scaled", 1.0 / math.sqrt(d_k)), ("unscaled", 1.0)):
            scores = (q @ k.transpose(-2, -1) * scale).requires_grad_(True)  # (N, 1, Dk) @ (N, Dk, S) -> (N, 1, S)
            weights = torch.softmax(scores, dim=-1)  # (N, 1, S)
            (weights * u).sum().backward()
            stats["entropy"][variant].append(attention_entropy(weights.detach()).mean().item())
            stats["max"][variant].append(weights.detach().amax(dim=-1).mean().item())
            stats["grad"][variant].append(scores.grad.norm(dim=-1).mean().item())
    return Saturation(d_ks=list(d_ks), entropy=stats["entropy"], max_weight=stats["max"], grad_norm=stats["grad"],
                      num_keys=num_keys)


# ---------------------------------------------------------------------------
# Training with and without the scale: associative recall
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class RecallConfig:
    """Associative recall: find the value stored under the query's key (notebook 04)."""

    d_k: int = 512  # width of queries, keys and values; large, where the scale matters
    num_pairs: int = 16  # S: (key, value) pairs per example; the query asks for one of them
    num_keys: int = 64  # key vocabulary; the keys of one example are distinct
    num_values: int = 64  # value vocabulary = number of classes
    d_model: int = 32  # width of the token embeddings
    batch_size: int = 64  # examples per training step
    steps: int = 60  # training steps
    lr: float = 3e-3  # Adam learning rate
    test_size: int = 2000  # held-out examples for the accuracy


def make_recall_batch(config: RecallConfig, batch_size: int, generator: torch.Generator
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random recall examples.

    Returns:
        keys (B, S) int64, distinct within a row; values (B, S) int64; query (B,)
        int64, one of the row's keys; target (B,) int64, the value stored under it.
    """
    B, S = batch_size, config.num_pairs
    keys = torch.rand(B, config.num_keys, generator=generator).argsort(dim=1)[:, :S]  # (B, S), distinct per row
    values = torch.randint(0, config.num_values, (B, S), generator=generator)  # (B, S)
    asked = torch.randint(0, S, (B,), generator=generator)  # (B,): which pair the query asks for
    rows = torch.arange(B)
    return keys, values, keys[rows, asked], values[rows, asked]


class RecallModel(torch.nn.Module):
    """One attention step from the query to the stored pairs, then a classifier (PyTorch default init).

    Each stored pair is one token, key embedding + value embedding; the query is
    the key embedding of the asked key. ``scale`` multiplies the scores:
    ``1 / sqrt(d_k)`` (scaled) or ``1.0`` (unscaled); nothing else differs.
    """

    def __init__(self, config: RecallConfig, scale: float) -> None:
        super().__init__()
        self.key_embedding = torch.nn.Embedding(config.num_keys, config.d_model)
        self.value_embedding = torch.nn.Embedding(config.num_values, config.d_model)
        self.q_proj = torch.nn.Linear(config.d_model, config.d_k)
        self.k_proj = torch.nn.Linear(config.d_model, config.d_k)
        self.v_proj = torch.nn.Linear(config.d_model, config.d_k)
        self.out_proj = torch.nn.Linear(config.d_k, config.num_values)
        self.scale = scale

    def forward(self, keys: torch.Tensor, values: torch.Tensor, query: torch.Tensor,
                return_weights: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Logits (B, num_values); with ``return_weights`` also the weights (B, 1, S)."""
        pairs = self.key_embedding(keys) + self.value_embedding(values)  # (B, S, d_model)
        q = self.q_proj(self.key_embedding(query))[:, None, :]  # (B, d_model) -> (B, 1, d_k)
        k, v = self.k_proj(pairs), self.v_proj(pairs)  # (B, S, d_k) each
        context, weights = scaled_dot_product_attention(q, k, v, scale=self.scale)  # (B, 1, d_k), (B, 1, S)
        logits = self.out_proj(context[:, 0])  # (B, d_k) -> (B, num_values)
        return (logits, weights) if return_weights else logits


@dataclass(frozen=True)
class RecallResult:
    """What ``train_recall`` measured."""

    losses: list[float]  # training loss at every step
    accuracy: float  # held-out accuracy after training, in [0, 1]
    initial_max_weight: float  # mean largest attention weight at initialisation (held-out examples)
    initial_score_std: float  # std of the scaled (or unscaled) scores at initialisation


def train_recall(config: RecallConfig = RecallConfig(), scaled: bool = True, seed: int = 0) -> RecallResult:
    """Train a ``RecallModel`` with or without the 1/sqrt(d_k) scale.

    With the same seed, both variants start from the same weights and see the
    same batches; only the scale differs.

    Args:
        config: Task and training settings.
        scaled: Multiply the scores by 1/sqrt(d_k) (True) or by 1 (False).
        seed: Seed for the initial weights, the training batches and the test set.

    Returns:
        A ``RecallResult``.
    """
    torch.manual_seed(seed)
    model = RecallModel(config, scale=1.0 / math.sqrt(config.d_k) if scaled else 1.0)
    test = make_recall_batch(config, config.test_size, torch.Generator().manual_seed(10_000 + seed))
    with torch.no_grad():
        pairs = model.key_embedding(test[0]) + model.value_embedding(test[1])  # (N, S, d_model)
        q = model.q_proj(model.key_embedding(test[2]))[:, None, :]  # (N, 1, d_k)
        scores = q @ model.k_proj(pairs).transpose(-2, -1) * model.scale  # (N, 1, S)
        initial_max_weight = torch.softmax(scores, dim=-1).amax(dim=-1).mean().item()
        initial_score_std = scores.std().item()
    generator = torch.Generator().manual_seed(seed)

    def step_loss(step: int) -> torch.Tensor:
        keys, values, query, target = make_recall_batch(config, config.batch_size, generator)
        return torch.nn.functional.cross_entropy(model(keys, values, query), target)

    result = fit(model, torch.optim.Adam(model.parameters(), lr=config.lr), step_loss, training_steps(config),
                 f"recall model, d_k = {config.d_k}, {'scaled' if scaled else 'unscaled'}, seed {seed}")
    with torch.no_grad():
        accuracy = (model(*test[:3]).argmax(dim=-1) == test[3]).float().mean().item()
    return RecallResult(losses=list(result.losses), accuracy=accuracy, initial_max_weight=initial_max_weight,
                        initial_score_std=initial_score_std)
