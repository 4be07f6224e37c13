"""Schematics: the course's diagrams, drawn by code a lecturer can edit (introduced in notebook 01).

A schematic is a few named boxes (operations, models), tensors (a row of
cells with a label, so a vector looks like a vector) and arrows between them,
placed on a grid of units::

    s = Schematic(8, 3, title="one attention step")
    s.tensor("q", 1, 2, "$s_{i-1}$", kind="query")
    s.box("score", 4, 2, "score", kind="op")
    s.arrow("q", "score")
    s.figure          # the last expression of a cell shows it

It is plain matplotlib (one Figure, one Axes, no pyplot), so it shows wherever
the course's other figures show (JupyterLab, the student release once run, the
site and the slides, which take a notebook's PNG outputs), its text form is
the usual ``<Figure size ...>``, and it needs no package beyond matplotlib.
Colours are the course palette (Okabe and Ito's colour-blind-safe set, the
same as the figures' colour cycle), one colour per ``kind`` of thing.
"""

from __future__ import annotations

from dataclasses import dataclass

from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch, Patch, Rectangle

from course_utils.core.errors import InputError

# One colour per kind of thing, the same in every schematic of the course.
KINDS = {
    "input": "#56B4E9",    # tokens and their vectors (sky blue)
    "state": "#0072B2",    # hidden states, keys, values held in memory (blue)
    "query": "#D55E00",    # what looks something up (vermillion)
    "weights": "#E69F00",  # attention weights, probabilities (orange)
    "context": "#009E73",  # what attention returns (bluish green)
    "output": "#CC79A7",   # predictions, logits (reddish purple)
    "op": "#BBBBBB",       # an operation or a model part (grey)
    "mask": "#000000",     # masked or unused (black, hatched)
}
UNIT = 0.75  # inches per grid unit


@dataclass
class _Node:
    patch: Patch
    x: float
    y: float


