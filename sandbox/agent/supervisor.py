"""The warm parent: answers frames until the load, then only supervises (process supervision).

Why it never reads a call after the load: every call child is forked from it, and a child can
read all of its own memory, so it must never have held another caller's prompt, response or
result. After the load it forks the I/O process (:mod:`.ioprocess`), which speaks the protocol
from then on, and only answers its control messages: reset the sandbox (:mod:`.cleanup`) and
fork the next call child (:mod:`.callchild`), or reap a call child and tell its exit status.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import signal
import socket
import sys
import time

from .callchild import CallChild
from .cleanup import CleanupError
from .framing import clip_message, error_info, exc_text
from .ioprocess import CTL_MAX, IO_BROKEN, IO_CRASHED, IO_EOF, IO_FATAL, IOProcess


class Agent(IOProcess, CallChild):
    """The agent: the load (:mod:`.load`), the I/O process's protocol and calls (:mod:`.ioprocess`),
    the call child (:mod:`.callchild`), the reset (:mod:`.cleanup`), and the supervision below."""

    def serve(self) -> int:
        """Answer frames until a load succeeds, then serve the I/O process (supervise)."""
        while True:
            if self.loaded and not self.broken:
                return self.supervise()
            got = self.serve_one()  # not loaded (calls refused) or broken (calls refused as crashed)
            if got == "eof":
                return 0
            if got == "fatal":
                return 2

    def supervise(self) -> int:
        """The warm parent after the load: it never reads a call again.

        A call child can read all of its own memory (freed buffers included), so the memory it
        is forked from must never have held another caller's prompt, response or result. This
        process forks the I/O process, which speaks the protocol from then on, and only answers
        its requests (small control messages): reset the sandbox and fork the next child, or
        reap a child and tell its exit status.
        """
        ctl, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        gc.freeze()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - runs in the I/O process
            code = IO_CRASHED
            try:
                ctl.close()
                self.ctl = theirs
                code = self.io_main()
            except BaseException:
                pass
            finally:
                os._exit(code)
        theirs.close()
        self.io_pid = pid
        self.inbuf[:] = bytes(len(self.inbuf))  # read-ahead input (frames sent before "loaded") is theirs
        self.inbuf.clear()
        with ctl:
            while True:
                try:
                    msg = ctl.recv(CTL_MAX)
                except OSError:
                    msg = b""
                if not msg:
                    break
                request = json.loads(msg)
                if request.get("op") == "next":
                    self.next_child(ctl, reset=request.get("reset") is True)
                elif request.get("op") == "status":
                    ctl.send(json.dumps({"status": self.child_exit(int(request["pid"]))}).encode())
        try:
            status: int | None = os.waitpid(pid, 0)[1]
        except ChildProcessError:
            status = None
        exited = os.WEXITSTATUS(status) if status is not None and os.WIFEXITED(status) else None
        if exited in (IO_EOF, IO_FATAL, IO_BROKEN):
            return {IO_EOF: 0, IO_FATAL: 2, IO_BROKEN: 3}[exited]  # PID 1 exiting kills whatever is left
        with contextlib.suppress(OSError):  # killed (a call's own code can signal it) or crashed
            self.send({"op": "error", "error": error_info("crashed", "the agent's I/O process died")})
        return 3

    def next_child(self, ctl: socket.socket, *, reset: bool) -> None:
        """Warm parent: reset the sandbox (after a call), fork the next call child, hand its pipes over."""
        report = None
        if reset:
            started = time.monotonic()
            stats: dict = {}
            try:
                stats = self.reset(spare=self.io_pid)
            except Exception as exc:  # CleanupError, or an OSError of the wipe
                self.broken = clip_message(exc) if isinstance(exc, CleanupError) else exc_text(exc)
            report = {"op": "reset", "ok": self.broken is None,
                      "cleanup_ms": round((time.monotonic() - started) * 1000, 3), **stats}  # fmt: skip
            if self.broken:
                report["error"] = error_info("crashed", f"sandbox reset after a call failed: {self.broken}")
                ctl.send(json.dumps({"reset": report}).encode())
                return
        started = time.monotonic()
        self.refresh_nproc_base()
        child = self.fork_child()
        if report is not None:
            report["spawn_ms"] = round((time.monotonic() - started) * 1000, 3)
        message = json.dumps({"pid": child.pid, "reset": report}).encode()
        socket.send_fds(ctl, [message], [child.call_w, child.res_r, child.out_r, child.err_r])
        child.close_fds()  # the I/O process holds them now

    def child_exit(self, pid: int) -> int | None:
        """Warm parent: the exit status of a call child the I/O process is done with (killed first)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)  # a no-op when it already ended (its status stays)
        try:
            return os.waitpid(pid, 0)[1]
        except ChildProcessError:
            return None


CHANNEL_ENV = "CROSSAUDIT_AGENT_SOCKET"  # sandbox.docker.container.CHANNEL_ENV


def connect_channel() -> None:
    """When the orchestrator offers a socket (Docker, local daemon), speak the protocol on it:
    it becomes fds 0 and 1, where the protocol otherwise arrives (the attach stream), so
    nothing else changes. Done before anything of the evaluator's is loaded."""
    path = os.environ.pop(CHANNEL_ENV, "")
    if not path:
        return
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(path)
    os.dup2(sock.fileno(), 0)
    os.dup2(sock.fileno(), 1)
    sock.close()


def main() -> int:
    if sys.platform != "linux":
        sys.stderr.write("the CrossAudit agent needs Linux\n")
        return 2
    try:
        connect_channel()
    except OSError as exc:
        sys.stderr.write(f"the CrossAudit agent could not connect its channel: {exc}\n")
        return 2
    try:
        return Agent().serve()
    except (BrokenPipeError, KeyboardInterrupt):  # the orchestrator went away
        return 1
