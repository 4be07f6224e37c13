"""The lecture's attention explorer (course_utils.experiments.explorer, notebook 05).

The weights function against the course's attention and ``torch.softmax``;
every control of the widget changes the figure the way it should; the display
bundle (live widget, still PNG, fixed text); the error messages.
"""

from __future__ import annotations

import base64
import math
import re

import pytest
import torch
from torch.testing import assert_close

from course_utils.blocks.attention import attention_entropy, scaled_dot_product_attention
from course_utils.blocks.masks import causal_mask
from course_utils.blocks.multihead import MultiHeadAttention, split_heads
from course_utils.core.errors import InputError
from course_utils.experiments.explorer import (
    ExplorerSettings,
    attention_explorer,
    explorer_figure,
    explorer_mask,
    explorer_weights,
)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _qk(T: int, S: int, D: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(T, D, generator=g), torch.randn(S, D, generator=g)


def _shown(explorer) -> list[torch.Tensor]:
    """The weights each visible heatmap of the explorer's current figure draws, left to right."""
    return [torch.from_numpy(ax.images[0].get_array().data).float() for ax in explorer.figure.axes
            if ax.get_visible() and ax.images and ax.get_label() != "<colorbar>"]


def _titles(explorer) -> str:
    return " ".join(ax.get_title() for ax in explorer.figure.axes) + " " + explorer.figure.get_suptitle()


# --- the weights: a plain function, checked against the references -----------------------------------


@pytest.mark.parametrize("T, S, D, H", [(5, 7, 8, 2), (4, 4, 12, 3), (3, 6, 16, 1), (6, 6, 32, 4)])
@pytest.mark.parametrize("temperature", [None, 0.3, 2.5])
def test_weights_match_the_course_attention_and_torch_softmax(T, S, D, H, temperature):
    q, k = _qk(T, S, D, seed=T * S + D)
    Dk = D // H
    q_heads, k_heads = split_heads(q[None], H)[0], split_heads(k[None], H)[0]  # (H, T, Dk), (H, S, Dk)
    divisor = math.sqrt(Dk) if temperature is None else temperature  # tau is the whole divisor, as in 03-04
    for mask in (None, causal_mask(T, S), torch.arange(S)[None, :] < S - 2):  # none, causal, padding (1, S)
        weights = explorer_weights(q, k, H, temperature, mask)
        assert weights.shape == (H, T, S)
        _, reference = scaled_dot_product_attention(q_heads, k_heads, k_heads, mask, scale=1.0 / divisor)
        assert_close(weights, reference)
        scores = torch.einsum("htd,hsd->hts", q_heads, k_heads) / divisor  # (H, T, S)
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        assert_close(weights, torch.softmax(scores, dim=-1))


def test_at_the_default_temperature_sqrt_dk_the_weights_are_the_modules():
    torch.manual_seed(0)
    mha = MultiHeadAttention(24, 3)
    x = torch.randn(1, 7, 24)
    with torch.no_grad():
        _, used = mha(x, return_weights=True)  # (1, H, T, T)
        assert_close(explorer_weights(mha.q_proj(x[0]), mha.k_proj(x[0]), 3), used[0])
        assert_close(explorer_weights(mha.q_proj(x[0]), mha.k_proj(x[0]), 3, mask=causal_mask(7)),
                     mha(x, mask=causal_mask(7), return_weights=True)[1][0])


def test_the_default_temperature_is_sqrt_dk_and_one_drops_the_scale():
    q, k = _qk(5, 5, 64)
    H = 1  # Dk = 64, sqrt = 8
    assert_close(explorer_weights(q, k, H), explorer_weights(q, k, H, temperature=8.0))
    unscaled = torch.softmax(q @ k.T, dim=-1)[None]  # (1, T, S): the scores divided by nothing
    assert_close(explorer_weights(q, k, H, temperature=1.0), unscaled)
    assert not torch.allclose(explorer_weights(q, k, H, temperature=1.0), explorer_weights(q, k, H))


def test_masks():
    assert explorer_mask("none", 4, 5) is None
    assert torch.equal(explorer_mask("causal", 4, 5), torch.ones(4, 5, dtype=torch.bool).tril())
    padding = explorer_mask("padding", 4, 5, padding=2)
    assert padding.shape == (1, 5) and padding.tolist() == [[True, True, True, False, False]]


# --- the widget: every control changes the figure the way it should ------------------------------------


Q, K = _qk(6, 6, 8, seed=3)  # the explorer's sequence: T = S = 6, D = 8, two heads of width 4


@pytest.fixture
def explorer():
    return attention_explorer(Q, K, 2, [f"t{i}" for i in range(6)], settings=ExplorerSettings(padding=2))


def test_the_first_figure_shows_head_0_at_temperature_sqrt_dk_with_its_entropy_in_the_title(explorer):
    weights = explorer_weights(Q, K, 2)
    [shown] = _shown(explorer)
    assert_close(shown, weights[0])
    assert f"row entropy {attention_entropy(weights[0]).mean():.2f} nats" in _titles(explorer)
    assert f"largest weight {weights[0].max(dim=-1).values.mean():.2f}" in _titles(explorer)
    assert bytes(explorer.image.value).startswith(PNG_SIGNATURE)
    assert explorer.temperature.value == pytest.approx(2.0) and "τ = 2.00 (√D_k = 2)" in _titles(explorer)


def test_a_higher_temperature_raises_the_entropy_of_every_row(explorer):
    before, png = _shown(explorer)[0], bytes(explorer.image.value)
    explorer.temperature.value = 4.0
    after = _shown(explorer)[0]
    assert_close(after, explorer_weights(Q, K, 2, temperature=4.0)[0])
    assert (attention_entropy(after) > attention_entropy(before)).all()
    assert f"row entropy {attention_entropy(after).mean():.2f} nats" in _titles(explorer)
    assert explorer.image.value != png, "the image widget shows the new figure"


def test_a_temperature_of_one_drops_the_scale_and_sharpens_every_row(explorer):
    before, png = _shown(explorer)[0], bytes(explorer.image.value)
    explorer.temperature.value = 1.0
    after = _shown(explorer)[0]
    assert_close(after, explorer_weights(Q, K, 2, temperature=1.0)[0])
    assert (attention_entropy(after) < attention_entropy(before)).all()
    assert "τ = 1.00" in _titles(explorer) and explorer.image.value != png


def test_the_head_control_picks_that_heads_weights_or_all_of_them(explorer):
    weights = explorer_weights(Q, K, 2)
    explorer.head.value = 1
    [shown] = _shown(explorer)
    assert_close(shown, weights[1])
    assert "head 1" in _titles(explorer)
    explorer.head.value = "all"
    panels = _shown(explorer)
    assert len(panels) == 2
    assert_close(panels[0], weights[0])
    assert_close(panels[1], weights[1])


def test_the_causal_mask_zeroes_and_hatches_the_upper_triangle(explorer):
    explorer.mask.value = "causal"
    [shown] = _shown(explorer)
    future = ~causal_mask(6)
    assert shown[future].abs().max() == 0 and shown[~future].min() > 0
    assert_close(shown.sum(dim=-1), torch.ones(6))
    assert_close(shown, explorer_weights(Q, K, 2, mask=causal_mask(6))[0])
    hatched = [p for p in explorer.figure.axes[0].patches if p.get_hatch()]
    assert len(hatched) == int(future.sum()), "every masked cell is hatched"


def test_the_padding_mask_hides_the_last_keys(explorer):
    explorer.mask.value = "padding"
    [shown] = _shown(explorer)
    assert shown[:, -2:].abs().max() == 0 and shown[:, :-2].min() > 0
    assert_close(shown.sum(dim=-1), torch.ones(6))
    assert explorer.mask.label == "padding: last 2 key(s)" and "mask: padding, the last 2 key(s)" in _titles(explorer)


def test_the_display_bundle_holds_the_widget_a_still_png_and_a_fixed_text(explorer):
    bundle = explorer._repr_mimebundle_()
    assert bundle["application/vnd.jupyter.widget-view+json"]["model_id"] == explorer.model_id
    assert base64.b64decode(bundle["image/png"]) == bytes(explorer.image.value)
    assert bundle["text/plain"] == "attention explorer: 2 heads, 6 queries, 6 keys (run the notebook to use its controls)"
    explorer.temperature.value = 0.5
    later = explorer._repr_mimebundle_()
    assert later["text/plain"] == bundle["text/plain"], "nbval compares this text: it must not depend on the state"
    assert later["image/png"] != bundle["image/png"], "the still shows the figure at the time of display"


# --- bad input: clear errors --------------------------------------------------------------------------


@pytest.mark.parametrize("q_shape, k_shape, H, message", [
    ((1, 6, 8), (6, 8), 2, "one sequence: q must be (T, D).*got shape (1, 6, 8): pick one sequence, e.g. q[0]"),
    ((6, 8), (8,), 2, "k must be (S, D)"),
    ((6, 8), (6, 4), 2, "the same width Dk"),
    ((6, 10), (6, 10), 4, "divides the width D = 10 .* got 4.*one of [1, 2, 5, 10]"),
    ((6, 8), (6, 8), 0, "num_heads = H must be a positive int"),
])
def test_bad_shapes_and_head_counts_are_rejected_with_a_clear_message(q_shape, k_shape, H, message):
    q, k = torch.randn(q_shape), torch.randn(k_shape)
    for build in (lambda: explorer_weights(q, k, H), lambda: attention_explorer(q, k, H)):
        with pytest.raises(InputError, match=re.escape(message).replace(r"\.\*", ".*")):
            build()


@pytest.mark.parametrize("settings, message", [
    (ExplorerSettings(head=2), "head must be 0 .. H - 1 = 1 (heads are counted from 0) or 'all', got 2"),
    (ExplorerSettings(head=-1), "head must be 0 .. H - 1 = 1"),
    (ExplorerSettings(temperature=0.0), "must be a positive number, got 0.0"),
    (ExplorerSettings(temperature=50.0), "the slider's temperature runs from 0.1 to 31.6228, got an initial 50.0"),
    (ExplorerSettings(mask="future"), "mask must be one of ('none', 'causal', 'padding'), got 'future'"),
    (ExplorerSettings(mask="padding", padding=6), "hides the last 1 .. S - 1 = 5 keys"),
])
def test_bad_settings_are_rejected_with_a_clear_message(settings, message):
    q, k = _qk(6, 6, 8)
    with pytest.raises(InputError, match=re.escape(message)):
        attention_explorer(q, k, 2, settings=settings)


def test_labels_must_match_the_queries_and_keys():
    q, k = _qk(4, 5, 8)
    with pytest.raises(InputError, match=re.escape("3 query labels for 4 queries: give one label per query")):
        explorer_figure(q, k, 2, query_labels=["a", "b", "c"])
    with pytest.raises(InputError, match=re.escape("4 key labels for 5 keys")):
        attention_explorer(q, k, 2, query_labels=list("abcd"), key_labels=list("abcd"))
