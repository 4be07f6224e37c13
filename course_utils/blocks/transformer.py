"""The transformer block, Vaswani et al. 2017, §3.1-3.4 (notebook 07).

Encoder block: self-attention and a position-wise feed-forward network, each
wrapped in a residual connection and a layer normalisation. Decoder block:
causal self-attention, cross-attention to the encoder's output, feed-forward.
Two placements of the normalisation:

* post-LN (the original paper): ``x = norm(x + sublayer(x))``;
* pre-LN (used, for example, by GPT-2; analysed by Xiong et al. 2020): ``x = x + sublayer(norm(x))``.

Masks are boolean, True = may attend. ``nn.TransformerEncoderLayer`` and
``nn.TransformerDecoderLayer`` read boolean masks the other way (True = ignore).
``block_from_torch`` copies such a layer's weights into one of our blocks.
"""

from __future__ import annotations

import math
from collections.abc import Callable
import torch
from torch import nn

from course_utils.core.errors import InputError
from course_utils.blocks.masks import causal_mask, padding_mask
from course_utils.blocks.multihead import MultiHeadAttention, multi_head_attention
from course_utils.blocks.positional import sinusoidal_positional_encoding


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """Normalise each token's features to mean 0 and variance 1, then scale and shift (notebook 07, exercise 1).

    Ba, Kiros, Hinton 2016, arXiv:1607.06450. The variance is the biased one
    (divided by D), as in ``nn.LayerNorm``.

    Args:
        x: (..., D) float.
        weight: (D,) float, the gain gamma.
        bias: (D,) float, the shift beta.
        eps: Added to the variance inside the square root.

    Returns:
        (..., D) float.
    """
    mean = x.mean(dim=-1, keepdim=True)  # (..., D) -> (..., 1)
    variance = ((x - mean) ** 2).mean(dim=-1, keepdim=True)  # (..., 1), divided by D
    return (x - mean) / torch.sqrt(variance + eps) * weight + bias  # (..., D)


class LayerNorm(nn.Module):
    """``layer_norm`` with a learned gain and shift; the same parameters as ``nn.LayerNorm(D)`` (notebook 07)."""

    def __init__(self, d_model: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d_model))  # gamma, (D,)
        self.bias = nn.Parameter(torch.zeros(d_model))  # beta, (D,)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(..., D) -> (..., D)."""
        return layer_norm(x, self.weight, self.bias, self.eps)  # (..., D)


def residual(x: torch.Tensor, sublayer: Callable[[torch.Tensor], torch.Tensor], norm: Callable[[torch.Tensor], torch.Tensor],
             norm_first: bool) -> torch.Tensor:
    """A sublayer wrapped in a residual connection and a normalisation (notebook 07, section 3).

    Args:
        x: (B, T, D) float.
        sublayer: (B, T, D) -> (B, T, D), e.g. self-attention or the feed-forward network.
        norm: (B, T, D) -> (B, T, D), a layer normalisation.
        norm_first: True for pre-LN, ``x + sublayer(norm(x))``; False for post-LN (the
            original paper), ``norm(x + sublayer(x))``.

    Returns:
        (B, T, D) float. The residual connection *adds*; it never concatenates.
    """
    if norm_first:
        return x + sublayer(norm(x))  # pre-LN: the residual path stays un-normalised
    return norm(x + sublayer(x))  # post-LN: normalise after the addition


def is_pre_ln(block: Callable[[torch.Tensor], torch.Tensor], D: int) -> bool:
    """Whether a block, seen only as a function from (B, T, D) to (B, T, D), is pre-LN (notebook 07, exercise 2).

    A post-LN block ends with a LayerNorm, so its output tokens have the same
    size whatever the size of its input. A pre-LN block adds its input to the
    output unchanged, so an input 1000 times larger gives an output about 1000
    times larger.

    Args:
        block: (B, T, D) -> (B, T, D), e.g. ``lambda x: encoder_block(x)``.
        D: Model width.

    Returns:
        True for pre-LN, False for post-LN.
    """
    x = torch.randn(2, 5, D, generator=torch.Generator().manual_seed(0))  # (B, T, D)
    with torch.no_grad():
        small, large = block(x), block(1000 * x)  # (B, T, D) each
    return bool(large.norm() > 10 * small.norm())  # pre-LN: about 1000 times larger; post-LN: about the same


