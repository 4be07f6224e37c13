"""The seed check behind the model answer of notebook 01's written question.

The question asks what happens when the context vector takes both halves of
the bidirectional states at the last real token (so the right-to-left half has
read one symbol only). Its model answer, for the instructor, states what the
per-output accuracy on sources of length 20 shows for that model against the
right one, retrained on seeds 0 to 2. This test retrains the six models (about
10 s each on the course machine) and checks those statements (the first output
gains, the last falls to about the left-to-right-only level), with margins that
another CPU's float path cannot break.
"""

from __future__ import annotations

import types

import pytest
import torch
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from course_utils.blocks.seq2seq import Seq2SeqConfig, build_seq2seq, final_states
from course_utils.experiments import training
from course_utils.experiments.data import make_batch, make_reversal_pairs, reversal_vocab


def _wrong_forward(self, src, src_lengths):
    """The encoder with c = final_states(states): both halves at the last real token."""
    packed = pack_padded_sequence(self.embedding(src), src_lengths.cpu(), batch_first=True, enforce_sorted=False)
    states, _ = pad_packed_sequence(self.gru(packed)[0], batch_first=True, total_length=src.shape[1])
    return states, final_states(states, src_lengths)


@pytest.mark.evidence("01", "the written question's model answer: with both halves of c taken at the last real token, "
                            "output 0 of a length-20 source is right 95% of the time or more, 10 points or more above "
                            "the right c (65-85%), and output 19 15-35%, about the left-to-right-only control's 27%, "
                            "8 points or more below the right c (33-60%) (seeds 0, 1 and 2; on the course machine "
                            "98-99% against 73-78% and 23-26% against 40-51%, as the answer quotes)")
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_c_at_the_last_real_token_helps_the_first_output_and_hurts_the_last(seed):
    torch.set_num_threads(1)
    train_pairs, test_pairs = training.load_splits("reversal")
    vocab = reversal_vocab(10)
    probe = make_batch(make_reversal_pairs(0, lengths=[20] * 1000, seed=20_000), vocab, vocab)

    def curve(model):
        with torch.no_grad():
            predicted = model(probe.src, probe.src_lengths, probe.tgt_in).argmax(-1)
        return (predicted == probe.tgt_out).float().mean(0)[:20]

    config = Seq2SeqConfig(seed=seed)
    right = curve(training.run_length_experiment(config, decoder="plain", train_pairs=train_pairs,
                                                 test_pairs=test_pairs).model)
    torch.manual_seed(seed)
    model = build_seq2seq(config, len(vocab), len(vocab), "plain")
    model.encoder.forward = types.MethodType(_wrong_forward, model.encoder)
    training.train(model, make_batch(train_pairs, vocab, vocab), config)
    wrong = curve(model)
    # Measured on seeds 0, 1, 2 (and 3): wrong c 0.986, 0.991, 0.983 (0.978) at output 0 and 0.257, 0.235, 0.226
    # (0.261) at output 19; right c 0.750, 0.731, 0.784 (0.753) and 0.428, 0.508, 0.400 (0.548). The same with
    # MKL_CBWR=COMPATIBLE; with ATEN_CPU_CAPABILITY=default a source or two moves (seed 1, output 19: 0.237). The
    # old bounds were this machine's extremes to a thousandth, one source of the 1,000-source probe.
    # "The first output should get better, close to 100%": fails if it does not gain, or stays far from 100%.
    assert wrong[0] >= 0.95 and wrong[0] >= right[0] + 0.1, (wrong[0], right[0])
    # "The last output loses what the backward GRU remembered of x_0, and falls to about the level of the
    # left-to-right-only control" (27% on seed 0): fails if it does not lose, or falls far below or stays far above.
    assert 0.15 <= wrong[19] <= 0.35 and wrong[19] <= right[19] - 0.08, (wrong[19], right[19])
    # the right c's own curve, as section 5 shows it on seed 0 (75% at output 0, 43% at output 19)
    assert 0.65 <= right[0] <= 0.85 and 0.33 <= right[19] <= 0.6, (right[0], right[19])
