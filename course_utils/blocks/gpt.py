"""A small decoder-only language model (GPT) with a KV cache and grouped-query attention (notebooks 10 and 11).

The parts are the course's own: notebook 07's ``LayerNorm``, ``FeedForward``
and ``residual`` (pre-LN), notebook 05's ``split_heads``/``merge_heads`` and
notebook 03's ``scaled_dot_product_attention``. What is new:

* ``grouped_attention``: H query heads share G groups of keys and values
  (Ainslie et al. 2023, arXiv:2305.13245). G = H is multi-head attention,
  G = 1 multi-query attention (Shazeer 2019, arXiv:1911.02150).
* ``attend_with_cache``: the new positions' keys and values are appended to a
  cache of the earlier ones, so decoding computes each key and value once
  (incremental decoding as written out by Shazeer 2019, section 2.4; its memory
  at scale is analysed by Pope et al. 2022, arXiv:2211.05102).
* ``GPT``: token and learned position embeddings, causal pre-LN blocks, a final
  LayerNorm and an output layer tied to the token embedding (Radford et al.
  2019; Press & Wolf 2017, arXiv:1608.05859); dropout 0.1 and the N(0, 0.02)
  initialisation as in GPT-1 (Radford et al. 2018).
* ``next_token_loss``: the cross-entropy of every next token, targets = inputs shifted by one.
* ``filter_logits`` and ``generate``: greedy, temperature, top-k and top-p
  sampling (Holtzman et al. 2020, arXiv:1904.09751); ``generate_with_cache``
  samples the same way with the KV cache (notebook 11).

Masks are boolean, True = may attend, as everywhere in the course.
Shapes: B batch, T new positions (queries), P cached positions, S = P + T keys,
D width, H query heads, G key/value groups, Dh = D // H, V vocabulary.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from course_utils.blocks.attention import scaled_dot_product_attention
from course_utils.blocks.multihead import merge_heads, split_heads
from course_utils.blocks.transformer import FeedForward, LayerNorm, residual
from course_utils.core.errors import InputError

KVCache = tuple[torch.Tensor, torch.Tensor]
"""Keys and values of the positions seen so far, each (B, G, P, Dh)."""


def grouped_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                      mask: torch.Tensor | None = None) -> torch.Tensor:
    """Attention in which H query heads share G groups of keys and values (notebook 11).

    Query head h reads group h // (H / G): heads 0 .. H/G - 1 the first group,
    and so on (the order of ``F.scaled_dot_product_attention(..., enable_gqa=True)``).
    The groups are broadcast, never copied.

    Args:
        q: (B, H, T, Dh) float queries.
        k: (B, G, S, Dh) float keys, G dividing H.
        v: (B, G, S, Dh) float values.
        mask: bool broadcastable to (T, S), True = may attend; None = every key.

    Returns:
        (B, H, T, Dh) float.
    """
    B, H, T, Dh = q.shape
    G = k.shape[1]
    q = q.view(B, G, H // G, T, Dh)  # (B, H, T, Dh) -> (B, G, H/G, T, Dh): heads of one group side by side
    out, _ = scaled_dot_product_attention(q, k[:, :, None], v[:, :, None], mask)  # k, v: (B, G, 1, S, Dh)
    return out.reshape(B, H, T, Dh)  # (B, G, H/G, T, Dh) -> (B, H, T, Dh)


def attend_with_cache(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                      cache: KVCache | None = None) -> tuple[torch.Tensor, KVCache]:
    """One decoding step with a KV cache: append the new keys and values, attend causally (notebook 11, exercise).

    The T new positions come after the P cached ones, so new query i sits at
    position P + i and may attend to keys 0 .. P + i.

    Args:
        q: (B, H, T, Dh) float, queries of the T new positions.
        k: (B, G, T, Dh) float, their keys (G groups, G dividing H).
        v: (B, G, T, Dh) float, their values.
        cache: None (nothing seen yet), or (keys, values) of the P earlier positions, each (B, G, P, Dh).

    Returns:
        (out, cache): out (B, H, T, Dh); the new cache, keys and values of all P + T positions.
    """
    if cache is not None:
        k = torch.cat([cache[0], k], dim=2)  # (B, G, P, Dh) + (B, G, T, Dh) -> (B, G, S, Dh)
        v = torch.cat([cache[1], v], dim=2)  # (B, G, S, Dh)
    T, S = q.shape[2], k.shape[2]
    mask = torch.ones(T, S, dtype=torch.bool, device=q.device).tril(diagonal=S - T)  # (T, S): key j <= P + i
    return grouped_attention(q, k, v, mask), (k, v)


class GroupedQueryAttention(nn.Module):
    """Causal self-attention with H query heads and G key/value groups, and a KV cache (notebook 11).

    G = H is multi-head attention with the parameters of notebook 05's
    ``MultiHeadAttention`` (same names, same shapes); G = 1 is multi-query
    attention. Keys and values are projected to G * Dh features instead of D.

    Args:
        d_model: D.
        num_heads: H; D must be divisible by H.
        num_groups: G; H must be divisible by G. None = H (multi-head attention).
        bias: Whether the projections have a bias.

    Raises:
        InputError: If D is not divisible by H or H not by G.
    """

    def __init__(self, d_model: int, num_heads: int, num_groups: int | None = None, bias: bool = True) -> None:
        super().__init__()
        num_groups = num_heads if num_groups is None else num_groups
        if num_heads < 1 or d_model % num_heads:
            raise InputError(f"d_model = {d_model} is not divisible by num_heads = {num_heads}")
        if num_groups < 1 or num_heads % num_groups:
            raise InputError(f"num_heads = {num_heads} is not divisible by num_groups = {num_groups}: "
                             "every group must serve the same number of query heads")
        self.num_heads, self.num_groups, self.head_dim = num_heads, num_groups, d_model // num_heads
        self.q_proj = nn.Linear(d_model, d_model, bias=bias)  # H heads of queries
        self.k_proj = nn.Linear(d_model, num_groups * self.head_dim, bias=bias)  # G groups of keys
        self.v_proj = nn.Linear(d_model, num_groups * self.head_dim, bias=bias)  # G groups of values
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)

    def forward(self, x: torch.Tensor, cache: KVCache | None = None) -> tuple[torch.Tensor, KVCache]:
        """(B, T, D) -> (B, T, D), and the cache extended by these T positions."""
        q = split_heads(self.q_proj(x), self.num_heads)  # (B, T, D) -> (B, H, T, Dh)
        k = split_heads(self.k_proj(x), self.num_groups)  # (B, T, G*Dh) -> (B, G, T, Dh)
        v = split_heads(self.v_proj(x), self.num_groups)  # (B, T, G*Dh) -> (B, G, T, Dh)
        out, cache = attend_with_cache(q, k, v, cache)  # (B, H, T, Dh)
        return self.out_proj(merge_heads(out)), cache  # (B, H, T, Dh) -> (B, T, D)


class GPTBlock(nn.Module):
    """A causal pre-LN block: x + Attn(LN(x)), then x + FFN(LN(x)) (notebook 10).

    With G = H it is notebook 07's ``TransformerEncoderBlock(norm_first=True)``
    under a causal mask, with the same parameter names. Dropout acts on each
    sublayer's output and inside the feed-forward network.
    """

    def __init__(self, d_model: int, num_heads: int, d_ff: int, num_groups: int | None = None,
                 dropout: float = 0.0) -> None:
        super().__init__()
        self.self_attn = GroupedQueryAttention(d_model, num_heads, num_groups)
        self.feed_forward = FeedForward(d_model, d_ff, dropout, activation="gelu")
        self.norm1, self.norm2 = LayerNorm(d_model), LayerNorm(d_model)
        self.dropout1, self.dropout2 = nn.Dropout(dropout), nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, cache: KVCache | None = None) -> tuple[torch.Tensor, KVCache]:
        """(B, T, D) -> (B, T, D), and this block's cache extended by the T positions."""
        new_cache = None

        def attend(h: torch.Tensor) -> torch.Tensor:
            nonlocal new_cache
            out, new_cache = self.self_attn(h, cache)
            return self.dropout1(out)  # (B, T, D)

        x = residual(x, attend, self.norm1, norm_first=True)
        x = residual(x, lambda h: self.dropout2(self.feed_forward(h)), self.norm2, norm_first=True)
        return x, new_cache


