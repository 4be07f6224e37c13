"""One budget per student's notebook in grading, which holds when the grader runs as root.

The sandbox of the notebook's kernel and that of its out-of-kernel verdict's
child (``course_utils.tooling.verdict``), which run at the same time, share one
:class:`Budget` of memory (tmpfs pages included), processes (threads count, as
the kernel counts them) and bytes written (the numbers are in
``course_utils.tooling.limits.Limits``). It is enforced by a cgroup where one
can be made (v2 ``memory.max``/``pids.max``, or v1
``memory.limit_in_bytes``/``pids.max``, under the grader's own cgroup), and
where none can be, by a watchdog thread that adds up the memory and counts the
processes of the sandboxes' process trees. When a budget is exceeded, every
process of that student's sandboxes is killed and the notebook fails with the
reason ("used more than 4 GiB of memory: stopped"); the students graded beside
it are not touched.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import itertools
import json
import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

from course_utils.tooling.limits import BUDGET_LOG_ENV, WORK, Limits, MiB, size_text


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
