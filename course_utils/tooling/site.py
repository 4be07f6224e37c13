"""The course as a static web site (``make site``): Sphinx, MyST-NB and sphinx-book-theme, built offline.

The Sphinx configuration is ``docs/site/conf.py``. This module stages its
sources in ``build/site-src``: the committed notebooks as they are (MyST-NB
renders their stored outputs and never executes them), the lab book's
notebooks under ``lab/``, an index page with the README's syllabus table and
two toctrees, the lectures' and then the lab book's, in syllabus order (the
README table is the one source of the order; ``syllabus`` parses it), and the
student version of every lecture (made as ``make release`` makes it), which the
site publishes under ``release/`` and links from each lecture's download menu.
It then runs ``sphinx-build``. A cell tagged ``evidence`` (a collapsed check of
a lecture's claims) is left out of the pages: MyST-NB reads every notebook
through ``read_page``, which tags such cells ``remove-cell`` in memory, so the
notebook a page offers for download is the committed file, evidence included.
Maths is rendered by a local copy of MathJax 2 (from the ``jupyter-server-mathjax``
package), so the site builds and displays without a network. The site is
built, not committed.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from course_utils.tooling.autograder import LAB  # the lab book's folder, in notebooks/, a release and the site
from course_utils.tooling.lecture_form import EVIDENCE  # the tag of a collapsed cell that checks a claim

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK_DIR = ROOT / "notebooks"
README = ROOT / "README.md"
SITE_DIR = ROOT / "build" / "site"
SOURCE_DIR = ROOT / "build" / "site-src"
CONF_DIR = ROOT / "docs" / "site"
RELEASE = "release"  # the student notebooks' folder in the site: build/site/release/NN_name.ipynb
EXTRA = "_extra"  # staged files Sphinx copies to the site as they are (html_extra_path)

# The lecturer's copy of the repository and JupyterHub, for the launch and repository buttons.
REPOSITORY_URL_VARIABLE = "COURSE_REPOSITORY_URL"
REPOSITORY_URL_DEFAULT = "https://github.com/OWNER/attention-course"
JUPYTERHUB_URL_VARIABLE = "COURSE_JUPYTERHUB_URL"
JUPYTERHUB_URL_DEFAULT = "https://jupyterhub.example.org"

MATHJAX_CONFIG = "TeX-AMS-MML_HTMLorMML-full,Safe"  # configs shipped by jupyter-server-mathjax
# jupyter-server-mathjax ships the STIX-Web fonts only (no TeX fonts): MathJax is told to use them.
MATHJAX_HUB_CONFIG = {"HTML-CSS": {"availableFonts": [], "preferredFont": None, "webFont": "STIX-Web",
                                   "imageFont": None}}

NO_LAB = "—"  # the lab book cell of a lecture without lab notebooks

_ROW = re.compile(r"^\|\s*\[(?P<title>[^\]]+)\]\(notebooks/(?P<file>[^)]+\.ipynb)\)\s*\|(?P<concepts>[^|]*)\|"
                  r"(?P<prereqs>[^|]*)\|(?P<minutes>[^|]*)\|(?P<lab>[^|]*)\|\s*$")
_LAB_LINK = re.compile(r"\[[^\]]+\]\(notebooks/(" + LAB + r"/[^)/]+\.ipynb)\)")


@dataclass(frozen=True)
class Entry:
    """One row of the README's syllabus table."""

    title: str  # "03 · Self-attention from scratch"
    file: str  # "03_self_attention.ipynb"
    concepts: str  # what the notebook covers (markdown)
    prerequisites: str  # earlier notebooks
    minutes: str  # measured CPU minutes
    lab: tuple[str, ...] = ()  # its lab book's notebooks, relative to notebooks/: ("lab/03_long_keys.ipynb",)

    @property
    def page(self) -> str:
        """The HTML page's file name."""
        return self.file.replace(".ipynb", ".html")

    @property
    def number(self) -> str:
        """The lecture's number: "03"."""
        return self.file[:2]


def _lab_files(cell: str, line: str) -> tuple[str, ...]:
    """The lab notebooks a syllabus row links (``[lab](notebooks/lab/NN_name.ipynb)``, ``, ``-separated) or ``—``."""
    cell = cell.strip()
    if cell == NO_LAB:
        return ()
    files = tuple(_LAB_LINK.findall(cell))
    if not files or _LAB_LINK.sub("", cell).replace(",", "").strip():
        raise ValueError(f"the README's syllabus row {line[:60]!r}…: its lab book cell {cell!r} is neither "
                         f"{NO_LAB!r} nor links [lab](notebooks/{LAB}/NN_name.ipynb) separated by ', '")
    return files


