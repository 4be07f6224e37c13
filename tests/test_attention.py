"""Reference implementations: invariants and parity with PyTorch built-ins."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from course_utils.blocks import attention, masks

SHAPES = [(1, 1, 1, 1), (2, 4, 6, 3), (3, 5, 2, 7), (4, 8, 8, 16)]


@pytest.mark.parametrize(("B", "T", "S", "D"), SHAPES)
def test_pairwise_scores_matches_einsum(B, T, S, D):
    g = torch.Generator().manual_seed(B * 100 + S)
    q, k = torch.randn(B, T, D, generator=g), torch.randn(B, S, D, generator=g)
    scores = attention.pairwise_scores(q, k)
    assert scores.shape == (B, T, S)
    torch.testing.assert_close(scores, torch.einsum("btd,bsd->bts", q, k))


@pytest.mark.parametrize(("B", "T", "S", "D"), SHAPES)
def test_masked_softmax_invariants(B, T, S, D):
    g = torch.Generator().manual_seed(S)
    scores = torch.randn(B, T, S, generator=g)
    lengths = torch.randint(1, S + 1, (B,), generator=g)
    mask = masks.padding_mask(lengths, S)
    weights = attention.masked_softmax(scores, mask)
    assert weights.shape == (B, T, S)
    torch.testing.assert_close(weights.sum(-1), torch.ones(B, T))  # rows sum to 1
    assert (weights.masked_select(~mask.expand(B, T, S)) == 0).all()  # masked keys get exactly 0
    assert (weights >= 0).all()


def test_masked_softmax_fully_masked_rows_are_zero_not_nan():
    scores = torch.randn(2, 3, 4)
    mask = masks.padding_mask(torch.tensor([0, 2]), 4)
    weights = attention.masked_softmax(scores, mask)
    assert torch.isfinite(weights).all()
    assert (weights[0] == 0).all()
    torch.testing.assert_close(weights[1].sum(-1), torch.ones(3))


def test_masked_softmax_without_mask_is_softmax():
    scores = torch.randn(2, 3, 4)
    torch.testing.assert_close(attention.masked_softmax(scores), torch.softmax(scores, -1))


@pytest.mark.parametrize(("B", "T", "S", "D"), SHAPES)
def test_masked_attention_matches_scaled_dot_product_attention(B, T, S, D):
    """scores -> padding mask -> masked softmax -> weighted sum equals PyTorch's fused SDPA."""
    g = torch.Generator().manual_seed(T)
    q, k, v = (torch.randn(B, n, D, generator=g) for n in (T, S, S))
    lengths = torch.randint(1, S + 1, (B,), generator=g)
    mask = masks.padding_mask(lengths, S)  # (B, 1, S), True = may attend, as SDPA expects
    weights = attention.masked_softmax(attention.pairwise_scores(q, k) / D**0.5, mask)
    out = weights @ v  # (B, T, S) @ (B, S, D) -> (B, T, D)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


def test_padding_mask_values_and_shape():
    mask = masks.padding_mask(torch.tensor([3, 0, 1]), 4)
    assert mask.shape == (3, 1, 4) and mask.dtype == torch.bool
    assert mask[:, 0].tolist() == [[True, True, True, False], [False] * 4, [True, False, False, False]]


def test_causal_mask_is_lower_triangular():
    mask = masks.causal_mask(3)
    assert mask.tolist() == [[True, False, False], [True, True, False], [True, True, True]]
    assert masks.causal_mask(2, 4).shape == (2, 4)
