"""Portable outputs: the pinned CPU code paths, the platform check, and no stopwatch inside a notebook."""

from __future__ import annotations

import ast
import json
import re

import pytest

from course_utils.core import portable
from course_utils.tooling.bench import (NOTEBOOK_BUDGET, SERIES_BUDGET, TRAINING_BUDGET, NotebookTiming, budget_failures,
                                report, stated_runtime)
from course_utils.experiments.loop import BENCH_LOG_ENV, record_training
from course_utils.core.reproducibility import UNPINNED_NOTE, error_bound, setup
from tests.conftest import NOTEBOOKS, pytest_configure


def test_this_test_run_is_pinned():
    # make test runs here, on the platform the outputs were committed from; the kernels inherit these settings.
    assert portable.platform_matches(), "the committed outputs come from x86-64 Linux with AVX2"
    assert portable.pinned(), "this process lacks a pinned setting, or torch chose another code path"


def test_every_pinned_setting_is_documented_in_the_readme(root):
    readme = (root / "README.md").read_text(encoding="utf-8")
    for key, value in portable.PINNED_ENV.items():
        assert f"`{key}={value}`" in readme, f"README's Tests section should name {key}={value} and what it changes"


def test_kernel_spec_carries_the_pins(tmp_path):
    path = portable.install_kernel(str(tmp_path))
    spec = json.loads(path.read_text())
    assert spec["env"] == portable.PINNED_ENV
    assert spec["argv"][1:3] == ["-m", "ipykernel_launcher"]


def test_make_setup_installed_the_pinned_kernel_for_make_lab():
    import sys
    from pathlib import Path

    path = Path(sys.prefix) / "share" / "jupyter" / "kernels" / portable.KERNEL_NAME / "kernel.json"
    assert path.exists(), "run make setup: it writes the kernel spec that JupyterLab uses"
    assert json.loads(path.read_text())["env"] == portable.PINNED_ENV


def test_an_explicit_setting_wins_and_other_platforms_get_none(monkeypatch):
    env = portable.pin_environment({"MKL_CBWR": "AUTO"})
    assert env["MKL_CBWR"] == "AUTO" and env["ATEN_CPU_CAPABILITY"] == "avx2"
    monkeypatch.setattr(portable, "platform_matches", lambda: False)
    assert portable.pin_environment({}) == {}
    assert "not compared" in portable.describe_platform()
    assert not portable.pinned()


def test_other_platforms_check_asserts_without_comparing_outputs(monkeypatch):
    class Options:
        nbval, nbval_lax = True, False

    class Config:
        option = Options()

    import tests.conftest as conftest

    pytest_configure(Config())
    assert Config.option.nbval_lax is False
    monkeypatch.setattr(conftest, "platform_matches", lambda: False)
    pytest_configure(Config())
    assert Config.option.nbval_lax is True


def test_setup_says_so_when_the_kernel_is_not_pinned(monkeypatch, capsys):
    setup()
    assert UNPINNED_NOTE not in capsys.readouterr().err
    monkeypatch.setattr(portable, "platform_matches", lambda: False)
    setup()
    assert UNPINNED_NOTE in capsys.readouterr().err


@pytest.mark.parametrize("error, text", [(0.0, "< 1e-05"), (4.3e-7, "< 1e-05"), (4.0e-7, "< 1e-05"),
                                         (2e-5, "2.00e-05"), (0.25, "2.50e-01")])
def test_error_bound(error, text):
    assert error_bound(error) == text


def test_error_bound_takes_a_tolerance_and_a_tensor_that_needs_grad():
    import torch

    x = torch.tensor(3e-7, requires_grad=True)
    assert error_bound(x, tol=1e-6) == "< 1e-06" and error_bound(2 * x, tol=1e-7) == "6.00e-07"


def test_error_bound_rejects_nan_and_negative():
    for bad in (float("nan"), -1e-7):
        with pytest.raises(ValueError, match="error >= 0"):
            error_bound(bad)


