"""Run a student's notebook in a sandbox, for ``make grade``.

Autograding runs code a student wrote. Each notebook is executed by a fresh
process tree inside `bubblewrap <https://github.com/containers/bubblewrap>`_
(``bwrap``):

* **It sees only what a notebook needs** (an allow-list, :func:`shown_paths`):
  the Python installation and the system libraries it loads (``/usr/lib``,
  ``/usr/bin``, the ``/lib*`` links of a merged ``/usr``), the environment and
  whatever else Python imports from, the course's package (``course_utils/``)
  and ``data/``, read-only; ``/etc/ld.so.cache`` and made-up ``passwd``,
  ``group`` and ``hosts`` files; the CPU list of ``/sys``; its own ``/proc``
  and ``/dev``. Nothing else of the machine: not the course's notebooks,
  ``.git``, ``build/`` or ``tests/``, no other copy of the course wherever it
  lies, no home folder, no ``/tmp`` of the machine's, no submissions.
* **What it writes stays inside, and is small**: its work folder
  (:data:`WORK`), its ``/tmp`` and ``/dev/shm`` are size-limited memory file
  systems of its own; the rest is read-only. The notebook comes in on its
  standard input and goes back through a pipe that only the grading process
  holds; scores are computed by nbgrader outside.
* no network: its own network namespace has only a loopback device, which the
  notebook's kernel uses to talk to the runner;
* no capabilities, its own user (no further ones), process and IPC
  namespaces, and a new session (so it cannot inject keystrokes into the
  grader's terminal); when a run ends, every process in it is killed, daemons
  included (they live in the sandbox's process namespace).

**One budget per student's notebook** (``course_utils.tooling.budget.Budget``):
its kernel's sandbox and its verdict child's share one budget of memory,
processes and bytes written, which holds when the grader runs as root.
Per-process limits from ``prlimit`` (address space, CPU
time, file size, processes of the user) stay as a second line, with a
wall-clock limit on the whole run.

What the sandbox does *not* do: it cannot tell whether the student's code
tampered with its own kernel, for example by hiding the errors of the test
cells that run after it. Autograding flags such code for a human (see
``submissions.static_flags``), and checks every exercise again out of that kernel
(``course_utils.tooling.verdict``, whose child process runs in a sandbox of this kind).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from functools import cache
from pathlib import Path

import nbformat

from course_utils.core.portable import PINNED_ENV
from course_utils.experiments.loop import SMOKE_ENV
from course_utils.tooling.budget import Budget, BudgetExceeded, active_budget, shared  # noqa: F401 (execute's API)
from course_utils.tooling.limits import WORK, Limits, MiB

ROOT = Path(__file__).resolve().parents[2]
RUNNER = Path(__file__).with_name("notebook_runner.py")  # what runs inside: a script that imports no course_utils


class SandboxUnavailable(RuntimeError):
    """bubblewrap is missing or does not work on this machine."""


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
    """This grading process's temporary folder (under ``TMPDIR``; removed at exit).

    No sandbox sees it: a sandbox's work folder is a tmpfs of its own. It
    holds the made-up ``/etc`` files the sandboxes show, and the grading
    workers' temporary files.
    """
    global _WORK_ROOT
    if _WORK_ROOT is None or not Path(_WORK_ROOT.name).is_dir():
        _WORK_ROOT = tempfile.TemporaryDirectory(prefix="course-grading-")
    return Path(_WORK_ROOT.name)


# --- What a sandbox shows ---------------------------------------------------------------------------------------

_SYSTEM_WIDE = {Path("/"), Path("/usr"), Path("/usr/local"), Path("/opt")}  # prefixes never shown whole


def _library_dirs(prefix: Path) -> list[Path]:
    """What a system-wide prefix (``/usr``) gives a Python: its programs and libraries, not its ``share`` or ``src``."""
    names = ["bin", "lib", "lib64", "lib32", "libx32", "share/jupyter"]
    return [prefix / name for name in names if (prefix / name).is_dir()]


@cache
def _python_paths(pythonpath: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Where a fresh interpreter with the sandbox's settings imports from: ``sys.path``, and editable installs."""
    probe = ("import json, sys\nmapped = []\nfor finder in sys.meta_path:\n"
             "    module = sys.modules.get(getattr(finder, '__module__', '') or '')\n"
             "    mapping = getattr(module, 'MAPPING', None)\n"
             "    if isinstance(mapping, dict):\n        mapped += [str(p) for p in mapping.values()]\n"
             "print(json.dumps([sys.path, mapped]))")
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(WORK)}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    try:
        out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, cwd="/",
                             timeout=60, check=True).stdout
        paths, mapped = json.loads(out.strip().splitlines()[-1])
    except (subprocess.SubprocessError, OSError, ValueError, IndexError):
        paths, mapped = list(sys.path), []
    return tuple(p for p in paths if p), tuple(mapped)


