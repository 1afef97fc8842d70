"""Hostile evaluators against the process backend (real subprocesses).

Every program must end in the right typed error, stopped by its deadline at the latest (never
held until it chose to stop), and the next benign evaluation on the same backend must still
succeed. Where the class is the point (a memory limit, not a kill at the deadline), the deadline
has room for a loaded machine to reach it; programs that only a deadline stops get a short one. Restricted mode is what
the process backend runs; ``raw`` (restricted=False) exercises the rlimit/kill layer alone,
which is also what the Docker backend relies on inside its containers.
"""

from __future__ import annotations

import asyncio
import os
import time

import pytest

from crossaudit.kernel.errors import (
    CrossAuditError,
    EvaluatorTimeoutError,
    ResultInvalidError,
    SandboxCodeError,
    SandboxCrashedError,
    SandboxLimitError,
    SandboxSecurityError,
)
from crossaudit.kernel.limits import SandboxLimits
from sandbox.base import CodeBundle
from sandbox.process.backend import ProcessSandbox
from sandbox.procfs import alive as _alive

pytestmark = pytest.mark.security

# The deadline of programs whose error class is the point: each ends by itself well inside a second
# when idle, with room for a loaded machine (a timeout would say nothing of the limit under test).
ROOM_S = 20.0
# Past its deadline, a call comes back once its process tree is killed. Generous: only a call held
# until the program chose to stop (sleep 60, forever) must fail this, not a busy machine.
STOP_SLACK_S = 30.0
LIMITS = SandboxLimits(
    timeout_s=ROOM_S,
    cpu_s=5,
    memory_bytes=128 * 1024 * 1024,
    pids=16,
    output_bytes=16 * 1024,
    result_bytes=64 * 1024,
    result_max_depth=16,
)
BENIGN = CodeBundle("def evaluate(prompt, response, context):\n    return {'score': 0.75, 'violations': []}\n")


@pytest.fixture
async def sb():
    s = ProcessSandbox(LIMITS)
    yield s
    await s.aclose()


@pytest.fixture
async def raw():
    s = ProcessSandbox(LIMITS, restricted=False)
    yield s
    await s.aclose()


def _fn(body: str) -> str:
    lines = "\n".join("    " + line for line in body.strip("\n").splitlines())
    return f"def evaluate(prompt, response, context):\n{lines}\n"


async def expect(
    box: ProcessSandbox,
    code: str,
    cls: type[CrossAuditError],
    *,
    timeout: float = ROOM_S,
    deps: tuple[str, ...] = (),
    limit: str | None = None,
    match: str | None = None,
) -> CrossAuditError:
    bundle = CodeBundle(code, deps)
    err: CrossAuditError | None = None
    try:
        await box.prepare(bundle)  # compile-time refusals surface here
    except CrossAuditError as exc:
        err = exc
    start = time.monotonic()
    with pytest.raises(CrossAuditError) as info:
        await box.run(bundle, "prompt", "response", {"k": 1}, timeout=timeout)
    elapsed = time.monotonic() - start
    assert type(info.value) is cls, f"{type(info.value).__name__}: {info.value}"
    if err is not None:
        assert type(err) is cls
    assert elapsed < timeout + STOP_SLACK_S, f"took {elapsed:.2f}s for a {timeout}s deadline"
    if limit is not None:
        assert getattr(info.value, "limit", None) == limit
    if match is not None:
        assert match in str(info.value)
    # ... and the backend still serves the next benign call.
    verdict, _ = await box.run(BENIGN, "p", "r", {}, timeout=LIMITS.timeout_s)
    assert verdict.score == 0.75
    return info.value


# --------------------------------------------------------------------------- time


async def test_infinite_loop_is_killed_at_deadline(sb) -> None:
    await expect(sb, _fn("while True:\n    pass"), EvaluatorTimeoutError, timeout=1.0)


async def test_infinite_loop_in_module_body(sb) -> None:
    code = "x = 0\nwhile True:\n    x += 1\n" + _fn("return {'score': 1}")
    await expect(sb, code, EvaluatorTimeoutError, timeout=1.0)


