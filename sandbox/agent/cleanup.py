"""The per-call reset: nothing one call (or the load's imports) leaves behind is seen by the next.

Processes first (a survivor could write again): as PID 1 of a container every other process of
the PID namespace is killed (``kill(-1)``), elsewhere (the process backend) the agent's own
descendants. Then the scratch directories (``/tmp``, ``/dev/shm``, ``/dev/mqueue`` in a
container) are emptied, then SysV IPC objects are removed when the sandbox has its own IPC
namespace. Any failure raises :class:`CleanupError`: that sandbox serves no further call.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import time

from .osutil import children_of
from .state import AgentState

REAP_ROUNDS = 20  # rounds of "kill every stray descendant" after a call
KILL_ROUNDS = 10_000  # PID 1: rounds of kill(-1) + reap while waiting for killed processes to exit
KILL_WAIT_S = 0.01  # longest wait for one killed process to exit before the next round
PIDFD_BATCH = 16  # killed processes waited on at once (pidfds), of the agent's spare file descriptors
WIPE_MAX_ENTRIES = 1_000_000  # per reset; the container's tmpfs inode caps keep real counts far lower
IPC_RMID = 0
SYSV_IPC_KINDS = ("shm", "sem", "msg")  # /proc/sysvipc/<kind>: the second column is the id


class CleanupError(Exception):
    """The sandbox could not be reset after a call: it must not serve another one."""

    # Not in crossaudit.kernel.errors: the agent is stdlib-only; the supervisor reports this as a
    # failed ``reset`` frame and the host retires that sandbox. It never crosses an edge as a type.


def other_pids() -> list[int]:
    """Every process of this PID namespace but the caller (inside a container: all but PID 1)."""
    me = os.getpid()
    return [int(n) for n in os.listdir("/proc") if n.isdigit() and int(n) != me]


def wait_exit(pids: list[int], timeout: float) -> None:
    """Block until one of ``pids`` exits or ``timeout`` passes: no polling (pidfds; else a short sleep)."""
    fds: list[int] = []
    try:
        for pid in pids[:PIDFD_BATCH]:
            with contextlib.suppress(OSError, AttributeError):  # gone already, or no pidfd support
                fds.append(os.pidfd_open(pid))
        if fds:
            select.select(fds, [], [], timeout)
        else:
            time.sleep(min(timeout, 0.001))
    finally:
        for fd in fds:
            os.close(fd)


def wipe(top: str, deadline: float, budget: int) -> int:
    """Remove everything inside ``top`` (not ``top`` itself); returns how many entries went.

    Never follows symlinks. Works on directory fds (``*at`` calls): no path is resolved from
    ``/`` per entry (on a FUSE root filesystem that costs ~25 us each). A subdirectory is renamed
    to the top level before it is emptied, so nothing is ever more than two levels down: a tree
    deeper than PATH_MAX (or than any recursion limit) goes like a flat one. Directories the code
    made unreadable are chmod-ed back first (same owner). Bounded by ``budget`` entries and
    ``deadline``; raises CleanupError beyond, or when ``top`` is not empty at the end.
    """
    removed = serial = 0
    top_fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        todo: list[str | None] = [None]  # None: ``top`` itself; else the name of one of its subdirectories
        while todo:
            name = todo.pop()
            fd = top_fd
            if name is not None:
                with contextlib.suppress(OSError):
                    os.chmod(name, 0o700, dir_fd=top_fd)
                try:
                    fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=top_fd)
                except FileNotFoundError:
                    continue
            try:
                with os.scandir(fd) as it:
                    entries = [(e.name, e.is_dir(follow_symlinks=False)) for e in it]
                for entry, is_dir in entries:
                    if removed >= budget or time.monotonic() > deadline:
                        raise CleanupError(f"{top} still held entries after removing {removed}")
                    if not is_dir:
                        os.unlink(entry, dir_fd=fd)
                        removed += 1
                    elif fd == top_fd:
                        todo.append(entry)
                    else:
                        os.chmod(entry, 0o700, dir_fd=fd)  # moving a directory rewrites its '..'
                        serial, dest = _free_name(top_fd, serial)
                        os.rename(entry, dest, src_dir_fd=fd, dst_dir_fd=top_fd)
                        todo.append(dest)
            finally:
                if fd != top_fd:
                    os.close(fd)
            if name is not None:
                os.rmdir(name, dir_fd=top_fd)
                removed += 1
        if os.listdir(top_fd):
            raise CleanupError(f"{top} is not empty after the wipe")
    finally:
        os.close(top_fd)
    return removed


def _free_name(dir_fd: int, serial: int) -> tuple[int, str]:
    """The next ``.reset-N`` name not taken in ``dir_fd`` (the code may have made some itself)."""
    for _ in range(1000):
        serial += 1
        name = f".reset-{serial}"
        try:
            os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            return serial, name
    raise CleanupError("no free name to move a directory to")


def _sysv_ids(kind: str) -> list[int]:
    try:
        with open(f"/proc/sysvipc/{kind}", "rb") as fh:
            rows = [line.split() for line in fh.read().splitlines()[1:]]
    except OSError:
        return []
    return [int(row[1]) for row in rows if len(row) > 1 and row[1].isdigit()]


def remove_sysv_ipc(libc) -> int:
    """IPC_RMID every SysV shared memory segment, semaphore set and message queue of this IPC namespace."""
    if libc is None:
        raise CleanupError("no libc to remove SysV IPC objects with")
    removed = 0
    for kind in SYSV_IPC_KINDS:
        ids = _sysv_ids(kind)
        for _ in range(3):
            if not ids:
                break
            for ident in ids:
                if kind == "shm":
                    rc = libc.shmctl(ident, IPC_RMID, None)
                elif kind == "sem":
                    rc = libc.semctl(ident, 0, IPC_RMID)
                else:
                    rc = libc.msgctl(ident, IPC_RMID, None)
                removed += rc == 0
            ids = _sysv_ids(kind)
        if ids:
            raise CleanupError(f"SysV {kind} objects survived IPC_RMID")
    return removed


def reset_spec(spec: object) -> tuple[list[str], bool, bool] | str:
    """Validate the load frame's ``reset``: ``{"paths": [absolute dirs], "ipc": bool, "idle": bool}``; a
    str is a problem. ``idle``: a finished call's process exits at SCHED_IDLE (:func:`.osutil.set_idle`)."""
    if not isinstance(spec, dict) or not isinstance(spec.get("paths", []), list):
        return "reset must be {'paths': [absolute directories], 'ipc': bool, 'idle': bool}"
    paths = []
    for path in spec.get("paths", []):
        plain = isinstance(path, str) and os.path.isabs(path) and os.path.normpath(path) == path and path != "/"
        if not plain or not os.path.isdir(path) or os.path.islink(path):
            return f"reset path {path!r} is not a plain absolute directory"
        paths.append(path)
    ipc = spec.get("ipc", False) is True
    if ipc and os.getpid() != 1:
        return "reset.ipc needs an IPC namespace of the sandbox's own (the agent as PID 1 of a container)"
    return paths, ipc, spec.get("idle", False) is True


