"""CrossAudit sandbox agent: runs one evaluator's code, one call at a time, in throwaway children.

Stdlib only, Linux only, started as ``python3 -I agent.py`` inside a sandbox (a container for
the Docker backend, a subprocess for the process backend). It speaks the JSON-lines protocol
of ``docs/agent-protocol.md`` on its stdin/stdout and nothing else:

* the original stdout is moved to a private fd used only for protocol frames, and fds 0/1 are
  pointed at /dev/null, so nothing the user's code prints can ever become a frame;
* the warm parent compiles the code and imports the declared modules once, then forks a
  single-use child per call *ahead of demand*; the child applies rlimits (and drops root) and
  waits for its call, so a call costs a pipe round trip, not a fork. No evaluator code runs
  while no call is in flight: the module body runs in the child once its call has arrived;
* the warm parent never reads a call: a long-lived *I/O process*, forked from it right after
  the load, speaks the protocol and drives each child through pipes the parent hands over, so
  every child is forked from memory that never held a caller's prompt, response or result;
* the child's stdout/stderr go to capped capture pipes, its result to a private pipe; the I/O
  process answers with a typed frame, then the parent *resets* the sandbox before forking the
  next child: every other process killed (all of the container's PID namespace when the agent
  is its PID 1), the scratch directories emptied, SysV IPC objects removed (``reset`` in the
  load frame). Nothing one call leaves behind is seen by the next.

The wall-clock deadline is enforced from outside (the orchestrator kills the process group or
the container); the agent's own backstop only bounds its loops.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import ctypes
import errno
import functools
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
import socket
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
PR_SET_NAME = 15
IO_PROCESS_NAME = b"crossaudit-io"  # the I/O process's name in ps and /proc/<pid>/comm
PR_SET_CHILD_SUBREAPER = 36
PR_SET_NO_NEW_PRIVS = 38
REAP_ROUNDS = 20  # rounds of "kill every stray descendant" after a call
IO_EOF, IO_FATAL, IO_BROKEN, IO_CRASHED = 10, 11, 12, 13  # exit codes of the I/O process
CTL_MAX = 64 * 1024  # longest message between the I/O process and the warm parent (small JSON)
KILL_ROUNDS = 10_000  # PID 1: rounds of kill(-1) + reap while waiting for killed processes to exit
KILL_WAIT_S = 0.01  # longest wait for one killed process to exit before the next round
PIDFD_BATCH = 16  # killed processes waited on at once (pidfds), of the agent's spare file descriptors
WIPE_MAX_ENTRIES = 1_000_000  # per reset; the container's tmpfs inode caps keep real counts far lower
IPC_RMID = 0
SYSV_IPC_KINDS = ("shm", "sem", "msg")  # /proc/sysvipc/<kind>: the second column is the id

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
        ("copy", "dispatch_table"),  # a reducer registered there makes copy._reconstruct setattr any name
        ("enum", "global_enum"),  # writes an enum's members into sys.modules[its __module__] (the agent's own)
    }
)
# Dunders through which the interpreter or a whitelisted library calls into a class (copy/pickle
# protocol, class creation, attribute access). RestrictedPython refuses them in class bodies; the
# agent re-checks every class the evaluator gets created, in case a library put one there.
CLASS_HOOK_DUNDERS = frozenset(
    {
        "__reduce__", "__reduce_ex__", "__getstate__", "__setstate__", "__getnewargs__", "__getnewargs_ex__",
        "__copy__", "__deepcopy__", "__set_name__", "__init_subclass__", "__class_getitem__", "__mro_entries__",
        "__prepare__", "__new__", "__del__", "__getattribute__", "__getattr__", "__setattr__", "__delattr__",
        "__get__", "__set__", "__delete__", "__instancecheck__", "__subclasscheck__", "__subclasshook__",
    }
)  # fmt: skip
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
# Declared dependencies become importable by restricted code (process backend). Only third-party
# distributions qualify: declaring "os", "ctypes" or the platform's own packages (which would reach
# the server's database and sockets through the host interpreter) must not unlock them.
PLATFORM_PACKAGES = frozenset(
    {"crossaudit", "orchestrator", "sandbox", "protos", "RestrictedPython", "grpc", "grpc_tools", "docker",
     "google", "pip", "setuptools", "pkg_resources", "importlib_metadata", "pytest", "_pytest"}
)  # fmt: skip


def _is_dependency_name(name: str) -> bool:
    root = name.split(".")[0]
    return root not in sys.stdlib_module_names and root not in PLATFORM_PACKAGES


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


class CleanupError(Exception):
    """The sandbox could not be reset after a call: it must not serve another one."""


def _other_pids() -> list[int]:
    """Every process of this PID namespace but the caller (inside a container: all but PID 1)."""
    me = os.getpid()
    return [int(n) for n in os.listdir("/proc") if n.isdigit() and int(n) != me]


def _ended(pid: int) -> bool:
    """Whether a process (not necessarily our child) has exited: gone, or a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[-1].split()[0] in (b"Z", b"X")
    except (OSError, IndexError):
        return True