async def test_sleep_past_deadline_raw(raw) -> None:
    await expect(raw, _fn("import time\ntime.sleep(60)\nreturn {'score': 1}"), EvaluatorTimeoutError, timeout=1.0)


async def test_sleep_is_not_importable_restricted(sb) -> None:
    await expect(sb, _fn("import time\ntime.sleep(60)"), SandboxSecurityError)


async def test_timeout_replaces_agent_and_leaves_no_process(raw) -> None:
    code = _fn("import os, time\nfor _ in range(3):\n    os.fork()\ntime.sleep(60)")
    bundle = CodeBundle(code)
    await raw.prepare(bundle)
    pids = {a.proc.pid for a in raw._agents}
    workdirs = {a.workdir for a in raw._agents}
    with pytest.raises(EvaluatorTimeoutError):
        await raw.run(bundle, "p", "r", {}, timeout=1.0)
    await raw.run(BENIGN, "p", "r", {}, timeout=ROOM_S)
    deadline = time.monotonic() + 30  # bounded; the loop stays free for the backend's own reaping
    while time.monotonic() < deadline and (any(_alive(p) for p in pids) or _processes_in(workdirs)):
        await asyncio.sleep(0.05)
    assert not any(_alive(p) for p in pids)
    assert not _processes_in(workdirs)  # the forked grandchildren (cwd = the agent's dir) are gone too


def _processes_in(dirs: set[str]) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cwd = os.readlink(f"/proc/{entry}/cwd").removesuffix(" (deleted)")
                if cwd in dirs and _alive(int(entry)):
                    found.append(int(entry))
            except OSError:
                continue
    return found


# --------------------------------------------------------------------------- resources


async def test_memory_bomb(sb) -> None:
    await expect(sb, _fn("x = 'a' * (2 ** 31)\nreturn {'score': 1}"), SandboxLimitError, limit="memory")


async def test_memory_bomb_list_growth(sb) -> None:
    code = _fn("x = []\nfor i in range(10 ** 9):\n    x.append([i] * 1000)\nreturn {'score': 1}")
    await expect(sb, code, SandboxLimitError, limit="memory")


async def test_memory_bomb_raw(raw) -> None:
    await expect(raw, _fn("b = bytearray(2 ** 31)\nreturn {'score': 1}"), SandboxLimitError, limit="memory")


async def test_fork_bomb_restricted_cannot_import_os(sb) -> None:
    await expect(sb, _fn("import os\nwhile True:\n    os.fork()"), SandboxSecurityError)


async def test_fork_bomb_raw_hits_process_limit(raw) -> None:
    await expect(raw, _fn("import os\nwhile True:\n    os.fork()"), SandboxLimitError, limit="pids")


async def test_cpu_limit_raw(raw) -> None:
    box = ProcessSandbox(SandboxLimits(timeout_s=ROOM_S, cpu_s=1), restricted=False)
    try:  # 1 s of CPU comes well before the deadline, however many share the core
        await expect(box, _fn("while True:\n    pass"), SandboxLimitError, limit="cpu")
    finally:
        await box.aclose()


async def test_file_size_limit_raw(raw) -> None:
    code = _fn("with open('big', 'wb') as fh:\n    fh.write(b'x' * (8 * 1024 * 1024))\nreturn {'score': 1}")
    await expect(raw, code, SandboxLimitError, limit="file_bytes")


async def test_huge_stdout(sb) -> None:
    await expect(sb, _fn("print('x' * 10 ** 6)\nreturn {'score': 1}"), SandboxLimitError, limit="output_bytes")


async def test_endless_stdout(sb) -> None:
    await expect(sb, _fn("while True:\n    print('spam' * 100)"), SandboxLimitError, limit="output_bytes")


async def test_huge_stderr_raw(raw) -> None:
    code = _fn("import sys\nsys.stderr.write('e' * 10 ** 6)\nreturn {'score': 1}")
    await expect(raw, code, SandboxLimitError, limit="output_bytes")


# --------------------------------------------------------------------------- results


