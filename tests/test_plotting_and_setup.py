"""setup() makes runs repeatable; plotting returns Figures with the course's conventions."""

from __future__ import annotations

import random

import matplotlib
import numpy as np
import pytest
import torch
from matplotlib.figure import Figure

from course_utils import setup
from course_utils.experiments.plotting import ATTENTION_CMAP, show_attention


def _draws():
    return random.random(), float(np.random.rand()), torch.randn(3).tolist()


def test_setup_makes_draws_repeatable_and_seed_dependent():
    setup(seed=0)
    first = _draws()
    setup(seed=0)
    assert _draws() == first
    setup(seed=1)
    assert _draws() != first


def test_setup_fixes_threads_and_print_options():
    torch.set_num_threads(2)
    setup(seed=0, threads=1)
    assert torch.get_num_threads() == 1
    assert str(torch.tensor([1 / 3])) == "tensor([0.3333])"
    assert np.array2string(np.array([1 / 3])) == "[0.3333]"


def test_setup_loads_the_pinned_figure_style():
    matplotlib.rcParams["figure.dpi"] = 37
    setup()
    assert matplotlib.rcParams["figure.dpi"] == 100
    assert matplotlib.rcParams["image.cmap"] == "viridis"


@pytest.mark.parametrize(("kwargs", "fragment"), [({"seed": -1}, "non-negative int"), ({"seed": 1.5}, "non-negative int"),
                                                  ({"threads": 0}, "int >= 1")])
def test_setup_rejects_bad_arguments(kwargs, fragment):
    with pytest.raises(ValueError, match=fragment):
        setup(**kwargs)


def test_show_attention_follows_the_heatmap_conventions():
    setup()
    weights = torch.softmax(torch.randn(1, 3, 5), dim=-1)  # leading batch dim of size 1 is dropped
    fig = show_attention(weights, query_labels=list("abc"), key_labels=list("vwxyz"), title="t")
    assert isinstance(fig, Figure)
    heat, colourbar = fig.axes
    image = heat.images[0]
    assert image.get_clim() == (0.0, 1.0)  # fixed scale, comparable across figures
    assert image.get_cmap().name == ATTENTION_CMAP
    assert [t.get_text() for t in heat.get_yticklabels()] == list("abc")  # queries on y
    assert [t.get_text() for t in heat.get_xticklabels()] == list("vwxyz")  # keys on x
    assert heat.get_title() == "t"
    assert colourbar.get_ylabel() == "attention weight"
    np.testing.assert_allclose(image.get_array(), weights[0].numpy())


def test_show_attention_hatches_masked_cells_and_annotates_only_the_others():
    weights = torch.tensor([[1.0, 0.0, 0.0], [0.4, 0.6, 0.0]])
    causal = torch.tril(torch.ones(2, 3, dtype=torch.bool))
    fig = show_attention(weights, mask=causal)
    heat = fig.axes[0]
    hatched = sorted((round(p.get_x() + 0.5), round(p.get_y() + 0.5)) for p in heat.patches if p.get_hatch())
    assert hatched == [(1, 0), (2, 0), (2, 1)]  # (key j, query i) where the mask is False
    assert sorted(t.get_text() for t in heat.texts) == ["0.40", "0.60", "1.00"]
    padding = show_attention(weights, mask=torch.tensor([[True, True, False]]))  # (1, S) broadcasts over queries
    assert len([p for p in padding.axes[0].patches if p.get_hatch()]) == 2
    with pytest.raises(ValueError, match="must be boolean"):
        show_attention(weights, mask=causal.float())
    with pytest.raises(ValueError, match=r"does not broadcast to the weights' \(T, S\) = \(2, 3\)"):
        show_attention(weights, mask=torch.ones(3, 3, dtype=torch.bool))


def test_show_attention_draws_into_a_given_axes():
    fig = Figure()
    ax = fig.add_subplot()
    assert show_attention(torch.eye(3), ax=ax) is fig


@pytest.mark.parametrize(
    ("weights", "kwargs", "fragment"),
    [
        (torch.rand(2, 3, 4), {}, r"got \(2, 3, 4\): pick one with weights\[b\]"),
        (torch.full((2, 2), float("nan")), {}, "NaN or inf"),
        (torch.rand(2, 3), {"key_labels": ["a", "b"]}, "2 key labels for 3 columns"),
        (torch.rand(2, 3), {"query_labels": ["a"]}, "1 query labels for 2 rows"),
    ],
)
def test_show_attention_rejects_bad_input(weights, kwargs, fragment):
    with pytest.raises(ValueError, match=fragment):
        show_attention(weights, **kwargs)


def test_plot_accuracy_by_length_draws_one_line_per_model_in_percent():
    from course_utils.experiments.plotting import plot_accuracy_by_length

    fig = plot_accuracy_by_length({"plain": {3: 1.0, 10: 0.3, 20: 0.0}, "attention": {3: 1.0, 10: 1.0, 20: 0.99}},
                                  title="t", longest_training_length=20)
    (ax,) = fig.axes
    lines = [line for line in ax.get_lines() if line.get_label() in ("plain", "attention")]
    assert [line.get_label() for line in lines] == ["plain", "attention"]
    assert list(lines[0].get_ydata()) == [100.0, 30.0, 0.0]
    assert list(lines[1].get_xdata()) == [3, 10, 20]
    with pytest.raises(ValueError, match="fractions in"):
        plot_accuracy_by_length({"x": {3: 97.0}})
