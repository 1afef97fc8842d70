"""Restricted-mode escapes through whitelisted library code (process backend, real subprocesses).

RestrictedPython refuses ``_`` names in the evaluator's *source*; these programs get a library
function to read or write such a name for them (``functools.wraps(..., updated=('__globals__',))``,
``dataclasses.make_dataclass(namespace=...)``, the enum functional API, the copy protocol, ...).
Each idiom must end in a typed error, or be shown harmless by an assertion that would fail if it
reached library internals. ``test_legit_idioms`` keeps the everyday uses of the same modules working.
The audited list, with what each idiom could reach and how it is blocked: docs/sandbox-process.md.
"""

from __future__ import annotations

import builtins
import importlib.machinery
import json

import pytest

from crossaudit.kernel.errors import SandboxCodeError, SandboxSecurityError
from sandbox.base import CodeBundle
from sandbox.process.backend import ProcessSandbox
from tests.security.test_process_hostile import LIMITS, _fn, expect

pytestmark = pytest.mark.security


@pytest.fixture
async def sb():
    s = ProcessSandbox(LIMITS)
    yield s
    await s.aclose()


async def _details(box: ProcessSandbox, body: str) -> dict:
    # the roomy deadline of the hostile suite: what leaks is the subject, not how fast
    verdict, _ = await box.run(CodeBundle(_fn(body)), "p", "r", {}, timeout=LIMITS.timeout_s)
    return verdict.details


PASSWD = "return {'score': 1.0, 'details': {'leak': str(leak)[:60]}}"