async def test_huge_return_value(sb) -> None:
    code = _fn("return {'score': 1.0, 'details': {'blob': 'a' * (4 * 1024 * 1024)}}")
    await expect(sb, code, SandboxLimitError, limit="result_bytes")


async def test_non_json_return(sb) -> None:
    await expect(sb, _fn("return {'score': 1.0, 'details': {'s': {1, 2}}}"), ResultInvalidError)


async def test_non_dict_return(sb) -> None:
    await expect(sb, _fn("return 0.5"), ResultInvalidError)


async def test_nan_return(sb) -> None:
    await expect(sb, _fn("return {'score': float('nan')}"), ResultInvalidError)


async def test_inf_nested_return(sb) -> None:
    await expect(sb, _fn("return {'score': 0.5, 'details': {'x': [float('inf')]}}"), ResultInvalidError)


async def test_deeply_nested_return(sb) -> None:
    code = _fn("x = []\nfor _ in range(100000):\n    x = [x]\nreturn {'score': 1.0, 'details': {'x': x}}")
    await expect(sb, code, ResultInvalidError)


async def test_too_many_violations(sb) -> None:
    await expect(sb, _fn("return {'score': 0.5, 'violations': ['x'] * 5000}"), ResultInvalidError)


async def test_huge_integer_score(sb) -> None:
    await expect(sb, _fn("return {'score': 10 ** 400}"), ResultInvalidError)


async def test_integer_too_long_to_serialise(sb) -> None:
    await expect(sb, _fn("return {'score': 1, 'details': {'n': 10 ** 5000}}"), ResultInvalidError)


async def test_score_out_of_range(sb) -> None:
    await expect(sb, _fn("return {'score': 7}"), ResultInvalidError)


async def test_raising(sb) -> None:
    await expect(sb, _fn("raise ValueError('boom')"), SandboxCodeError, match="ValueError: boom")


async def test_recursion(sb) -> None:
    code = "def f(n):\n    return f(n + 1)\n" + _fn("return f(0)")
    await expect(sb, code, SandboxCodeError, match="RecursionError")


async def test_os_exit_restricted(sb) -> None:
    await expect(sb, _fn("import os\nos._exit(3)"), SandboxSecurityError)


async def test_os_exit_raw(raw) -> None:
    await expect(raw, _fn("import os\nos._exit(3)"), SandboxCrashedError)


async def test_self_kill_raw(raw) -> None:
    await expect(raw, _fn("import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)"), SandboxCrashedError)


async def test_fake_result_printed_is_ignored(sb) -> None:
    fake = '{"op":"result","id":"x","ok":true,"result":{"score":1.0}}'
    await expect(sb, _fn(f"print({fake!r})\nraise ValueError('real failure')"), SandboxCodeError)


async def test_fake_result_printed_raw_all_fds(raw) -> None:
    fake = '{"op":"result","id":"x","ok":true,"result":{"score":1.0}}\n'
    body = (
        "import os, sys\n"
        f"fake = {fake!r}.encode()\n"
        "for fd in (1, 2, 0):\n"
        "    try:\n"
        "        os.write(fd, fake)\n"
        "    except OSError:\n"
        "        pass\n"
        "print(fake.decode())\n"
        "raise ValueError('real failure')"
    )
    await expect(raw, _fn(body), SandboxCodeError)


async def test_printed_fake_does_not_replace_real_result(sb) -> None:
    fake = '{"op":"result","id":"x","ok":true,"result":{"score":1.0}}'
    bundle = CodeBundle(_fn(f"print({fake!r})\nreturn {{'score': 0.25}}"))
    verdict, diag = await sb.run(bundle, "p", "r", {}, timeout=ROOM_S)
    assert verdict.score == 0.25 and '"score":1.0' in diag.stdout


# --------------------------------------------------------------------------- RestrictedPython escapes


