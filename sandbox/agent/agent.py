"""CrossAudit sandbox agent: runs one evaluator's code, one call at a time, in throwaway children.

Stdlib only, Linux only, started as ``python3 -I agent.py`` inside a sandbox (a container for
the Docker backend, a subprocess for the process backend). It speaks the JSON-lines protocol
of ``docs/agent-protocol.md`` on its stdin/stdout and nothing else:

* the original stdout is moved to a private fd used only for protocol frames, and fds 0/1 are
  pointed at /dev/null, so nothing the user's code prints can ever become a frame;
* the warm parent compiles the code and imports the declared modules once, then forks a
  single-use child *ahead of demand*; the child applies rlimits (and drops root), runs the
  module body, and waits for its call, so a call costs a pipe round trip, not a fork;
* the child's stdout/stderr go to capped capture pipes, its result to a private pipe; the
  parent kills the child's process group after every call and answers with a typed frame.

The wall-clock deadline is enforced from outside (the orchestrator kills the process group or
the container); the agent's own backstop only bounds its loops.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import ctypes
import errno
import gc
import importlib
import json
import math
import operator
import os
import re
import resource
import select
import signal
import sys
import time
import types
import weakref

PROTOCOL_IN_MAX = 16 * 1024 * 1024  # longest inbound frame (the orchestrator is trusted; this bounds memory)
MESSAGE_MAX = 2000  # error messages are truncated to this many characters
ENVELOPE_SLACK = 64 * 1024  # room for the child's envelope around the result document
BACKSTOP_SLACK_S = 2.0  # the agent's own bound on a call, beyond limits.timeout_s
SANDBOX_UID = 65534  # "nobody": the call child drops to it when the agent runs as root
CLONE_NEWNET = 0x40000000
PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
PR_SET_NO_NEW_PRIVS = 38
REAP_ROUNDS = 20  # rounds of "kill every stray descendant" after a call

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
}

# Modules restricted code may import (besides the declared dependencies): pure computation.
SAFE_MODULES = frozenset(
    [
        "re",
        "json",
        "math",
        "string",
        "typing",
        "collections",
        "collections.abc",
        "statistics",
        "datetime",
        "itertools",
        "functools",
        "unicodedata",
        "dataclasses",
        "enum",
        "decimal",
        "fractions",
        "random",
        "hashlib",
        "textwrap",
        "difflib",
        "html",
        "operator",
        "copy",
        "heapq",
        "bisect",
    ]
)
# Public names of whitelisted modules that reach arbitrary attributes or evaluate strings.
DENIED_MODULE_ATTRS = frozenset(
    {
        ("string", "Formatter"),  # field names such as {0.__class__} walk attributes
        ("operator", "attrgetter"),  # attrgetter("__globals__") bypasses the getattr guard
        ("operator", "methodcaller"),
        ("typing", "get_type_hints"),  # eval()s string annotations outside the restricted compiler
        ("typing", "ForwardRef"),
        ("functools", "singledispatch"),  # register() calls get_type_hints
        ("functools", "singledispatchmethod"),
        ("json", "scanner"),
    }
)
BLOCKED_ATTRS = frozenset(
    {
        "mro", "format", "format_map", "gi_frame", "gi_code", "gi_yieldfrom", "cr_frame", "cr_code",
        "cr_await", "cr_origin", "ag_frame", "ag_code", "ag_await", "f_back", "f_globals", "f_locals",
        "f_builtins", "f_code", "f_trace", "f_generator", "tb_frame", "tb_next", "co_code", "func_globals",
        "func_code", "im_func", "im_self",
    }
)  # fmt: skip
WARM_EXTRA = frozenset({"_strptime"})  # imported lazily by datetime.strptime; preloaded with the whitelist
DENIED_BUILTINS = ("open", "eval", "exec", "compile", "globals", "locals", "vars", "dir", "input", "help",
                   "memoryview", "exit", "quit", "object", "super", "delattr", "breakpoint")  # fmt: skip
FORBIDDEN_VALUE_TYPES = (types.ModuleType, types.FrameType, types.CodeType, types.TracebackType)
IMPORT_NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_]*(\.[A-Za-z][A-Za-z0-9_]*)*$")


# --------------------------------------------------------------------------- small helpers


def _msg(text: object) -> str:
    s = str(text)
    return s if len(s) <= MESSAGE_MAX else s[: MESSAGE_MAX - 3] + "..."


def _exc_text(exc: BaseException) -> str:
    try:
        return _msg(f"{type(exc).__name__}: {exc}")
    except Exception:  # a hostile __str__
        return _msg(type(exc).__name__)


def _error(etype: str, message: str, limit: str | None = None) -> dict:
    return {"type": etype, "message": _msg(message), "limit": limit}


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _depth_ok(obj: object, max_depth: int) -> bool:
    """Iterative nesting check (json.dumps would hit RecursionError long before telling us)."""
    stack = [(obj, 1)]
    seen = 0
    while stack:
        cur, depth = stack.pop()
        seen += 1
        if isinstance(cur, dict):
            if depth > max_depth:
                return False
            stack.extend((v, depth + 1) for v in cur.values())
        elif isinstance(cur, (list, tuple)):
            if depth > max_depth:
                return False
            stack.extend((v, depth + 1) for v in cur)
    return True


def _reject_constant(name: str) -> None:
    raise ValueError(f"non-finite number {name}")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # "1e999" parses to inf
        raise ValueError(f"non-finite number {text}")
    return value


def loads_strict(data: bytes | str):
    """json.loads that refuses NaN/Infinity literals and overflowing floats."""
    return json.loads(data, parse_constant=_reject_constant, parse_float=_finite_float)


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


def _libc():
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


def _count_uid_processes(uid: int, cap: int = 100_000) -> int:
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


def _world_readable(path: str) -> bool:
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


def _vm_size() -> int:
    try:
        with open("/proc/self/status", "rb") as fh:
            for line in fh:
                if line.startswith(b"VmSize:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0


def _children_of(pid: int) -> list[int]:
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


# --------------------------------------------------------------------------- restricted mode


class SandboxViolation(Exception):
    """Restricted code touched something forbidden. Recorded even if the code catches it."""


class Restrictions:
    """Builds the globals restricted code runs with: guarded builtins, imports and attribute access."""

    def __init__(self, allowed_imports: frozenset[str], dependency_roots: frozenset[str]) -> None:
        self.allowed_imports = allowed_imports
        self.dependency_roots = dependency_roots
        self.violations: list[str] = []
        self._proxies: dict[str, object] = {}
        from RestrictedPython.Guards import safer_getattr

        self._safer_getattr = safer_getattr

    def violation(self, message: str) -> SandboxViolation:
        self.violations.append(message)
        return SandboxViolation(message)

    # -- attribute / item access
    def check_value(self, value, what: str):
        if isinstance(value, FORBIDDEN_VALUE_TYPES):
            raise self.violation(f"access to {what} is not allowed (module/frame/code object)")
        return value

    def getattr(self, obj, name, *default):
        safer_getattr = self._safer_getattr
        if type(name) is not str:
            raise TypeError("attribute name must be a str")
        if name.startswith("_") or (name in BLOCKED_ATTRS and (name not in ("format", "format_map") or _is_str(obj))):
            raise self.violation(f"attribute {name!r} is not allowed")
        if isinstance(obj, FORBIDDEN_VALUE_TYPES):
            raise self.violation("attribute access on a module/frame/code object is not allowed")
        try:
            value = safer_getattr(obj, name, *default) if default else _safer_getattr_raise(safer_getattr, obj, name)
        except NotImplementedError as exc:
            raise self.violation(str(exc)) from None
        return self.check_value(value, f"attribute {name!r}")

    def hasattr(self, obj, name) -> bool:
        try:
            self.getattr(obj, name)
        except AttributeError:
            return False
        return True

    def getitem(self, obj, key):
        if isinstance(obj, FORBIDDEN_VALUE_TYPES):
            raise self.violation("item access on a module/frame/code object is not allowed")
        return self.check_value(obj[key], "item")

    def denied(self, name: str):
        def refuse(*args, **kwargs):
            raise self.violation(f"{name}() is not available in the sandbox")

        return refuse

    def type1(self, *args):
        if len(args) != 1:
            raise self.violation("type() with 3 arguments (class creation) is not allowed")
        t = type(args[0])
        if issubclass(t, type):
            raise self.violation("type() of a class (metaclass access) is not allowed")
        return t

    # -- imports
    def module_attr(self, mod: types.ModuleType, name: str):
        if type(name) is not str or name.startswith("_"):
            raise self.violation(f"module attribute {name!r} is not allowed")
        if (mod.__name__, name) in DENIED_MODULE_ATTRS:
            raise self.violation(f"{mod.__name__}.{name} is not allowed")
        value = getattr(mod, name)
        if isinstance(value, FORBIDDEN_VALUE_TYPES):
            raise self.violation(f"{mod.__name__}.{name} is a module; import it explicitly if it is allowed")
        if value is operator.attrgetter or value is operator.methodcaller:
            raise self.violation(f"{mod.__name__}.{name} is not allowed")
        return value

    def proxy(self, mod: types.ModuleType):
        got = self._proxies.get(mod.__name__)
        if got is not None:
            return got
        restrictions = self

        class RestrictedModule:
            """Read-only view of a module: no '_' names, no module-valued attributes."""

            __slots__ = ()

            def __getattr__(self, name):
                return restrictions.module_attr(mod, name)

            def __setattr__(self, name, value):
                raise restrictions.violation("modules are read-only")

            def __delattr__(self, name):
                raise restrictions.violation("modules are read-only")

            def __repr__(self):
                return f"<restricted module {mod.__name__!r}>"

        got = RestrictedModule()
        self._proxies[mod.__name__] = got
        return got

    def allowed(self, name: str) -> bool:
        return name in self.allowed_imports or name.split(".")[0] in self.dependency_roots

    def import_(self, name, globals=None, locals=None, fromlist=(), level=0):
        if type(name) is not str or level != 0:
            raise self.violation(f"import of {name!r} is not allowed")
        if name.startswith("_") and name in sys.modules and not fromlist:
            # Restricted source cannot spell a '_' import (the compiler refuses it), so this is a
            # C library function importing lazily under the caller's builtins (datetime -> _strptime).
            return sys.modules[name]
        if not IMPORT_NAME_RE.match(name):
            raise self.violation(f"import of {name!r} is not allowed")
        if not self.allowed(name):
            raise self.violation(f"import of {name!r} is not allowed")
        module = importlib.import_module(name)
        if fromlist:
            for item in fromlist:
                if type(item) is not str or item.startswith("_") or item == "*":
                    raise self.violation(f"from {name} import {item!r} is not allowed")
            return self.proxy(module)
        # "import a.b" binds "a": hand out the root, whose module attributes stay refused.
        root = importlib.import_module(name.split(".")[0])
        return self.proxy(root)

    # -- globals
    def make_globals(self, print_target) -> dict:
        from RestrictedPython.Guards import (
            guarded_iter_unpack_sequence,
            guarded_unpack_sequence,
            safe_builtins,
        )

        b = dict(safe_builtins)
        for name in (
            "all",
            "any",
            "enumerate",
            "filter",
            "frozenset",
            "iter",
            "list",
            "map",
            "max",
            "min",
            "next",
            "reversed",
            "set",
            "sorted",
            "sum",
            "tuple",
            "zip",
            "dict",
            "bytes",
            "bytearray",
            "classmethod",
            "staticmethod",
            "property",
        ):
            b[name] = getattr(builtins, name)
        b["__import__"] = self.import_
        b["getattr"] = self.getattr
        b["hasattr"] = self.hasattr
        user_classes: weakref.WeakSet[type] = weakref.WeakSet()
        real_build_class = builtins.__build_class__

        def build_class(func, name, *bases, **kwargs):
            """Record classes the evaluator defines: their instances may get attributes written."""
            cls = real_build_class(func, name, *bases, **kwargs)
            user_classes.add(cls)
            return cls

        import collections

        writable = (dict, list, bytearray, collections.deque)

        def write_guard(ob):
            """Writes go to containers and to the evaluator's own classes/instances, nothing else.

            Every call runs in a fresh fork, so even a write to a shared container cannot outlive it.
            """
            if isinstance(ob, writable) or ob in user_classes or type(ob) in user_classes:
                return ob
            raise self.violation(f"writing to a {type(ob).__name__!r} object is not allowed")

        def setattr_(ob, name, value):
            if type(name) is not str or name.startswith("_"):
                raise self.violation(f"setting attribute {name!r} is not allowed")
            setattr(write_guard(ob), name, value)

        b["__build_class__"] = build_class
        b["setattr"] = setattr_
        b["type"] = self.type1
        b.pop("_getattr_", None)
        for name in DENIED_BUILTINS:  # present but refusing, so a misuse is reported as a violation
            b[name] = self.denied(name)

        def inplacevar(op, x, y):
            fn = _INPLACE.get(op)
            if fn is None:
                raise self.violation(f"in-place operator {op!r} is not allowed")
            return fn(x, y)

        class Printer:
            """RestrictedPython's print target: writes through to the captured stdout."""

            def __init__(self, _getattr_=None):
                self._getattr_ = _getattr_

            def write(self, text):
                print_target.write(str(text))

            def __call__(self):
                return ""

            def _call_print(self, *objects, **kwargs):
                kwargs["file"] = self
                print(*objects, **kwargs)

        return {
            "__builtins__": b,
            "__name__": "evaluator",
            "__metaclass__": type,
            "_getattr_": self.getattr,
            "_getitem_": self.getitem,
            "_getiter_": iter,
            "_iter_unpack_sequence_": guarded_iter_unpack_sequence,
            "_unpack_sequence_": guarded_unpack_sequence,
            "_write_": write_guard,
            "_inplacevar_": inplacevar,
            "_apply_": lambda f, *a, **kw: f(*a, **kw),
            "_print_": Printer,
        }


