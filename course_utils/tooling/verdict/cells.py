"""Which cells the child runs, and how each test cell runs in the grading process (reads notebooks only)."""

from __future__ import annotations

import ast
import builtins
from dataclasses import dataclass
from typing import Any

import nbformat

CONTEXT_TAG = "grading-context"  # a cell the solutions need that is not in the Setup or Exercises section
_SECTIONS = {"## setup": "setup", "## exercises": "exercises"}


@dataclass(frozen=True)
class Check:
    """One test cell, as the grading process runs it."""

    grade_id: str
    points: float
    source: str  # the instructor's test cell, hidden tests included
    student_names: tuple[str, ...]  # names the cell uses that solution cells define: the child's objects
    prelude: tuple[str, ...]  # the instructor's imports and definitions it needs, run here first
    solution_cells: tuple[int, ...]  # the cells that define student_names
    uncovered: str = ""  # why it cannot run out of the kernel ("" when it can)


@dataclass(frozen=True)
class Plan:
    """What the child runs, and the checks run here."""

    steps: tuple[dict, ...]  # {"cell", "source", "solution": [names]} or {"snapshot": grade_id, "names": [...]}
    checks: tuple[Check, ...]
    kernel: tuple[int, ...] = ()  # the code cells autograding runs in the kernel: the child's, the tests, definitions


def _source(cell) -> str:
    return cell.source if isinstance(cell.source, str) else "".join(cell.source)


def as_python(source: str) -> str:
    """A cell's source with IPython's magics turned into plain Python."""
    from IPython.core.inputtransformer2 import TransformerManager

    try:
        return TransformerManager().transform_cell(source)
    except Exception:  # noqa: BLE001 - whatever IPython cannot transform does not parse either
        return source


def _parse(source: str) -> ast.Module | None:
    try:
        return ast.parse(as_python(source))
    except SyntaxError:
        return None


