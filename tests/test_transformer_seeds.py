"""The seed checks behind notebooks 07 and 08.

Notebook 07 trains its transformer on seed 0; its text compares the result with
notebook 02's attention RNN (seeds 0 to 2) and quotes seeds 1 and 2. Notebook 08
trains its deep stacks on seeds 0, 1 and 2 for 100 steps; its text says that
post-LN without a warm-up is still at chance after 300 steps on each of them.
These tests re-run those experiments exactly as the notebooks do.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from course_utils.blocks.seq2seq import Seq2SeqConfig
from course_utils.blocks.transformer import TransformerSeq2Seq
from course_utils.experiments import deep_stacks, training
from course_utils.experiments.data import make_batch, reversal_vocab


def _transformer_run(seed: int) -> tuple[float, float, int, float, float]:
    """Train 07's model as section 8 does; return overall and worst exact match, the worst length, and the shares
    of output symbols whose largest cross-attention weight sits on the mirror and one position to its right."""
    config = Seq2SeqConfig()
    train_pairs, test_pairs = training.load_splits("reversal")
    vocab = reversal_vocab(config.n_symbols)
    train_data, test_data = make_batch(train_pairs, vocab, vocab), make_batch(test_pairs, vocab, vocab)
    torch.manual_seed(seed)
    model = TransformerSeq2Seq(len(vocab), len(vocab), config.d_model, config.num_heads, config.d_ff, config.num_layers)
    training.train(model, train_data, dataclasses.replace(config, seed=seed))
    correct = training.exact_match(model, test_data).float()
    accuracy = {n: correct[test_data.src_lengths == n].mean().item() for n in range(config.min_len, config.max_len + 1)}
    worst = min(accuracy, key=accuracy.get)
    with torch.no_grad():
        memory, mask = model.encode(test_data.src, test_data.src_lengths)
        _, cross = model.decode(test_data.tgt_in, memory, mask)
    offsets = []
    for row, S in enumerate(test_data.src_lengths.tolist()):
        offsets += (cross[row, :S].argmax(-1) - torch.arange(S - 1, -1, -1)).tolist()
    offsets = torch.tensor(offsets)
    return (correct.mean().item(), accuracy[worst], worst, (offsets == 0).float().mean().item(),
            (offsets == 1).float().mean().item())


@pytest.mark.slow
@pytest.mark.evidence("07", "the transformer of section 8 on seeds 1 and 2 (seed 0 runs in the notebook): exact match "
                            "0.97 or more overall, below 02's attention RNN (0.99) at its worst length, which is 18 "
                            "or more; the largest cross-attention weight on the mirror for 0.6 to 0.75 of the output "
                            "symbols and one position to its right for 0.2 to 0.3")
@pytest.mark.parametrize("seed", [1, 2])
def test_the_transformer_on_other_seeds(seed):
    overall, worst, length, exact, right = _transformer_run(seed)
    print(seed, overall, worst, length, exact, right)
    assert 0.97 <= overall <= 0.995
    assert 0.7 <= worst < 0.99 and length >= 18
    assert 0.6 <= exact <= 0.75 and 0.2 <= right <= 0.3


@pytest.mark.slow
@pytest.mark.evidence("08", "post-LN without warm-up stays at chance for 300 steps on seeds 0, 1 and 2 (test "
                            "accuracy at most 0.15, last losses above ln 7); RAdam without warm-up reaches 0.95 by "
                            "step 200 on the same seeds (as the notebook also shows)")
def test_post_ln_without_warmup_stays_stuck_for_300_steps():
    config = dataclasses.replace(deep_stacks.WarmupConfig(), warmup_steps=0, steps=300)
    for seed in range(3):
        run = deep_stacks.train_reversal_stack(False, config, seed)
        assert run.accuracy <= 0.15 and sum(run.losses[-10:]) / 10 > 1.95
        radam = deep_stacks.train_reversal_stack(False, dataclasses.replace(config, optimizer="radam", steps=200), seed)
        assert radam.accuracy >= 0.95
