"""The seed checks behind notebooks 07 and 08.

Notebook 07 measures the tokens' growth through a pre-LN stack on seed 0 (its transformer on seeds 1 to 4, against notebook 02's
attention RNN, is lab 07's, which asserts what it shows). Notebook 08
trains its deep stacks on seeds 0, 1 and 2 for 100 steps; its text says that
post-LN without a warm-up is still at chance after 300 steps on each of them.
These tests re-run those experiments exactly as the notebooks do.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from course_utils.experiments import deep_stacks


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