def _wait_exit(pids: list[int], timeout: float) -> None:
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


def _thread_count() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 1


def _wipe(top: str, deadline: float, budget: int) -> int:
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


def _remove_sysv_ipc(libc) -> int:
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


def _reset_paths(spec: object) -> tuple[list[str], bool] | str:
    """Validate the load frame's ``reset``: ``{"paths": [absolute dirs], "ipc": bool}``; a str is a problem."""
    if not isinstance(spec, dict) or not isinstance(spec.get("paths", []), list):
        return "reset must be {'paths': [absolute directories], 'ipc': bool}"
    paths = []
    for path in spec.get("paths", []):
        plain = isinstance(path, str) and os.path.isabs(path) and os.path.normpath(path) == path and path != "/"
        if not plain or not os.path.isdir(path) or os.path.islink(path):
            return f"reset path {path!r} is not a plain absolute directory"
        paths.append(path)
    ipc = spec.get("ipc", False) is True
    if ipc and os.getpid() != 1:
        return "reset.ipc needs an IPC namespace of the sandbox's own (the agent as PID 1 of a container)"
    return paths, ipc


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
        import collections

        self._writable = (dict, list, bytearray, collections.deque)
        # Classes the evaluator created (class statements, make_dataclass): they and their instances
        # may be written to. Kept per call child; a fork never shares it with another call.
        self.user_classes: weakref.WeakSet[type] = weakref.WeakSet()
        # Captured once: a later rebinding of the module globals (enum.global_enum did that) changes nothing.
        self._forbidden_types, self._denied_ids, denied_types = _internals()
        # Types none of check_value's tests can refuse (they do not depend on more than the type):
        # checked once per type. Seeded with the plain ones; never a dict, class or denied kind.
        self._safe_types: set[type] = set(_PLAIN_VALUE_TYPES)
        self._unsafe_types = (dict, type, *denied_types)
        self._library_guards = self._make_library_guards()

    def violation(self, message: str) -> SandboxViolation:
        self.violations.append(message)
        return SandboxViolation(message)

    # -- attribute / item access
    def check_value(self, value, what: str):
        """Refuse library internals as values of getattr/getitem/iteration/module attributes.

        Defence in depth behind the guards below: modules, frames, code, tracebacks, import
        specs/loaders, a module's globals (or any dict holding ``__builtins__``: a copy of globals
        carries the real ``open``), the denied builtins and library functions, metaclasses
        (a 3-argument call is class creation with any namespace).
        """
        t = type(value)
        if t in self._safe_types:
            return value
        if isinstance(value, self._forbidden_types):
            raise self.violation(f"access to {what} is not allowed (module/frame/code object or import machinery)")
        if id(value) in self._denied_ids:
            raise self.violation(f"access to {what} is not allowed (a denied builtin or library function)")
        if type(value) is dict and _is_namespace_dict(value):
            raise self.violation(f"access to {what} is not allowed (a module's globals or builtins)")
        if isinstance(value, type) and issubclass(value, type):
            raise self.violation(f"access to {what} is not allowed (a metaclass)")
        if not issubclass(t, self._unsafe_types) and not issubclass(t, self._forbidden_types):
            self._safe_types.add(t)
        return value

    def getiter(self, ob):
        """``_getiter_`` (for loops, comprehensions, unpacking): items are checked like subscripts.

        Strings, bytes and ranges cannot yield an object; a list or tuple is checked up front (its
        items are what the evaluator could subscript anyway); anything else item by item.
        """
        t = type(ob)
        if t in _ITER_PLAIN:
            return iter(ob)
        if t is list or t is tuple:
            safe = self._safe_types
            for value in ob:
                if type(value) not in safe:
                    self.check_value(value, "item")
            return iter(ob)
        return self._checked_items(iter(ob))

    def _checked_items(self, it):
        safe, check = self._safe_types, self.check_value
        for value in it:
            yield value if type(value) in safe else check(value, "item")

    def getattr(self, obj, name, *default):
        safer_getattr = self._safer_getattr
        if type(name) is not str:
            raise TypeError("attribute name must be a str")
        if name.startswith("_") or (name in BLOCKED_ATTRS and (name not in ("format", "format_map") or _is_str(obj))):
            raise self.violation(f"attribute {name!r} is not allowed")
        if isinstance(obj, self._forbidden_types):
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
        if isinstance(obj, self._forbidden_types):
            raise self.violation("item access on a module/frame/code object is not allowed")
        return self.check_value(obj[key], "item")

    # -- writes
    def is_user_object(self, ob) -> bool:
        """A class the evaluator created, or an instance of one (``ob in`` would hash an unhashable ``ob``)."""
        return type(ob) in self.user_classes or (isinstance(ob, type) and ob in self.user_classes)

    def write_guard(self, ob):
        """Writes go to containers and to the evaluator's own classes/instances, nothing else.

        Every call runs in a fresh fork, so even a write to a shared container cannot outlive it.
        """
        if isinstance(ob, self._writable) or self.is_user_object(ob):
            return ob
        raise self.violation(f"writing to a {type(ob).__name__!r} object is not allowed")

    def check_class(self, cls):
        """Refuse a class whose hook dunders run evaluator code.

        The compiler refuses such defs and setattr refuses '_' names, so only a library can have
        put one there (make_dataclass, the enum functional API, a metaclass call): copy's
        _reconstruct, for one, would then setattr attacker-chosen names on any object.
        """
        for klass in getattr(cls, "__mro__", ())[:-1]:  # not object
            ns = klass.__dict__
            for name in ns.keys() & CLASS_HOOK_DUNDERS:
                if _is_evaluator_code(ns[name]):
                    raise self.violation(f"class {getattr(cls, '__name__', '?')!r} defines {name}")
        return cls

    # -- guarded versions of library functions that read, write or call by a caller-chosen name
    def _make_library_guards(self) -> dict[int, tuple[object, object]]:
        import dataclasses

        pairs = [
            (functools.wraps, self.wraps),
            (functools.update_wrapper, self.update_wrapper),
            (dataclasses.make_dataclass, self.make_dataclass),
            (dataclasses.dataclass, self.dataclass),
            (operator.getitem, self.getitem),
            (operator.setitem, self.setitem),
            (operator.delitem, self.delitem),
            (operator.itemgetter, self.itemgetter),
        ]
        return {id(original): (original, guard) for original, guard in pairs}

    def wraps(self, wrapped, assigned=functools.WRAPPER_ASSIGNMENTS, updated=functools.WRAPPER_UPDATES):
        return functools.partial(self.update_wrapper, wrapped=wrapped, assigned=assigned, updated=updated)

    def update_wrapper(
        self, wrapper, wrapped, assigned=functools.WRAPPER_ASSIGNMENTS, updated=functools.WRAPPER_UPDATES
    ):
        """functools.update_wrapper with (a subset of) the default names, onto the evaluator's own objects.

        Any other name makes it a free getattr/setattr: ``updated=('__globals__',)`` merges a library
        function's real globals (``__builtins__``: open, __import__) into a dict of the caller's.
        Checked here, at the call, since a partial's keywords stay mutable after wraps().
        """
        names = []
        for given, allowed in ((assigned, functools.WRAPPER_ASSIGNMENTS), (updated, functools.WRAPPER_UPDATES)):
            given = tuple(given) if type(given) in (tuple, list) else None
            if given is None or not all(type(n) is str and n in allowed for n in given):
                raise self.violation("functools.update_wrapper/wraps only take the default attribute names")
            names.append(given)
        if not (_is_evaluator_function(wrapper) or self.is_user_object(wrapper)):
            raise self.violation(f"functools.update_wrapper cannot write to a {type(wrapper).__name__!r} object")
        return functools.update_wrapper(wrapper, wrapped, names[0], names[1])

    def make_dataclass(self, cls_name, fields, **kwargs):
        """dataclasses.make_dataclass without '_' names: fields and namespace keys become class attributes
        (``__globals__`` for functools.update_wrapper, ``__reduce_ex__`` for copy)."""
        import dataclasses

        items = []
        for item in list(fields):
            if type(item) is not str:
                item = tuple(item)
            name = item if type(item) is str else (item[0] if item else None)
            if type(name) is not str or name.startswith("_"):
                raise self.violation(f"dataclass field name {name!r} is not allowed")
            items.append(item)
        if kwargs.get("namespace") is not None:
            namespace = dict(kwargs["namespace"])
            for key in namespace:
                if type(key) is not str or key.startswith("_"):
                    raise self.violation(f"dataclass namespace key {key!r} is not allowed")
            kwargs["namespace"] = namespace
        cls = self.check_class(dataclasses.make_dataclass(cls_name, items, **kwargs))
        self.user_classes.add(cls)  # like a class statement: its instances may be written to
        return cls

    def dataclass(self, cls=None, /, **kwargs):
        """dataclasses.dataclass on the evaluator's own classes, with identifier field names only.

        It pastes each name of the class's ``__annotations__`` into the source of ``__init__`` and
        exec()s it with the real builtins; a class statement cannot annotate, but update_wrapper's
        default ``__annotations__`` copy or a TypedDict (any string as a key) can supply the dict.
        """
        import dataclasses

        def wrap(target):
            if not (isinstance(target, type) and target in self.user_classes):
                raise self.violation("dataclasses.dataclass only applies to the evaluator's own classes")
            # exactly the mapping dataclasses reads (its own annotations, not inherited ones)
            for name in list(target.__dict__.get("__annotations__", {})):  # noqa: RUF063
                if type(name) is not str or not name.isidentifier() or name.startswith("_"):
                    raise self.violation(f"dataclass field name {name!r} is not allowed")
            out = dataclasses.dataclass(target, **kwargs)
            self.user_classes.add(out)  # slots=True returns a new class
            return out

        return wrap if cls is None else wrap(cls)

    def setitem(self, obj, key, value):
        self.write_guard(obj)[key] = value

    def delitem(self, obj, key):
        del self.write_guard(obj)[key]

    def itemgetter(self, item, *items):
        getitem = self.getitem
        if not items:
            return lambda obj: getitem(obj, item)
        keys = (item, *items)
        return lambda obj: tuple(getitem(obj, k) for k in keys)

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
        try:
            value = getattr(mod, name)
        except AttributeError:
            # A fresh error: the interpreter's own carries the real module as ``.obj``.
            raise AttributeError(f"module {mod.__name__!r} has no attribute {name!r}") from None
        guarded = self._library_guards.get(id(value))
        if guarded is not None and guarded[0] is value:
            return guarded[1]
        if isinstance(value, types.ModuleType):
            raise self.violation(f"{mod.__name__}.{name} is a module; import it explicitly if it is allowed")
        return self.check_value(value, f"{mod.__name__}.{name}")

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
        user_classes = self.user_classes
        write_guard = self.write_guard
        real_build_class = builtins.__build_class__

        def build_class(func, name, *bases, **kwargs):
            """Record classes the evaluator defines: their instances may get attributes written."""
            cls = self.check_class(real_build_class(func, name, *bases, **kwargs))
            user_classes.add(cls)
            return cls

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
        _guard_enum_functional_api(self)

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
            "_getiter_": self.getiter,
            "_iter_unpack_sequence_": guarded_iter_unpack_sequence,
            "_unpack_sequence_": guarded_unpack_sequence,
            "_write_": write_guard,
            "_inplacevar_": inplacevar,
            "_apply_": lambda f, *a, **kw: f(*a, **kw),
            "_print_": Printer,
        }


