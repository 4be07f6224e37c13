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

**One budget per student's notebook** (:class:`Budget`): the sandbox of the
notebook's kernel and that of its out-of-kernel verdict's child
(``course_utils.tooling.verdict``), which run at the same time, share one
budget of memory (tmpfs pages included), processes (threads count, as the
kernel counts them) and bytes written. It holds when the grader runs as
root: a cgroup where one can be made (v2 ``memory.max``/``pids.max``, or v1
``memory.limit_in_bytes``/``pids.max``, under the grader's own cgroup), and
where none can be, a watchdog thread that adds up the memory and counts the
processes of the sandboxes' process trees. When a budget is exceeded, every
process of that student's sandboxes is killed and the notebook fails with the
reason ("used more than 4 GiB of memory: stopped"); the students graded beside
it are not touched. Per-process limits from ``prlimit`` (address space, CPU
time, file size, processes of the user) stay as a second line, with a
wall-clock limit on the whole run.

What the sandbox does *not* do: it cannot tell whether the student's code
tampered with its own kernel, for example by hiding the errors of the test
cells that run after it. Autograding flags such code for a human (see
``submissions.static_flags``), and checks every exercise again out of that kernel
(``course_utils.tooling.verdict``, whose child process runs in a sandbox of this kind).
"""

from __future__ import annotations

import argparse
import atexit
import collections
import contextlib
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, fields, replace
from functools import cache
from pathlib import Path

import nbformat

from course_utils.core.portable import PINNED_ENV
from course_utils.experiments.loop import SMOKE_ENV

ROOT = Path(__file__).resolve().parents[2]
WORK = Path("/sandbox")  # the work folder inside every sandbox (HOME and the kernel's folder): a tmpfs
LIMITS_ENV = "COURSE_GRADING_LIMITS"  # e.g. "memory_budget=2GiB,process_budget=128,watchdog=1" (see Limits.from_env)
BUDGET_LOG_ENV = "COURSE_GRADING_BUDGET_LOG"  # a file: each budget appends its peaks there (make bench-grading)
MiB, GiB = 2**20, 2**30


class SandboxUnavailable(RuntimeError):
    """bubblewrap is missing or does not work on this machine."""


@dataclass(frozen=True)
class Limits:
    """Resource limits of one student's notebook (its kernel's sandbox and its verdict child's, together).

    The budgets come from measurement. Grading the instructor's notebooks as
    a submission on the 2-core course machine (``python -m
    course_utils.tooling.bench_grading --peaks``; cgroup v1, the kernel's
    ``memory.max_usage_in_bytes`` and ``pids.peak`` of the budget: the
    notebook's kernel, its runner and its verdict child together, page cache
    included), the same with ``COURSE_UTILS_SMOKE=1`` and without (grading
    runs no training, so both gave the same numbers):

    =============================  ===========  ===========  =========
    notebook                       peak memory  peak tasks   written
    =============================  ===========  ===========  =========
    10_small_gpt                   654 MiB      28           0.1 MiB
    11_gpt_inference               654 MiB      28           0.1 MiB
    03_self_attention (heaviest)   752 MiB      30           0.1 MiB
    the nine others                618-693 MiB  28           0.1 MiB
    =============================  ===========  ===========  =========

    A whole notebook run in one sandbox, its training at full length
    included (more than grading ever runs): 10 664 MiB and 25 tasks, 11 644
    MiB and 25, 03 637 MiB, 26 and 1 MiB written, 09 (the heaviest) 1,454 MiB
    and 28. The budgets leave a margin on all of these: memory 4 GiB (5.4
    times grading's peak, 2.8 times a whole 09), 256 processes and threads
    (8.5 times), 512 MiB written (a thousand times: room for a learner's own
    files and checkpoints). With ``JOBS=2`` two budgets take at most 8 GiB
    of the course machine's 24 GiB. ``make bench-grading`` prints the peaks
    again and fails when a notebook uses more than half of a budget.
    """

    # The student's notebook in all: every process of its sandboxes, tmpfs pages included.
    memory_budget: int = 4 * GiB  # resident memory (cgroup memory.max; the watchdog sums PSS and tmpfs)
    process_budget: int = 256  # processes and threads alive at once (cgroup pids.max)
    disk_budget: int = 512 * MiB  # bytes in its work folders, /tmp and /dev/shm, all sandboxes together
    watchdog: bool = False  # use the watchdog even where a cgroup can be made (tests, or a machine that prefers it)
    # Each process (prlimit), a second line.
    memory_bytes: int = 6 * GiB  # address space of each process (MemoryError beyond it)
    extra_processes: int = 512  # processes and threads on top of what the grader's user already runs
    cpu_seconds: int = 1200  # CPU time of each process
    file_bytes: int = 256 * MiB  # largest file the notebook may write
    tmp_bytes: int = 256 * MiB  # size of the sandbox's /tmp and /dev/shm (each; all count in disk_budget)
    wall_seconds: int = 1800  # the whole run, kernel start to shutdown

    @classmethod
    def from_env(cls, environ: dict | None = None) -> Limits:
        """The default limits, changed by ``COURSE_GRADING_LIMITS`` (``name=value,...``; sizes as 512MiB, 4GiB)."""
        text = (os.environ if environ is None else environ).get(LIMITS_ENV, "").strip()
        limits = cls()
        if not text:
            return limits
        known = {f.name: f for f in fields(cls)}
        changes = {}
        for item in filter(None, (part.strip() for part in text.split(","))):
            name, _, value = item.partition("=")
            name = name.strip()
            if name not in known:
                raise ValueError(f"{LIMITS_ENV}: unknown limit {name!r}; the limits are {', '.join(known)}")
            if name == "watchdog":
                changes[name] = value.strip().lower() in ("1", "true", "yes", "on")
            else:
                changes[name] = _parse_size(value, f"{LIMITS_ENV}: {name}")
        return replace(limits, **changes)


def _parse_size(text: str, what: str) -> int:
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(|k|kib|m|mib|g|gib)\s*", text.lower())
    if not match:
        raise ValueError(f"{what}: {text!r} is not a number or a size such as 512MiB or 4GiB")
    scale = {"": 1, "k": 2**10, "kib": 2**10, "m": MiB, "mib": MiB, "g": GiB, "gib": GiB}[match.group(2)]
    return int(float(match.group(1)) * scale)


def size_text(n: int) -> str:
    """512 MiB, 4 GiB, 1.5 GiB: a size as the limits' messages say it."""
    if n >= GiB:
        return f"{n / GiB:.3g} GiB"
    if n >= MiB:
        return f"{n / MiB:.3g} MiB"
    return f"{n / 2**10:.3g} KiB"


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


# --- One budget for all the sandboxes of one student's notebook ---------------------------------------------------

class BudgetExceeded(RuntimeError):
    """A budget was exceeded: its sandboxes were stopped; the message says which limit."""


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _field(text: str, name: str) -> int:
    """The number after ``name`` in a cgroup file of ``name value`` lines (0 when absent)."""
    match = re.search(rf"^{re.escape(name)} (\d+)$", text, re.M)
    return int(match.group(1)) if match else 0


def _mountinfo() -> list[tuple[str, str, str, str]]:
    """The cgroup mounts: (fstype, root within the hierarchy, mount point, super options)."""
    found = []
    for line in _read(Path("/proc/self/mountinfo")).splitlines():
        left, _, right = line.partition(" - ")
        parts, rest = left.split(), right.split()
        if len(parts) >= 5 and len(rest) >= 3 and rest[0] in ("cgroup", "cgroup2"):
            unescape = lambda s: re.sub(r"\\(\d{3})", lambda m: chr(int(m.group(1), 8)), s)  # noqa: E731
            found.append((rest[0], unescape(parts[3]), unescape(parts[4]), rest[2]))
    return found


def _own_cgroups() -> dict[str, str]:
    """This process's cgroup per hierarchy: ``{"": path}`` for v2, ``{"memory": path, "pids": path}`` for v1."""
    own = {}
    for line in _read(Path("/proc/self/cgroup")).splitlines():
        _, controllers, path = line.split(":", 2)
        for name in controllers.split(",") if controllers else [""]:
            own[name] = path
    return own


def _inside(mount_root: str, mount_point: str, path: str) -> Path | None:
    """The folder of cgroup ``path`` under a mount of ``mount_root`` at ``mount_point`` (None when outside it).

    Empty cgroups that a grader killed before it could remove them (its process is gone) are removed from it.
    """
    root, own = Path(mount_root), Path(path)
    if not own.is_relative_to(root):
        return None
    folder = Path(mount_point) / own.relative_to(root)
    if not folder.is_dir():
        return None
    for stale in folder.glob("course-grading-*-*"):
        pid = stale.name.split("-")[2]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            with contextlib.suppress(OSError):
                stale.rmdir()  # fails, as it should, while a process is left in it
    return folder


_NAMES = itertools.count()
_LIVE: set = set()  # the cgroups made and not yet removed (removed at exit, should grading stop half-way)


@atexit.register
def _remove_cgroups() -> None:
    for group in list(_LIVE):
        group.kill()
        group.remove()


class _Cgroup:
    """A cgroup for one budget: v2 (one folder) or v1 (a folder in the memory and in the pids hierarchy)."""

    def __init__(self, version: int, folders: dict[str, Path]):
        self.version, self.folders = version, folders
        _LIVE.add(self)

    @classmethod
    def make(cls, limits: Limits, mounts: list[tuple[str, str, str, str]] | None = None,
             own: dict[str, str] | None = None) -> _Cgroup | None:
        """A new cgroup under the grader's own, with the budget's limits; None where none can be made.

        ``mounts`` and ``own`` stand for ``/proc/self/mountinfo`` and ``/proc/self/cgroup`` (tests).
        """
        name = f"course-grading-{os.getpid()}-{next(_NAMES)}"
        mounts = _mountinfo() if mounts is None else mounts
        own = _own_cgroups() if own is None else own
        for kind, root, point, _ in mounts:  # cgroup v2, when it has the memory and pids controllers for us
            if kind != "cgroup2" or "" not in own:
                continue
            parent = _inside(root, point, own[""])
            if parent is None or not {"memory", "pids"} <= set(_read(parent / "cgroup.controllers").split()):
                continue
            try:
                if not {"memory", "pids"} <= set(_read(parent / "cgroup.subtree_control").split()):
                    (parent / "cgroup.subtree_control").write_text("+memory +pids")
                (parent / name).mkdir()
            except OSError:
                continue
            group = cls(2, {"": parent / name})
            if group._limit(limits):
                return group
        folders = {}
        for controller in ("memory", "pids"):  # cgroup v1: one hierarchy per controller
            for kind, root, point, options in mounts:
                if kind == "cgroup" and controller in options.split(",") and controller in own:
                    parent = _inside(root, point, own[controller])
                    if parent is not None:
                        try:
                            (parent / name).mkdir()
                        except OSError:
                            continue
                        folders[controller] = parent / name
                        break
        group = cls(1, folders)
        if set(folders) == {"memory", "pids"} and group._limit(limits):
            return group
        group.remove()
        return None

    def _limit(self, limits: Limits) -> bool:
        if self.version == 2:
            settings = [("", "memory.max", limits.memory_budget), ("", "memory.swap.max", 0),
                        ("", "pids.max", limits.process_budget), ("", "memory.oom.group", 1)]
        else:
            settings = [("memory", "memory.limit_in_bytes", limits.memory_budget),
                        ("memory", "memory.memsw.limit_in_bytes", limits.memory_budget),
                        ("pids", "pids.max", limits.process_budget)]
        try:
            for controller, name, value in settings:
                path = self.folders[controller] / name
                if path.exists() or name in ("memory.max", "memory.oom.group", "memory.limit_in_bytes", "pids.max"):
                    path.write_text(str(value))
        except OSError:
            self.remove()
            return False
        return True

    def _file(self, controller: str, name: str) -> Path:
        return self.folders["" if self.version == 2 else controller] / name

    def procs_files(self) -> list[Path]:
        return [folder / "cgroup.procs" for folder in self.folders.values()]

    def oom_kills(self) -> int:
        if self.version == 2:
            return _field(_read(self._file("memory", "memory.events")), "oom_kill")
        return _field(_read(self._file("memory", "memory.oom_control")), "oom_kill")

    def pid_refusals(self) -> int:
        return _field(_read(self._file("pids", "pids.events")), "max")

    def memory(self) -> int:
        return int(_read(self._file("memory", "memory.current" if self.version == 2 else "memory.usage_in_bytes"))
                   or 0)

    def peak_memory(self) -> int:
        return int(_read(self._file("memory", "memory.peak" if self.version == 2 else "memory.max_usage_in_bytes"))
                   or 0)

    def tasks(self) -> int:
        return int(_read(self._file("pids", "pids.current")) or 0)

    def peak_tasks(self) -> int:
        return int((_read(self._file("pids", "pids.peak")) or "0").split()[0])

    def pids(self) -> set[int]:
        return {int(p) for folder in self.folders.values() for p in _read(folder / "cgroup.procs").split()}

    def kill(self) -> None:
        if self.version == 2 and (self.folders[""] / "cgroup.kill").exists():
            with contextlib.suppress(OSError):
                (self.folders[""] / "cgroup.kill").write_text("1")
        for _ in range(50):
            left = self.pids()
            if not left:
                return
            for pid in left:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.02)

    def remove(self) -> None:
        _LIVE.discard(self)
        for folder in self.folders.values():
            for _ in range(100):
                try:
                    folder.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:  # processes not yet gone
                    time.sleep(0.05)


def _processes() -> dict[int, tuple[int, int, int]]:
    """Every process of the machine: pid -> (parent pid, threads, resident pages)."""
    found = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as handle:
                data = handle.read()
        except OSError:
            continue
        rest = data[data.rfind(b")") + 2:].split()
        try:
            found[int(name)] = (int(rest[1]), int(rest[17]), int(rest[21]))
        except (IndexError, ValueError):
            continue
    return found


def _tree(roots: list[int], table: dict[int, tuple[int, int, int]]) -> list[int]:
    """``roots`` and all their descendants (a sandbox's orphans are adopted by its own init, a descendant)."""
    children = collections.defaultdict(list)
    for pid, (parent, _, _) in table.items():
        children[parent].append(pid)
    found, todo = [], [r for r in roots if r in table]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += children.get(pid, [])
    return found


def _pss(pid: int) -> int:
    """Proportional set size of a process in bytes (shared pages divided among their users)."""
    match = re.search(r"^Pss:\s+(\d+) kB", _read(Path(f"/proc/{pid}/smaps_rollup")), re.M)
    return int(match.group(1)) * 1024 if match else 0


_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


class Budget:
    """What all the sandboxes of one student's notebook may use together, and who enforces it.

    Usage::

        with Budget(limits) as budget:
            process = budget.popen(sandbox_command(argv, hide, limits), ...)  # each sandbox of that notebook
            ...
            if budget.breach: ...  # "used more than 4 GiB of memory: stopped"; every sandbox was killed

    A cgroup holds the memory and the processes where one can be made
    (``mode`` ``"cgroup v2"`` or ``"cgroup v1"``); elsewhere, or with
    ``limits.watchdog``, a watchdog thread (``mode`` ``"watchdog"``) sums the
    memory (PSS) and counts the processes and threads of the sandboxes'
    process trees. Either way a thread watches the bytes the sandboxes hold in
    their work folders, ``/tmp`` and ``/dev/shm``, and turns a limit the kernel
    enforced (an out-of-memory kill, a refused fork) into the kill of every
    sandbox of the budget, with the reason in :attr:`breach`.
    """

    def __init__(self, limits: Limits | None = None, *, label: str = "", poll: float = 0.2):
        self.limits = limits or Limits.from_env()
        self.label, self.poll = label, poll
        self.breach = ""
        self.peaks = {"memory": 0, "tasks": 0, "disk": 0}
        self._processes: list[subprocess.Popen] = []
        self._inner: dict[int, int] = {}  # outer bwrap pid -> a pid inside the sandbox (to reach its mounts)
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._cgroup: _Cgroup | None = None
        self.mode = ""  # "cgroup v2", "cgroup v1" or "watchdog", once a sandbox started

    def __enter__(self) -> Budget:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- starting sandboxes
    def popen(self, command: list[str], **kwargs) -> subprocess.Popen:
        """Start a sandbox (a :func:`sandbox_command`) in this budget; ``kwargs`` go to ``subprocess.Popen``.

        Raises:
            BudgetExceeded: If the budget was already exceeded (nothing is started).
        """
        with self._lock:
            if self.breach:
                raise BudgetExceeded(self.breach)
            if not self.mode:
                self._cgroup = None if self.limits.watchdog else _Cgroup.make(self.limits)
                self.mode = f"cgroup v{self._cgroup.version}" if self._cgroup else "watchdog"
            if self._cgroup is not None:  # join the cgroup before anything runs: no fork escapes it
                files = [str(f) for f in self._cgroup.procs_files()]
                join = 'while [ "$1" != -- ]; do echo $$ > "$1" || exit 125; shift; done; shift; exec "$@"'
                command = ["/bin/sh", "-c", join, "sh", *files, "--", *command]
            kwargs.setdefault("start_new_session", True)
            process = subprocess.Popen(command, **kwargs)
            self._processes.append(process)
            if self._thread is None:
                self._thread = threading.Thread(target=self._watch, name="sandbox-budget", daemon=True)
                self._thread.start()
            return process

    # -- watching
    def check(self) -> str:
        """Look now (besides the watching thread's rounds); the breach, or ""."""
        with self._lock:
            self._round()
            return self.breach

    def _watch(self) -> None:
        while not self._stop.wait(self.poll):
            with self._lock:
                self._round()
                if self.breach:
                    return

    def _round(self) -> None:
        if self.breach or not self._processes:
            return
        limits = self.limits
        roots = self._running()
        disk = self._disk(roots)
        self.peaks["disk"] = max(self.peaks["disk"], disk)
        if self._cgroup is not None:
            group = self._cgroup
            self.peaks["memory"] = max(self.peaks["memory"], group.peak_memory(), group.memory())
            self.peaks["tasks"] = max(self.peaks["tasks"], group.peak_tasks(), group.tasks())
            if group.oom_kills():
                return self._exceeded(f"used more than {size_text(limits.memory_budget)} of memory: stopped")
            if group.pid_refusals():
                return self._exceeded(f"started more than {limits.process_budget} processes: stopped")
        else:
            table = _processes()
            tree = _tree(roots, table)
            tasks = sum(table[pid][1] for pid in tree)
            self.peaks["tasks"] = max(self.peaks["tasks"], tasks)
            if tasks > limits.process_budget:
                return self._exceeded(f"started more than {limits.process_budget} processes: stopped")
            resident = sum(table[pid][2] for pid in tree) * _PAGE + disk
            if resident > limits.memory_budget:  # resident counts shared pages once per process: look closer
                resident = sum(_pss(pid) for pid in tree) + disk
            self.peaks["memory"] = max(self.peaks["memory"], resident)
            if resident > limits.memory_budget:
                return self._exceeded(f"used more than {size_text(limits.memory_budget)} of memory: stopped")
        if disk > limits.disk_budget:
            return self._exceeded(f"wrote more than {size_text(limits.disk_budget)}: stopped")

    def _running(self) -> list[int]:
        """The outer bwrap of each sandbox not yet reaped (a reaped one's pid may already be another process's)."""
        for process in self._processes:
            if process.returncode is not None:
                self._inner.pop(process.pid, None)
        return [p.pid for p in self._processes if p.returncode is None]

    def _disk(self, roots: list[int]) -> int:
        """Bytes held in the work folders, ``/tmp`` and ``/dev/shm`` of the budget's running sandboxes.

        Each is reached through ``/proc/<pid>/root`` of the sandbox's first process, once that process has
        moved into the sandbox's own root (before, the path would lead to the machine's ``/tmp``); a file
        system larger than the sandbox's own mounts are is not one of them and is not counted.
        """
        used, largest = 0, self.limits.disk_budget + 2 * MiB
        for root in roots:
            inner = self._inner.get(root)
            if inner is None or not Path(f"/proc/{inner}").exists():
                children = _read(Path(f"/proc/{root}/task/{root}/children")).split()
                if not children:
                    continue
                inner = int(children[0])
                try:
                    theirs, ours = os.stat(f"/proc/{inner}/root"), os.stat("/")
                except OSError:
                    continue
                if (theirs.st_dev, theirs.st_ino) == (ours.st_dev, ours.st_ino):
                    continue  # still setting the sandbox up
                self._inner[root] = inner
            for mount in (WORK, Path("/tmp"), Path("/dev/shm")):
                try:
                    stat = os.statvfs(f"/proc/{inner}/root{mount}")
                except OSError:
                    continue
                if stat.f_blocks * stat.f_frsize <= largest:
                    used += (stat.f_blocks - stat.f_bfree) * stat.f_frsize
        return used

    def _exceeded(self, reason: str) -> None:
        self.breach = reason
        self.kill()

    # -- stopping
    def kill(self) -> None:
        """Kill every process of every sandbox of this budget."""
        with self._lock:
            for pid in self._running():
                with contextlib.suppress(OSError):
                    os.killpg(pid, signal.SIGKILL)  # the outer bwrap: its sandbox dies with it
            if self._cgroup is not None:
                self._cgroup.kill()
            else:
                for _ in range(3):
                    tree = _tree(self._running(), _processes())
                    for pid in tree:
                        with contextlib.suppress(OSError):
                            os.kill(pid, signal.SIGKILL)
                    if not tree:
                        break

    def close(self) -> None:
        """Stop watching, kill what is left, remove the cgroup, and log the peaks where asked."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        with self._lock:
            if self._processes and not self.breach:
                self._round()  # the last look (the kernel's peaks are kept by the cgroup)
            if self._cgroup is not None:
                self._cgroup.kill()
                self._cgroup.remove()
                self._cgroup = None
            log = os.environ.get(BUDGET_LOG_ENV)
            if log and self._processes:
                with open(log, "a", encoding="utf-8") as handle:
                    handle.write(json.dumps({"label": self.label, "mode": self.mode, "breach": self.breach,
                                             **self.peaks}) + "\n")
            self._processes = []


_ACTIVE: list[Budget] = []


@contextlib.contextmanager
def shared(budget: Budget):
    """Within this block, :func:`execute` runs in ``budget`` (nbgrader's preprocessor cannot be handed one)."""
    _ACTIVE.append(budget)
    try:
        yield budget
    finally:
        _ACTIVE.remove(budget)


def active_budget() -> Budget | None:
    return _ACTIVE[-1] if _ACTIVE else None


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
    argv = [sys.executable, "-m", "course_utils.tooling.sandbox", "--timeout", str(cell_timeout),
            "--result-fd", str(write_end)]
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


def read_stdin() -> bytes:
    """Inside the sandbox: all of standard input (what the grader handed in), then standard input closed."""
    data = sys.stdin.buffer.read()
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    return data


def _run_inside(timeout: int, result_fd: int) -> int:
    """Inside the sandbox: execute the notebook read from stdin with nbgrader's Execute; write it to ``result_fd``."""
    os.set_inheritable(result_fd, False)  # the kernel must not inherit the result pipe
    out = os.fdopen(result_fd, "w", encoding="utf-8")
    nb = nbformat.reads(read_stdin().decode("utf-8"), as_version=4)  # nothing of it is on disk for the kernel
    from nbgrader.preprocessors import Execute

    executor = Execute(timeout=timeout, interrupt_on_timeout=True, allow_errors=True)
    nb, _ = executor.preprocess(nb, {"metadata": {"path": str(WORK)}})
    out.write(nbformat.writes(nb))
    out.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="(inside the sandbox) execute the notebook on stdin for autograding")
    parser.add_argument("--timeout", type=int, required=True)
    parser.add_argument("--result-fd", type=int, required=True)
    args = parser.parse_args(argv)
    return _run_inside(args.timeout, args.result_fd)


if __name__ == "__main__":
    sys.exit(main())
