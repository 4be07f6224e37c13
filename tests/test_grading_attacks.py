"""Grading that a student's code cannot subvert: one test per attack found in review (issue 14).

A tiny course with one exercise (``double``) keeps these fast. Every attacker
is a student folder; one autograde run grades them all. Each test states the
attack and fails if it works: the attacks scored full marks, rewrote other
files, read the instructor's solutions, reached the network or outlived the
grading before the fixes (rebuilding each notebook from the release, the
sandbox, no symlinks followed, flags, CSV escaping).
"""

from __future__ import annotations

import copy
import csv
import socket
import subprocess
import threading
import time
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from course_utils.tooling import grading

STEM = "00_tiny"


def _nbgrader(cell, grade_id, *, solution=False, grade=False, points=0):
    meta = {"schema_version": 3, "grade_id": grade_id, "solution": solution, "grade": grade, "locked": not solution,
            "task": False}
    if grade:
        meta["points"] = points
    cell.metadata["nbgrader"] = meta
    return cell


def _instructor() -> nbformat.NotebookNode:
    nb = new_notebook(cells=[
        new_markdown_cell("# 00 · A tiny course"),
        new_code_cell("def check_double(fn):\n    assert fn(3) == 6, 'double(3) must be 6'\n    print('ok')"),
        _nbgrader(new_code_cell("def double(x):\n    ### BEGIN SOLUTION\n    return 2 * x\n    ### END SOLUTION"),
                  "double", solution=True),
        _nbgrader(new_code_cell("check_double(double)\n### BEGIN HIDDEN TESTS\nassert double(-4) == -8\n"
                                "### END HIDDEN TESTS"), "double_tests", grade=True, points=3),
        new_code_cell("double = lambda x: 2 * x  # from here on: the reference"),
    ])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return nb


def _with_solution(nb, source: str) -> nbformat.NotebookNode:
    nb = copy.deepcopy(nb)
    next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("solution")).source = source
    return nb