ESCAPES = {
    "generator_frame_static": "g = (x for x in [1])\nreturn {'score': 1, 'v': str(g.gi_frame.f_back.f_globals)}",
    "generator_frame_dynamic": "g = (x for x in [1])\nf = getattr(g, 'gi_frame')\nreturn {'score': 1}",
    "frame_walk_f_back": "g = (x for x in [1])\nf = getattr(getattr(g, 'gi_frame'), 'f_back')\nreturn {'score': 1}",
    "str_format_attr": "x = 1\ns = '{0.__class__.__mro__}'.format(x)\nreturn {'score': 1, 'v': s}",
    "str_format_map": "s = '{a.__class__}'.format_map({'a': 1})\nreturn {'score': 1}",
    "str_format_unbound": "f = getattr(str, 'format')\nreturn {'score': 1, 'v': f('{0.__class__}', 1)}",
    "string_formatter": "import string\nreturn {'score': 1, 'v': string.Formatter().format('{0.__class__}', 1)}",
    "subclasses": "return {'score': 1, 'v': str(().__class__.__bases__[0].__subclasses__())}",
    "subclasses_dynamic": "c = getattr((), '__class__')\nreturn {'score': 1}",
    "mro": "return {'score': 1, 'v': str(type(1).mro())}",
    "type_of_class": "t = type(type(1))\nreturn {'score': 1}",
    "type_three_args": "X = type('X', (), {'y': 1})\nreturn {'score': 1}",
    "dunder_import": "os = __import__('os')\nreturn {'score': 1}",
    "import_os": "import os\nreturn {'score': 1, 'v': os.getcwd()}",
    "import_subprocess": "import subprocess\nreturn {'score': 1}",
    "import_builtins": "import builtins\nreturn {'score': 1}",
    "relative_import": "from . import x\nreturn {'score': 1}",
    "open_passwd": "return {'score': 1, 'v': open('/etc/passwd').read()}",
    "eval_call": "return {'score': eval('1')}",
    "exec_call": "exec('x = 1')\nreturn {'score': 1}",
    "getattr_globals": "f = getattr(evaluate, '__globals__')\nreturn {'score': 1}",
    "globals_builtin": "g = globals()\nreturn {'score': 1}",
    "function_globals_static": "return {'score': 1, 'v': str(evaluate.__globals__)}",
    "traceback_frame": "try:\n    1 / 0\nexcept Exception as e:\n    f = e.__traceback__\nreturn {'score': 1}",
    "module_submodule_attr": "import collections\nx = collections.abc\nreturn {'score': 1}",
    "module_private_attr": "import random\nx = getattr(random, '_os')\nreturn {'score': 1}",
    "module_os_via_stdlib": "import dataclasses\nx = dataclasses.sys\nreturn {'score': 1}",
    "operator_attrgetter": "import operator\nf = operator.attrgetter('__globals__')\nreturn {'score': 1}",
    "typing_get_type_hints": "import typing\nf = typing.get_type_hints\nreturn {'score': 1}",
    "singledispatch": "import functools\nf = functools.singledispatch\nreturn {'score': 1}",
    "module_write": "import math\nmath.pi = 3\nreturn {'score': 1}",
    "caught_violation_still_reported": "try:\n    import os\nexcept Exception:\n    pass\nreturn {'score': 1}",
    "hasattr_private": "ok = hasattr(evaluate, '__code__')\nreturn {'score': 1}",
    "posonly_param_shadows_guard": "def f(_getattr_, /):\n    return _getattr_\nreturn {'score': 1}",
    "dunder_built_at_runtime": "d = getattr(type(1), '_' + '_dict_' + '_')\nreturn {'score': 1}",
    "setattr_builtin_on_module": "import json\nsetattr(json, 'dumps', None)\nreturn {'score': 1}",
    "setattr_dunder_on_own_class": "class A:\n    pass\nsetattr(A(), '__class__', int)\nreturn {'score': 1}",
    "write_attr_on_library_object": "import json\nd = json.JSONDecoder()\nd.parse_float = None\nreturn {'score': 1}",
    "match_class_attribute_walk": (
        "F = type(evaluate)\nmatch evaluate:\n    case F(__globals__=g):\n        return g\nreturn {'score': 1}"
    ),
    "async_def": "async def f():\n    return 1\nreturn {'score': 1}",
    "print_file_kw": "print('x', file=None)\nx = getattr(print, '__self__')\nreturn {'score': 1}",
}


