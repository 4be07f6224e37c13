"""Notebooks 03 and 04: scaled dot-product attention against PyTorch, input errors, embeddings, the √Dk measurements."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import course_utils
from course_utils.blocks import attention, masks
from course_utils.experiments import embeddings, scaling
from course_utils.core.errors import InputError

# (B, H, T, S, Dk, Dv): several shapes, including T != S, Dk != Dv, size-1 dims
SHAPES = [(1, 1, 1, 1, 1, 1), (2, 3, 4, 5, 6, 7), (3, 1, 7, 2, 8, 3), (2, 4, 16, 16, 32, 32)]


def _qkv(B, H, T, S, Dk, Dv, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, H, T, Dk, generator=g), torch.randn(B, H, S, Dk, generator=g),
            torch.randn(B, H, S, Dv, generator=g))


def test_public_names_import_from_the_package():
    from course_utils import causal_mask, padding_mask, scaled_dot_product_attention  # noqa: F401

    assert scaled_dot_product_attention is attention.scaled_dot_product_attention
    assert course_utils.causal_mask(3).shape == (3, 3)
    assert course_utils.padding_mask(torch.tensor([2, 1]), 4).expand(2, 5, 4).shape == (2, 5, 4)


@pytest.mark.parametrize(("B", "H", "T", "S", "Dk", "Dv"), SHAPES)
def test_parity_with_torch_without_mask(B, H, T, S, Dk, Dv):
    q, k, v = _qkv(B, H, T, S, Dk, Dv)
    out, weights = attention.scaled_dot_product_attention(q, k, v)
    assert out.shape == (B, H, T, Dv) and weights.shape == (B, H, T, S)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v), atol=1e-6, rtol=0)
    torch.testing.assert_close(weights.sum(-1), torch.ones(B, H, T))


@pytest.mark.parametrize(("B", "H", "T", "S", "Dk", "Dv"), SHAPES)
def test_parity_with_torch_with_a_boolean_mask(B, H, T, S, Dk, Dv):
    q, k, v = _qkv(B, H, T, S, Dk, Dv, seed=1)
    g = torch.Generator().manual_seed(2)
    lengths = torch.randint(1, S + 1, (B,), generator=g)
    mask = masks.padding_mask(lengths, S)[:, None]  # (B, 1, 1, S), True = may attend
    out, weights = attention.scaled_dot_product_attention(q, k, v, mask)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=mask), atol=1e-6, rtol=0)
    assert (weights.masked_select(~mask.expand_as(weights)) == 0).all()


@pytest.mark.parametrize(("B", "H", "T", "S", "Dk", "Dv"), [s for s in SHAPES if s[2] == s[3]])
def test_parity_with_torch_causal(B, H, T, S, Dk, Dv):
    q, k, v = _qkv(B, H, T, S, Dk, Dv, seed=3)
    out, weights = attention.scaled_dot_product_attention(q, k, v, masks.causal_mask(T))
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, is_causal=True), atol=1e-6, rtol=0)
    assert (weights.triu(diagonal=1) == 0).all()


def test_explicit_scale_matches_torch():
    q, k, v = _qkv(2, 2, 3, 4, 5, 6, seed=4)
    out, _ = attention.scaled_dot_product_attention(q, k, v, scale=0.3)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, scale=0.3), atol=1e-6, rtol=0)


def test_causality_future_keys_do_not_change_earlier_outputs():
    q, k, v = _qkv(1, 1, 6, 6, 4, 4, seed=5)
    out, _ = attention.scaled_dot_product_attention(q, k, v, masks.causal_mask(6))
    k2, v2 = k.clone(), v.clone()
    k2[..., 4:, :] += 10.0
    v2[..., 4:, :] -= 5.0
    out2, _ = attention.scaled_dot_product_attention(q, k2, v2, masks.causal_mask(6))
    torch.testing.assert_close(out[..., :4, :], out2[..., :4, :])
    assert not torch.allclose(out[..., 4:, :], out2[..., 4:, :])


def test_permutation_equivariance_without_positions():
    g = torch.Generator().manual_seed(6)
    x = torch.randn(2, 5, 8, generator=g)
    perm = torch.tensor([3, 0, 4, 1, 2])
    out, _ = attention.scaled_dot_product_attention(x, x, x)
    out_perm, _ = attention.scaled_dot_product_attention(x[:, perm], x[:, perm], x[:, perm])
    torch.testing.assert_close(out_perm, out[:, perm])


def test_fully_masked_query_gets_zero_output_like_torch():
    q, k, v = _qkv(1, 1, 2, 3, 4, 4, seed=7)
    mask = torch.tensor([[False, False, False], [True, True, False]])
    out, weights = attention.scaled_dot_product_attention(q, k, v, mask)
    assert torch.isfinite(out).all() and (out[..., 0, :] == 0).all() and (weights[..., 0, :] == 0).all()
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=mask), atol=1e-6, rtol=0)


def test_what_torch_returns_for_a_fully_masked_query():
    """Notebook 03, section 8 states this for the pinned torch; a new torch that changes it must change the text."""
    q, k, v = _qkv(1, 1, 2, 3, 4, 4, seed=7)
    q, k, v = q[0], k[0], v[0]  # (1, T, D), (1, S, D): one batch, no head axis
    mask = torch.tensor([[False, False, False], [True, True, False]])  # True = may attend
    fused = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert (fused[:, 0] == 0).all()  # zeros, not NaN
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(4, num_heads=1, batch_first=True)
    with torch.no_grad():
        torch.nn.init.normal_(mha.out_proj.bias)
        out, weights = mha(q, k, v, attn_mask=~mask)  # its bool mask: True = ignore
        fast, _ = mha(q, k, v, attn_mask=~mask, need_weights=False)
    assert out[0, 0].isnan().all() and weights[0, 0].isnan().all()  # need_weights=True (default): NaN
    assert torch.equal(fast[0, 0], mha.out_proj.bias)  # need_weights=False: zero attention, so out_proj's bias
    torch.testing.assert_close(fast[0, 1], out[0, 1])


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        ((None, torch.zeros(2, 3), torch.zeros(2, 3)), "expects q to be a tensor of shape (..., T, Dk), got None"),
        ((torch.zeros(3), torch.zeros(2, 3), torch.zeros(2, 3)), "at least 2 dimensions"),
        ((torch.zeros(2, 3, dtype=torch.long), torch.zeros(2, 3), torch.zeros(2, 3)), "expects float q"),
        ((torch.zeros(2, 3), torch.zeros(2, 4), torch.zeros(2, 3)), "the same width Dk"),
        ((torch.zeros(2, 3), torch.zeros(4, 3), torch.zeros(5, 3)), "the same length S"),
        ((torch.full((2, 3), float("nan")), torch.zeros(2, 3), torch.zeros(2, 3)), "q contains NaN"),
        ((torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2, 3, dtype=torch.float64)), "share a dtype"),
        ((torch.zeros(2, 2, 3), torch.zeros(3, 2, 3), torch.zeros(3, 2, 3)), "leading (batch/head) dimensions"),
        ((torch.zeros(2, 3), torch.zeros(4, 3), torch.zeros(4, 3), torch.ones(2, 4)), "mask must be bool"),
        ((torch.zeros(2, 3), torch.zeros(4, 3), torch.zeros(4, 3), torch.ones(4, 2, dtype=torch.bool)),
         "does not broadcast to the scores' shape (2, 4)"),
    ],
)
def test_bad_inputs_get_a_clear_message(args, fragment):
    with pytest.raises(InputError) as err:
        attention.scaled_dot_product_attention(*args)
    assert fragment in str(err.value)


def test_attention_entropy_limits():
    uniform = torch.full((2, 3, 8), 1 / 8)
    one_hot = F.one_hot(torch.tensor([[1, 0, 2]]), 4).float()
    torch.testing.assert_close(attention.attention_entropy(uniform), torch.full((2, 3), math.log(8)))
    assert (attention.attention_entropy(one_hot) == 0).all()


def test_scaled_scores_use_the_head_width():
    q, k, _ = _qkv(2, 4, 3, 5, 6, 6, seed=8)
    torch.testing.assert_close(attention.scaled_scores(q, k), torch.einsum("bhtd,bhsd->bhts", q, k) / math.sqrt(6))


# --- embeddings (notebook 03) --------------------------------------------------


@pytest.fixture(scope="module")
def vectors():
    return embeddings.train_word2vec(embeddings.load_corpus(), embeddings.Word2VecConfig(epochs=5))


def test_corpus_ships_offline_and_training_is_reproducible(vectors):
    corpus = embeddings.load_corpus()
    assert len(corpus) == 300 and 50_000 < sum(map(len, corpus)) < 70_000
    again = embeddings.train_word2vec(corpus, embeddings.Word2VecConfig(epochs=5))
    assert vectors.index_to_key == again.index_to_key
    assert (vectors.vectors == again.vectors).all()


def test_sentence_matrix_and_its_errors(vectors):
    X = embeddings.sentence_matrix(vectors, "police said the fire")
    assert X.shape == (4, 32) and X.dtype == torch.float32
    torch.testing.assert_close(X[3], torch.tensor(vectors["fire"]))
    with pytest.raises(InputError, match=r"not in the vocabulary of \d+ words: \['zyzzyva'\]"):
        embeddings.sentence_matrix(vectors, "the zyzzyva")
    with pytest.raises(InputError, match="empty"):
        embeddings.sentence_matrix(vectors, [])
    with pytest.raises(InputError, match="available offline: .*lee_background.cor"):
        embeddings.load_corpus("no_such_corpus.cor")


def test_word2vec_text_format_round_trip(vectors, tmp_path):
    from gensim.models import KeyedVectors

    path = tmp_path / "vectors.txt"
    vectors.save_word2vec_format(str(path), binary=False)
    loaded = KeyedVectors.load_word2vec_format(str(path), binary=False)
    assert loaded.index_to_key == vectors.index_to_key
    assert abs(loaded["fire"] - vectors["fire"]).max() < 1e-5


# --- the √Dk measurements (notebook 04) -----------------------------------------


def test_score_variance_grows_like_dk():
    variance = scaling.score_variance([4, 16, 64, 256], n_pairs=20_000)
    assert 0.95 < scaling.fit_slope(list(variance), list(variance.values())) < 1.05
    assert 0.95 < scaling.fit_slope(list(variance), list(variance.values()), log=True) < 1.05


def test_fit_slope_recovers_a_known_slope():
    assert scaling.fit_slope([1, 2, 3], [5, 7, 9]) == pytest.approx(2.0)
    assert scaling.fit_slope([1, 10, 100], [3, 300, 30_000], log=True) == pytest.approx(2.0)


def test_unscaled_softmax_saturates_and_the_right_key_loses_its_gradient():
    sat = scaling.softmax_saturation([4, 64, 1024], num_queries=128)
    assert sat.Dks == [4, 64, 1024] and sat.S == 16
    assert sat.entropy["unscaled"][0] > sat.entropy["unscaled"][1] > sat.entropy["unscaled"][2]
    assert sat.score_gap["unscaled"][-1] > 10 > 0.5 > max(sat.score_gap["scaled"])  # gaps grow like sqrt(Dk) unscaled
    assert sat.max_weight["unscaled"][-1] > 0.9 and max(sat.max_weight["scaled"]) < 0.35
    assert max(sat.entropy["scaled"]) - min(sat.entropy["scaled"]) < 0.1  # scaled: the same at every Dk
    assert sat.grad_norm["unscaled"][-1] < 0.25 * sat.grad_norm["scaled"][-1]  # dL/de shrinks ...
    assert sat.grad_query["unscaled"][-1] > 3 * sat.grad_query["scaled"][-1]  # ... dL/dq grows, on average ...
    assert sat.grad_query_median["unscaled"][-1] < 0.01 * sat.grad_query["unscaled"][-1]  # ... from a few queries
    assert sat.split_grad_share["unscaled"][-1] > 0.9 > 0.5 > sat.split_fraction["unscaled"][-1]
    assert sat.right_weight["unscaled"][-1] < 1e-10 < 0.03 < min(sat.right_weight["scaled"])


def test_the_right_keys_score_gradient_is_minus_2_loss_times_its_weight():
    g = torch.Generator().manual_seed(0)
    q = torch.randn(32, dtype=torch.float64, generator=g)
    k = torch.randn(8, 32, dtype=torch.float64, generator=g)
    v = torch.randn(8, 5, dtype=torch.float64, generator=g)
    scores = (k @ q / 32**0.5).requires_grad_(True)  # (S,)
    w = torch.softmax(scores, dim=-1)
    loss = 0.5 * ((w @ v - v[3]) ** 2).sum()  # j* = 3, the loss softmax_saturation uses
    loss.backward()
    torch.testing.assert_close(scores.grad[3], -2 * loss.detach() * w[3].detach())


def test_for_any_loss_a_keys_score_gradient_is_its_weight_times_a_bracket():
    """dL/de_j = w_j (g·v_j - g·z) with g = dL/dz, e.g. for a cross-entropy, where -2 L w_j does not hold."""
    g = torch.Generator().manual_seed(1)
    k = torch.randn(8, 32, dtype=torch.float64, generator=g)
    q = torch.randn(32, dtype=torch.float64, generator=g)
    v = torch.randn(8, 5, dtype=torch.float64, generator=g)
    classifier = torch.randn(7, 5, dtype=torch.float64, generator=g)
    scores = (k @ q / 32**0.5).requires_grad_(True)  # (S,)
    w = torch.softmax(scores, dim=-1)
    out = w @ v  # (Dv,)
    out.retain_grad()
    loss = torch.nn.functional.cross_entropy((classifier @ out)[None], torch.tensor([2]))
    loss.backward()
    bracket = out.grad @ v.T - out.grad @ out.detach()  # (S,): g·v_j - g·z
    torch.testing.assert_close(scores.grad, w.detach() * bracket, rtol=1e-12, atol=0.0)
    assert not torch.allclose(scores.grad[3], -2 * loss.detach() * w[3].detach(), rtol=0.1)


def test_self_attention_diagonal_mean_grows_with_the_correlation_of_the_projections():
    independent, tied = scaling.self_attention_diagonal([64], rhos=[0.0, 1.0], num_sentences=50)
    assert abs(independent.diagonal_mean) < 0.1 and abs(tied.diagonal_mean - 1) < 0.1
    assert independent.self_weight < 0.1 < 0.9 < tied.self_weight
    assert 0.85 < independent.off_diagonal_variance < 1.15 and 0.85 < tied.off_diagonal_variance < 1.2


def test_steps_to_learn():
    assert scaling.steps_to_learn([5.0] * 10 + [0.5] * 10, threshold=1.0, window=10) == 19  # 5 + 9 * 0.5 < 10
    assert scaling.steps_to_learn([5.0] * 30) is None
    assert scaling.steps_to_learn([0.1] * 10) == 10


def test_recall_training_is_reproducible_and_the_scale_is_the_only_difference():
    config = scaling.RecallConfig(steps=20, test_size=200)
    first = scaling.train_recall(config, scaled=True, seed=0)
    again = scaling.train_recall(config, scaled=True, seed=0)
    assert first == again
    assert scaling.train_recall(config, seed=0, scale=1 / math.sqrt(config.Dk)) == first  # scale= overrides
    torch.manual_seed(0)
    scaled = scaling.RecallModel(config, scale=1 / math.sqrt(config.Dk))
    torch.manual_seed(0)
    unscaled = scaling.RecallModel(config, scale=1.0)
    for a, b in zip(scaled.state_dict().values(), unscaled.state_dict().values()):
        assert torch.equal(a, b)  # same initial weights
    g = torch.Generator().manual_seed(1)
    keys, values, query, target = scaling.make_recall_batch(config, 8, g)
    assert (keys.sort(dim=1).values.diff(dim=1) > 0).all()  # distinct keys in a row
    assert ((keys == query[:, None]).sum(1) == 1).all()  # the query is one of them
    assert torch.equal(values[keys == query[:, None]], target)  # the target is the value stored under it
    logits, weights = scaled(keys, values, query, return_weights=True)
    assert logits.shape == (8, config.num_values) and weights.shape == (8, 1, config.num_pairs)


def test_scaled_recall_learns_and_unscaled_lags():
    config = scaling.RecallConfig(Dk=256, test_size=500)
    scaled = scaling.train_recall(config, scaled=True, seed=0)
    unscaled = scaling.train_recall(config, scaled=False, seed=0)
    assert scaled.accuracy >= 0.9 and unscaled.accuracy <= scaled.accuracy - 0.3
    assert unscaled.initial.max_weight > 0.8 > 0.2 > scaled.initial.max_weight
    assert scaling.steps_to_learn(scaled.losses) is not None and scaling.steps_to_learn(unscaled.losses) is None
    assert scaled.final.right_weight > 0.8 and scaled.final.score_std > 5 * scaled.initial.score_std
    assert scaled.final.query_norm > scaled.initial.query_norm and scaled.final.key_norm > scaled.initial.key_norm


def test_line_plots_and_their_errors():
    from course_utils.experiments.plotting import plot_lines, plot_saturation

    fig = plot_lines([1, 2, 4], {"a": [1, 2, 3], "b": [3, 2, 1]}, "x", "y", logx=True, reference=("ref", [1, 1, 1]))
    (ax,) = fig.axes
    assert len(ax.lines) == 3 and ax.get_xscale() == "log"
    with pytest.raises(ValueError, match="has 2 values for 3 x values"):
        plot_lines([1, 2, 3], {"a": [1, 2]}, "x", "y")
    with pytest.raises(ValueError, match="NaN"):
        plot_lines([1, 2], {"a": [1, float("nan")]}, "x", "y")
    fig = plot_saturation(scaling.softmax_saturation([4, 16], num_queries=16))
    assert len(fig.axes) == 3
