"""Why attention scores are divided by sqrt(Dk): the measurements of notebook 04.

Vaswani et al. 2017, §3.2.1 and footnote 4: if the components of q and k are
independent with mean 0 and variance 1, then q·k has mean 0 and variance Dk.
Unscaled scores therefore spread out as Dk grows and the softmax saturates
(one weight near 1, the rest near 0). What that does to learning is not simply
that the gradients vanish: the mean gradient reaching the query grows with Dk
up to about Dk = 64 and then levels off (it comes from the queries whose
weight is split between a few wrong keys), but for any loss the part of it
that would raise the right key is proportional to that key's weight, which a
saturated softmax makes exponentially small. Each function here measures one
part of that argument, so a lecturer can re-run it with other settings.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from course_utils.blocks.attention import attention_entropy, scaled_dot_product_attention
from course_utils.experiments.loop import fit, training_steps


def score_variance(Dks: Sequence[int], n_pairs: int = 20_000, seed: int = 0) -> dict[int, float]:
    """Empirical Var(q·k) for q, k with independent N(0, 1) components, for each key width.

    Args:
        Dks: Key widths Dk to measure.
        n_pairs: Number of (q, k) pairs drawn per width.
        seed: Seed of the generator.

    Returns:
        ``{Dk: variance of q·k}``; the theory says ``Dk``.
    """
    g = torch.Generator().manual_seed(seed)
    result = {}
    for Dk in Dks:
        q = torch.randn(n_pairs, Dk, generator=g, dtype=torch.float64)  # (B, Dk): one pair per row, B = n_pairs
        k = torch.randn(n_pairs, Dk, generator=g, dtype=torch.float64)  # (B, Dk)
        dots = (q * k).sum(dim=-1)  # (B, Dk) -> (B,)
        result[Dk] = dots.var().item()
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
class SelfScores:
    """Scores of a token with itself against scores with other tokens (see ``self_attention_diagonal``)."""

    Dk: int  # width of queries and keys
    rho: float  # correlation of W_K with W_Q: 0 = independent, 1 = tied (W_K = W_Q)
    diagonal_mean: float  # mean of q_i · k_i / Dk (unscaled): 0 when q_i, k_i are independent, rho in theory
    off_diagonal_variance: float  # variance of q_i · k_j / Dk for i != j (unscaled): about 1
    self_weight: float  # mean w_ii with the 1/sqrt(Dk) scale: about 1/T when nothing singles out i


def self_attention_diagonal(Dks: Sequence[int], rhos: Sequence[float], D: int = 1024, T: int = 16,
                            num_sentences: int = 200, seed: int = 0) -> list[SelfScores]:
    """Self-attention of random tokens when W_K is correlated with W_Q (tied when rho = 1).

    The tokens x_i have independent N(0, 1) components; W_Q has N(0, 1/D)
    entries, so q_i = x_i W_Q has components of variance 1, and
    ``W_K = rho W_Q + sqrt(1 - rho^2) W'`` with an independent W' like W_Q.
    For i != j, q_i and k_j come from different tokens and the variance
    argument holds. For i = j they come from the same token: the expectation
    of q_i · k_i is rho Dk, so the scaled diagonal score has mean
    rho sqrt(Dk), which grows. Its ratio to the spread of the off-diagonal
    scores is rho sqrt(Dk) whatever the scores are divided by.

    Args:
        Dks: Key widths Dk.
        rhos: Correlations between W_K and W_Q, in [0, 1].
        D: Width of the tokens (keep D >> Dk so that q's components stay nearly independent).
        T: Tokens per sentence (queries = keys).
        num_sentences: Sentences averaged over (B, the batch of sentences).
        seed: Seed of the generator.

    Returns:
        One ``SelfScores`` per (Dk, rho), Dk-major.
    """
    g = torch.Generator().manual_seed(seed)
    eye = torch.eye(T, dtype=torch.bool)  # (T, T): the diagonal i = j
    result = []
    for Dk in Dks:
        x = torch.randn(num_sentences, T, D, generator=g, dtype=torch.float64)  # (B, T, D)
        W_q = torch.randn(D, Dk, generator=g, dtype=torch.float64) / math.sqrt(D)  # (D, Dk)
        W_other = torch.randn(D, Dk, generator=g, dtype=torch.float64) / math.sqrt(D)  # (D, Dk)
        for rho in rhos:
            W_k = rho * W_q + math.sqrt(1.0 - rho**2) * W_other  # (D, Dk)
            q, k = x @ W_q, x @ W_k  # (B, T, D) @ (D, Dk) -> (B, T, Dk)
            scores = q @ k.transpose(-2, -1)  # (B, T, Dk) @ (B, Dk, T) -> (B, T, T), unscaled
            weights = torch.softmax(scores / math.sqrt(Dk), dim=-1)  # (B, T, T), scaled
            result.append(SelfScores(
                Dk=Dk, rho=rho,
                diagonal_mean=(scores[:, eye].mean() / Dk).item(),
                off_diagonal_variance=(scores[:, ~eye].var() / Dk).item(),
                self_weight=weights[:, eye].mean().item(),
            ))
    return result


@dataclass(frozen=True)
class Saturation:
    """Softmax statistics and gradients against Dk, scaled and unscaled (see ``softmax_saturation``).

    Every dict maps "scaled"/"unscaled" to one value per Dk in ``Dks``.
    """

    Dks: list[int]  # the key widths Dk measured
    entropy: dict[str, list[float]]  # mean entropy of a query's weights, nats
    max_weight: dict[str, list[float]]  # mean largest weight of a query
    score_gap: dict[str, list[float]]  # median gap between a query's two largest scores e_j (scale included)
    right_weight: dict[str, list[float]]  # median weight w_{j*} of the right key
    grad_norm: dict[str, list[float]]  # mean norm of dL/de, the gradient with respect to the scores
    grad_query: dict[str, list[float]]  # mean norm of dL/dq, the gradient with respect to the query
    grad_query_median: dict[str, list[float]]  # median norm of dL/dq: the typical query
    split_fraction: dict[str, list[float]]  # fraction of queries whose second-largest weight exceeds 0.01
    split_grad_share: dict[str, list[float]]  # share of the summed ||dL/dq|| that comes from those queries
    S: int  # keys per query; uniform weights have entropy ln(S)


def softmax_saturation(Dks: Sequence[int], S: int = 16, num_queries: int = 256, Dv: int = 16,
                       seed: int = 0) -> Saturation:
    """Entropy, weights and gradients of one attention step, scaled and unscaled, against Dk.

    One query q attends over S keys k_j with values v_j; all components are
    independent N(0, 1). The task: retrieve the value of key j* = 0 (the keys
    are exchangeable, so any fixed j* is a random one). The loss is the
    squared error ``L_sq = 0.5 * ||z - v_{j*}||^2`` with
    ``z = sum_j w_j v_j`` (``out`` in the code) and ``w = softmax(e)``,
    ``e_j = q · k_j / sqrt(Dk)`` (scaled) or ``q · k_j`` (unscaled).
    Gradients by autograd, in float64 so that tiny weights do not round to 0.

    Args:
        Dks: Key widths Dk.
        S: The number of keys each query attends over.
        num_queries: Queries averaged over (B: each query is one example of a batch).
        Dv: Width of the values.
        seed: Seed of the generator.

    Returns:
        A ``Saturation`` with one value per Dk for each statistic and variant.
    """
    g = torch.Generator().manual_seed(seed)
    names = ("entropy", "max", "gap", "right", "grad", "grad_q", "grad_q_median", "split", "split_share")
    stats: dict[str, dict[str, list[float]]] = {s: {"scaled": [], "unscaled": []} for s in names}
    for Dk in Dks:
        q0 = torch.randn(num_queries, 1, Dk, generator=g, dtype=torch.float64)  # (B, 1, Dk): one query per row
        k = torch.randn(num_queries, S, Dk, generator=g, dtype=torch.float64)  # (B, S, Dk)
        v = torch.randn(num_queries, S, Dv, generator=g, dtype=torch.float64)  # (B, S, Dv)
        for variant, scale in (("scaled", 1.0 / math.sqrt(Dk)), ("unscaled", 1.0)):
            q = q0.clone().requires_grad_(True)
            scores = q @ k.transpose(-2, -1) * scale  # (B, 1, Dk) @ (B, Dk, S) -> (B, 1, S)
            scores.retain_grad()
            weights = torch.softmax(scores, dim=-1)  # (B, 1, S)
            out = weights @ v  # (B, 1, S) @ (B, S, Dv) -> (B, 1, Dv)
            loss = 0.5 * ((out[:, 0] - v[:, 0]) ** 2).sum(dim=-1)  # (B,): one squared error per query, j* = 0
            loss.sum().backward()
            w = weights.detach()[:, 0]  # (B, S)
            top_two = scores.detach()[:, 0].topk(2, dim=-1).values  # (B, 2): the two largest scores
            stats["entropy"][variant].append(attention_entropy(w).mean().item())
            stats["max"][variant].append(w.amax(dim=-1).mean().item())
            stats["gap"][variant].append((top_two[:, 0] - top_two[:, 1]).median().item())
            stats["right"][variant].append(w[:, 0].median().item())
            stats["grad"][variant].append(scores.grad[:, 0].norm(dim=-1).mean().item())
            stats["grad_q"][variant].append(q.grad[:, 0].norm(dim=-1).mean().item())
            q_norms = q.grad[:, 0].norm(dim=-1)  # (B,)
            stats["grad_q_median"][variant].append(q_norms.median().item())
            split = w.topk(2, dim=-1).values[:, 1] > 0.01  # (B,): weight shared by at least two keys
            stats["split"][variant].append(split.double().mean().item())
            stats["split_share"][variant].append((q_norms[split].sum() / q_norms.sum()).item())
    return Saturation(Dks=list(Dks), entropy=stats["entropy"], max_weight=stats["max"], score_gap=stats["gap"],
                      right_weight=stats["right"], grad_norm=stats["grad"], grad_query=stats["grad_q"],
                      grad_query_median=stats["grad_q_median"], split_fraction=stats["split"],
                      split_grad_share=stats["split_share"], S=S)


def saturation_width(Dks: list[int], S: int, T: int, generator: torch.Generator,
                     threshold: float = 0.9) -> int | None:
    """The first key width at which an unscaled softmax puts more than ``threshold`` on one key, on average.

    Notebook 04, exercise 2. For each width Dk in ``Dks``, in the order given:
    draw T queries, then S keys (independent N(0, 1) components, float32, from
    ``generator``, in that order); all T queries attend over the same S keys,
    like the tokens of one sequence. Softmax of the unscaled scores q · k_j,
    the largest weight of each query, its mean over the T queries. Stop at the
    first width where that mean is more than ``threshold``; the widths after
    it draw nothing.

    Args:
        Dks: Key widths to try, in order.
        S: Number of keys.
        T: Number of queries.
        generator: Source of every random number.
        threshold: The mean largest weight to exceed, in [0, 1].

    Returns:
        The first width in ``Dks`` whose mean largest weight is more than
        ``threshold``, or None if none is.
    """
    for Dk in Dks:
        q = torch.randn(T, Dk, generator=generator)  # (T, Dk): T queries
        k = torch.randn(S, Dk, generator=generator)  # (S, Dk): the keys every query attends over
        weights = torch.softmax(q @ k.T, dim=-1)  # (T, Dk) @ (Dk, S) -> (T, S), unscaled scores
        if weights.amax(dim=-1).mean() > threshold:  # (T, S) -> (T,) -> the mean largest weight
            return Dk
    return None


def top_two_gap_density(S: int) -> float:
    """Density at 0 of the gap between the largest and the second largest of S independent N(0, 1) numbers.

    The two largest lie within dx of x with the other S - 2 below x:
    ``f_S = S (S - 1) ∫ φ(x)² Φ(x)^(S-2) dx`` (φ, Φ: the standard normal density
    and distribution function), integrated numerically in float64. f_2 = 1/sqrt(π),
    and f_S grows slowly with S: about 1.0 at S = 4, 1.8 at 16, 3.2 at 1024
    (it approaches sqrt(2 ln S) from below, slowly).

    A query whose scores spread like sqrt(Dk) splits its weight between its
    two best keys when their gap is below about 1, which happens with
    probability about f_S / sqrt(Dk). To leading order
    ``1 - E[largest weight] = ln(2) f_S / sqrt(Dk)`` (notebook 04, exercise 2 and its going-further note).

    Args:
        S: Number of keys, at least 2.

    Returns:
        f_S.
    """
    x = torch.linspace(-12.0, 12.0, 200_001, dtype=torch.float64)  # the integrand is negligible beyond |x| = 12
    density = torch.exp(-x**2 / 2) / math.sqrt(2 * math.pi)  # φ(x)
    below = 0.5 * (1 + torch.erf(x / math.sqrt(2)))  # Φ(x)
    return S * (S - 1) * torch.trapezoid(density**2 * below ** (S - 2), x).item()


# ---------------------------------------------------------------------------
# Training with and without the scale: associative recall
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class RecallConfig:
    """Associative recall: find the value stored under the query's key (notebook 04)."""

    Dk: int = 64  # width of queries and keys: the one width a sweep changes
    Dv: int = 64  # width of the values, fixed so that only Dk changes across a sweep
    num_pairs: int = 16  # S: (key, value) pairs per example; the query asks for one of them
    num_keys: int = 64  # key vocabulary; the keys of one example are distinct
    num_values: int = 64  # value vocabulary = number of classes; chance loss ln 64 = 4.16
    D: int = 32  # model width: the width of the token embeddings
    batch_size: int = 64  # examples per training step
    steps: int = 150  # training steps
    lr: float = 3e-3  # Adam learning rate
    test_size: int = 2000  # held-out examples for the accuracy and the attention statistics


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
    ``1 / sqrt(Dk)`` (scaled) or ``1.0`` (unscaled); nothing else differs.
    """

    def __init__(self, config: RecallConfig, scale: float) -> None:
        super().__init__()
        self.key_embedding = torch.nn.Embedding(config.num_keys, config.D)
        self.value_embedding = torch.nn.Embedding(config.num_values, config.D)
        self.q_proj = torch.nn.Linear(config.D, config.Dk)
        self.k_proj = torch.nn.Linear(config.D, config.Dk)
        self.v_proj = torch.nn.Linear(config.D, config.Dv)
        self.out_proj = torch.nn.Linear(config.Dv, config.num_values)
        self.scale = scale

    def project(self, keys: torch.Tensor, values: torch.Tensor, query: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q (B, 1, Dk), k (B, S, Dk), v (B, S, Dv) of a batch."""
        pairs = self.key_embedding(keys) + self.value_embedding(values)  # (B, S, D)
        q = self.q_proj(self.key_embedding(query))[:, None, :]  # (B, D) -> (B, 1, Dk)
        return q, self.k_proj(pairs), self.v_proj(pairs)  # (B, 1, Dk), (B, S, Dk), (B, S, Dv)

    def forward(self, keys: torch.Tensor, values: torch.Tensor, query: torch.Tensor,
                return_weights: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Logits (B, num_values); with ``return_weights`` also the weights (B, 1, S)."""
        q, k, v = self.project(keys, values, query)
        context, weights = scaled_dot_product_attention(q, k, v, scale=self.scale)  # (B, 1, Dv), (B, 1, S)
        logits = self.out_proj(context[:, 0])  # (B, Dv) -> (B, num_values)
        return (logits, weights) if return_weights else logits


class MultiHeadRecallModel(RecallModel):
    """A ``RecallModel`` whose queries, keys and values are split into ``heads`` heads (notebook 04, section 7).

    Head h attends with slice h of the query and keys (width Dh = Dk / H) and
    reads slice h of the values; the heads' outputs are concatenated into the
    classifier, as in multi-head attention (notebook 05). ``scale`` multiplies
    every head's scores.
    """

    def __init__(self, config: RecallConfig, scale: float, heads: int) -> None:
        super().__init__(config, scale)
        self.heads = heads

    def forward(self, keys: torch.Tensor, values: torch.Tensor, query: torch.Tensor,
                return_weights: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Logits (B, num_values); with ``return_weights`` also the weights (B, H, 1, S)."""
        q, k, v = self.project(keys, values, query)  # (B, 1, Dk), (B, S, Dk), (B, S, Dv)
        q, k, v = (t.unflatten(-1, (self.heads, -1)).transpose(1, 2) for t in (q, k, v))  # (B, H, n, width / H)
        context, weights = scaled_dot_product_attention(q, k, v, scale=self.scale)  # (B, H, 1, Dv/H), (B, H, 1, S)
        logits = self.out_proj(context[:, :, 0].flatten(1))  # (B, H, Dv / H) -> (B, Dv) -> (B, num_values)
        return (logits, weights) if return_weights else logits


@dataclass(frozen=True)
class AttentionStats:
    """What one attention step of a ``RecallModel`` does on held-out examples (means over them)."""

    query_norm: float  # mean ||q||
    key_norm: float  # mean ||k_j||
    score_std: float  # std of the scores e_j that enter the softmax (scale included)
    max_weight: float  # mean largest weight of a query
    right_weight: float  # mean weight on the pair the query asks for


def attention_stats(model: RecallModel, batch: tuple[torch.Tensor, ...]) -> AttentionStats:
    """``AttentionStats`` of ``model`` on ``batch`` = (keys, values, query, target); with heads, means over them too."""
    keys, values, query, _ = batch
    H = getattr(model, "heads", 1)  # a MultiHeadRecallModel's number of heads; a RecallModel has one
    with torch.no_grad():
        q, k, _ = model.project(keys, values, query)  # (B, 1, Dk), (B, S, Dk)
        q, k = (t.unflatten(-1, (H, -1)).transpose(1, 2) for t in (q, k))  # (B, H, 1, Dh), (B, H, S, Dh)
        scores = q @ k.transpose(-2, -1) * model.scale  # (B, H, 1, Dh) @ (B, H, Dh, S) -> (B, H, 1, S)
        weights = torch.softmax(scores, dim=-1)[:, :, 0]  # (B, H, S)
        right = weights.transpose(0, 1)[:, keys == query[:, None]]  # (H, B): weight on the asked pair (keys distinct)
    return AttentionStats(query_norm=q.norm(dim=-1).mean().item(), key_norm=k.norm(dim=-1).mean().item(),
                          score_std=scores.std().item(), max_weight=weights.amax(dim=-1).mean().item(),
                          right_weight=right.mean().item())


@dataclass(frozen=True)
class RecallResult:
    """What ``train_recall`` measured."""

    losses: list[float]  # training loss at every step
    accuracy: float  # held-out accuracy after training, in [0, 1]
    initial: AttentionStats  # attention on the held-out examples at initialisation
    final: AttentionStats  # ... after training


def steps_to_learn(losses: Sequence[float], threshold: float = 1.0, window: int = 10) -> int | None:
    """First step after which the mean training loss of the last ``window`` steps is below ``threshold``.

    Returns:
        The number of steps taken (``window`` <= n <= len(losses)), or None if never.
    """
    for n in range(window, len(losses) + 1):
        if sum(losses[n - window:n]) / window < threshold:
            return n
    return None


def train_recall(config: RecallConfig = RecallConfig(), scaled: bool = True, seed: int = 0,
                 scale: float | None = None, start_scale: float | None = None, heads: int = 1) -> RecallResult:
    """Train a ``RecallModel`` with or without the 1/sqrt(Dk) scale.

    With the same seed, all variants start from the same weights and see the
    same batches; only the scale differs.

    Args:
        config: Task and training settings.
        scaled: Multiply the scores by 1/sqrt(Dk) (True) or by 1 (False).
        seed: Seed for the initial weights, the training batches and the test set.
        scale: If given, multiply the scores by this instead (``scaled`` is then ignored).
        start_scale: If given, the query projection starts multiplied by ``start_scale / scale``, so that
            the model starts with exactly the scores of a model whose scale is ``start_scale``; only the
            scale that multiplies every later step differs (the controls of notebook 04, section 6).
        heads: Split the attention into this many heads (a ``MultiHeadRecallModel``, notebook 04, section 7).

    Returns:
        A ``RecallResult``.
    """
    torch.manual_seed(seed)
    if scale is None:
        scale = 1.0 / math.sqrt(config.Dk) if scaled else 1.0
    model = RecallModel(config, scale=scale) if heads == 1 else MultiHeadRecallModel(config, scale, heads)
    if start_scale is not None:
        with torch.no_grad():
            for p in model.q_proj.parameters():  # the same initial scores as a model with scale start_scale
                p.mul_(start_scale / scale)
    test = make_recall_batch(config, config.test_size, torch.Generator().manual_seed(10_000 + seed))
    initial = attention_stats(model, test)
    generator = torch.Generator().manual_seed(seed)

    def step_loss(step: int) -> torch.Tensor:
        keys, values, query, target = make_recall_batch(config, config.batch_size, generator)
        return torch.nn.functional.cross_entropy(model(keys, values, query), target)

    result = fit(model, torch.optim.Adam(model.parameters(), lr=config.lr), step_loss, training_steps(config),
                 f"recall model, Dk = {config.Dk}, scale {scale:.4g}, seed {seed}")
    with torch.no_grad():
        accuracy = (model(*test[:3]).argmax(dim=-1) == test[3]).float().mean().item()
    return RecallResult(losses=list(result.losses), accuracy=accuracy, initial=initial,
                        final=attention_stats(model, test))


def head_scale_runs(config: RecallConfig, H: int, seed: int = 0) -> dict[str, list[float]]:
    """Notebook 04, exercise 3: the recall model with H heads, trained with each head's scores scaled two ways.

    Both runs start from the same weights and see the same batches (``train_recall`` with ``seed``). In
    "head width", every head's scores are multiplied by 1/sqrt(Dh), the width of one head's queries and keys
    (Dh = Dk / H); in "model width", by 1/sqrt(Dk), the width of the whole query before it is split.

    Returns:
        ``{"head width": losses, "model width": losses}``, each run's training losses, one per step (plain
        numbers, which the out-of-kernel check can read back from the grading child).
    """
    Dh = config.Dk // H  # the width of one head's queries and keys
    return {"head width": train_recall(config, seed=seed, scale=1 / math.sqrt(Dh), heads=H).losses,
            "model width": train_recall(config, seed=seed, scale=1 / math.sqrt(config.Dk), heads=H).losses}
