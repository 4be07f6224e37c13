"""The form of a lecture, checked: what keeps a notebook readable as one lecture (third and fourth editions).

The rules from the style guide, each a function that lists what breaks it:

* ``harness_words``: the markdown talks to the learner, never to the test
  suite ("asserted", "make bench", "reference machine", "nbval", "tests/",
  "margins from seeds");
* ``markdown_words``: one lecture is at most ``MAX_WORDS`` words of markdown;
* ``has_schematic``: from notebook 01 on, the main mechanism is drawn with the
  course's ``Schematic`` in a code cell;
* evidence out of the reading path (fourth edition): the asserts that guard a
  lecture's claims sit in code cells tagged ``evidence``, collapsed in
  JupyterLab (``source_hidden``) and dropped by the site and the slides;
  ``visible_asserts`` counts the others (at most ``MAX_VISIBLE_ASSERTS``),
  ``unhidden_evidence`` lists evidence cells shown open;
* said once (fourth edition): ``numbers_said_twice`` lists the numbers a cell
  prints that the prose also writes.

``split_evidence(nb)`` moves the top-level asserts of each code cell into a
collapsed evidence cell right after it (a first step when a lecture is rewritten;
asserts inside loops and functions stay where they are).

``problems(path)`` gathers them for one notebook; ``python -m
course_utils.tooling.lecture_form`` prints them for every notebook.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import nbformat

MAX_WORDS = 4000
HARNESS = [r"\basserted\b", r"\bthe assert\b", r"\bmake bench\b", r"\breference machine\b", r"\bnbval\b",
           r"\btests/", r"\bmargins? from seeds\b", r"\bthe course's tests\b"]
_HARNESS = re.compile("|".join(HARNESS), re.IGNORECASE)
EVIDENCE = "evidence"  # the tag of a collapsed cell that checks a lecture's claims
MAX_VISIBLE_ASSERTS = 3
# A number a reader would notice: 0.57, 2.184, 41,904, 12%, 12.5% (not 2, 10 or a year).
_NUMBER = re.compile(r"(?<![\w.,])(\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+\.\d{2,}|\d+(?:\.\d+)?%)(?![\w])")


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


def is_evidence(cell) -> bool:
    return EVIDENCE in cell.metadata.get("tags", [])


def _is_graded(cell) -> bool:
    return bool(cell.metadata.get("nbgrader", {}).get("grade"))


def _tree(source: str) -> ast.Module | None:
    """The cell's code without IPython's magics and shell lines, parsed (None if it does not parse)."""
    lines = ["" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines()]
    try:
        return ast.parse("\n".join(lines))
    except SyntaxError:
        return None


def visible_asserts(nb: nbformat.NotebookNode) -> int:
    """``assert`` statements a reader sees: in code cells that are neither evidence nor graded tests."""
    count = 0
    for cell in nb.cells:
        if cell.cell_type == "code" and not is_evidence(cell) and not _is_graded(cell):
            tree = _tree(cell.source)
            count += sum(isinstance(node, ast.Assert) for node in ast.walk(tree)) if tree else 0
    return count


def unhidden_evidence(nb: nbformat.NotebookNode) -> list[int]:
    """Evidence cells whose code is shown open in JupyterLab (indices)."""
    return [i for i, cell in enumerate(nb.cells)
            if is_evidence(cell) and not cell.metadata.get("jupyter", {}).get("source_hidden")]


def _printed(cell) -> str:
    text = []
    for output in cell.get("outputs", []):
        text.append(output.get("text", "") if output.get("output_type") == "stream" else
                    output.get("data", {}).get("text/plain", "") if "data" in output else "")
    return "".join(t if isinstance(t, str) else "".join(t) for t in text)


def _prose(source: str) -> str:
    return re.sub(r"```.*?```", " ", source, flags=re.S)


def numbers_said_twice(nb: nbformat.NotebookNode) -> list[str]:
    """Numbers that a visible cell prints and the markdown writes as well (each once, in order of printing)."""
    written = {m.replace(",", "") for c in nb.cells if c.cell_type == "markdown" for m in _NUMBER.findall(_prose(c.source))}
    found = []
    for cell in nb.cells:
        if cell.cell_type == "code" and not is_evidence(cell):
            for number in _NUMBER.findall(_printed(cell)):
                if number.replace(",", "") in written and number not in found:
                    found.append(number)
    return found


def split_evidence(nb: nbformat.NotebookNode) -> int:
    """Move each code cell's top-level asserts (and the comment lines just above them) into a collapsed evidence
    cell right after it; a cell of asserts only becomes an evidence cell itself. Returns the cells changed."""
    cells, changed = [], 0
    for cell in nb.cells:
        cells.append(cell)
        tree = _tree(cell.source) if cell.cell_type == "code" and not is_evidence(cell) and not _is_graded(cell) \
            else None
        asserts = [node for node in tree.body if isinstance(node, ast.Assert)] if tree else []
        if not asserts:
            continue
        changed += 1
        lines = cell.source.splitlines()
        moved = set()
        for node in asserts:
            first = node.lineno - 1
            while first > 0 and lines[first - 1].lstrip().startswith("#") and first - 1 not in moved:
                first -= 1
            moved |= set(range(first, node.end_lineno))
        kept = [line for i, line in enumerate(lines) if i not in moved]
        taken = [line for i, line in enumerate(lines) if i in moved]
        if all(not line.strip() or line.lstrip().startswith("#") for line in kept):
            evidence = cell  # asserts only: the cell itself becomes evidence
        else:
            while kept and not kept[-1].strip():
                kept.pop()
            cell.source = "\n".join(kept)
            evidence = nbformat.v4.new_code_cell("\n".join(taken))
            evidence.metadata["slideshow"] = {"slide_type": "-"}
            cells.append(evidence)
        evidence.metadata.setdefault("tags", [])
        if EVIDENCE not in evidence.metadata["tags"]:
            evidence.metadata["tags"].append(EVIDENCE)
        evidence.metadata["jupyter"] = {**evidence.metadata.get("jupyter", {}), "source_hidden": True}
    nb.cells = cells
    return changed


def problems(path: Path) -> list[str]:
    """What breaks the form of a lecture in the notebook at ``path`` (empty if nothing)."""
    nb = nbformat.read(path, as_version=4)
    found = [f"harness word {w}" for w in harness_words(nb)]
    words = markdown_words(nb)
    if words > MAX_WORDS:
        found.append(f"{words} words of markdown, over the {MAX_WORDS} of one lecture: cut, or split it in two")
    if int(path.name[:2]) >= 1 and not has_schematic(nb):
        found.append("no schematic: draw the main mechanism with course_utils.experiments.schematics.Schematic")
    shown = visible_asserts(nb)
    if shown > MAX_VISIBLE_ASSERTS:
        found.append(f"{shown} visible asserts, over {MAX_VISIBLE_ASSERTS}: move the checks into collapsed cells "
                     f"tagged {EVIDENCE!r} (split_evidence), or to the lab book")
    found += [f"cell {i} is tagged {EVIDENCE!r} but shown open: collapse it (metadata jupyter.source_hidden)"
              for i in unhidden_evidence(nb)]
    found += [f"{number} is printed by a cell and written in the prose too: say it once"
              for number in numbers_said_twice(nb)]
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
