"""Portable outputs: the pinned CPU code paths, the platform check, and no stopwatch inside a notebook."""

from __future__ import annotations

import ast
import json
import re

import nbformat
import pytest
from IPython.core.inputtransformer2 import TransformerManager

from course_utils.core import portable
from course_utils.tooling.bench import (NOTEBOOK_BUDGET, SERIES_BUDGET, TRAINING_BUDGET, NotebookTiming, budget_failures,
                                read_log, report, stated_runtime)
from course_utils.experiments.loop import BENCH_LOG_ENV, record_training, timing_claim, timing_claims
from course_utils.core.reproducibility import UNPINNED_NOTE, error_bound, setup
from course_utils.tooling import pytest_plugin
from course_utils.tooling.pytest_plugin import pytest_configure
from course_utils.tooling.execute import (IGNORE_OUTPUT, STAMP_COMMAND, STAMP_FIELD, STAMP_KEY, source_sha256,
                                          stamp_ignored_outputs)
from tests.conftest import LAB, NOTEBOOKS, ROOT


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

    pytest_configure(Config())
    assert Config.option.nbval_lax is False
    monkeypatch.setattr(pytest_plugin, "platform_matches", lambda: False)
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


# --- No stopwatch inside a notebook -----------------------------------------------------------------------------
#
# The rule: no assert in a notebook code cell may involve a measured time, absolute ("under 20 s") or relative
# ("three times faster", "a log-log slope near 2", "the ratio grows"). A slow laptop or a busy shared core changes
# every one of them, and Run All must not stop on a stopwatch. A claim about time goes to
# course_utils.experiments.loop.timing_claim instead, and `make bench` checks it on the reference machine.
#
# The scan reads the code cells in order, as the kernel runs them, and treats a value as a measured time when
#   1. a timer made it: a call of a function whose name starts with time or timeit (time.time, time_call,
#      time_layers, time_generation, timeit.timeit) or is perf_counter, monotonic, process_time, thread_time,
#      default_timer, *_time, blocked_autorange (each with an optional _ns etc.), a %time or %timeit magic, a
#      function imported from the time or timeit module, or a function the notebook defines that returns one;
#   2. its name says so: a name or attribute with a word, between underscores, such as second(s), elapsed, time(s),
#      timing(s), duration, ms, runtime or latency (`seconds`, `run.seconds`, `attention_time`, `timings`);
#   3. it is computed from one: a name bound (=, +=, for ... in, with ... as, :=, .append and the like) from an
#      expression that involves a measured time is one, in later cells too, until it is bound again to a value that
#      is not (`per_token = [time_generation(...)]`, `slopes[D] = fit_slope(lengths, t.attention)`,
#      `for D, t in timings.items()`, `first = t.attention[0] / t.recurrent[0]`).
# Only the condition of an assert counts, not its message. The scan errs on the safe side: a value taken from a
# measured time (its length, its loop variable) counts too; name it and compute it without the time.

_TIME_WORDS = {"second", "seconds", "sec", "secs", "elapsed", "time", "times", "timing", "timings", "duration",
               "durations", "ms", "millisecond", "milliseconds", "runtime", "runtimes", "latency", "latencies", "wallclock"}
_TIMER = re.compile(r"(time|timeit|perf_counter|monotonic|process_time|thread_time)(_\w*)?|\w+_time(_ns)?"
                    r"|default_timer|blocked_autorange|adaptive_autorange")
_MUTATORS = {"append", "extend", "insert", "update", "add", "setdefault"}
_COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)


def _spelled_as_time(name: str) -> bool:
    return bool(_TIME_WORDS & set(name.lower().split("_")))


def _target_names(target: ast.AST) -> list[str]:
    return [n.id for n in ast.walk(target) if isinstance(n, ast.Name)]


