"""What grading hands the instructor: the grade table, ``grades.csv``, the marking sheets, and shards merged.

A grading folder (``build/grading`` by default) holds, after a run:

* ``results/<student>.json``: that student's results, one per notebook (the
  unit the merge reads; hand marks are never stored there);
* ``autograded/<student>/``, ``feedback/<student>/``, ``gradebooks/<student>.db``;
* ``class.json``: the class the run belongs to (every student's name, the
  notebooks graded, a fingerprint of the instructor notebooks) and, for a
  shard, which share it graded;
* after :func:`finish`: ``grades.csv`` and ``written/`` (marking sheets and
  ``marks-template.csv``).

:func:`merge` turns the folders of the ``N`` shards of one class into one such
folder, equal to what a single run writes.
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import json
import re
import shutil
from pathlib import Path

from course_utils.tooling import written as written_questions
from course_utils.tooling.autograder import NOTEBOOKS, course_notebooks, gradable
from course_utils.tooling.submissions import Result

_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def csv_safe(value: object) -> str:
    """A cell a spreadsheet shows as text: a leading =, +, -, @, tab or CR would start a formula."""
    text = str(value)
    if text.startswith(_FORMULA_START) and not re.fullmatch(r"-?\d+(\.\d+)?", text):
        return "'" + text
    return text


def fingerprint(notebooks: list[Path]) -> str:
    """A short digest of the instructor notebooks: shards graded against other notebooks do not merge."""
    digest = hashlib.sha256()
    for nb in notebooks:
        digest.update(nb.name.encode() + b"\0" + nb.read_bytes())
    return digest.hexdigest()[:16]


def save_results(out: Path, student: str, results: list[Result]) -> Path:
    path = Path(out) / "results" / f"{student}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps([dataclasses.asdict(r) for r in results], indent=1), encoding="utf-8")
    return path


def load_results(out: Path) -> list[Result]:
    """Every student's results in a grading folder, sorted by student then notebook."""
    results = []
    for path in sorted((Path(out) / "results").glob("*.json")):
        results += [Result(**row) for row in json.loads(path.read_text(encoding="utf-8"))]
    return sorted(results, key=lambda r: (r.student, r.notebook))


def apply_marks(results: list[Result], marks: Path | None, notebooks_dir: Path) -> list[Result]:
    """The results with the hand marks of a marks file counted (``written.read_marks`` checks the file)."""
    if marks is None:
        return results
    asked = {nb.stem: written_questions.questions(nb) for nb in course_notebooks(notebooks_dir)}
    hand = written_questions.read_marks(marks, asked)
    marked = []
    for r in results:
        if not r.failed and r.unmarked:
            scores = dict(r.scores)
            for grade_id in r.unmarked:
                if (r.student, r.notebook, grade_id) in hand:
                    scores[grade_id] = hand[(r.student, r.notebook, grade_id)]
            r = dataclasses.replace(r, scores=scores, unmarked=[g for g in r.unmarked if g not in scores])
        marked.append(r)
    return marked


def finish(out: Path, notebooks_dir: Path, marks: Path | None = None) -> list[Result]:
    """Write ``grades.csv`` and the marking sheets of a grading folder; return its results, hand marks counted."""
    results = apply_marks(load_results(out), marks, notebooks_dir)
    asked = {nb.stem: written_questions.questions(nb) for nb in course_notebooks(notebooks_dir)
             if any(r.notebook == nb.stem for r in results)}
    written_questions.write_marking_sheets(results, asked, Path(out) / "written", safe=csv_safe)
    write_grades_csv(results, Path(out) / "grades.csv", notebooks_dir)
    return results


def write_grades_csv(results: list[Result], path: Path, notebooks_dir: Path = NOTEBOOKS) -> Path:
    """Write the grades in long format: one row per student, notebook and exercise.

    Columns: student, notebook, exercise, points, max_points, status, flags.
    A written question not yet marked by hand has an empty ``points`` cell.
    A submission that could not be graded has one row with exercise "-" and
    status "FAILED: <reason>" (or "MISSING: ..."). ``flags`` lists what a human
    should look at, separated by "; ". Every cell that a spreadsheet would read
    as a formula is prefixed with an apostrophe.

    Returns:
        ``path``.
    """
    known = {nb.stem: nb for nb in course_notebooks(notebooks_dir)}
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["student", "notebook", "exercise", "points", "max_points", "status", "flags"])
        for r in results:
            flags = "; ".join(r.flags)
            if r.failed:
                writer.writerow([csv_safe(v) for v in (r.student, r.notebook, "-", "", "", r.status, flags)])
                continue
            for ex in gradable(known[r.notebook]):
                score = r.scores.get(ex.grade_id)
                shown = "" if score is None and ex.grade_id in r.unmarked else f"{score or 0.0:g}"
                writer.writerow([csv_safe(v) for v in (r.student, r.notebook, ex.grade_id, shown, f"{ex.points:g}",
                                                       r.status, flags)])
    return Path(path)


