"""The state every part of the agent shares, and the handle of a forked call child.

Why one object: the warm parent, its I/O process and each call child are forks of the same
process, so each works on its own copy of this state (the compiled code, the limits, the
preloaded names, the reset spec). The modules of this package each add one job's methods to it
(:class:`~.supervisor.Agent` combines them); this base only opens the protocol fds.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import types

from .osutil import load_libc

DEFAULT_LIMITS = {
    "timeout_s": 10.0,
    "cpu_s": 10,
    "memory_bytes": 256 * 1024 * 1024,
    "pids": 64,
    "nofile": 64,
    "file_bytes": 1024 * 1024,
    "output_bytes": 64 * 1024,
    "result_bytes": 1024 * 1024,
    "result_max_depth": 32,
    "result_max_violations": 1000,
    "cleanup_s": 2.0,  # the reset after a call; beyond it the sandbox is reported broken
}


class Child:
    """A forked, single-use call child as the parent sees it."""

    def __init__(self, pid: int, call_w: int, res_r: int, out_r: int, err_r: int) -> None:
        self.pid = pid
        self.call_w = call_w
        self.res_r = res_r
        self.out_r = out_r
        self.err_r = err_r
        self.status: int | None = None

    def close_fds(self) -> None:
        for fd in (self.call_w, self.res_r, self.out_r, self.err_r):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self.call_w = self.res_r = self.out_r = self.err_r = -1


class AgentState:
    """Protocol fds and the agent's state; fds 0 and 1 become /dev/null for everything else."""

    def __init__(self) -> None:
        # Protocol fds: private duplicates; fds 0 and 1 become /dev/null for everything else.
        self.proto_in = os.dup(0)
        self.proto_out = os.dup(1)
        self.devnull = os.open(os.devnull, os.O_RDWR)
        os.dup2(self.devnull, 0)
        os.dup2(self.devnull, 1)
        sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115 - a stray print goes to /dev/null
        self.inbuf = bytearray()  # protocol input read but not parsed yet (ours: zeroed when handed on)
        self.loaded = False
        self.code_obj: types.CodeType | None = None
        self.entry = "evaluate"
        self.restricted = False
        self.limits = dict(DEFAULT_LIMITS)
        self.preload: list[str] = []
        self.child: Child | None = None
        self.isolation: dict = {"netns": False, "subreaper": False, "uid_drop": False, "restricted": False}
        self.libc = load_libc()
        self.base_vm = 0
        self.reap_later: list[int] = []
        self.nproc_base = 0  # tasks the call child's uid already has (refreshed off the request path)
        self.rlimit_nproc = True
        self.reset_paths: list[str] = []  # scratch directories emptied after every call
        self.reset_ipc = False  # SysV IPC objects removed after every call (own IPC namespace only)
        self.reset_idle = False  # a finished call's process exits at SCHED_IDLE: never delays a call in flight
        self.report_reset = False  # send a "reset" frame after each call (the load asked for it)
        self.broken: str | None = None  # a reset failed: no further call is served
        self.ctl: socket.socket | None = None  # the I/O process <-> warm parent channel (after the load)
        self.io_pid = 0  # the warm parent: its I/O process, spared by the resets
