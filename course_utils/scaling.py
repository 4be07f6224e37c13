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

from course_utils.attention import attention_entropy


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
