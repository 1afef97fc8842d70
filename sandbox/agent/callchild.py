"""The single-use call child: forked by the warm parent ahead of demand, runs exactly one call.

Why forked ahead: a call then costs a pipe round trip, not a fork. The child applies its rlimits
(and drops root) first, then blocks until its call arrives, so no evaluator code runs while no
call is in flight: the module body runs only once the call is there. Its stdout/stderr go to
capped capture pipes, its result (a small JSON envelope) to a private pipe.
"""

from __future__ import annotations

import builtins
import errno
import gc
import json
import math
import os
import resource
import signal
import sys

from .framing import ENVELOPE_SLACK, PROTOCOL_IN_MAX, depth_ok, error_info, exc_text, write_all
from .osutil import PR_SET_NO_NEW_PRIVS, PR_SET_PDEATHSIG, count_uid_processes, vm_size
from .restrictions import SAFE_MODULES, Restrictions, SandboxViolation
from .state import AgentState, Child

SANDBOX_UID = 65534  # "nobody": the call child drops to it when the agent runs as root


def _watch_fork() -> None:
    """Wrap os.fork so a fork refused by RLIMIT_NPROC is reported as the 'pids' limit."""
    real_fork = os.fork

    def fork():
        try:
            return real_fork()
        except OSError as exc:
            if exc.errno == errno.EAGAIN:
                os.fork_refused = True  # type: ignore[attr-defined]
            raise

    os.fork = fork