def _free_names(tree: ast.Module) -> set[str]:
    """Names a cell reads that it never binds (anywhere in it), builtins aside."""
    loaded, bound = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (loaded if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
    return loaded - bound - set(dir(builtins))


def _stored_names(node: ast.AST) -> set[str]:
    """Names a statement binds in the notebook's namespace (inside if, for, with and try blocks too)."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return {(alias.asname or alias.name).split(".")[0] for alias in node.names}
    if isinstance(node, ast.Name):
        return {node.id} if isinstance(node.ctx, (ast.Store, ast.Del)) else set()
    if isinstance(node, (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
        return set()  # their own scope
    names = {node.name} if isinstance(node, ast.ExceptHandler) and node.name else set()
    for child in ast.iter_child_nodes(node):
        names |= _stored_names(child)
    return names


def _definition_only(tree: ast.Module) -> bool:
    """True if a cell only imports and defines (running it here has no other effect)."""
    allowed = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    return all(isinstance(s, allowed) or (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))
               for s in tree.body)


def _grade_meta(cell) -> dict:
    return cell.metadata.get("nbgrader", {}) if cell.cell_type == "code" else {}


def _is_test(cell) -> bool:
    meta = _grade_meta(cell)
    return bool(meta.get("grade")) and not meta.get("solution")


def plan(graded: nbformat.NotebookNode, source: nbformat.NotebookNode) -> Plan:
    """The child's steps and the checks of a notebook to grade.

    Args:
        graded: The notebook being graded (the release with the student's solution cells).
        source: The instructor's notebook (test cells with their hidden tests).

    Returns:
        The plan: the instructor's cells give the structure, the solution cells
        come from ``graded`` (matched by nbgrader ``grade_id``).
    """
    theirs = {_grade_meta(c).get("grade_id"): _source(c) for c in graded.cells if _grade_meta(c).get("solution")}
    bindings: dict[str, tuple[str, Any]] = {}  # name -> (kind, detail), the latest binding in notebook order
    steps: list[dict] = []
    checks: list[Check] = []
    kernel: list[int] = []
    section = ""
    for index, cell in enumerate(source.cells):
        if cell.cell_type == "markdown":
            fenced = False
            for line in _source(cell).splitlines():
                fenced ^= line.lstrip().startswith("```")
                if not fenced and (line.startswith("## ") or line.startswith("# ")):  # a new section
                    section = _SECTIONS.get(line.strip().lower(), "")
            continue
        if cell.cell_type != "code":
            continue
        meta = _grade_meta(cell)
        text = _source(cell)
        tree = _parse(text)
        if _is_test(cell):
            checks.append(_check(meta, text, tree, bindings))
            steps.append({"snapshot": meta["grade_id"], "names": list(checks[-1].student_names)})
            kernel.append(index)
            for name in _stored_names(tree) if tree is not None else ():
                bindings[name] = ("state", index)
            continue
        solution = bool(meta.get("solution"))
        if tree is None:  # not Python: it runs in the child (if it should), nothing of it runs here
            tree = ast.Module(body=[], type_ignores=[])
        definitions = not solution and _definition_only(tree)
        theirs_here = set()
        for statement in tree.body:
            if isinstance(statement, (ast.Import, ast.ImportFrom)):  # the instructor's import, even in a solution
                for alias in statement.names:
                    single = (ast.Import(names=[alias]) if isinstance(statement, ast.Import)
                              else ast.ImportFrom(module=statement.module, names=[alias], level=statement.level))
                    bindings[(alias.asname or alias.name).split(".")[0]] = ("import", ast.unparse(single))
            elif definitions and isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                bindings[statement.name] = ("define", (index, text, tree))
            else:
                for name in _stored_names(statement):
                    bindings[name] = ("student", index) if solution else ("state", index)
                    theirs_here |= {name} if solution else set()
        if solution:
            steps.append({"cell": index, "source": theirs.get(meta.get("grade_id"), text),
                          "solution": sorted(theirs_here)})
            kernel.append(index)
        elif section in ("setup", "exercises") or CONTEXT_TAG in cell.metadata.get("tags", []):
            steps.append({"cell": index, "source": text, "solution": []})
            kernel.append(index)
        elif definitions:  # imports and definitions only (a checker, say): cheap, and a test cell may use them
            kernel.append(index)
    return Plan(tuple(steps), tuple(checks), tuple(kernel))


def _check(meta: dict, text: str, tree: ast.Module | None, bindings: dict[str, tuple[str, Any]]) -> Check:
    """How to run one test cell here: which names are the student's, which the instructor's."""
    grade_id, points = meta["grade_id"], float(meta.get("points", 0))
    if tree is None:
        return Check(grade_id, points, text, (), (), (), uncovered="the test cell is not valid Python")
    student, prelude, cells, problems = set(), {}, set(), []
    queue, seen = sorted(_free_names(tree)), set()
    direct = set(queue)
    while queue:
        name = queue.pop(0)
        if name in seen:
            continue
        seen.add(name)
        kind, detail = bindings.get(name, ("none", None))
        if kind == "student":
            student.add(name)
            cells.add(detail)
        elif kind == "import":
            prelude.setdefault((-1, detail), detail)
        elif kind == "define":
            index, source, definition = detail
            prelude[(index, "")] = source
            queue += sorted(_free_names(definition))
        elif name in direct:  # a name a definition uses but cannot resolve fails when it runs, not here
            where = f"cell {detail} sets it by running code" if kind == "state" else "no cell before it binds it"
            problems.append(f"`{name}` ({where}; tag the cell that defines it `{CONTEXT_TAG}`, or import it)")
    uncovered = ("the test cell uses " + ", ".join(problems)) if problems else ""
    ordered = tuple(source for _, source in sorted(prelude.items(), key=lambda item: item[0]))
    return Check(grade_id, points, text, tuple(sorted(student)), ordered, tuple(sorted(cells)), uncovered)