def _is_str(obj) -> bool:
    """Objects whose format/format_map walk attributes of their arguments (UserString forwards to str)."""
    import collections
    import string

    kinds = (str, string.Formatter, collections.UserString)
    return isinstance(obj, kinds) or (isinstance(obj, type) and issubclass(obj, kinds))


EVALUATOR_FILENAME = "<evaluator>"  # what handle_load compiles the evaluator's source as
# Values that cannot be or hold a library internal: check_value/getiter pass them on the fast path.
_PLAIN_VALUE_TYPES = frozenset({str, int, float, bool, type(None), complex, bytes, bytearray, list, tuple,
                                set, frozenset, range, slice})  # fmt: skip
_ITER_PLAIN = frozenset({str, bytes, bytearray, range})  # their items are str/int


def _static_internals() -> tuple[tuple[type, ...], tuple[object, ...]]:
    """(types, objects) restricted code must never hold as a value; see Restrictions.check_value.

    Import specs and loaders read any file (``get_data``) or load any module; the real builtins
    behind DENIED_BUILTINS, the raw getattr family and importlib's entry points undo the guards.
    Computed once at import, in the warm parent: the call children inherit it.
    """
    import importlib.machinery as machinery

    kinds = [*FORBIDDEN_VALUE_TYPES, machinery.ModuleSpec, machinery.FileFinder]
    for loader in (machinery.SourceFileLoader, machinery.SourcelessFileLoader, machinery.ExtensionFileLoader):
        kinds.extend(c for c in loader.__mro__ if c is not object)
    for extra in (
        getattr(machinery, "NamespaceLoader", None),
        getattr(sys.modules.get("zipimport"), "zipimporter", None),
    ):
        if isinstance(extra, type):
            kinds.append(extra)
    names = (*DENIED_BUILTINS, "getattr", "setattr", "hasattr", "delattr", "__import__", "__build_class__")
    objects = [
        getattr(builtins, n) for n in names if hasattr(builtins, n) and not isinstance(getattr(builtins, n), type)
    ]
    objects += [machinery.BuiltinImporter, machinery.FrozenImporter, machinery.PathFinder, sys.modules,
                importlib.import_module, importlib.reload, importlib.__import__]  # fmt: skip
    return tuple(dict.fromkeys(kinds)), tuple(objects)


