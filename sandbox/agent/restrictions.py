"""Restricted mode: the audited guards restricted code runs under (RestrictedPython's policy hooks).

Why a module of its own: this is the security boundary of restricted mode, audited on its own.
It only builds globals and checks values; it never forks or talks the protocol. Everything here
runs in the single-use call child (``Restrictions``) except the tables computed at import, in
the warm parent, which every call child inherits.
"""

from __future__ import annotations

import builtins
import contextlib
import functools
import importlib
import operator
import re
import sys
import types
import weakref

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
DENIED_BUILTINS = ("open", "eval", "exec", "compile", "globals", "locals", "vars", "dir", "input", "help",
                   "memoryview", "exit", "quit", "object", "super", "delattr", "breakpoint")  # fmt: skip
FORBIDDEN_VALUE_TYPES = (types.ModuleType, types.FrameType, types.CodeType, types.TracebackType)
IMPORT_NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_]*(\.[A-Za-z][A-Za-z0-9_]*)*$")


class SandboxViolation(Exception):
    """Restricted code touched something forbidden. Recorded even if the code catches it."""

    # Not in crossaudit.kernel.errors: it lives inside the stdlib-only agent, which reports it as a
    # "security" error frame; the host turns that into a SandboxSecurityError.


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
    # Long: the restricted namespace is one table (builtins, guards, hooks) read top to bottom;
    # its entries are audited together (docs/threat-model.md), so they stay in one place.
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
