"""Grading that a student's code cannot subvert: one test per attack found in review (issue 14).

A tiny course with one exercise (``double``) keeps these fast. Every attacker
is a student folder; one autograde run grades them all. Each test states the
attack and fails if it works: the attacks scored full marks, rewrote other
files, read the instructor's solutions, reached the network or outlived the
grading before the fixes (rebuilding each notebook from the release, the
sandbox, no symlinks followed, flags, CSV escaping).

A second tiny course, graded by two of the course's own checkers, holds the
attacks on the kernel's verdict itself (a replaced checker or torch.allclose,
an input transformer, dropped error messages, a detached answer): each got full
marks from its kernel before the out-of-kernel verdict
(``course_utils.tooling.verdict``). The verdict's own defences (time, size,
what is unpickled, hidden files) and its coverage of every exercise of the
course are tested on it directly.

Issue 34 added a student who walks the whole file system for another copy of
the course (copies are planted beside the course, in /opt, /srv and /var/tmp),
and attacks on the machine itself, each stopped by the budget of one student's
notebook (``sandbox.Budget``) while an honest student graded beside it with
``JOBS=2`` keeps full marks: processes holding more memory together than the
budget, 1,500 sleeping processes, many large files. They run as root (as CI
does), with a cgroup where one can be made and with the watchdog forced.
"""

from __future__ import annotations

import copy
import csv
import io
import json
import os
import pickle
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from pathlib import Path

import nbformat
import pytest
import torch
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from buggy_answers import BUGGY
from conftest import NOTEBOOKS, ROOT
from course_utils.tooling import autograder, grading, verdict
from course_utils.tooling.verdict import transport

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


# A folder for the attack course that is not under /tmp (see ``graded``); /var/tmp is the
# standard place for temporary files outside /tmp (Filesystem Hierarchy Standard).
_OUTSIDE_TMP = "/var/tmp"


def _plant_clones(token: str) -> list[Path]:
    """Copies of the course where a second checkout or a CI runner's workspace would be: beside this
    course, in /opt and /srv, and in /var/tmp (those of them that can be written here); each holds notebook
    00 with its solutions, a ``.git`` folder and a file named ``token``."""
    planted = []
    for parent in (ROOT.parent, Path("/opt"), Path("/srv"), Path(_OUTSIDE_TMP)):
        try:
            clone = Path(tempfile.mkdtemp(prefix="course-clone-", dir=parent))
        except OSError:
            continue
        (clone / "notebooks").mkdir()
        shutil.copy(NOTEBOOKS[0], clone / "notebooks")
        (clone / ".git").mkdir()
        (clone / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
        (clone / token).write_text("a second copy of the course")
        planted.append(clone)
    assert planted, "no folder to plant a copy of the course in"
    return planted


# The answer of a student who walks the whole file system the sandbox shows, for notebooks, .git folders
# and the copies of the course planted by _plant_clones (found by the token file), and prints what it found.
EXPLORE = '''import json, os, sys
notebooks, gits, clones, folders = [], [], [], 0
environment = tuple(os.path.realpath(p) + os.sep for p in {{sys.prefix, sys.base_prefix}})
for folder, subfolders, files in os.walk("/"):
    if folder in ("/proc", "/sys", "/dev"):
        subfolders[:] = []
        continue
    folders += 1
    gits += [os.path.join(folder, d) for d in subfolders if d == ".git"]
    notebooks += [os.path.join(folder, f) for f in files
                  if f.endswith(".ipynb") and not os.path.join(folder, f).startswith(environment)]
    clones += [folder for f in files if f == {token!r}]
print("EXPLORED " + json.dumps({{"notebooks": notebooks, "git": gits, "clones": clones, "folders": folders,
                                 "top": sorted(os.listdir("/")), "course": sorted(os.listdir({course!r}))}}))

def double(x):
    return 2 * x
'''


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """Grade a class of attackers once; return (results by student, folders, listener).

    The folders live outside /tmp on purpose: the sandbox gives each notebook
    an empty /tmp of its own, so files under /tmp would be out of a student's
    reach whether or not the sandbox hides and protects them, and the tests
    of hiding and of writing outside could not fail.
    """
    base = Path(tempfile.mkdtemp(prefix="course-attacks-", dir=_OUTSIDE_TMP))
    assert not base.resolve().is_relative_to("/tmp"), base
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
    token = f"clone-token-{base.name}"
    clones = _plant_clones(token)
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
                                             f"'sleep 8; echo late > {outside / 'late.txt'}', '{marker}'], "
                                             "start_new_session=True)\ndef double(x):\n    return 2 * x"),
        # allocate memory without limit
        "memory": _with_solution(instructor, "block = bytearray(64 * 2**30)\ndef double(x):\n    return 2 * x"),
        # reach a port on the grader's machine
        "network": _with_solution(instructor, "import socket\ntry:\n    s = socket.create_connection(('127.0.0.1', "
                                              f"{listener.port}), timeout=2)\n    s.sendall(b'leak')\nexcept OSError:\n"
                                              "    pass\ndef double(x):\n    return 2 * x"),
        # walk the whole file system for another copy of the course (its notebooks hold the solutions)
        "explorer": _with_solution(instructor, EXPLORE.format(token=token, course=str(ROOT))),
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
    try:
        results = grading.autograde(subs, notebooks_dir=instructor_dir, course=base / "course", timeout=60)
    finally:
        for clone in clones:
            shutil.rmtree(clone, ignore_errors=True)
    elapsed = time.time() - started
    listener_received = list(listener.received)
    listener.close()
    by = {}
    for r in results:
        by.setdefault(r.student, r)
    try:
        yield {"results": by, "all": results, "subs": subs, "outside": outside, "marker": marker,
               "received": listener_received, "honest_before": honest_before, "base": base, "elapsed": elapsed,
               "clones": clones}
    finally:
        shutil.rmtree(base, ignore_errors=True)


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