class _TimeFlow:
    """Follows measured times through a notebook's code cells (the rule above) and collects the asserts on them."""

    def __init__(self) -> None:
        self.timed: set[str] = set()  # names that hold a measured time now
        self.timers: set[str] = set()  # functions imported or defined in the notebook that return one
        self.found: dict[tuple[int, int], str] = {}  # (code cell, line) -> assert; a loop's body is read twice
        self.cell = 0
        self._returns: list[bool] = []  # per function being read: does it return a measured time?

    def is_timer(self, call: ast.Call) -> bool:
        func = call.func
        name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
        if name in ("run_line_magic", "run_cell_magic"):  # %time, %timeit, %%time, %%timeit after IPython's transform
            first = call.args[0] if call.args else None
            return isinstance(first, ast.Constant) and first.value in ("time", "timeit")
        return name in self.timers or bool(_TIMER.fullmatch(name.lower()))

    def is_timed(self, node: ast.AST, local: dict[str, bool] | None = None) -> bool:
        """Whether the expression involves a measured time; ``local``: a comprehension's own names."""
        local = local or {}
        if isinstance(node, _COMPREHENSIONS):
            local = dict(local)
            for gen in node.generators:
                over_time = self.is_timed(gen.iter, local)
                local.update(dict.fromkeys(_target_names(gen.target), over_time))
                if over_time or any(self.is_timed(cond, local) for cond in gen.ifs):
                    return True
            parts = [node.key, node.value] if isinstance(node, ast.DictComp) else [node.elt]
            return any(self.is_timed(part, local) for part in parts)
        if isinstance(node, ast.Lambda):
            local = {**local, **dict.fromkeys((a.arg for a in ast.walk(node.args) if isinstance(a, ast.arg)), False)}
            return self.is_timed(node.body, local)
        if isinstance(node, ast.Name):
            return local[node.id] if node.id in local else node.id in self.timed or _spelled_as_time(node.id)
        if isinstance(node, ast.Attribute) and _spelled_as_time(node.attr):
            return True
        if isinstance(node, ast.Call) and self.is_timer(node):
            return True
        return any(self.is_timed(child, local) for child in ast.iter_child_nodes(node))

    def bind(self, target: ast.AST, timed: bool) -> None:
        if isinstance(target, ast.Name):
            (self.timed.add if timed else self.timed.discard)(target.id)
        elif isinstance(target, (ast.Tuple, ast.List)):
            for element in target.elts:
                self.bind(element, timed)
        elif isinstance(target, ast.Starred):
            self.bind(target.value, timed)
        elif isinstance(target, (ast.Subscript, ast.Attribute)) and timed:  # x[i][j] = t or x.y = t: x now holds one
            base = target
            while isinstance(base, (ast.Subscript, ast.Attribute)):
                base = base.value
            if isinstance(base, ast.Name):
                self.timed.add(base.id)

    def read(self, statements: list[ast.stmt]) -> None:
        for statement in statements:
            self.statement(statement)

    def statement(self, node: ast.stmt) -> None:
        for walrus in (n for n in ast.walk(node) if isinstance(n, ast.NamedExpr)):
            self.bind(walrus.target, self.is_timed(walrus.value))
        if isinstance(node, ast.Assert):
            if self.is_timed(node.test):
                self.found[self.cell, node.lineno] = ast.unparse(node)
        elif isinstance(node, ast.Assign):
            timed = self.is_timed(node.value)
            for target in node.targets:
                self.bind(target, timed)
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            self.bind(node.target, self.is_timed(node.value))
        elif isinstance(node, ast.AugAssign) and self.is_timed(node.value):
            self.bind(node.target, True)
        elif isinstance(node, (ast.For, ast.AsyncFor)):
            self.bind(node.target, self.is_timed(node.iter))
            self.read(node.body + node.body + node.orelse)  # twice: what one pass binds, the next pass reads
        elif isinstance(node, ast.While):
            self.read(node.body + node.body + node.orelse)
        elif isinstance(node, ast.If):
            before = set(self.timed)
            self.read(node.body)
            after_body, self.timed = self.timed, before
            self.read(node.orelse)
            self.timed |= after_body
        elif isinstance(node, (ast.With, ast.AsyncWith)):
            for item in node.items:
                if item.optional_vars is not None:
                    self.bind(item.optional_vars, self.is_timed(item.context_expr))
            self.read(node.body)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            outer = set(self.timed)
            self.timed -= {a.arg for a in ast.walk(node.args) if isinstance(a, ast.arg)}
            self._returns.append(False)
            self.read(node.body)
            if self._returns.pop():
                self.timers.add(node.name)
            self.timed = outer
        elif isinstance(node, ast.Return):
            if self._returns and node.value is not None and self.is_timed(node.value):
                self._returns[-1] = True
        elif isinstance(node, ast.ImportFrom) and node.module in ("time", "timeit"):
            self.timers.update(a.asname or a.name for a in node.names if a.name != "sleep")
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
            call = node.value
            if (isinstance(call.func, ast.Attribute) and call.func.attr in _MUTATORS
                    and any(self.is_timed(a) for a in [*call.args, *(k.value for k in call.keywords)])):
                self.timed.update(_target_names(call.func.value)[:1])  # times.append(t): times now holds one
        else:  # try, match, class: their statements in order
            for field in ("body", "handlers", "orelse", "finalbody", "cases"):
                for child in getattr(node, field, []):
                    if isinstance(child, (ast.ExceptHandler, ast.match_case)):
                        self.read(child.body)
                    else:
                        self.statement(child)


