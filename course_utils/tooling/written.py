"""Written questions, graded by hand: the marking sheets and the marks file.

Each notebook ends its exercises with one short written question: a markdown
cell marked in nbgrader as a manually graded answer (``solution`` and
``grade``, a ``grade_id`` starting with ``written``). In the instructor
notebook that cell holds a model answer and the rubric; the release replaces it
with "YOUR ANSWER HERE", and grading takes the student's text from the
submission (``submissions.assemble``).

Autograding cannot score them. ``make grade`` writes, for every notebook,
``build/grading/written/<notebook>.md``: the question, the model answer and
rubric, and each student's answer, one after another, so a marker reads them in
one place; and ``marks-template.csv`` with a row per student and question and
an empty ``points`` column. The marker fills in the points, saves the file
somewhere outside ``build/`` and runs ``make grade SUBMISSIONS=... MARKS=file``
again; the marks are then part of the totals and of ``grades.csv``. A question
without a mark is shown as "to mark" and keeps the total provisional.
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass
from pathlib import Path

import nbformat

from course_utils.checks.flow import WRITTEN_STUB

STUB = WRITTEN_STUB  # what nbgrader's release puts in a written-answer cell
MARKS_COLUMNS = ["student", "notebook", "question", "points", "max_points"]


@dataclass(frozen=True)
class Question:
    """One written question of a notebook."""

    notebook: str  # notebook stem
    grade_id: str  # nbgrader grade_id of the answer cell, "written_..."
    points: float
    prompt: str  # the markdown cell before the answer cell (the question)
    rubric: str  # the instructor's answer cell (model answer and rubric); "" in a release


def is_written(cell) -> bool:
    """True for a hand-graded written-answer cell (markdown, nbgrader solution and grade)."""
    meta = cell.metadata.get("nbgrader", {})
    return cell.cell_type == "markdown" and bool(meta.get("solution")) and bool(meta.get("grade"))


def questions(notebook: Path | nbformat.NotebookNode) -> list[Question]:
    """The written questions of a notebook, in order."""
    nb = nbformat.read(notebook, as_version=4) if isinstance(notebook, (str, Path)) else notebook
    stem = Path(notebook).stem if isinstance(notebook, (str, Path)) else ""
    found = []
    for i, cell in enumerate(nb.cells):
        if is_written(cell):
            meta = cell.metadata["nbgrader"]
            prompt = nb.cells[i - 1].source if i and nb.cells[i - 1].cell_type == "markdown" else ""
            found.append(Question(stem, meta["grade_id"], float(meta.get("points", 0)), prompt, cell.source))
    return found


def answers(nb: nbformat.NotebookNode) -> dict[str, str]:
    """The student's text for each written question ("" when left as released)."""
    return {c.metadata["nbgrader"]["grade_id"]: ("" if c.source.strip() in ("", STUB) else c.source.strip())
            for c in nb.cells if is_written(c)}


def read_marks(path: Path, known: dict[str, list[Question]]) -> dict[tuple[str, str, str], float]:
    """The hand marks in a marks file, by (student, notebook, question).

    Rows with an empty ``points`` cell are skipped (not yet marked).

    Raises:
        FileNotFoundError: If there is no such file.
        ValueError: If a row names an unknown notebook or question, or gives
            points that are not a number between 0 and the question's maximum.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no marks file at {path}: fill in the points column of "
                                "build/grading/written/marks-template.csv and save it outside build/")
    marks = {}
    with open(path, newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        missing = {"student", "notebook", "question", "points"} - set(reader.fieldnames or [])
        if missing:
            raise ValueError(f"{path.name}: the header lacks {', '.join(sorted(missing))} "
                             f"(expected the columns of marks-template.csv: {', '.join(MARKS_COLUMNS)})")
        for line, row in enumerate(reader, start=2):
            text = (row.get("points") or "").strip()
            if not text:
                continue
            student, stem, grade_id = (row.get(k, "").strip().lstrip("'") for k in ("student", "notebook", "question"))
            by_id = {q.grade_id: q for q in known.get(stem, [])}
            if grade_id not in by_id:
                raise ValueError(f"{path.name}, line {line}: {stem!r} has no written question {grade_id!r}")
            try:
                points = float(text)
            except ValueError:
                raise ValueError(f"{path.name}, line {line}: points {text!r} is not a number") from None
            if not 0 <= points <= by_id[grade_id].points:
                raise ValueError(f"{path.name}, line {line}: {points:g} points is outside 0 to "
                                 f"{by_id[grade_id].points:g} for {grade_id}")
            marks[(student, stem, grade_id)] = points
    return marks


def _quote(text: str) -> str:
    return "\n".join("> " + line for line in text.splitlines()) or "> (no answer)"


def write_marking_sheets(results, known: dict[str, list[Question]], out: Path,
                         safe=lambda v: str(v)) -> list[Path]:
    """One markdown marking sheet per notebook with written questions, and ``marks-template.csv``.

    Args:
        results: ``submissions.Result`` rows (their ``written`` answers and ``scores``).
        known: The questions of each notebook (from the instructor notebooks).
        out: Folder to write to (created).
        safe: Applied to every CSV cell (grading passes its formula escaping).

    Returns:
        The files written.
    """
    out.mkdir(parents=True, exist_ok=True)
    written = []
    rows = []
    for stem, qs in sorted(known.items()):
        graded = [r for r in results if r.notebook == stem and not r.failed]
        if not qs or not graded:
            continue
        lines = [f"# Written questions of {stem}", ""]
        for q in qs:
            lines += [f"## {q.grade_id} ({q.points:g} points)", "", "### The question", "", q.prompt.strip(), "",
                      "### Model answer and rubric", "", q.rubric.strip(), "", "### Answers", ""]
            for r in graded:
                mark = r.scores.get(q.grade_id)
                status = f"marked {mark:g}/{q.points:g}" if mark is not None else "to mark"
                lines += [f"#### {r.student} ({status})", "", _quote(r.written.get(q.grade_id, "")), ""]
                rows.append([r.student, stem, q.grade_id, "" if mark is None else f"{mark:g}", f"{q.points:g}"])
        sheet = out / f"{stem}.md"
        sheet.write_text("\n".join(lines), encoding="utf-8")
        written.append(sheet)
    template = out / "marks-template.csv"
    with open(template, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(MARKS_COLUMNS)
        writer.writerows([[safe(v) for v in row] for row in rows])
    written.append(template)
    return written


def check_answer_cell(source: str) -> list[str]:
    """What an instructor's written-answer cell lacks: a model answer and a rubric with points."""
    problems = []
    if not re.search(r"\*\*Model answer", source):
        problems.append("a '**Model answer**' paragraph")
    if not re.search(r"\*\*Rubric", source) or not re.search(r"\b\d+(\.\d+)? points?\b|\(\d+\)", source):
        problems.append("a '**Rubric**' that says what earns each point")
    return problems
