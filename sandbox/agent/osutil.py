"""Linux facts the agent reads from ``/proc`` and the libc calls it makes (prctl, unshare).

Why here and not in the host's ``sandbox.procfs``: the agent runs inside the sandbox
on the standard library alone, so it keeps its own small walk.
"""

from __future__ import annotations

import contextlib
import ctypes
import os

CLONE_NEWNET = 0x40000000
PR_SET_PDEATHSIG = 1
PR_SET_NAME = 15
PR_SET_CHILD_SUBREAPER = 36
PR_SET_NO_NEW_PRIVS = 38


def set_idle(pid: int) -> None:
    """SCHED_IDLE for a process that is about to be killed: its exit (unmapping its memory) runs
    only where no other task of its cgroup wants the CPU, and any waking task preempts it.
    One way only (leaving SCHED_IDLE needs CAP_SYS_NICE or RLIMIT_NICE); refused is no error."""
    with contextlib.suppress(OSError, AttributeError):
        os.sched_setscheduler(pid, os.SCHED_IDLE, os.sched_param(0))


def load_libc():
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


def count_uid_processes(uid: int, cap: int = 100_000) -> int:
    """Tasks (processes + threads) the kernel charges to ``uid`` for RLIMIT_NPROC."""
    count = 0
    try:
        names = os.listdir("/proc")
    except OSError:
        return 0
    for name in names[:cap]:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status", "rb") as fh:
                uid_line = threads = None
                for line in fh:
                    if line.startswith(b"Uid:"):
                        uid_line = line
                    elif line.startswith(b"Threads:"):
                        threads = line
                        break
            if uid_line and int(uid_line.split()[1]) == uid:
                count += int(threads.split()[1]) if threads else 1
        except (OSError, ValueError, IndexError):
            continue
    return count


def world_readable(path: str) -> bool:
    """Whether an unprivileged uid can traverse every directory down to ``path``."""
    import stat

    cur = os.path.abspath(path)
    for _ in range(64):
        try:
            mode = os.stat(cur).st_mode
        except OSError:
            return False
        if not mode & stat.S_IXOTH:
            return False
        parent = os.path.dirname(cur)
        if parent == cur:
            return True
        cur = parent
    return True


def vm_size() -> int:
    try:
        with open("/proc/self/status", "rb") as fh:
            for line in fh:
                if line.startswith(b"VmSize:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0


def children_of(pid: int) -> list[int]:
    out: list[int] = []
    try:
        names = os.listdir("/proc")
    except OSError:
        return out
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                stat = fh.read()
            ppid = int(stat[stat.rindex(b")") + 2 :].split()[1])
        except (OSError, ValueError):
            continue
        if ppid == pid:
            out.append(int(name))
    return out


def process_ended(pid: int) -> bool:
    """Whether a process (not necessarily our child) has exited: gone, or a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[-1].split()[0] in (b"Z", b"X")
    except (OSError, IndexError):
        return True


def thread_count() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 1
