"""An attention explorer for the lecture: the temperature, one head or all, a mask (notebook 05).

A lecturer shows in class what each knob does to the weights of real heads,
without editing code:

    w^h_ij = softmax_j( q^h_i · k^h_j / τ ),   masked keys get weight 0,

with the temperature τ, the whole divisor of the scores as in notebooks 03 and
04, on a slider that starts at τ = √D_k (the layer as trained; τ = 1 is the
layer without its scale), the head on a drop-down (or
every head side by side), and no mask, the causal mask or a padding mask on
the last keys. Each heatmap's title gives the mean entropy of its rows and
the mean of their largest weights, so that a change can be read off as a number.

The computation is plain functions, tested against the course's attention and
``torch.softmax`` (tests/test_explorer.py): ``explorer_weights`` (the weights
of every head), ``explorer_mask`` and ``explorer_figure`` (the figure for one
setting). The widget only turns its controls into an ``ExplorerSettings``,
calls ``explorer_figure`` and shows the figure as a PNG in an ``Image``
widget. An ``Image`` rather than an ``Output`` widget: an ``Output`` widget
re-sends the figure as a display message of the cell, which nbval would
compare; an ``Image`` changes only its value.

Displayed in a notebook, the widget's output carries, besides the live
widget, a still PNG of the figure it shows at that moment and a fixed text,
so that the static site, the slides and a reader without a kernel see the
heatmap, and nbval compares only the text (it skips widget views and PNGs).
"""

from __future__ import annotations

import base64
import io
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import ipywidgets as widgets
import torch
from matplotlib.figure import Figure

from course_utils.blocks import masks
from course_utils.blocks.attention import (
    attention_entropy,
    masked_softmax,
    pairwise_scores,
    validate_attention_inputs,
)
from course_utils.blocks.multihead import split_heads
from course_utils.core.errors import InputError
from course_utils.experiments.plotting import show_attention

MASK_KINDS = ("none", "causal", "padding")
ALL_HEADS = "all"
# The temperature slider runs over tau = 10 ** exponent, exponent in [-1, 1.5] in steps of 0.05.
TEMPERATURE_EXPONENTS = (-1.0, 1.5, 0.05)


@dataclass(frozen=True)
class ExplorerSettings:
    """What the explorer shows; each field but ``padding`` is one control of the widget."""

    temperature: float | None = None  # tau > 0 divides the scores (as in notebooks 03-04); None: sqrt(Dk), as trained
    head: int | str = 0  # the head shown, 0 .. H - 1, or "all" for every head side by side
    mask: str = "none"  # "none", "causal" (query i sees keys j <= i) or "padding" (the last `padding` keys hidden)
    padding: int = 1  # how many keys at the end the padding mask hides, 1 .. S - 1


def _check_sequence(q: Any, k: Any, num_heads: Any) -> None:
    for name, x, letters in (("q", q, "(T, D)"), ("k", k, "(S, D)")):
        if isinstance(x, torch.Tensor) and x.dim() != 2:
            hint = f": pick one sequence, e.g. {name}[0]" if x.dim() == 3 else ""
            raise InputError(f"the explorer shows one sequence: {name} must be {letters}, the projected "
                             f"{'queries' if name == 'q' else 'keys'} of all heads side by side, got shape "
                             f"{tuple(x.shape)}{hint}")
    validate_attention_inputs(q, k, k)  # tensors, float, finite, the same width D
    D = q.shape[-1]
    if isinstance(num_heads, bool) or not isinstance(num_heads, int) or num_heads < 1 or D % num_heads != 0:
        raise InputError(f"num_heads = H must be a positive int that divides the width D = {D} of q and k (every "
                         f"head has width Dk = D / H), got {num_heads!r}: for a MultiHeadAttention use its "
                         f"num_heads; H may be one of {[h for h in range(1, D + 1) if D % h == 0]}")


