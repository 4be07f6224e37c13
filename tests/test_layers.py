"""The layers of course_utils, checked by import-linter (contracts in pyproject.toml).

tooling > checks > experiments > blocks > core: a module imports only from
layers below its own, the experiments and the checkers do not import each
other, and no package has an import cycle. The second test shows the check
can fail: it adds an upward import to a copy of the package and expects
import-linter to report the broken contract.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def lint_imports(cwd: Path) -> subprocess.CompletedProcess:
    """Run import-linter on the ``course_utils`` found in ``cwd``, without its cache."""
    result = subprocess.run([str(Path(sys.executable).with_name("lint-imports")), "--no-cache"], cwd=cwd,
                            capture_output=True, text=True, env={"PYTHONPATH": str(cwd), "PATH": "/usr/bin:/bin"})
    result.stdout = " ".join(result.stdout.split())  # the report wraps long lines
    return result


def test_layers_and_no_cycles():
    result = lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "5 kept, 0 broken" in result.stdout, result.stdout


def lint_with_import(tmp_path: Path, module: str, statement: str) -> subprocess.CompletedProcess:
    """import-linter on a copy of the package in which ``module`` (a path under course_utils/) gains ``statement``."""
    shutil.copytree(ROOT / "course_utils", tmp_path / "course_utils", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    target = tmp_path / "course_utils" / module
    target.write_text(target.read_text() + f"\n{statement}\n")
    return lint_imports(tmp_path)


def test_an_upward_import_breaks_the_contract(tmp_path):
    result = lint_with_import(tmp_path, "blocks/masks.py", "from course_utils.experiments import training")
    assert result.returncode != 0, result.stdout
    assert "course_utils.blocks is not allowed to import course_utils.experiments" in result.stdout, result.stdout
    assert "course_utils.blocks.masks -> course_utils.experiments.training" in result.stdout, result.stdout


def test_an_experiment_importing_another_breaks_the_contract(tmp_path):
    result = lint_with_import(tmp_path, "experiments/neighbours.py", "from course_utils.experiments import order")
    assert result.returncode != 0, result.stdout
    assert "course_utils.experiments.neighbours is not allowed to import course_utils.experiments.order" \
        in result.stdout, result.stdout


def test_a_cycle_breaks_the_contract(tmp_path):
    # transformer imports multihead; multihead importing transformer closes a cycle
    result = lint_with_import(tmp_path, "blocks/multihead.py", "from course_utils.blocks import transformer")
    assert result.returncode != 0, result.stdout
    assert "No import cycles anywhere in course_utils BROKEN" in result.stdout, result.stdout
    assert "course_utils.blocks.multihead -> course_utils.blocks.transformer" in result.stdout, result.stdout


def test_no_module_is_longer_than_500_lines():
    long = {str(p.relative_to(ROOT)): n for p in (ROOT / "course_utils").rglob("*.py")
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > 500}
    assert not long, f"split these modules (over 500 lines): {long}"


def test_no_notebook_imports_the_tooling():
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        code = "\n".join("".join(c["source"]) for c in json.loads(path.read_text(encoding="utf-8"))["cells"]
                         if c["cell_type"] == "code")
        assert "course_utils.tooling" not in code and "from course_utils import tooling" not in code, \
            f"{path.name} imports course_utils.tooling: the course's tools are not for notebooks"