# Each must fail with SandboxSecurityError. Where the idiom is a working escape on a sandbox without
# the guard, the program goes all the way (reads /etc/passwd, or writes where writes are refused),
# so a missing guard shows up as a normal verdict, not as an unrelated error.
ESCAPES = {
    # -- functools: update_wrapper reads and writes the attribute names it is given
    "wraps_updated_globals_make_dataclass": (  # the reported escape
        "import dataclasses, functools, json\n"
        "d = {}\n"
        "C = dataclasses.make_dataclass('C', [], namespace={'__globals__': d})\n"
        "functools.wraps(json.loads, assigned=(), updated=('__globals__',))(C)\n"
        "leak = d['__builtins__']['open']('/etc/passwd').read()\n" + PASSWD
    ),
    "wraps_updated_globals_instance": (
        "import dataclasses, functools, json\n"
        "d = {}\n"
        "C = dataclasses.make_dataclass('C', [], namespace={'__globals__': d})\n"
        "functools.wraps(json.loads, assigned=(), updated=('__globals__',))(C())\n"
        "leak = d['__builtins__']['open']('/etc/passwd').read()\n" + PASSWD
    ),
    "update_wrapper_into_own_globals": (  # json's globals (real __builtins__) merged into the evaluator's
        "import functools, json\n"
        "functools.update_wrapper(evaluate, json.loads, assigned=(), updated=('__globals__',))\n"
        "def later():\n"
        "    return open('/etc/passwd').read()\n"
        "leak = later()\n" + PASSWD
    ),
    "update_wrapper_assigned_dunder": (
        "import functools, json\n"
        "class W:\n"
        "    pass\n"
        "functools.update_wrapper(W, json.loads, assigned=('__globals__',), updated=())\n"
        "functools.update_wrapper(evaluate, W, assigned=(), updated=('__globals__',))\n"
        "def later():\n"
        "    return open('/etc/passwd').read()\n"
        "leak = later()\n" + PASSWD
    ),
    "wraps_partial_keywords_rewritten": (  # wraps() returns a partial whose keywords dict stays mutable
        "import functools, json\n"
        "w = functools.wraps(json.loads)\n"
        "w.keywords['assigned'] = ()\n"
        "w.keywords['updated'] = ('__globals__',)\n"
        "w(evaluate)\n"
        "def later():\n"
        "    return open('/etc/passwd').read()\n"
        "leak = later()\n" + PASSWD
    ),
    "wraps_writes_library_function": (  # a write to a library object, which `x.attr = v` may not do
        "import functools, json\nfunctools.wraps(evaluate)(json.loads)\nreturn {'score': 1.0}"
    ),
    "singledispatchmethod": "import functools\nf = functools.singledispatchmethod\nreturn {'score': 1}",
    "cached_property_attrname_rewrite": (
        "import functools\n"
        "class A:\n"
        "    def calc(self):\n"
        "        return 3\n"
        "    v = functools.cached_property(calc)\n"
        "A.v.attrname = '__globals__'\n"
        "return {'score': 1.0}"
    ),
    # -- dataclasses: make_dataclass puts any name into the class namespace
    "make_dataclass_namespace_reduce_ex": (
        "import copy, dataclasses, json\n"
        "def red(self, proto):\n"
        "    return (json.JSONDecoder, (), (None, {'parse_object': None}))\n"
        "C = dataclasses.make_dataclass('C', [], namespace={'__reduce_ex__': red})\n"
        "leak = copy.copy(C()).parse_object\n" + PASSWD
    ),
    "make_dataclass_field_named_globals": (  # a field default is a class attribute too
        "import dataclasses, functools, json\n"
        "class Sink:\n"
        "    def update(self, other):\n"
        "        self.got = other\n"
        "sink = Sink()\n"
        "C = dataclasses.make_dataclass('C', [('__globals__', object, dataclasses.field(default=sink))])\n"
        "functools.wraps(json.loads, assigned=(), updated=('__globals__',))(C)\n"
        "leak = sink.got['__builtins__']['open']('/etc/passwd').read()\n" + PASSWD
    ),
    "dataclass_field_name_injection": (  # annotation keys are pasted into exec()ed source of __init__
        "import dataclasses, functools, typing\n"
        "N = \"a=int(open('/etc/passwd').read()),*b):\\n pass\\ndef q(*c\"\n"
        "T = typing.TypedDict('T', {N: int})\n"
        "class U:\n"
        "    pass\n"
        "functools.update_wrapper(U, T, updated=())\n"
        "setattr(U, N, dataclasses.field(init=False))\n"
        "try:\n"
        "    dataclasses.dataclass(repr=False, eq=False)(U)\n"
        "except ValueError as e:\n"
        "    leak = e.args[0]\n" + PASSWD
    ),
    "dataclass_on_typeddict": (
        "import dataclasses, typing\n"
        "T = typing.TypedDict('T', {'x y': int})\n"
        "dataclasses.dataclass(T)\n"
        "return {'score': 1.0}"
    ),
    "make_dataclass_private_field": (
        "import dataclasses\nC = dataclasses.make_dataclass('C', ['_hidden'])\nreturn {'score': 1.0}"
    ),
    # -- enum: the functional API and global_enum
    "enum_functional_reduce_ex": (
        "import copy, enum, json\n"
        "def red(self, proto):\n"
        "    return (json.JSONDecoder, (), (None, {'parse_object': None}))\n"
        "E = enum.Enum('E', [('__reduce_ex__', red), ('__copy__', None), ('A', 1)])\n"
        "leak = copy.copy(E.A).parse_object\n" + PASSWD
    ),
    "enum_functional_dunder_mapping": (
        "import enum\nE = enum.Enum('E', {'__globals__': {}, 'A': 1})\nreturn {'score': 1.0}"
    ),
    "enum_functional_sunder_string": "import enum\nE = enum.Enum('E', '_missing_ A')\nreturn {'score': 1.0}",
    "enum_global_enum_overwrites_agent_globals": (  # members are exported into sys.modules[module]
        "import enum, json\n"
        "E = enum.Enum('E', [('FORBIDDEN_VALUE_TYPES', ((),))], type=tuple, module='__main__')\n"
        "enum.global_enum(E)\n"
        "leak = json.codecs.open('/etc/passwd').read()\n" + PASSWD
    ),
    "enum_module_main_without_global_enum": (  # module= alone exports nothing
        "import enum, json\n"
        "E = enum.Enum('E', [('FORBIDDEN_VALUE_TYPES', ((),))], type=tuple, module='__main__')\n"
        "leak = json.codecs.open('/etc/passwd').read()\n" + PASSWD
    ),
    # -- metaclasses handed out by module attributes: a 3-argument call is a class with any namespace
    "typing_abcmeta_class_creation": (
        "import copy, json, typing\n"
        "def red(self, proto):\n"
        "    return (json.JSONDecoder, (), (None, {'parse_object': None}))\n"
        "X = typing.ABCMeta('X', (), {'__reduce_ex__': red})\n"
        "leak = copy.copy(X()).parse_object\n" + PASSWD
    ),
    "enum_metaclass": (
        "import enum\nM = enum.EnumMeta\nX = M('X', (), {'__reduce_ex__': None})\nreturn {'score': 1.0}"
    ),
    "typing_namedtuplemeta": "import typing\nM = typing.NamedTupleMeta\nreturn {'score': 1.0}",
    # -- copy: the reduce table drives copy._reconstruct (setattr with any name, any callable)
    "copy_dispatch_table": (
        "import copy, json\n"
        "class C:\n"
        "    pass\n"
        "def red(obj):\n"
        "    return (json.JSONDecoder, (), (None, {'parse_object': None}))\n"
        "copy.dispatch_table[C] = red\n"
        "leak = copy.copy(C()).parse_object\n" + PASSWD
    ),
    # -- operator: item functions are the subscript guards' business
    "operator_setitem_library_object": (
        "import collections, operator\n"
        "m = collections.ChainMap()\n"
        "operator.setitem(m, 'k', 1)\n"
        "return {'score': 1.0, 'details': {'k': m['k']}}"
    ),
    "operator_delitem_library_object": (
        "import collections, operator\n"
        "m = collections.ChainMap({'k': 1})\n"
        "operator.delitem(m, 'k')\n"
        "return {'score': 1.0}"
    ),
    # -- str.format walks attributes: every str-like class that forwards to it
    "userstring_format": (
        "import collections\nleak = collections.UserString('{0.__class__.__mro__}').format(1)\n" + PASSWD
    ),
    "userstring_format_map": (
        "import collections\nleak = collections.UserString('{a.__class__.__mro__}').format_map({'a': 1})\n" + PASSWD
    ),
    "typing_text_format": "import typing\nleak = typing.Text('{0.__class__}').format(1)\n" + PASSWD,
    "strenum_member_format": ("import enum\nS = enum.StrEnum('S', 'a')\nleak = S.a.format(1)\n" + PASSWD),
    # -- guarded builtins stay guarded when a library calls them
    "getattr_as_map_callback": "import json\nx = list(map(getattr, [json], ['codecs']))\nreturn {'score': 1.0}",
    "setattr_dunder_hook_on_own_class": (
        "class A:\n"
        "    pass\n"
        "def red(self, p):\n"
        "    return (dict, ())\n"
        "setattr(A, '__reduce_ex__', red)\n"
        "return {'score': 1}"
    ),
}


