"""Notebooks 05 and 06: multi-head attention against nn.MultiheadAttention, positional encodings, their checkers."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from torch import nn

import course_utils
from course_utils.blocks import masks, multihead, positional
from course_utils.experiments import neighbours, order
from course_utils.checks import (
    CheckError,
    check_apply_rotary,
    check_merge_heads,
    check_multi_head_attention,
    check_sinusoidal_positional_encoding,
    check_split_heads,
    check_to_rotate_half,
)
from course_utils.core.errors import InputError
from course_utils.blocks.multihead import MultiHeadAttention
from helpers import assert_no_answer_in, notebook_solution

# (B, T, S, D, H)
SHAPES = [(1, 1, 1, 4, 1), (2, 5, 7, 12, 3), (3, 6, 6, 32, 8), (2, 4, 9, 16, 4)]


def _pair(D, H, bias=True, seed=0):
    torch.manual_seed(seed)
    theirs = nn.MultiheadAttention(D, H, bias=bias, batch_first=True).eval()
    return theirs, MultiHeadAttention.from_torch(theirs)


def test_public_names_import_from_the_package():
    from course_utils import (  # noqa: F401
        MultiHeadAttention,
        apply_rotary,
        merge_heads,
        sinusoidal_positional_encoding,
        split_heads,
    )

    assert course_utils.MultiHeadAttention is multihead.MultiHeadAttention


@pytest.mark.parametrize(("B", "T", "S", "D", "H"), SHAPES)
@pytest.mark.parametrize("bias", [True, False])
def test_parity_with_nn_multihead_attention(B, T, S, D, H, bias):
    theirs, ours = _pair(D, H, bias=bias, seed=B + T)
    g = torch.Generator().manual_seed(S)
    x = torch.randn(B, T, D, generator=g)
    memory = torch.randn(B, S, D, generator=g)
    lengths = torch.randint(1, S + 1, (B,), generator=g)
    pad = masks.padding_mask(lengths, S)  # (B, 1, S), True = may attend
    with torch.no_grad():
        # self-attention, per-head weights
        out, w = ours(x, return_weights=True)
        ref_out, ref_w = theirs(x, x, x, average_attn_weights=False)
        torch.testing.assert_close(out, ref_out, atol=1e-5, rtol=0)
        torch.testing.assert_close(w, ref_w, atol=1e-5, rtol=0)
        # cross-attention with key padding: PyTorch's key_padding_mask is True = ignore, so pass ~mask
        out, w = ours(x, memory, mask=pad, return_weights=True)
        ref_out, ref_w = theirs(x, memory, memory, key_padding_mask=~pad[:, 0])
        torch.testing.assert_close(out, ref_out, atol=1e-5, rtol=0)
        torch.testing.assert_close(w.mean(dim=1), ref_w, atol=1e-5, rtol=0)  # averaged over heads
        # causal self-attention: PyTorch's boolean attn_mask is True = not allowed
        causal = masks.causal_mask(T)
        out, w = ours(x, mask=causal, return_weights=True)
        ref_out, ref_w = theirs(x, x, x, attn_mask=~causal, average_attn_weights=False)
        torch.testing.assert_close(out, ref_out, atol=1e-5, rtol=0)
        torch.testing.assert_close(w, ref_w, atol=1e-5, rtol=0)


def test_split_and_merge_are_inverse_and_keep_tokens_apart():
    x = torch.randn(2, 5, 12)
    heads = multihead.split_heads(x, 3)
    assert heads.shape == (2, 3, 5, 4)
    torch.testing.assert_close(heads[1, 2, 4], x[1, 4, 8:12])  # head 2 of token 4 = features 8..11 of token 4
    torch.testing.assert_close(multihead.merge_heads(heads), x)


def test_indivisible_width_and_bad_inputs_get_clear_messages():
    with pytest.raises(InputError, match=r"D = d_model = 10 is not divisible by H = num_heads = 4.*\[1, 2, 5, 10\]"):
        MultiHeadAttention(10, 4)
    with pytest.raises(InputError, match="H = num_heads must be at least 1, got 0"):
        MultiHeadAttention(8, 0)
    mha = MultiHeadAttention(8, 2)
    with pytest.raises(InputError, match="query must be \\(B, length, D\\) with D = d_model = 8, got shape \\(2, 3, 6\\)"):
        mha(torch.randn(2, 3, 6))
    with pytest.raises(InputError, match="must share B"):
        mha(torch.randn(2, 3, 8), torch.randn(3, 3, 8))
    with pytest.raises(InputError, match="batch_first=True"):
        MultiHeadAttention.from_torch(nn.MultiheadAttention(8, 2))
    with pytest.raises(InputError, match="expected an nn.MultiheadAttention"):
        MultiHeadAttention.from_torch(nn.Linear(8, 8))


def test_ablating_a_head_removes_exactly_its_output_and_restores_the_weights():
    mha = MultiHeadAttention(12, 3)
    x = torch.randn(2, 4, 12)
    before = mha.out_proj.weight.detach().clone()
    with torch.no_grad():
        _, weights = mha(x, return_weights=True)
        q = multihead.split_heads(mha.q_proj(x), 3)
        v = multihead.split_heads(mha.v_proj(x), 3)
        context = weights @ v  # (B, H, T, Dh)
        context[:, 1] = 0.0
        expected = mha.out_proj(multihead.merge_heads(context))
        with multihead.ablate_head(mha, 1):
            ablated = mha(x)
    torch.testing.assert_close(ablated, expected)
    assert torch.equal(mha.out_proj.weight, before) and q.shape == (2, 3, 4, 4)
    with pytest.raises(InputError, match="head must be in 0 .. 2"):
        with multihead.ablate_head(mha, 3):
            pass


def test_cost_of_heads_does_not_depend_on_their_number():
    costs = [multihead.attention_cost(T=10, S=12, d_model=64, num_heads=h) for h in (1, 2, 8, 64)]
    assert all(c == costs[0] for c in costs)
    assert costs[0]["parameters"] == sum(p.numel() for p in MultiHeadAttention(64, 8).parameters())
    assert costs[0]["total"] == 2 * 10 * 64 * 64 + 2 * 12 * 64 * 64 + 2 * 10 * 12 * 64


def test_self_attention_without_positions_is_permutation_equivariant():
    mha = MultiHeadAttention(16, 4)
    x = torch.randn(2, 6, 16)
    perm = torch.tensor([4, 2, 0, 5, 1, 3])
    with torch.no_grad():
        torch.testing.assert_close(mha(x[:, perm]), mha(x)[:, perm])


# --- positional encodings (notebook 06) ----------------------------------------


def test_sinusoidal_encoding_values():
    pe = positional.sinusoidal_positional_encoding(5, 6)
    assert pe.shape == (5, 6)
    assert torch.equal(pe[0], torch.tensor([0.0, 1.0] * 3))  # sin 0, cos 0
    torch.testing.assert_close(pe[3, 2], torch.tensor(math.sin(3 / 10000 ** (2 / 6))))
    torch.testing.assert_close(pe[3, 5], torch.tensor(math.cos(3 / 10000 ** (4 / 6))))
    with pytest.raises(InputError, match="D = 5 is odd"):
        positional.sinusoidal_positional_encoding(4, 5)
    with pytest.raises(InputError, match="T must be a positive int"):
        positional.sinusoidal_positional_encoding(0, 4)


@pytest.mark.parametrize("k", [1, 2, 5, 11])
def test_a_shift_is_a_fixed_rotation(k):
    pe = positional.sinusoidal_positional_encoding(40, 16)
    M = positional.shift_matrix(k, 16)
    torch.testing.assert_close(pe[k:], pe[:-k] @ M, atol=1e-5, rtol=0)
    torch.testing.assert_close(M @ M.T, torch.eye(16), atol=1e-6, rtol=0)  # a rotation


def test_rotary_scores_depend_only_on_the_offset():
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(16, generator=g), torch.randn(16, generator=g)

    def at(v, p):
        return positional.apply_rotary(v[None], torch.tensor([p]))[0]

    for offset in (0, 3, -2):
        scores = [at(q, m) @ at(k, m + offset) for m in (0, 4, 9, 30)]
        torch.testing.assert_close(torch.stack(scores), scores[0].expand(4), atol=1e-4, rtol=0)
    torch.testing.assert_close(at(q, 7).norm(), q.norm())  # rotations keep the norm
    with pytest.raises(InputError, match="positions must have shape"):
        positional.apply_rotary(torch.randn(3, 4), torch.arange(4))


# --- checkers -----------------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_checkers_accept_the_notebook_solutions(seed, capsys):
    check_split_heads(notebook_solution("05_multi_head_attention", "split_heads"), seed=seed)
    check_merge_heads(notebook_solution("05_multi_head_attention", "merge_heads"), seed=seed)
    check_multi_head_attention(notebook_solution("05_multi_head_attention", "multi_head_attention"), seed=seed)
    check_to_rotate_half(notebook_solution("06_positional_encoding", "to_rotate_half"), seed=seed)
    check_apply_rotary(notebook_solution("06_positional_encoding", "apply_rotary"), seed=seed)
    assert capsys.readouterr().out.count("all checks passed") == 5


SPLIT_BUGS = [
    (lambda x, H: x.view(x.shape[0], H, x.shape[1], -1), "view went straight to (B, H, T, Dh)"),
    (lambda x, H: x.view(x.shape[0] * H, x.shape[1], -1), "keep B and H as two dimensions"),
    (lambda x, H: x.view(x.shape[1], x.shape[0] * H, -1), "mixes batch elements and positions"),
    (lambda x, H: x.view(x.shape[0], x.shape[1], H, -1), "the head axis is still after the token axis"),
    (lambda x, H: x.view(x.shape[0], x.shape[1], -1, H).permute(0, 3, 1, 2), "every H-th feature"),
]


@pytest.mark.parametrize(("buggy", "fragment"), SPLIT_BUGS)
def test_check_split_heads_names_the_bug(buggy, fragment):
    with pytest.raises(CheckError) as err:
        check_split_heads(buggy)
    assert fragment in str(err.value)


MERGE_BUGS = [
    (lambda x: x.reshape(x.shape[0], x.shape[2], -1), "without transposing back"),
    (lambda x: x.transpose(1, 2).view(x.shape[0], x.shape[2], -1), "a view cannot reorder memory"),
    (lambda x: x.transpose(1, 2), "not concatenated"),
    (lambda x: x.permute(0, 2, 3, 1).reshape(x.shape[0], x.shape[2], -1), "interleaved"),
]


@pytest.mark.parametrize(("buggy", "fragment"), MERGE_BUGS)
def test_check_merge_heads_names_the_bug(buggy, fragment):
    with pytest.raises(CheckError) as err:
        check_merge_heads(buggy)
    assert fragment in str(err.value)


def _mha(**mistake):
    from course_utils.checks.multihead import _mha_variant

    def fn(query, key, value, q_proj, k_proj, v_proj, out_proj, num_heads, mask=None):
        return _mha_variant(query, key, value, (q_proj, k_proj, v_proj, out_proj), num_heads, mask, **mistake)

    return fn


def _mha_wrong_length(query, key, value, q_proj, k_proj, v_proj, out_proj, num_heads, mask=None):
    B, T, D = query.shape

    def split(x):  # uses the query length T for keys and values too: fails when S != T
        return x.view(B, T, num_heads, D // num_heads).transpose(1, 2)

    context, weights = course_utils.scaled_dot_product_attention(split(q_proj(query)), split(k_proj(key)),
                                                                 split(v_proj(value)), mask)
    return out_proj(context.transpose(1, 2).reshape(B, T, D)), weights


def _mha_averaged(*args):
    out, weights = multihead.multi_head_attention(*args)
    return out, weights.mean(dim=1)


MHA_BUGS = [
    (_mha(bad_split=True), "scrambles tokens across heads"),
    (_mha(bad_merge=True), "without transposing back"),
    (_mha(scale_by_model_width=True), "scaled by sqrt(D) = sqrt(12), the model width"),
    (_mha(no_scale=True), "not scaled at all"),
    (_mha(no_out_proj=True), "output projection is missing"),
    (_mha_averaged, "averaged over the heads"),
    (_mha_wrong_length, "take their length from their own shape"),
    (lambda *args: multihead.multi_head_attention(*args[:-1], None), "the mask was ignored"),
]


@pytest.mark.parametrize(("buggy", "fragment"), MHA_BUGS)
def test_check_multi_head_attention_names_the_bug(buggy, fragment):
    with pytest.raises(CheckError) as err:
        check_multi_head_attention(buggy)
    assert fragment in str(err.value)


# Pieces of the exercises' solution code (notebook 05): a checker names the bug, it never prints these.
SOLUTION_CODE = ["view(B, T, H", "view(B, length", "transpose(1, 2)", ".reshape(", "permute(", ".contiguous(",
                 "merge_heads(", "split_heads(", "out_proj("]


def _merge_unknown_bug(x):
    return multihead.merge_heads(x) + 1.0  # no known mistake: the checker's fallback hint


def _mha_unknown_bug(*args):
    out, weights = multihead.multi_head_attention(*args)
    return out + 1.0, weights


@pytest.mark.parametrize(("checker", "buggy"),
                         [(check_split_heads, bug) for bug, _ in SPLIT_BUGS]
                         + [(check_split_heads, lambda x, H: x.view(H, -1))]  # raises: the error hint
                         + [(check_merge_heads, bug) for bug, _ in MERGE_BUGS + [(_merge_unknown_bug, "")]]
                         + [(check_multi_head_attention, bug) for bug, _ in MHA_BUGS + [(_mha_unknown_bug, "")]])
def test_multihead_checkers_print_no_solution_code(checker, buggy):
    with pytest.raises(CheckError) as err:
        checker(buggy)
    assert_no_answer_in(str(err.value), SOLUTION_CODE)


def _pe_layout(T, D, layout):
    p = torch.arange(T, dtype=torch.float32)[:, None]
    w = positional.frequencies(D)
    if layout == "halves":
        return torch.cat([torch.sin(p * w), torch.cos(p * w)], -1)
    if layout == "from one":
        return positional.sinusoidal_positional_encoding(T + 1, D)[1:]
    if layout == "swapped":
        return torch.stack([torch.cos(p * w), torch.sin(p * w)], -1).reshape(T, D)
    raise ValueError(layout)


PE_BUGS = [
    (lambda T, D: _pe_layout(T, D, "halves"), "'halves' layout"),
    (lambda T, D: _pe_layout(T, D, "from one"), "positions start at 1"),
    (lambda T, D: _pe_layout(T, D, "swapped"), "sin and cos are swapped"),
    (lambda T, D: positional.sinusoidal_positional_encoding(T, D).T, "rows are positions"),
    (lambda T, D: None, "got None"),
]


@pytest.mark.parametrize(("buggy", "fragment"), PE_BUGS)
def test_check_sinusoidal_positional_encoding_names_the_bug(buggy, fragment):
    with pytest.raises(CheckError) as err:
        check_sinusoidal_positional_encoding(buggy)
    assert fragment in str(err.value)
    assert_no_answer_in(str(err.value), ("::", "torch."))  # names the bug, prints no solution code


def _rotary_halves(x, positions=None):
    T, D = x.shape[-2:]
    pos = torch.arange(T) if positions is None else positions
    a = pos[:, None].float() * positional.frequencies(D)[None, :]
    first, second = x[..., : D // 2], x[..., D // 2:]
    return torch.cat([first * a.cos() - second * a.sin(), first * a.sin() + second * a.cos()], -1)


def _rotary_inplace(x, positions=None):
    x[..., 0] += 0.0
    x.mul_(1.0)
    x[0, 0, 0] = 1.0
    return positional.apply_rotary(x, positions)


def _rotary_angles_in_x_dtype(x, positions=None):
    T, D = x.shape[-2:]
    pos = torch.arange(T) if positions is None else positions
    a = pos[:, None].to(x.dtype) * positional.frequencies(D).to(x.dtype)[None, :]  # bfloat16 angles for bfloat16 x
    out = torch.empty_like(x)
    out[..., 0::2] = x[..., 0::2] * a.cos() - x[..., 1::2] * a.sin()
    out[..., 1::2] = x[..., 0::2] * a.sin() + x[..., 1::2] * a.cos()
    return out


def _rotary_float32_angles_cast_to_x_dtype(x, positions=None):
    T, D = x.shape[-2:]
    pos = torch.arange(T) if positions is None else positions
    a = (pos[:, None].float() * positional.frequencies(D)[None, :]).to(x.dtype)  # float32 angles, rounded to bfloat16
    out = torch.empty_like(x)
    out[..., 0::2] = x[..., 0::2] * a.cos() - x[..., 1::2] * a.sin()
    out[..., 1::2] = x[..., 0::2] * a.sin() + x[..., 1::2] * a.cos()
    return out


ROTARY_BUGS = [
    (lambda x, positions=None: positional.apply_rotary(x, None if positions is None else -positions)
     if positions is not None else positional.apply_rotary(x, -torch.arange(x.shape[-2])), "the wrong way"),
    (_rotary_halves, "'rotate half' layout"),
    (lambda x, positions=None: positional.apply_rotary(x), "the given positions were ignored"),
    (lambda x, positions=None: x, "the positions were ignored"),
    (_rotary_inplace, "changed x in place"),
    (_rotary_angles_in_x_dtype, "the angles were rounded to bfloat16 (x's dtype) before cos and sin"),
    (_rotary_float32_angles_cast_to_x_dtype, "the angles were rounded to bfloat16 (x's dtype) before cos and sin"),
]


@pytest.mark.parametrize(("buggy", "fragment"), ROTARY_BUGS)
def test_check_apply_rotary_names_the_bug(buggy, fragment):
    with pytest.raises(CheckError) as err:
        check_apply_rotary(buggy)
    assert fragment in str(err.value)
    assert_no_answer_in(str(err.value), ("::", "x'_"))  # names the bug, prints no solution formula


def test_rotate_half_layout_is_the_interleaved_one_up_to_a_fixed_permutation():
    """Notebook 06: pairs (m, m + D/2) (GPT-NeoX, LLaMA code) vs (2m, 2m + 1) (Su et al.)."""
    g = torch.Generator().manual_seed(0)
    T, D = 9, 16
    x, y = torch.randn(2, T, D, generator=g), torch.randn(2, T, D, generator=g)
    perm = torch.cat([torch.arange(0, D, 2), torch.arange(1, D, 2)])  # interleaved feature of each rotate-half slot
    positions = torch.tensor([0, 3, 1, 40, 7, 1000, 2, 5, 9])
    torch.testing.assert_close(_rotary_halves(x[..., perm], positions), positional.apply_rotary(x, positions)[..., perm],
                               atol=1e-6, rtol=0)
    scores = positional.apply_rotary(x) @ positional.apply_rotary(y).mT  # (2, T, T)
    torch.testing.assert_close(_rotary_halves(x[..., perm]) @ _rotary_halves(y[..., perm]).mT, scores, atol=1e-5, rtol=0)
    assert not torch.allclose(_rotary_halves(x) @ _rotary_halves(y).mT, scores, atol=1e-2)  # unpermuted: other scores


def test_rotary_angles_are_float32_whatever_the_dtype():
    x = torch.randn(2, 4, 8, generator=torch.Generator().manual_seed(0))
    far = torch.tensor([1000, 1001, 1002, 1003])  # bfloat16 rounds 1001 and 1002 to 1000
    out16 = positional.apply_rotary(x.bfloat16(), far)
    assert out16.dtype == torch.bfloat16
    torch.testing.assert_close(out16.float(), positional.apply_rotary(x, far), atol=0.05, rtol=0.02)
    assert not torch.allclose(_rotary_angles_in_x_dtype(x.bfloat16(), far).float(), positional.apply_rotary(x, far),
                              atol=0.05, rtol=0.02)


def test_to_rotate_half_is_hugging_faces_permute_and_keeps_the_scores():
    """Notebook 06, exercise 2: the reordering of transformers' convert_llama_weights_to_hf.permute."""
    g = torch.Generator().manual_seed(0)
    H, D, D_in, T = 4, 32, 20, 7
    Dh = D // H
    weight, k_weight = torch.randn(D, D_in, generator=g), torch.randn(D, D_in, generator=g)
    hf_permute = weight.view(H, Dh // 2, 2, D_in).transpose(1, 2).reshape(D, D_in)
    torch.testing.assert_close(positional.to_rotate_half(weight, H), hf_permute, atol=0, rtol=0)
    bias = torch.randn(D, generator=g)
    torch.testing.assert_close(positional.to_rotate_half(bias, H), bias.view(H, Dh // 2, 2).transpose(1, 2).reshape(D))
    x = torch.randn(2, T, D_in, generator=g)
    heads = lambda y: multihead.split_heads(y, H)  # noqa: E731
    before = positional.apply_rotary(heads(x @ weight.T)) @ positional.apply_rotary(heads(x @ k_weight.T)).mT
    after = (positional.apply_rotary_half(heads(x @ positional.to_rotate_half(weight, H).T))
             @ positional.apply_rotary_half(heads(x @ positional.to_rotate_half(k_weight, H).T)).mT)
    torch.testing.assert_close(after, before, atol=1e-4, rtol=1e-4)


def test_check_to_rotate_half_names_the_bug():
    def across(weight, num_heads):
        D = weight.shape[0]
        return weight[torch.cat([torch.arange(0, D, 2), torch.arange(1, D, 2)])]

    def inverse(weight, num_heads):
        Dh = weight.shape[0] // num_heads
        return weight.reshape(num_heads, 2, Dh // 2, *weight.shape[1:]).transpose(1, 2).reshape(weight.shape)

    for buggy, fragment in [(across, "across the whole width"), (inverse, "the other way"),
                            (lambda weight, num_heads: weight.clone(), "nothing was reordered")]:
        with pytest.raises(CheckError, match=fragment):
            check_to_rotate_half(buggy)


# --- the training experiments of notebooks 05 and 06 (short runs) ----------------


def test_rotary_attention_rotates_each_heads_queries_and_keys():
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 2, rotary=True)
    x = torch.randn(2, 5, 16)
    with torch.no_grad():
        out, weights = mha(x, return_weights=True)
        q = positional.apply_rotary(multihead.split_heads(mha.q_proj.linear(x), 2))  # (B, H, T, Dh)
        k = positional.apply_rotary(multihead.split_heads(mha.k_proj.linear(x), 2))
        v = multihead.split_heads(mha.v_proj(x), 2)
        expected_out, expected_weights = course_utils.scaled_dot_product_attention(q, k, v)
        torch.testing.assert_close(weights, expected_weights)
        torch.testing.assert_close(out, mha.out_proj(multihead.merge_heads(expected_out)))


def test_neighbour_task_and_model():
    config = neighbours.NeighbourConfig(steps=5, test_size=50)
    x, y = neighbours.make_neighbour_batch(config, 4, torch.Generator().manual_seed(0))
    assert y.shape == (4, config.T, 2)
    assert torch.equal(y[:, 3, 0], x[:, 2]) and torch.equal(y[:, 3, 1], x[:, 4])
    assert torch.equal(y[:, 0, 0], x[:, -1]) and torch.equal(y[:, -1, 1], x[:, 0])  # circular
    first = neighbours.train_neighbour_model(config, seed=0)
    again = neighbours.train_neighbour_model(config, seed=0)
    assert first.losses == again.losses and first.accuracy == again.accuracy
    logits, weights = first.model(x)
    assert logits.shape == (4, config.T, 2, config.V) and weights.shape == (4, 2, config.T, config.T)
    # no MLP after attention: the logits are an affine function of x + attended
    assert not any(isinstance(m, (nn.ReLU, nn.GELU, nn.LayerNorm)) for m in first.model.modules())
    offsets, profile = neighbours.head_offset_profile(first.model, config)
    assert offsets[0] == -6 and len(offsets) == 12 and profile.shape == (2, 12)
    torch.testing.assert_close(profile.sum(dim=1), torch.ones(2))  # each head's weights sum to 1 per query
    # notebook 05's single-head control: the same D, hence the same parameters, one weight pattern
    single = neighbours.train_neighbour_model(dataclasses.replace(config, num_heads=1), seed=0)
    assert sum(p.numel() for p in single.model.parameters()) == sum(p.numel() for p in first.model.parameters())
    _, weights = single.model(neighbours.neighbour_test_set(config, 0)[0])
    assert weights.shape == (config.test_size, 1, config.T, config.T)
    left, right = neighbours.neighbour_accuracy(first.model, config, 0, ablated_head=1)
    assert 0 <= left <= 1 and 0 <= right <= 1


def test_order_models_and_reversal_task():
    config = order.ReversalConfig(steps=3, test_size=20)
    x, y = order.make_reversal_batch(config, 5, torch.Generator().manual_seed(0))
    assert torch.equal(y, x.flip(-1)) and all(len(set(row.tolist())) == config.T for row in x)
    counts = {}
    for kind in order.POSITION_KINDS:
        result = order.train_order_model(config, positions=kind, seed=0)
        assert len(result.losses) == 3 and 0 <= result.accuracy <= 1
        assert len(result.position_accuracy) == config.T
        assert abs(sum(result.position_accuracy) / config.T - result.accuracy) < 1e-6
        assert isinstance(result.model, order.OrderModel) and not result.model.training
        counts[kind] = result.parameters
    # the learning rate is constant after the warm-up: a shorter run is a prefix of a longer one (notebook 06)
    longer = order.train_order_model(order.ReversalConfig(steps=6, warmup=2, test_size=20), positions="learned", seed=1)
    shorter = order.train_order_model(order.ReversalConfig(steps=4, warmup=2, test_size=20), positions="learned", seed=1)
    assert shorter.losses == longer.losses[:4]
    assert counts["learned"] == counts["sinusoidal"] + config.T * config.D
    with pytest.raises(InputError, match="positions must be one of"):
        order.OrderModel(config, "absolute")


def test_rotary_self_attention_is_notebook_05s_layer_with_rotary_projections():
    """Notebook 06 shows RotarySelfAttention; with the same weights it is MultiHeadAttention(rotary=True)."""
    torch.manual_seed(0)
    ours = order.RotarySelfAttention(16, 4)
    torch.manual_seed(0)
    theirs = MultiHeadAttention(16, 4, rotary=True)  # creates q, k, v, out in the same order
    x = torch.randn(2, 6, 16)
    with torch.no_grad():
        torch.testing.assert_close(ours(x, return_weights=True), theirs(x, return_weights=True), atol=0, rtol=0)


def test_two_block_order_model_and_the_model_class_argument():
    config = order.ReversalConfig(steps=3, test_size=20, num_layers=2)
    built = []

    def model_class(cfg, positions):
        built.append(positions)
        return order.OrderModel(cfg, positions)

    run = order.train_order_model(config, positions="rotary", seed=0, model_class=model_class)
    assert built == ["rotary"] and len(run.model.blocks) == 2
    assert all(isinstance(block.attention, order.RotarySelfAttention) for block in run.model.blocks)
    one = order.OrderModel(dataclasses.replace(config, num_layers=1), "rotary")
    per_block = sum(p.numel() for p in one.blocks[0].parameters())
    assert run.parameters == sum(p.numel() for p in one.parameters()) + per_block


def test_order_model_without_positions_is_equivariant():
    torch.manual_seed(0)
    model = order.OrderModel(order.ReversalConfig(), "none").eval()
    x = torch.randperm(16)[:12][None]
    perm = torch.randperm(12)
    with torch.no_grad():
        torch.testing.assert_close(model(x[:, perm]), model(x)[:, perm])


def test_copy_task_targets_and_the_causal_order_model():
    """Notebook 06's copy back: y[i] = x[i - back], no target before ``back``; query i sees keys 0 .. i only."""
    config = order.CopyConfig(steps=3, test_size=20)
    x, y = order.make_copy_batch(config, 5, 9, torch.Generator().manual_seed(0))
    assert x.shape == y.shape == (5, 9) and (y[:, : config.back] == order.IGNORE).all()
    assert torch.equal(y[:, config.back:], x[:, : 9 - config.back])
    for kind in ["none", "sinusoidal", "learned", "rotary"]:
        torch.manual_seed(0)
        model = order.OrderModel(config, kind).eval()
        long = torch.randint(config.V, (2, config.T_test))
        with torch.no_grad():  # causal: changing the last token changes no earlier output
            changed = long.clone()
            changed[:, -1] = (changed[:, -1] + 1) % config.V
            torch.testing.assert_close(model(changed)[:, :-1], model(long)[:, :-1])
            assert model(long).shape == (2, config.T_test, config.V)
    # the learned table has max_len rows; a run at length T leaves rows T .. max_len - 1 untouched
    run = order.train_copy_model(config, positions="learned", seed=0)
    torch.manual_seed(0)
    fresh = order.OrderModel(config, "learned")
    table, start = run.model.position_embedding.weight, fresh.position_embedding.weight
    assert table.shape == (config.max_len, config.D)
    torch.testing.assert_close(table[config.T:], start[config.T:], atol=0, rtol=0)
    assert not torch.equal(table[: config.T], start[: config.T])
    assert len(run.position_accuracy) == config.T_test and all(math.isnan(a) for a in run.position_accuracy[: config.back])
    assert 0 <= run.seen <= 1 and 0 <= run.unseen <= 1 and len(run.losses) == 3
    with pytest.raises(InputError, match="max_len"):
        order.OrderModel(dataclasses.replace(config, max_len=config.T - 1), "learned")


def test_show_matrix():
    from course_utils.experiments.plotting import show_matrix

    fig = show_matrix(positional.sinusoidal_positional_encoding(8, 4), "feature", "position")
    assert len(fig.axes) == 2
    with pytest.raises(ValueError, match="finite 2-D"):
        show_matrix(torch.zeros(2, 2, 2), "a", "b")


def test_every_public_name_of_the_attention_modules_imports_from_the_package():
    import importlib
    import inspect

    for name in ("blocks.attention", "blocks.masks", "blocks.multihead", "blocks.positional", "blocks.transformer",
                 "experiments.efficiency", "experiments.neighbours", "experiments.order", "experiments.deep_stacks"):
        module = importlib.import_module(f"course_utils.{name}")
        public = [n for n, obj in vars(module).items() if not n.startswith("_")
                  and ((inspect.isfunction(obj) or inspect.isclass(obj)) and obj.__module__ == module.__name__
                       or n.isupper())]
        for n in public:
            assert getattr(course_utils, n, None) is getattr(module, n), f"course_utils.{n} is missing"
            assert n in course_utils.__all__, f"{n} is missing from course_utils.__all__"