def explorer_weights(q: torch.Tensor, k: torch.Tensor, num_heads: int, temperature: float | None = None,
                     mask: torch.Tensor | None = None) -> torch.Tensor:
    """The attention weights of every head of one sequence, softmax(q k^T / tau) (notebook 05).

    With ``temperature=None``, tau = sqrt(Dk), these are the weights of
    ``MultiHeadAttention`` (Vaswani et al. 2017, eq. 1, per head); tau = 1 is
    the same layer without its scale.

    Args:
        q: (T, D) float, the projected queries of one sequence, all heads side by side (e.g. ``mha.q_proj(x)``).
        k: (S, D) float, the projected keys (e.g. ``mha.k_proj(x)``).
        num_heads: H; D must be divisible by H, and Dk = D / H.
        temperature: tau > 0, the whole divisor of the scores; None: sqrt(Dk).
        mask: None, or bool broadcastable to (T, S), True = may attend (see ``explorer_mask``).

    Returns:
        (H, T, S) float weights; each row sums to 1 over its allowed keys.

    Raises:
        InputError: If q or k is not one sequence (2-D), they differ in width, H does not divide D,
            the temperature is not a positive number, or the mask does not fit.
    """
    _check_sequence(q, k, num_heads)
    if temperature is not None and (isinstance(temperature, bool) or not isinstance(temperature, (int, float))
                                    or not 0 < temperature < math.inf):
        raise InputError(f"the temperature tau divides the scores and must be a positive number, got {temperature!r}")
    q_heads = split_heads(q[None], num_heads)[0]  # (T, D) -> (1, T, D) -> (1, H, T, Dk) -> (H, T, Dk)
    k_heads = split_heads(k[None], num_heads)[0]  # (S, D) -> (H, S, Dk)
    validate_attention_inputs(q_heads, k_heads, k_heads, mask)  # the mask must broadcast to (H, T, S)
    Dk = q_heads.shape[-1]
    divisor = math.sqrt(Dk) if temperature is None else temperature
    scores = pairwise_scores(q_heads, k_heads) / divisor  # (H, T, Dk) @ (H, Dk, S) -> (H, T, S)
    return masked_softmax(scores, mask)  # (H, T, S)


def explorer_mask(kind: str, T: int, S: int, padding: int = 1) -> torch.Tensor | None:
    """The mask the explorer applies: none, causal, or padding on the last keys (True = may attend).

    Args:
        kind: "none", "causal" or "padding".
        T: Number of queries.
        S: Number of keys.
        padding: For "padding": how many keys at the end are padding, 1 .. S - 1.

    Returns:
        None for "none"; a (T, S) bool causal mask; a (1, S) bool padding mask.

    Raises:
        InputError: For another kind, or a padding that would hide no key or every key.
    """
    if kind == "none":
        return None
    if kind == "causal":
        return masks.causal_mask(T, S)  # (T, S)
    if kind == "padding":
        if isinstance(padding, bool) or not isinstance(padding, int) or not 1 <= padding < S:
            raise InputError(f"padding = {padding!r}: the padding mask hides the last 1 .. S - 1 = {S - 1} keys, "
                             "so that every query keeps at least one key")
        return masks.padding_mask(torch.tensor([S - padding]), S)[0]  # (B, 1, S) -> (1, S)
    raise InputError(f"mask must be one of {MASK_KINDS}, got {kind!r}")


def _labels(labels: Sequence[str] | None, count: int, what: str, plural: str) -> list[str]:
    if labels is None:
        return [str(i) for i in range(count)]
    labels = [str(label) for label in labels]
    if len(labels) != count:
        raise InputError(f"{len(labels)} {what} labels for {count} {plural}: give one label per {what}")
    return labels


