"""Notebook 04's measurement of saturation against the number of keys: the reference and its theory."""

from __future__ import annotations

import math

import pytest
import torch

from course_utils.experiments import scaling

WIDTHS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]


def _mean_largest_weights(Dks, S, T, generator):
    """Every width's mean largest weight, on the draws the exercise prescribes (float64 arithmetic, einsum)."""
    means = []
    for Dk in Dks:
        q = torch.randn(T, Dk, generator=generator).double()
        k = torch.randn(S, Dk, generator=generator).double()
        means.append(torch.einsum("td,sd->ts", q, k).softmax(dim=1).max(dim=1).values.mean().item())
    return means


@pytest.mark.parametrize(("seed", "S", "T", "threshold"), [(0, 16, 40, 0.9), (1, 3, 1, 0.8), (2, 40, 9, 0.95)])
def test_saturation_width_is_the_first_width_whose_mean_largest_weight_passes(seed, S, T, threshold):
    width = scaling.saturation_width(WIDTHS, S, T, torch.Generator().manual_seed(seed), threshold)
    means = _mean_largest_weights(WIDTHS, S, T, torch.Generator().manual_seed(seed))
    first = next(Dk for Dk, mean in zip(WIDTHS, means) if mean > threshold)
    assert width == first
    assert all(mean < threshold - 1e-4 for mean in means[:WIDTHS.index(first)]), "no width near the threshold"


def test_saturation_width_draws_only_up_to_the_width_it_returns():
    generator = torch.Generator().manual_seed(3)
    width = scaling.saturation_width(WIDTHS, 16, 32, generator)
    replay = torch.Generator().manual_seed(3)
    for Dk in WIDTHS[:WIDTHS.index(width) + 1]:
        torch.randn(32, Dk, generator=replay)
        torch.randn(16, Dk, generator=replay)
    assert torch.equal(generator.get_state(), replay.get_state())


def test_saturation_width_at_the_boundaries():
    assert scaling.saturation_width(WIDTHS, 1, 8, torch.Generator().manual_seed(0)) == 1  # one key: weight 1
    assert scaling.saturation_width(WIDTHS, 1, 8, torch.Generator().manual_seed(0), threshold=1.0) is None
    assert scaling.saturation_width(WIDTHS, 16, 8, torch.Generator().manual_seed(0), threshold=0.0) == 1
    assert scaling.saturation_width([], 16, 8, torch.Generator().manual_seed(0)) is None
    # float32 softmax of unscaled scores in wide heads: no overflow, and the mean passes
    assert scaling.saturation_width([3000], 16, 8, torch.Generator().manual_seed(0)) == 3000


def test_top_two_gap_density_is_exact_for_two_and_grows_slowly():
    assert scaling.top_two_gap_density(2) == pytest.approx(1 / math.sqrt(math.pi), rel=1e-9)  # |N(0, 2)| at 0
    sizes = [4, 16, 64, 1024, 2**16, 2**20]
    relative = [scaling.top_two_gap_density(S) / math.sqrt(2 * math.log(S)) for S in sizes]
    assert relative == sorted(relative) and relative[-1] < 1  # approaches sqrt(2 ln S) from below
    assert 1.7 < scaling.top_two_gap_density(16) < 1.8 and 3.2 < scaling.top_two_gap_density(1024) < 3.3


def test_top_two_gap_density_matches_sampled_gaps():
    g = torch.Generator().manual_seed(0)
    top = torch.randn(400_000, 16, generator=g, dtype=torch.float64).topk(2, dim=-1).values
    gaps = top[:, 0] - top[:, 1]
    sampled = (gaps < 0.05).double().mean().item() / 0.05  # density near 0 (it falls slowly: a 1% bias)
    assert sampled == pytest.approx(scaling.top_two_gap_density(16), rel=0.04)


@pytest.mark.parametrize(("S", "Dk"), [(2, 1024), (16, 1024), (256, 256)])
def test_the_leading_order_theory_of_the_mean_largest_weight(S, Dk):
    """1 - E[largest weight] = ln 2 · f_S / sqrt(Dk) for unscaled scores, to leading order (notebook 04)."""
    g = torch.Generator().manual_seed(S)
    left = 0.0
    for _ in range(32):  # 32 sets of keys, 512 queries over each
        q = torch.randn(512, Dk, generator=g, dtype=torch.float64)
        k = torch.randn(S, Dk, generator=g, dtype=torch.float64)
        left += (1 - torch.softmax(q @ k.T, dim=-1).amax(dim=-1).mean().item()) / 32
    assert left == pytest.approx(math.log(2) * scaling.top_two_gap_density(S) / math.sqrt(Dk), rel=0.1)


def test_start_scale_gives_the_start_of_the_other_scale_and_keeps_the_factor():
    config = scaling.RecallConfig(Dk=64, steps=2, test_size=200)
    scaled = scaling.train_recall(config, scaled=True, seed=0)
    matched = scaling.train_recall(config, scaled=False, seed=0, start_scale=1 / math.sqrt(64))
    unscaled = scaling.train_recall(config, scaled=False, seed=0)
    assert matched.initial.score_std == pytest.approx(scaled.initial.score_std, rel=1e-5)
    assert matched.initial.max_weight == pytest.approx(scaled.initial.max_weight, rel=1e-5)
    assert matched.initial.max_weight < unscaled.initial.max_weight
    assert matched.initial.query_norm == pytest.approx(scaled.initial.query_norm / 8, rel=1e-5)  # q starts 8x shorter
    assert matched.losses[0] == pytest.approx(scaled.losses[0], rel=1e-5)  # the same first step ...
    assert matched.losses[1] != pytest.approx(scaled.losses[1], rel=1e-6)  # ... then the factor differs


def test_the_multi_head_recall_model_is_one_recall_model_per_slice():
    """Head h attends with slice h of q and k and reads slice h of v; with one head it is the RecallModel."""
    config = scaling.RecallConfig(Dk=12, Dv=8, D=10, steps=2, test_size=50)
    torch.manual_seed(0)
    model = scaling.MultiHeadRecallModel(config, scale=0.3, heads=4)
    keys, values, query, _ = scaling.make_recall_batch(config, 5, torch.Generator().manual_seed(1))
    logits, weights = model(keys, values, query, return_weights=True)
    q, k, v = model.project(keys, values, query)  # (B, 1, 12), (B, S, 12), (B, S, 8)
    contexts = []
    for h in range(4):
        w = torch.softmax(q[..., 3 * h:3 * h + 3] @ k[..., 3 * h:3 * h + 3].transpose(-2, -1) * 0.3, dim=-1)
        torch.testing.assert_close(weights[:, h], w)
        contexts.append((w @ v[..., 2 * h:2 * h + 2])[:, 0])
    torch.testing.assert_close(logits, model.out_proj(torch.cat(contexts, dim=-1)))
    single = scaling.MultiHeadRecallModel(config, scale=0.3, heads=1)
    plain = scaling.RecallModel(config, scale=0.3)
    plain.load_state_dict(single.state_dict())
    torch.testing.assert_close(single(keys, values, query), plain(keys, values, query))


def test_attention_stats_average_over_heads():
    config = scaling.RecallConfig(Dk=16, Dv=16, D=16, steps=2, test_size=64)
    one = scaling.train_recall(config, seed=0, scale=0.25)
    four = scaling.train_recall(config, seed=0, scale=0.25, heads=4)
    assert four.initial.query_norm == pytest.approx(one.initial.query_norm / 2, rel=0.2)  # a quarter of the width
    assert abs(four.initial.right_weight - 1 / 16) < 0.02 and 1 / 16 < four.initial.max_weight < 1
