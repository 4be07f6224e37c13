"""Grading a class: wherever the course lives, several students at once, and in shards merged afterwards.

* A copy of the course under /tmp, in a folder whose name has a space, grades
  a submission with full marks (the sandbox hides /tmp and shows the course
  and its environment again).
* No sandbox sees what another sandbox writes, nor the grader's TMPDIR,
  wherever TMPDIR points; a sandbox shows only an allow-list of the machine;
  a course or environment inside a hidden folder, and a grading folder that
  cannot be written, are refused before anyone is graded.
* JOBS=2 gives the same table, grades.csv and feedback as one job, with a
  progress line per student; three shards merged give the same as one run,
  and a merge of an incomplete or mixed set of shards is refused.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import nbformat
import pytest

from buggy_answers import BUGGY
from conftest import NOTEBOOKS, ROOT
from course_utils.tooling import grade_report, grading, sandbox

STEM = NOTEBOOKS[0].stem  # 00_orientation: the quickest to grade
SINGLE = dict(zip(("cy", "dee", "fay", "gus"), BUGGY[STEM]))  # student -> the one exercise they got wrong
STUDENTS = ["ada", "ben", *SINGLE, "eve"]  # eve got every exercise wrong


def _with_answer(nb, grade_id: str, source: str):
    nb = copy.deepcopy(nb)
    next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id).source = source
    return nb


def _class(folder: Path, released: Path) -> Path:
    """Students of notebook 00: full marks, the untouched release, one buggy answer each, and every answer buggy."""
    assert len(SINGLE) == len(BUGGY[STEM]), "name more students for the buggy answers of notebook 00"
    instructor = nbformat.read(NOTEBOOKS[0], as_version=4)
    students = {"ada": instructor, "ben": nbformat.read(released, as_version=4)}
    for name, grade_id in SINGLE.items():
        students[name] = _with_answer(instructor, grade_id, BUGGY[STEM][grade_id])
    students["eve"] = instructor
    for grade_id, source in BUGGY[STEM].items():
        students["eve"] = _with_answer(students["eve"], grade_id, source)
    for name, nb in students.items():
        (folder / name).mkdir(parents=True)
        nbformat.write(nb, folder / name / f"{STEM}.ipynb")
    return folder


@pytest.fixture(scope="module")
def submissions(tmp_path_factory):
    base = tmp_path_factory.mktemp("class")
    course = grading.build_course([NOTEBOOKS[0]], base / "release-course")
    del course
    return _class(base / "submissions", base / "release-course" / "release" / STEM / f"{STEM}.ipynb")


def _outputs(folder: Path) -> dict[str, object]:
    """What an instructor reads: grades.csv, the marking sheets and the feedback pages."""
    feedback = {str(p.relative_to(folder)): p.read_text(encoding="utf-8")
                for p in sorted((folder / "feedback").rglob("*.html"))}
    written = {str(p.relative_to(folder)): p.read_text(encoding="utf-8") for p in sorted((folder / "written").iterdir())}
    return {"grades": (folder / "grades.csv").read_text(encoding="utf-8"), "feedback": feedback, "written": written}


@pytest.fixture(scope="module")
def one_job(submissions, tmp_path_factory):
    out = tmp_path_factory.mktemp("one") / "grading"
    lines: list[str] = []
    results = grading.autograde(submissions, course=out, jobs=1, progress=lines.append)
    return {"results": results, "out": out, "lines": lines}


def test_one_job_grades_the_class_and_says_how_far_it_is(one_job):
    by = {r.student: r for r in one_job["results"]}
    points = {ex.grade_id: ex.points for ex in grading.exercises(NOTEBOOKS[0])}
    assert by["ada"].scores == points and by["ben"].scores == {g: 0.0 for g in points}
    for student, grade_id in SINGLE.items():
        assert by[student].scores == dict(points, **{f"{grade_id}_tests": 0.0})
    assert by["eve"].scores == dict(points, **{f"{grade_id}_tests": 0.0 for grade_id in BUGGY[STEM]})
    lines, n = one_job["lines"], len(STUDENTS)
    assert len(lines) == n and all(line.startswith(f"graded {i}/{n}: ") for i, line in enumerate(lines, start=1))
    assert all("so far, about" in line and "left" in line for line in lines[:-1]) and "left" not in lines[-1]


def test_two_jobs_give_what_one_job_gives(submissions, one_job, tmp_path):
    out = tmp_path / "grading"
    lines: list[str] = []
    results = grading.autograde(submissions, course=out, jobs=2, progress=lines.append)
    assert grading.format_table(results) == grading.format_table(one_job["results"])
    assert _outputs(out) == _outputs(one_job["out"])
    assert sorted(line.split(": ")[1].split(" ")[0] for line in lines) == sorted(STUDENTS)


def test_three_shards_merged_give_what_one_run_gives(submissions, one_job, tmp_path):
    shards = []
    for index in range(3):
        shard = grading.Shard(f"{index}/3")
        shards.append(tmp_path / f"shard-{index}")
        graded = grading.autograde(submissions, course=shards[-1], jobs=1, shard=shard, progress=lambda line: None)
        assert sorted({r.student for r in graded}) == shard.pick(sorted(STUDENTS))
        assert not (shards[-1] / "grades.csv").exists(), "a shard leaves the report to the merge"
    merged = grading.merge(list(reversed(shards)), tmp_path / "merged", NOTEBOOKS[0].parent)
    assert grading.format_table(merged) == grading.format_table(one_job["results"])
    assert _outputs(tmp_path / "merged") == _outputs(one_job["out"])
    with pytest.raises(grade_report.MergeError, match="missing: 1"):
        grading.merge([shards[0], shards[2]], tmp_path / "nope", NOTEBOOKS[0].parent)
    with pytest.raises(grade_report.MergeError, match="given twice: 0"):
        grading.merge([shards[0], shards[0], shards[1]], tmp_path / "nope", NOTEBOOKS[0].parent)
    with pytest.raises(grade_report.MergeError, match="is one of 1 shards"):
        grading.merge([shards[0], one_job["out"], shards[2]], tmp_path / "nope", NOTEBOOKS[0].parent)
    other = tmp_path / "other-class"
    shutil.copytree(shards[1], other)
    info = json.loads((other / "class.json").read_text())
    (other / "class.json").write_text(json.dumps(dict(info, students=info["students"] + ["zed"])))
    with pytest.raises(grade_report.MergeError, match=r"graded another class .* \(its students differ\)"):
        grading.merge([shards[0], other, shards[2]], tmp_path / "nope", NOTEBOOKS[0].parent)
    assert not (tmp_path / "nope").exists(), "a refused merge writes nothing"


@pytest.mark.parametrize(("text", "fragment"), [("3/3", "i runs from 0 to N-1"), ("1-3", "write i/N"),
                                                ("0/0", "i runs from 0 to N-1")])
def test_a_wrong_shard_says_how_to_write_it(text, fragment):
    with pytest.raises(ValueError, match=fragment):
        grading.Shard(text)


def test_shards_split_the_class_deterministically_and_completely():
    students = [f"s{i:03d}" for i in range(101)]
    shares = [grading.Shard(f"{i}/7").pick(reversed(students)) for i in range(7)]
    assert sorted(s for share in shares for s in share) == students
    assert max(map(len, shares)) - min(map(len, shares)) <= 1


def test_grading_from_a_copy_of_the_course_under_tmp_whose_path_has_a_space(submissions):
    base = Path(tempfile.mkdtemp(prefix="course clone ", dir="/tmp"))
    try:
        clone = base / "attention course"
        shutil.copytree(ROOT / "course_utils", clone / "course_utils", ignore=shutil.ignore_patterns("__pycache__"))
        (clone / "notebooks").mkdir()
        shutil.copy(NOTEBOOKS[0], clone / "notebooks")
        subs = base / "subs"
        shutil.copytree(submissions / "ada", subs / "ada")
        env = dict(os.environ, PYTHONPATH=str(clone))
        run = subprocess.run([sys.executable, "-m", "course_utils.tooling.grading", "autograde", str(subs),
                              "--jobs", "1"], capture_output=True, text=True, cwd=clone, env=env, timeout=600)
        assert run.returncode == 0, run.stdout + run.stderr
        total = sum(ex.points for ex in grading.exercises(NOTEBOOKS[0]))
        assert f"{total:g}/" in run.stdout and "FAILED" not in run.stdout, run.stdout
        assert (clone / "build" / "grading" / "grades.csv").is_file()
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _visible(path: Path) -> bool:
    command = sandbox.sandbox_command(["/bin/sh", "-c", f"test -e '{path}'"], [], sandbox.Limits())
    return subprocess.run(command, capture_output=True).returncode == 0


@pytest.mark.parametrize("tmpdir", ["/tmp", "/var/tmp"])
def test_no_sandbox_sees_another_sandboxs_work_wherever_tmpdir_points(tmpdir, monkeypatch):
    """Each sandbox writes only to memory file systems of its own (its work folder, /tmp, /dev/shm): what one
    student's code writes there, another's never sees, nor anything of the grader's TMPDIR."""
    monkeypatch.setattr(tempfile, "tempdir", tempfile.mkdtemp(prefix="tmpdir-", dir=tmpdir))
    monkeypatch.setattr(sandbox, "_WORK_ROOT", None)
    try:
        grader_file = Path(tempfile.mkdtemp(prefix="grader-")) / "answer.txt"
        grader_file.write_text("a file of the grader's")
        writes = "for d in /sandbox /tmp /dev/shm; do echo mine > $d/answer.txt || exit 1; done; echo ok; sleep 30"
        first = subprocess.Popen(sandbox.sandbox_command(["/bin/sh", "-c", writes], [], sandbox.Limits()),
                                 stdout=subprocess.PIPE, start_new_session=True)
        try:
            assert first.stdout.readline() == b"ok\n", "a sandbox must write its work folder, /tmp and /dev/shm"
            for seen in ("/sandbox/answer.txt", "/tmp/answer.txt", "/dev/shm/answer.txt", grader_file,
                         grader_file.parent, sandbox.work_root()):
                assert not _visible(seen), f"{seen} is visible from another sandbox"
        finally:
            os.killpg(first.pid, 9)
            first.wait()
            first.stdout.close()
        assert _visible(ROOT / "course_utils" / "__init__.py"), "the course's package must stay visible"
        assert _visible(Path(sys.executable)), "the Python environment must stay visible"
    finally:
        sandbox._WORK_ROOT = None
        shutil.rmtree(tempfile.tempdir, ignore_errors=True)


