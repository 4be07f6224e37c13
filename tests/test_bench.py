"""`make bench` and `make execute` with the lab book: which notebooks a path names, the lab book's own budget
outside the series, its own lines in the report, and no minutes for it in the README's syllabus table.

The lectures' budgets are tested in tests/test_portable.py.
"""

from __future__ import annotations

import shutil

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from course_utils.tooling import bench, execute
from course_utils.tooling.bench import LAB_BUDGET, SERIES_BUDGET, NotebookTiming, budget_failures, report

from conftest import LAB, NOTEBOOKS, ROOT


def test_a_lab_notebook_has_its_own_budget_and_is_not_in_the_series():
    lectures = [NotebookTiming(f"{i:02d}_a.ipynb", SERIES_BUDGET / 6 - 1, 60.0) for i in range(6)]
    lab = NotebookTiming("lab/01_b.ipynb", LAB_BUDGET - 1, None, [("sweep", 30.0)], [("faster", True)], lab=True)
    assert lab.budget == LAB_BUDGET and bench.NOTEBOOK_BUDGET < lab.seconds < LAB_BUDGET
    assert budget_failures(lectures) == []
    assert budget_failures(lectures + [lab]) == ["lab/01_b.ipynb: its first cell states no "
                                                 "'*Runtime:* under N CPU minutes'"], "the lab book is not in the series"
    stated = NotebookTiming("lab/01_b.ipynb", LAB_BUDGET - 1, 120.0, lab=True)
    assert budget_failures(lectures + [stated]) == []
    slow = NotebookTiming("lab/02_c.ipynb", LAB_BUDGET + 1, 180.0, [("sweep", bench.TRAINING_BUDGET + 1)],
                          [("the cache is faster", False)], lab=True)
    assert budget_failures([slow]) == [f"lab/02_c.ipynb: {LAB_BUDGET + 1:.1f} s, over its budget of {LAB_BUDGET:.0f} s",
                                       f"lab/02_c.ipynb: training run 'sweep' took {bench.TRAINING_BUDGET + 1:.1f} s, "
                                       f"over {bench.TRAINING_BUDGET:.0f} s",
                                       "lab/02_c.ipynb: timing claim did not hold: the cache is faster"]
    short = NotebookTiming("lab/03_d.ipynb", 50.0, 30.0, lab=True)
    assert short.budget == 30.0 and budget_failures([short]) == ["lab/03_d.ipynb: 50.0 s, over its budget of 30 s"]
    assert budget_failures([NotebookTiming("00_a.ipynb", 70.0, 120.0)]) == [
        "00_a.ipynb: 70.0 s, over its budget of 60 s"], "a lecture keeps its own budget"


def test_the_report_lists_the_lab_book_in_lines_of_its_own_after_the_series():
    lectures = [NotebookTiming("00_a.ipynb", 10.0, 60.0), NotebookTiming("01_b.ipynb", 20.0, 60.0)]
    lab = [NotebookTiming("lab/01_c.ipynb", 100.0, 120.0, [("sweep", 50.0)], [("faster", True)], lab=True),
           NotebookTiming("lab/02_d.ipynb", 130.0, 180.0, lab=True)]
    lines = report(lectures + lab).splitlines()
    series = next(i for i, line in enumerate(lines) if line.startswith("the series"))
    assert lines[series].split()[2:] == ["30.0", f"{SERIES_BUDGET:.0f}"], "the series: the lectures alone"
    assert [line.split()[0] for line in lines[1:series]] == ["00_a.ipynb", "01_b.ipynb"]
    after = lines[series + 1:]
    assert after[0] == "" and after[1].startswith("lab book (not in the series)")
    assert after[2].split() == ["lab/01_c.ipynb", "100.0", f"{LAB_BUDGET:.0f}"]
    assert after[3].split() == ["training:", "sweep", "50.0", f"{bench.TRAINING_BUDGET:.0f}"]
    assert after[4] == "  claim held: faster"
    assert after[5].split() == ["lab/02_d.ipynb", "130.0", f"{LAB_BUDGET:.0f}", "OVER"]
    assert after[6].split()[-1] == "230.0" and len(after) == 7
    assert "lab book" not in report(lectures), "no lab book lines without lab notebooks"


