"""The load frame: limits, code compilation (plain or restricted), isolation, preloading, first reset.

The entry-point check lives on the host (``crossaudit.kernel.codecheck.check_code``), which is
authoritative: the upload and policy paths run it before code is stored or deployed, and both
backends' ``prepare`` runs it (the Docker backend also before it starts a pool at call time). Why
not here too: the agent cannot import the kernel (it runs inside the sandbox on the standard
library alone), the kernel imports nothing of the sandbox, and a second copy of the signature
rules would drift. So the agent only refuses a load whose code has no top-level plain
``def <entrypoint>`` at all (a cheap guard for code that skipped the host check, e.g. a process
backend ``run`` without ``prepare``) and reports an entry point that turns out not to be callable
when the module body runs in the call child (``'evaluate' is not defined``); on such a path a
wrong signature surfaces as the call's ``TypeError`` (``code_error``).
"""

from __future__ import annotations

import ast
import contextlib
import math
import os

from .cleanup import Cleanup, reset_spec
from .framing import Framing, error_info, exc_text
from .osutil import CLONE_NEWNET, PR_SET_CHILD_SUBREAPER, thread_count, vm_size, world_readable
from .preload import preload_modules
from .restrictions import EVALUATOR_FILENAME
from .state import DEFAULT_LIMITS


def missing_entrypoint(tree: ast.Module, entry: str) -> str | None:
    """A problem description when no top-level ``def entry`` exists; the signature is the host's to check."""
    if any(isinstance(node, ast.FunctionDef) and node.name == entry for node in tree.body):
        return None
    return f"no top-level 'def {entry}(prompt, response, context)'"


class Loader(Framing, Cleanup):
    """The load frame's handling; runs in the warm parent, before the I/O process exists."""

    def handle_load(self, frame: dict) -> None:
        def fail(etype: str, message: str) -> None:
            self.send({"op": "loaded", "ok": False, "error": error_info(etype, message)})

        if self.loaded:
            return fail("load_error", "agent already loaded")
        code = frame.get("code")
        entry = frame.get("entrypoint", "evaluate")
        if not isinstance(code, str) or not isinstance(entry, str) or not entry.isidentifier():
            return fail("load_error", "load frame needs 'code' (str) and an identifier 'entrypoint'")
        limits = frame.get("limits") or {}
        if isinstance(limits, dict):
            for key, default in DEFAULT_LIMITS.items():
                value = limits.get(key, default)
                numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
                if numeric and value > 0 and math.isfinite(value):
                    self.limits[key] = type(default)(value)
        try:
            tree = ast.parse(code, filename=EVALUATOR_FILENAME)
        except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
            return fail("load_error", f"code does not compile: {exc_text(exc)}")
        problem = missing_entrypoint(tree, entry)
        if problem:
            return fail("load_error", problem)
        if frame.get("reset") is not None:
            reset = reset_spec(frame["reset"])
            if isinstance(reset, str):
                return fail("load_error", reset)
            self.reset_paths, self.reset_ipc, self.reset_idle = reset
            self.report_reset = True
        self.restricted = bool(frame.get("restricted", False))
        # RLIMIT_NPROC counts every task of the uid kernel-wide; inside a PID namespace (a container
        # sharing its uid with others) the visible count is too low, so a backend that has a cgroup
        # pids limit may turn it off.
        self.rlimit_nproc = frame.get("rlimit_nproc", True) is not False
        if self.restricted:
            try:
                from RestrictedPython import compile_restricted_exec
            except ImportError:
                return fail("load_error", "restricted mode needs RestrictedPython, which is not installed")
            result = compile_restricted_exec(code, filename=EVALUATOR_FILENAME)
            if result.errors or result.code is None:
                return fail("security", "restricted: " + "; ".join(result.errors))
            self.code_obj = result.code
        else:
            self.code_obj = compile(code, EVALUATOR_FILENAME, "exec")
        warnings: list[str] = []
        self.entry = entry
        self.isolate()  # before the imports: no network for them, and their orphans come back to us
        preload_modules(frame.get("preload") or [], self.preload, warnings, restricted=self.restricted)
        threads = thread_count()
        if threads > 1:
            return fail(
                "load_error",
                f"importing the declared dependencies left {threads - 1} extra thread(s) running in the "
                "sandbox's warm process, which forks every call and must stay single-threaded "
                "(configure those libraries for one thread, or import them inside evaluate())",
            )
        try:
            self.reset()  # processes the imports started, files they wrote: none reaches a call
        except Exception as exc:
            return fail("load_error", f"could not clean up after importing the declared dependencies: {exc_text(exc)}")
        if self.isolation["uid_drop"] and not world_readable(os.path.dirname(os.__file__)):
            warnings.append(
                "the Python installation is not readable by the sandbox uid: "
                "only modules preloaded by the agent can be imported during calls"
            )
        self.loaded = True
        self.base_vm = vm_size()
        self.send({"op": "loaded", "ok": True, "pid": os.getpid(), "warnings": warnings, "isolation": self.isolation})

    def isolate(self) -> None:
        """Best-effort: no network namespace, adopt orphans. Reported, never required."""
        self.isolation["restricted"] = self.restricted
        if self.libc is not None:
            with contextlib.suppress(Exception):
                self.isolation["netns"] = self.libc.unshare(CLONE_NEWNET) == 0
            with contextlib.suppress(Exception):
                self.isolation["subreaper"] = self.libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
        self.isolation["uid_drop"] = os.geteuid() == 0