class FeedForward(nn.Module):
    """Position-wise feed-forward network, max(0, x W1 + b1) W2 + b2, Vaswani et al. 2017 eq. (2) (notebook 07).

    The same two-layer network is applied to every position separately.

    Args:
        d_model: D.
        d_ff: Hidden width D_ff (the paper's d_ff, 4D there).
        dropout: Dropout on the hidden activations (training only).
        activation: "relu" (the paper) or "gelu".
    """

    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.0, activation: str = "relu") -> None:
        super().__init__()
        if activation not in ("relu", "gelu"):
            raise InputError(f"activation must be 'relu' or 'gelu', got {activation!r}")
        self.linear1 = nn.Linear(d_model, d_ff)
        self.activation = nn.ReLU() if activation == "relu" else nn.GELU()
        self.dropout = nn.Dropout(dropout)
        self.linear2 = nn.Linear(d_ff, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(..., D) -> (..., D)."""
        hidden = self.activation(self.linear1(x))  # (..., D) -> (..., d_ff)
        return self.linear2(self.dropout(hidden))  # (..., d_ff) -> (..., D)


class TransformerEncoderBlock(nn.Module):
    """Self-attention, then the feed-forward network, each inside ``residual`` (notebook 07).

    Dropout acts on each sublayer's output before it is added to the residual
    stream, and on the feed-forward network's hidden layer. ``nn.TransformerEncoderLayer``
    drops in these places and also on the attention weights, which our
    ``MultiHeadAttention`` does not; so in training mode with dropout > 0 the two
    compute different functions.

    Args:
        d_model: D.
        num_heads: H.
        d_ff: Hidden width of the feed-forward network.
        dropout: Dropout probability (training only; ``model.eval()`` turns it off).
        norm_first: Pre-LN (True) or post-LN (False, the original paper).
        activation: "relu" (the paper) or "gelu".
    """

    def __init__(self, d_model: int, num_heads: int, d_ff: int, dropout: float = 0.0, norm_first: bool = False,
                 activation: str = "relu") -> None:
        super().__init__()
        self.norm_first = norm_first
        self.self_attn = MultiHeadAttention(d_model, num_heads)
        self.feed_forward = FeedForward(d_model, d_ff, dropout, activation)
        self.norm1, self.norm2 = LayerNorm(d_model), LayerNorm(d_model)
        self.dropout1, self.dropout2 = nn.Dropout(dropout), nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """(B, T, D) -> (B, T, D); ``mask`` bool, True = may attend: (B, 1, T) padding or (T, T) causal."""
        x = residual(x, lambda h: self.dropout1(self.self_attn(h, mask=mask)), self.norm1, self.norm_first)
        return residual(x, lambda h: self.dropout2(self.feed_forward(h)), self.norm2, self.norm_first)


class TransformerDecoderBlock(nn.Module):
    """Causal self-attention, cross-attention to the encoder's output, feed-forward (notebook 07).

    The self-attention is *always* causal (query i sees target positions j <= i),
    in training and in generation alike. Arguments as ``TransformerEncoderBlock``.
    """

    def __init__(self, d_model: int, num_heads: int, d_ff: int, dropout: float = 0.0, norm_first: bool = False,
                 activation: str = "relu") -> None:
        super().__init__()
        self.norm_first = norm_first
        self.self_attn = MultiHeadAttention(d_model, num_heads)
        self.cross_attn = MultiHeadAttention(d_model, num_heads)
        self.feed_forward = FeedForward(d_model, d_ff, dropout, activation)
        self.norm1, self.norm2, self.norm3 = LayerNorm(d_model), LayerNorm(d_model), LayerNorm(d_model)
        self.dropout1, self.dropout2, self.dropout3 = nn.Dropout(dropout), nn.Dropout(dropout), nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, memory: torch.Tensor, memory_mask: torch.Tensor | None = None,
                return_weights: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Decode.

        Args:
            x: (B, T, D) target-side inputs.
            memory: (B, S, D) encoder output.
            memory_mask: bool, True = may attend, e.g. (B, 1, S) source padding.
            return_weights: Also return the cross-attention weights (B, H, T, S).

        Returns:
            (B, T, D), and with ``return_weights`` the cross-attention weights.
        """
        causal = causal_mask(x.shape[1]).to(x.device)  # (T, T), True on and below the diagonal
        cross_weights = None

        def cross_attend(h: torch.Tensor) -> torch.Tensor:
            nonlocal cross_weights
            out, cross_weights = self.cross_attn(h, memory, mask=memory_mask, return_weights=True)
            return self.dropout2(out)  # (B, T, D); cross_weights (B, H, T, S)

        x = residual(x, lambda h: self.dropout1(self.self_attn(h, mask=causal)), self.norm1, self.norm_first)
        x = residual(x, cross_attend, self.norm2, self.norm_first)
        x = residual(x, lambda h: self.dropout3(self.feed_forward(h)), self.norm3, self.norm_first)
        return (x, cross_weights) if return_weights else x


def _activation_name(layer: nn.Module) -> str:
    activation = layer.activation
    if activation is nn.functional.relu or isinstance(activation, nn.ReLU):
        return "relu"
    if activation is nn.functional.gelu or isinstance(activation, nn.GELU):
        return "gelu"
    raise InputError("block_from_torch supports activation='relu' or 'gelu' only")


def block_from_torch(layer: nn.Module, block_class: type[nn.Module]) -> nn.Module:
    """A ``block_class`` with the sizes, settings and weights of a PyTorch layer (notebook 07).

    ``nn.TransformerEncoderLayer(..., batch_first=True)`` goes into an encoder
    block class, ``nn.TransformerDecoderLayer(..., batch_first=True)`` into a
    decoder block class (one with ``cross_attn``). For either placement of the
    normalisation, the copy computes the same function in evaluation mode (or
    with dropout 0). In training mode with dropout > 0 it does not: PyTorch's
    layer also drops attention weights, and our blocks do not.

    Args:
        layer: The PyTorch layer.
        block_class: ``TransformerEncoderBlock`` or ``TransformerDecoderBlock`` (or the notebook's copy of one).

    Returns:
        A new ``block_class`` instance.

    Raises:
        InputError: For another module, an activation other than relu/gelu, or an
            encoder layer given a decoder class (or the reverse).
    """
    if not isinstance(layer, (nn.TransformerEncoderLayer, nn.TransformerDecoderLayer)):
        raise InputError("expected an nn.TransformerEncoderLayer or nn.TransformerDecoderLayer, "
                         f"got {type(layer).__name__}")
    attn = layer.self_attn
    ours = block_class(attn.embed_dim, attn.num_heads, layer.linear1.out_features, dropout=layer.dropout.p,
                       norm_first=layer.norm_first, activation=_activation_name(layer))
    is_decoder = isinstance(layer, nn.TransformerDecoderLayer)
    if is_decoder != hasattr(ours, "cross_attn"):
        kind = "a decoder" if is_decoder else "an encoder"
        raise InputError(f"{type(layer).__name__} needs {kind} block class, got {block_class.__name__}")
    ours.self_attn = MultiHeadAttention.from_torch(attn)
    if is_decoder:
        ours.cross_attn = MultiHeadAttention.from_torch(layer.multihead_attn)
    norms = ("norm1", "norm2", "norm3") if is_decoder else ("norm1", "norm2")
    with torch.no_grad():
        for name in ("linear1", "linear2"):
            getattr(ours.feed_forward, name).weight.copy_(getattr(layer, name).weight)
            getattr(ours.feed_forward, name).bias.copy_(getattr(layer, name).bias)
        for name in norms:
            getattr(ours, name).weight.copy_(getattr(layer, name).weight)
            getattr(ours, name).bias.copy_(getattr(layer, name).bias)
            getattr(ours, name).eps = getattr(layer, name).eps
    return ours


def decoder_layer_forward(state: dict[str, torch.Tensor], x: torch.Tensor, memory: torch.Tensor,
                          memory_mask: torch.Tensor | None, num_heads: int, norm_first: bool,
                          activation: str = "relu") -> torch.Tensor:
    """What PyTorch's decoder layer computes, from its saved weights (notebook 07, exercise 3).

    ``state`` is the ``state_dict()`` of an ``nn.TransformerDecoderLayer(D, H, D_ff,
    batch_first=True, norm_first=..., activation=...)``, as a checkpoint holds it.
    The result is what that layer returns for ``layer(x, memory, tgt_mask=~causal_mask(T),
    memory_key_padding_mask=~memory_mask[:, 0])`` in evaluation mode (or with dropout
    0). Each attention keeps its three input projections in one ``in_proj_weight``
    of shape (3D, D): rows 0..D-1 for the queries, D..2D-1 for the keys, 2D..3D-1
    for the values, each stored (out, in) and applied as h W^T + b, like an
    ``nn.Linear``. In a pre-LN layer ``norm2`` normalises the decoder's stream only:
    the memory enters the cross-attention as it is.

    Args:
        state: The layer's weights by name, e.g. ``"self_attn.in_proj_weight"`` (3D, D).
        x: (B, T, D) float, the decoder's input.
        memory: (B, S, D) float, the encoder's output.
        memory_mask: (B, 1, S) bool, True = may attend (the course's convention), or None.
        num_heads: H, the layer's ``nhead``.
        norm_first: The layer's ``norm_first``: pre-LN (True) or post-LN.
        activation: The layer's activation, "relu" or "gelu".

    Returns:
        (B, T, D) float.
    """
    causal = causal_mask(x.shape[1]).to(x.device)  # (T, T), True = may attend
    cross_mask = None if memory_mask is None else memory_mask[:, None]  # (B, 1, S) -> (B, 1, 1, S): every head

    def linear(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
        return lambda h: nn.functional.linear(h, state[f"{name}.weight"], state[f"{name}.bias"])  # h W^T + b

    def norm(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
        return lambda h: layer_norm(h, state[f"{name}.weight"], state[f"{name}.bias"])  # eps 1e-5, as nn.LayerNorm

    def attend(name: str, query: torch.Tensor, source: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        w_q, w_k, w_v = state[f"{name}.in_proj_weight"].chunk(3)  # (3D, D) -> three (D, D): queries, keys, values
        b_q, b_k, b_v = state[f"{name}.in_proj_bias"].chunk(3)  # (3D,) -> three (D,)
        out, _ = multi_head_attention(query, source, source,
                                      lambda h: nn.functional.linear(h, w_q, b_q),  # (..., D) -> (..., D)
                                      lambda h: nn.functional.linear(h, w_k, b_k),
                                      lambda h: nn.functional.linear(h, w_v, b_v),
                                      linear(f"{name}.out_proj"), num_heads, mask)
        return out  # (B, T, D)

    act = {"relu": nn.functional.relu, "gelu": nn.functional.gelu}[activation]  # the layer's activation
    x = residual(x, lambda h: attend("self_attn", h, h, causal), norm("norm1"), norm_first)
    x = residual(x, lambda h: attend("multihead_attn", h, memory, cross_mask), norm("norm2"), norm_first)
    return residual(x, lambda h: linear("linear2")(act(linear("linear1")(h))), norm("norm3"), norm_first)

class TransformerSeq2Seq(nn.Module):
    """A small encoder-decoder transformer with the interface of ``seq2seq.Seq2Seq`` (notebook 07).

    Token embeddings scaled by sqrt(D) plus sinusoidal positions (Vaswani et al.
    2017, §3.4-3.5), ``num_layers`` encoder and decoder blocks, a final LayerNorm
    after each stack (pre-LN only: a post-LN block already ends with one), a
    linear output layer.

    Args:
        src_vocab_size, tgt_vocab_size: Vocabulary sizes (id 0 = padding).
        d_model, num_heads, d_ff, num_layers: Sizes.
        dropout: Dropout on the embeddings plus positions and in every block (training only).
        norm_first: Pre-LN (True) or post-LN.
        max_len: Longest sequence the position table covers.
        sos_id, eos_id: Ids of <sos> and <eos>.
    """

    def __init__(self, src_vocab_size: int, tgt_vocab_size: int, d_model: int = 64, num_heads: int = 4,
                 d_ff: int = 128, num_layers: int = 2, dropout: float = 0.0, norm_first: bool = True,
                 max_len: int = 128, sos_id: int = 1, eos_id: int = 2) -> None:
        super().__init__()
        self.d_model, self.sos_id, self.eos_id = d_model, sos_id, eos_id
        self.src_embedding = nn.Embedding(src_vocab_size, d_model, padding_idx=0)
        self.tgt_embedding = nn.Embedding(tgt_vocab_size, d_model, padding_idx=0)
        for embedding in (self.src_embedding, self.tgt_embedding):
            nn.init.normal_(embedding.weight, std=d_model**-0.5)  # times sqrt(D) in embed(): entries of size ~1
            embedding.weight.data[0] = 0.0  # the padding row
        self.register_buffer("pe", sinusoidal_positional_encoding(max_len, d_model))  # (max_len, D)
        self.dropout = nn.Dropout(dropout)
        self.encoder = nn.ModuleList(TransformerEncoderBlock(d_model, num_heads, d_ff, dropout, norm_first)
                                     for _ in range(num_layers))
        self.decoder = nn.ModuleList(TransformerDecoderBlock(d_model, num_heads, d_ff, dropout, norm_first)
                                     for _ in range(num_layers))
        self.encoder_norm = LayerNorm(d_model) if norm_first else nn.Identity()
        self.decoder_norm = LayerNorm(d_model) if norm_first else nn.Identity()
        self.out = nn.Linear(d_model, tgt_vocab_size)

    def embed(self, embedding: nn.Embedding, tokens: torch.Tensor) -> torch.Tensor:
        """(B, T) ids -> (B, T, D): scaled token embeddings plus positions."""
        T = tokens.shape[1]
        if T > self.pe.shape[0]:
            raise InputError(f"sequence of length {T} is longer than max_len = {self.pe.shape[0]}")
        return self.dropout(embedding(tokens) * math.sqrt(self.d_model) + self.pe[:T])  # (B, T, D)

    def encode(self, src: torch.Tensor, src_lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, S) ids -> memory (B, S, D) and the source padding mask (B, 1, S)."""
        mask = padding_mask(src_lengths, src.shape[1])  # (B, 1, S), True on real tokens
        h = self.embed(self.src_embedding, src)  # (B, S, D)
        for block in self.encoder:
            h = block(h, mask=mask)  # (B, S, D)
        return self.encoder_norm(h), mask

    def decode(self, tgt_in: torch.Tensor, memory: torch.Tensor,
               memory_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits (B, T, V) for every position of ``tgt_in``, and the last block's cross-attention
        weights averaged over heads (B, T, S)."""
        h = self.embed(self.tgt_embedding, tgt_in)  # (B, T, D)
        for block in self.decoder:
            h, weights = block(h, memory, memory_mask=memory_mask, return_weights=True)  # (B, T, D), (B, H, T, S)
        return self.out(self.decoder_norm(h)), weights.mean(dim=1)  # (B, T, V), (B, H, T, S) -> (B, T, S)

    def forward(self, src: torch.Tensor, src_lengths: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        """Teacher-forced logits (B, T, V); ``tgt_in`` is the target shifted right: <sos> y_0 ... y_{T-2}."""
        memory, mask = self.encode(src, src_lengths)
        return self.decode(tgt_in, memory, mask)[0]

    @torch.no_grad()
    def greedy_decode(self, src: torch.Tensor, src_lengths: torch.Tensor,
                      max_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Greedy decoding: append the most likely token, run the decoder again on the longer prefix.

        Returns:
            tokens (B, T') with T' <= max_len, and the last block's cross-attention (B, T', S).
        """
        memory, mask = self.encode(src, src_lengths)  # (B, S, D), (B, 1, S)
        tokens = torch.full((src.shape[0], 1), self.sos_id, dtype=torch.long, device=src.device)  # (B, 1)
        done = torch.zeros(src.shape[0], dtype=torch.bool, device=src.device)  # (B,)
        for _ in range(max_len):
            logits, weights = self.decode(tokens, memory, mask)  # (B, t, V), (B, t, S)
            next_token = logits[:, -1].argmax(dim=-1)  # (B,)
            tokens = torch.cat([tokens, next_token[:, None]], dim=1)  # (B, t + 1)
            done = done | (next_token == self.eos_id)
            if bool(done.all()):
                break
        return tokens[:, 1:], weights