def test_a_submission_that_walks_the_file_system_finds_no_copy_of_the_course(graded):
    """A blank submission scored 7/7 by finding another clone's 00_orientation.ipynb outside the folders the
    sandbox hid and running its solution cells. The sandbox now shows an allow-list: the Python installation,
    the system's libraries, the environment, the course's package and data, and its own work folder."""
    r = graded["results"]["explorer"]
    assert r.scores == {"double_tests": 3.0}, (r.failed, r.scores)
    autograded = graded["base"] / "course" / "autograded" / "explorer" / STEM / f"{STEM}.ipynb"
    line = next(line for cell in nbformat.read(autograded, as_version=4).cells if cell.cell_type == "code"
                for out in cell.outputs for line in out.get("text", "").splitlines() if line.startswith("EXPLORED "))
    found = json.loads(line.removeprefix("EXPLORED "))
    assert found["folders"] > 1000, "the walk saw next to nothing: did it run?"
    assert found["clones"] == [], f"copies of the course are visible: {found['clones']} (planted: {graded['clones']})"
    assert found["notebooks"] == [], "notebooks outside the Python environment are visible"
    assert found["git"] == [], "a .git folder (the course's history holds the solutions) is visible"
    assert found["course"] == sorted(p.name for p in (ROOT / "course_utils", ROOT / "data", Path(sys.prefix))
                                     if p.parent == ROOT), "of the course, only its package and data are shown"
    assert set(found["top"]) <= {"bin", "dev", "etc", "lib", "lib32", "lib64", "libx32", "proc", "sandbox", "sys",
                                 "tmp", "usr", *(p.parts[1] for p in (ROOT, Path(sys.prefix), Path(sys.base_prefix)))}


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

    book = graded["base"] / "course" / "gradebooks" / "unsolved.db"  # each student's own gradebook
    with Gradebook(f"sqlite:///{book}") as gradebook:
        grade = gradebook.find_grade("double_tests", STEM, STEM, "unsolved")
        grade.manual_score = 3.0
        gradebook.db.commit()
    scores, flags = autograder.scores(book, STEM, "unsolved", grading.exercises(graded["base"] / "instructor" /
                                                                                f"{STEM}.ipynb"))
    assert scores == {"double_tests": 0.0}, "the total is the automatic score"
    assert flags == ["double_tests: a manual score (3) that autograding did not set"]


def test_grading_refuses_to_run_without_the_sandbox(tmp_path, monkeypatch):
    from course_utils.tooling import sandbox

    monkeypatch.setattr(sandbox.shutil, "which", lambda name: None)
    (tmp_path / "subs" / "someone").mkdir(parents=True)
    with pytest.raises(sandbox.SandboxUnavailable, match="apt-get install bubblewrap"):
        grading.autograde(tmp_path / "subs", course=tmp_path / "course")


# --- The out-of-kernel verdict (course_utils.tooling.verdict) ----------------------------------------------------
#
# Each attacker below gets full marks from its own kernel (every test asserts the DISAGREES flag, which says
# so); the verdict computed in the grading process, on the functions the student's code defines, scores the
# exercise 0. A second tiny course uses two of the course's own checkers: check_pairwise_scores, and
# check_next_token_loss, which runs backward through the student's loss and a model that stays in the grader.