def _course_parts(folder: Path) -> list[Path]:
    """Of a course's folder (this one, or a copy on PYTHONPATH): only its package and its data."""
    return [folder / part for part in ("course_utils", "data") if (folder / part).is_dir()]


def _is_course(folder: Path) -> bool:
    return folder == ROOT or ((folder / "course_utils" / "__init__.py").is_file() and (folder / "notebooks").is_dir())


def shown_paths() -> list[Path]:
    """The folders (and files) every sandbox shows read-only, at the same path: the allow-list.

    The Python installation (``sys.base_prefix``) and the environment
    (``sys.prefix``), whole, unless one is a system-wide folder such as ``/usr``
    (then only its ``bin`` and ``lib*``); every other folder a fresh
    interpreter imports from (``PYTHONPATH``, an editable install), but of a
    copy of the course only its ``course_utils/`` and ``data/``; and this
    course's ``course_utils/`` and ``data/`` (never its ``notebooks/``,
    ``.git``, ``build/`` or ``tests/``). The system's libraries are added by
    :func:`sandbox_command`.
    """
    prefixes = []
    for prefix in dict.fromkeys((sys.base_prefix, sys.base_exec_prefix, sys.prefix, sys.exec_prefix)):
        path = Path(prefix).resolve()
        prefixes += _library_dirs(path) if path in _SYSTEM_WIDE else [path]
    shown = list(prefixes)
    paths, mapped = _python_paths(os.environ.get("PYTHONPATH", ""))
    for entry in [*paths, *mapped]:
        path = Path(entry)
        if not path.is_absolute() or not path.exists():
            continue
        path = path.resolve()
        if any(path.is_relative_to(p) for p in prefixes) or path in _SYSTEM_WIDE:
            continue
        if path.is_dir() and _is_course(path):
            shown += _course_parts(path)
        elif not (path.is_relative_to(ROOT) or ROOT.is_relative_to(path)):  # in or around the course: its parts only
            shown.append(path)
    shown += _course_parts(ROOT)
    unique = sorted(dict.fromkeys(shown), key=lambda p: (len(p.parts), str(p)))
    return [p for p in unique if not any(p != q and p.is_relative_to(q) for q in unique)]


def needed_paths() -> list[Path]:
    """What a sandboxed run must see (read-only): :func:`shown_paths`."""
    return shown_paths()


def check_visible(hide: list[Path]) -> None:
    """Refuse, before anyone is graded, when a folder the sandbox must show lies in one it hides.

    Also reads the budgets of ``COURSE_GRADING_LIMITS`` (:meth:`Limits.from_env`), so that a mistake there
    stops grading before it starts.

    Raises:
        SandboxUnavailable: naming the path and what to do.
        ValueError: If ``COURSE_GRADING_LIMITS`` cannot be read.
    """
    Limits.from_env()
    for need in needed_paths():
        for folder in hide:
            folder = Path(folder).resolve()
            if need.is_relative_to(folder):
                what = "the course" if need.is_relative_to(ROOT) and not need.is_relative_to(Path(sys.prefix)) \
                    else "the Python environment"
                raise SandboxUnavailable(
                    f"{what} ({need}) lies inside {folder}, which grading hides from the students' code; "
                    f"put the submissions, the grading folder and the environment in separate folders "
                    f"(for example --out outside {need})")