def _time_asserts(cells: list[str]) -> list[tuple[int, str]]:
    """The asserts on a measured time in these code cells, run in order: (index of the cell in ``cells``, assert)."""
    flow = _TimeFlow()
    for flow.cell, source in enumerate(cells):
        flow.read(_parse(source).body)
    return [(cell, text) for (cell, _), text in sorted(flow.found.items())]


def _code_cells(nb: dict) -> dict[int, str]:
    """{index of the cell among all cells, from 0: its source}, for the code cells."""
    return {i: "".join(c["source"]) for i, c in enumerate(nb["cells"]) if c["cell_type"] == "code"}


def test_the_wall_clock_assert_scan_finds_one():
    # absolute times, by name or by timer
    assert _time_asserts(["assert plain.train.seconds <= 45, 'budget'"])
    assert _time_asserts(["assert time.perf_counter() - start < 20"])
    assert _time_asserts(["from time import perf_counter as clock\nstart = clock()\nf()\nstop = clock()",
                          "assert stop - start < 20"])
    assert _time_asserts(["r = %timeit -o f()", "assert r.best < 1e-3"])
    # a time stored deep in a container marks the container (not the index names)
    assert _time_asserts(["cost = {}\nfor H in (1, 2):\n    for part in ('a', 'b'):\n"
                          "        cost[H][part] = efficiency.time_call(f)", "assert cost[2]['a'] < 2 * cost[1]['a']"])
    # relative times: two times compared with each other are still times
    assert _time_asserts(["assert max(seconds.values()) < 4 * min(seconds.values())"])
    # notebook 08 before make bench checked its claims, cell by cell: timings -> slopes, ratios, a width sweep
    old_08 = [
        "timings = {D: efficiency.time_layers(lengths, D, repeats=5) for D in (32, 128)}\nslopes = {}\n"
        "for D, t in timings.items():\n"
        "    slopes[D] = {kind: fit_slope(lengths, getattr(t, kind), log=True) for kind in ('attention', 'fused')}",
        "for D, s in slopes.items():\n    assert 1.6 <= s['fused'] <= 2.4",
        "for D, t in timings.items():\n"
        "    first, last = t.attention[0] / t.recurrent[0], t.attention[-1] / t.recurrent[-1]\n"
        "    assert last > 4 * first\n    assert max(t.attention[0], t.fused[0]) < t.recurrent[0]",
        "by_width = [efficiency.time_layers([512], D, repeats=3) for D in widths]\n"
        "width_curves = {'recurrent': [t.recurrent[0] for t in by_width]}",
        "for kind, values in width_curves.items():\n    assert values[-1] > 2 * values[0]\n"
        "recurrent = width_curves['recurrent']\nassert recurrent[2] < 1.5 * recurrent[0]",
        "with torch.no_grad():\n    sequential = efficiency.time_call(lambda: rnn(x[None]))\n"
        "    batched = efficiency.time_call(lambda: rnn(x[:, None]))",
        "assert sequential > 3 * batched",
        "with torch.no_grad():\n    times = {'naive': efficiency.time_call(lambda: f(q, k, v), repeats=3)}\n"
        "assert times['PyTorch fused'] < times['naive']",
    ]
    assert [cell for cell, _ in _time_asserts(old_08)] == [1, 2, 2, 4, 4, 6, 7]
    # notebook 09's cache timing, and a function of the notebook's own that times
    assert _time_asserts(["per_token = {use: [lm.time_generation(m, T, use_cache=use) for T in lengths]\n"
                          "             for use in (False, True)}",
                          "assert per_token[False][-1] > 2 * per_token[True][-1]"])
    assert _time_asserts(["def clock(f):\n    start = time.perf_counter()\n    f()\n"
                          "    return time.perf_counter() - start",
                          "took = [clock(f) for f in fs]\nassert took[0] < took[1]"])
    # ordinary asserts pass: counts, memory, losses, a slope of a variance, and a name bound again to a count
    ordinary = ["madds = {T: attention_madds(T, 64) for T in lengths}\nassert madds[4096] > 10 * madds[16]",
                "memory = {k: efficiency.peak_memory_curve(k, [2048, 4096], 64) for k in kinds}\n"
                "assert memory['naive'][-1] > 3 * memory['tiled'][-1]",
                "run = fit(model, optimizer, step_loss, 10, 'x')\nassert run.losses[-1] < run.losses[0]",
                "slope = fit_slope(Dks, list(variance.values()))\nassert 0.95 < slope < 1.05",
                "for D, t in timings.items():\n    pass\nT, D = 1024, 64\n"
                "assert attention_madds(T, D) > recurrent_madds(T, D)",
                "assert all(share[n] == (n + 1) / (2 * n) for n in share)"]
    assert _time_asserts(ordinary) == []


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_no_notebook_asserts_on_elapsed_time(path):
    cells = _code_cells(json.loads(path.read_text(encoding="utf-8")))
    found = [(list(cells)[code], text) for code, text in _time_asserts(list(cells.values()))]
    assert not found, (f"{path.name} asserts on measured time (cell, counting all cells from 0; assert): {found}. "
                       "A time depends on the machine and its load: state the claim with "
                       "course_utils.experiments.loop.timing_claim, which make bench checks, instead (the rule is "
                       "above _TIME_WORDS in tests/test_portable.py)")


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
    many = [NotebookTiming(f"{i:02d}_c.ipynb", 50.0, 60.0) for i in range(8)]
    assert any("the series" in f for f in budget_failures(many)) and 8 * 50.0 > SERIES_BUDGET
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