TENSOR_STEM = "00_tensors"
PAIRWISE = "def pairwise_scores(q, k):\n    ### BEGIN SOLUTION\n    return {}\n    ### END SOLUTION\n"
PAIRWISE_RIGHT = PAIRWISE.format("q @ k.transpose(-2, -1)")
PAIRWISE_WRONG = PAIRWISE.format("q @ k.transpose(-2, -1) + 1  # the right shape and gradient, wrong values")
LOSS = ("def next_token_loss(model, tokens):\n    ### BEGIN SOLUTION\n    logits = model(tokens[:, :-1])\n"
        "    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1)){}\n"
        "    ### END SOLUTION\n")
GET_IPYTHON = 'getattr(__import__("IPy" + "thon"), "get_" + "ipython")()'
DROP_ERRORS = (  # the kernel drops its error outputs and reports every cell as "ok" (nbgrader sees a clean cell)
    f"_kernel = getattr({GET_IPYTHON}, 'kernel', None)  # None outside a Jupyter kernel\n"
    "if _kernel is not None:\n"
    "    _send = _kernel.session.send\n\n"
    "    def _without_errors(stream, msg_or_type, content=None, *args, **kwargs):\n"
    "        kind = msg_or_type if isinstance(msg_or_type, str) else msg_or_type['header']['msg_type']\n"
    "        if kind == 'error':\n            return None\n"
    "        if kind == 'execute_reply' and isinstance(content, dict) and content.get('status') == 'error':\n"
    "            content = {'status': 'ok', 'execution_count': content.get('execution_count'), "
    "'user_expressions': {}, 'payload': []}\n"
    "        return _send(stream, msg_or_type, content, *args, **kwargs)\n\n"
    "    _kernel.session.send = _without_errors\n")
TENSOR_ATTACKS = {
    # replace the checkers' comparisons, reached through an obfuscated import
    "patches_checker": ('for _name in ("core", "orientation", "gpt"):\n'
                        '    _module = __import__("course_utils.checks." + _name, fromlist=["x"])\n'
                        '    for _what in ("check_" + "close", "check_" + "tensor"):\n'
                        "        setattr(_module, _what, lambda *args, **kwargs: None)\n" + PAIRWISE_WRONG),
    # strip every line that calls a checker from the cells that run next
    "strips_checks": (f"{GET_IPYTHON}.input_transformers_post.append(\n"
                      "    lambda lines: [line for line in lines if 'check' + '_' not in line])\n" + PAIRWISE_WRONG),
    # drop the error outputs from the kernel's messages
    "drops_errors": DROP_ERRORS + PAIRWISE_WRONG,
    # make every comparison succeed
    "patches_allclose": ("torch.allclose = lambda *args, **kwargs: True\n"
                         "torch.testing.assert_close = lambda *args, **kwargs: None\n" + PAIRWISE_WRONG),
}


def _tensor_course() -> nbformat.NotebookNode:
    nb = new_notebook(cells=[
        new_markdown_cell("# 00 · Tensors"),
        new_markdown_cell("## Setup"),
        new_code_cell("import torch\nimport torch.nn.functional as F\n\n"
                      "from course_utils.checks import check_next_token_loss, check_pairwise_scores"),
        new_markdown_cell("## Exercises"),
        _nbgrader(new_code_cell(PAIRWISE_RIGHT), "pairwise_scores", solution=True),
        _nbgrader(new_code_cell("check_pairwise_scores(pairwise_scores)\n### BEGIN HIDDEN TESTS\n"
                                "check_pairwise_scores(pairwise_scores, seed=1, B=3, T=5, S=2, D=7)\n"
                                "### END HIDDEN TESTS"), "pairwise_scores_tests", grade=True, points=2),
        new_code_cell("from course_utils.blocks import attention\n\npairwise_scores = attention.pairwise_scores"),
        _nbgrader(new_code_cell(LOSS.format("")), "next_token_loss", solution=True),
        _nbgrader(new_code_cell("check_next_token_loss(next_token_loss)"), "next_token_loss_tests", grade=True,
                  points=3),
    ])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return nb


def _with_solutions(nb, **sources: str) -> nbformat.NotebookNode:
    nb = copy.deepcopy(nb)
    for cell in nb.cells:
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        if cell.metadata.get("nbgrader", {}).get("solution") and grade_id in sources:
            cell.source = sources[grade_id]
    return nb