def _system_mounts() -> list[tuple[Path, list[str]]]:
    """The system's programs and libraries: ``/usr/bin``, ``/usr/lib*``, and ``/bin``, ``/lib*`` (links when merged)."""
    mounts: list[tuple[Path, list[str]]] = []
    for name in ("usr/bin", "usr/lib", "usr/lib64", "usr/lib32", "usr/libx32"):
        path = Path("/") / name
        if path.is_dir() and not path.is_symlink():
            mounts.append((path, ["--ro-bind", str(path), str(path)]))
    for name in ("bin", "lib", "lib64", "lib32", "libx32"):
        path = Path("/") / name
        if path.is_symlink():
            mounts.append((path, ["--symlink", os.readlink(path), str(path)]))
        elif path.is_dir():
            mounts.append((path, ["--ro-bind", str(path), str(path)]))
    # The dynamic loader's cache; fontconfig's settings (a figure's text); the CPUs (OpenMP's and torch's count).
    for extra in ("/etc/ld.so.cache", "/etc/fonts", "/sys/devices/system/cpu"):
        if Path(extra).exists():
            mounts.append((Path(extra), ["--ro-bind", extra, extra]))
    folder = work_root() / "etc"
    if not folder.is_dir():
        folder.mkdir()
        uid, gid = os.getuid(), os.getgid()
        user = "root" if uid == 0 else "student"
        (folder / "passwd").write_text(f"{user}:x:{uid}:{gid}:{user}:{WORK}:/bin/sh\n", encoding="utf-8")
        (folder / "group").write_text(f"{user}:x:{gid}:\n", encoding="utf-8")
        (folder / "hosts").write_text("127.0.0.1 localhost\n::1 localhost\n", encoding="utf-8")
    for name in ("passwd", "group", "hosts"):
        mounts.append((Path("/etc") / name, ["--ro-bind", str(folder / name), f"/etc/{name}"]))
    return mounts


def sandbox_command(argv: list[str], hide: list[Path] = (), limits: Limits = Limits()) -> list[str]:
    """The command line that runs ``argv`` in a sandbox (see the module's docstring for what it shows).

    Args:
        argv: The command to run inside (its executable must be in what the sandbox shows).
        hide: Folders that must stay hidden even inside a folder the sandbox shows (empty, read-only there).
        limits: Resource limits (the sizes of the work folder, ``/tmp`` and ``/dev/shm``; the per-process ones).

    Returns:
        The full argv: ``prlimit ... -- bwrap ... -- argv``, run with :data:`WORK` as its folder. To hold it
        to a budget shared with other sandboxes, start it with :meth:`Budget.popen`.
    """
    bwrap = bwrap_path()
    hidden = sorted({Path(f).resolve() for f in hide if Path(f).is_dir()})
    shown = [p for p in shown_paths() if not any(p.is_relative_to(h) for h in hidden)]
    if any(WORK.is_relative_to(p) or p.is_relative_to(WORK) for p in shown):
        raise SandboxUnavailable(f"the course or its environment lies in {WORK}, where the sandbox keeps its work "
                                 "folder; move it")
    # (depth, order at equal depth, mount args), applied from the shallowest path to the deepest.
    disk = limits.disk_budget + MiB  # each mount alone is capped just above the budget of them all
    layers: list[tuple[int, int, list[str]]] = [
        (1, 0, ["--dev", "/dev"]), (1, 0, ["--proc", "/proc"]),
        (1, 0, ["--size", str(min(limits.tmp_bytes, disk)), "--tmpfs", "/tmp"]),
        (len(WORK.parts), 0, ["--size", str(disk), "--tmpfs", str(WORK)]),
        (2, 1, ["--size", str(min(limits.tmp_bytes, disk)), "--tmpfs", "/dev/shm"]),
    ]
    layers += [(len(path.parts), 1, args) for path, args in _system_mounts()]
    layers += [(len(path.parts), 1, ["--ro-bind", str(path), str(path)]) for path in shown]
    for folder in hidden:  # a hidden folder inside a shown one: an empty, read-only folder there
        if any(folder.is_relative_to(p) for p in shown):
            layers.append((len(folder.parts), 2, ["--tmpfs", str(folder), "--remount-ro", str(folder)]))
    mounts: list[str] = []
    for _, _, args in sorted(layers, key=lambda layer: layer[:2]):
        mounts += args
    for sub in (".ipython", ".matplotlib", ".runtime"):
        mounts += ["--dir", str(WORK / sub)]
    mounts += ["--remount-ro", "/dev", "--remount-ro", "/"]  # writable: the work folder, /tmp and /dev/shm only
    isolation = ["--unshare-all", "--unshare-user", "--disable-userns", "--cap-drop", "ALL", "--die-with-parent",
                 "--new-session", "--chdir", str(WORK), "--clearenv"]
    keep_env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8", "HOME": str(WORK),
                "USER": "student", "TMPDIR": "/tmp", "JUPYTER_RUNTIME_DIR": str(WORK / ".runtime"),
                "IPYTHONDIR": str(WORK / ".ipython"), "MPLCONFIGDIR": str(WORK / ".matplotlib"),
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