def test_a_timing_claim_that_did_not_hold_fails_the_bench_and_the_report_shows_every_claim():
    held = NotebookTiming("08_a.ipynb", 10.0, 60.0, [("model", 5.0)],
                          [("the batched run is more than 3x faster", True)])
    failed = NotebookTiming("09_b.ipynb", 10.0, 60.0, [], [("the cache saves more than half the time", False)])
    assert budget_failures([held]) == []
    assert budget_failures([held, failed]) == [
        "09_b.ipynb: timing claim did not hold: the cache saves more than half the time"]
    table = report([held, failed])
    assert "claim held: the batched run is more than 3x faster" in table
    assert "claim DID NOT HOLD: the cache saves more than half the time" in table
    assert "training: model" in table


def test_the_bench_log_holds_training_runs_and_claims(tmp_path, monkeypatch):
    log = tmp_path / "runs.jsonl"
    monkeypatch.setenv(BENCH_LOG_ENV, str(log))
    record_training("model", 1.25)
    assert timing_claim("the loop is faster", True) is True
    assert timing_claim("the fused call is faster", 0) is False  # any truth value; the log gets a bool
    assert read_log(log.read_text()) == ([("model", 1.25)], [("the loop is faster", True),
                                                              ("the fused call is faster", False)])
    for bad in ('{"label": "model"}', '{"claim": "x", "holds": "yes"}', '[1, 2]'):
        with pytest.raises(ValueError, match=r"line 2 is .*record_training.*timing_claim"):
            read_log('{"label": "model", "seconds": 1.0}\n' + bad)