@pytest.fixture(scope="module")
def tensor_graded(tmp_path_factory):
    """Grade the tensor course's attackers once; return the results by student."""
    base = tmp_path_factory.mktemp("tensor-attacks")
    (base / "instructor").mkdir()
    instructor = _tensor_course()
    nbformat.write(instructor, base / "instructor" / f"{TENSOR_STEM}.ipynb")
    students = {name: _with_solutions(instructor, pairwise_scores=source) for name, source in TENSOR_ATTACKS.items()}
    students["honest"] = _with_solutions(instructor, pairwise_scores=PAIRWISE_RIGHT, next_token_loss=LOSS.format(""))
    # the right loss, detached from the model (so no gradient reaches it), its error hidden from nbgrader
    students["detaches"] = _with_solutions(instructor, pairwise_scores=DROP_ERRORS + PAIRWISE_RIGHT,
                                           next_token_loss=LOSS.format(".detach()"))
    for student, nb in students.items():
        (base / "subs" / student).mkdir(parents=True)
        nbformat.write(nb, base / "subs" / student / f"{TENSOR_STEM}.ipynb")
    results = grading.autograde(base / "subs", notebooks_dir=base / "instructor", course=base / "course", timeout=60)
    return {r.student: r for r in results}


@pytest.mark.parametrize("student", sorted(TENSOR_ATTACKS))
def test_tampering_with_the_kernel_no_longer_gets_the_marks(tensor_graded, student):
    r = tensor_graded[student]
    assert not r.failed, r.failed
    assert r.scores == {"pairwise_scores_tests": 0.0, "next_token_loss_tests": 3.0}, (student, r.scores, r.flags)
    assert f"pairwise_scores_tests: {verdict.DISAGREES}" in " ".join(r.flags), "the kernel gave it the marks"


def test_a_detached_answer_fails_out_of_the_kernel_too(tensor_graded):
    r = tensor_graded["detaches"]
    assert r.scores == {"pairwise_scores_tests": 2.0, "next_token_loss_tests": 0.0}, (r.scores, r.flags)
    flag = next(f for f in r.flags if f.startswith("next_token_loss_tests:"))
    assert verdict.DISAGREES in flag and "detached" in flag


def test_a_right_answer_gets_full_marks_and_no_flag(tensor_graded):
    r = tensor_graded["honest"]
    assert r.scores == {"pairwise_scores_tests": 2.0, "next_token_loss_tests": 3.0}
    assert r.flags == []


def _misbehaving_course(secret: Path, marker: Path) -> nbformat.NotebookNode:
    """Exercises whose answers hang, flood, forge a message, or look for the instructor's files."""
    forge = ("import io, os, struct, sys\n\nclass Payload:\n    def __reduce__(self):\n"
             f"        return (os.system, ('touch {marker}',))\n\n"
             "def forged(x):\n    channel = sys.modules['course_utils.tooling.verdict.child']._SERVER\n"
             "    buffer = io.BytesIO()\n    torch.save({'op': 'result', 'tree': Payload()}, buffer)\n"
             "    os.write(channel.out_fd, struct.pack('>Q', buffer.tell()) + buffer.getvalue())\n"
             "    return 2 * x\n")
    answers = {
        "twice": "def twice(x):\n    return x + x\n",
        "sleeps": "import time\n\ndef sleeps(x):\n    time.sleep(10**6)\n",
        "floods": "def floods(x):\n    return torch.zeros(20_000_000)  # 80 MB\n",
        "forged": forge,
        "after": "def after(x):\n    return 2 * x\n",
        "leaked": f"try:\n    leaked = open({str(secret)!r}).read()\nexcept OSError as error:\n"
                  "    leaked = type(error).__name__\n",
    }
    cells = [new_markdown_cell("## Setup"), new_code_cell("import torch"),
             new_code_cell("def check_twice(fn):\n    x = torch.tensor([1.0, -2.0], requires_grad=True)\n"
                           "    assert torch.equal(fn(x), 2 * x), 'fn(x) must be 2 x'"),
             new_markdown_cell("## Exercises")]
    for name, source in answers.items():
        test = ("assert leaked == 'FileNotFoundError', leaked" if name == "leaked" else f"check_twice({name})")
        cells += [_nbgrader(new_code_cell(source), name, solution=True),
                  _nbgrader(new_code_cell(test), f"{name}_tests", grade=True, points=1)]
    return new_notebook(cells=cells)


def test_a_child_that_hangs_floods_or_forges_is_stopped_with_a_reason(tmp_path):
    # the sandbox has its own /tmp: a secret the child could see without `hide` must live elsewhere
    (ROOT / "build").mkdir(exist_ok=True)
    hidden = Path(tempfile.mkdtemp(prefix="verdict-secret-", dir=ROOT / "build"))
    secret = hidden / "solutions.ipynb"
    secret.write_text("the instructor's solutions", encoding="utf-8")
    marker = tmp_path / "forged-payload-ran"  # what the forged message would create, if it were unpickled here
    nb = _misbehaving_course(secret, marker)
    started = time.monotonic()
    try:
        outcomes = verdict.judge(nb, nb, hide=[hidden], timeout=5)
    finally:
        shutil.rmtree(hidden)
    assert time.monotonic() - started < 60
    assert outcomes["twice_tests"] == verdict.Outcome(1.0)
    assert outcomes["sleeps_tests"].score == 0.0
    assert "did not answer within the time limit and was stopped (5 s for the checks of sleeps_tests" \
        in outcomes["sleeps_tests"].reason
    assert outcomes["floods_tests"].score == 0.0
    assert "a message of 76 MB, over the 32 MB limit" in outcomes["floods_tests"].reason
    assert outcomes["forged_tests"].score == 0.0
    assert "other than tensors and plain values (torch.load(weights_only=True) refused it" \
        in outcomes["forged_tests"].reason
    assert not marker.exists()
    assert outcomes["after_tests"] == verdict.Outcome(1.0), "a new child grades the exercises after a stopped one"
    assert outcomes["leaked_tests"] == verdict.Outcome(1.0), "the child read the instructor's file"