# --- Running a notebook -----------------------------------------------------------------------------------------

def execute(nb: nbformat.NotebookNode, hide: list[Path], cell_timeout: int, limits: Limits | None = None,
            budget: Budget | None = None) -> tuple[nbformat.NotebookNode | None, str]:
    """Execute a notebook in the sandbox, as nbgrader's ``Execute`` would.

    Args:
        nb: The notebook to run (not modified).
        hide: Folders the notebook must not see, even inside what the sandbox shows.
        cell_timeout: Seconds allowed per cell (a slower cell gets nbgrader's ``CellTimeoutError`` output).
        limits: Resource limits (default: ``budget``'s, or :meth:`Limits.from_env`).
        budget: The budget it shares (default: the one of :func:`shared`, or one of its own).

    Returns:
        ``(executed notebook, "")``, or ``(None, reason)`` when the run did not finish.
    """
    budget = budget or active_budget()
    if budget is None:
        with Budget(limits) as own:
            return execute(nb, hide, cell_timeout, limits, own)
    limits = limits or budget.limits
    if budget.breach:
        return None, budget.breach
    read_end, write_end = os.pipe()
    argv = [sys.executable, "-P", str(RUNNER), "--timeout", str(cell_timeout), "--result-fd", str(write_end)]
    try:
        process = budget.popen(sandbox_command(argv, hide, limits), pass_fds=(write_end,), stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    except BudgetExceeded as exc:
        os.close(read_end)
        return None, str(exc)
    finally:
        os.close(write_end)
    chunks: list[bytes] = []
    with os.fdopen(read_end, "rb") as reader:
        try:
            result, log = _communicate(process, reader, chunks, nbformat.writes(nb).encode(), limits.wall_seconds)
        except subprocess.TimeoutExpired:
            _kill(process)
            return None, (f"the notebook ran longer than {limits.wall_seconds} s in all; look for a loop that "
                          "never ends or a very slow cell")
    if budget.check():
        return None, budget.breach
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


def _communicate(process: subprocess.Popen, reader, chunks: list[bytes], data: bytes, wall_seconds: int
                 ) -> tuple[bytes, bytes]:
    def drain() -> None:
        chunks.append(reader.read())

    thread = threading.Thread(target=drain, daemon=True)
    thread.start()
    try:
        log, _ = process.communicate(input=data, timeout=wall_seconds)
    except BrokenPipeError:  # it died before reading its notebook
        log = process.stdout.read() if process.stdout else b""
        process.wait()
    thread.join(timeout=10)
    return (chunks[0] if chunks else b""), (log or b"")


def _kill(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, 9)
    except ProcessLookupError:
        pass
    process.wait()