def syllabus(readme: Path = README) -> list[Entry]:
    """The syllabus table of README.md, in order, each lecture with its lab book's notebooks (last column)."""
    entries = []
    for line in readme.read_text(encoding="utf-8").splitlines():
        match = _ROW.match(line)
        if match:
            entries.append(Entry(match["title"].strip(), match["file"].strip(), match["concepts"].strip(),
                                 match["prereqs"].strip(), match["minutes"].strip(), _lab_files(match["lab"], line)))
    return entries


def lab_problems(entries: list[Entry], notebooks: Path = NOTEBOOK_DIR) -> list[str]:
    """What is wrong with the syllabus's lab book column, one message each (empty when all is well).

    Every notebook in ``notebooks/lab/`` is linked exactly once, from the row
    of the lecture its number names, and every link names a notebook that exists.
    """
    problems = []
    linked = [(entry, file) for entry in entries for file in entry.lab]
    for entry, file in linked:
        if not (Path(notebooks) / file).is_file():
            problems.append(f"{entry.file}'s row links notebooks/{file}, which does not exist")
        if Path(file).name[:2] != entry.number:
            problems.append(f"{entry.file}'s row links notebooks/{file}, which is lecture {Path(file).name[:2]}'s")
    files = [file for _, file in linked]
    for path in sorted((Path(notebooks) / LAB).glob("[0-9][0-9]_*.ipynb")):
        file = f"{LAB}/{path.name}"
        if files.count(file) != 1:
            problems.append(f"notebooks/{file} is linked {files.count(file)} times from the syllabus (once is right)")
    return problems


def read_page(text: str):
    """MyST-NB's reader of a page's notebook (``nb_custom_formats``): cells tagged ``evidence`` get ``remove-cell``."""
    import nbformat

    nb = nbformat.reads(text, as_version=4)
    for cell in nb.cells:
        tags = cell.metadata.get("tags", [])
        if EVIDENCE in tags and "remove-cell" not in tags:
            cell.metadata["tags"] = [*tags, "remove-cell"]
    return nb


def course_title(readme: Path = README) -> str:
    """The README's first heading: the course's name."""
    return readme.read_text(encoding="utf-8").splitlines()[0].removeprefix("# ").strip()


def mathjax_source() -> Path:
    """The MathJax 2 folder of the ``jupyter-server-mathjax`` package (``MathJax.js``, configs, STIX-Web fonts)."""
    import jupyter_server_mathjax

    return Path(jupyter_server_mathjax.__file__).parent / "static"


def launch_urls() -> tuple[str, str]:
    """(repository URL, JupyterHub URL) for the launch buttons: the environment's, or placeholders."""
    return (os.environ.get(REPOSITORY_URL_VARIABLE) or REPOSITORY_URL_DEFAULT,
            os.environ.get(JUPYTERHUB_URL_VARIABLE) or JUPYTERHUB_URL_DEFAULT)


def _lab_cell(entry: Entry) -> str:
    """The index's lab book cell: a link per lab notebook (to its page), or ``—``."""
    if not entry.lab:
        return NO_LAB
    if len(entry.lab) == 1:
        return f"[lab]({entry.lab[0]})"
    return ", ".join(f"[lab {i}]({file})" for i, file in enumerate(entry.lab, 1))


def _toctree(caption: str, files: list[str]) -> str:
    documents = "\n".join(str(Path(file).with_suffix("")) for file in files)
    return f"```{{toctree}}\n:hidden:\n:maxdepth: 1\n:caption: {caption}\n\n{documents}\n```\n"


