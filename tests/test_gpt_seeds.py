"""The seed tables behind notebooks 10 and 11: dropout at notebook 10's budget, and what multi-query attention costs.

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
@pytest.mark.evidence("11", "the phase change of the copying model depends on the seed: trained for 1,000 steps, "
                            "seeds 1 and 2 are still above 1.5 nats at step 850, where the notebook's seed 0 falls "
                            "through 1 nat; seed 1 has dropped below 1.2 by step 1000, seed 2 is still near 2.0 (1.8 "
                            "to 2.2)")
def test_the_phase_change_comes_later_on_other_seeds():
    # Measured, MKL_CBWR=AVX2 / COMPATIBLE: seed 0 (the notebook's run) 0.99 / 1.06 at step 850, so it first measures
    # below 1 nat at step 850 / 875: the crossing step moves with the float path, and is not asserted. Seed 1: 1.99
    # at step 850, 0.85 at step 1000 (below 1 nat from step 975 on both paths). Seed 2: 2.32 at step 850, 1.99 at
    # step 1000. (Seeds 3 and 4: 1.74 and 1.79 at step 850, 0.51 and 1.22 at step 1000.)
    at = {}
    for seed in (1, 2):
        _, measured, losses = lm.train_on_repeats(lm.InductionConfig(steps=1000, seed=seed))
        at[seed] = dict(zip(measured, losses))
    # Fails if either seed has learned to copy by the step where seed 0 has.
    assert at[1][850] > 1.5 and at[2][850] > 1.5, (at[1][850], at[2][850])
    # Seed 1 has its drop before step 1000, seed 2 has not begun it. Fails if the drop comes at the same step on
    # every seed, or never.
    assert at[1][1000] < 1.2, at[1][1000]
    assert 1.8 < at[2][1000] < 2.2, at[2][1000]
