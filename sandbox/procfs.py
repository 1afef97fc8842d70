"""The host's processes as ``/proc`` shows them (Linux): the one place host-side code walks it.

The sandbox agent has its own walk (it runs inside the sandbox on the standard library alone);
everything on the orchestrator's side that looks for processes or their descendants uses this.
"""

from __future__ import annotations

import contextlib
import os
import signal

PROC = "/proc"
KILL_ROUNDS = 10  # rounds of "find descendants, SIGKILL them" when tearing a process tree down
MAX_DESCENDANTS = 100_000  # bound of one walk of the tree


def pid_exists(pid: int) -> bool:
    """True while process ``pid`` exists, whoever owns it (no signal is sent)."""
    return os.path.exists(f"{PROC}/{pid}")


def alive(pid: int) -> bool:
    """True while process ``pid`` exists and is not a zombie (exited, not yet reaped)."""
    fields = _stat(pid)
    return bool(fields) and fields[0] != b"Z"


def proc_table() -> dict[int, tuple[int, int]]:
    """pid -> (ppid, pgid) for every visible process (processes gone meanwhile are skipped)."""
    table: dict[int, tuple[int, int]] = {}
    for name in os.listdir(PROC):
        if not name.isdigit():
            continue
        fields = _stat(int(name))
        try:
            table[int(name)] = (int(fields[1]), int(fields[2]))
        except (ValueError, IndexError):
            continue
    return table


def _stat(pid: int) -> list[bytes]:
    """The fields of ``/proc/<pid>/stat`` after ``(comm)`` (state, ppid, pgid, ...); [] once gone."""
    try:
        with open(f"{PROC}/{pid}/stat", "rb") as fh:
            stat = fh.read()
        return stat[stat.rindex(b")") + 2 :].split()  # after "(comm)", which may hold spaces and ")"
    except (OSError, ValueError):
        return []


def descendants(root_pid: int, table: dict[int, tuple[int, int]] | None = None) -> list[int]:
    """Every descendant of ``root_pid`` in ``table`` (default: read now), at most MAX_DESCENDANTS."""
    table = proc_table() if table is None else table
    kids: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        kids.setdefault(ppid, []).append(pid)
    found: list[int] = []
    todo = list(kids.get(root_pid, []))
    while todo and len(found) < MAX_DESCENDANTS:
        pid = todo.pop()
        found.append(pid)
        todo.extend(kids.get(pid, []))
    return found


def kill_tree(root_pid: int) -> None:
    """SIGKILL a process, every descendant and their process groups (never our own group)."""
    own_group = os.getpgrp()
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(root_pid, signal.SIGSTOP)  # a stopped root cannot fork replacements meanwhile
    for _ in range(KILL_ROUNDS):
        table = proc_table()
        found = descendants(root_pid, table)
        if not found:
            break
        for pid in found:
            pgid = table[pid][1]
            with contextlib.suppress(ProcessLookupError, PermissionError):
                if pgid not in (own_group, 0):
                    os.killpg(pgid, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
    if root_pid != own_group:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(root_pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(root_pid, signal.SIGKILL)