def test_a_timing_claim_writes_only_under_make_bench_and_needs_a_statement(tmp_path, monkeypatch):
    log = tmp_path / "runs.jsonl"
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(BENCH_LOG_ENV, raising=False)
    assert timing_claim("quiet", False) is False  # never raises on a false claim
    monkeypatch.setenv(BENCH_LOG_ENV, "")
    assert timing_claim("quiet", True) is True
    assert list(tmp_path.iterdir()) == [], "without make bench's log, a claim writes nothing, anywhere"
    monkeypatch.setenv(BENCH_LOG_ENV, str(log))
    for empty in ("", "   ", None):
        with pytest.raises(TypeError, match="non-empty string"):
            timing_claim(empty, True)
    assert not log.exists()
    timing_claim("said", True)
    assert [json.loads(line) for line in log.read_text().splitlines()] == [{"claim": "said", "holds": True}]


def test_timing_claims_logs_each_claim_and_prints_whether_it_held(tmp_path, monkeypatch, capsys):
    log = tmp_path / "runs.jsonl"
    monkeypatch.setenv(BENCH_LOG_ENV, str(log))
    timing_claims({"a is faster": True, "b is faster": False})
    assert capsys.readouterr().out.splitlines() == ["✓ held in this run: a is faster", "✗ did not hold in this run: b is faster"]
    assert [json.loads(line) for line in log.read_text().splitlines()] == [
        {"claim": "a is faster", "holds": True}, {"claim": "b is faster", "holds": False}]
    assert _checks(_parse("timing_claims({'a is faster': t_a < t_b})")), "a timing_claims call counts as a check"


def _parse(source: str) -> ast.Module:
    """A code cell as Python: IPython's own transform turns %magics and !commands into calls, as the kernel does.

    A %%cell magic's body is read as the Python it usually is (%%time, %%capture); if it is not (%%bash), nothing.
    """
    if source.lstrip().startswith("%%"):
        try:
            return ast.parse(source.lstrip().partition("\n")[2])
        except SyntaxError:
            return ast.Module(body=[], type_ignores=[])
    return ast.parse(TransformerManager().transform_cell(source))


def _defined(tree: ast.Module) -> set[str]:
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    return names | {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef))}


def _checks(tree: ast.Module) -> list[ast.AST]:
    """A cell's checks: its asserts, and its calls of ``timing_claim`` or ``timing_claims``.

    A timing claim counts as the check of what it names. A claim about measured time may not be asserted in a
    notebook (test_no_notebook_asserts_on_elapsed_time), so a timing cell can have no other check; ``timing_claim``
    hands it to ``make bench``, which fails when it does not hold on the reference machine.
    """
    def claims(node: ast.AST) -> bool:
        func = getattr(node, "func", None)
        name = getattr(func, "id", None) or getattr(func, "attr", None)
        return isinstance(node, ast.Call) and name in ("timing_claim", "timing_claims")

    return [n for n in ast.walk(tree) if isinstance(n, ast.Assert) or claims(n)]