# The guard that must be the one to refuse (several idioms would also trip a later one).
REFUSED_BY = {
    "wraps_updated_globals_make_dataclass": "dataclass namespace key '__globals__'",
    "wraps_updated_globals_instance": "dataclass namespace key '__globals__'",
    "update_wrapper_into_own_globals": "only take the default attribute names",
    "update_wrapper_assigned_dunder": "only take the default attribute names",
    "wraps_writes_library_function": "update_wrapper cannot write to a 'function'",
    "wraps_partial_keywords_rewritten": "only take the default attribute names",
    "make_dataclass_namespace_reduce_ex": "dataclass namespace key '__reduce_ex__'",
    "make_dataclass_field_named_globals": "dataclass field name '__globals__'",
    "make_dataclass_private_field": "dataclass field name '_hidden'",
    "dataclass_field_name_injection": 'dataclass field name "a=int(open',
    "dataclass_on_typeddict": "dataclasses.dataclass only applies to the evaluator's own classes",
    "enum_functional_reduce_ex": "enum member name '__reduce_ex__'",
    "enum_functional_dunder_mapping": "enum member name '__globals__'",
    "enum_functional_sunder_string": "enum member name '_missing_'",
    "enum_global_enum_overwrites_agent_globals": "enum.global_enum is not allowed",
    "typing_abcmeta_class_creation": "(a metaclass)",
    "enum_metaclass": "(a metaclass)",
    "typing_namedtuplemeta": "(a metaclass)",
    "copy_dispatch_table": "copy.dispatch_table is not allowed",
    "operator_setitem_library_object": "writing to a 'ChainMap'",
    "operator_delitem_library_object": "writing to a 'ChainMap'",
    "userstring_format": "attribute 'format'",
    "userstring_format_map": "attribute 'format_map'",
}