class CallChild(AgentState):
    """The call child's methods.

    ``fork_child`` runs in the warm parent; everything from ``child_main`` on runs in the child,
    on a copy of the parent's state (the compiled code, limits, preloaded names).
    """

    def refresh_nproc_base(self) -> None:
        """Tasks the next call child's uid will have when it runs: those counted now, plus itself."""
        self.nproc_base = count_uid_processes(self.sandbox_uid()) + 1

    @staticmethod
    def sandbox_uid() -> int:
        return SANDBOX_UID if os.geteuid() == 0 else os.getuid()

    def fork_child(self) -> Child:
        """Warm parent: fork a single-use call child; returns it with the parent's ends of its pipes."""
        call_r, call_w = os.pipe()
        res_r, res_w = os.pipe()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        gc.freeze()  # keep the child's GC off the parent's objects: fewer copy-on-write faults per call
        pid = os.fork()
        if pid == 0:  # pragma: no cover - runs in the child
            code = 70
            try:
                os.setpgid(0, 0)
                code = self.child_main(call_r, res_w, out_w, err_w)
            except BaseException:
                code = 71
            finally:
                os._exit(code)
        for fd in (call_r, res_w, out_w, err_w):
            os.close(fd)
        try:  # noqa: SIM105 - also from the parent: no window where the child shares our group
            os.setpgid(pid, pid)
        except OSError:
            pass
        return Child(pid, call_w, res_r, out_r, err_r)

    # -- the child's side
    # Long: the forked child's hardening runs in a fixed order (death signal, no new privileges,
    # rlimits, uid drop, namespaces) before any tenant code; one function keeps that order visible.
    def child_main(self, call_r: int, res_w: int, out_w: int, err_w: int) -> int:  # pragma: no cover
        if self.libc is not None:
            try:
                self.libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
                self.libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)  # no setuid binary can raise privileges
            except Exception:
                pass
        os.dup2(out_w, 1)
        os.dup2(err_w, 2)
        os.dup2(self.devnull, 0)
        keep = sorted({0, 1, 2, call_r, res_w})
        lo = 3
        for fd in keep:
            if fd >= lo:
                os.closerange(lo, fd)
                lo = fd + 1
        os.closerange(lo, 1 << 16)
        sys.stdin = open(0, closefd=False)  # noqa: SIM115
        sys.stdout = open(1, "w", buffering=1, errors="replace", closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", buffering=1, errors="replace", closefd=False)  # noqa: SIM115
        sys.__stdout__, sys.__stderr__, sys.__stdin__ = sys.stdout, sys.stderr, sys.stdin  # type: ignore[misc]
        self.apply_limits()
        _watch_fork()

        child_pid = os.getpid()

        def finish(envelope: dict) -> int:
            if os.getpid() != child_pid:  # a process the evaluator forked: it has no say
                return 0
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            except Exception:
                pass
            try:
                data = json.dumps(envelope, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()
            except (ValueError, TypeError, RecursionError) as exc:
                data = json.dumps({"ok": False, "error": error_info("invalid_result", exc_text(exc))}).encode()
            if len(data) > int(self.limits["result_bytes"]) + ENVELOPE_SLACK:
                message = f"result_bytes limit of {self.limits['result_bytes']} bytes exceeded"
                data = json.dumps({"ok": False, "error": error_info("limit", message, "result_bytes")}).encode()
            try:
                write_all(res_w, data)
                os.close(res_w)
            except OSError:
                return 74
            return 0

        restrictions = None
        try:
            if self.restricted:
                deps = frozenset(n.split(".")[0] for n in self.preload)
                restrictions = Restrictions(SAFE_MODULES | frozenset(self.preload), deps)
                glb = restrictions.make_globals(sys.stdout)
            else:
                glb = {"__name__": "evaluator", "__builtins__": builtins}
        except BaseException as exc:
            return finish({"ok": False, "error": self._exc_error(exc, restrictions, "while loading: ")})

        data = bytearray()  # blocks until the call arrives: no evaluator code runs before it
        while True:
            chunk = os.read(call_r, 1 << 16)
            if not chunk:
                break
            data += chunk
            if len(data) > PROTOCOL_IN_MAX:
                return 75
        os.close(call_r)
        try:
            call = json.loads(data)
        except ValueError:
            return 75
        try:
            assert self.code_obj is not None
            exec(self.code_obj, glb)  # the module body, under the child's limits, inside the call
            fn = glb.get(self.entry)
            if not callable(fn):
                return finish({"ok": False, "error": error_info("load_error", f"'{self.entry}' is not defined")})
        except BaseException as exc:
            return finish({"ok": False, "error": self._exc_error(exc, restrictions, "while loading: ")})
        try:
            result = fn(call["prompt"], call["response"], call["context"])
        except BaseException as exc:
            return finish({"ok": False, "error": self._exc_error(exc, restrictions, "")})
        if restrictions is not None and restrictions.violations:
            return finish({"ok": False, "error": error_info("security", restrictions.violations[0])})
        return finish(self.check_result(result))

    @staticmethod
    def _exc_error(exc: BaseException, restrictions: Restrictions | None, prefix: str) -> dict:
        if isinstance(exc, MemoryError):
            return error_info("limit", "memory limit exceeded", "memory")
        if isinstance(exc, OSError) and exc.errno == errno.EFBIG:  # Python ignores SIGXFSZ: EFBIG instead
            return error_info("limit", "file size limit exceeded", "file_bytes")
        if getattr(os, "fork_refused", False) or (
            isinstance(exc, RuntimeError) and "can't start new thread" in str(exc)
        ):
            return error_info("limit", "process limit reached (fork or thread start refused)", "pids")
        if isinstance(exc, SandboxViolation) or (restrictions is not None and restrictions.violations):
            first = restrictions.violations[0] if restrictions and restrictions.violations else str(exc)
            return error_info("security", first)
        return error_info("code_error", prefix + exc_text(exc))

    def check_result(self, result: object) -> dict:
        if not isinstance(result, dict):
            message = f"evaluate returned {type(result).__name__}, not a dict"
            return {"ok": False, "error": error_info("invalid_result", message)}
        if not depth_ok(result, int(self.limits["result_max_depth"])):
            return {"ok": False, "error": error_info("invalid_result", "result nested too deeply")}
        try:
            text = json.dumps(result, allow_nan=False, ensure_ascii=False, separators=(",", ":"))
        except (ValueError, TypeError, RecursionError) as exc:
            return {"ok": False, "error": error_info("invalid_result", f"result is not finite JSON: {exc_text(exc)}")}
        if len(text.encode("utf-8", "replace")) > int(self.limits["result_bytes"]):
            return {
                "ok": False,
                "error": error_info(
                    "limit", f"result_bytes limit of {self.limits['result_bytes']} bytes exceeded", "result_bytes"
                ),
            }
        return {"ok": True, "result": json.loads(text)}

    def apply_limits(self) -> None:  # pragma: no cover - runs in the child
        lim = self.limits
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if os.geteuid() == 0:
            os.setgroups([])
            os.setgid(SANDBOX_UID)
            os.setuid(SANDBOX_UID)
        nproc = self.nproc_base + int(lim["pids"])
        for rlim, value in (
            *([(resource.RLIMIT_NPROC, nproc)] if self.rlimit_nproc else []),
            (resource.RLIMIT_NOFILE, int(lim["nofile"])),
            (resource.RLIMIT_FSIZE, int(lim["file_bytes"])),
            (resource.RLIMIT_CPU, math.ceil(lim["cpu_s"])),
        ):
            _soft, hard = resource.getrlimit(rlim)
            cap = value if hard == resource.RLIM_INFINITY else min(value, hard)
            room = hard == resource.RLIM_INFINITY or hard > cap
            hard_cap = cap + 1 if rlim == resource.RLIMIT_CPU and room else cap  # SIGXCPU first, then SIGKILL
            resource.setrlimit(rlim, (cap, hard_cap))
        # Address space: what the warm parent already maps (shared, copy-on-write) + the call's budget.
        budget = (vm_size() or self.base_vm) + int(lim["memory_bytes"])
        resource.setrlimit(resource.RLIMIT_AS, (budget, budget))