def test_the_grading_process_reads_only_tensors_and_plain_values(tmp_path):
    marker = tmp_path / "payload-ran"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    forged = io.BytesIO()
    torch.save({"op": "result", "tree": Payload()}, forged)
    with pytest.raises(verdict.ProtocolError, match="unsupported GLOBAL posix.system"):
        transport.load(forged.getvalue())
    with pytest.raises(verdict.ProtocolError, match="not a torch.save archive"):
        transport.load(pickle.dumps({"op": "result", "tree": Payload()}))
    assert not marker.exists()
    plain = io.BytesIO()
    torch.save({"op": "result", "tree": ("tensor", 0, False), "tensors": [torch.ones(2)], "ids": [7]}, plain)
    compressed = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(plain.getvalue())) as original, \
            zipfile.ZipFile(compressed, "w", zipfile.ZIP_DEFLATED) as squeezed:
        for item in original.infolist():
            squeezed.writestr(item.filename, original.read(item))
    with pytest.raises(verdict.ProtocolError, match="a compressed entry"):
        transport.load(compressed.getvalue())
    overlapping = io.BytesIO()  # a few bytes that would take 4 GB once copied
    torch.save({"op": "result", "tree": ("tensor", 0, False), "tensors": [torch.zeros(1).expand(10**9)],
                "ids": [7]}, overlapping)
    with pytest.raises(verdict.ProtocolError, match="whose elements overlap in memory"):
        transport.load(overlapping.getvalue())
    assert transport.load(plain.getvalue())["ids"] == [7]


def test_every_graded_exercise_of_the_course_is_checked_out_of_the_kernel():
    for path in NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        solutions = {c.metadata["nbgrader"]["grade_id"] for c in nb.cells
                     if c.metadata.get("nbgrader", {}).get("solution")}
        checks = verdict.plan(nb, nb).checks
        assert [c.grade_id for c in checks] == [ex.grade_id for ex in grading.exercises(path)]
        for check in checks:
            assert not check.uncovered, f"{path.stem} {check.grade_id}: {check.uncovered}"
            assert check.student_names and set(check.student_names) <= solutions, (path.stem, check)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_out_of_the_kernel_every_solution_passes_and_every_known_buggy_answer_fails(path):
    instructor = nbformat.read(path, as_version=4)
    right = verdict.judge(instructor, instructor, timeout=120)
    assert {g: o.score for g, o in right.items()} == {ex.grade_id: ex.points for ex in grading.exercises(path)}, \
        {g: o.reason for g, o in right.items() if o.reason}
    # Every solution cell replaced by its buggy answer at once: the fallbacks after each test cell keep one
    # exercise's bug from reaching the next one, as in the kernel.
    wrong = verdict.judge(_with_solutions(instructor, **BUGGY[path.stem]), instructor, timeout=120)
    assert {g: o.score for g, o in wrong.items()} == {f"{g}_tests": 0.0 for g in BUGGY[path.stem]}, wrong
    assert all(o.reason for o in wrong.values())


def test_the_reported_score_is_the_lower_of_the_two_verdicts():
    kernel = {"a": 2.0, "b": 3.0, "c": 0.0, "d": 1.0}
    outcomes = {"a": verdict.Outcome(2.0), "b": verdict.Outcome(0.0, "CheckError: wrong values"),
                "c": verdict.Outcome(4.0), "d": verdict.Outcome(None, "the test cell uses `x`")}
    scores, flags = verdict.combine(kernel, outcomes)
    assert scores == {"a": 2.0, "b": 0.0, "c": 0.0, "d": 1.0}
    assert flags == [f"b: {verdict.DISAGREES} (out of the kernel: CheckError: wrong values)",
                     "d: not checked out of the kernel (the test cell uses `x`)"]