@pytest.mark.parametrize("name", sorted(ESCAPES))
async def test_library_escape_is_refused(sb, name: str) -> None:
    await expect(sb, _fn(ESCAPES[name]), SandboxSecurityError, match=REFUSED_BY.get(name))


# Hook dunders an evaluator class may not define (RestrictedPython refuses the names at compile time;
# the agent re-checks every class it creates, in case a library put one there).
CLASS_HOOKS = [
    "__reduce__",
    "__reduce_ex__",
    "__getstate__",
    "__setstate__",
    "__copy__",
    "__deepcopy__",
    "__set_name__",
    "__init_subclass__",
    "__class_getitem__",
    "__getattribute__",
    "__getattr__",
    "__setattr__",
    "__get__",
    "__mro_entries__",
]


@pytest.mark.parametrize("hook", CLASS_HOOKS)
async def test_class_defining_a_hook_dunder_is_refused(sb, hook: str) -> None:
    code = f"class A:\n    def {hook}(self, *args):\n        return None\n" + _fn("return {'score': 1}")
    await expect(sb, code, SandboxSecurityError)


# Refused by the library itself: a typed error, nothing created.
LIBRARY_REFUSALS = {
    "namedtuple_dunder_field": "import collections\nN = collections.namedtuple('N', ['__reduce_ex__'])",
    "typing_namedtuple_dunder_field": "import typing\nN = typing.NamedTuple('N', [('__globals__', int)])",
    "dataclasses_replace_dunder_change": (
        "import dataclasses\n"
        "D = dataclasses.make_dataclass('D', ['x'])\n"
        "dataclasses.replace(D(1), **{'__globals__': {}})"
    ),
}


@pytest.mark.parametrize("name", sorted(LIBRARY_REFUSALS))
async def test_library_refuses_dunder_names(sb, name: str) -> None:
    await expect(sb, _fn(LIBRARY_REFUSALS[name] + "\nreturn {'score': 1.0}"), SandboxCodeError)


AGENT_INTERNALS = {
    "libc": "from crossaudit_agent.osutil import load_libc\nload_libc().system(b'true')",
    "guards": "from crossaudit_agent.restrictions import Restrictions",
    "limits": "from crossaudit_agent.state import DEFAULT_LIMITS\nDEFAULT_LIMITS['memory_bytes'] = 1 << 40",
}


@pytest.mark.parametrize("name", sorted(AGENT_INTERNALS))
async def test_agent_package_is_not_a_dependency(sb, name: str) -> None:
    """launch.py registers the agent as the package ``crossaudit_agent``: declaring a dependency of
    that name must not make its modules (libc through ctypes, the guards' tables) importable."""
    code = _fn(AGENT_INTERNALS[name] + "\nreturn {'score': 1.0}")
    await expect(sb, code, SandboxSecurityError, deps=("crossaudit-agent",), match="import of 'crossaudit_agent")


# --------------------------------------------------------------------------- harmless, with proof


