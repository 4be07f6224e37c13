"""The seed check the instructor guide lists beside notebook 01's beam search experiment.

Notebook 01 runs seed 0 with beam_size 5 and reports only that run. For a lecturer
who wants to know whether it generalises, this test searches each of the three
models (training seeds 0, 1 and 2) with beams of 3 and of 5 (about 75 s) and
asserts that at least 99% of the wrong outputs are model errors (the model scores
its wrong output above the target), and bounds how far beam search moves exact
match at any source length, with margins that another CPU's float path cannot break.
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
                          "exact match moves by at most 12 points at any source length (-3 to +8 on the course "
                          "machine) and stays at 5% or less from length 15 on, and 99% or more of the wrong outputs "
                          "are model errors (the model scores its wrong output above the target; 99.4% to 100%)")
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
            # "it reverses almost none of the long inputs" (measured: none, on every seed and beam)
            assert max(beam[n] for n in range(15, 21)) <= 0.05, (seed, k)
    # Measured with MKL_CBWR=AVX2 and COMPATIBLE alike: gains from -0.03 to +0.08 and shares from 0.9944 (7 search
    # errors in 1,256 wrong outputs) to 1 (ATEN_CPU_CAPABILITY=default moves a source: seed 1 from -0.01 to 0.00);
    # seed 3, beyond the claim, -0.02 to +0.07 and 0.9928.
    # One source more or less is a point at a length (100 sources each) and 0.0008 of a share, so the notebook's
    # "-3 to +8 points" and "99.4% to 100%" are this machine's extremes, not bounds another CPU must meet.
    # "Beam search moves exact match by a few points at most": fails if it moves any length by more than 12 points.
    assert round(100 * max(abs(g) for g in gains)) <= 12, (min(gains), max(gains))  # in points of 100 sources
    # "The model prefers every wrong output here to its target ... What fails is the model's ranking, not the
    # search": fails if more than 1% of the wrong outputs of any setting are search errors.
    assert min(shares) >= 0.99, shares