def test_the_sandbox_shows_only_what_a_notebook_needs():
    """An allow-list: every file a sandbox shows lies in the Python installation, the environment, the course's
    package and data, the system's programs and libraries, a few files of /etc, or its own folders."""
    shown = [str(p) for p in sandbox.shown_paths()]
    allowed = [*shown, "/usr/bin", "/usr/lib", "/usr/lib64", "/usr/lib32", "/usr/libx32", "/bin", "/lib", "/lib64",
               "/lib32", "/libx32", "/etc/ld.so.cache", "/etc/fonts", "/etc/passwd", "/etc/group", "/etc/hosts",
               "/sys/devices/system/cpu", "/sandbox", "/tmp", "/dev", "/proc"]
    walk = ("import json, os, sys\nallowed = tuple(sys.argv[1:])\nodd = []\n"
            "for folder, subs, files in os.walk('/'):\n"
            "    if folder in ('/proc', '/dev', '/sys/devices/system/cpu'):\n        subs[:] = []\n"
            "    odd += [p for p in (os.path.join(folder, n) for n in files + subs)\n"
            "            if not any(p == a or p.startswith(a + '/') or a.startswith(p + '/') for a in allowed)]\n"
            "print(json.dumps(odd))")
    command = sandbox.sandbox_command([sys.executable, "-c", walk, *allowed], [], sandbox.Limits())
    run = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout) == [], "the sandbox shows more than the allow-list"
    for hidden in (ROOT / "notebooks", ROOT / ".git", ROOT / "tests", ROOT / "build", Path.home() / ".bashrc"):
        assert not _visible(hidden), f"{hidden} is visible"
    assert not _visible("/etc/shadow") and _visible("/etc/ld.so.cache")


