"""Written questions graded by hand: marking sheets, the marks file, and totals that include the marks.

A tiny course of one notebook (one autograded exercise and one written
question) goes through the real pipeline (release, sandboxed autograde) so the
test runs in seconds; the course notebooks' own written questions are checked
statically in tests/test_notebooks.py and through the release in test_grading.py.
"""

from __future__ import annotations

import csv
import shutil

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from course_utils.tooling import grading, written

RUBRIC = ("**Model answer.** Doubling twice multiplies by four.\n\n"
          "**Rubric (2 points).** 1 point for 'four', 1 point for saying why.")


def _nbgrader(grade_id, **kw):
    meta = {"grade_id": grade_id, "schema_version": 3, "locked": False, "solution": False, "grade": False, "task": False}
    meta.update(kw)
    return {"nbgrader": meta}


def _course(folder):
    nb = new_notebook(cells=[
        new_markdown_cell("# A tiny course notebook"),
        new_code_cell("def double(x):\n    ### BEGIN SOLUTION\n    return 2 * x\n    ### END SOLUTION\n",
                      metadata=_nbgrader("double", solution=True)),
        new_code_cell("assert double(2) == 4\n### BEGIN HIDDEN TESTS\nassert double(-3) == -6\n### END HIDDEN TESTS\n",
                      metadata=_nbgrader("double_tests", grade=True, locked=True, points=1)),
        new_markdown_cell("### Question · Twice (2 points)\n\nWhat does doubling twice do?"),
        new_markdown_cell(RUBRIC, metadata=_nbgrader("written_twice", solution=True, grade=True, points=2)),
    ])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    folder.mkdir(parents=True)
    nbformat.write(nb, folder / "00_tiny.ipynb")
    return folder / "00_tiny.ipynb"


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("written")
    source = _course(tmp / "notebooks")
    nb = nbformat.read(source, as_version=4)
    subs = tmp / "submissions"
    for student, answer in [("ada", "It multiplies by four, since 2 * 2 = 4."), ("bob", None),
                            ("=cmd", "=HYPERLINK(\"x\")")]:
        (subs / student).mkdir(parents=True)
        mine = nbformat.from_dict(nb)
        for cell in mine.cells:
            if written.is_written(cell):
                cell.source = answer if answer is not None else written.STUB
        nbformat.write(mine, subs / student / source.name)
    first = grading.autograde(subs, notebooks_dir=source.parent, course=tmp / "course", timeout=60)
    sheets = tmp / "course" / "written"
    template = list(csv.DictReader(open(sheets / "marks-template.csv", encoding="utf-8")))
    marks = tmp / "marks.csv"
    shutil.copy(sheets / "marks-template.csv", marks)
    text = marks.read_text(encoding="utf-8").splitlines()
    text = [line.replace(",,2", ",1.5,2") if line.startswith("ada,") else line for line in text]
    marks.write_text("\n".join(text) + "\n", encoding="utf-8")
    second = grading.autograde(subs, notebooks_dir=source.parent, course=tmp / "course2", timeout=60, marks=marks)
    return tmp, {r.student: r for r in first}, {r.student: r for r in second}, template


def test_without_marks_written_answers_are_to_mark_and_collected_in_one_sheet(graded):
    tmp, first, _, template = graded
    ada = first["ada"]
    assert ada.scores == {"double_tests": 1.0} and ada.unmarked == ["written_twice"]
    assert "to mark by hand: written_twice" in ada.status
    assert ada.written == {"written_twice": "It multiplies by four, since 2 * 2 = 4."}
    assert first["bob"].written == {"written_twice": ""}, "an answer left as released counts as empty"
    sheet = (tmp / "course" / "written" / "00_tiny.md").read_text(encoding="utf-8")
    assert "What does doubling twice do?" in sheet and "Doubling twice multiplies by four" in sheet
    assert "> It multiplies by four" in sheet and "(no answer)" in sheet
    assert [(r["student"], r["question"], r["points"], r["max_points"]) for r in template] == [
        ("'=cmd", "written_twice", "", "2"), ("ada", "written_twice", "", "2"), ("bob", "written_twice", "", "2")]
    table = grading.format_table(list(first.values()), notebooks_dir=tmp / "notebooks")
    assert "to mark/2" in table and "1/3 so far" in table


def test_marks_from_the_filled_template_enter_the_totals_and_the_csv(graded):
    tmp, _, second, _ = graded
    ada = second["ada"]
    assert ada.scores == {"double_tests": 1.0, "written_twice": 1.5} and ada.unmarked == [] and ada.status == "graded"
    assert second["bob"].unmarked == ["written_twice"], "a row left empty stays to mark"
    rows = list(csv.DictReader(open(grading.write_grades_csv(list(second.values()), tmp / "grades.csv",
                                                             notebooks_dir=tmp / "notebooks"), encoding="utf-8")))
    by = {(r["student"], r["exercise"]): r for r in rows}
    assert by[("ada", "written_twice")]["points"] == "1.5" and by[("bob", "written_twice")]["points"] == ""
    assert by[("'=cmd", "written_twice")]["student"] == "'=cmd", "formula-looking names are escaped"


def test_a_written_answer_cannot_pass_for_an_exercise_or_change_a_test(graded):
    _, first, _, _ = graded
    assert first["=cmd"].scores == {"double_tests": 1.0}
    assert first["=cmd"].written["written_twice"] == '=HYPERLINK("x")', "kept as text for the marker"


@pytest.mark.parametrize("row, message", [
    ("ada,00_tiny,written_twice,3,2", "outside 0 to 2"),
    ("ada,00_tiny,written_twice,-1,2", "outside 0 to 2"),
    ("ada,00_tiny,written_twice,lots,2", "is not a number"),
    ("ada,00_tiny,written_other,1,2", "has no written question 'written_other'"),
    ("ada,01_other,written_twice,1,2", "'01_other' has no written question"),
])
def test_bad_marks_are_refused_with_the_line_and_the_reason(tmp_path, row, message):
    known = {"00_tiny": written.questions(_course(tmp_path / "nb"))}
    marks = tmp_path / "marks.csv"
    marks.write_text("student,notebook,question,points,max_points\n" + row + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match="line 2") as info:
        written.read_marks(marks, known)
    assert message in str(info.value)


def test_a_marks_file_without_the_columns_or_missing_is_refused(tmp_path):
    marks = tmp_path / "marks.csv"
    marks.write_text("name,score\nada,1\n", encoding="utf-8")
    with pytest.raises(ValueError, match="header lacks notebook, points, question, student"):
        written.read_marks(marks, {})
    with pytest.raises(FileNotFoundError, match="marks-template.csv"):
        written.read_marks(tmp_path / "nope.csv", {})


def test_an_answer_cell_without_a_rubric_is_reported():
    assert written.check_answer_cell(RUBRIC) == []
    assert written.check_answer_cell("Doubling twice multiplies by four.") == [
        "a '**Model answer**' paragraph", "a '**Rubric**' that says what earns each point"]