class _Listener:
    """A server on this machine's loopback that records whatever reaches it."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.sock.settimeout(0.5)
        self.port = self.sock.getsockname()[1]
        self.received: list[bytes] = []
        self.running = True
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while self.running:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.received.append(conn.recv(100))
            conn.close()

    def close(self):
        self.running = False
        self.thread.join()
        self.sock.close()


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """Grade a class of attackers once; return (results by student, folders, listener)."""
    base = tmp_path_factory.mktemp("attacks")
    instructor_dir = base / "instructor"
    instructor_dir.mkdir()
    instructor = _instructor()
    nbformat.write(instructor, instructor_dir / f"{STEM}.ipynb")
    release = grading.build_course([instructor_dir / f"{STEM}.ipynb"], base / "release-course")
    released = nbformat.read(base / "release-course" / "release" / STEM / f"{STEM}.ipynb", as_version=4)
    del release
    subs = base / "submissions"
    outside = base / "outside"  # a folder of the grader's that no student may write
    outside.mkdir()
    listener = _Listener()
    marker = f"attack-daemon-{base.name}"
    students = {
        "honest": _with_solution(instructor, "def double(x):\n    return x + x"),
        "unsolved": released,
        # move the test cell below the fallback that rebinds `double` to the reference
        "reorders": _moved_test_to_end(released),
        # write into another student's submission
        "overwrites": _with_solution(instructor, f"open({str(subs / 'honest' / (STEM + '.ipynb'))!r}, 'w').write('x')\n"
                                                 "def double(x):\n    return 0"),
        # write a file outside the sandbox (e.g. grades.csv, the gradebook)
        "writes_outside": _with_solution(instructor, f"open({str(outside / 'pwned.txt')!r}, 'w').write('x')\n"
                                                     "def double(x):\n    return 2 * x"),
        # read the instructor's notebook (with the solutions)
        "reads_solutions": _with_solution(instructor, "import json\nnb = json.load(open("
                                          f"{str(instructor_dir / (STEM + '.ipynb'))!r}))\n"
                                          "def double(x):\n    return 2 * x"),
        # a daemon that outlives the grading and writes afterwards
        "daemon": _with_solution(instructor, "import subprocess\nsubprocess.Popen(['sh', '-c', "
                                             f"'exec -a {marker} sleep 8; echo late > {outside / 'late.txt'}'], "
                                             "start_new_session=True)\ndef double(x):\n    return 2 * x"),
        # allocate memory without limit
        "memory": _with_solution(instructor, "block = bytearray(64 * 2**30)\ndef double(x):\n    return 2 * x"),
        # reach a port on the grader's machine
        "network": _with_solution(instructor, "import socket\ntry:\n    s = socket.create_connection(('127.0.0.1', "
                                              f"{listener.port}), timeout=2)\n    s.sendall(b'leak')\nexcept OSError:\n"
                                              "    pass\ndef double(x):\n    return 2 * x"),
        # shadow the checker and hide errors from the kernel: flagged for a human
        "tampers": _with_solution(instructor, "def check_double(fn):\n    print('ok')\n"
                                              "get_ipython().set_custom_exc((Exception,), lambda *a, **k: None)\n"
                                              "def double(x):\n    return 0"),
    }
    for student, nb in students.items():
        (subs / student).mkdir(parents=True)
        nbformat.write(nb, subs / student / f"{STEM}.ipynb")
    # a symbolic link to the instructor's notebook instead of a file
    (subs / "links").mkdir()
    (subs / "links" / f"{STEM}.ipynb").symlink_to(instructor_dir / f"{STEM}.ipynb")
    # a wrongly named file, and a student whose notebook is missing
    (subs / "misnamed").mkdir()
    nbformat.write(instructor, subs / "misnamed" / "00_tiny (1).ipynb")
    (subs / "absent").mkdir()
    # a student folder whose name is a spreadsheet formula
    (subs / "=HYPERLINK(0)").mkdir()
    nbformat.write(instructor, subs / "=HYPERLINK(0)" / f"{STEM}.ipynb")
    honest_before = (subs / "honest" / f"{STEM}.ipynb").read_bytes()
    started = time.time()
    results = grading.autograde(subs, notebooks_dir=instructor_dir, course=base / "course", timeout=60)
    elapsed = time.time() - started
    listener_received = list(listener.received)
    listener.close()
    by = {}
    for r in results:
        by.setdefault(r.student, r)
    yield {"results": by, "all": results, "subs": subs, "outside": outside, "marker": marker,
           "received": listener_received, "honest_before": honest_before, "base": base, "elapsed": elapsed}


def _moved_test_to_end(nb):
    nb = copy.deepcopy(nb)
    test = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade"))
    nb.cells.remove(test)
    nb.cells.append(test)
    return nb


def test_the_honest_and_the_unsolved_get_their_marks(graded):
    assert graded["results"]["honest"].scores == {"double_tests": 3.0}
    assert graded["results"]["unsolved"].scores == {"double_tests": 0.0}


def test_moving_the_test_below_the_fallback_gains_nothing(graded):
    assert graded["results"]["reorders"].scores == {"double_tests": 0.0}


def test_a_student_cannot_overwrite_another_students_submission(graded):
    assert (graded["subs"] / "honest" / f"{STEM}.ipynb").read_bytes() == graded["honest_before"]
    assert graded["results"]["honest"].scores == {"double_tests": 3.0}


def test_nothing_outside_the_sandbox_is_written(graded):
    assert not (graded["outside"] / "pwned.txt").exists()
    assert graded["results"]["writes_outside"].scores == {"double_tests": 0.0}  # the cell failed, so did the test


def test_the_instructors_notebooks_are_hidden(graded):
    assert graded["results"]["reads_solutions"].scores == {"double_tests": 0.0}
    autograded = graded["base"] / "course" / "autograded" / "reads_solutions" / STEM / f"{STEM}.ipynb"
    text = autograded.read_text(encoding="utf-8")
    assert "FileNotFoundError" in text and "BEGIN SOLUTION" not in text


def test_no_process_outlives_the_grading(graded):
    time.sleep(max(0.0, 9.0 - graded["elapsed"]))  # past the daemon's 8 s sleep
    alive = subprocess.run(["pgrep", "-f", graded["marker"]], capture_output=True, text=True).stdout
    assert not alive.strip(), f"a student's daemon still runs: {alive}"
    assert not (graded["outside"] / "late.txt").exists()


def test_memory_is_limited(graded):
    r = graded["results"]["memory"]
    assert not r.failed and r.scores == {"double_tests": 0.0}  # MemoryError in the cell, graded as usual
    autograded = graded["base"] / "course" / "autograded" / "memory" / STEM / f"{STEM}.ipynb"
    assert "MemoryError" in autograded.read_text(encoding="utf-8")


def test_the_network_is_out_of_reach(graded):
    assert graded["received"] == []


def test_tampering_with_the_kernel_or_the_checker_is_flagged(graded):
    flags = " ".join(graded["results"]["tampers"].flags)
    assert "reaches into the IPython kernel" in flags
    assert "redefines check_double, which the tests use" in flags
    assert graded["results"]["honest"].flags == []


def test_a_symbolic_link_is_not_followed(graded):
    r = graded["results"]["links"]
    assert r.failed.endswith("is a symbolic link, which grading never follows: submit the notebook file itself")
    assert not r.scores


def test_a_misnamed_file_and_a_missing_notebook_say_what_to_fix(graded):
    mis = [r for r in graded["all"] if r.student == "misnamed"]
    assert any("did you mean 00_tiny.ipynb? Rename it exactly so" in r.failed for r in mis)
    assert any(r.missing for r in mis)  # and the notebook itself is missing
    absent = graded["results"]["absent"]
    assert absent.missing and absent.status == f"MISSING: no {STEM}.ipynb in absent/ (name the file exactly as released)"


def test_grades_csv_escapes_spreadsheet_formulas(graded, tmp_path):
    path = grading.write_grades_csv(graded["all"], tmp_path / "grades.csv",
                                    notebooks_dir=graded["base"] / "instructor")
    rows = list(csv.DictReader(path.open(encoding="utf-8")))
    assert any(r["student"] == "'=HYPERLINK(0)" for r in rows)
    assert not any(value.startswith(("=", "+", "@")) for r in rows for value in r.values())
    assert next(r for r in rows if r["student"] == "tampers")["flags"]


def test_a_manual_score_in_the_gradebook_is_flagged(graded):
    from nbgrader.api import Gradebook

    course = graded["base"] / "course"
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gradebook:
        grade = gradebook.find_grade("double_tests", STEM, STEM, "unsolved")
        grade.manual_score = 3.0
        gradebook.db.commit()
    scores, flags = grading._scores(course, STEM, "unsolved", grading.exercises(graded["base"] / "instructor" /
                                                                                f"{STEM}.ipynb"))
    assert scores == {"double_tests": 0.0}, "the total is the automatic score"
    assert flags == ["double_tests: a manual score (3) that autograding did not set"]


def test_grading_refuses_to_run_without_the_sandbox(tmp_path, monkeypatch):
    from course_utils.tooling import sandbox

    monkeypatch.setattr(sandbox.shutil, "which", lambda name: None)
    (tmp_path / "subs" / "someone").mkdir(parents=True)
    with pytest.raises(sandbox.SandboxUnavailable, match="apt-get install bubblewrap"):
        grading.autograde(tmp_path / "subs", course=tmp_path / "course")