def index_page(entries: list[Entry], title: str) -> str:
    """The site's front page (MyST markdown): the syllabus table, then the lectures' and the lab book's toctrees.

    Both toctrees are hidden (the sidebar shows them, under the captions
    "Lectures" and "Lab book") and in syllabus order; the lab book's is left
    out when no lecture has a lab notebook.
    """
    rows = "\n".join(f"| [{e.title}]({e.file}) | {e.concepts} | {e.prerequisites} | {e.minutes} | {_lab_cell(e)} |"
                     for e in entries)
    lab = [file for e in entries for file in e.lab]
    toctrees = _toctree("Lectures", [e.file for e in entries]) + ("\n" + _toctree("Lab book", lab) if lab else "")
    return f"""# {title}

The course's notebooks, executed, in the order they are meant to be read. Each page shows the code and
every output as the tests check them. The download button of a page gives the notebook with its outputs
(`.ipynb`) and, for a lecture, the student version (no solutions, no outputs) to work in; the launch button
opens it on Binder or JupyterHub. The lab book's notebooks are optional: they take a lecture's questions
further, with more seeds, controls and side findings, and are never graded. To run the course on your
machine, clone the repository and run `make lab`.

## Syllabus

| notebook | concepts | prerequisites | CPU minutes | lab book |
| --- | --- | --- | --- | --- |
{rows}

{toctrees}"""


def stage(src: Path, entries: list[Entry], notebooks: Path, readme: Path = README) -> Path:
    """Write the Sphinx sources of the site into ``src`` (emptied first) and return it.

    The notebooks are copied as they are, the lab book's under ``lab/``; the
    lectures' student versions are made as ``make release`` makes them
    (``grading.build_course``), in a course folder of our own
    (``grading.release``'s is shared with the grading tests).

    Args:
        src: The staging folder.
        entries: The syllabus, in order.
        notebooks: Folder of the executed notebooks named in ``entries`` (the lab book's in its ``lab/``).
        readme: The README whose first heading titles the site.

    Raises:
        FileNotFoundError: If a notebook of the syllabus is missing.
        ValueError: If the lab book column does not link each lab notebook once, from its lecture's row.
    """
    from course_utils.tooling import grading  # here: conf.py and guide.py import this module, not the grader

    problems = lab_problems(entries, notebooks)
    if problems:
        raise ValueError("the README's syllabus and notebooks/lab/ disagree:\n" + "\n".join(problems))
    if src.exists():
        shutil.rmtree(src)
    src.mkdir(parents=True)
    (src / "index.md").write_text(index_page(entries, course_title(readme)), encoding="utf-8")
    for file in [e.file for e in entries] + [file for e in entries for file in e.lab]:
        notebook = Path(notebooks) / file
        if not notebook.is_file():
            raise FileNotFoundError(f"the README's syllabus lists {file}, but {notebook} does not exist")
        (src / file).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(notebook, src / file)
    course = src / "_nbgrader"
    grading.build_course([src / e.file for e in entries], course)
    published = src / EXTRA / RELEASE
    published.mkdir(parents=True)
    for entry in entries:
        shutil.copy2(course / "release" / Path(entry.file).stem / entry.file, published / entry.file)
    shutil.rmtree(course)
    return src


def build_site(out: Path = SITE_DIR, notebooks: Path = NOTEBOOK_DIR, entries: list[Entry] | None = None,
               src: Path = SOURCE_DIR) -> list[Path]:
    """Build the site into ``out`` (emptied first) with ``sphinx-build``; any Sphinx warning fails the build.

    Args:
        out: Folder for the HTML site.
        notebooks: Folder of the executed notebooks.
        entries: The pages, in order; default: the README's syllabus.
        src: Staging folder for the Sphinx sources.

    Returns:
        The pages: the index, the lectures in syllabus order, then the lab book's in syllabus order.

    Raises:
        RuntimeError: If ``sphinx-build`` fails (its output is in the message).
    """
    entries = syllabus() if entries is None else entries
    out = Path(out)
    stage(Path(src), entries, Path(notebooks))
    if out.exists():
        shutil.rmtree(out)
    command = [sys.executable, "-m", "sphinx", "--builder", "html", "--conf-dir", str(CONF_DIR),
               "--fail-on-warning", "--keep-going", "--quiet", "--fresh-env", str(src), str(out)]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"sphinx-build failed (configuration: {CONF_DIR / 'conf.py'}):\n"
                           f"{done.stdout}\n{done.stderr}")
    return ([out / "index.html"] + [out / e.page for e in entries]
            + [out / Path(file).with_suffix(".html") for e in entries for file in e.lab])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=SITE_DIR, help="output folder (default: build/site)")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    pages = build_site(args.out)
    print(f"wrote {len(pages)} pages to {args.out} in {time.perf_counter() - start:.0f} s; "
          f"open {args.out / 'index.html'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
