"""Run a student's notebook in a sandbox, for ``make grade``.

Autograding runs code a student wrote. Each notebook is executed by a fresh
process tree inside `bubblewrap <https://github.com/containers/bubblewrap>`_
(``bwrap``), with resource limits from ``prlimit`` (util-linux):

* a throwaway work folder holding only the notebook being graded is the one
  writable place (besides a small, private ``/tmp``);
* the rest of the file system is read-only, and the instructor's notebooks,
  the grading folder (gradebook, other students' work, grades) and the
  submissions folder are hidden behind empty folders, as are ``/tmp``, the
  grader's home folder and ``TMPDIR`` (where the other work folders are); the
  Python installation, the environment and the course are shown again,
  read-only, wherever they live (under ``/tmp`` or the home folder too);
* no network: the sandbox has its own network namespace with only a loopback
  device, which the notebook's kernel uses to talk to the runner;
* no capabilities, its own user, process and IPC namespaces, and a new
  session (so it cannot inject keystrokes into the grader's terminal);
* limits on address space (memory), on processes and threads, on CPU time per
  process, on the size of any file written, and a wall-clock limit on the
  whole run; when the run ends, every process in the sandbox is killed,
  daemons included (they live in the sandbox's process namespace).

The executed notebook is handed back through a pipe that only the runner
holds, and scores are computed by nbgrader outside the sandbox.

What the sandbox does *not* do: it cannot tell whether the student's code
tampered with its own kernel, for example by hiding the errors of the test
cells that run after it. Autograding flags such code for a human (see
``submissions.static_flags``), and checks every exercise again out of that kernel
(``course_utils.tooling.verdict``, whose child process runs in this sandbox).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import nbformat

from course_utils.core.portable import PINNED_ENV
from course_utils.experiments.loop import SMOKE_ENV

ROOT = Path(__file__).resolve().parents[2]


class SandboxUnavailable(RuntimeError):
    """bubblewrap is missing or does not work on this machine."""


@dataclass(frozen=True)
class Limits:
    """Resource limits for one sandboxed run."""

    memory_bytes: int = 6 * 2**30  # address space of each process (MemoryError beyond it)
    extra_processes: int = 512  # processes and threads on top of what the grader's user already runs
    cpu_seconds: int = 1200  # CPU time of each process
    file_bytes: int = 256 * 2**20  # largest file the notebook may write
    tmp_bytes: int = 512 * 2**20  # size of the sandbox's private /tmp
    wall_seconds: int = 1800  # the whole run, kernel start to shutdown


def bwrap_path() -> str:
    """The bwrap executable, or raise ``SandboxUnavailable`` with what to install."""
    found = shutil.which("bwrap")
    if not found:
        raise SandboxUnavailable(
            "bubblewrap (bwrap) is not installed, and student code is never run outside a sandbox: "
            "install it with `sudo apt-get install bubblewrap` (Debian/Ubuntu) or `dnf install bubblewrap`"
        )
    return found


def _user_processes() -> int:
    """Processes and threads the current user runs now (RLIMIT_NPROC counts them all)."""
    uid = os.getuid()
    count = 0
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if entry.stat().st_uid == uid:
                    count += len(list((entry / "task").iterdir()))
            except OSError:
                continue
    return count


_WORK_ROOT: tempfile.TemporaryDirectory | None = None


def work_root() -> Path:
    """This grading process's folder for the sandboxes' work folders (under ``TMPDIR``; removed at exit).

    Every sandbox hides it (and the whole of ``TMPDIR``) and shows again only
    its own work folder, so that with parallel jobs no student's code sees
    another student's work folder, wherever ``TMPDIR`` points.
    """
    global _WORK_ROOT
    if _WORK_ROOT is None or not Path(_WORK_ROOT.name).is_dir():
        _WORK_ROOT = tempfile.TemporaryDirectory(prefix="course-grading-")
    return Path(_WORK_ROOT.name)


def work_folder(prefix: str) -> tempfile.TemporaryDirectory:
    """A throwaway work folder for one sandboxed run (inside :func:`work_root`)."""
    return tempfile.TemporaryDirectory(prefix=prefix, dir=work_root())


def _masked() -> list[Path]:
    """Folders every sandbox replaces with an empty one: /tmp, the home folder, TMPDIR and the work root."""
    masks = [Path("/tmp"), Path(tempfile.gettempdir()), work_root()]
    home = Path.home()
    if home.is_dir() and home.resolve() != Path("/"):
        masks.append(home)
    return [m.resolve() for m in masks if m.is_dir() and m.resolve() != Path("/")]


def needed_paths() -> list[Path]:
    """What a sandboxed run must see (read-only): the Python installation, the environment and the course."""
    return [Path(p).resolve() for p in dict.fromkeys((sys.base_prefix, sys.prefix, str(ROOT)))]


def check_visible(hide: list[Path]) -> None:
    """Refuse, before anyone is graded, when a folder the sandbox must show lies in one it hides.

    Raises:
        SandboxUnavailable: naming the path and what to do.
    """
    for need in needed_paths():
        for folder in hide:
            folder = Path(folder).resolve()
            if need.is_relative_to(folder):
                what = "the Python environment" if need != ROOT.resolve() else "the course"
                raise SandboxUnavailable(
                    f"{what} ({need}) lies inside {folder}, which grading hides from the students' code; "
                    f"put the submissions, the grading folder and the environment in separate folders "
                    f"(for example --out outside {need})")


def sandbox_command(argv: list[str], work: Path, hide: list[Path], limits: Limits) -> list[str]:
    """The command line that runs ``argv`` in the sandbox with ``work`` as its only writable folder.

    The file system is the grader's, read-only, with these replaced by empty
    folders: ``/tmp``, the home folder, ``TMPDIR`` and this process's work
    root (:func:`work_root`), and every folder in ``hide``. What a run needs
    and lies in one of them (the Python installation, the environment, the
    course: :func:`needed_paths`) is shown again read-only, unless it lies in
    a folder of ``hide``. Mounts are applied from the shallowest path to the
    deepest, so a folder hidden inside a shown one stays hidden.

    Args:
        argv: The command to run inside (its executable must be readable there).
        work: The throwaway folder it may write (bound at the same path).
        hide: Folders to hide behind empty, read-only folders (missing ones are skipped).
        limits: Resource limits.

    Returns:
        The full argv: ``prlimit ... -- bwrap ... -- argv``.
    """
    bwrap = bwrap_path()
    work = Path(work).resolve()
    hidden = sorted({Path(f).resolve() for f in hide if Path(f).is_dir()})
    hidden = [f for f in hidden if not any(f != g and f.is_relative_to(g) for g in hidden)]  # already hidden
    # (depth, order at equal depth, mount args): masks first, then what is shown again, then hidden folders.
    layers: list[tuple[int, int, list[str]]] = []
    for mask in _masked():
        if mask == Path("/tmp"):
            layers.append((len(mask.parts), 0, ["--size", str(limits.tmp_bytes), "--tmpfs", str(mask)]))
        else:
            layers.append((len(mask.parts), 0, ["--tmpfs", str(mask)]))
    # Also every folder Python imports from here (an editable install's source, PYTHONPATH), unless hidden.
    shown = dict.fromkeys([*needed_paths(), *(Path(p).resolve() for p in sys.path if p and Path(p).is_dir())])
    for keep in shown:
        if any(keep.is_relative_to(m) for m in _masked()) and not any(keep.is_relative_to(h) for h in hidden):
            layers.append((len(keep.parts), 1, ["--ro-bind", str(keep), str(keep)]))
    for folder in hidden:
        if work.is_relative_to(folder):
            layers.append((len(folder.parts), 2, ["--tmpfs", str(folder)]))  # the work folder's bind is its content
        else:
            layers.append((len(folder.parts), 2, ["--tmpfs", str(folder), "--remount-ro", str(folder)]))
    mounts = ["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
    for _, _, args in sorted(layers, key=lambda layer: layer[:2]):
        mounts += args
    mounts += ["--bind", str(work), str(work)]
    isolation = ["--unshare-all", "--unshare-user", "--cap-drop", "ALL", "--die-with-parent", "--new-session",
                 "--chdir", str(work), "--clearenv"]
    keep_env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8", "HOME": str(work),
                "TMPDIR": str(work / "tmp"), "JUPYTER_RUNTIME_DIR": str(work / "runtime"),
                "IPYTHONDIR": str(work / "ipython"), "MPLCONFIGDIR": str(work / "matplotlib"),
                "JUPYTER_PLATFORM_DIRS": "1"}
    # The settings the course's kernels run with (pinned code paths, hash seed) and the short-training flag.
    for name in ("PYTHONHASHSEED", "PYTHONPATH", "IPYKERNEL_CELL_NAME", "VIRTUAL_ENV", SMOKE_ENV, *PINNED_ENV):
        if name in os.environ:
            keep_env[name] = os.environ[name]
    env = [arg for name, value in sorted(keep_env.items()) for arg in ("--setenv", name, value)]
    nproc = _user_processes() + limits.extra_processes
    prlimit = ["prlimit", f"--as={limits.memory_bytes}", f"--nproc={nproc}", f"--cpu={limits.cpu_seconds}",
               f"--fsize={limits.file_bytes}", "--core=0"]
    return [*prlimit, "--", bwrap, *mounts, *isolation, *env, "--", *argv]


def execute(nb: nbformat.NotebookNode, hide: list[Path], cell_timeout: int, limits: Limits = Limits()
            ) -> tuple[nbformat.NotebookNode | None, str]:
    """Execute a notebook in the sandbox, as nbgrader's ``Execute`` would.

    Args:
        nb: The notebook to run (not modified).
        hide: Folders the notebook must not see (instructor notebooks, grading folder, submissions).
        cell_timeout: Seconds allowed per cell (a slower cell gets nbgrader's ``CellTimeoutError`` output).
        limits: Resource limits of the whole run.

    Returns:
        ``(executed notebook, "")``, or ``(None, reason)`` when the run did not finish.
    """
    with work_folder("grade-") as tmp:
        work = Path(tmp)
        for sub in ("tmp", "runtime", "ipython", "matplotlib"):
            (work / sub).mkdir()
        nbformat.write(nb, work / "submission.ipynb")
        read_end, write_end = os.pipe()
        argv = [sys.executable, "-m", "course_utils.tooling.sandbox", str(work / "submission.ipynb"),
                "--timeout", str(cell_timeout), "--result-fd", str(write_end)]
        try:
            process = subprocess.Popen(sandbox_command(argv, work, hide, limits), pass_fds=(write_end,),
                                       stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                       start_new_session=True)
        finally:
            os.close(write_end)
        chunks: list[bytes] = []
        with os.fdopen(read_end, "rb") as reader:
            try:
                result, log = _communicate(process, reader, chunks, limits.wall_seconds)
            except subprocess.TimeoutExpired:
                _kill(process)
                return None, (f"the notebook ran longer than {limits.wall_seconds} s in all; look for a loop that "
                              "never ends or a very slow cell")
        if process.returncode != 0 or not result:
            tail = "\n".join(log.decode(errors="replace").strip().splitlines()[-3:])
            if "bwrap:" in tail:
                raise SandboxUnavailable(f"bubblewrap could not start the sandbox: {tail}")
            return None, ("the notebook's kernel died or was killed (memory or process limit?) before the end; "
                          f"last messages: {tail or 'none'}")
        try:
            return nbformat.reads(result.decode(), as_version=4), ""
        except Exception as exc:  # noqa: BLE001 - anything unreadable is a failed run
            return None, f"the sandbox returned an unreadable notebook ({type(exc).__name__})"


def _communicate(process: subprocess.Popen, reader, chunks: list[bytes], wall_seconds: int) -> tuple[bytes, bytes]:
    import threading

    def drain() -> None:
        chunks.append(reader.read())

    thread = threading.Thread(target=drain, daemon=True)
    thread.start()
    log, _ = process.communicate(timeout=wall_seconds)
    thread.join(timeout=10)
    return (chunks[0] if chunks else b""), (log or b"")


def _kill(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, 9)
    except ProcessLookupError:
        pass
    process.wait()


def _run_inside(path: Path, timeout: int, result_fd: int) -> int:
    """Inside the sandbox: execute the notebook with nbgrader's Execute and write it to ``result_fd``."""
    os.set_inheritable(result_fd, False)  # the kernel must not inherit the result pipe
    out = os.fdopen(result_fd, "w", encoding="utf-8")
    from nbgrader.preprocessors import Execute

    nb = nbformat.read(path, as_version=4)
    path.unlink()  # nothing of the run's input stays readable to the kernel
    executor = Execute(timeout=timeout, interrupt_on_timeout=True, allow_errors=True)
    nb, _ = executor.preprocess(nb, {"metadata": {"path": str(path.parent)}})
    out.write(nbformat.writes(nb))
    out.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="(inside the sandbox) execute one notebook for autograding")
    parser.add_argument("notebook", type=Path)
    parser.add_argument("--timeout", type=int, required=True)
    parser.add_argument("--result-fd", type=int, required=True)
    args = parser.parse_args(argv)
    return _run_inside(args.notebook, args.timeout, args.result_fd)


if __name__ == "__main__":
    sys.exit(main())