def _names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _checked_names(tree: ast.Module) -> set[str]:
    """The names a cell's checks are computed from.

    Those named in a check, and, within the cell, those that went into a name a check reads: a cell may first
    gather its claims (``claims = {"...": sequential > 3 * batched}``) and then state each one
    (``timing_claims(claims)``), which checks ``sequential``.
    """
    feeds: dict[str, set[str]] = {}  # name -> the names of the values bound to it in this cell
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and node.value is not None:
            targets, value = getattr(node, "targets", [getattr(node, "target", None)]), node.value
        elif isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)):
            targets, value = [node.target], node.iter
        else:
            continue
        for name in set().union(*map(_names, targets)):
            feeds.setdefault(name, set()).update(_names(value))
    checked = set().union(set(), *map(_names, _checks(tree)))
    todo = list(checked)
    while todo:
        for name in feeds.get(todo.pop(), set()) - checked:
            checked.add(name)
            todo.append(name)
    return checked


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_ignored_output_is_covered_by_an_assert(path):
    """A cell whose output nbval ignores checks its claim itself, or a later cell checks what it computed.

    A check is an assert or, for a measured time, a ``timing_claim`` (see ``_checks``), on the names it reads or
    on what the cell computed them from (see ``_checked_names``).
    """
    code = [_parse("".join(c["source"])) for c in json.loads(path.read_text(encoding="utf-8"))["cells"]
            if c["cell_type"] == "code"]
    tags = [c.get("metadata", {}).get("tags", []) for c in json.loads(path.read_text(encoding="utf-8"))["cells"]
            if c["cell_type"] == "code"]
    for i, tree in enumerate(code):
        if "nbval-ignore-output" not in tags[i]:
            continue
        if _checks(tree):
            continue
        later = set().union(*(_checked_names(t) for t in code[i + 1 :]))
        assert _defined(tree) & later, (
            f"code cell {i} ignores its output, and neither it nor a later cell asserts on what it computes "
            "(or, for a time, states a timing_claim on it):\n"
            + ast.unparse(tree)[:300])


def test_the_coverage_rule_catches_an_unasserted_cell():
    ignored, later = _parse("x = train()\nprint(x)"), _parse("assert y > 0")
    assert not _defined(ignored) & _checked_names(later)
    assert _defined(ignored) & _checked_names(_parse("assert x.accuracy > 0.9"))
    # a time is covered by a timing claim on it (make bench checks it), not by printing it
    timed = _parse("times = {'a': time_call(f), 'b': time_call(g)}\nprint(times)")
    assert _defined(timed) & _checked_names(_parse("timing_claim('a is faster than b', times['a'] < times['b'])"))
    assert _defined(timed) & _checked_names(_parse("loop.timing_claim('a is faster', times['a'] < 1)"))
    assert not _defined(timed) & _checked_names(_parse("print('a is faster:', times['a'] < times['b'])"))
    assert _checks(_parse("timing_claim('b is slow', times['b'] > 1)")) and not _checks(_parse("print(times)"))
    # claims gathered first and stated in a loop check what they were computed from; a printed dict checks nothing
    gathered = "claims = {'a is faster': times['a'] < times['b']}\nfor statement, holds in claims.items():\n    "
    assert _defined(timed) & _checked_names(_parse(gathered + "timing_claim(statement, holds)"))
    assert not _defined(timed) & _checked_names(_parse(gathered + "print(statement, holds)"))
    assert not _defined(ignored) & _checked_names(_parse("y = x\nprint(y)"))


# --- An ignored output comes from the source above it -----------------------------------------------------------
#
# nbval does not compare the output of a cell tagged nbval-ignore-output, so an edit to such a cell that was never
# re-run (a legend changed from "seed 0" to "seeds 0-2") leaves a committed output that its source no longer makes.
# `make execute` stamps each such cell with the SHA-256 of the source it ran (course_utils.tooling.execute,
# stamp_ignored_outputs); the test below fails when the stamp is missing or differs from the source.


def _stale_ignored_outputs(nb: nbformat.NotebookNode) -> list[str]:
    """One line per code cell tagged nbval-ignore-output whose stamp is missing or belongs to another source."""
    stale = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code" or IGNORE_OUTPUT not in cell.metadata.get("tags", []):
            continue
        stamp = cell.metadata.get(STAMP_KEY, {}).get(STAMP_FIELD)
        first = next((line for line in cell.source.splitlines() if line.strip()), "")[:80]
        if stamp is None:
            stale.append(f"cell {i} ({first!r}) has no {STAMP_KEY}.{STAMP_FIELD}: it was not executed since the stamp "
                         "was introduced")
        elif stamp != source_sha256(cell.source):
            stale.append(f"cell {i} ({first!r}) was edited after its output was made: the output nbval ignores is "
                         "stale")
    return stale