@pytest.mark.parametrize("name", sorted(ESCAPES))
async def test_restricted_escape(sb, name: str) -> None:
    await expect(sb, _fn(ESCAPES[name]), SandboxSecurityError)


DEP_ESCAPES = {
    "nltk_os_attr": "import nltk\nnltk.os.system('id')\nreturn {'score': 1}",
    "nltk_sys_attr": "import nltk\nx = nltk.sys.modules\nreturn {'score': 1}",
    "nltk_subprocess_from": "from nltk import subprocess\nreturn {'score': 1}",
    "nltk_submodule_attr": "import nltk.internals\nx = nltk.internals\nreturn {'score': 1}",
    "textblob_submodule_os": "from textblob import blob\nreturn {'score': 1}",
    "textblob_private": "import textblob\nx = getattr(textblob, '_text')\nreturn {'score': 1}",
    "undeclared_dependency": "import langdetect\nreturn {'score': 1}",
    "stdlib_not_whitelisted": "import pickle\nreturn {'score': 1}",
}


@pytest.mark.parametrize("name", sorted(DEP_ESCAPES))
async def test_dependency_module_escape(sb, name: str) -> None:
    await expect(sb, _fn(DEP_ESCAPES[name]), SandboxSecurityError, deps=("nltk>=3.9", "textblob"))


async def test_declared_but_missing_dependency_is_an_import_error(sb) -> None:
    code = _fn("import not_installed_pkg_xyz\nreturn {'score': 1}")
    await expect(sb, code, SandboxCodeError, deps=("not-installed-pkg-xyz",), match="No module named")


async def test_declared_dependency_public_api_works(sb) -> None:
    code = "from textblob import TextBlob\n" + _fn(
        "s = TextBlob(response).sentiment\nreturn {'score': (s.polarity + 1) / 2, 'details': {'p': s.polarity}}"
    )
    verdict, _ = await sb.run(CodeBundle(code, ("textblob",)), "p", "I love this, it is great", {}, timeout=ROOM_S)
    assert verdict.score > 0.5


async def test_host_environment_is_not_visible(raw) -> None:
    os.environ["CROSSAUDIT_TEST_SECRET"] = "s3cret"
    try:
        code = _fn("import os\nreturn {'score': 1.0, 'details': {'env': dict(os.environ)}}")
        verdict, _ = await raw.run(CodeBundle(code), "p", "r", {}, timeout=ROOM_S)
    finally:
        del os.environ["CROSSAUDIT_TEST_SECRET"]
    assert "CROSSAUDIT_TEST_SECRET" not in verdict.details["env"]


async def test_drops_root_and_network_when_possible(raw) -> None:
    code = _fn(
        "import os\n"
        "with open('/proc/net/dev') as fh:\n"
        "    ifs = [line.split(':')[0].strip() for line in fh.read().splitlines()[2:]]\n"
        "return {'score': 1.0, 'details': {'uid': os.getuid(), 'ifs': ifs}}"
    )
    verdict, diag = await raw.run(CodeBundle(code), "p", "r", {}, timeout=ROOM_S)
    if os.geteuid() == 0:
        assert verdict.details["uid"] != 0
    if raw.info()["netns"]:
        assert verdict.details["ifs"] == ["lo"]  # a fresh namespace: loopback only
    assert diag.extra["isolation"]["netns"] == raw.info()["netns"]


async def test_daemonised_grandchild_is_reaped_after_a_normal_call(raw) -> None:
    code = _fn(
        "import os, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        "        time.sleep(60)\n"
        "    os._exit(0)\n"
        "return {'score': 0.5}"
    )
    bundle = CodeBundle(code)
    await raw.prepare(bundle)
    workdirs = {a.workdir for a in raw._agents}
    verdict, _ = await raw.run(bundle, "p", "r", {}, timeout=ROOM_S)
    assert verdict.score == 0.5
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and len(_processes_in(workdirs)) > 3:  # agent, its I/O process, next child
        time.sleep(0.05)
    assert len(_processes_in(workdirs)) <= 3
