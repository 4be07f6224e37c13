"""Score functions for attention over encoder states, and the context vector (notebook 02).

Bahdanau's additive attention (:func:`additive_attention`, the score, the masked
softmax and the context in one step), Luong's concat, dot and "general"
(bilinear) scores, and :func:`attend`, which turns any scores into weights and a
context. Every score module's ``attend`` method gives the context and the weights.
Shapes: ``B`` batch, ``S`` source length, ``R`` query width (the decoder
state), ``Dk`` key width (the encoder states, which are also the values),
``A`` attention size. The scoring vector is ``v_a`` (Bahdanau's name), not
``v``, which the course keeps for values. Masks are boolean, True = may attend.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import torch
from torch import nn

from course_utils.blocks.attention import masked_softmax  # True = may attend; fully masked rows -> 0, not NaN

ScoreKind = Literal["additive", "concat", "dot", "bilinear"]


def additive_attention(
    query: torch.Tensor, projected_keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor,
    W_q: torch.Tensor, v_a: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Bahdanau's attention for one output step of a batch (notebook 02's exercise, section 2).

    Scores ``e_j = v_a^T tanh(W_q s + W_k h_j + b)``, weights ``w = softmax_j(e_j)`` over
    the real positions, context ``c = sum_j w_j h_j``. The keys are projected by the
    caller (``W_k h_j + b`` once per sequence); the query is projected here, at every step.

    Args:
        query: ``s``, the previous decoder state, ``(B, R)`` float.
        projected_keys: ``W_k h_j + b`` for every source position, ``(B, S, A)`` float.
        values: ``h_j``, the encoder states, ``(B, S, Dk)`` float.
        mask: ``(B, S)`` bool, True on real source tokens.
        W_q: ``(A, R)`` float, stored like the weight of an ``nn.Linear(R, A)``.
        v_a: The scoring vector, ``(A,)`` float.

    Returns:
        ``context`` ``(B, Dk)`` and ``weights`` ``(B, S)``, 0 on padding, each row summing to 1.
    """
    q_proj = query @ W_q.T  # (B, R) @ (R, A) -> (B, A)
    hidden = torch.tanh(q_proj[:, None, :] + projected_keys)  # (B, 1, A) + (B, S, A) -> (B, S, A)
    scores = hidden @ v_a  # (B, S, A) @ (A,) -> (B, S)
    weights = masked_softmax(scores, mask)  # (B, S), exactly 0 on padding
    context = (weights[:, None, :] @ values)[:, 0]  # (B, 1, S) @ (B, S, Dk) -> (B, 1, Dk) -> (B, Dk)
    return context, weights


def bilinear_scores(query: torch.Tensor, keys: torch.Tensor, W: torch.Tensor) -> torch.Tensor:
    """Luong's "general" scores ``e_j = s^T W h_j`` (notebook 02, section 3).

    Args:
        query: ``s``, ``(B, R)`` float.
        keys: ``h_j`` for every source position, ``(B, S, Dk)`` float.
        W: ``(R, Dk)`` float.

    Returns:
        Scores ``(B, S)`` float.
    """
    q_w = query @ W  # (B, R) @ (R, Dk) -> (B, Dk)
    return (keys @ q_w[:, :, None])[:, :, 0]  # (B, S, Dk) @ (B, Dk, 1) -> (B, S, 1) -> (B, S)


