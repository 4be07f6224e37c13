"""Keep the per-notebook facts of docs/instructor_guide.md in step with the notebooks.

The block between the BEGIN/END GENERATED markers of the guide is rendered from
the notebooks themselves (title, learning objectives, graded exercises and their
points, the written question) and from the README's syllabus table (measured CPU minutes).

Each notebook's subsection ends with its evidence: the checks the notebook runs
on its own numbers (its ``assert`` statements), and the evidence that lives
outside it, which the learner's text no longer mentions: every test marked
``@pytest.mark.evidence("NN", "what it establishes")`` (seed sweeps, runs too
long for the notebook), the time budget ``make bench`` holds it to, and its
lab book's notebooks (the README syllabus's last column), each named by its
path and first heading.
``python -m course_utils.tooling.guide`` rewrites it; a test fails when it is stale.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import nbformat

from course_utils.tooling import written
from course_utils.tooling.execute import LAB_BUDGET, NOTEBOOK_BUDGET
from course_utils.tooling.grading import course_notebooks, exercises
from course_utils.tooling.site import syllabus

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "instructor_guide.md"
BEGIN, END = "<!-- BEGIN GENERATED: notebooks -->", "<!-- END GENERATED -->"


def _objectives(nb: nbformat.NotebookNode) -> list[str]:
    text = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    section = text.split("## Learning objectives", 1)[1].split("\n## ", 1)[0]
    return [line[2:].strip() for line in section.splitlines() if line.startswith("* ")]


def _asserts(nb: nbformat.NotebookNode) -> int:
    count = 0
    for cell in nb.cells:
        if cell.cell_type == "code":
            try:
                count += sum(isinstance(node, ast.Assert) for node in ast.walk(ast.parse(cell.source)))
            except SyntaxError:  # an IPython magic: no assert of ours
                continue
    return count


def evidence_tests(tests_dir: Path = ROOT / "tests") -> dict[str, list[str]]:
    """Notebook number -> "claim (`tests/file.py::test`)" for every test marked ``pytest.mark.evidence``."""
    found: dict[str, list[str]] = {}
    for path in sorted(tests_dir.glob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.FunctionDef):
                continue
            for deco in node.decorator_list:
                if (isinstance(deco, ast.Call) and ast.unparse(deco.func) == "pytest.mark.evidence"
                        and len(deco.args) == 2 and all(isinstance(a, ast.Constant) for a in deco.args)):
                    number, claim = (a.value for a in deco.args)
                    found.setdefault(number, []).append(f"{claim} (`tests/{path.name}::{node.name}`)")
    return found


def first_heading(nb: nbformat.NotebookNode) -> str:
    """The text of a notebook's first markdown heading ("Lab 03 · Long keys"), or "" if it has none."""
    for cell in nb.cells:
        for line in cell.source.splitlines() if cell.cell_type == "markdown" else []:
            if line.startswith("#"):
                return line.lstrip("#").strip()
    return ""


def lab_lines(files: tuple[str, ...], notebooks_dir: Path = ROOT / "notebooks") -> list[str]:
    """The evidence list's lab book item: each lab notebook (relative to ``notebooks_dir``) by path and first heading.

    Empty when the lecture has no lab notebook.
    """
    if not files:
        return []
    lines = ["* In the lab book (optional, never graded; the test suite re-runs and compares it as it does a lecture, "
             f"and `make bench` holds each notebook to {LAB_BUDGET:.0f} s):"]
    for file in files:
        nb = nbformat.read(Path(notebooks_dir) / file, as_version=4)
        lines.append(f"  * `notebooks/{file}`: {first_heading(nb)} ({_asserts(nb)} `assert` statements)")
    return lines


def _evidence(path: Path, nb: nbformat.NotebookNode, outside: dict[str, list[str]], lab: list[str]) -> list[str]:
    lines = ["", "Evidence:", "",
             f"* In the notebook: {_asserts(nb)} `assert` statements check its own numbers as it runs, and the test "
             "suite re-runs it and compares every output (strict nbval).",
             f"* Time: `make bench` runs it top to bottom and holds it to {NOTEBOOK_BUDGET:.0f} s and to the runtime "
             "its first cell states, on the 2-core course machine; the minutes above come from there."]
    claims = outside.get(path.name[:2], [])
    if claims:
        lines += ["* Outside the notebook, runs too long for it (other seeds, longer runs), so that an instructor "
                  "knows how far a result of the notebook's own run holds:"]
        lines += [f"  * {claim}" for claim in claims]
    return lines + lab


def render(notebooks_dir: Path = ROOT / "notebooks") -> str:
    """The generated block: one subsection per notebook."""
    entries = syllabus()
    minutes = {e.file: e.minutes for e in entries}
    lab = {e.file: e.lab for e in entries}
    outside = evidence_tests()
    parts = []
    for path in course_notebooks(notebooks_dir):
        nb = nbformat.read(path, as_version=4)
        title = nb.cells[0].source.splitlines()[0].lstrip("# ").strip()
        exs = exercises(path)
        lines = [f"### {title}", "", f"`notebooks/{path.name}` · measured run time: {minutes.get(path.name, '?')} CPU "
                 f"minutes · {len(exs)} graded exercise(s), {sum(e.points for e in exs):g} points", "",
                 "Learning objectives:", ""]
        lines += [f"* {objective}" for objective in _objectives(nb)]
        lines += ["", "Graded exercises (nbgrader `grade_id`, points):", ""]
        lines += [f"* `{e.grade_id}`: {e.points:g}" for e in exs]
        for q in written.questions(path):
            title = q.prompt.splitlines()[0].lstrip("# ").strip() if q.prompt else q.grade_id
            lines += ["", f"Written question, graded by hand (`{q.grade_id}`, {q.points:g} points; model answer and "
                          f"rubric in the answer cell): {title}"]
        lines += _evidence(path, nb, outside, lab_lines(lab.get(path.name, ()), notebooks_dir))
        parts.append("\n".join(lines))
    return "\n\n".join(parts)


def update(guide: Path = GUIDE) -> bool:
    """Rewrite the generated block; return True if the file changed."""
    text = guide.read_text(encoding="utf-8")
    pattern = re.compile(re.escape(BEGIN) + r".*?" + re.escape(END), re.S)
    new = pattern.sub(lambda _: f"{BEGIN}\n\n{render()}\n\n{END}", text)
    if new != text:
        guide.write_text(new, encoding="utf-8")
    return new != text


if __name__ == "__main__":
    print("updated" if update() else "already up to date", GUIDE)
    sys.exit(0)
