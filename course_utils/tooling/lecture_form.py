"""The form of a lecture, checked: what keeps a notebook readable as one lecture (third edition).

Three rules from the style guide, each a function that lists what breaks it:

* ``harness_words``: the markdown talks to the learner, never to the test
  suite ("asserted", "make bench", "reference machine", "nbval", "tests/",
  "margins from seeds");
* ``markdown_words``: one lecture is at most ``MAX_WORDS`` words of markdown;
* ``has_schematic``: from notebook 01 on, the main mechanism is drawn with the
  course's ``Schematic`` in a code cell.

``problems(path)`` gathers them for one notebook; ``python -m
course_utils.tooling.lecture_form`` prints them for every notebook.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import nbformat

MAX_WORDS = 4000
HARNESS = [r"\basserted\b", r"\bthe assert\b", r"\bmake bench\b", r"\breference machine\b", r"\bnbval\b",
           r"\btests/", r"\bmargins? from seeds\b", r"\bthe course's tests\b"]
_HARNESS = re.compile("|".join(HARNESS), re.IGNORECASE)


def _markdown(nb: nbformat.NotebookNode) -> list[str]:
    return [c.source for c in nb.cells if c.cell_type == "markdown"]


def harness_words(nb: nbformat.NotebookNode) -> list[str]:
    """Each harness word in the markdown, with a few words around it."""
    found = []
    for text in _markdown(nb):
        for match in _HARNESS.finditer(text):
            around = text[max(0, match.start() - 40):match.end() + 40].replace("\n", " ")
            found.append(f"'{match.group(0)}' in: …{around}…")
    return found


def markdown_words(nb: nbformat.NotebookNode) -> int:
    """Words of markdown (whitespace-separated tokens, formulas included)."""
    return sum(len(re.findall(r"\S+", text)) for text in _markdown(nb))


def has_schematic(nb: nbformat.NotebookNode) -> bool:
    """True if a code cell draws a ``Schematic`` and shows it."""
    return any(c.cell_type == "code" and re.search(r"\bSchematic\(", c.source) for c in nb.cells)


def problems(path: Path) -> list[str]:
    """What breaks the form of a lecture in the notebook at ``path`` (empty if nothing)."""
    nb = nbformat.read(path, as_version=4)
    found = [f"harness word {w}" for w in harness_words(nb)]
    words = markdown_words(nb)
    if words > MAX_WORDS:
        found.append(f"{words} words of markdown, over the {MAX_WORDS} of one lecture: cut, or split it in two")
    if int(path.name[:2]) >= 1 and not has_schematic(nb):
        found.append("no schematic: draw the main mechanism with course_utils.experiments.schematics.Schematic")
    return found


def main(argv: list[str] | None = None) -> int:
    from course_utils.tooling.autograder import NOTEBOOKS, course_notebooks

    paths = [Path(p) for p in (argv if argv is not None else sys.argv[1:])] or course_notebooks(NOTEBOOKS)
    bad = 0
    for path in paths:
        found = problems(path)
        bad += bool(found)
        print(f"{path.name}: {markdown_words(nbformat.read(path, as_version=4))} words, "
              f"{'ok' if not found else f'{len(found)} problem(s)'}")
        for line in found[:8]:
            print(f"  {line}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