def _is_str(obj) -> bool:
    import string

    return isinstance(obj, (str, string.Formatter)) or (
        isinstance(obj, type) and issubclass(obj, (str, string.Formatter))
    )


def _safer_getattr_raise(safer_getattr, obj, name):
    marker = object()
    value = safer_getattr(obj, name, marker)
    if value is marker:
        raise AttributeError(f"{type(obj).__name__!r} object has no attribute {name!r}")
    return value


_INPLACE = {
    "+=": operator.iadd, "-=": operator.isub, "*=": operator.imul, "/=": operator.itruediv,
    "//=": operator.ifloordiv, "%=": operator.imod, "**=": operator.ipow, "<<=": operator.ilshift,
    ">>=": operator.irshift, "&=": operator.iand, "|=": operator.ior, "^=": operator.ixor,
    "@=": operator.imatmul,
}  # fmt: skip


# --------------------------------------------------------------------------- the agent


def check_entrypoint(tree: ast.Module, entry: str) -> str | None:
    """Return a problem description unless ``entry`` is a top-level def callable with 3 positionals."""
    found = None
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == entry:
            found = node
    if found is None:
        return f"no top-level 'def {entry}(prompt, response, context)'"
    if isinstance(found, ast.AsyncFunctionDef):
        return f"'{entry}' must be a plain def, not async"
    a = found.args
    positional = len(a.posonlyargs) + len(a.args)
    required = positional - len(a.defaults)
    if (positional < 3 and a.vararg is None) or required > 3:
        return f"'{entry}' must accept exactly (prompt, response, context)"
    if any(d is None for d in a.kw_defaults):
        return f"'{entry}' has keyword-only parameters without defaults"
    return None


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