class Schematic:
    """A diagram of boxes, tensors and arrows on a grid of ``width`` x ``height`` units.

    Args:
        width: Width in grid units (0.75 inch each).
        height: Height in grid units.
        title: Shown above the diagram.
    """

    def __init__(self, width: float, height: float, title: str | None = None) -> None:
        if not (0 < width <= 16 and 0 < height <= 12):
            raise InputError(f"Schematic(width, height) expects 0 < width <= 16 and 0 < height <= 12 units, "
                             f"got {width} x {height}")
        self.figure = Figure(figsize=(width * UNIT, height * UNIT), layout="constrained")
        self.ax = self.figure.add_subplot()
        self.ax.set_xlim(0, width)
        self.ax.set_ylim(0, height)
        self.ax.set_aspect("equal")
        self.ax.axis("off")
        if title:
            self.ax.set_title(title)
        self.width, self.height = width, height
        self.nodes: dict[str, _Node] = {}

    def _colour(self, kind: str) -> str:
        if kind not in KINDS:
            raise InputError(f"unknown kind {kind!r}: use one of {', '.join(KINDS)}")
        return KINDS[kind]

    def _add(self, name: str, node: _Node) -> str:
        if name in self.nodes:
            raise InputError(f"the schematic already has a node called {name!r}: give each node its own name")
        if not (0 <= node.x <= self.width and 0 <= node.y <= self.height):
            raise InputError(f"node {name!r} at ({node.x}, {node.y}) lies outside the "
                             f"{self.width} x {self.height} schematic")
        self.nodes[name] = node
        return name

    def box(self, name: str, x: float, y: float, label: str, *, kind: str = "op",
            w: float = 1.6, h: float = 0.7) -> str:
        """A rounded box centred at (x, y): an operation or a part of a model."""
        colour = self._colour(kind)
        patch = FancyBboxPatch((x - w / 2, y - h / 2), w, h, boxstyle="round,pad=0.02,rounding_size=0.12",
                               facecolor=colour + "40", edgecolor=colour if kind != "op" else "#555555",
                               linewidth=1.4)
        self.ax.add_patch(patch)
        self.ax.text(x, y, label, ha="center", va="center", fontsize=10)
        return self._add(name, _Node(patch, x, y))

    def tensor(self, name: str, x: float, y: float, label: str, *, kind: str = "state", cells: int = 4,
               vertical: bool = False, size: float = 0.28, below: bool = True) -> str:
        """A vector drawn as ``cells`` squares centred at (x, y), with its label beside it."""
        if not (isinstance(cells, int) and 1 <= cells <= 16):
            raise InputError(f"tensor {name!r}: cells must be an int from 1 to 16, got {cells!r}")
        colour = self._colour(kind)
        w, h = (size, size * cells) if vertical else (size * cells, size)
        x0, y0 = x - w / 2, y - h / 2
        for i in range(cells):
            cx, cy = (x0, y0 + i * size) if vertical else (x0 + i * size, y0)
            self.ax.add_patch(Rectangle((cx, cy), size, size, facecolor=colour + "99", edgecolor="white",
                                        linewidth=1.0, hatch="//" if kind == "mask" else None))
        outline = Rectangle((x0, y0), w, h, fill=False, edgecolor=colour, linewidth=1.2)
        self.ax.add_patch(outline)
        if vertical:
            self.ax.text(x + w / 2 + 0.12, y, label, ha="left", va="center", fontsize=10)
        else:
            ly = y0 - 0.12 if below else y0 + h + 0.12
            self.ax.text(x, ly, label, ha="center", va="top" if below else "bottom", fontsize=10)
        return self._add(name, _Node(outline, x, y))

    def arrow(self, start: str, end: str, label: str | None = None, *, bend: float = 0.0,
              dashed: bool = False, kind: str = "op") -> None:
        """An arrow from node ``start`` to node ``end``, clipped at their edges, with an optional label."""
        for node in (start, end):
            if node not in self.nodes:
                raise InputError(f"arrow({start!r}, {end!r}): no node called {node!r}; "
                                 f"the schematic has {', '.join(self.nodes) or 'no nodes yet'}")
        a, b = self.nodes[start], self.nodes[end]
        colour = "#333333" if kind == "op" else self._colour(kind)
        self.ax.add_patch(FancyArrowPatch((a.x, a.y), (b.x, b.y), patchA=a.patch, patchB=b.patch,
                                          arrowstyle="-|>", mutation_scale=12, color=colour, linewidth=1.3,
                                          linestyle="--" if dashed else "-",
                                          connectionstyle=f"arc3,rad={bend}", shrinkA=2, shrinkB=2))
        if label:
            mx, my = (a.x + b.x) / 2, (a.y + b.y) / 2
            dx, dy = b.x - a.x, b.y - a.y
            mx, my = mx - bend * dy / 2, my + bend * dx / 2
            if abs(dx) >= abs(dy):  # beside the arrow, not on it: above a horizontal one, right of a vertical one
                self.ax.text(mx, my + 0.12, label, ha="center", va="bottom", fontsize=9)
            else:
                self.ax.text(mx + 0.12, my, label, ha="left", va="center", fontsize=9)

    def note(self, x: float, y: float, text: str, *, size: float = 9, colour: str = "#333333",
             ha: str = "center") -> None:
        """Free text at (x, y), e.g. a shape or a remark."""
        self.ax.text(x, y, text, ha=ha, va="center", fontsize=size, color=colour)

    def bracket(self, x0: float, x1: float, y: float, text: str) -> None:
        """A horizontal bracket from x0 to x1 at height y, with text under it (e.g. "T steps")."""
        self.ax.plot([x0, x0, x1, x1], [y + 0.1, y, y, y + 0.1], color="#555555", linewidth=1.0)
        self.ax.text((x0 + x1) / 2, y - 0.15, text, ha="center", va="top", fontsize=9, color="#333333")
