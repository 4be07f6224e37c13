"""Notebook 09: tiled attention with an online softmax, the fused path, memory and timing helpers, the checker."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from course_utils.experiments import efficiency
from course_utils.blocks.attention import scaled_dot_product_attention
from course_utils.checks import CheckError, check_online_softmax_update
from helpers import notebook_solution
from course_utils.core.errors import InputError


@pytest.mark.parametrize(("T", "S", "Dk", "Dv", "block_size"), [(1, 1, 1, 1, 1), (5, 17, 8, 3, 4), (64, 64, 16, 16, 64),
                                                                 (10, 300, 32, 8, 1000), (2, 9, 4, 4, 2)])
def test_tiled_attention_equals_naive_attention(T, S, Dk, Dv, block_size):
    g = torch.Generator().manual_seed(T + S)
    q, k, v = torch.randn(2, 3, T, Dk, generator=g), torch.randn(2, 3, S, Dk, generator=g), torch.randn(2, 3, S, Dv, generator=g)
    expected = scaled_dot_product_attention(q, k, v)[0]
    torch.testing.assert_close(efficiency.tiled_attention(q, k, v, block_size), expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(F.scaled_dot_product_attention(q, k, v), expected, atol=1e-5, rtol=1e-5)


def test_online_softmax_is_exact_for_huge_scores_where_a_plain_softmax_overflows():
    scores = torch.tensor([[1000.0, 990.0, 1010.0, 995.0]])  # exp(1000) overflows float32
    v = torch.eye(4)
    m, l, acc = torch.full((1, 1), float("-inf")), torch.zeros(1, 1), torch.zeros(1, 4)
    for j in range(4):
        m, l, acc = efficiency.online_softmax_update(m, l, acc, scores[:, j:j + 1], v[j:j + 1])
    torch.testing.assert_close(acc / l, torch.softmax(scores, dim=-1))
    assert torch.isinf(scores.exp()).any()


def test_fused_self_attention_layer_matches_the_reference_layer():
    torch.manual_seed(0)
    reference = efficiency.SelfAttentionLayer(16).eval()
    fused = efficiency.SelfAttentionLayer(16, fused=True).eval()
    fused.load_state_dict(reference.state_dict())
    x = torch.randn(3, 20, 16)
    with torch.no_grad():
        torch.testing.assert_close(fused(x), reference(x), atol=1e-5, rtol=1e-5)


def test_time_layers_and_time_call_measure_positive_times():
    result = efficiency.time_layers([8, 16], d=8, repeats=1)
    assert result.ns == [8, 16] and result.d == 8
    assert all(t > 0 for t in result.attention + result.fused + result.recurrent)
    assert efficiency.time_call(lambda: None, repeats=2, min_seconds=0.0) >= 0


def test_peak_memory_naive_holds_the_matrix_tiled_does_not():
    n = 2048
    matrix_mb = 4 * n * n / 2**20
    naive = efficiency.peak_memory_mb("naive", n, 32)
    tiled = efficiency.peak_memory_mb("tiled", n, 32, block_size=128)
    assert naive >= matrix_mb and tiled < naive / 2
    with pytest.raises(InputError, match="kind must be"):
        efficiency.peak_memory_mb("flash", n, 32)
    with pytest.raises(InputError, match="block_size"):
        efficiency.tiled_attention(torch.zeros(2, 4), torch.zeros(3, 4), torch.zeros(3, 4), block_size=0)


def test_peak_memory_curve_measures_each_length_afresh():
    # one process for several lengths: the n x n buffers of a length are freed before the next,
    # so each length is measured as in a process of its own (within 10%) and grows like n^2
    ns = [1024, 2048, 4096]
    curve = efficiency.peak_memory_curve("naive", ns, 32)
    alone = efficiency.peak_memory_mb("naive", 4096, 32)
    assert abs(curve[-1] - alone) <= 0.1 * alone, (curve, alone)
    assert all(mb >= 4 * n * n / 2**20 for mb, n in zip(curve, ns)), curve
    assert 3 <= curve[2] / curve[1] <= 5, curve


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_checker_accepts_the_notebook_solution(seed, capsys):
    solution = notebook_solution("09_attention_at_scale", "online_softmax_update")
    check_online_softmax_update(solution, seed=seed)
    check_online_softmax_update(solution, seed=seed, T=1, Dv=2, block_sizes=(1, 4, 3))
    assert capsys.readouterr().out.count("all checks passed") == 2


def _update(rescale_acc=True, rescale_l=True, old_max=False, inverted=False, block_max=False):
    def fn(m, l, acc, scores, v):
        m_new = scores.amax(-1, keepdim=True) if block_max else torch.maximum(m, scores.amax(-1, keepdim=True))
        p = torch.exp(scores - (m if old_max else m_new))
        c = torch.exp(m_new - m).nan_to_num(0.0, posinf=0.0) if inverted else torch.exp(m - m_new)
        return m_new, (l * c if rescale_l else l) + p.sum(-1, keepdim=True), (acc * c if rescale_acc else acc) + p @ v

    return fn


def _update_inplace(m, l, acc, scores, v):
    acc.mul_(1.0)
    acc += 1.0
    return efficiency.online_softmax_update(m, l, acc, scores, v)


UPDATE_BUGS = [
    (_update(rescale_acc=False), "acc was not rescaled"),
    (_update(rescale_acc=False, rescale_l=False), "the old sums were not rescaled"),
    (_update(old_max=True), "with the old maximum"),
    (_update(inverted=True), "the correction is inverted"),
    (_update(block_max=True), "m after block 3"),
    (_update_inplace, "changed an input in place"),
    (_update(), "every key masked"),  # right for ordinary blocks, NaN once a row's block is fully masked
    (lambda m, l, acc, scores, v: (m, l), "a tuple of three tensors"),
    (lambda m, l, acc, scores, v: efficiency.online_softmax_update(m, l, acc, scores, v.T), "online_softmax_update raised"),
]


@pytest.mark.parametrize(("buggy", "fragment"), UPDATE_BUGS)
def test_check_online_softmax_update_names_the_bug(buggy, fragment):
    with pytest.raises(CheckError) as err:
        check_online_softmax_update(buggy)
    assert fragment in str(err.value)


# --- causal tiled attention (notebook 09, exercise 2) ---------------------------------------------------------


@pytest.mark.parametrize(("lead", "T", "Dk", "Dv", "block_size"), [((2, 3), 11, 5, 6, 4), ((), 11, 5, 6, 1),
                                                                   ((1,), 12, 4, 3, 4), ((2, 1), 7, 3, 4, 7),
                                                                   ((1, 2), 5, 8, 2, 64), ((), 1, 2, 3, 1)])
def test_causal_tiled_attention_equals_pytorch_causal_attention_and_counts_the_lower_tiles(lead, T, Dk, Dv,
                                                                                            block_size):
    g = torch.Generator().manual_seed(T)
    q, k = torch.randn(*lead, T, Dk, generator=g), torch.randn(*lead, T, Dk, generator=g)
    v = torch.randn(*lead, T, Dv, generator=g)
    out, tiles = efficiency.causal_tiled_attention(q, k, v, block_size)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, is_causal=True), atol=1e-5, rtol=1e-5)
    n = -(-T // block_size)
    assert tiles == n * (n + 1) // 2


def test_causal_tiled_attention_skips_the_upper_tiles():
    """The multiply-adds of its matrix products are those of the tiles at or below the diagonal, and no more."""
    from torch.utils.flop_counter import FlopCounterMode

    q, k, v = torch.randn(1, 1, 96, 8), torch.randn(1, 1, 96, 8), torch.randn(1, 1, 96, 4)
    with FlopCounterMode(display=False) as causal:
        efficiency.causal_tiled_attention(q, k, v, 16)  # 6 blocks: 21 of 36 tiles
    with FlopCounterMode(display=False) as every_tile:
        efficiency.tiled_attention(q, k, v, 16)
    assert causal.get_total_flops() == 2 * 21 * 16 * 16 * (8 + 4)
    assert causal.get_total_flops() * 36 == every_tile.get_total_flops() * 21


def test_causal_tiled_attention_rejects_an_empty_block():
    with pytest.raises(InputError, match="block_size"):
        efficiency.causal_tiled_attention(torch.zeros(3, 4), torch.zeros(3, 4), torch.zeros(3, 4), block_size=0)


def test_peak_memory_curves_side_by_side_agree_with_one_process_each():
    ns = [1024, 2048]
    together = efficiency.peak_memory_curves(("naive", "pytorch"), ns, 32)
    assert list(together) == ["naive", "pytorch"]
    assert all(mb >= 4 * n * n / 2**20 for mb, n in zip(together["naive"], ns)), together
    assert max(together["pytorch"]) < together["naive"][0] / 2, together
    with pytest.raises(InputError, match="kind must be"):
        efficiency.peak_memory_curves(("naive", "flash"), ns, 32)


def test_page_faults_counts_the_fresh_pages_of_a_large_tensor():
    import mmap

    n = 4096  # a 64 MiB float32 matrix, above glibc's largest mmap threshold (32 MiB): fresh pages on every call
    pages = 4 * n * n // mmap.PAGESIZE
    faults = efficiency.page_faults(lambda: torch.ones(n, n))
    assert faults >= 0.9 * pages, (faults, pages)
    buffer = torch.empty(n, n)
    assert efficiency.page_faults(lambda: buffer.fill_(1.0)) < 0.01 * pages
