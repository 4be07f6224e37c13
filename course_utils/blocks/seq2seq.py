"""GRU encoder-decoder models, with and without (Bahdanau) attention.

The two decoders differ in exactly one thing, the *context vector* fed to the
decoder GRU at every step:

* :class:`PlainDecoder` (Cho et al. 2014): the same vector at every step, the
  encoder's final state. The whole source must squeeze through it: the
  context-vector bottleneck.
* :class:`AttentionDecoder` (Bahdanau, Cho & Bengio 2014, arXiv:1409.0473): a
  fresh vector at every step, a weighted average of *all* encoder states,
  with weights given by a score between the previous decoder state and each
  encoder state (the score functions are in :mod:`course_utils.blocks.scorers`).

Dimension letters in shape comments: ``B`` batch, ``S`` source length,
``T`` target length, ``R`` GRU state size (per direction), ``D`` token
embedding size (features per token), ``Dq`` / ``Dk`` / ``Dv`` query, key and
value widths, ``A`` attention size, ``V`` vocabulary size. (The comments of
:class:`AttentionDecoder` write ``embed_size`` for ``D``, as notebook 02 does.) Masks are boolean,
``True`` = a real token that may be attended to.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from course_utils.blocks.scorers import ScoreKind, attend, make_scorer

DecoderKind = Literal["plain", "attention", "transformer"]


@dataclass(frozen=True)
class Seq2SeqConfig:
    """Everything that defines one run of the length experiment.

    The *same* config is used for the plain and the attention model, so both
    get the same sizes, data and training budget; only the decoder differs.
    """

    # --- task / data ---
    task: Literal["reversal", "dates"] = "reversal"  # which toy task to train on
    min_len: int = 3  # reversal: shortest source length (inclusive)
    max_len: int = 20  # reversal: longest training source length (inclusive)
    n_symbols: int = 10  # reversal: alphabet size (plus <pad>, <sos>, <eos>)
    n_train: int = 12_000  # training pairs (reshuffled each epoch; 300 x 64 = 1.6 epochs)
    n_test_per_length: int = 100  # reversal: test pairs per source length; dates: n_test_per_length * 10 pairs
    # --- model ---
    embed_size: int = 32  # D in notebooks 01-02: token embedding size (encoder and decoder)
    hidden_size: int = 64  # R: GRU state size (per direction in the encoder; the decoder's state has R)
    bidirectional: bool = True  # encoder reads the source both ways, states are 2R wide (else R)
    score: ScoreKind = "additive"  # attention score function (attention decoder only)
    attn_size: int = 64  # A: width of the additive / concat scorer's hidden layer
    # --- transformer (decoder="transformer", notebook 07) ---
    d_model: int = 64  # D: width of the transformer
    num_heads: int = 4  # H: attention heads per layer
    num_layers: int = 2  # encoder blocks, and as many decoder blocks
    d_ff: int = 128  # hidden width of the feed-forward networks
    # --- training budget (identical for every decoder) ---
    steps: int = 300  # optimizer steps
    batch_size: int = 64  # B: pairs per step
    lr: float = 5e-3  # peak Adam learning rate
    warmup_steps: int = 50  # linear warm-up from 0 to lr
    lr_decay: Literal["cosine", "constant"] = "cosine"  # after warm-up: cosine decay to min_lr_frac * lr, or constant
    min_lr_frac: float = 0.05  # final learning rate as a fraction of lr (cosine only)
    grad_clip: float = 1.0  # max global gradient norm (0 = no clipping)
    # --- reproducibility ---
    seed: int = 0  # seeds model init (torch.manual_seed), batch order and the training data
    num_threads: int = 1  # torch.set_num_threads during training/eval (results depend on it)
    log_every: int = 100  # progress=True prints the rounded loss every log_every steps


# --------------------------------------------------------------------------
# Encoder
# --------------------------------------------------------------------------


def final_states(states: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """The state after the last real token of each sequence (notebook 01, exercise 1).

    For a left-to-right RNN over right-padded sequences this is the context
    vector ``c`` of a plain encoder-decoder. It is *not* ``states[:, -1]``,
    which is a padding position for every sequence shorter than ``S``.

    Args:
        states: ``(B, S, R)`` float, the RNN state at every position.
        lengths: ``(B,)`` int64, real lengths, each in ``[1, S]``.

    Returns:
        ``(B, R)`` float, ``states[b, lengths[b] - 1]`` for every ``b``.
    """
    rows = torch.arange(states.shape[0], device=states.device)  # (B,)
    return states[rows, lengths - 1]  # (B, S, R) indexed at (B,) x (B,) -> (B, R)


class Encoder(nn.Module):
    """Embedding + (bi)GRU over the source (notebook 01).

    Bidirectional by default, as in Bahdanau et al.: ``h_j`` then summarises the source both before and
    after ``j``, what an attention read at ``j`` should return (notebook 02). Padding is packed away, so
    padded positions never influence the real states, and come back as zeros.

    Args:
        vocab_size: Source vocabulary size ``V``.
        embed_size: Embedding size ``D``.
        hidden_size: GRU state size ``R`` per direction.
        bidirectional: Run a second GRU right-to-left and concatenate.
    """

    def __init__(self, vocab_size: int, embed_size: int, hidden_size: int, bidirectional: bool = True):
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, embed_size, padding_idx=0)
        self.gru = nn.GRU(embed_size, hidden_size, batch_first=True, bidirectional=bidirectional)
        self.out_size = hidden_size * (2 if bidirectional else 1)  # width of h_j and c: 2R, or R one way

    def forward(self, src: torch.Tensor, src_lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Encode a padded batch.

        Args:
            src: Source ids, ``(B, S)``, right-padded with 0.
            src_lengths: Real lengths, ``(B,)``.

        Returns:
            ``states`` ``(B, S, 2R)`` (zeros at padded positions) and the context vector ``c`` ``(B, 2R)``:
            the left-to-right GRU's state at the last real token (read with :func:`final_states`), then the
            right-to-left GRU's state at position 0 (``R`` instead of ``2R`` if one-directional).
        """
        emb = self.embedding(src)  # (B, S) -> (B, S, D)
        packed = pack_padded_sequence(emb, src_lengths.cpu(), batch_first=True, enforce_sorted=False)
        states, _ = pad_packed_sequence(self.gru(packed)[0], batch_first=True, total_length=src.shape[1])  # (B, S, 2R)
        R = self.gru.hidden_size
        left_to_right = final_states(states[..., :R], src_lengths)  # (B, R): at the last real token, L_b - 1
        if not self.gru.bidirectional:
            return states, left_to_right  # c: (B, R)
        right_to_left = states[:, 0, R:]  # (B, R): at position 0, where the right-to-left GRU stops
        return states, torch.cat([left_to_right, right_to_left], dim=-1)  # c: (B, 2R)


