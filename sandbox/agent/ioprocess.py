"""The I/O process ("crossaudit-io"): speaks the protocol after the load and drives each call child.

Why a separate process: a call child can read all of its own memory (freed buffers included),
so the warm parent it is forked from must never hold a caller's prompt, response or result.
Forked from the warm parent right after the load, this process reads every call, writes it to
the waiting child's pipe, collects the child's capped output and result envelope, answers with
a typed frame, then asks the warm parent (over a SOCK_SEQPACKET pair: small JSON messages, the
child's pipes passed as fds) to reset the sandbox and fork the next child.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import time

from .framing import ENVELOPE_SLACK, PROTOCOL_IN_MAX, depth_ok, error_info, exc_text, loads_strict
from .load import Loader
from .osutil import PR_SET_NAME, PR_SET_PDEATHSIG, process_ended, set_idle
from .state import Child

IO_PROCESS_NAME = b"crossaudit-io"  # the I/O process's name in ps and /proc/<pid>/comm
IO_EOF, IO_FATAL, IO_BROKEN, IO_CRASHED = 10, 11, 12, 13  # exit codes of the I/O process
CTL_MAX = 64 * 1024  # longest message between the I/O process and the warm parent (small JSON)
BACKSTOP_SLACK_S = 2.0  # the agent's own bound on a call, beyond limits.timeout_s


class IOProcess(Loader):
    """I/O-process methods of the agent (mixed into :class:`~.supervisor.Agent`).

    ``handle_call`` and ``kill_child`` also serve the warm parent before the load (calls refused).
    """

    def serve_one(self) -> str | None:
        """Read and answer one frame: "call" (a call was run), "eof", "fatal" (stream unusable) or None."""
        line = self.read_line()
        if not line:
            self.kill_child()
            return "eof"
        if len(line) > PROTOCOL_IN_MAX or not line.endswith(b"\n"):
            self.send({"op": "error", "error": error_info("protocol", "frame too long")})
            self.kill_child()
            return "fatal"
        try:
            frame = json.loads(line)
            if not isinstance(frame, dict):
                raise ValueError("frame is not an object")
        except (ValueError, RecursionError) as exc:
            self.send({"op": "error", "error": error_info("protocol", f"bad frame: {exc}")})
            return None
        op = frame.get("op")
        if op == "load":
            self.handle_load(frame)
        elif op == "call":
            return "call" if self.handle_call(frame) else None
        else:
            self.send({"op": "error", "error": error_info("protocol", f"unknown op {op!r}")})
        return None

    def io_main(self) -> int:  # pragma: no cover - runs in the I/O process
        if self.libc is not None:
            with contextlib.suppress(Exception):
                self.libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
                self.libc.prctl(PR_SET_NAME, IO_PROCESS_NAME, 0, 0, 0)
        self.request_child(reset=False)
        while True:
            got = self.serve_one()
            if got == "eof":
                return IO_EOF
            if got == "fatal":
                return IO_FATAL
            if got == "call":
                self.request_child(reset=True)  # off the request path: the answer is out
                if self.broken and os.getppid() == 1:
                    return IO_BROKEN

    def request_child(self, *, reset: bool) -> None:
        """I/O process: have the warm parent reset the sandbox (after a call) and fork the next child.

        Then report the reset (``reset`` frame) when the load asked for it: the sandbox is clean
        and the next call's child waits. A failed reset leaves this agent refusing calls.
        """
        assert self.ctl is not None
        self.ctl.send(json.dumps({"op": "next", "reset": reset}).encode())
        msg, fds, _flags, _addr = socket.recv_fds(self.ctl, CTL_MAX, 4)
        if not msg:
            raise EOFError("the warm parent is gone")
        reply = json.loads(msg)
        if len(fds) == 4:
            self.child = Child(int(reply["pid"]), *fds)
        report = reply.get("reset")
        if isinstance(report, dict) and not report.get("ok"):
            self.broken = str((report.get("error") or {}).get("message") or "reset failed")
        if report is not None and self.report_reset:
            self.send(report)

    def child_status(self, child: Child) -> int | None:
        """I/O process: a call child's exit status, from the warm parent (its parent, which reaps it)."""
        if self.ctl is None:
            return child.status
        self.ctl.send(json.dumps({"op": "status", "pid": child.pid}).encode())
        msg = self.ctl.recv(CTL_MAX)
        status = json.loads(msg).get("status") if msg else None
        return status if isinstance(status, int) else child.status

    def kill_child(self) -> None:
        child, self.child = self.child, None
        if child is None:
            return
        self._kill_group(child.pid)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(child.pid, 0)
        child.close_fds()

    # -- call
    def handle_call(self, frame: dict) -> bool:
        """Run one call in the waiting child and answer it; False when the frame was refused instead."""
        call_id = frame.get("id")
        if not isinstance(call_id, str) or len(call_id) > 200:
            self.send({"op": "error", "error": error_info("protocol", "call needs a string 'id'")})
            return False
        if not self.loaded or self.broken:
            reason = f"sandbox is not clean: {self.broken}"
            error = error_info("load_error", "not loaded") if not self.loaded else error_info("crashed", reason)
            self.send({"op": "result", "id": call_id, "ok": False, "error": error,
                       "stdout": "", "stderr": "", "truncated": False, "wall_ms": 0.0})  # fmt: skip
            return False
        payload = {k: frame.get(k) for k in ("prompt", "response", "context")}
        if not isinstance(payload["prompt"], str) or not isinstance(payload["response"], str):
            self.send({"op": "error", "error": error_info("protocol", "call needs string 'prompt' and 'response'")})
            return False
        if not isinstance(payload["context"], dict):
            payload["context"] = {}
        if self.child is None:  # only after an agent error: a fresh child, after a reset
            self.request_child(reset=True)
        if self.child is None:
            self.send({"op": "result", "id": call_id, "ok": False, "error": error_info("crashed", "no call process"),
                       "stdout": "", "stderr": "", "truncated": False, "wall_ms": 0.0})  # fmt: skip
            return False
        started = time.monotonic()
        try:
            answer = self.run_child(json.dumps(payload, ensure_ascii=False).encode("utf-8", "replace"))
        except Exception as exc:  # an agent bug must not take the agent down: report, kill, go on
            self.kill_child()
            answer = {"ok": False, "error": error_info("crashed", f"agent error: {exc_text(exc)}"),
                      "stdout": "", "stderr": "", "truncated": False}  # fmt: skip
        answer.update({"op": "result", "id": call_id, "wall_ms": round((time.monotonic() - started) * 1000, 3)})
        self.send(answer)
        return True

    # Long: one call's whole life in the child (send, read three capped pipes, deadline, reap) in
    # the order the kernel sees it; the buffers and caps it shares would be passed around if split.
    def run_child(self, payload: bytes) -> dict:
        child = self.child
        assert child is not None
        lim = self.limits
        out_cap, res_cap = int(lim["output_bytes"]), int(lim["result_bytes"]) + ENVELOPE_SLACK
        out_buf, err_buf, res_buf = bytearray(), bytearray(), bytearray()
        bufs = {child.out_r: out_buf, child.err_r: err_buf, child.res_r: res_buf}
        caps = {child.out_r: out_cap, child.err_r: out_cap, child.res_r: res_cap}
        names = {child.out_r: "output_bytes", child.err_r: "output_bytes", child.res_r: "result_bytes"}
        over: str | None = None
        pending = memoryview(payload)
        os.set_blocking(child.call_w, False)
        open_fds = {child.out_r, child.err_r, child.res_r}
        pidfd = -1
        with contextlib.suppress(AttributeError, OSError):
            pidfd = os.pidfd_open(child.pid)
        backstop = time.monotonic() + float(lim["timeout_s"]) + BACKSTOP_SLACK_S
        exited = False
        try:
            while time.monotonic() < backstop:
                rlist = list(open_fds) + ([pidfd] if pidfd >= 0 and not exited else [])
                wlist = [child.call_w] if child.call_w >= 0 else []
                if child.res_r not in open_fds and exited:
                    break
                if not rlist and not wlist:
                    break
                ready_r, ready_w, _ = select.select(rlist, wlist, [], 0.05 if pidfd < 0 else 1.0)
                if child.call_w in ready_w:
                    try:
                        n = os.write(child.call_w, pending[: 1 << 16])
                        pending = pending[n:]
                    except (BrokenPipeError, BlockingIOError, OSError) as exc:
                        if not isinstance(exc, BlockingIOError):
                            pending = pending[len(pending) :]
                    if not pending:
                        os.close(child.call_w)
                        child.call_w = -1
                for fd in ready_r:
                    if fd == pidfd:
                        exited = True
                        continue
                    chunk = os.read(fd, 1 << 16)
                    if not chunk:
                        open_fds.discard(fd)
                        continue
                    room = caps[fd] - len(bufs[fd])
                    bufs[fd] += chunk[: max(room, 0)]
                    if len(chunk) > room:
                        over = names[fd]
                if over:
                    break
                if child.res_r not in open_fds:
                    break  # the child closes its result pipe only when it is done (or dead)
                if pidfd < 0 and not exited:
                    exited = process_ended(child.pid)
                if exited:
                    break  # a grandchild may still hold the pipes open: drain below, do not wait on it
            else:
                over = "timeout"
            # Done (or over a cap): kill the whole group before answering; drain what is buffered.
            if self.reset_idle:
                set_idle(child.pid)  # its exit (unmapping its memory) then never delays a call in flight
            self._kill_group(child.pid)
            for fd in list(open_fds):
                if self._drain(fd, bufs[fd], caps[fd]) and not over:
                    over = names[fd]
            status: int | None = None
            envelope = None if over else self._parse_envelope(bytes(res_buf))
            if envelope is None or envelope.get("ok", True) is None:  # else reaped by the reset, after the answer
                status = self.child_status(child)
                if envelope is not None and status is not None and os.WIFSIGNALED(status):
                    envelope = None  # a partial result from a child killed by a limit
        finally:
            if pidfd >= 0:
                os.close(pidfd)
            child.close_fds()
            self.child = None

        out = bytes(out_buf).decode("utf-8", "replace")
        err = bytes(err_buf).decode("utf-8", "replace")
        truncated = over == "output_bytes"
        base = {"stdout": out, "stderr": err, "truncated": truncated}
        if over == "timeout":
            return {**base, "ok": False, "error": error_info("limit", "call exceeded its time limit", "timeout")}
        if over:
            cap = out_cap if over == "output_bytes" else int(lim["result_bytes"])
            return {**base, "ok": False, "error": error_info("limit", f"{over} limit of {cap} bytes exceeded", over)}
        if envelope is not None:
            return {**base, **envelope, "ok": bool(envelope["ok"])}
        return {**base, "ok": False, "error": self._death_error(status)}

    def _parse_envelope(self, data: bytes) -> dict | None:
        if not data:
            return None
        try:
            env = loads_strict(data)
        except (ValueError, RecursionError):
            return {"ok": None, "error": error_info("invalid_result", "result is not valid JSON")}
        if not isinstance(env, dict) or not isinstance(env.get("ok"), bool):
            return {"ok": False, "error": error_info("invalid_result", "malformed result envelope")}
        if env["ok"]:
            if not depth_ok(env.get("result"), int(self.limits["result_max_depth"])):
                return {"ok": False, "error": error_info("invalid_result", "result nested too deeply")}
            return {"ok": True, "result": env.get("result")}
        err = env.get("error")
        if not isinstance(err, dict) or not isinstance(err.get("type"), str):
            return {"ok": False, "error": error_info("crashed", "malformed error envelope")}
        limit = err.get("limit")
        return {"ok": False, "error": error_info(err["type"], str(err.get("message", "")),
                                             limit if isinstance(limit, str) else None)}  # fmt: skip

    @staticmethod
    def _drain(fd: int, buf: bytearray, cap: int) -> bool:
        """Read what is already buffered (never blocks); True when it went over ``cap``."""
        os.set_blocking(fd, False)
        for _ in range(64):
            try:
                chunk = os.read(fd, 1 << 16)
            except (BlockingIOError, OSError):
                return False
            if not chunk:
                return False
            room = cap - len(buf)
            buf += chunk[: max(room, 0)]
            if len(chunk) > room:
                return True
        return False

    @staticmethod
    def _death_error(status: int | None) -> dict:
        if status is not None and os.WIFSIGNALED(status):
            sig = os.WTERMSIG(status)
            if sig == signal.SIGXCPU:
                return error_info("limit", "CPU time limit exceeded", "cpu")
            if sig == signal.SIGXFSZ:
                return error_info("limit", "file size limit exceeded", "file_bytes")
            try:
                name = signal.Signals(sig).name
            except ValueError:
                name = str(sig)
            return error_info("crashed", f"evaluator process killed by {name} without a result")
        if status is not None and os.WIFEXITED(status):
            return error_info(
                "crashed", f"evaluator process exited with status {os.WEXITSTATUS(status)} without a result"
            )
        return error_info("crashed", "evaluator process ended without a result")
