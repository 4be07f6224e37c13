"""The repository keeps its promises: exact pins in one list, the README's commands, CI, the syllabus."""

from __future__ import annotations

import re
import subprocess
import tomllib
from importlib.metadata import version

import nbformat

from conftest import NOTEBOOKS, ROOT

REQUIRED = {"torch": "2.13.0", "nbval": "0.11.0", "nbgrader": None, "jupyterlab": None, "numpy": None,
            "matplotlib": None, "gensim": None, "pytest": None}


def _pins() -> dict[str, str]:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    pins = {}
    for dep in deps:
        match = re.fullmatch(r"([A-Za-z0-9_.-]+)==([0-9][0-9A-Za-z.+-]*)", dep)
        assert match, f"{dep!r} is not pinned exactly (name==version)"
        pins[match.group(1).lower()] = match.group(2)
    return pins


def test_every_dependency_is_pinned_exactly_and_installed_at_that_version():
    pins = _pins()
    for name, pinned in REQUIRED.items():
        assert name in pins, f"{name} must be a pinned dependency"
        if pinned:
            assert pins[name] == pinned
    for name, pinned in pins.items():
        installed = version(name)
        assert installed.split("+")[0] == pinned, f"{name} {installed} is installed but {pinned} is pinned: run make setup"


def test_environment_yml_uses_the_same_single_list():
    text = (ROOT / "environment.yml").read_text()
    assert re.search(r"^\s*- python=3\.11\s*$", text, re.M), "environment.yml pins Python 3.11"
    assert re.search(r"^\s*- -e \.\s*$", text, re.M), "environment.yml installs this package (and so its pins)"
    entries = re.findall(r"^\s*- ([^\s#]+)", text, re.M)
    assert set(entries) <= {"conda-forge", "python=3.11", "pip", "pip:", "-e"}, f"no second list of pins: {entries}"
    assert tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"] == "==3.11.*"


def test_readme_quick_start_and_ci_use_the_same_commands():
    readme = (ROOT / "README.md").read_text()
    learner = readme.split("## Start here, if you are learning", 1)[1].split("\n## ", 1)[0]
    assert re.findall(r"^make [\w-]+$", learner, re.M) == ["make lab"], "a learner's start gives one command"
    quick = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    commands = re.findall(r"^make [\w-]+$", quick, re.M)
    assert commands == ["make lab-instructor", "make test"], commands
    makefile = (ROOT / "Makefile").read_text()
    for target in ("setup", "lab", "lab-instructor", "test", "execute", "release", "grade", "site", "slides", "browser-test"):
        assert re.search(rf"^{target}:", makefile, re.M), f"Makefile has no '{target}' target"
        assert f"make {target}" in readme, f"README does not explain make {target}"
    assert re.search(r"^make test$", (ROOT / ".ci" / "run").read_text(), re.M), ".ci/run must call the README's test command"
    assert "--nbval " in makefile + (ROOT / "pyproject.toml").read_text() and "--nbval-lax" not in makefile


def test_syllabus_table_lists_every_notebook_with_measured_minutes():
    from course_utils.tooling import site

    entries = site.syllabus()  # the README's table, parsed as the site reads it
    assert {e.file for e in entries} == {p.name for p in NOTEBOOKS}, \
        "the syllabus table must list exactly the notebooks in notebooks/"
    for name, minutes in ((e.file, e.minutes) for e in entries):
        assert re.fullmatch(r"\d+\.\d|< 0\.1", minutes) and minutes != "0.0", \
            f"{name}: measured CPU minutes missing (run make bench)"
        first = nbformat.read(ROOT / "notebooks" / name, as_version=4).cells[0].source
        assert "*Runtime:*" in first


def test_the_learners_command_opens_the_student_version():
    """`make lab` (the README's one command for learners) writes the release into my-notebooks/ and opens it there."""
    dry = subprocess.run(["make", "-n", "lab"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    lab = [line for line in dry.splitlines() if "jupyter lab" in line]
    assert "course_utils.tooling.grading release --out \"my-notebooks\"" in dry
    assert len(lab) == 1 and lab[0].rstrip().endswith('"my-notebooks/00_orientation.ipynb"'), lab
    instructor = subprocess.run(["make", "-n", "lab-instructor"], cwd=ROOT, capture_output=True, text=True,
                                check=True).stdout
    assert "notebooks/00_orientation.ipynb" in instructor and "release" not in instructor
    # The tests fix IPYKERNEL_CELL_NAME (the Makefile exports it); a learner's kernel must not inherit it, or a
    # traceback through a function of an earlier cell shows "Error retrieving source code" instead of the line.
    for command in (lab[0], next(line for line in instructor.splitlines() if "jupyter lab" in line)):
        assert command.startswith("env -u IPYKERNEL_CELL_NAME "), command