@pytest.mark.parametrize("path", NOTEBOOKS + LAB, ids=lambda p: p.name)
def test_every_ignored_output_was_made_by_the_source_above_it(path):
    stale = _stale_ignored_outputs(nbformat.read(path, as_version=4))
    command = STAMP_COMMAND.format(path=path.relative_to(ROOT).as_posix())
    assert not stale, (f"{path.name}: cells whose output nbval ignores (cells counted from 0):\n  " + "\n  ".join(stale)
                       + f"\nRe-execute the notebook, which re-runs these cells and stamps them: {command}")


def test_the_stamp_catches_an_ignored_output_whose_source_changed():
    new_cell = nbformat.v4.new_code_cell
    nb = nbformat.v4.new_notebook(cells=[new_cell("x = 1\nprint(x)", metadata={"tags": [IGNORE_OUTPUT]}),
                                         new_cell("assert x == 1"), new_cell("y = 2", metadata={STAMP_KEY: {STAMP_FIELD: "0"}})])
    assert "has no course.source_sha256" in _stale_ignored_outputs(nb)[0]  # never executed with the stamp
    stamp_ignored_outputs(nb)
    assert _stale_ignored_outputs(nb) == [] and STAMP_KEY not in nb.cells[2].metadata  # an untagged cell loses it
    nbformat.validate(nb)  # the notebook format accepts the stamp
    nb.cells[0].source = "x = 2\nprint(x)"
    assert _stale_ignored_outputs(nb) == ["cell 0 ('x = 2') was edited after its output was made: the output nbval "
                                          "ignores is stale"]
    # the edit of issue 36: notebook 07's legend changed without re-running the cell
    nb = nbformat.read(ROOT / "notebooks" / "07_transformer_block.ipynb", as_version=4)
    stamp_ignored_outputs(nb)
    (cell,) = [c for c in nb.cells if "axhline" in c.source and IGNORE_OUTPUT in c.metadata.get("tags", [])]
    assert _stale_ignored_outputs(nb) == []
    cell.source = cell.source.replace("(seed 0)", "(seeds 0-2)")
    (found,) = _stale_ignored_outputs(nb)
    assert found.startswith(f"cell {nb.cells.index(cell)} (") and "stale" in found


def test_a_notebook_collected_alone_gets_the_pinned_kernel_settings(root):
    # `pytest --nbval notebooks/03_self_attention.ipynb` never loads tests/conftest.py: the plugin in
    # pyproject.toml's addopts puts the settings in place, so the kernels nbval starts inherit them.
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in portable.PINNED_ENV and k != "PYTHONHASHSEED"}
    # The probe must not import course_utils itself (that pins the settings too): it gets them as text.
    probe = ("import os, sys\nimport pytest\n"
             f"PINNED = {dict(portable.PINNED_ENV)!r}\n"
             "class Report:\n"
             "    def pytest_collection_finish(self, session):\n"
             "        print('PINNED', all(os.environ.get(k) == v for k, v in PINNED.items()))\n"
             "sys.exit(pytest.main(['--co', '-q', *sys.argv[1:], 'notebooks/03_self_attention.ipynb'], "
             "plugins=[Report()]))")
    run = subprocess.run([sys.executable, "-c", probe], cwd=root, env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "PINNED True" in run.stdout, run.stdout
    # and without the plugin, the same collection lacks them (so the check above can fail)
    run = subprocess.run([sys.executable, "-c", probe, "-o", "addopts=-p no:cacheprovider --nbval"], cwd=root,
                         env=env, capture_output=True, text=True)
    assert "PINNED False" in run.stdout, run.stdout + run.stderr