_STATIC_INTERNALS = _static_internals()


def _internals() -> tuple[tuple[type, ...], frozenset[int], frozenset[type]]:
    """(forbidden types, denied object ids, the types of those objects): the static internals plus
    the denied attributes of the modules imported so far (all of the whitelist in a call child;
    one not imported yet is still refused by name in module_attr)."""
    kinds, objects = _STATIC_INTERNALS
    found = list(objects)
    for module, name in DENIED_MODULE_ATTRS:
        value = getattr(sys.modules.get(module), name, None)
        if value is not None and not isinstance(value, types.ModuleType):
            found.append(value)
    return kinds, frozenset(id(o) for o in found), frozenset(type(o) for o in found)


def _is_namespace_dict(d: dict) -> bool:
    """A module's globals, the real builtins, or a dict filled from one (the reported escape's ``d``)."""
    if "__builtins__" in d:
        return True
    name = d.get("__name__")
    return type(name) is str and getattr(sys.modules.get(name), "__dict__", None) is d


def _is_evaluator_function(value) -> bool:
    """A plain function compiled from the evaluator's source (a def or a lambda)."""
    return isinstance(value, types.FunctionType) and value.__code__.co_filename == EVALUATOR_FILENAME


def _is_evaluator_code(value) -> bool:
    """Whether ``value`` is, or wraps, a function compiled from the evaluator's source."""
    for _ in range(8):
        if isinstance(value, (classmethod, staticmethod, types.MethodType)):
            value = value.__func__
        elif isinstance(value, functools.partial):
            value = value.func
        elif isinstance(value, property):
            value = value.fget
        else:
            break
    return _is_evaluator_function(value)


