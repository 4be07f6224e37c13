"""Finding, checking and rebuilding students' submissions before they are graded (``make grade``).

* ``find_submissions`` maps each student's files to course notebooks without
  following symbolic links, and says what to fix for every file it cannot use;
* ``assemble`` rebuilds the notebook to grade from the release, taking only
  the student's solution cells;
* ``static_flags`` lists what a human should read in the solution cells.
"""

from __future__ import annotations

import ast
import copy
import difflib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
import nbformat.reader


@dataclass
class Result:
    """The outcome of grading one student's notebook."""

    student: str  # folder name of the student
    notebook: str  # notebook stem
    scores: dict[str, float] = field(default_factory=dict)  # grade_id -> points earned (empty if failed)
    failed: str = ""  # why the submission could not be graded; "" when graded
    flags: list[str] = field(default_factory=list)  # what a human should look at (static look, gradebook)

    missing: bool = False  # the student submitted no file for this notebook
    written: dict[str, str] = field(default_factory=dict)  # grade_id -> the student's written answer
    unmarked: list[str] = field(default_factory=list)  # written questions not yet marked by hand
    seconds: float = 0.0  # how long grading it took (not part of the grade)

    @property
    def total(self) -> float:
        return sum(self.scores.values())

    @property
    def status(self) -> str:
        """"graded", "MISSING: <what>" or "FAILED: <reason>"."""
        if self.missing:
            return f"MISSING: {self.failed}"
        if self.failed:
            return f"FAILED: {self.failed}"
        return "graded; to mark by hand: " + ", ".join(self.unmarked) if self.unmarked else "graded"


def find_submissions(submissions: Path, names: set[str]
                      ) -> tuple[dict[tuple[str, str], Path], list[Result], list[str]]:
    """Map (student, notebook stem) -> file, without following symbolic links.

    Returns:
        The files found, a failed ``Result`` for every file that cannot be
        graded (a symbolic link, a name that is not a course notebook, two
        copies of one notebook), and the students' folder names.
    """
    found: dict[tuple[str, str], Path] = {}
    problems: list[Result] = []
    students: list[str] = []
    known = sorted(f"{name}.ipynb" for name in names)
    for entry in sorted(os.scandir(submissions), key=lambda e: e.name):
        if entry.is_symlink():
            problems.append(Result(entry.name, "-", failed="the student's folder is a symbolic link, which grading "
                                                            "never follows: put the notebooks in a real folder"))
            continue
        if not entry.is_dir(follow_symlinks=False):
            continue
        student = entry.name
        students.append(student)
        for folder, subfolders, files in os.walk(entry.path, followlinks=False):
            subfolders[:] = sorted(d for d in subfolders if d != ".ipynb_checkpoints")
            for name in sorted(files):
                if not name.endswith(".ipynb"):
                    continue
                path = Path(folder) / name
                shown = path.relative_to(submissions)
                stem = path.stem
                if path.is_symlink():
                    problems.append(Result(student, stem, failed=f"{shown} is a symbolic link, which grading never "
                                                                   "follows: submit the notebook file itself"))
                elif stem not in names:
                    close = difflib.get_close_matches(name, known, n=1, cutoff=0.75)
                    hint = f": did you mean {close[0]}? Rename it exactly so" if close else ""
                    problems.append(Result(student, stem, failed=f"{name} is not a course notebook{hint}"))
                elif (student, stem) in found:
                    first = found[(student, stem)].relative_to(submissions)
                    problems.append(Result(student, stem, failed=f"two copies of {name} ({first} and {shown}): "
                                                                   "keep one"))
                    del found[(student, stem)]
                elif any(r.student == student and r.notebook == stem for r in problems):
                    continue
                else:
                    found[(student, stem)] = path
    return found, problems, students


