"""Run a student's notebook in a sandbox, for ``make grade``.

Autograding runs code a student wrote. Each notebook is executed by a fresh
process tree inside `bubblewrap <https://github.com/containers/bubblewrap>`_
(``bwrap``), with resource limits from ``prlimit`` (util-linux):

* a throwaway work folder holding only the notebook being graded is the one
  writable place (besides a small, private ``/tmp``);
* the rest of the file system is read-only, and the instructor's notebooks,
  the grading folder (gradebook, other students' work, grades) and the
  submissions folder are hidden behind empty folders, as is the grader's home
  folder apart from the Python installation;
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
``grading.static_flags``), and checks every exercise again out of that kernel
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


def sandbox_command(argv: list[str], work: Path, hide: list[Path], limits: Limits) -> list[str]:
    """The command line that runs ``argv`` in the sandbox with ``work`` as its only writable folder.

    Args:
        argv: The command to run inside (its executable must be readable there).
        work: The throwaway folder it may write (bound at the same path).
        hide: Folders to hide behind empty, read-only folders (missing ones are skipped).
        limits: Resource limits.

    Returns:
        The full argv: ``prlimit ... -- bwrap ... -- argv``.
    """
    bwrap = bwrap_path()
    home = Path.home()
    mounts = ["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
              "--size", str(limits.tmp_bytes), "--tmpfs", "/tmp"]
    if home.is_dir() and home != Path("/"):
        mounts += ["--tmpfs", str(home)]
        # The Python installation and the course may live under the home folder: show them again, read-only.
        for keep in (Path(sys.base_prefix), Path(sys.prefix), ROOT):
            if keep.resolve().is_relative_to(home.resolve()):
                mounts += ["--ro-bind", str(keep.resolve()), str(keep.resolve())]
    for folder in hide:
        folder = Path(folder).resolve()
        if folder.is_dir() and not work.resolve().is_relative_to(folder):
            mounts += ["--tmpfs", str(folder), "--remount-ro", str(folder)]
        elif folder.is_dir():
            mounts += ["--tmpfs", str(folder)]  # the work folder is inside: its bind below is the only content
    mounts += ["--bind", str(work), str(work)]
    isolation = ["--unshare-all", "--unshare-user", "--cap-drop", "ALL", "--die-with-parent", "--new-session",
                 "--chdir", str(work), "--clearenv"]
    keep_env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8", "HOME": str(work),
                "TMPDIR": str(work / "tmp"), "JUPYTER_RUNTIME_DIR": str(work / "runtime"),
                "IPYTHONDIR": str(work / "ipython"), "MPLCONFIGDIR": str(work / "matplotlib"),
                "JUPYTER_PLATFORM_DIRS": "1"}
    # The settings the course's kernels run with (pinned code paths, hash seed) and the short-training flag.
    for name in ("PYTHONHASHSEED", "IPYKERNEL_CELL_NAME", "VIRTUAL_ENV", SMOKE_ENV, *PINNED_ENV):
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
    with tempfile.TemporaryDirectory(prefix="grade-") as tmp:
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
