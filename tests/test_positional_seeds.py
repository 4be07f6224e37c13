"""The seed checks behind notebook 06's rotary experiments, and its written question's model answer.

Section 5 trains the one-block rotary order model on seed 0 and says that on
seeds 1 to 3 it does the same (the two ends solved, the middle far below the
bound 1/11, 0.19 to 0.21 overall). Section 6 trains the two-block rotary model
on seed 0 (0.65) and says that seeds 1 and 2 reach 0.77 and 0.79; its line
that reads the position from the first block's output is shown on seed 0 only
(off by 1.1 positions); on seeds 1 and 2 it is off by 1.4 and 2.2. This
file trains those seeds exactly as the notebook's cells do (about 2 s per
400-step block run on the course machine) and checks the same numbers. The
last test runs the causal-mask experiment that the written question's rubric
quotes.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from course_utils.blocks.masks import causal_mask
from course_utils.blocks.multihead import MultiHeadAttention
from course_utils.experiments import order


@pytest.mark.slow
@pytest.mark.evidence("06", "one rotary block on seeds 1 to 3 (seed 0 runs in the notebook): accuracy 0.19 to 0.21, "
                            "outputs 0 and 11 at 0.9 or more, outputs 3 to 8 below half the bound 1/11")
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_one_rotary_block_solves_only_the_ends(seed):
    config = order.ReversalConfig()
    run = order.train_order_model(config, positions="rotary", seed=seed)
    a = run.position_accuracy
    assert 0.18 < run.accuracy < 0.22
    assert min(a[0], a[-1]) >= 0.9 and max(a[3:9]) < 1 / (config.T - 1) / 2


@pytest.mark.slow
@pytest.mark.evidence("06", "two rotary blocks on seeds 1 and 2 (seed 0 runs in the notebook): accuracy 0.77 and 0.79, "
                            "outputs 3 to 8 above 0.4; a line reads the position from the first block's output better "
                            "than a constant reading (off by 1.4 and 2.2 positions on average against 3.0; seed 0 in "
                            "the notebook: 1.1)")
@pytest.mark.parametrize(("seed", "accuracy"), [(1, 0.774), (2, 0.789)])
def test_two_rotary_blocks_read_position(seed, accuracy):
    config = order.ReversalConfig()
    run = order.train_order_model(replace(config, num_layers=2), positions="rotary", seed=seed)
    assert abs(run.accuracy - accuracy) < 0.01
    assert min(run.position_accuracy[3:9]) > 0.4
    x, _ = order.make_reversal_batch(config, 2000, torch.Generator().manual_seed(2))
    with torch.no_grad():
        h = run.model.blocks[0](run.model.embed(x))  # (N, T, D)
    N, T, D = h.shape
    features = torch.cat([h, torch.ones(N, T, 1)], dim=-1)
    target = torch.arange(T, dtype=torch.float32).expand(N, T)
    coef = torch.linalg.lstsq(features[:1000].reshape(-1, D + 1), target[:1000].reshape(-1, 1)).solution
    reading = (features[1000:] @ coef)[..., 0]
    assert (reading - target[1000:]).abs().mean() < 2.5  # a constant reading, 5.5, is off by 3.0


@pytest.mark.evidence("06", "the written question's rubric: with section 1's layer and a causal mask, 'bites' and "
                            "'dog' change by up to 0.64; position 2 of 'dog man bites' and 'man dog bites' is the "
                            "same after one masked layer and differs after a second")
def test_the_causal_mask_experiment_of_the_written_question():
    torch.manual_seed(0)
    D = 16
    mha = MultiHeadAttention(D, num_heads=4).eval()  # section 1's cell
    vocabulary = {word: torch.randn(D) for word in ["dog", "bites", "man"]}

    def sentence(text):
        return torch.stack([vocabulary[w] for w in text.split()])[None]  # (1, 3, D)

    mask = causal_mask(3)
    with torch.no_grad():
        a, b = mha(sentence("dog bites man"), mask=mask), mha(sentence("man bites dog"), mask=mask)
        assert round((a[0, 1] - b[0, 1]).abs().max().item(), 2) == 0.64  # "bites"
        assert round((a[0, 0] - b[0, 2]).abs().max().item(), 2) == 0.64  # "dog"
        first, second = mha(sentence("dog man bites"), mask=mask), mha(sentence("man dog bites"), mask=mask)
        torch.testing.assert_close(first[0, 2], second[0, 2])  # one layer: the same multiset of keys
        layer2 = MultiHeadAttention(D, 4).eval()
        assert not torch.allclose(layer2(first, mask=mask)[0, 2], layer2(second, mask=mask)[0, 2], atol=1e-3)
        # the reason: "dog" that has seen only itself is a first-layer output of one sentence, not of the other
        assert not any(torch.allclose(first[0, 0], row, atol=1e-3) for row in second[0])