# --------------------------------------------------------------------------- restricted mode


class Cleanup(AgentState):
    """The reset, run by the warm parent after every call and once after the load's imports."""

    @staticmethod
    def _kill_group(pgid: int) -> None:
        for target in (lambda: os.killpg(pgid, signal.SIGKILL), lambda: os.kill(pgid, signal.SIGKILL)):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                target()

    def reap_strays(self, spare: int = 0) -> int:
        """Kill every descendant but ``spare`` (the I/O process) left after a call (orphans come back to us)."""
        keep = spare or None
        pending, self.reap_later = self.reap_later, []
        for pid in pending:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
        killed = 0
        for _ in range(REAP_ROUNDS):
            strays = [p for p in children_of(os.getpid()) if p != keep]
            if not strays:
                break
            killed += len(strays)
            for pid in strays:
                self._kill_group(pid)
            for pid in strays:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, 0)
        else:
            if [p for p in children_of(os.getpid()) if p != keep]:
                raise CleanupError(f"descendants survived {REAP_ROUNDS} rounds of SIGKILL")
        self._reap_zombies()
        return killed

    @staticmethod
    def _reap_zombies() -> None:
        while True:  # every exit status already available; each one is a pid gone for good
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return

    def kill_all(self, deadline: float, spare: int = 0) -> int:
        """PID 1 of a container only: SIGKILL every other process of the namespace but ``spare``, and reap.

        ``kill(-1)`` reaches whatever a call started (setsid, double fork, a fork chain). Sparing
        the I/O process, each round first stops everything with ``kill(-1, SIGSTOP)`` (a stopped
        process cannot fork), then kills every process found but ``spare`` by pid; the spared
        one waits for our answer meanwhile and gets SIGCONT. Bounded by KILL_ROUNDS and ``deadline``.
        """
        others = [p for p in other_pids() if p != spare]
        count = len(others)
        try:
            for _ in range(KILL_ROUNDS):
                if not others:
                    break
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(-1, signal.SIGSTOP if spare else signal.SIGKILL)
                for pid in others if spare else ():
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(pid, signal.SIGKILL)
                self._reap_zombies()
                others = [p for p in other_pids() if p != spare]
                if others:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    wait_exit(others, min(remaining, KILL_WAIT_S))
        finally:
            if spare:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(spare, signal.SIGCONT)
        if others:
            raise CleanupError(f"{len(others)} process(es) survived SIGKILL")
        self.reap_later.clear()
        return count

    def reset(self, spare: int = 0) -> dict:
        """Leave nothing of the last call (or of the load's imports) for the next; raises CleanupError.

        Processes first (a survivor could write again), then the scratch directories, then SysV
        IPC. ``kill(-1)`` only as PID 1 of a container: anywhere else it would mean every process
        of the user, so the process backend kills this agent's descendants instead.
        """
        started = time.monotonic()
        deadline = started + float(self.limits["cleanup_s"])
        pid1 = os.getpid() == 1
        stats: dict = {"processes": self.kill_all(deadline, spare) if pid1 else self.reap_strays(spare)}
        stats["reap_ms"] = round((time.monotonic() - started) * 1000, 3)  # mostly: the last child's exit
        files = 0
        for path in self.reset_paths:
            files += wipe(path, deadline, WIPE_MAX_ENTRIES - files)
        stats["files"] = files
        if self.reset_ipc and os.getpid() == 1:
            stats["ipc"] = remove_sysv_ipc(self.libc)
        return stats