def _course(folder):
    """notebooks/ with two lectures and one lab notebook (and files that are neither)."""
    (folder / "lab").mkdir(parents=True)
    for name in ("00_a.ipynb", "01_b.ipynb", "lab/01_c.ipynb"):
        nb = new_notebook(cells=[new_markdown_cell("# T\n\n*Runtime:* under 1 CPU minute"),
                                 new_code_cell("print(6 * 7)")],
                          metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}})
        nbformat.write(nb, folder / name)
    (folder / "scratch.ipynb").write_text("{}")
    (folder / "lab" / "notes.md").write_text("not a notebook")
    return folder


def test_a_folder_names_its_lectures_then_its_lab_book_and_a_file_names_itself(tmp_path):
    folder = _course(tmp_path / "notebooks")
    names = [p.relative_to(folder).as_posix() for p in execute.notebook_paths([folder])]
    assert names == ["00_a.ipynb", "01_b.ipynb", "lab/01_c.ipynb"]
    assert execute.notebook_paths([folder / "lab"]) == [folder / "lab" / "01_c.ipynb"]
    assert execute.notebook_paths([str(folder / "lab" / "01_c.ipynb")]) == [folder / "lab" / "01_c.ipynb"]
    assert [execute.display_name(p) for p in execute.notebook_paths([folder])] == names
    assert [execute.is_lab(p) for p in execute.notebook_paths([folder])] == [False, False, True]
    course = execute.notebook_paths([ROOT / "notebooks"])
    assert course == NOTEBOOKS + LAB, "make execute and make bench: the lectures, then the lab book"


def test_bench_times_the_lab_book_apart_and_writes_no_minutes_for_it(tmp_path, capsys):
    folder = _course(tmp_path / "notebooks")
    assert bench.main(["--no-readme", "--timeout", "60", str(folder)]) == 0
    out = capsys.readouterr().out
    assert "lab/01_c.ipynb: " in out and "00_a.ipynb: " in out
    table = out[out.index("notebook "):]
    assert table.index("00_a.ipynb") < table.index("the series") < table.index("lab book") < table.index("lab/01_c")
    timing = bench.time_notebook(folder / "lab" / "01_c.ipynb")
    assert timing.lab and timing.name == "lab/01_c.ipynb" and timing.stated_seconds == 60.0


def test_readme_minutes_go_into_the_cpu_minutes_column_for_lectures_only(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("# C\n\n| notebook | concepts | prerequisites | CPU minutes | lab book |\n| --- | --- | --- | --- | --- |\n"
                      "| [00 · A](notebooks/00_a.ipynb) | x | y | 9.9 | — |\n"
                      "| [01 · B](notebooks/01_b.ipynb) | x | 00 | 9.9 | [lab](notebooks/lab/01_c.ipynb) |\n")
    execute.update_readme_minutes({"00_a.ipynb": 0.01, "01_b.ipynb": 0.44, "lab/01_c.ipynb": 1.5, "01_c.ipynb": 1.5},
                                  readme)
    assert readme.read_text().splitlines()[-2:] == [
        "| [00 · A](notebooks/00_a.ipynb) | x | y | < 0.1 | — |",
        "| [01 · B](notebooks/01_b.ipynb) | x | 00 | 0.4 | [lab](notebooks/lab/01_c.ipynb) |"]
    real = tmp_path / "real.md"
    shutil.copy(ROOT / "README.md", real)
    from course_utils.tooling.site import syllabus

    entries = syllabus(real)
    measured = {e.file: float(e.minutes) for e in entries if e.minutes != "< 0.1"}
    execute.update_readme_minutes({**measured, **{f"lab/{p.name}": 1.0 for p in LAB}}, real)
    assert real.read_text(encoding="utf-8") == (ROOT / "README.md").read_text(encoding="utf-8"), \
        "the README's table: the minutes land in their own column, and the lab book column is left alone"