# --------------------------------------------------------------------------
# Decoders
# --------------------------------------------------------------------------


class PlainDecoder(nn.Module):
    """GRU decoder that sees the source only through one context vector ``c`` (notebook 01).

    As in Cho et al. (2014): ``c``, the encoder's final state, sets the
    initial state and is fed again at every step ``i = 0, 1, ...``, with
    ``y_{-1} = <sos>``::

        s_{-1} = tanh(W_init c)
        s_i = GRU([emb(y_{i-1}); c], s_{i-1})
        logits_i = W_out [s_i; c; emb(y_{i-1})]

    Args:
        vocab_size: Target vocabulary size ``V``.
        embed_size: ``D``.
        hidden_size: Decoder state size ``R``.
        context_size: Width of ``c``: ``2R`` after a bidirectional encoder, ``R`` after a one-directional one.
    """

    def __init__(self, vocab_size: int, embed_size: int, hidden_size: int, context_size: int):
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, embed_size, padding_idx=0)
        self.init_state = nn.Linear(context_size, hidden_size)  # W_init
        self.gru = nn.GRU(embed_size + context_size, hidden_size, batch_first=True)
        self.out = nn.Linear(hidden_size + context_size + embed_size, vocab_size)  # W_out

    def initial_state(self, context: torch.Tensor) -> torch.Tensor:
        """``s_{-1} = tanh(W_init c)``, ``(B, 2R) -> (B, R)``."""
        return torch.tanh(self.init_state(context))  # (B, 2R) -> (B, R)

    def forward(
        self, tgt_in: torch.Tensor, context: torch.Tensor, state: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Teacher forcing: every step in one GRU call, each fed the true previous token.

        Args:
            tgt_in: Decoder inputs ``<sos> y_0 ... y_{T-2}``, ``(B, T)``.
            context: The context vector ``c``, ``(B, 2R)``.
            state: The state before the first step, ``(B, R)``; default ``s_{-1} = tanh(W_init c)``.

        Returns:
            ``logits`` ``(B, T, V)`` for ``y_0 ... y_{T-1}``, and the last state ``(B, R)``.
        """
        if state is None:
            state = self.initial_state(context)  # s_{-1}: (B, R)
        emb = self.embedding(tgt_in)  # (B, T) -> (B, T, D)
        repeated = context.unsqueeze(1).expand(-1, tgt_in.shape[1], -1)  # (B, 2R) -> (B, T, 2R): c at every step
        states, last = self.gru(torch.cat([emb, repeated], dim=-1), state.unsqueeze(0))  # (B, T, D+2R) -> (B, T, R)
        logits = self.out(torch.cat([states, repeated, emb], dim=-1))  # (B, T, R+2R+D) -> (B, T, V)
        return logits, last.squeeze(0)  # (1, B, R) -> (B, R)

    def step(
        self, y_prev: torch.Tensor, state: torch.Tensor, context: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One decoding step: :meth:`forward` on a target of length 1.

        Args:
            y_prev: Previous tokens ``y_{i-1}``, ``(B,)``.
            state: ``s_{i-1}``, ``(B, R)``.
            context: ``c``, ``(B, 2R)``.

        Returns:
            ``logits`` of ``y_i`` ``(B, V)`` and the new state ``s_i`` ``(B, R)``.
        """
        logits, state = self.forward(y_prev.unsqueeze(1), context, state=state)  # (B,) -> (B, 1)
        return logits.squeeze(1), state  # (B, 1, V) -> (B, V)


@torch.no_grad()
def plain_greedy_decode(encoder: Encoder, decoder: PlainDecoder, src: torch.Tensor, src_lengths: torch.Tensor,
                        max_len: int, sos_id: int = 1, eos_id: int = 2) -> torch.Tensor:
    """Greedy decoding with the plain decoder: feed back its own most likely token (notebook 01).

    What :meth:`Seq2Seq.greedy_decode` runs for a :class:`PlainDecoder`.

    Args:
        encoder: An :class:`Encoder`.
        decoder: A :class:`PlainDecoder`.
        src: ``(B, S)`` source ids.
        src_lengths: ``(B,)``.
        max_len: Maximum number of output tokens (including ``<eos>``).
        sos_id: Id of ``<sos>``, the input of the first step.
        eos_id: Id of ``<eos>``; decoding stops once every row has written it.

    Returns:
        ``tokens`` ``(B, T')`` with ``T' <= max_len``; positions after a row's
        ``<eos>`` hold arbitrary tokens.
    """
    _, context = encoder(src, src_lengths)  # c: (B, 2R)
    state = decoder.initial_state(context)  # s_{-1}: (B, R)
    y = torch.full((src.shape[0],), sos_id, dtype=torch.long, device=src.device)  # (B,): y_{-1} = <sos>
    done = torch.zeros_like(y, dtype=torch.bool)  # (B,): rows that have written <eos>
    tokens = []
    for _ in range(max_len):
        logits, state = decoder.step(y, state, context)  # (B, V), s_i (B, R)
        y = logits.argmax(dim=-1)  # (B, V) -> (B,): its own guess is the next step's input
        tokens.append(y)
        done = done | (y == eos_id)
        if bool(done.all()):
            break
    return torch.stack(tokens, dim=1)  # T' x (B,) -> (B, T')


class AttentionDecoder(nn.Module):
    """GRU decoder with Bahdanau attention over all encoder states.

    Identical to :class:`PlainDecoder` except that the context is recomputed
    at every output step ``i = 0, 1, ...``, queried with the state *before*
    the GRU update (Bahdanau et al. 2014; Luong et al. 2015 query with the
    updated state instead)::

        s_{-1} = tanh(W_init c_final)               # y_{-1} is <sos>
        e_ij = score(s_{i-1}, h_j), j = 0 .. S-1    # scores over source positions
        w_i = masked softmax of e_i over j          # weights (Bahdanau's alpha_ij)
        c_i = sum_j w_ij h_j
        s_i = GRU([emb(y_{i-1}); c_i], s_{i-1})
        logits_i = W_out [s_i; c_i; emb(y_{i-1})]

    Args:
        vocab_size: Target vocabulary size ``V``.
        embed_size: Width of the token embeddings.
        hidden_size: Decoder GRU size ``R``.
        context_size: Width ``Dk`` of the encoder states.
        scorer: A score module (e.g. :class:`AdditiveScore`) with ``precompute(keys)``,
            ``score(query, precomputed)`` and ``attend(query, precomputed, values, mask)``.
    """

    def __init__(self, vocab_size: int, embed_size: int, hidden_size: int, context_size: int, scorer: nn.Module):
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, embed_size, padding_idx=0)
        self.init_state = nn.Linear(context_size, hidden_size)
        self.scorer = scorer
        self.cell = nn.GRUCell(embed_size + context_size, hidden_size)
        self.out = nn.Linear(hidden_size + context_size + embed_size, vocab_size)

    def initial_state(self, enc_final: torch.Tensor) -> torch.Tensor:
        """``s_{-1} = tanh(W_init c_final)``, ``(B, Dk) -> (B, R)``."""
        return torch.tanh(self.init_state(enc_final))  # (B, Dk) -> (B, R)

    def step(
        self,
        y_prev: torch.Tensor,
        state: torch.Tensor,
        enc_states: torch.Tensor,
        projected_keys: torch.Tensor,
        mask: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """One decoding step.

        Args:
            y_prev: Previous tokens ``(B,)``.
            state: ``s_{i-1}``, ``(B, R)``: the query, taken before the update.
            enc_states: Encoder states ``h_j`` (the keys and the values), ``(B, S, Dk)``.
            projected_keys: ``scorer.precompute(enc_states)``, e.g. ``W_k h_j + b`` ``(B, S, A)``.
            mask: ``(B, S)`` bool, True on real source tokens.

        Returns:
            ``state`` ``s_i`` ``(B, R)``, ``context`` ``c_i`` ``(B, Dk)``,
            ``emb`` ``(B, embed_size)`` and ``weights`` ``(B, S)``. (The output
            layer is applied outside, to all steps at once.)
        """
        context, weights = self.scorer.attend(state, projected_keys, enc_states, mask)  # query s_{i-1}: (B, Dk), (B, S)
        emb = self.embedding(y_prev)  # (B,) -> (B, embed_size)
        state = self.cell(torch.cat([emb, context], dim=-1), state)  # (B, embed_size + Dk), (B, R) -> s_i (B, R)
        return state, context, emb, weights

    def forward(
        self, tgt_in: torch.Tensor, enc_states: torch.Tensor, enc_final: torch.Tensor, mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Teacher-forced decoding of a whole target.

        Args:
            tgt_in: Decoder inputs ``<sos> y_0 ... y_{T-2}``, ``(B, T)``.
            enc_states: ``(B, S, Dk)``.
            enc_final: ``(B, Dk)``.
            mask: ``(B, S)`` bool, True on real source tokens.

        Returns:
            ``logits`` ``(B, T, V)`` and attention ``weights`` ``(B, T, S)``.
        """
        state = self.initial_state(enc_final)  # s_{-1} (B, R)
        projected_keys = self.scorer.precompute(enc_states)  # once per sequence, e.g. (B, S, Dk) -> (B, S, A)
        outs, all_weights = [], []
        for i in range(tgt_in.shape[1]):
            state, context, emb, weights = self.step(tgt_in[:, i], state, enc_states, projected_keys, mask)
            outs.append(torch.cat([state, context, emb], dim=-1))  # (B, R + Dk + embed_size)
            all_weights.append(weights)
        logits = self.out(torch.stack(outs, dim=1))  # T x (B, R+Dk+embed_size) -> (B, T, R+Dk+embed_size) -> (B, T, V)
        return logits, torch.stack(all_weights, dim=1)  # T x (B, S) -> (B, T, S)


def luong_step(emb: torch.Tensor, state: torch.Tensor, enc_states: torch.Tensor, projected_keys: torch.Tensor,
               mask: torch.Tensor, cell: nn.GRUCell, score: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
               W_c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One decoder step in the order of Luong et al. (2015, §3, eq. 5), "global attention" (notebook 02, exercise 4).

    The GRU updates first, reading the embedding only (no input feeding, §3.3), and the new state ``s_i``
    is the query. The attentional state ``s~_i`` combines the context with ``s_i`` and feeds an output
    layer. :meth:`AttentionDecoder.step` (Bahdanau et al.) queries with ``s_{i-1}`` instead.

    Args:
        emb, state: ``emb(y_{i-1})`` ``(B, embed_size)`` and ``s_{i-1}`` ``(B, R)``, float.
        enc_states, projected_keys: The values ``h_j`` ``(B, S, Dk)`` and the keys, ``scorer.precompute(...)``.
        mask: ``(B, S)`` bool, True on real source tokens.
        cell, score: ``nn.GRUCell(embed_size, R)``, and ``score(query, projected_keys) -> (B, S)``, e.g. the
            ``score`` method of a module of :mod:`course_utils.blocks.scorers`.
        W_c: ``(R, Dk + R)`` float, the weight of the attentional layer (no bias).

    Returns:
        ``s_i`` ``(B, R)``, ``c_i`` ``(B, Dk)``, ``s~_i = tanh(W_c [c_i; s_i])`` ``(B, R)`` and ``w_i`` ``(B, S)``.
    """
    state = cell(emb, state)  # (B, embed_size), s_{i-1} (B, R) -> s_i (B, R)
    scores = score(state, projected_keys)  # query s_i (B, R), keys (B, S, A) -> (B, S)
    context, weights = attend(scores, enc_states, mask)  # (B, Dk), (B, S)
    both = torch.cat([context, state], dim=-1)  # (B, Dk) ++ (B, R) -> (B, Dk + R)
    attentional = torch.tanh(both @ W_c.T)  # (B, Dk + R) @ (Dk + R, R) -> (B, R)
    return state, context, attentional, weights


# --------------------------------------------------------------------------
# The wrapper
# --------------------------------------------------------------------------


class Seq2Seq(nn.Module):
    """Encoder + (plain or attention) decoder.

    Args:
        encoder: An :class:`Encoder`.
        decoder: A :class:`PlainDecoder` or an :class:`AttentionDecoder`.
        sos_id: Id of ``<sos>`` (first decoder input at inference).
        eos_id: Id of ``<eos>`` (greedy decoding stops once every row emitted it).
    """

    def __init__(self, encoder: Encoder, decoder: PlainDecoder | AttentionDecoder, sos_id: int = 1, eos_id: int = 2):
        super().__init__()
        self.encoder = encoder
        self.decoder = decoder
        self.sos_id = sos_id
        self.eos_id = eos_id

    @property
    def uses_attention(self) -> bool:
        """True if the decoder attends over the encoder states."""
        return isinstance(self.decoder, AttentionDecoder)

    def forward_with_weights(
        self, src: torch.Tensor, src_lengths: torch.Tensor, tgt_in: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Like :meth:`forward`, also returning attention weights ``(B, T, S)`` (``None`` for the plain decoder)."""
        enc_states, enc_final = self.encoder(src, src_lengths)  # (B, S, Dk), (B, Dk)
        if self.uses_attention:
            mask = src != 0  # (B, S): True on real tokens (pad id is 0)
            return self.decoder(tgt_in, enc_states, enc_final, mask)
        logits, _ = self.decoder(tgt_in, enc_final)
        return logits, None

    def forward(self, src: torch.Tensor, src_lengths: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        """Teacher-forced logits.

        Args:
            src: ``(B, S)`` source ids.
            src_lengths: ``(B,)``.
            tgt_in: ``(B, T)`` decoder inputs ``<sos> y_0 ... y_{T-2}``.

        Returns:
            Logits ``(B, T, V)`` for ``y_0 ... y_{T-1}``.
        """
        return self.forward_with_weights(src, src_lengths, tgt_in)[0]

    @torch.no_grad()
    def greedy_decode(
        self, src: torch.Tensor, src_lengths: torch.Tensor, max_len: int
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Greedy decoding: feed back the most likely token at every step.

        Args:
            src: ``(B, S)`` source ids.
            src_lengths: ``(B,)``.
            max_len: Maximum number of output tokens ``T`` (including ``<eos>``).

        Returns:
            ``tokens`` ``(B, T')`` with ``T' <= max_len`` (decoding stops early
            once every row has produced ``<eos>``; positions after a row's
            ``<eos>`` hold arbitrary tokens), and the attention ``weights``
            ``(B, T', S)`` (``None`` for the plain decoder).
        """
        if not self.uses_attention:  # the plain decoder's loop is written out in notebook 01
            return plain_greedy_decode(self.encoder, self.decoder, src, src_lengths, max_len,
                                       self.sos_id, self.eos_id), None
        enc_states, enc_final = self.encoder(src, src_lengths)  # (B, S, Dk), (B, Dk)
        dec = self.decoder
        state = dec.initial_state(enc_final)  # (B, R)
        y = torch.full((src.shape[0],), self.sos_id, dtype=torch.long, device=src.device)  # (B,)
        done = torch.zeros_like(y, dtype=torch.bool)  # (B,)
        tokens, all_weights = [], []
        mask = src != 0  # (B, S)
        projected_keys = dec.scorer.precompute(enc_states)  # once per sequence
        for _ in range(max_len):
            state, context, emb, weights = dec.step(y, state, enc_states, projected_keys, mask)
            logits = dec.out(torch.cat([state, context, emb], dim=-1))  # (B, R+Dk+embed_size) -> (B, V)
            all_weights.append(weights)
            y = logits.argmax(dim=-1)  # (B, V) -> (B,)
            tokens.append(y)
            done = done | (y == self.eos_id)
            if bool(done.all()):
                break
        weights = torch.stack(all_weights, dim=1) if all_weights else None  # T' x (B, S) -> (B, T', S)
        return torch.stack(tokens, dim=1), weights  # T' x (B,) -> (B, T')


def build_seq2seq(
    config: Seq2SeqConfig, src_vocab_size: int, tgt_vocab_size: int, decoder: DecoderKind = "attention"
) -> nn.Module:
    """Build a plain, attention or transformer model from a config (call ``torch.manual_seed`` first).

    Every kind has the interface of :class:`Seq2Seq` (``forward(src, src_lengths, tgt_in)`` and
    ``greedy_decode(src, src_lengths, max_len)``), so training and evaluation are shared.

    Args:
        config: Sizes (``embed_size``, ``hidden_size``, ``bidirectional``,
            ``score``, ``attn_size``; for the transformer ``d_model``,
            ``num_heads``, ``num_layers``, ``d_ff``).
        src_vocab_size: Source vocabulary size.
        tgt_vocab_size: Target vocabulary size.
        decoder: ``"plain"`` (bottleneck), ``"attention"`` (Bahdanau) or
            ``"transformer"`` (notebook 07: a pre-LN encoder-decoder transformer).
    """
    if decoder == "transformer":
        from course_utils.blocks.transformer import TransformerSeq2Seq  # transformer -> multihead -> attention

        return TransformerSeq2Seq(src_vocab_size, tgt_vocab_size, config.d_model, config.num_heads, config.d_ff,
                                  config.num_layers)
    enc = Encoder(src_vocab_size, config.embed_size, config.hidden_size, config.bidirectional)
    if decoder == "plain":
        dec: nn.Module = PlainDecoder(tgt_vocab_size, config.embed_size, config.hidden_size, enc.out_size)
    elif decoder == "attention":
        scorer = make_scorer(config.score, config.hidden_size, enc.out_size, config.attn_size)
        dec = AttentionDecoder(tgt_vocab_size, config.embed_size, config.hidden_size, enc.out_size, scorer)
    else:
        raise ValueError(f"decoder must be 'plain', 'attention' or 'transformer', got {decoder!r}")
    return Seq2Seq(enc, dec)


def sequence_loss(logits: torch.Tensor, tgt_out: torch.Tensor, pad_id: int = 0) -> torch.Tensor:
    """Mean cross-entropy over the real (non-pad) target tokens.

    Args:
        logits: ``(B, T, V)``.
        tgt_out: ``(B, T)`` target ids, ``pad_id`` where there is no token.
    """
    return F.cross_entropy(logits.flatten(0, 1), tgt_out.flatten(), ignore_index=pad_id)  # (B*T, V) vs (B*T,)