def explorer_figure(q: torch.Tensor, k: torch.Tensor, num_heads: int, settings: ExplorerSettings = ExplorerSettings(),
                    query_labels: Sequence[str] | None = None,
                    key_labels: Sequence[str] | None = None) -> Figure:
    """The explorer's heatmap for one setting: one head, or all heads side by side (notebook 05).

    Each heatmap's title gives the mean entropy of its rows (in nats; ln S for
    uniform weights, 0 for one-hot rows) and the mean of the rows' largest
    weights. Masked cells are hatched.

    Args:
        q: (T, D) float projected queries of one sequence (see ``explorer_weights``).
        k: (S, D) float projected keys.
        num_heads: H.
        settings: Temperature, head, mask.
        query_labels: T labels (tokens) for the rows; default: positions.
        key_labels: S labels for the columns; default: ``query_labels`` when S = T, else positions.

    Returns:
        The Figure.

    Raises:
        InputError: For inputs ``explorer_weights`` or ``explorer_mask`` rejects, a head outside
            0 .. H - 1 (or "all"), or labels that do not match T or S.
    """
    _check_sequence(q, k, num_heads)
    (T, _), (S, _) = q.shape, k.shape
    query_labels = _labels(query_labels, T, "query", "queries")
    key_labels = _labels(key_labels if key_labels is not None or S != T else query_labels, S, "key", "keys")
    head = settings.head
    if head != ALL_HEADS and (isinstance(head, bool) or not isinstance(head, int) or not 0 <= head < num_heads):
        raise InputError(f"head must be 0 .. H - 1 = {num_heads - 1} (heads are counted from 0) or {ALL_HEADS!r}, "
                         f"got {head!r}")
    mask = explorer_mask(settings.mask, T, S, settings.padding)
    with torch.no_grad():
        weights = explorer_weights(q, k, num_heads, settings.temperature, mask)  # (H, T, S)
    entropy = attention_entropy(weights).mean(dim=-1)  # (H, T) -> (H,): mean over the queries
    largest = weights.max(dim=-1).values.mean(dim=-1)  # (H, T, S) -> (H, T) -> (H,)
    Dk = q.shape[-1] // num_heads
    tau = math.sqrt(Dk) if settings.temperature is None else settings.temperature
    divisor = f"τ = {tau:.2f} (√D_k = {math.sqrt(Dk):.3g})"
    masked = f"padding, the last {settings.padding} key(s)" if settings.mask == "padding" else settings.mask
    setting = f"scores ÷ {divisor}, mask: {masked}"

    def stats(h: int, between: str) -> str:
        return (f"mean row entropy {entropy[h]:.2f} nats{between}(uniform: {math.log(S):.2f}), "
                f"largest weight {largest[h]:.2f}")

    if head != ALL_HEADS:
        return show_attention(weights[head], query_labels, key_labels, mask=mask,
                              title=f"head {head}: {setting}\n{stats(head, ' ')}")
    columns = min(num_heads, 4)
    rows = math.ceil(num_heads / columns)
    fig = Figure(figsize=(0.55 * max(S, 4) * columns + 1.5, (0.5 * max(T, 3) + 1.2) * rows + 0.5))
    axes = fig.subplots(rows, columns, squeeze=False).flatten()
    for h in range(num_heads):
        show_attention(weights[h], query_labels, key_labels, mask=mask, ax=axes[h], colorbar=False,
                       title=f"head {h}\n" + stats(h, "\n"))
    for ax in axes[num_heads:]:
        ax.set_visible(False)
    fig.colorbar(axes[0].images[0], ax=list(axes[:num_heads]), label="attention weight", fraction=0.05)
    fig.suptitle(f"all {num_heads} heads: {setting}")
    return fig


def _png(figure: Figure) -> bytes:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", bbox_inches="tight")
    return buffer.getvalue()