def test_static_flags_look_only_at_what_the_student_wrote():
    """A correct solution of the course's own notebooks was flagged: 02's `attend` keeps the import of
    `masked_softmax` that its released cell gives, and an answer that is a value bound to its grade_id."""
    from course_utils.tooling.submissions import static_flags

    def notebook(solution_source: str, grade_id: str, test_source: str) -> nbformat.NotebookNode:
        return new_notebook(cells=[_nbgrader(new_code_cell(solution_source), grade_id, solution=True),
                                   _nbgrader(new_code_cell(test_source), f"{grade_id}_tests", grade=True, points=2)])

    given = "from course_utils.blocks.attention import masked_softmax\n\n\ndef attend(scores, values):\n"
    release = notebook(given + "    # YOUR CODE HERE\n    raise NotImplementedError()", "attend", "check_attend(attend)")
    answer = notebook(given + "    return masked_softmax(scores, None) @ values", "attend", "check_attend(attend)")
    assert static_flags(answer, release) == []
    added = notebook(given + "    from course_utils.blocks.scorers import attend as a\n    return a(scores, values)",
                     "attend", "check_attend(attend)")
    assert static_flags(added, release) == ["attend: uses course_utils, where the reference implementations live"]

    release = notebook("# the numbers of the wrong rows\n# YOUR CODE HERE\nraise NotImplementedError()",
                       "wrong_rows", "check_wrong_rows(wrong_rows)")
    assert static_flags(notebook("wrong_rows = {1, 2}", "wrong_rows", ""), release) == []
    shadowed = notebook("wrong_rows = {1}\ncheck_wrong_rows = print", "wrong_rows", "")
    assert static_flags(shadowed, release) == ["wrong_rows: redefines check_wrong_rows, which the tests use"]


# --- Budgets per student (sandbox.Budget) -------------------------------------------------------------------------
#
# Each attack is an otherwise correct answer whose side effect would take the grading machine down: with JOBS=2,
# 1,500 sleeping processes raised the machine's process count by 3,029 (the verdict's child runs the answer too),
# three processes of 4 GiB each took 22.3 GiB of 23, sixteen files of 240 MiB took 7.5 GiB of disk. Now the kernel's
# sandbox and the verdict child's share one budget per student's notebook; over it, both are killed and the notebook
# fails with the reason, while the honest student graded beside it (JOBS=2) keeps full marks. All runs twice: with
# a cgroup where this machine lets one be made (as root here; the watchdog where it does not), and with the watchdog
# forced. The budgets are made small for the tests, through COURSE_GRADING_LIMITS as an instructor would.

from course_utils.tooling import sandbox  # noqa: E402
from course_utils.tooling.budget import _Cgroup  # noqa: E402
from course_utils.tooling.limits import BUDGET_LOG_ENV, LIMITS_ENV, size_text  # noqa: E402

TEST_BUDGETS = "memory_budget=1GiB,process_budget=256,disk_budget=64MiB"
CORRECT = "\ndef double(x):\n    return 2 * x\n"
BUDGET_ATTACKS = {
    # three processes of 400 MiB each (each far under the 6 GiB address space a process may have): 1.2 GiB
    "memory": ("import subprocess, sys, time\nholders = [subprocess.Popen([sys.executable, '-c', "
               "'import time; block = b\"x\" * (400 * 2**20); time.sleep(60)', '{marker}']) for _ in range(3)]\n"
               "time.sleep(5)\n" + CORRECT,
               "used more than 1 GiB of memory: stopped"),
    # 1,500 sleeping processes (the process limit of prlimit does not bind root)
    "processes": ("import subprocess, time\ntry:\n    for _ in range(1500):\n"
                  "        subprocess.Popen(['sleep', '{marker}'])\nexcept OSError:\n    pass\n"
                  "time.sleep(5)\n" + CORRECT,
                  "started more than 256 processes: stopped"),
    # sixteen files of 16 MiB in the work folder and /tmp (256 MiB in all)
    "disk": ("import time\ntry:\n    for i in range(16):\n"
             "        with open(('/tmp/' if i % 2 else '') + f'big{{i}}.bin', 'wb') as f:\n"
             "            f.write(b'x' * (16 * 2**20))\nexcept OSError:\n    pass\ntime.sleep(5)\n" + CORRECT,
             "wrote more than 64 MiB: stopped"),
}


def _cgroup_here() -> bool:
    group = _Cgroup.make(sandbox.Limits())
    if group is None:
        return False
    group.remove()
    return True


# One notebook per attack (copies of the tiny course under three names): the attacker hands in the three, the
# honest student the three right answers. With JOBS=2 each student has a worker, and the attacker's notebooks, each
# stopped within seconds, are all graded while the honest student's (about ten seconds each) are.
BUDGET_STEMS = {"memory": "00_tiny", "processes": "01_tiny", "disk": "02_tiny"}