@dataclass(frozen=True)
class GPTConfig:
    """Sizes of a ``GPT``."""

    vocab_size: int  # V, distinct characters
    max_len: int = 64  # the longest context, in tokens (positions 0 .. max_len - 1)
    d_model: int = 128  # D
    num_heads: int = 4  # H
    num_groups: int | None = None  # G key/value groups; None = H (multi-head), 1 = multi-query
    num_layers: int = 3  # blocks
    d_ff: int = 512  # D_ff, hidden width of the feed-forward network, 4D as in GPT-2
    dropout: float = 0.1  # on the embeddings and every sublayer's output (training only)


class GPT(nn.Module):
    """A decoder-only language model, GPT-2's layout (Radford et al. 2019) at a small size (notebook 10).

    Token embedding plus a learned position embedding, dropout, ``num_layers``
    causal pre-LN blocks, a final LayerNorm, and an output layer that reuses the
    token embedding matrix (weight tying, Press & Wolf 2017): logits = LN(x) W_tok^T.
    """

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.token_embedding = nn.Embedding(config.vocab_size, config.d_model)  # W_tok, (V, D)
        self.position_embedding = nn.Embedding(config.max_len, config.d_model)  # W_pos, (max_len, D)
        self.dropout = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(
            GPTBlock(config.d_model, config.num_heads, config.d_ff, config.num_groups, config.dropout)
            for _ in range(config.num_layers))
        self.final_norm = LayerNorm(config.d_model)
        for name, p in self.named_parameters():  # N(0, 0.02) as in GPT-1; the 1/sqrt(2L) scaling is GPT-2's
            if p.dim() == 2:
                std = 0.02 / (2 * config.num_layers) ** 0.5 if name.endswith(("out_proj.weight", "linear2.weight")) else 0.02
                nn.init.normal_(p, std=std)  # the projections into the residual stream get less
            elif name.endswith("bias") and "norm" not in name:
                nn.init.zeros_(p)

    def forward_cached(self, tokens: torch.Tensor,
                       caches: list[KVCache] | None = None) -> tuple[torch.Tensor, list[KVCache]]:
        """Logits for T new tokens that follow the P cached ones.

        Args:
            tokens: (B, T) int64 ids of the new tokens.
            caches: None (start of the text), or one (keys, values) per block from the previous call.

        Returns:
            logits (B, T, V) for the token after each new one, and the caches extended by T positions.

        Raises:
            InputError: If P + T exceeds ``max_len``.
        """
        B, T = tokens.shape
        P = 0 if caches is None else caches[0][0].shape[2]
        if P + T > self.config.max_len:
            raise InputError(f"{P} cached + {T} new tokens exceed the context of max_len = {self.config.max_len}")
        positions = torch.arange(P, P + T, device=tokens.device)  # (T,)
        x = self.dropout(self.token_embedding(tokens) + self.position_embedding(positions))  # (B, T, D)
        new_caches = []
        for i, block in enumerate(self.blocks):
            x, cache = block(x, None if caches is None else caches[i])  # (B, T, D)
            new_caches.append(cache)
        logits = self.final_norm(x) @ self.token_embedding.weight.T  # (B, T, D) @ (D, V) -> (B, T, V)
        return logits, new_caches

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """(B, T) ids -> logits (B, T, V); position i's logits score the token at i + 1."""
        return self.forward_cached(tokens)[0]


