"""Beam search (course_utils.blocks.decoding, notebook 01's exercise 3): greedy decoding at k = 1, exact search
with a beam wide enough, scores that are the model's log-probabilities, and sources decoded independently."""

from __future__ import annotations

import itertools

import pytest
import torch

from course_utils.blocks import decoding, seq2seq

EOS = 2


def _model(seed: int, V: int) -> seq2seq.Seq2Seq:
    """A small plain encoder-decoder with peaked predictions that never writes <pad> or <sos>."""
    torch.manual_seed(seed)
    encoder = seq2seq.Encoder(V, 4, 3)
    model = seq2seq.Seq2Seq(encoder, seq2seq.PlainDecoder(V, 4, 3, encoder.out_size))
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(3.0)
        model.decoder.out.bias[:2] = -30.0
    return model.eval()


def _sources(seed: int, B: int, S: int, V: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, S + 1, (B,), generator=g)
    lengths[0] = S
    src = torch.randint(3, V, (B, S), generator=g)
    return src.masked_fill(torch.arange(S)[None, :] >= lengths[:, None], 0), lengths


def _log_probs(model: seq2seq.Seq2Seq, src: torch.Tensor, lengths: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """log p(tokens | source) by teacher forcing, each row summed over its tokens (its 0s are padding)."""
    tgt_in = torch.cat([torch.ones(len(tokens), 1, dtype=torch.long), tokens[:, :-1]], dim=1)  # <sos> y_0 ...
    with torch.no_grad():
        log_p = model(src, lengths, tgt_in).log_softmax(-1).gather(-1, tokens[..., None])[..., 0]  # (N, T)
    return (log_p * (tokens != 0)).sum(1)


@pytest.mark.parametrize("seed", range(4))
def test_a_beam_of_one_is_greedy_decoding(seed):
    model, (src, lengths) = _model(seed, 7), _sources(seed, 6, 5, 7)
    tokens, _ = decoding.beam_search(model, src, lengths, 1, 8)
    greedy = seq2seq.plain_greedy_decode(model.encoder, model.decoder, src, lengths, 8)
    after_eos = ((greedy == EOS).cumsum(1) - (greedy == EOS).long()) > 0  # greedy writes on after a row's <eos>
    assert torch.equal(tokens, greedy.masked_fill(after_eos, 0))


@pytest.mark.parametrize("seed", range(3))
def test_a_beam_that_keeps_every_prefix_finds_the_most_likely_hypothesis(seed):
    """V = 6 and max_len = 4: a beam of 6^4 never drops a prefix, so it must return the best of all hypotheses
    (those that end at their first <eos>, and those cut at max_len), found here by listing every one of them."""
    V, max_len = 6, 4
    model, (src, lengths) = _model(seed, V), _sources(seed, 3, 4, V)
    tokens, scores = decoding.beam_search(model, src, lengths, V ** max_len, max_len)
    others = range(3, V)  # <pad> and <sos> (log-probability about -30) are in the beam but in no best hypothesis
    hypotheses = [list(h) + [EOS] for n in range(max_len) for h in itertools.product(others, repeat=n)]
    hypotheses += [list(h) for h in itertools.product(others, repeat=max_len)]  # cut at max_len
    every = torch.tensor([h + [0] * (max_len - len(h)) for h in hypotheses])  # (N, max_len)
    for b in range(len(src)):
        log_p = _log_probs(model, src[b:b + 1].expand(len(every), -1), lengths[b:b + 1].expand(len(every)), every)
        best = int(log_p.argmax())
        assert log_p.topk(2).values.diff().abs().item() > 1e-4, "no near-tie, so the best is unambiguous"
        assert tokens[b].tolist() + [0] * (max_len - tokens.shape[1]) == every[best].tolist()
        torch.testing.assert_close(scores[b], log_p[best], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(("seed", "k"), [(0, 2), (1, 3), (2, 9)])
def test_each_score_is_the_log_probability_of_its_tokens_and_sources_do_not_interact(seed, k):
    model, (src, lengths) = _model(seed, 6), _sources(seed, 5, 6, 6)
    tokens, scores = decoding.beam_search(model, src, lengths, k, 7)
    assert tokens.dtype == torch.long and tokens.shape[0] == 5 and tokens.shape[1] <= 7 and scores.shape == (5,)
    torch.testing.assert_close(scores, _log_probs(model, src, lengths, tokens), atol=1e-5, rtol=1e-5)
    for b in range(len(src)):
        alone, alone_score = decoding.beam_search(model, src[b:b + 1], lengths[b:b + 1], k, 7)  # a batch of one
        assert tokens[b].tolist() == alone[0].tolist() + [0] * (tokens.shape[1] - alone.shape[1])
        torch.testing.assert_close(scores[b], alone_score[0])


def test_eos_as_the_best_first_token_ends_a_hypothesis_at_once():
    model, (src, lengths) = _model(0, 6), _sources(0, 3, 4, 6)
    with torch.no_grad():
        model.decoder.out.bias[EOS] = 30.0
    for k in (1, 4):
        tokens, scores = decoding.beam_search(model, src, lengths, k, 5)
        assert tokens.tolist() == [[EOS]] * 3 and scores.abs().max() < 1e-4