@pytest.fixture(scope="module")
def budget_course(tmp_path_factory):
    folder = tmp_path_factory.mktemp("budget-course")
    for stem in BUDGET_STEMS.values():
        nbformat.write(_instructor(), folder / f"{stem}.ipynb")
    return folder


@pytest.mark.parametrize("enforcer", ["cgroup where possible", "watchdog"])
def test_a_notebook_over_its_budget_is_stopped_and_the_student_beside_keeps_full_marks(
        enforcer, budget_course, tmp_path, monkeypatch):
    marker = f"{3600 + len(enforcer)}.{os.getpid()}{time.monotonic_ns() % 10**6}"  # `sleep` takes it too
    instructor = _instructor()
    subs = tmp_path / "subs"
    for attack, stem in BUDGET_STEMS.items():
        for student, answer in (("attacker", BUDGET_ATTACKS[attack][0].format(marker=marker)),
                                ("honest", "def double(x):\n    return x + x")):
            (subs / student).mkdir(parents=True, exist_ok=True)
            nbformat.write(_with_solution(instructor, answer), subs / student / f"{stem}.ipynb")
    log = tmp_path / "budgets.jsonl"
    monkeypatch.setenv(LIMITS_ENV, TEST_BUDGETS + (",watchdog=1" if enforcer == "watchdog" else ""))
    monkeypatch.setenv(BUDGET_LOG_ENV, str(log))
    results = grading.autograde(subs, notebooks_dir=budget_course, course=tmp_path / "course", timeout=60, jobs=2,
                                progress=lambda line: None)
    by = {(r.student, r.notebook): r for r in results}
    table = grading.format_table(results, notebooks_dir=budget_course)
    budgets = {entry["label"]: entry for entry in map(json.loads, log.read_text().splitlines())}
    # One budget per student's notebook: its kernel's sandbox and its verdict child's counted together.
    assert sorted(budgets) == sorted(f"{who}/{stem}" for who in ("attacker", "honest")
                                     for stem in BUDGET_STEMS.values())
    mode = "watchdog" if enforcer == "watchdog" or not _cgroup_here() else budgets["honest/00_tiny"]["mode"]
    assert {e["mode"] for e in budgets.values()} == {mode} and mode in ("watchdog", "cgroup v1", "cgroup v2"), budgets
    for attack, stem in BUDGET_STEMS.items():
        reason = BUDGET_ATTACKS[attack][1]
        honest, attacker = by[("honest", stem)], by[("attacker", stem)]
        assert honest.scores == {"double_tests": 3.0} and not honest.failed, honest
        assert budgets[f"honest/{stem}"]["breach"] == ""
        assert attacker.failed == reason and attacker.scores == {} and attacker.total == 0, attacker
        assert budgets[f"attacker/{stem}"]["breach"] == reason
        assert attacker.seconds < 60, attacker.seconds  # stopped at once, not after its cells ran out of time
        assert f"FAILED: {reason}" in table
        page = (tmp_path / "course" / "feedback" / "attacker" / stem / f"{stem}.html").read_text(encoding="utf-8")
        assert reason in page and "0 points" in page
    # Both students started together, one per worker: the attacker's notebooks were all graded beside the honest's.
    assert sum(by[("attacker", s)].seconds for s in BUDGET_STEMS.values()) < \
        sum(by[("honest", s)].seconds for s in BUDGET_STEMS.values())
    if mode.startswith("cgroup"):  # the kernel itself holds the sandboxes to the budget
        assert budgets["attacker/01_tiny"]["tasks"] <= 256, "the 257th process is refused"
        assert budgets["attacker/00_tiny"]["memory"] <= 2**30
    alive = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout
    assert not alive.strip(), f"processes of the stopped notebooks still run: {alive}"


@pytest.mark.parametrize("enforcer", ["cgroup where possible", "watchdog"])
def test_the_kernel_and_the_verdict_child_share_one_budget(enforcer, tmp_path):
    """Two sandboxes of one student's notebook (as its kernel and its verdict child run at once), 600 MiB each:
    either alone fits in a budget of 1 GiB, together they do not, and both are stopped."""
    limits = sandbox.Limits(memory_budget=2**30, watchdog=enforcer == "watchdog")
    hold = [sys.executable, "-c", "import sys, time; block = b'x' * (600 * 2**20); print('held', flush=True); "
                                  "time.sleep(60)"]
    with sandbox.Budget(limits, poll=0.1) as budget:
        first = budget.popen(sandbox.sandbox_command(hold, [], limits), stdout=subprocess.PIPE)
        assert first.stdout.readline() == b"held\n" and not budget.check(), "600 MiB alone fits"
        second = budget.popen(sandbox.sandbox_command(hold, [], limits), stdout=subprocess.PIPE)
        deadline = time.monotonic() + 30
        while not budget.check() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert budget.breach == "used more than 1 GiB of memory: stopped"
        assert first.wait(timeout=10) != 0 and second.wait(timeout=10) != 0, "both sandboxes are killed"
        with pytest.raises(sandbox.BudgetExceeded, match="1 GiB of memory"):
            budget.popen(sandbox.sandbox_command(hold, [], limits))
    first.stdout.close()
    second.stdout.close()