def assemble(submission: nbformat.NotebookNode, release_nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """The notebook to grade: the release, with only the student's solution cells put in.

    Every other cell (instructions, test cells, the fallbacks to the reference
    implementation), their order and their metadata are the instructor's. A
    solution cell is matched by its nbgrader ``grade_id``; one the student
    deleted stays as released (unsolved).
    """
    theirs = {c.metadata.get("nbgrader", {}).get("grade_id"): c for c in submission.cells
              if c.metadata.get("nbgrader", {}).get("solution")}
    graded = copy.deepcopy(release_nb)
    for cell in graded.cells:
        meta = cell.metadata.get("nbgrader", {})
        answer = theirs.get(meta.get("grade_id"))
        if meta.get("solution") and answer is not None and answer.cell_type == cell.cell_type:
            cell.source = answer.source if isinstance(answer.source, str) else "".join(answer.source)
    return graded


# What a solution cell never needs; each match is flagged for a human to read.
FLAGS = [
    (r"\bcourse_utils\b", "uses course_utils, where the reference implementations live"),
    (r"\b(exec|eval|compile|__import__)\s*\(", "runs code from a string (exec, eval, compile or __import__)"),
    (r"\bget_ipython\b|\bIPython\b|\bipykernel\b", "reaches into the IPython kernel (get_ipython)"),
    (r"\bsubprocess\b|\bos\.(system|popen|fork|exec\w*|spawn\w*|kill\w*)\b|\bpty\b|\bmultiprocessing\b",
     "starts or signals processes"),
    (r"\bopen\s*\(|\bpathlib\b|\bshutil\b|\bos\.(remove|unlink|rename|replace|mkdir|makedirs|chmod|listdir|"
     r"scandir|walk)\b|\.(write_text|write_bytes|read_text|read_bytes)\b|\btorch\.(load|save)\b|\bglob\b",
     "reads or writes files"),
    (r"\bsqlite3\b|\bsqlalchemy\b|\bgradebook\b", "touches a database"),
    (r"\bsocket\b|\burllib\b|\bhttp\.|\brequests\b", "uses the network"),
    (r"\bsys\.(modules|settrace|setprofile|exit|excepthook)\b|\bbuiltins\b|\bimportlib\b|\bctypes\b|"
     r"\bsignal\b|\batexit\b|\bthreading\b|\bgc\b|\binspect\b", "changes the interpreter or its modules"),
]


def _bound_names(source: str) -> set[str]:
    """Names a cell binds at its top level (def, class, assignment, import), or set() if it does not parse."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return set()
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(alias.asname or alias.name).split(".")[0] for alias in node.names}
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                names |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
    return names


def _used_names(source: str) -> set[str]:
    try:
        return {n.id for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Name)}
    except SyntaxError:
        return set()


def static_flags(submission: nbformat.NotebookNode, release_nb: nbformat.NotebookNode) -> list[str]:
    """What a human should look at in a submission's solution cells (a static look: nothing is run).

    Only what the student wrote is looked at: a line that stands in the released
    cell as well (an import the exercise gives, say) is the instructor's and is
    not flagged. Besides the patterns of ``FLAGS``, a solution cell that rebinds
    a name the test cells use (a checker, say), other than the names the
    released cell itself defines and the exercise's answer (its ``grade_id``),
    is flagged.
    """
    def source_of(cell) -> str:
        return cell.source if isinstance(cell.source, str) else "".join(cell.source)

    tested = set().union(*[_used_names(source_of(c)) for c in release_nb.cells
                           if c.metadata.get("nbgrader", {}).get("grade") and c.cell_type == "code"])
    given = {c.metadata["nbgrader"].get("grade_id"): source_of(c) for c in release_nb.cells
             if c.metadata.get("nbgrader", {}).get("solution") and c.cell_type == "code"}
    released = {grade_id: _bound_names(source) | {grade_id} for grade_id, source in given.items()}
    found = []
    for cell in submission.cells:
        meta = cell.metadata.get("nbgrader", {})
        if not meta.get("solution") or cell.cell_type != "code":
            continue
        grade_id = meta.get("grade_id", "?")
        source = source_of(cell)
        theirs = {line.strip() for line in given.get(grade_id, "").splitlines()}
        written = "\n".join(line for line in source.splitlines() if line.strip() not in theirs)
        for pattern, what in FLAGS:
            if re.search(pattern, written):
                found.append(f"{grade_id}: {what}")
        for name in sorted((_bound_names(source) & tested) - released.get(grade_id, set())):
            found.append(f"{grade_id}: redefines {name}, which the tests use")
    return found


def validate(submission: Path, release_nb: Path, source_nb: Path) -> str:
    """Why a submission cannot be graded, or "" if it can.

    Checks that it is valid notebook JSON and that every graded test cell of
    the release is present and unchanged (nbgrader's checksum): as released,
    or as in the instructor version (which also holds the hidden tests).
    """
    from nbgrader.utils import compute_checksum

    try:
        nb = nbformat.read(submission, as_version=4)
    except (json.JSONDecodeError, UnicodeDecodeError, nbformat.reader.NotJSONError) as exc:
        return f"not valid notebook JSON ({str(exc)[:80]})"
    except Exception as exc:  # noqa: BLE001 - nbformat raises several kinds
        return f"not a readable notebook ({type(exc).__name__}: {exc})"
    cells = {c.metadata.get("nbgrader", {}).get("grade_id"): c for c in nb.cells}
    instructor = {c.metadata.get("nbgrader", {}).get("grade_id"): c
                  for c in nbformat.read(source_nb, as_version=4).cells}
    reference = nbformat.read(release_nb, as_version=4)
    for cell in reference.cells:
        meta = cell.metadata.get("nbgrader", {})
        if not (meta.get("grade") and cell.cell_type == "code"):
            continue
        theirs = cells.get(meta["grade_id"])
        if theirs is None:
            return f"test cell '{meta['grade_id']}' was deleted"
        allowed = {meta.get("checksum"), compute_checksum(instructor[meta["grade_id"]])}
        if theirs.cell_type != "code" or compute_checksum(theirs) not in allowed:
            return f"test cell '{meta['grade_id']}' was edited"
    return ""