async def test_json_hooks_receive_only_parsed_data(sb) -> None:
    details = await _details(
        sb,
        "import json\n"
        "seen = []\n"
        "def hook(x):\n"
        "    seen.append(str(type(x)))\n"
        "    return x\n"
        "def default(o):\n"
        "    seen.append(str(type(o)))\n"
        "    return sorted(o)\n"
        "class Dec(json.JSONDecoder):\n"
        "    pass\n"
        "class Enc(json.JSONEncoder):\n"
        "    def default(self, o):\n"
        "        seen.append(str(type(o)))\n"
        "        return str(o)\n"
        'json.loads(\'{"a": [1, 2.5, {"b": null}], "c": NaN}\', object_hook=hook, parse_float=hook,\n'
        "           parse_int=hook, parse_constant=hook)\n"
        'json.loads(\'{"a": {"b": 1}}\', object_pairs_hook=hook, cls=Dec)\n'
        "json.dumps({'x': {1, 2}}, default=default)\n"
        "json.dumps({'y': frozenset()}, cls=Enc)\n"
        "return {'score': 1.0, 'details': {'seen': sorted(set(seen))}}",
    )
    assert set(details["seen"]) == {f"<class '{t}'>" for t in ("dict", "list", "str", "set", "frozenset")}


async def test_string_template_looks_up_keys_not_attributes(sb) -> None:
    details = await _details(
        sb,
        "import string\n"
        "class Dotted(string.Template):\n"
        "    idpattern = '[a-z_.]+'\n"
        "a = string.Template('$__globals__ ${__class__}').safe_substitute({})\n"
        "b = Dotted('$f.__globals__').safe_substitute({'f': evaluate})\n"
        "c = string.Template('$x').substitute(x=evaluate)\n"
        "return {'score': 1.0, 'details': {'a': a, 'b': b, 'c': c[:10]}}",
    )
    assert details == {"a": "$__globals__ ${__class__}", "b": "$f.__globals__", "c": "<function "}


async def test_string_annotations_are_never_evaluated(sb) -> None:
    """NamedTuple/TypedDict/NewType/make_dataclass/typing aliases keep strings as ForwardRef or str."""
    details = await _details(
        sb,
        "import dataclasses, typing\n"
        "N = typing.NamedTuple('N', [('x', '1/0')])\n"
        "T = typing.TypedDict('T', {'x': '1/0', '__reduce_ex__': int})\n"
        "U = typing.NewType('U', int)\n"
        "D = dataclasses.make_dataclass('D', [('x', '1/0')])\n"
        "fr = typing.get_args(typing.List['1/0'])[0]\n"
        "t = T(x=3)\n"
        "return {'score': 1.0, 'details': {'n': N(1).x, 'd': D(2).x, 'u': U(4), 'fr': repr(fr),\n"
        "        't': [str(type(t)), t['x']]}}",
    )
    assert details == {"n": 1, "d": 2, "u": 4, "fr": "ForwardRef('1/0')", "t": ["<class 'dict'>", 3]}


async def test_attribute_error_from_a_module_does_not_carry_the_module(sb) -> None:
    details = await _details(
        sb,
        "import json\n"
        "try:\n"
        "    json.no_such_name\n"
        "except AttributeError as e:\n"
        "    obj = e.obj\n"
        "return {'score': 1.0, 'details': {'obj': repr(obj)}}",
    )
    assert details == {"obj": "None"}


async def test_copy_of_evaluator_classes_uses_only_library_reducers(sb) -> None:
    """copy/deepcopy of the evaluator's own classes: object.__reduce_ex__, same attribute names back."""
    details = await _details(
        sb,
        "import copy, dataclasses\n"
        "class P:\n"
        "    def __init__(self):\n"
        "        self.items = [1, {'k': 'v'}]\n"
        "D = dataclasses.make_dataclass('D', [('x', int), ('y', list, dataclasses.field(default_factory=list))])\n"
        "p = P()\n"
        "q = copy.deepcopy(p)\n"
        "r = copy.copy(D(1, [2]))\n"
        "q.items[1]['k'] = 'changed'\n"
        "return {'score': 1.0, 'details': {'orig': p.items, 'copy': q.items, 'dc': [r.x, r.y],\n"
        "        'same_class': type(q) is P}}",
    )
    assert details == {"orig": [1, {"k": "v"}], "copy": [1, {"k": "changed"}], "dc": [1, [2]], "same_class": True}