def test_budgets_are_set_through_the_environment_and_say_what_is_wrong():
    limits = sandbox.Limits.from_env({LIMITS_ENV: "memory_budget=1.5GiB, process_budget=64,watchdog=yes"})
    assert (limits.memory_budget, limits.process_budget, limits.watchdog) == (3 * 2**29, 64, True)
    assert limits.disk_budget == sandbox.Limits().disk_budget
    with pytest.raises(ValueError, match="unknown limit 'memory'"):
        sandbox.Limits.from_env({LIMITS_ENV: "memory=1GiB"})
    with pytest.raises(ValueError, match="not a number or a size"):
        sandbox.Limits.from_env({LIMITS_ENV: "disk_budget=lots"})
    assert [size_text(n) for n in (4 * 2**30, 512 * 2**20, 3 * 2**29)] == ["4 GiB", "512 MiB", "1.5 GiB"]


def test_where_the_machine_has_cgroup_v2_the_budget_is_a_cgroup_under_the_graders_own(tmp_path):
    """This machine may have cgroup v1 only: a cgroup v2 hierarchy is stood in for by a folder, to check that the
    budget's cgroup is made under the grader's own (found through the mount and /proc/self/cgroup) with the limits
    of the budget and the whole group killed on running out of memory, and that the events are read."""
    mount = tmp_path / "cgroup v2"
    own = mount / "system.slice" / "grader.service"
    own.mkdir(parents=True)
    (own / "cgroup.controllers").write_text("cpu io memory pids\n")
    (own / "cgroup.subtree_control").write_text("memory pids\n")
    (own / "course-grading-4999999-3").mkdir()  # left by a grader that was killed (no such process)
    (own / f"course-grading-{os.getpid()}-999").mkdir()  # a live grader's
    limits = sandbox.Limits(memory_budget=2**30, process_budget=99)
    group = _Cgroup.make(limits, [("cgroup2", "/", str(mount), "rw")], {"": "/system.slice/grader.service"})
    assert not (own / "course-grading-4999999-3").exists(), "a dead grader's empty cgroup is removed"
    assert (own / f"course-grading-{os.getpid()}-999").is_dir(), "a live grader's is kept"
    (own / f"course-grading-{os.getpid()}-999").rmdir()
    try:
        assert group is not None and group.version == 2 and group.folders[""].parent == own
        folder = group.folders[""]
        assert {name: (folder / name).read_text() for name in ("memory.max", "pids.max", "memory.oom.group")} == \
            {"memory.max": str(2**30), "pids.max": "99", "memory.oom.group": "1"}
        assert group.procs_files() == [folder / "cgroup.procs"]
        assert (group.oom_kills(), group.pid_refusals()) == (0, 0)
        (folder / "memory.events").write_text("low 0\nhigh 0\nmax 12\noom 1\noom_kill 1\noom_group_kill 1\n")
        (folder / "pids.events").write_text("max 3\n")
        assert (group.oom_kills(), group.pid_refusals()) == (1, 3)
    finally:
        for file in group.folders[""].iterdir():
            file.unlink()
        group.remove()
    assert [p.name for p in own.iterdir() if p.is_dir()] == [], "the budget's cgroup is removed"
    # No memory and pids controllers for the grader's cgroup, and no cgroup v1: the watchdog is used.
    (own / "cgroup.controllers").write_text("cpu io\n")
    assert _Cgroup.make(limits, [("cgroup2", "/", str(mount), "rw")], {"": "/system.slice/grader.service"}) \
        is None


def test_the_bytes_written_are_counted_only_in_the_sandboxs_own_folders():
    """The watcher reaches a sandbox's /tmp through /proc/<pid>/root of its first process; while bwrap still sets
    the sandbox up, that is the machine's /tmp. Two honest notebooks were stopped for having "written" the
    machine's disk that way (under load, when setting up is slow). A process tree outside any sandbox counts 0."""
    outside = subprocess.Popen(["/bin/sh", "-c", "sleep 30; true"], start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while not Path(f"/proc/{outside.pid}/task/{outside.pid}/children").read_text().split():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        budget = sandbox.Budget(sandbox.Limits(disk_budget=2**20))
        assert budget._disk([outside.pid]) == 0
    finally:
        os.killpg(outside.pid, 9)
        outside.wait()
