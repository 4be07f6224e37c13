"""The course as a static web site (``make site``): Sphinx, MyST-NB and sphinx-book-theme, built offline.

The Sphinx configuration is ``docs/site/conf.py``. This module stages its
sources in ``build/site-src``: the committed notebooks as they are (MyST-NB
renders their stored outputs and never executes them), an index page with the
README's syllabus table and a toctree in syllabus order (the README table is
the one source of the order; ``syllabus`` parses it), and the student version
of every notebook (made as ``make release`` makes it), which the site publishes
under ``release/`` and links from each page's download menu. It then runs
``sphinx-build``. Maths is rendered by a local copy of MathJax 2 (from the
``jupyter-server-mathjax`` package), so the site builds and displays without a
network. The site is built, not committed.
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

_ROW = re.compile(r"^\|\s*\[(?P<title>[^\]]+)\]\(notebooks/(?P<file>[^)]+\.ipynb)\)\s*\|(?P<concepts>[^|]*)\|"
                  r"(?P<prereqs>[^|]*)\|(?P<minutes>[^|]*)\|\s*$")


@dataclass(frozen=True)
class Entry:
    """One row of the README's syllabus table."""

    title: str  # "03 · Self-attention from scratch"
    file: str  # "03_self_attention.ipynb"
    concepts: str  # what the notebook covers (markdown)
    prerequisites: str  # earlier notebooks
    minutes: str  # measured CPU minutes

    @property
    def page(self) -> str:
        """The HTML page's file name."""
        return self.file.replace(".ipynb", ".html")


def syllabus(readme: Path = README) -> list[Entry]:
    """The syllabus table of README.md, in order."""
    entries = []
    for line in readme.read_text(encoding="utf-8").splitlines():
        match = _ROW.match(line)
        if match:
            entries.append(Entry(match["title"].strip(), match["file"].strip(), match["concepts"].strip(),
                                 match["prereqs"].strip(), match["minutes"].strip()))
    return entries


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


def index_page(entries: list[Entry], title: str) -> str:
    """The site's front page (MyST markdown): the syllabus table and the toctree, both in syllabus order."""
    rows = "\n".join(f"| [{e.title}]({e.file}) | {e.concepts} | {e.prerequisites} | {e.minutes} |" for e in entries)
    toctree = "\n".join(Path(e.file).stem for e in entries)
    return f"""# {title}

The course's notebooks, executed, in the order they are meant to be read. Each page shows the code and
every output as the tests check them. The download button of a page gives the notebook with its outputs
(`.ipynb`) and the student version (no solutions, no outputs) to work in; the launch button opens it on
Binder or JupyterHub. To run the course on your machine, clone the repository and run `make lab`.

## Syllabus

| notebook | concepts | prerequisites | CPU minutes |
| --- | --- | --- | --- |
{rows}

```{{toctree}}
:hidden:
:maxdepth: 1

{toctree}
```
"""


def stage(src: Path, entries: list[Entry], notebooks: Path, readme: Path = README) -> Path:
    """Write the Sphinx sources of the site into ``src`` (emptied first) and return it.

    The notebooks are copied as they are; their student versions are made as
    ``make release`` makes them (``grading.build_course``), in a course folder
    of our own (``grading.release``'s is shared with the grading tests).

    Args:
        src: The staging folder.
        entries: The syllabus, in order.
        notebooks: Folder of the executed notebooks named in ``entries``.
        readme: The README whose first heading titles the site.

    Raises:
        FileNotFoundError: If a notebook of the syllabus is missing.
    """
    from course_utils.tooling import grading  # here: conf.py and guide.py import this module, not the grader

    if src.exists():
        shutil.rmtree(src)
    src.mkdir(parents=True)
    (src / "index.md").write_text(index_page(entries, course_title(readme)), encoding="utf-8")
    for entry in entries:
        notebook = Path(notebooks) / entry.file
        if not notebook.is_file():
            raise FileNotFoundError(f"the README's syllabus lists {entry.file}, but {notebook} does not exist")
        shutil.copy2(notebook, src / entry.file)
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
        The notebook pages, index first, then in syllabus order.

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
    return [out / "index.html"] + [out / e.page for e in entries]


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
