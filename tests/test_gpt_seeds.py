"""The seed tables behind notebooks 10 and 11: dropout at notebook 10's budget, what multi-query attention costs, the copying model.

Notebook 10 trains one model (seed 0) and says that dropout 0.1 made the same run worse; notebook 11 compares
the shipped multi-head and multi-query models (seed 0) and says that one pair cannot tell whether their
difference is real. These tests train the models with the notebooks' recipe (``lm.make_checkpoint``: about
20 s a run on an idle course machine) and assert the claims, not one machine's trained numbers: a trained loss
moves in its third decimal with the CPU's float path (a paired difference by up to 0.004 between this machine's
two MKL paths, the largest one by 0.002 on a second machine), so every bound below leaves a margin several
times that.
"""

from __future__ import annotations

import math
import statistics

import pytest
import torch

from course_utils.experiments import language_model as lm

SEEDS = range(8)


@pytest.fixture(scope="module")
def table(tmp_path_factory) -> dict[int, tuple[float, float]]:
    folder = tmp_path_factory.mktemp("checkpoints")
    return {seed: (lm.make_checkpoint(folder / "mha.pt", seed=seed),
                   lm.make_checkpoint(folder / "mqa.pt", num_groups=1, seed=seed)) for seed in SEEDS}


@pytest.mark.slow
@pytest.mark.evidence("11", "multi-query against multi-head attention, seeds 0 to 7 at notebook 10's training budget: "
                            "multi-head attention's own loss moves from seed to seed by more than the notebook's pair "
                            "differs; the paired differences take both signs, stay within 0.05 nats, and their mean "
                            "lies within 2.5 standard errors of zero; seed 0's pair, the notebook's, is below zero")
def test_multi_query_costs_no_measurable_loss_at_notebook_10s_budget(table):
    multi_head = [mha for mha, _ in table.values()]
    differences = [mqa - mha for mha, mqa in table.values()]
    # Measured (multi-query minus multi-head, seeds 0 to 7), MKL_CBWR=AVX2 (pinned) / COMPATIBLE (another path):
    # mean -0.0062 / -0.0052, standard deviation 0.0127 / 0.0130, from -0.0293 / -0.0296 to +0.0095 / +0.0104,
    # three positive on both; multi-head from 2.187 to 2.226 on both; seed 0 -0.0104 / -0.0119.
    # "One pair cannot tell, because training the same model from another seed also moves its loss": multi-head's
    # loss spans more across seeds (0.039) than the notebook's pair differs (0.010). Fails if the seeds agree closely.
    assert max(multi_head) - min(multi_head) > abs(differences[0]), (multi_head, differences[0])
    # Sharing keys and values did not make the loss visibly worse, and its cost is too small to measure: every pair
    # within 0.05 nats, pairs on both sides of zero, the mean within 2.5 standard errors of zero (|t| was 1.4 / 1.1).
    # Fails if multi-query costs (or gains) a measurable amount: all pairs one way, or a mean of about 0.011 or more.
    assert max(abs(d) for d in differences) < 0.05, differences
    assert min(differences) < 0 < max(differences), differences
    standard_error = statistics.stdev(differences) / math.sqrt(len(differences))
    assert abs(statistics.mean(differences)) < 2.5 * standard_error, (statistics.mean(differences), standard_error)
    # the notebook's own pair is seed 0 of this table: multi-query's loss below multi-head's (by 0.010 here)
    assert differences[0] < 0, differences[0]


@pytest.mark.slow
@pytest.mark.evidence("10", "dropout 0.1 against no dropout at notebook 10's budget, seeds 0 to 2: the validation "
                            "loss with dropout is higher on every seed, by about 0.08 on seed 0")
def test_dropout_raises_the_validation_loss_at_notebook_10s_budget(tmp_path):
    for seed in range(3):
        without = lm.make_checkpoint(tmp_path / "plain.pt", seed=seed)
        with_dropout = lm.make_checkpoint(tmp_path / "dropout.pt", dropout=0.1, seed=seed)
        assert with_dropout > without + 0.03, (seed, without, with_dropout)
        if seed == 0:  # "trained from the same seed with dropout 0.1, the same model ended about 0.08 nats worse"
            assert 0.06 < with_dropout - without < 0.1


@pytest.mark.slow
@pytest.mark.evidence("11", "the copying model on seeds 0 to 4 (1,500 steps, copies placed at random): the steep fall "
                            "of its loss began within 1,500 steps on four seeds, at different steps, and not on the "
                            "fifth; on each of the four, block 0's two heads look back n and n - 1 positions and block "
                            "1's heads look n - 1 positions after the induction position, at every gap from 1 on (at "
                            "gap 0 that key is the query's own), rather than at the induction position itself")
def test_the_copying_model_on_five_seeds():
    # Measured (this machine): loss on the copyable positions at steps 1000 / 1500: seed 0 2.80 / 0.85 (first below
    # 1 nat at step 1400), seed 1 2.78 / 1.80, seed 2 2.90 / 1.34, seed 3 2.75 / 1.14, seed 4 2.79 / 2.53. Block 0's
    # strongest look-backs 8 and 7 on seeds 0 to 3 (weights 0.39 to 0.72); block 1's mean weight on the induction
    # position + 7: 0.67, 0.46, 0.42, 0.65 (seed 4: 0.08), at most 0.03 on the induction position itself.
    config = lm.InductionConfig()
    n = config.n
    fell = []
    for seed in range(5):
        model, measured, losses = lm.train_on_repeats(lm.InductionConfig(seed=seed))
        at = dict(zip(measured, losses))
        steepest = max(at[s - 100] - at[s] for s in measured if s >= 650)
        if at[1500] < 2.2:  # the steep fall has begun
            assert steepest > 0.3, (seed, steepest)
            fell.append(seed)
        else:
            assert at[1500] > 2.3, (seed, at[1500])  # no fall begun, and not borderline
            continue
        tokens, copyable, lag = lm.repeated_segments(256, n, config.max_gap, config.length, config.vocab_size,
                                                     torch.Generator().manual_seed(10_000))
        maps = lm.attention_weights(model, tokens[:, :-1])  # (B, 2, H, T, T)
        back = torch.stack([maps[:, 0].diagonal(offset=-b, dim1=-2, dim2=-1).mean(dim=(0, -1))
                            for b in range(1, n + 1)])  # (n, H): block 0's weight b = 1 .. n positions back
        assert sorted(int(back[:, h].argmax()) + 1 for h in range(config.num_heads)) == [n - 1, n], (seed, back)
        rows, queries = copyable.nonzero(as_tuple=True)
        after = (queries - lag[rows] + 1)[:, None] + torch.arange(n)  # the induction position and the n - 1 after it
        seen = maps[rows[:, None], 1, :, queries[:, None], after].mean(dim=2)  # (N, n): block 1, mean over heads
        gap = lag[rows] - n
        assert int(seen.mean(dim=0).argmax()) == n - 1 and seen[:, n - 1].mean() > 0.3, (seed, seen.mean(dim=0))
        # At every gap from 1 on, more on the shifted position than on the induction one. At gap 0 the shifted key is
        # the query's own position, so weight there says nothing about matching (seed 1: 0.11 against 0.06 there).
        for g in range(1, config.max_gap + 1):
            assert seen[gap == g, n - 1].mean() > 2 * seen[gap == g, 0].mean(), (seed, g)
    # Fails if the fall comes on every seed within 1,500 steps (or on none but the notebook's).
    assert 0 in fell and 2 <= len(fell) <= 4, fell