def _time_asserts(source: str) -> list[str]:
    """Asserts that compare a time (a name with 'second' or a perf_counter call) with a bare number."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Assert):
            continue
        for compare in (n for n in ast.walk(node.test) if isinstance(n, ast.Compare)):
            sides = [compare.left, *compare.comparators]
            timed = any(re.search(r"second|perf_counter|monotonic|elapsed", ast.unparse(s)) for s in sides)
            bare = any(isinstance(s, ast.Constant) for s in sides)
            if timed and bare:
                found.append(ast.unparse(node))
    return found


def test_the_wall_clock_assert_scan_finds_one():
    assert _time_asserts("assert plain.train.seconds <= 45, 'budget'")
    assert _time_asserts("assert time.perf_counter() - start < 20")
    assert not _time_asserts("assert max(seconds.values()) < 4 * min(seconds.values())")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_no_notebook_asserts_on_elapsed_time(path):
    nb = json.loads(path.read_text(encoding="utf-8"))
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] != "code":
            continue
        source = "\n".join(l for l in "".join(cell["source"]).splitlines() if not l.lstrip().startswith(("%", "!")))
        assert not _time_asserts(source), f"cell {i} asserts on elapsed time; budgets belong in make bench"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_notebook_states_its_runtime(path):
    # make bench holds the notebook to the smaller of this and NOTEBOOK_BUDGET, and says which it exceeds.
    seconds = stated_runtime(path)
    assert seconds is not None, "the first cell needs '*Runtime:* under N CPU minutes' (make bench checks it)"
    assert 0 < seconds <= 5 * NOTEBOOK_BUDGET


def test_budgets_flag_what_is_over():
    fine = NotebookTiming("00_a.ipynb", 10.0, 60.0, [("model", 5.0)])
    assert budget_failures([fine]) == []
    slow = NotebookTiming("01_b.ipynb", 70.0, 60.0, [("model", TRAINING_BUDGET + 1)])
    failures = budget_failures([fine, slow])
    assert any("01_b.ipynb: 70.0 s, over its budget of 60 s" in f for f in failures)
    assert any("training run 'model'" in f for f in failures)
    many = [NotebookTiming(f"{i:02d}_c.ipynb", 80.0, 90.0) for i in range(4)]
    assert any("the series" in f for f in budget_failures(many)) and 4 * 80.0 > SERIES_BUDGET
    assert any("states no" in f for f in budget_failures([NotebookTiming("02_d.ipynb", 1.0, None)]))
    assert "OVER" in report([slow]) and "OVER" not in report([fine])


def test_training_runs_report_to_the_bench_log_only_when_asked(tmp_path, monkeypatch):
    log = tmp_path / "runs.jsonl"
    monkeypatch.delenv(BENCH_LOG_ENV, raising=False)
    record_training("quiet", 1.0)
    assert not log.exists()
    monkeypatch.setenv(BENCH_LOG_ENV, str(log))
    from course_utils.experiments import scaling

    scaling.train_recall(scaling.RecallConfig(steps=2, test_size=16), seed=0)
    (entry,) = map(json.loads, log.read_text().splitlines())
    assert entry["label"].startswith("recall model") and entry["seconds"] > 0


def _parse(source: str) -> ast.Module:
    lines = [l for l in source.splitlines() if not l.lstrip().startswith(("%", "!"))]
    return ast.parse("\n".join(lines))


def _defined(tree: ast.Module) -> set[str]:
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    return names | {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef))}


def _asserted_names(tree: ast.Module) -> set[str]:
    return {n.id for a in ast.walk(tree) if isinstance(a, ast.Assert) for n in ast.walk(a) if isinstance(n, ast.Name)}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_ignored_output_is_covered_by_an_assert(path):
    """A cell whose output nbval ignores asserts its claim itself, or a later cell asserts on what it computed."""
    code = [_parse("".join(c["source"])) for c in json.loads(path.read_text(encoding="utf-8"))["cells"]
            if c["cell_type"] == "code"]
    tags = [c.get("metadata", {}).get("tags", []) for c in json.loads(path.read_text(encoding="utf-8"))["cells"]
            if c["cell_type"] == "code"]
    for i, tree in enumerate(code):
        if "nbval-ignore-output" not in tags[i]:
            continue
        if any(isinstance(n, ast.Assert) for n in ast.walk(tree)):
            continue
        later = set().union(*(_asserted_names(t) for t in code[i + 1 :]))
        assert _defined(tree) & later, (
            f"code cell {i} ignores its output, and neither it nor a later cell asserts on what it computes:\n"
            + ast.unparse(tree)[:300])


def test_the_coverage_rule_catches_an_unasserted_cell():
    ignored, later = _parse("x = train()\nprint(x)"), _parse("assert y > 0")
    assert not _defined(ignored) & _asserted_names(later)
    assert _defined(ignored) & _asserted_names(_parse("assert x.accuracy > 0.9"))