# --------------------------------------------------------------------------- legitimate evaluators


LEGIT_PRELUDE = '''
import collections, copy, dataclasses, enum, functools, json, operator, string, typing


def logged(f):
    @functools.wraps(f)
    def inner(*args, **kwargs):
        return f(*args, **kwargs)
    return inner


@logged
def double(x):
    """Twice x."""
    return 2 * x


class Memo:
    """A class-based decorator: update_wrapper on its own instance."""

    def __init__(self, f):
        functools.update_wrapper(self, f)
        self.f = f
        self.calls = 0

    def call(self, *args):
        self.calls = self.calls + 1
        return self.f(*args)


@functools.lru_cache(maxsize=None)
def fib(n):
    return n if n < 2 else fib(n - 1) + fib(n - 2)


Point = dataclasses.make_dataclass("Point", [("x", int), ("y", int, dataclasses.field(default=0))])
Frozen = dataclasses.make_dataclass("Frozen", ["a"], frozen=True)


@dataclasses.dataclass
class Empty:
    pass


@functools.total_ordering
class Version:
    def __init__(self, n):
        self.n = n

    def __eq__(self, other):
        return self.n == other.n

    def __lt__(self, other):
        return self.n < other.n


class Shade(enum.Enum):
    DARK = 1
    LIGHT = 2


class Area:
    def __init__(self, w, h):
        self.w = w
        self.h = h

    def size(self):
        return self.w * self.h

    big = functools.cached_property(size)


Color = enum.Enum("Color", "RED GREEN")
Level = enum.IntEnum("Level", [("LOW", 1), ("HIGH", 2)])
Pair = collections.namedtuple("Pair", "a b")
Typed = typing.NamedTuple("Typed", [("a", int)])
'''

LEGIT_BODY = """
data = json.loads('{"a": {"b": 1}}', object_hook=lambda d: dict(d, seen=True))
pairs = json.loads('[["k", 1]]')
deep = copy.deepcopy({'k': [1, 2, {'z': Pair(1, 2)}]})
pt = Point(1)
pt.y = 4
moved = dataclasses.replace(pt, x=7)
m = Memo(double)
rows = sorted([(2, 'b'), (1, 'a')], key=operator.itemgetter(0))
mine = {}
operator.setitem(mine, 'k', operator.getitem([5, 6], 1))
operator.delitem(mine, 'k')
counts = collections.Counter(response.split())
seen = []
for key, value in sorted(counts.items()):
    seen.append(key + '=' + str(value))
total = 0
for a, (b, c) in [(1, (2, 3))]:
    total = a + b + c
return {'score': 0.5, 'details': {
    'json': data, 'pairs': pairs, 'deep': [deep['k'][2]['z'].a, deep['k'][0]],
    'double': [double(3), m.call(5), m.calls],
    'fib': fib(20), 'point': dataclasses.asdict(moved), 'frozen': Frozen(1).a,
    'empty': dataclasses.is_dataclass(Empty()),
    'version': Version(1) <= Version(2), 'shade': [s.name for s in Shade], 'area': Area(2, 3).big,
    'color': Color.RED.value, 'level': int(Level.HIGH), 'pair': list(Pair(1, 2)),
    'typed': Typed(3).a, 'rows': rows, 'template': string.Template('$who!').substitute(who='you'),
    'reduce': functools.reduce(operator.add, [1, 2, 3]), 'partial': functools.partial(double, 4)(),
    'words': seen, 'loop': total, 'mine': mine,
}}
"""


async def test_legit_idioms(sb) -> None:
    verdict, _ = await sb.run(CodeBundle(LEGIT_PRELUDE + _fn(LEGIT_BODY)), "p", "b a b", {}, timeout=LIMITS.timeout_s)
    assert verdict.score == 0.5
    assert verdict.details == {
        "json": {"a": {"b": 1, "seen": True}, "seen": True},
        "pairs": [["k", 1]],
        "deep": [1, 1],
        "double": [6, 10, 1],
        "fib": 6765,
        "point": {"x": 7, "y": 4},
        "frozen": 1,
        "empty": True,
        "version": True,
        "shade": ["DARK", "LIGHT"],
        "area": 6,
        "color": 1,
        "level": 2,
        "pair": [1, 2],
        "typed": 3,
        "rows": [[1, "a"], [2, "b"]],
        "template": "you!",
        "reduce": 6,
        "partial": 8,
        "words": ["a=1", "b=2"],
        "loop": 6,
        "mine": {},
    }


