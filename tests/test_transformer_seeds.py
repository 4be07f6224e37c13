"""The seed checks behind notebooks 07 and 08.

Notebook 07 measures the tokens' growth through a pre-LN stack on seed 0 and trains its transformer on seed 0; its text compares the result with
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
    worst = max(n for n in accuracy if accuracy[n] == min(accuracy.values()))  # of tied lengths, the longest
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
                            "0.95 or more overall, below 02's attention RNN (0.99) at its worst length, which is 18 "
                            "or more; the largest cross-attention weight on the mirror or one position to its right "
                            "for 0.8 or more of the output symbols: on the mirror for 0.55 to 0.8 of them (about two "
                            "thirds), one to its right for 0.12 to 0.38 (about a quarter)")
@pytest.mark.parametrize("seed", [1, 2])
def test_the_transformer_on_other_seeds(seed):
    overall, worst, length, exact, right = _transformer_run(seed)
    print(seed, overall, worst, length, exact, right)
    # Measured on seeds 1 and 2, MKL_CBWR=AVX2 / COMPATIBLE: overall 0.973 / 0.976 and 0.989 / 0.985; worst length 20
    # at 0.76 / 0.78 and 0.89 / 0.85; on the mirror 0.718 / 0.734 and 0.628 / 0.637; one to its right 0.201 / 0.196
    # (the old bound was 0.2) and 0.266 / 0.241. Seed 1 with ATEN_CPU_CAPABILITY=default: 0.973, 0.84 at 20, 0.708,
    # 0.217. Seed 3: 0.991, 0.95 at 20, 0.650, 0.249. The float path moves a share by up to 0.025, the worst by 0.08.
    # "Reverses nearly every test source": fails if the transformer has not learned the task.
    assert overall >= 0.95
    # "at its worst length, one of the longest, it stays below notebook 02's attention RNN": fails if it matches the
    # RNN's 0.99 at every length, or if its worst length is a short one.
    assert 0.6 <= worst < 0.99 and length >= 18
    # "finds the mirror, though not always exactly": fails if the peak is elsewhere, always exactly on the mirror,
    # or seldom on it.
    assert exact + right >= 0.8
    assert 0.55 <= exact <= 0.8 and 0.12 <= right <= 0.38


def _growth(seed: int) -> list[float]:
    """Section 1 of notebook 07: the per-token standard deviation, mean over the tokens, after 0, 6, 12, 24 and 48
    random pre-LN blocks of PyTorch's, without a LayerNorm after the last."""
    torch.manual_seed(seed)
    x = torch.randn(8, 10, 64)
    stack = [torch.nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True, norm_first=True).eval()
             for _ in range(48)]
    stds, h = [x.std(-1, unbiased=False).mean().item()], x
    with torch.no_grad():
        for n, block in enumerate(stack, start=1):
            h = block(h)
            if n in (6, 12, 24, 48):
                stds.append(h.std(-1, unbiased=False).mean().item())
    return stds


@pytest.mark.evidence("07", "the tokens' standard deviation through 48 random pre-LN blocks (section 1) grows at every "
                            "depth shown and more than doubles, on seeds 1 and 2 as on seed 0")
@pytest.mark.parametrize("seed", [1, 2])
def test_the_tokens_grow_through_a_pre_ln_stack(seed):
    stds = _growth(seed)
    # Measured: seed 0 (the notebook) 0.98, 1.22, 1.47, 1.94, 2.97; seed 1 1.00, 1.22, 1.52, 2.01, 2.80; seed 2 0.98,
    # 1.28, 1.52, 1.93, 2.79. "The deeper the stack, the larger": fails if the growth stops or reverses.
    assert all(a < b for a, b in zip(stds, stds[1:])) and stds[-1] > 2 * stds[0], stds


@pytest.mark.slow
@pytest.mark.evidence("08", "post-LN without warm-up stays at chance for 300 steps on seeds 0, 1 and 2 (test accuracy "
                            "below 0.2, where knowing nothing gives 0.10 and ignoring order 0.14; last losses above "
                            "ln 7); RAdam without warm-up reaches 0.95 by step 200 on the same seeds (as the notebook "
                            "also shows)")
def test_post_ln_without_warmup_stays_stuck_for_300_steps():
    config = dataclasses.replace(deep_stacks.WarmupConfig(), warmup_steps=0, steps=300)
    for seed in range(3):
        run = deep_stacks.train_reversal_stack(False, config, seed)
        # Measured on seeds 0 to 2, MKL_CBWR=AVX2 / COMPATIBLE: accuracy 0.135 / 0.122, 0.102 / 0.102, 0.123 / 0.124
        # (seeds 3 and 4: 0.102, 0.122), last losses 2.28 to 2.30 (ln 10 = 2.30). An accuracy at chance moves by
        # 0.01 with the float path, so the bound is not 0.15. Fails if the stack learns more than which symbols a
        # sequence holds (that alone gives 0.14 and a loss of ln 8).
        assert run.accuracy < 0.2 and sum(run.losses[-10:]) / 10 > 1.95, (seed, run.accuracy, run.losses[-10:])
        radam = deep_stacks.train_reversal_stack(False, dataclasses.replace(config, optimizer="radam", steps=200), seed)
        # measured 0.997 to 1.0 on both paths (seeds 3 and 4: 0.989, 1.0); fails if RAdam does not learn the task
        assert radam.accuracy >= 0.95, (seed, radam.accuracy)