class AttentionExplorer(widgets.VBox):
    """The explorer widget: a row of controls above the heatmap (build it with ``attention_explorer``).

    Attributes:
        temperature, head, mask: The controls (``FloatLogSlider`` and two ``Dropdown``).
        image: The ``Image`` widget that shows the current figure as a PNG.
        figure: The current matplotlib Figure (what ``image`` shows).
    """

    def __init__(self, q: torch.Tensor, k: torch.Tensor, num_heads: int, settings: ExplorerSettings,
                 query_labels: Sequence[str] | None, key_labels: Sequence[str] | None, figure: Figure) -> None:
        self._q, self._k, self._num_heads = q, k, num_heads
        self._labels, self._padding = (query_labels, key_labels), settings.padding
        low, high, step = TEMPERATURE_EXPONENTS
        Dk = q.shape[-1] // num_heads
        tau = math.sqrt(Dk) if settings.temperature is None else settings.temperature
        self.temperature = widgets.FloatLogSlider(value=tau, base=10, min=low, max=high, step=step,
                                                  description=f"temperature τ (√D_k = {math.sqrt(Dk):.3g})",
                                                  readout_format=".2f", style={"description_width": "initial"})
        self.head = widgets.Dropdown(options=[(f"head {h}", h) for h in range(num_heads)] + [("all heads", ALL_HEADS)],
                                     value=settings.head, description="show", layout={"width": "max-content"})
        self.mask = widgets.Dropdown(options=[("no mask", "none"), ("causal", "causal"),
                                              (f"padding: last {settings.padding} key(s)", "padding")],
                                     value=settings.mask, description="mask", layout={"width": "max-content"})
        self.figure = figure
        self.image = widgets.Image(value=_png(self.figure), format="png")
        super().__init__([widgets.HBox([self.temperature, self.head, self.mask]), self.image])
        for control in (self.temperature, self.head, self.mask):
            control.observe(self._redraw, names="value")

    @property
    def settings(self) -> ExplorerSettings:
        """The setting the controls show now."""
        return ExplorerSettings(temperature=self.temperature.value, head=self.head.value, mask=self.mask.value,
                                padding=self._padding)

    def _redraw(self, change: dict | None = None) -> None:
        self.figure = explorer_figure(self._q, self._k, self._num_heads, self.settings, *self._labels)
        self.image.value = _png(self.figure)

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any]:
        """The live widget, plus a still PNG of the current figure and a fixed text for readers without a kernel."""
        bundle = super()._repr_mimebundle_(**kwargs)
        bundle["image/png"] = base64.b64encode(self.image.value).decode("ascii")
        bundle["text/plain"] = (f"attention explorer: {self._num_heads} heads, {self._q.shape[0]} queries, "
                                f"{self._k.shape[0]} keys (run the notebook to use its controls)")
        return bundle


def attention_explorer(q: torch.Tensor, k: torch.Tensor, num_heads: int,
                       query_labels: Sequence[str] | None = None, key_labels: Sequence[str] | None = None,
                       settings: ExplorerSettings = ExplorerSettings()) -> AttentionExplorer:
    """A widget to explore the attention weights of every head of one sequence, for the lecture (notebook 05).

    Args:
        q: (T, D) float projected queries of one sequence, all heads side by side (e.g. ``mha.q_proj(x)``).
        k: (S, D) float projected keys (e.g. ``mha.k_proj(x)``, or of another sequence for cross-attention).
        num_heads: H, the number of heads the width D is cut into.
        query_labels: T labels for the rows (tokens); default: positions.
        key_labels: S labels for the columns; default: ``query_labels`` when S = T.
        settings: The initial temperature (None: sqrt(Dk)), head, mask and the padding mask's length.

    Returns:
        The ``AttentionExplorer`` widget; make it the last expression of a cell to show it.

    Raises:
        InputError: If the inputs or the initial settings do not fit (see ``explorer_figure``),
            or the initial temperature is outside the slider's range.
    """
    q, k = (x.detach() if isinstance(x, torch.Tensor) else x for x in (q, k))
    figure = explorer_figure(q, k, num_heads, settings, query_labels, key_labels)  # bad input fails here
    low, high, _ = TEMPERATURE_EXPONENTS
    tau = math.sqrt(q.shape[-1] // num_heads) if settings.temperature is None else settings.temperature
    if not 10 ** low <= tau <= 10 ** high:
        raise InputError(f"the slider's temperature runs from {10 ** low:g} to {10 ** high:g}, got an initial "
                         f"{settings.temperature!r}")
    return AttentionExplorer(q, k, num_heads, settings, query_labels, key_labels, figure)