def test_an_environment_inside_a_hidden_folder_is_refused_before_grading():
    with pytest.raises(sandbox.SandboxUnavailable, match="lies inside .* which grading hides"):
        sandbox.check_visible([Path(sys.prefix).parent])


def test_a_grading_folder_that_cannot_be_written_is_refused_before_grading(submissions, tmp_path):
    # A read-only file system (as a read-only checkout or container image has), which even root cannot write,
    # but for a temporary folder.
    readonly = [sandbox.bwrap_path(), "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
                "--bind", str(tmp_path), str(tmp_path), "--setenv", "TMPDIR", str(tmp_path), "--"]
    run = subprocess.run([*readonly, sys.executable, "-m", "course_utils.tooling.grading", "autograde",
                          str(submissions), "--out", str(ROOT / "build" / "read-only-grading")],
                         capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert run.returncode == 2, run.stdout + run.stderr
    assert "cannot grade: cannot write the grading folder" in run.stderr and "--out" in run.stderr, run.stderr
    assert "Traceback" not in run.stderr


def test_bench_grading_budget_scales_with_the_notebooks_and_names_what_failed():
    from course_utils.tooling import bench_grading

    def run(one, serial, parallel, notebooks=12):
        return {"one": one, "split": {f"{i:02d}_nb": one / notebooks for i in range(notebooks)}, "students": 4,
                "serial": serial, "parallel": parallel, "busy": {"one": 1.2, "serial": 1.2, "parallel": 1.9}}

    budget = bench_grading.NOTEBOOK_BUDGET * 12
    assert bench_grading.failures(run(budget - 1, 400, 250)) == []
    slow = bench_grading.failures(run(budget + 1, 400, 250))
    assert len(slow) == 1 and "over the" in slow[0] and "12 notebooks" in slow[0]
    assert bench_grading.failures(run(budget + 1, 400, 250, notebooks=14)) == [], "the budget grows with the course"
    flat = bench_grading.failures(run(100, 400, 390))
    assert len(flat) == 1 and "JOBS=2" in flat[0]
    assert "one student's 12 notebooks" in bench_grading.table(run(100, 400, 250))