def next_token_loss(model: Callable[[torch.Tensor], torch.Tensor], tokens: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of predicting each token from the ones before it (notebook 10, exercise 1).

    The model reads tokens 0 .. T - 1 of each window and its logits at
    position i are scored against token i + 1: the targets are the inputs
    shifted left by one.

    Args:
        model: (B, T) int64 ids -> (B, T, V) float logits, causal.
        tokens: (B, T + 1) int64, windows of text.

    Returns:
        Scalar float, the mean over all B * T predictions, in nats.
    """
    inputs, targets = tokens[:, :-1], tokens[:, 1:]  # (B, T) each: targets are the inputs shifted by one
    logits = model(inputs)  # (B, T, V)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))  # (B*T, V), (B*T,) -> ()


def filter_logits(logits: torch.Tensor, top_k: int | None = None, top_p: float | None = None) -> torch.Tensor:
    """Keep the top-k tokens and/or the nucleus of probability top_p; set the others to -inf (notebook 10, exercise 2).

    Top-k keeps the k largest logits. Top-p (Holtzman et al. 2020,
    arXiv:1904.09751) keeps the smallest set of most likely tokens whose
    probabilities sum to at least p: a token stays if the tokens more likely
    than it sum to less than p, so the most likely token always stays. With
    both, top-k acts first and top-p works on the softmax of what is left.

    Args:
        logits: (..., V) float.
        top_k: Number of tokens to keep, >= 1; None = all.
        top_p: Probability mass to keep, in (0, 1]; None = all.

    Returns:
        (..., V) float: the kept logits unchanged, the others -inf. ``logits`` is not modified.
    """
    if top_k is not None:
        kth = torch.topk(logits, min(top_k, logits.shape[-1]), dim=-1).values[..., -1:]  # (..., 1), k-th largest
        logits = logits.masked_fill(logits < kth, float("-inf"))  # (..., V)
    if top_p is not None:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)  # (..., V) each
        probs = torch.softmax(sorted_logits, dim=-1)  # (..., V), most likely first
        before = probs.cumsum(dim=-1) - probs  # (..., V): mass of the tokens ranked above each one
        drop_sorted = before >= top_p  # (..., V); the first token has before = 0 < p and stays
        drop = drop_sorted.scatter(-1, order, drop_sorted)  # back to the vocabulary's order
        logits = logits.masked_fill(drop, float("-inf"))  # (..., V)
    return logits  # (..., V): the kept logits unchanged, the others -inf


@torch.no_grad()
def generate(model: GPT, prompt: torch.Tensor, num_tokens: int, temperature: float = 1.0, top_k: int | None = None,
             top_p: float | None = None, generator: torch.Generator | None = None) -> torch.Tensor:
    """Sample ``num_tokens`` tokens after ``prompt``, without a cache (notebook 10).

    Each step runs the model on the last ``max_len`` tokens of the text (a
    window that slides once the text is longer than the context), divides the
    last position's logits by the temperature, filters them with
    ``filter_logits`` and draws from the softmax; ``temperature=0`` means
    greedy decoding (the most likely token). ``generate_with_cache`` (notebook
    11) gives the same tokens as long as the text fits in ``max_len``.

    Args:
        model: A ``GPT`` (put in eval mode by the caller).
        prompt: (B, T0) int64 ids, T0 >= 1.
        num_tokens: How many tokens to add.
        temperature: > 0 divides the logits; 0 = greedy.
        top_k, top_p: As in ``filter_logits``.
        generator: For reproducible draws.

    Returns:
        (B, T0 + num_tokens) int64: the prompt and the new tokens.
    """
    tokens = prompt  # (B, T0)
    for _ in range(num_tokens):
        logits = model(tokens[:, -model.config.max_len:])  # the last max_len tokens at most: (B, T, V)
        last = logits[:, -1]  # (B, V): scores of the next token
        if temperature == 0:
            next_token = last.argmax(dim=-1, keepdim=True)  # (B, 1)
        else:
            probs = torch.softmax(filter_logits(last / temperature, top_k, top_p), dim=-1)  # (B, V)
            next_token = torch.multinomial(probs, 1, generator=generator)  # (B, 1)
        tokens = torch.cat([tokens, next_token], dim=1)  # (B, t + 1)
    return tokens


@torch.no_grad()
def generate_with_cache(model: GPT, prompt: torch.Tensor, num_tokens: int, temperature: float = 1.0,
                        top_k: int | None = None, top_p: float | None = None,
                        generator: torch.Generator | None = None,
                        filter_fn: Callable[..., torch.Tensor] | None = None) -> torch.Tensor:
    """``generate`` with a KV cache: only the newest token goes through the model at each step (notebook 11).

    The first step runs the prompt (its last ``max_len`` tokens) and keeps
    every block's keys and values; each later step runs only the token just
    drawn, its keys and values joining the cache. The sampling rule is
    ``generate``'s, and the two give the same tokens as long as the text fits
    in ``max_len``. Beyond that the learned positions end, and the cache
    cannot slide: it starts again from the last ``max_len // 2`` tokens, so
    the two keep different windows.

    Args:
        model: A ``GPT`` (put in eval mode by the caller).
        prompt: (B, T0) int64 ids, T0 >= 1.
        num_tokens: How many tokens to add.
        temperature: > 0 divides the logits; 0 = greedy.
        top_k, top_p: As in ``filter_logits``.
        generator: For reproducible draws.
        filter_fn: The top-k / top-p filter, called as ``filter_fn(logits, top_k, top_p)``; ``None`` means this
            module's ``filter_logits`` (notebook 10 passes the learner's).

    Returns:
        (B, T0 + num_tokens) int64: the prompt and the new tokens.
    """
    max_len = model.config.max_len
    filter_fn = filter_logits if filter_fn is None else filter_fn
    tokens, caches, start = prompt, None, 0  # the cache holds tokens[:, start:-1]
    for _ in range(num_tokens):
        if caches is None or tokens.shape[1] - start > max_len:  # the first step, or the cache is full
            start = max(0, tokens.shape[1] - (max_len if caches is None else max_len // 2))
            logits, caches = model.forward_cached(tokens[:, start:])  # (B, T, V)
        else:
            logits, caches = model.forward_cached(tokens[:, -1:], caches)  # only the newest token: (B, 1, V)
        last = logits[:, -1]  # (B, V): scores of the next token
        if temperature == 0:
            next_token = last.argmax(dim=-1, keepdim=True)  # (B, 1)
        else:
            probs = torch.softmax(filter_fn(last / temperature, top_k, top_p), dim=-1)  # (B, V)
            next_token = torch.multinomial(probs, 1, generator=generator)  # (B, 1)
        tokens = torch.cat([tokens, next_token], dim=1)  # (B, t + 1)
    return tokens


def kv_cache_bytes_per_token(num_layers: int, num_groups: int, head_dim: int, bytes_per_value: int = 4) -> int:
    """Memory the KV cache holds for one token: a key and a value of G * Dh numbers in every layer (notebook 11)."""
    return 2 * num_layers * num_groups * head_dim * bytes_per_value