_ENUM_CREATE = None  # the real EnumType._create_, kept once the call child has installed the guard


def _guard_enum_functional_api(restrictions: Restrictions) -> None:
    """``Enum('E', names)`` turns each name into a class attribute, dunders and sunders included.

    EnumType._create_ is replaced process-wide: make_globals runs in the single-use call child, so
    neither the agent nor any other call sees it. Library callers go through it too (their names
    cannot start with '_' either: enum reserves those).
    """
    import collections.abc
    import enum

    global _ENUM_CREATE
    if _ENUM_CREATE is None:
        _ENUM_CREATE = enum.EnumType._create_  # type: ignore[attr-defined]
    original = _ENUM_CREATE

    def _create_(cls, class_name, names=None, **kwargs):
        if isinstance(names, str):
            names = names.replace(",", " ").split()
        elif names is not None:  # one snapshot: what is checked is what enum gets
            items = list(names.items()) if isinstance(names, collections.abc.Mapping) else list(names)
            names = [item if type(item) is str else tuple(item) for item in items]
        for item in names or ():
            name = item if type(item) is str else (item[0] if item else None)
            if type(name) is not str or name.startswith("_"):
                raise restrictions.violation(f"enum member name {name!r} is not allowed")
        if kwargs.get("module") is None:  # what the original finds two frames up: our caller's module
            with contextlib.suppress(ValueError):
                kwargs["module"] = sys._getframe(2).f_globals.get("__name__")
        return restrictions.check_class(original(cls, class_name, names, **kwargs))

    enum.EnumType._create_ = _create_  # type: ignore[attr-defined]


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
        self.inbuf = bytearray()  # protocol input read but not parsed yet (ours: zeroed when handed on)
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
        self.reset_paths: list[str] = []  # scratch directories emptied after every call
        self.reset_ipc = False  # SysV IPC objects removed after every call (own IPC namespace only)
        self.report_reset = False  # send a "reset" frame after each call (the load asked for it)
        self.broken: str | None = None  # a reset failed: no further call is served
        self.ctl: socket.socket | None = None  # the I/O process <-> warm parent channel (after the load)
        self.io_pid = 0  # the warm parent: its I/O process, spared by the resets

    # -- frames
    def send(self, frame: dict) -> None:
        data = json.dumps(frame, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8", "replace")
        _write_all(self.proto_out, data + b"\n")

    def read_line(self) -> bytes:
        """The next protocol line (newline included); b"" at EOF, a line without newline if too long or cut."""
        while True:
            nl = self.inbuf.find(b"\n")
            if nl >= 0 or len(self.inbuf) > PROTOCOL_IN_MAX:
                end = nl + 1 if nl >= 0 else len(self.inbuf)
                line = bytes(self.inbuf[:end])
                del self.inbuf[:end]
                return line
            chunk = os.read(self.proto_in, 1 << 16)
            if not chunk:
                line, self.inbuf = bytes(self.inbuf), bytearray()
                return line
            self.inbuf += chunk

    def serve_one(self) -> str | None:
        """Read and answer one frame: "call" (a call was run), "eof", "fatal" (stream unusable) or None."""
        line = self.read_line()
        if not line:
            self.kill_child()
            return "eof"
        if len(line) > PROTOCOL_IN_MAX or not line.endswith(b"\n"):
            self.send({"op": "error", "error": _error("protocol", "frame too long")})
            self.kill_child()
            return "fatal"
        try:
            frame = json.loads(line)
            if not isinstance(frame, dict):
                raise ValueError("frame is not an object")
        except (ValueError, RecursionError) as exc:
            self.send({"op": "error", "error": _error("protocol", f"bad frame: {exc}")})
            return None
        op = frame.get("op")
        if op == "load":
            self.handle_load(frame)
        elif op == "call":
            return "call" if self.handle_call(frame) else None
        else:
            self.send({"op": "error", "error": _error("protocol", f"unknown op {op!r}")})
        return None

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
            self.send({"op": "error", "error": _error("crashed", "the agent's I/O process died")})
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
                self.broken = _msg(exc) if isinstance(exc, CleanupError) else _exc_text(exc)
            report = {"op": "reset", "ok": self.broken is None,
                      "cleanup_ms": round((time.monotonic() - started) * 1000, 3), **stats}  # fmt: skip
            if self.broken:
                report["error"] = _error("crashed", f"sandbox reset after a call failed: {self.broken}")
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
        if frame.get("reset") is not None:
            reset = _reset_paths(frame["reset"])
            if isinstance(reset, str):
                return fail("load_error", reset)
            self.reset_paths, self.reset_ipc = reset
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
            result = compile_restricted_exec(code, filename="<evaluator>")
            if result.errors or result.code is None:
                return fail("security", "restricted: " + "; ".join(result.errors))
            self.code_obj = result.code
        else:
            self.code_obj = compile(code, "<evaluator>", "exec")
        warnings: list[str] = []
        self.entry = entry
        self.isolate()  # before the imports: no network for them, and their orphans come back to us
        self.preload_modules(frame.get("preload") or [], warnings)
        threads = _thread_count()
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
            return fail("load_error", f"could not clean up after importing the declared dependencies: {_exc_text(exc)}")
        if self.isolation["uid_drop"] and not _world_readable(os.path.dirname(os.__file__)):
            warnings.append(
                "the Python installation is not readable by the sandbox uid: "
                "only modules preloaded by the agent can be imported during calls"
            )
        self.loaded = True
        self.base_vm = _vm_size()
        self.send({"op": "loaded", "ok": True, "pid": os.getpid(), "warnings": warnings, "isolation": self.isolation})

    def preload_modules(self, preload: object, warnings: list[str]) -> None:
        """Import the declared dependencies (and, restricted, the whitelist) once, in the warm parent."""
        for name in preload if isinstance(preload, list) else []:
            if not isinstance(name, str) or not IMPORT_NAME_RE.match(name):
                warnings.append(f"ignored preload name {name!r}")
                continue
            if not _is_dependency_name(name):
                warnings.append(f"ignored preload {name!r}: the standard library's or the platform's, not a dependency")
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

    def refresh_nproc_base(self) -> None:
        """Tasks the next call child's uid will have when it runs: those counted now, plus itself."""
        self.nproc_base = _count_uid_processes(self.sandbox_uid()) + 1

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

    def reap_strays(self, spare: int = 0) -> int:
        """Kill every descendant but ``spare`` (the I/O process) left after a call (orphans come back to us)."""
        keep = spare or None
        pending, self.reap_later = self.reap_later, []
        for pid in pending:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
        killed = 0
        for _ in range(REAP_ROUNDS):
            strays = [p for p in _children_of(os.getpid()) if p != keep]
            if not strays:
                break
            killed += len(strays)
            for pid in strays:
                self._kill_group(pid)
            for pid in strays:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, 0)
        else:
            if [p for p in _children_of(os.getpid()) if p != keep]:
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
        others = [p for p in _other_pids() if p != spare]
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
                others = [p for p in _other_pids() if p != spare]
                if others:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    _wait_exit(others, min(remaining, KILL_WAIT_S))
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
            files += _wipe(path, deadline, WIPE_MAX_ENTRIES - files)
        stats["files"] = files
        if self.reset_ipc and os.getpid() == 1:
            stats["ipc"] = _remove_sysv_ipc(self.libc)
        return stats

    # -- call
    def handle_call(self, frame: dict) -> bool:
        """Run one call in the waiting child and answer it; False when the frame was refused instead."""
        call_id = frame.get("id")
        if not isinstance(call_id, str) or len(call_id) > 200:
            self.send({"op": "error", "error": _error("protocol", "call needs a string 'id'")})
            return False
        if not self.loaded or self.broken:
            reason = f"sandbox is not clean: {self.broken}"
            error = _error("load_error", "not loaded") if not self.loaded else _error("crashed", reason)
            self.send({"op": "result", "id": call_id, "ok": False, "error": error,
                       "stdout": "", "stderr": "", "truncated": False, "wall_ms": 0.0})  # fmt: skip
            return False
        payload = {k: frame.get(k) for k in ("prompt", "response", "context")}
        if not isinstance(payload["prompt"], str) or not isinstance(payload["response"], str):
            self.send({"op": "error", "error": _error("protocol", "call needs string 'prompt' and 'response'")})
            return False
        if not isinstance(payload["context"], dict):
            payload["context"] = {}
        if self.child is None:  # only after an agent error: a fresh child, after a reset
            self.request_child(reset=True)
        if self.child is None:
            self.send({"op": "result", "id": call_id, "ok": False, "error": _error("crashed", "no call process"),
                       "stdout": "", "stderr": "", "truncated": False, "wall_ms": 0.0})  # fmt: skip
            return False
        started = time.monotonic()
        try:
            answer = self.run_child(json.dumps(payload, ensure_ascii=False).encode("utf-8", "replace"))
        except Exception as exc:  # an agent bug must not take the agent down: report, kill, go on
            self.kill_child()
            answer = {"ok": False, "error": _error("crashed", f"agent error: {_exc_text(exc)}"),
                      "stdout": "", "stderr": "", "truncated": False}  # fmt: skip
        answer.update({"op": "result", "id": call_id, "wall_ms": round((time.monotonic() - started) * 1000, 3)})
        self.send(answer)
        return True

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
                    exited = _ended(child.pid)
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
                return finish({"ok": False, "error": _error("load_error", f"'{self.entry}' is not defined")})
        except BaseException as exc:
            return finish({"ok": False, "error": self._exc_error(exc, restrictions, "while loading: ")})
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
