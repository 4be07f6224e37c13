"""The seed check behind notebook 04's long run and its start-versus-step controls.

Section 5 trains the unscaled recall model three times as long at Dk = 256 on
seed 0 only (269 steps against the scaled model's 89); its text says that on
seeds 1 and 2 it also gets there, about twice as late or later (169 against
76, 155 against 77). Section 6 runs the two controls on seed 0 (the unscaled
model at Dk = 256 started where the scaled one starts: 148 steps; tau = 64 at
Dk = 64 started at the spread of tau = 8: 114 steps) and says that seeds 1 and
2 fall the same way (101 and 87 against 76 and 77; 112 and 105 against 96 and
91), the start explaining about two thirds of the extra steps. This test
trains seeds 1 and 2 exactly as those cells do and checks the same ordering.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from course_utils.experiments import scaling


@pytest.mark.slow
@pytest.mark.evidence("04", "seeds 1 and 2 (seed 0 runs in the notebook): the unscaled model at Dk = 256 learns within "
                            "450 steps, at least 1.7 times the scaled model's steps; started where the scaled model "
                            "starts it needs more steps than the scaled model and fewer than from its own start, and "
                            "so does tau = 64 started at tau = 8's spread at Dk = 64; the start explains 55% to 95% "
                            "of the extra steps")
@pytest.mark.parametrize("seed", [1, 2])
def test_the_start_explains_most_of_the_cost_but_not_all(seed):
    config = scaling.RecallConfig()

    def steps(run):
        return scaling.steps_to_learn(run.losses)

    scaled = steps(scaling.train_recall(replace(config, Dk=256), scaled=True, seed=seed))
    own_start = scaling.train_recall(replace(config, Dk=256, steps=450), scaled=False, seed=seed)
    matched = steps(scaling.train_recall(replace(config, Dk=256, steps=250), scaled=False, seed=seed,
                                         start_scale=1 / math.sqrt(256)))
    assert own_start.accuracy >= 0.9 and steps(own_start) >= 1.7 * scaled
    assert scaled < matched < steps(own_start)
    assert 0.55 < (steps(own_start) - matched) / (steps(own_start) - scaled) < 0.95

    tau_8 = steps(scaling.train_recall(replace(config, Dk=64), seed=seed, scale=1 / 8))
    tau_64 = steps(scaling.train_recall(replace(config, Dk=64), seed=seed, scale=1 / 64))
    tau_64_matched = steps(scaling.train_recall(replace(config, Dk=64, steps=250), seed=seed, scale=1 / 64,
                                                start_scale=1 / 8))
    assert tau_8 < tau_64_matched < tau_64
    assert 0.55 < (tau_64 - tau_64_matched) / (tau_64 - tau_8) < 0.95
