"""Beam search over the plain GRU decoder (notebook 01, exercise 3).

Greedy decoding (:func:`course_utils.blocks.seq2seq.plain_greedy_decode`)
keeps one prefix and commits to its most likely next token. Beam search keeps
the ``k`` most likely prefixes instead, as Sutskever et al. (2014, §3.2,
arXiv:1409.3215) decode: every prefix is extended with every token, the ``k``
best extensions are kept, and a prefix that writes ``<eos>`` leaves the beam
as a finished hypothesis. Here the beam then narrows by one, so that the
search ends once ``k`` hypotheses are finished. Scores are sums of
log-probabilities, without length normalisation.
"""

from __future__ import annotations

import torch
from torch.nn.utils.rnn import pad_sequence

from course_utils.blocks.seq2seq import Seq2Seq


def beam_search(model: Seq2Seq, src: torch.Tensor, src_lengths: torch.Tensor, beam_size: int, max_len: int,
                sos_id: int = 1, eos_id: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    """Beam search with a plain encoder-decoder, one source at a time (notebook 01, exercise 3).

    For each source: the beam starts as the empty prefix (input ``<sos>``, score 0).
    At every step each prefix in the beam is extended with every token ``y`` of the
    vocabulary, scored ``score(prefix) + log p(y | prefix, x)``, and the
    ``beam_size - finished`` best extensions are kept, where ``finished`` counts the
    hypotheses that have written ``<eos>`` so far. Those that end in ``<eos>`` are
    finished; the others form the next beam. The search stops when the beam is empty
    or after ``max_len`` tokens; prefixes still in the beam then count as hypotheses
    with the score they have. The answer is the hypothesis with the highest score.
    With ``beam_size = 1`` this is greedy decoding. Exact ties may be broken either way.

    Args:
        model: A :class:`~course_utils.blocks.seq2seq.Seq2Seq` with a ``PlainDecoder``.
        src: ``(B, S)`` int64 source ids, right-padded with 0.
        src_lengths: ``(B,)`` int64 real lengths.
        beam_size: ``k >= 1``, the number of hypotheses kept (it may exceed the vocabulary).
        max_len: The most tokens a hypothesis may have, ``<eos>`` included.
        sos_id: Id of ``<sos>``, the input of the first step.
        eos_id: Id of ``<eos>``, which finishes a hypothesis.

    Returns:
        ``tokens`` ``(B, T')`` int64: row ``b`` is the best hypothesis for source ``b``
        (its ``<eos>`` included, ``<sos>`` not), padded with 0 to the longest of the
        ``B``; and ``scores`` ``(B,)`` float, its sum of log-probabilities.
    """
    best_tokens, best_scores = [], []
    with torch.no_grad():  # decoding: nothing here is trained
        _, contexts = model.encoder(src, src_lengths)  # c: (B, 2R)
        for context in contexts.split(1):  # one source at a time: (1, 2R)
            state = model.decoder.initial_state(context)  # s_{-1}: (n, R), n = 1 prefix in the beam
            y = torch.full((1,), sos_id, dtype=torch.long, device=src.device)  # (n,): each prefix's last token
            prefixes = torch.zeros(1, 0, dtype=torch.long, device=src.device)  # (n, t): the tokens written so far
            scores = torch.zeros(1, device=src.device)  # (n,): each prefix's sum of log-probabilities
            finished = []  # (score, tokens) of the hypotheses that wrote <eos>
            for _ in range(max_len):
                logits, state = model.decoder.step(y, state, context.expand(len(y), -1))  # (n, V), (n, R)
                candidates = (scores[:, None] + logits.log_softmax(dim=-1)).flatten()  # (n, V) -> (n * V,)
                kept = candidates.argsort(descending=True)[: beam_size - len(finished)]  # (m,): the m best
                parent, y = kept // logits.shape[1], kept % logits.shape[1]  # (m,) each: which prefix, which token
                prefixes = torch.cat([prefixes[parent], y[:, None]], dim=1)  # (m, t + 1)
                scores, state = candidates[kept], state[parent]  # (m,), (m, R)
                ended = y == eos_id  # (m,)
                finished += list(zip(scores[ended], prefixes[ended]))
                y, prefixes, scores, state = y[~ended], prefixes[~ended], scores[~ended], state[~ended]
                if len(y) == 0:
                    break
            finished += list(zip(scores, prefixes))  # cut at max_len: they count with the score they have
            score, tokens = max(finished, key=lambda hypothesis: hypothesis[0].item())
            best_scores.append(score)
            best_tokens.append(tokens)
    return pad_sequence(best_tokens, batch_first=True, padding_value=0), torch.stack(best_scores)  # (B, T'), (B,)