def format_table(results: list[Result], notebooks_dir: Path = NOTEBOOKS) -> str:
    """One table per notebook: a row per student, a column per exercise, total and status."""
    lines: list[str] = []
    by_notebook: dict[str, list[Result]] = {}
    for r in results:
        by_notebook.setdefault(r.notebook, []).append(r)
    known = {nb.stem: nb for nb in course_notebooks(notebooks_dir)}
    for stem, rows in sorted(by_notebook.items()):
        exs = gradable(known[stem]) if stem in known else []
        headers = ["student"] + [ex.grade_id for ex in exs] + ["total", "status"]
        table = []
        for r in rows:
            if r.failed:
                cells = ["-"] * len(exs) + ["-", r.status]
            else:
                cells = [f"to mark/{ex.points:g}" if ex.grade_id in r.unmarked else
                         f"{r.scores.get(ex.grade_id, 0):g}/{ex.points:g}" for ex in exs]
                cells += [f"{r.total:g}/{sum(ex.points for ex in exs):g}" + (" so far" if r.unmarked else ""),
                          r.status]
            if r.flags:
                cells[-1] += "  FLAGGED: " + "; ".join(r.flags)
            table.append([r.student] + cells)
        widths = [max(len(str(row[i])) for row in [headers] + table) for i in range(len(headers))]
        lines.append(f"## {stem}")
        for row in [headers] + table:
            lines.append("  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip())
        lines.append("")
    return "\n".join(lines)


class MergeError(ValueError):
    """The shard folders given are not the complete set of shards of one class."""


def merge(shards: list[Path], out: Path, notebooks_dir: Path, marks: Path | None = None) -> list[Result]:
    """Merge the grading folders of the shards of one class into ``out``; return the results.

    Refuses (``MergeError``, before writing anything) unless the folders are
    exactly shards 0 to N-1 of one class, graded against these instructor
    notebooks, and together hold every student of the class once.
    """
    infos = []
    for folder in shards:
        path = Path(folder) / "class.json"
        if not path.is_file():
            raise MergeError(f"{folder} is not a shard's grading folder (no class.json): pass the folders that "
                             "`make grade SHARD=i/N` wrote")
        infos.append((Path(folder), json.loads(path.read_text(encoding="utf-8"))))
    first = infos[0][1]
    count = first["shard"][1]
    for folder, info in infos:
        for key in ("students", "notebooks", "fingerprint"):
            if info[key] != first[key]:
                raise MergeError(f"{folder} graded another class than {infos[0][0]} (its {key} differ)")
        if info["shard"][1] != count:
            raise MergeError(f"{folder} is one of {info['shard'][1]} shards, {infos[0][0]} one of {count}")
    got = sorted(info["shard"][0] for _, info in infos)
    if got != list(range(count)):
        missing = sorted(set(range(count)) - set(got))
        twice = sorted({i for i in got if got.count(i) > 1})
        raise MergeError(f"the class was graded in {count} shards (0 to {count - 1}); "
                         + (f"missing: {', '.join(map(str, missing))}" if missing else "")
                         + ("; " if missing and twice else "")
                         + (f"given twice: {', '.join(map(str, twice))}" if twice else ""))
    shares = [student for _, info in infos for student in info["mine"]]
    if sorted(shares) != sorted(first["students"]):
        raise MergeError("the shards do not hold every student of the class exactly once")
    if first["fingerprint"] != fingerprint(course_notebooks(notebooks_dir)):
        raise MergeError(f"the shards were graded against other instructor notebooks than those in {notebooks_dir}")
    out = Path(out)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    for folder, _ in infos:
        for kind in ("results", "autograded", "feedback", "gradebooks", "logs"):
            if (folder / kind).is_dir():
                shutil.copytree(folder / kind, out / kind, dirs_exist_ok=True)
    whole = dict(first, shard=[0, 1], mine=first["students"])
    (out / "class.json").write_text(json.dumps(whole, indent=1), encoding="utf-8")
    return finish(out, notebooks_dir, marks)
