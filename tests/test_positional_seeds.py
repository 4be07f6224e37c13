"""The seed checks behind notebook 06's rotary experiments, and its written question's model answer.

Lecture 06's section 5 trains copy back (the token three places back, causal, 12 tokens to train, 24 to test) on
seeds 0 and 1, and its lab book on seeds 0 to 4: only the rotary model keeps the rule at positions 12 to 23. The
first test runs seeds 5 and 6, beyond the claim. The lab book's section 2 trains the one-block rotary order model
on seed 0: the two ends solved, the middle far below the bound 1/11. Its section 3 trains the two-block rotary model
on seed 0 (0.65) and reads the position from the first block's output with a line (off by 1.1 positions). This
file trains seeds 1 to 3 and 1 and 2 exactly as the lab's cells do (about 2 s per 400-step block run on the course
machine) and checks that the same holds there: the claims, with margins, not the accuracies of one machine's run
(on this machine 0.19 to 0.21 for one block, 0.77 and 0.79 for two, off by 1.4 and 2.2). The last test runs the
causal-mask experiment that the written question's rubric quotes.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from course_utils.blocks.masks import causal_mask
from course_utils.blocks.multihead import MultiHeadAttention
from course_utils.experiments import order


@pytest.mark.slow
@pytest.mark.evidence("06", "copy back on seeds 5 and 6 (seeds 0 to 4 run in the lab book): every model with positions "
                            "learns the rule on the trained positions (above 0.99); at positions 12 to 23 only the "
                            "rotary model keeps it (above 0.99), sinusoidal and learned stay below 0.25")
@pytest.mark.parametrize("seed", [5, 6])
def test_only_rotary_keeps_copy_back_past_the_training_length(seed):
    # Measured on seeds 5 to 9 (7 to 9 beyond this test): rotary 1.000 on both; at positions 12 to 23 sinusoidal
    # 0.102 to 0.243, learned 0.077 to 0.083. Fails if the added positions carry the rule past the training length,
    # or if RoPE loses it.
    config = order.CopyConfig()
    for kind in ["sinusoidal", "learned", "rotary"]:
        run = order.train_copy_model(config, positions=kind, seed=seed)
        assert run.seen > 0.99, (kind, run.seen)
        assert run.unseen > 0.99 if kind == "rotary" else run.unseen < 0.25, (kind, run.unseen)


@pytest.mark.slow
@pytest.mark.evidence("06", "one rotary block on seeds 1 to 3 (seed 0 runs in the lab book): outputs 0 and 11 at 0.9 "
                            "or more, outputs 3 to 8 below half the bound 1/11, so about 0.2 overall (0.15 to 0.25)")
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_one_rotary_block_solves_only_the_ends(seed):
    config = order.ReversalConfig()
    run = order.train_order_model(config, positions="rotary", seed=seed)
    a = run.position_accuracy
    # Measured on seeds 1 to 5 (seeds 4 and 5 beyond the claim): the ends 0.957 or more, the middle 0.011 at most,
    # overall 0.178 to 0.212; the same with MKL_CBWR=COMPATIBLE and with ATEN_CPU_CAPABILITY=default (seeds 1 to 3).
    # Fails if the middle is solved or an end is not.
    assert min(a[0], a[-1]) >= 0.9 and max(a[3:9]) < 1 / (config.T - 1) / 2, a
    # Overall: the two ends (2/12 = 0.17) and a little from outputs 1, 2, 9 and 10. Fails if more than the ends is
    # solved, or an end is lost.
    assert 0.15 < run.accuracy < 0.25, run.accuracy


@pytest.mark.slow
@pytest.mark.evidence("06", "two rotary blocks on seeds 1 and 2 (seed 0 runs in the lab book): accuracy 0.7 or more "
                            "(0.77 and 0.79 on the course machine; one block: about 0.2), outputs 3 to 8 above 0.4; a "
                            "line reads the position from the first block's output better than a constant reading "
                            "(off by less than 2.5 positions on average against 3.0: 1.4 and 2.2; seed 0 in the "
                            "lab book: 1.1)")
@pytest.mark.parametrize("seed", [1, 2])
def test_two_rotary_blocks_read_position(seed):
    config = order.ReversalConfig()
    run = order.train_order_model(replace(config, num_layers=2), positions="rotary", seed=seed)
    # Measured: 0.7743 and 0.7887 (MKL_CBWR=COMPATIBLE: 0.7744 and 0.7891; ATEN_CPU_CAPABILITY=default: 0.7743 and
    # 0.7889), the middle at 0.478 and 0.504 at least (seed 3: 0.7705, 0.42).
    # Fails if the second block does not read position: one block gets about 0.2 and the middle below 0.05.
    assert run.accuracy >= 0.7, run.accuracy
    assert min(run.position_accuracy[3:9]) > 0.4, run.position_accuracy
    x, _ = order.make_reversal_batch(config, 2000, torch.Generator().manual_seed(2))
    with torch.no_grad():
        h = run.model.blocks[0](run.model.embed(x))  # (N, T, D)
    N, T, D = h.shape
    features = torch.cat([h, torch.ones(N, T, 1)], dim=-1)
    target = torch.arange(T, dtype=torch.float32).expand(N, T)
    coef = torch.linalg.lstsq(features[:1000].reshape(-1, D + 1), target[:1000].reshape(-1, 1)).solution
    reading = (features[1000:] @ coef)[..., 0]
    # a constant reading, 5.5, is off by 3.0; measured 1.377 and 2.175 on all three paths (seed 3: 0.56)
    assert (reading - target[1000:]).abs().mean() < 2.5


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