class Agent:
    def __init__(self) -> None:
        # Protocol fds: private duplicates; fds 0 and 1 become /dev/null for everything else.
        self.proto_in = os.dup(0)
        self.proto_out = os.dup(1)
        self.devnull = os.open(os.devnull, os.O_RDWR)
        os.dup2(self.devnull, 0)
        os.dup2(self.devnull, 1)
        sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115 - a stray print goes to /dev/null
        self.reader = os.fdopen(self.proto_in, "rb", buffering=1 << 16)
        self.loaded = False
        self.code_obj: types.CodeType | None = None
        self.entry = "evaluate"
        self.restricted = False
        self.limits = dict(DEFAULT_LIMITS)
        self.preload: list[str] = []
        self.child: Child | None = None
        self.isolation: dict = {"netns": False, "subreaper": False, "uid_drop": False, "restricted": False}
        self.libc = _libc()
        self.base_vm = 0
        self.reap_later: list[int] = []
        self.nproc_base = 0  # tasks the call child's uid already has (refreshed off the request path)
        self.rlimit_nproc = True

    # -- frames
    def send(self, frame: dict) -> None:
        data = json.dumps(frame, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8", "replace")
        _write_all(self.proto_out, data + b"\n")

    def serve(self) -> int:
        while True:
            line = self.reader.readline(PROTOCOL_IN_MAX + 1)
            if not line:
                self.kill_child()
                return 0
            if len(line) > PROTOCOL_IN_MAX or not line.endswith(b"\n"):
                self.send({"op": "error", "error": _error("protocol", "frame too long")})
                self.kill_child()
                return 2
            try:
                frame = json.loads(line)
                if not isinstance(frame, dict):
                    raise ValueError("frame is not an object")
            except (ValueError, RecursionError) as exc:
                self.send({"op": "error", "error": _error("protocol", f"bad frame: {exc}")})
                continue
            op = frame.get("op")
            if op == "load":
                self.handle_load(frame)
            elif op == "call":
                self.handle_call(frame)
            else:
                self.send({"op": "error", "error": _error("protocol", f"unknown op {op!r}")})

    # -- load
    def handle_load(self, frame: dict) -> None:
        def fail(etype: str, message: str) -> None:
            self.send({"op": "loaded", "ok": False, "error": _error(etype, message)})

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
            tree = ast.parse(code, filename="<evaluator>")
        except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
            return fail("load_error", f"code does not compile: {_exc_text(exc)}")
        problem = check_entrypoint(tree, entry)
        if problem:
            return fail("load_error", problem)
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
            result = compile_restricted_exec(code, filename="<evaluator>")
            if result.errors or result.code is None:
                return fail("security", "restricted: " + "; ".join(result.errors))
            self.code_obj = result.code
        else:
            self.code_obj = compile(code, "<evaluator>", "exec")
        warnings = []
        preload = frame.get("preload") or []
        for name in preload if isinstance(preload, list) else []:
            if not isinstance(name, str) or not IMPORT_NAME_RE.match(name):
                warnings.append(f"ignored preload name {name!r}")
                continue
            self.preload.append(name)  # declared: importable by restricted code even if this import fails
            try:
                importlib.import_module(name)
            except BaseException as exc:  # a dependency failing to import is reported, not fatal
                warnings.append(f"preload {name}: {_exc_text(exc)}")
                if not isinstance(exc, Exception):
                    raise
        if self.restricted:
            for name in sorted(SAFE_MODULES | WARM_EXTRA):  # warm the whitelist: calls never pay for imports
                try:
                    importlib.import_module(name)
                except Exception as exc:
                    warnings.append(f"preload {name}: {_exc_text(exc)}")
        self.entry = entry
        self.isolate()
        if self.isolation["uid_drop"] and not _world_readable(os.path.dirname(os.__file__)):
            warnings.append(
                "the Python installation is not readable by the sandbox uid: "
                "only modules preloaded by the agent can be imported during calls"
            )
        self.loaded = True
        self.base_vm = _vm_size()
        self.nproc_base = _count_uid_processes(self.sandbox_uid())
        self.send({"op": "loaded", "ok": True, "pid": os.getpid(), "warnings": warnings, "isolation": self.isolation})
        self.spawn_child()

    @staticmethod
    def sandbox_uid() -> int:
        return SANDBOX_UID if os.geteuid() == 0 else os.getuid()

    def isolate(self) -> None:
        """Best-effort: no network namespace, adopt orphans. Reported, never required."""
        self.isolation["restricted"] = self.restricted
        if self.libc is not None:
            with contextlib.suppress(Exception):
                self.isolation["netns"] = self.libc.unshare(CLONE_NEWNET) == 0
            with contextlib.suppress(Exception):
                self.isolation["subreaper"] = self.libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
        self.isolation["uid_drop"] = os.geteuid() == 0

    # -- children
    def spawn_child(self) -> None:
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
        self.child = Child(pid, call_w, res_r, out_r, err_r)

    def kill_child(self) -> None:
        child, self.child = self.child, None
        if child is None:
            return
        self._kill_group(child.pid)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(child.pid, 0)
        child.close_fds()

    @staticmethod
    def _kill_group(pgid: int) -> None:
        for target in (lambda: os.killpg(pgid, signal.SIGKILL), lambda: os.kill(pgid, signal.SIGKILL)):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                target()

    def reap_strays(self) -> None:
        """Kill every descendant left after a call (orphans are re-parented to us as subreaper)."""
        keep = self.child.pid if self.child else None
        pending, self.reap_later = self.reap_later, []
        for pid in pending:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
        for _ in range(REAP_ROUNDS):
            strays = [p for p in _children_of(os.getpid()) if p != keep]
            if not strays:
                break
            for pid in strays:
                self._kill_group(pid)
            for pid in strays:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, 0)
        while True:  # zombies of already-killed strays
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break

    # -- call
    def handle_call(self, frame: dict) -> None:
        call_id = frame.get("id")
        if not isinstance(call_id, str) or len(call_id) > 200:
            self.send({"op": "error", "error": _error("protocol", "call needs a string 'id'")})
            return
        if not self.loaded:
            self.send({"op": "result", "id": call_id, "ok": False, "error": _error("load_error", "not loaded"),
                       "stdout": "", "stderr": "", "truncated": False, "wall_ms": 0.0})  # fmt: skip
            return
        payload = {k: frame.get(k) for k in ("prompt", "response", "context")}
        if not isinstance(payload["prompt"], str) or not isinstance(payload["response"], str):
            self.send({"op": "error", "error": _error("protocol", "call needs string 'prompt' and 'response'")})
            return
        if not isinstance(payload["context"], dict):
            payload["context"] = {}
        if self.child is None:
            self.spawn_child()
        started = time.monotonic()
        try:
            answer = self.run_child(json.dumps(payload, ensure_ascii=False).encode("utf-8", "replace"))
        except Exception as exc:  # an agent bug must not take the agent down: report, kill, go on
            self.kill_child()
            answer = {"ok": False, "error": _error("crashed", f"agent error: {_exc_text(exc)}"),
                      "stdout": "", "stderr": "", "truncated": False}  # fmt: skip
        answer.update({"op": "result", "id": call_id, "wall_ms": round((time.monotonic() - started) * 1000, 3)})
        self.send(answer)
        self.spawn_child()  # ahead of demand, off the request path
        self.reap_strays()  # then clean up (the scan keeps the new child)
        self.nproc_base = _count_uid_processes(self.sandbox_uid())  # for the child after next

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
                    try:
                        pid, wstatus = os.waitpid(child.pid, os.WNOHANG)
                        if pid:
                            exited, child.status = True, wstatus
                    except ChildProcessError:
                        exited = True
                if exited:
                    break  # a grandchild may still hold the pipes open: drain below, do not wait on it
            else:
                over = "timeout"
            # Done (or over a cap): kill the whole group before answering; drain what is buffered.
            self._kill_group(child.pid)
            for fd in list(open_fds):
                if self._drain(fd, bufs[fd], caps[fd]) and not over:
                    over = names[fd]
            status: int | None = None
            envelope = None if over else self._parse_envelope(bytes(res_buf))
            if envelope is not None and envelope.get("ok", True) is not None:
                self.reap_later.append(child.pid)  # reaping a big child costs ms: after the answer
            else:
                status = self._wait(child)
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
            return {**base, "ok": False, "error": _error("limit", "call exceeded its time limit", "timeout")}
        if over:
            cap = out_cap if over == "output_bytes" else int(lim["result_bytes"])
            return {**base, "ok": False, "error": _error("limit", f"{over} limit of {cap} bytes exceeded", over)}
        if envelope is not None:
            return {**base, **envelope, "ok": bool(envelope["ok"])}
        return {**base, "ok": False, "error": self._death_error(status)}

    def _parse_envelope(self, data: bytes) -> dict | None:
        if not data:
            return None
        try:
            env = loads_strict(data)
        except (ValueError, RecursionError):
            return {"ok": None, "error": _error("invalid_result", "result is not valid JSON")}
        if not isinstance(env, dict) or not isinstance(env.get("ok"), bool):
            return {"ok": False, "error": _error("invalid_result", "malformed result envelope")}
        if env["ok"]:
            if not _depth_ok(env.get("result"), int(self.limits["result_max_depth"])):
                return {"ok": False, "error": _error("invalid_result", "result nested too deeply")}
            return {"ok": True, "result": env.get("result")}
        err = env.get("error")
        if not isinstance(err, dict) or not isinstance(err.get("type"), str):
            return {"ok": False, "error": _error("crashed", "malformed error envelope")}
        limit = err.get("limit")
        return {"ok": False, "error": _error(err["type"], str(err.get("message", "")),
                                             limit if isinstance(limit, str) else None)}  # fmt: skip

    @staticmethod
    def _wait(child: Child) -> int | None:
        try:
            return os.waitpid(child.pid, 0)[1]
        except ChildProcessError:
            return child.status

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
                return _error("limit", "CPU time limit exceeded", "cpu")
            if sig == signal.SIGXFSZ:
                return _error("limit", "file size limit exceeded", "file_bytes")
            try:
                name = signal.Signals(sig).name
            except ValueError:
                name = str(sig)
            return _error("crashed", f"evaluator process killed by {name} without a result")
        if status is not None and os.WIFEXITED(status):
            return _error("crashed", f"evaluator process exited with status {os.WEXITSTATUS(status)} without a result")
        return _error("crashed", "evaluator process ended without a result")

    # -- the child's side
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
                data = json.dumps({"ok": False, "error": _error("invalid_result", _exc_text(exc))}).encode()
            if len(data) > int(self.limits["result_bytes"]) + ENVELOPE_SLACK:
                message = f"result_bytes limit of {self.limits['result_bytes']} bytes exceeded"
                data = json.dumps({"ok": False, "error": _error("limit", message, "result_bytes")}).encode()
            try:
                _write_all(res_w, data)
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
            assert self.code_obj is not None
            exec(self.code_obj, glb)  # the module body runs here, under the child's limits
            fn = glb.get(self.entry)
            if not callable(fn):
                return finish({"ok": False, "error": _error("load_error", f"'{self.entry}' is not defined")})
        except BaseException as exc:
            return finish({"ok": False, "error": self._exc_error(exc, restrictions, "while loading: ")})

        data = bytearray()
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
            result = fn(call["prompt"], call["response"], call["context"])
        except BaseException as exc:
            return finish({"ok": False, "error": self._exc_error(exc, restrictions, "")})
        if restrictions is not None and restrictions.violations:
            return finish({"ok": False, "error": _error("security", restrictions.violations[0])})
        return finish(self.check_result(result))

    @staticmethod
    def _exc_error(exc: BaseException, restrictions: Restrictions | None, prefix: str) -> dict:
        if isinstance(exc, MemoryError):
            return _error("limit", "memory limit exceeded", "memory")
        if isinstance(exc, OSError) and exc.errno == errno.EFBIG:  # Python ignores SIGXFSZ: EFBIG instead
            return _error("limit", "file size limit exceeded", "file_bytes")
        if getattr(os, "fork_refused", False) or (
            isinstance(exc, RuntimeError) and "can't start new thread" in str(exc)
        ):
            return _error("limit", "process limit reached (fork or thread start refused)", "pids")
        if isinstance(exc, SandboxViolation) or (restrictions is not None and restrictions.violations):
            first = restrictions.violations[0] if restrictions and restrictions.violations else str(exc)
            return _error("security", first)
        return _error("code_error", prefix + _exc_text(exc))

    def check_result(self, result: object) -> dict:
        if not isinstance(result, dict):
            message = f"evaluate returned {type(result).__name__}, not a dict"
            return {"ok": False, "error": _error("invalid_result", message)}
        if not _depth_ok(result, int(self.limits["result_max_depth"])):
            return {"ok": False, "error": _error("invalid_result", "result nested too deeply")}
        try:
            text = json.dumps(result, allow_nan=False, ensure_ascii=False, separators=(",", ":"))
        except (ValueError, TypeError, RecursionError) as exc:
            return {"ok": False, "error": _error("invalid_result", f"result is not finite JSON: {_exc_text(exc)}")}
        if len(text.encode("utf-8", "replace")) > int(self.limits["result_bytes"]):
            return {
                "ok": False,
                "error": _error(
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
        budget = (_vm_size() or self.base_vm) + int(lim["memory_bytes"])
        resource.setrlimit(resource.RLIMIT_AS, (budget, budget))


def main() -> int:
    if sys.platform != "linux":
        sys.stderr.write("the CrossAudit agent needs Linux\n")
        return 2
    try:
        return Agent().serve()
    except (BrokenPipeError, KeyboardInterrupt):  # the orchestrator went away
        return 1


if __name__ == "__main__":
    sys.exit(main())
