"""Figures for the course. Every function returns a matplotlib Figure.

Figures are built with ``matplotlib.figure.Figure`` rather than pyplot, so a
notebook shows a figure exactly once: when it is the last expression of a
cell. Assign it (``fig = show_attention(...)``) to keep it without showing it.
Style (sizes, colours) comes from the pinned ``matplotlibrc`` that
``course_utils.setup()`` loads.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from matplotlib.ticker import MaxNLocator

# Colour-blind-safe sequential map; the same fixed [0, 1] scale in every heatmap.
ATTENTION_CMAP = "viridis"


def _as_matrix(weights: Any) -> np.ndarray:
    if isinstance(weights, torch.Tensor):
        weights = weights.detach().cpu().float().numpy()
    array = np.asarray(weights, dtype=float)
    while array.ndim > 2 and array.shape[0] == 1:
        array = array[0]
    if array.ndim != 2:
        raise ValueError(
            f"show_attention expects weights of shape (T, S) for one example and one head, got {array.shape}: "
            "pick one with weights[b] (and weights[b, h] for several heads)"
        )
    if not np.isfinite(array).all():
        raise ValueError("show_attention got NaN or inf weights: check the masked softmax (fully-masked rows?)")
    return array


def show_attention(
    weights: Any,
    query_labels: Sequence[str] | None = None,
    key_labels: Sequence[str] | None = None,
    title: str | None = None,
    ax: Axes | None = None,
    annotate: bool | None = None,
    mask: Any = None,
    colorbar: bool = True,
) -> Figure:
    """Heatmap of attention weights: queries on the y-axis, keys on the x-axis.

    The colour scale is fixed to [0, 1] (weights are probabilities) so that
    two heatmaps can be compared by eye. Masked cells are hatched, so that a
    key that may not be attended is not mistaken for a small weight.

    Args:
        weights: (T, S) tensor or array (leading size-1 dims are dropped),
            ``weights[i, j]`` = weight of key j for query i.
        query_labels: T labels for the rows (tokens or positions).
        key_labels: S labels for the columns.
        title: Axes title.
        ax: Draw into this Axes instead of a new Figure.
        annotate: Write each weight in its cell (default: when T, S <= 8).
        mask: Optional boolean mask, True = may attend, broadcastable to
            (T, S) (e.g. (1, S) for padding, (T, S) for causal); the cells
            where it is False are hatched and left unannotated.
        colorbar: Draw a labelled colourbar beside the heatmap; pass False for
            panels that share one (``fig.colorbar(ax.images[0], ax=axes)``).

    Returns:
        The Figure holding the heatmap.

    Raises:
        ValueError: If the weights are not 2-D, not finite, the labels do
            not match their number of rows/columns, or the mask does not
            broadcast to (T, S).
    """
    matrix = _as_matrix(weights)
    T, S = matrix.shape
    allowed = np.ones((T, S), dtype=bool)
    if mask is not None:
        mask_array = mask.detach().cpu().numpy() if isinstance(mask, torch.Tensor) else np.asarray(mask)
        while mask_array.ndim > 2 and mask_array.shape[0] == 1:
            mask_array = mask_array[0]
        if mask_array.dtype != bool:
            raise ValueError(f"show_attention: mask must be boolean (True = may attend), got {mask_array.dtype}")
        try:
            allowed = np.broadcast_to(mask_array, (T, S))
        except ValueError:
            raise ValueError(
                f"show_attention: a mask of shape {mask_array.shape} does not broadcast to the weights' (T, S) = "
                f"{(T, S)}: pass the mask of this one example (and head)"
            ) from None
    if query_labels is not None and len(query_labels) != T:
        raise ValueError(f"{len(query_labels)} query labels for {T} rows (queries): give one label per query")
    if key_labels is not None and len(key_labels) != S:
        raise ValueError(f"{len(key_labels)} key labels for {S} columns (keys): give one label per key")
    if ax is None:
        fig = Figure(figsize=(1.6 + 0.55 * max(S, 4), 1.0 + 0.5 * max(T, 3)))
        ax = fig.add_subplot()
    else:
        fig = ax.figure
    image = ax.imshow(matrix, cmap=ATTENTION_CMAP, vmin=0.0, vmax=1.0, aspect="auto")
    ax.set_xticks(range(S), list(key_labels) if key_labels is not None else range(S),
                  rotation=90 if key_labels is not None and max(len(str(k)) for k in key_labels) > 3 else 0)
    ax.set_yticks(range(T), list(query_labels) if query_labels is not None else range(T))
    ax.set_xlabel("keys (j)")
    ax.set_ylabel("queries (i)")
    if title:
        ax.set_title(title)
    if annotate is None:
        annotate = T <= 8 and S <= 8
    for i, j in zip(*np.nonzero(~allowed)):
        ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, facecolor="white", edgecolor="0.55", hatch="///",
                               linewidth=0))
    if annotate:
        for i in range(T):
            for j in range(S):
                if allowed[i, j]:
                    colour = "black" if matrix[i, j] > 0.6 else "white"
                    ax.text(j, i, f"{matrix[i, j]:.2f}", ha="center", va="center", fontsize=8, color=colour)
    if colorbar:
        fig.colorbar(image, ax=ax, label="attention weight", fraction=0.05)
    return fig


def plot_accuracy_by_length(
    curves: Mapping[str, Mapping[int, float]],
    title: str | None = None,
    longest_training_length: int | None = None,
    colours: Mapping[str, str] | None = None,
) -> Figure:
    """Exact-match accuracy against source length, one line per model (notebooks 01 and 02).

    Args:
        curves: ``{label: {source_length: accuracy in [0, 1]}}``.
        title: Axes title.
        longest_training_length: Draw a dotted vertical line there.
        colours: ``{label: matplotlib colour}``, so that a model keeps its colour from figure to figure
            (01 and 02: the plain model at notebook 01's budget is ``"C0"``, the attention model ``"C3"``);
            default: matplotlib's cycle, in the order of ``curves``.

    Returns:
        The Figure.

    Raises:
        ValueError: If a curve is empty or an accuracy is outside [0, 1].
    """
    fig = Figure(figsize=(6.0, 3.6))
    ax = fig.add_subplot()
    markers = "os^D"
    for i, (label, accuracy) in enumerate(curves.items()):
        if not accuracy:
            raise ValueError(f"curve {label!r} is empty")
        lengths = sorted(accuracy)
        values = [accuracy[n] for n in lengths]
        if not all(0.0 <= v <= 1.0 for v in values):
            raise ValueError(f"curve {label!r}: accuracies must be fractions in [0, 1]")
        colour = (colours or {}).get(label, f"C{i}")
        ax.plot(lengths, [100 * v for v in values], marker=markers[i % len(markers)], markersize=4, label=label,
                color=colour)
    if longest_training_length is not None:
        ax.axvline(longest_training_length, color="grey", linestyle=":", linewidth=1)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("source length (tokens)")
    ax.set_ylabel("exact match (%)")
    ax.set_ylim(-3, 103)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower left")
    if title:
        ax.set_title(title)
    return fig


def plot_lines(
    x: Sequence[float],
    curves: Mapping[str, Sequence[float]],
    xlabel: str,
    ylabel: str,
    title: str | None = None,
    logx: bool = False,
    logy: bool = False,
    reference: tuple[str, Sequence[float]] | None = None,
    ax: Axes | None = None,
) -> Figure:
    """Line plot of several measured curves over a shared x (notebooks 04 onwards).

    Args:
        x: The x values, shared by every curve.
        curves: ``{label: y values}``, each as long as ``x``.
        xlabel: Label of the x-axis.
        ylabel: Label of the y-axis.
        title: Axes title.
        logx: Logarithmic x-axis (base 2).
        logy: Logarithmic y-axis (base 2).
        reference: ``(label, y values)`` of a theoretical curve, drawn dashed in grey.
        ax: Draw into this Axes instead of a new Figure.

    Returns:
        The Figure.

    Raises:
        ValueError: If a curve's length differs from ``x``'s or a value is not finite.
    """
    if ax is None:
        fig = Figure(figsize=(5.5, 3.6))
        ax = fig.add_subplot()
    else:
        fig = ax.figure
    markers = "os^Dv"
    items = list(curves.items()) + ([reference] if reference is not None else [])
    for i, (label, ys) in enumerate(items):
        ys = [float(y) for y in ys]
        if len(ys) != len(x):
            raise ValueError(f"curve {label!r} has {len(ys)} values for {len(x)} x values")
        if not all(np.isfinite(ys)):
            raise ValueError(f"curve {label!r} has NaN or inf values")
        if reference is not None and i == len(items) - 1:
            ax.plot(x, ys, linestyle="--", color="grey", linewidth=1, label=label)
        else:
            ax.plot(x, ys, marker=markers[i % len(markers)] if len(x) <= 20 else None, markersize=4, label=label)
    if logx:
        ax.set_xscale("log", base=2)
    if logy:
        ax.set_yscale("log", base=2)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    if len(items) > 1:
        ax.legend()
    if title:
        ax.set_title(title)
    return fig


def line_panels(count: int, sharey: bool = True) -> tuple[Figure, list[Axes]]:
    """A Figure with ``count`` line-plot panels side by side, for ``plot_lines(..., ax=panel)``.

    One panel per setting (e.g. one per width in notebook 09) keeps each
    panel's legend from hiding another setting's curves.

    Args:
        count: Number of panels, at least 1.
        sharey: Give the panels one y-axis scale, so that they can be compared.

    Returns:
        The Figure and its list of Axes, left to right.

    Raises:
        ValueError: If ``count`` is not a positive int.
    """
    if not isinstance(count, int) or count < 1:
        raise ValueError(f"line_panels needs a positive number of panels, got {count!r}")
    fig = Figure(figsize=(4.6 * count, 3.6))
    axes = fig.subplots(1, count, sharey=sharey, squeeze=False)[0]
    fig.set_layout_engine("constrained")
    return fig, list(axes)


def plot_saturation(saturation: Any) -> Figure:
    """Three panels against Dk, scaled and unscaled: entropy, largest weight, gradient norm (notebook 04).

    Args:
        saturation: A ``course_utils.experiments.scaling.Saturation``.

    Returns:
        The Figure.
    """
    fig = Figure(figsize=(10.0, 3.3))
    axes = fig.subplots(1, 3)
    d_ks = saturation.Dks
    uniform = [float(np.log(saturation.S))] * len(d_ks)
    plot_lines(d_ks, saturation.entropy, "key width $D_k$", "entropy (nats)", title="entropy of the weights", logx=True,
               reference=(f"uniform, ln {saturation.S}", uniform), ax=axes[0])
    plot_lines(d_ks, saturation.max_weight, "key width $D_k$", "largest weight", title="largest weight", logx=True,
               ax=axes[1])
    plot_lines(d_ks, saturation.grad_norm, "key width $D_k$", "‖∂L/∂e‖", title="gradient through the softmax",
               logx=True, ax=axes[2])
    axes[1].set_ylim(0, 1.02)
    return fig


def show_matrix(
    matrix: Any,
    xlabel: str,
    ylabel: str,
    title: str | None = None,
    symmetric: bool = True,
    colorbar_label: str = "value",
) -> Figure:
    """Heatmap of any matrix (not attention weights): e.g. positional encodings (notebook 06).

    Args:
        matrix: (rows, columns) tensor or array.
        xlabel: Label of the columns.
        ylabel: Label of the rows.
        title: Axes title.
        symmetric: Colour scale centred on 0 with the colour-blind-safe diverging
            map "PuOr"; otherwise "viridis" from the minimum to the maximum.
        colorbar_label: What the colours mean (the colourbar's label).

    Returns:
        The Figure.

    Raises:
        ValueError: If the matrix is not 2-D or not finite.
    """
    array = matrix.detach().cpu().float().numpy() if isinstance(matrix, torch.Tensor) else np.asarray(matrix, float)
    if array.ndim != 2 or not np.isfinite(array).all():
        raise ValueError(f"show_matrix expects a finite 2-D matrix, got shape {array.shape}")
    fig = Figure(figsize=(6.0, 3.8))
    ax = fig.add_subplot()
    if symmetric:
        limit = float(np.abs(array).max()) or 1.0
        image = ax.imshow(array, cmap="PuOr", vmin=-limit, vmax=limit, aspect="auto")
    else:
        image = ax.imshow(array, cmap=ATTENTION_CMAP, aspect="auto")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    fig.colorbar(image, ax=ax, fraction=0.05, label=colorbar_label)
    return fig