# --------------------------------------------------------------------------- defence in depth (in process)


def _restrictions():
    """A Restrictions object without make_globals (which is meant for the single-use call child)."""
    from sandbox.agent.restrictions import SAFE_MODULES, Restrictions, SandboxViolation

    return Restrictions(SAFE_MODULES, frozenset()), SandboxViolation


INTERNALS = {
    "builtins_dict": vars(builtins),
    "module_globals": vars(json),
    "real_open": builtins.open,
    "real_eval": builtins.eval,
    "real_exec": builtins.exec,
    "real_compile": builtins.compile,
    "real_import": builtins.__import__,
    "real_getattr": builtins.getattr,
    "module_spec": json.__spec__,
    "source_loader": json.__loader__,
    "builtin_importer": importlib.machinery.BuiltinImporter,
    "metaclass": type,
    "globals_copy": dict(vars(json)),  # what the reported escape built: a dict holding the real __builtins__
}


@pytest.mark.parametrize("name", sorted(INTERNALS))
def test_guards_refuse_internals_as_values(name: str) -> None:
    r, violation = _restrictions()
    value = INTERNALS[name]

    class Holder:
        pass

    holder = Holder()
    holder.x = value
    with pytest.raises(violation):
        r.getitem({"k": value}, "k")
    with pytest.raises(violation):
        r.getattr(holder, "x")
    for container in ([value], (1, value), iter([value]), {"k": value}.values()):
        with pytest.raises(violation):
            list(r.getiter(container))
    assert r.violations


def test_class_with_evaluator_code_behind_a_hook_is_refused() -> None:
    """The backstop behind make_dataclass/enum/metaclass guards: any class the evaluator gets created."""
    r, violation = _restrictions()
    ns: dict = {}
    exec(compile("def hook(self, *args):\n    return None\n", "<evaluator>", "exec"), ns)
    for wrap in (lambda f: f, classmethod, staticmethod):
        with pytest.raises(violation):
            r.check_class(type("Planted", (), {"__reduce_ex__": wrap(ns["hook"])}))
    base = type("Base", (), {"__set_name__": ns["hook"]})
    with pytest.raises(violation):
        r.check_class(type("Child", (base,), {}))
    library_hook = type("Lib", (), {"__reduce_ex__": json.loads, "__init__": ns["hook"]})
    assert r.check_class(library_hook) is library_hook  # library code behind a hook, evaluator code in __init__


def test_guards_pass_ordinary_values() -> None:
    r, _ = _restrictions()
    lookalike = {"__name__": "json", "x": 1}  # names a module but is not its globals
    for value in ([1], {"a": 1}, lookalike, "s", 3, None, len, str, json.loads):
        assert r.getitem({"k": value}, "k") is value
        assert list(r.getiter([value])) == [value]
    assert list(r.getiter("ab")) == ["a", "b"]
    assert list(r.getiter({"a": 1}.items())) == [("a", 1)]
    assert not r.violations


@pytest.mark.parametrize("dep", ["os", "ctypes", "subprocess", "orchestrator", "sandbox", "docker"])
async def test_declaring_a_stdlib_or_platform_module_as_a_dependency_does_not_unlock_it(sb, dep: str) -> None:
    """Declared dependencies become importable; the standard library's and the platform's own
    modules (which reach the host's files, the server's database and sockets) never do."""
    code = _fn(f"import {dep}\nreturn {{'score': 1.0, 'details': {{'got': str({dep})[:40]}}}}")
    await expect(sb, code, SandboxSecurityError, deps=(dep,), match="not allowed")