class AdditiveScore(nn.Module):
    """Bahdanau's additive score ``v_a^T tanh(W_q q + W_k k_j + b)`` (``b`` is the bias of ``W_k``).

    Bahdanau et al. (2014, App. A.1.2) write ``v_a^T tanh(W_a s_{i-1} + U_a h_j)``,
    without ``b``; here ``W_q = W_a`` and ``W_k = U_a``.

    Args:
        query_size: ``R``.
        key_size: ``Dk``.
        attn_size: ``A``, width of the hidden layer.
        attention: The function that turns the query, the projected keys and the values into
            a context and weights, ``attention(query (B, R), projected_keys (B, S, A), values
            (B, S, Dk), mask (B, S), W_q (A, R), v_a (A,)) -> (context (B, Dk), weights (B, S))``;
            by default :func:`additive_attention`. Notebook 02 passes the learner's own once it
            passes its check; :meth:`attend` calls it.
    """

    def __init__(self, query_size: int, key_size: int, attn_size: int,
                 attention: Callable[..., tuple[torch.Tensor, torch.Tensor]] | None = None):
        super().__init__()
        self.attention = additive_attention if attention is None else attention  # a plain function, not a parameter
        self.W_q = nn.Linear(query_size, attn_size, bias=False)
        self.W_k = nn.Linear(key_size, attn_size, bias=True)
        self.v_a = nn.Parameter(torch.empty(attn_size).uniform_(-(attn_size**-0.5), attn_size**-0.5))  # (A,)

    def precompute(self, keys: torch.Tensor) -> torch.Tensor:
        """``W_k h_j + b`` for all positions; it does not depend on the query, so a decoder computes it once."""
        return self.W_k(keys)  # (B, S, Dk) -> (B, S, A)

    def score(self, query: torch.Tensor, projected_keys: torch.Tensor) -> torch.Tensor:
        """Scores from a query and the output of :meth:`precompute`, ``(B, S)`` (the scores of :meth:`attend`)."""
        hidden = torch.tanh(self.W_q(query)[:, None, :] + projected_keys)  # (B, 1, A) + (B, S, A) -> (B, S, A)
        return hidden @ self.v_a  # (B, S, A) @ (A,) -> (B, S)

    def attend(self, query: torch.Tensor, projected_keys: torch.Tensor, values: torch.Tensor,
               mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Context ``(B, Dk)`` and weights ``(B, S)`` from :attr:`attention`; ``mask`` None = no padding."""
        if mask is None:
            mask = torch.ones(projected_keys.shape[:2], dtype=torch.bool, device=projected_keys.device)  # (B, S)
        return self.attention(query, projected_keys, values, mask, self.W_q.weight, self.v_a)

    def forward(self, query: torch.Tensor, keys: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Unnormalised scores.

        Args:
            query: ``(B, R)``, e.g. the previous decoder state.
            keys: ``(B, S, Dk)``, e.g. the encoder states.
            mask: ``(B, S)`` bool, True = may attend. Unused here (the scores
                of masked positions are removed by :meth:`attend`, with
                :func:`course_utils.blocks.attention.masked_softmax`); accepted so
                that all scorers share one signature.

        Returns:
            Scores ``(B, S)``.
        """
        return self.score(query, self.precompute(keys))


class ConcatScore(nn.Module):
    """The "concat" score ``v_a^T tanh(W [q; k_j] + b)`` (Luong et al. 2015, eq. 8, there without ``b``).

    Writing ``W = [W_q  W_k]`` in two column blocks gives
    ``W [q; k] + b = W_q q + W_k k + b``: this *is* the additive score. The code
    below builds the concatenation literally (broadcasting the query over the
    source positions), so it multiplies every key by ``W_k`` again at every
    decoder step, which :class:`AdditiveScore` does once (notebook 02 counts it).
    """

    def __init__(self, query_size: int, key_size: int, attn_size: int):
        super().__init__()
        self.W = nn.Linear(query_size + key_size, attn_size, bias=True)
        self.v_a = nn.Parameter(torch.empty(attn_size).uniform_(-(attn_size**-0.5), attn_size**-0.5))  # (A,)

    def precompute(self, keys: torch.Tensor) -> torch.Tensor:
        """Nothing to precompute: the keys are returned unchanged."""
        return keys

    def score(self, query: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        """Scores ``(B, S)``."""
        q = query.unsqueeze(1).expand(-1, keys.shape[1], -1)  # (B, R) -> (B, S, R)
        both = torch.cat([q, keys], dim=-1)  # (B, S, R) ++ (B, S, Dk) -> (B, S, R + Dk)
        return torch.tanh(self.W(both)) @ self.v_a  # (B, S, R+Dk) -> (B, S, A) -> (B, S)

    def attend(self, query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
               mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Context ``(B, Dk)`` and weights ``(B, S)``: :func:`attend` of the scores; ``mask`` None = no padding."""
        return attend(self.score(query, keys), values, mask)

    def forward(self, query: torch.Tensor, keys: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Scores ``(B, S)`` for query ``(B, R)`` and keys ``(B, S, Dk)``; see :class:`AdditiveScore`."""
        return self.score(query, keys)


class DotScore(nn.Module):
    """The dot-product score ``q^T k_j`` (no parameters; needs ``R == Dk``)."""

    def precompute(self, keys: torch.Tensor) -> torch.Tensor:
        """Nothing to precompute: the keys are returned unchanged."""
        return keys

    def score(self, query: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        """Scores ``(B, S)``."""
        if query.shape[-1] != keys.shape[-1]:
            raise ValueError(f"DotScore needs equal widths, got query {query.shape[-1]} and keys {keys.shape[-1]}")
        return torch.bmm(keys, query.unsqueeze(-1)).squeeze(-1)  # (B, S, D) @ (B, D, 1) -> (B, S, 1) -> (B, S)

    def attend(self, query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
               mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Context ``(B, Dk)`` and weights ``(B, S)``: :func:`attend` of the scores; ``mask`` None = no padding."""
        return attend(self.score(query, keys), values, mask)

    def forward(self, query: torch.Tensor, keys: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Scores ``(B, S)`` for query ``(B, D)`` and keys ``(B, S, D)``; see :class:`AdditiveScore`."""
        return self.score(query, keys)


class BilinearScore(nn.Module):
    """Luong's "general" score ``q^T W k_j`` (works for ``R != Dk``).

    As written, every step maps the query through ``W``; ``W k_j`` could
    instead be computed once per sequence, like ``W_k h_j + b`` in
    :class:`AdditiveScore` (notebook 02 counts both).
    """

    def __init__(self, query_size: int, key_size: int):
        super().__init__()
        bound = key_size**-0.5
        self.W = nn.Parameter(torch.empty(query_size, key_size).uniform_(-bound, bound))  # (R, Dk)

    def precompute(self, keys: torch.Tensor) -> torch.Tensor:
        """Nothing to precompute: the keys are returned unchanged."""
        return keys

    def score(self, query: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        """Scores ``(B, S)``."""
        return bilinear_scores(query, keys, self.W)

    def attend(self, query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
               mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Context ``(B, Dk)`` and weights ``(B, S)``: :func:`attend` of the scores; ``mask`` None = no padding."""
        return attend(self.score(query, keys), values, mask)

    def forward(self, query: torch.Tensor, keys: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Scores ``(B, S)`` for query ``(B, R)`` and keys ``(B, S, Dk)``; see :class:`AdditiveScore`."""
        return self.score(query, keys)


def make_scorer(kind: ScoreKind, query_size: int, key_size: int, attn_size: int) -> nn.Module:
    """Build one of the four score modules by name."""
    if kind == "additive":
        return AdditiveScore(query_size, key_size, attn_size)
    if kind == "concat":
        return ConcatScore(query_size, key_size, attn_size)
    if kind == "dot":
        return DotScore()
    if kind == "bilinear":
        return BilinearScore(query_size, key_size)
    raise ValueError(f"unknown score {kind!r}")


def attend(
    scores: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Turn scores into attention weights and a context vector.

    Args:
        scores: ``(B, S)`` unnormalised scores.
        values: ``(B, S, Dk)`` vectors to average (here the encoder states ``h_j``).
        mask: ``(B, S)`` bool, True = may attend; ``None`` = attend everywhere.

    Returns:
        ``context`` ``(B, Dk)`` = sum_j weights_j * values_j, and ``weights``
        ``(B, S)``.
    """
    if mask is None:
        mask = torch.ones_like(scores, dtype=torch.bool)
    weights = masked_softmax(scores, mask)  # (B, S); exactly 0 at masked positions
    context = torch.bmm(weights.unsqueeze(1), values).squeeze(1)  # (B, 1, S) @ (B, S, Dk) -> (B, 1, Dk) -> (B, Dk)
    return context, weights


