"""The seed check behind notebook 01's sentence on beam search against greedy decoding.

The paragraph after notebook 01's beam search experiment says that over the notebook's
model and two retrained from other seeds (training seeds 0, 1 and 2), each searched with
beams of 3 and of 5 (beam_size), beam search moved exact match by -3 to +8 points at any
source length, and that 99.4% to 100% of the wrong outputs were model errors (the model
scores its wrong output above the target). The notebook runs seed 0 with beam_size 5; this
test re-runs all six settings (about 75 s) and asserts those numbers.
"""

from __future__ import annotations

import dataclasses

import pytest

import torch

from course_utils.blocks import decoding
from course_utils.blocks.seq2seq import Seq2SeqConfig
from course_utils.experiments import training
from course_utils.experiments.data import make_batch, reversal_vocab


@pytest.mark.evidence("01", "beam search (beam_size 3 and 5) against greedy decoding on training seeds 0, 1 and 2: "
                          "exact match moves little at any source length, and nearly all wrong outputs are model "
                          "errors (the model scores its wrong output above the target)")
def test_beam_search_moves_exact_match_little_and_the_wrong_outputs_are_model_errors():
    train_pairs, test_pairs = training.load_splits("reversal")
    vocab = reversal_vocab(10)
    batch = make_batch(test_pairs, vocab, vocab)
    T = batch.tgt_out.shape[1]
    gains, shares = [], []
    for seed in (0, 1, 2):
        run = training.run_length_experiment(dataclasses.replace(Seq2SeqConfig(), seed=seed), decoder="plain",
                                             train_pairs=train_pairs, test_pairs=test_pairs)
        with torch.no_grad():
            log_probs = run.model(batch.src, batch.src_lengths, batch.tgt_in).log_softmax(-1)
        per_token = log_probs.gather(-1, batch.tgt_out[..., None]).squeeze(-1)
        target_scores = per_token.masked_fill(batch.tgt_out == 0, 0.0).sum(1)  # log p(target | x)
        for k in (3, 5):
            tokens, scores = decoding.beam_search(run.model, batch.src, batch.src_lengths, k, T)
            tokens = torch.nn.functional.pad(tokens, (0, T - tokens.shape[1]))
            right = training.sequence_exact_match(tokens, batch.tgt_out)
            beam = {n: right[batch.src_lengths == n].float().mean().item() for n in run.accuracy}
            gains += [beam[n] - run.accuracy[n] for n in run.accuracy]
            wrong = ~right
            shares.append(float((wrong & (scores > target_scores)).sum() / wrong.sum()))
            assert max(beam[n] for n in range(15, 21)) <= 0.05, (seed, k)
    # "exact match moved by -3 to +8 points at any length"
    assert round(100 * min(gains)) >= -3 and round(100 * max(gains)) <= 8, (min(gains), max(gains))
    # "99.4% to 100% of the wrong outputs were model errors"
    assert min(shares) >= 0.994, shares
