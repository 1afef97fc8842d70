"""The process backend end to end with real subprocesses: benign evaluators, pools, lifecycle."""

from __future__ import annotations

import asyncio
import os
import re
from pathlib import Path

import pytest

from orchestrator.errors import EvaluatorCodeError, PoolExhaustedError, SandboxCodeError
from orchestrator.limits import PoolLimits, SandboxLimits
from sandbox.base import CodeBundle
from sandbox.process.backend import ProcessSandbox, import_names

GUIDE = Path(__file__).resolve().parents[3] / "shared" / "spec" / "policy-dsl-guide.md"
LIMITS = SandboxLimits(timeout_s=10.0)


def guide_profanity_code() -> str:
    """The guide's custom_profanity_filter code, verbatim (dedented from its YAML block)."""
    text = GUIDE.read_text() if GUIDE.exists() else ""
    m = re.search(r'name: "custom_profanity_filter".*?code: \|\n(.*?)```', text, re.S)
    if m is None:
        pytest.skip("policy DSL guide not available")
    lines = m.group(1).splitlines()
    indent = min(len(line) - len(line.lstrip()) for line in lines if line.strip())
    return "\n".join(line[indent:] for line in lines) + "\n"


@pytest.fixture
async def sb():
    s = ProcessSandbox(LIMITS)
    yield s
    await s.aclose()


async def test_guide_profanity_filter(sb) -> None:
    bundle = CodeBundle(guide_profanity_code(), ("nltk", "textblob"))
    await sb.prepare(bundle)
    clean, _ = await sb.run(bundle, "hi", "a perfectly nice answer", {}, timeout=5)
    assert clean.score == 1.0 and clean.passed is True and clean.violations == []
    assert clean.details == {"checked_words": 2, "found_violations": 0}
    one, _ = await sb.run(bundle, "hi", "this has BadWord1 in it", {}, timeout=5)
    assert one.score == pytest.approx(0.8) and one.passed is False and one.violations == ["badword1"]
    both, _ = await sb.run(bundle, "hi", "badword1 badword2", {}, timeout=5)
    assert both.score == pytest.approx(0.6) and both.violations == ["badword1", "badword2"]
    assert both.details["found_violations"] == 2


async def test_context_passed_through(sb) -> None:
    code = (
        "def evaluate(prompt, response, context):\n"
        "    return {'score': 1.0, 'details': {'ctx': context, 'p': prompt}}\n"
    )
    ctx = {"user": {"id": "u1", "roles": ["admin"]}, "n": 3, "unicode": "héllo ✓"}
    v, _ = await sb.run(CodeBundle(code), "the prompt", "r", ctx, timeout=5)
    assert v.details == {"ctx": ctx, "p": "the prompt"}


async def test_state_does_not_leak_between_calls(sb) -> None:
    code = (
        "SEEN = []\n"
        "COUNTER = {'n': 0}\n"
        "def evaluate(prompt, response, context):\n"
        "    SEEN.append(response)\n"
        "    COUNTER['n'] = COUNTER['n'] + 1\n"
        "    return {'score': 1.0, 'details': {'seen': list(SEEN), 'n': COUNTER['n']}}\n"
    )
    bundle = CodeBundle(code)
    for i in range(4):
        v, _ = await sb.run(bundle, "p", f"r{i}", {}, timeout=5)
        assert v.details == {"seen": [f"r{i}"], "n": 1}


async def test_prints_are_diagnostics_only(sb) -> None:
    code = "def evaluate(prompt, response, context):\n    print('debug', len(response))\n    return {'score': 0.5}\n"
    v, diag = await sb.run(CodeBundle(code), "p", "abc", {}, timeout=5)
    assert v.score == 0.5 and diag.stdout == "debug 3\n" and not diag.truncated


async def test_whitelisted_stdlib_modules(sb) -> None:
    code = (
        "import json, math, statistics, collections, hashlib, unicodedata, datetime\n"
        "from collections.abc import Mapping\n"
        "from dataclasses import make_dataclass\n"
        "Hit = make_dataclass('Hit', ['word'])\n"
        "def evaluate(prompt, response, context):\n"
        "    words = response.split()\n"
        "    c = collections.Counter(words)\n"
        "    h = hashlib.sha256(response.encode()).hexdigest()\n"
        "    d = datetime.datetime.strptime('2024-01-02', '%Y-%m-%d').year\n"
        "    hits = [Hit(w).word for w in words if w.isupper()]\n"
        "    total = 0\n"
        "    for word, n in c.items():\n"
        "        total += n\n"
        "    return {'score': min(1.0, math.sqrt(statistics.mean([1, 1]))), 'violations': hits,\n"
        "            'details': {'n': total, 'h': h[:8], 'year': d, 'm': isinstance({}, Mapping),\n"
        "                        'j': json.dumps({'a': 1})}}\n"
    )
    v, _ = await sb.run(CodeBundle(code), "p", "a B a", {}, timeout=5)
    assert v.score == 1.0 and v.violations == ["B"] and v.details["n"] == 3 and v.details["year"] == 2024
    assert v.details["m"] is True and v.details["j"] == '{"a": 1}'


async def test_load_error_is_typed_and_cached(sb) -> None:
    bundle = CodeBundle("def nope(a, b, c):\n    return {}\n")
    with pytest.raises(EvaluatorCodeError):
        await sb.run(bundle, "p", "r", {}, timeout=5)
    with pytest.raises(EvaluatorCodeError):
        await sb.run(bundle, "p", "r", {}, timeout=5)
    with pytest.raises(EvaluatorCodeError):
        await sb.prepare(bundle)


async def test_module_body_error_is_code_error(sb) -> None:
    code = "raise ValueError('at import')\ndef evaluate(p, r, c):\n    return {'score': 1}\n"
    with pytest.raises(SandboxCodeError, match="at import"):
        await sb.run(CodeBundle(code), "p", "r", {}, timeout=5)


async def test_concurrent_calls_spawn_extra_agents_up_to_bound() -> None:
    box = ProcessSandbox(LIMITS, pool_limits=PoolLimits(min_size=1, max_size=2, queue_wait_s=10))
    code = (
        "def evaluate(prompt, response, context):\n"
        "    n = 0\n"
        "    for i in range(300000):\n"
        "        n += i\n"
        "    return {'score': 1.0, 'details': {'r': response}}\n"
    )
    bundle = CodeBundle(code)
    try:
        await box.prepare(bundle)
        results = await asyncio.gather(*(box.run(bundle, "p", str(i), {}, timeout=10) for i in range(6)))
        assert sorted(v.details["r"] for v, _ in results) == [str(i) for i in range(6)]
        assert box.info()["agents"] <= 2
    finally:
        await box.aclose()


async def test_pool_exhausted_when_queue_wait_runs_out() -> None:
    box = ProcessSandbox(LIMITS, pool_limits=PoolLimits(min_size=1, max_size=1, queue_wait_s=0.2))
    slow = CodeBundle(
        "def evaluate(p, r, c):\n    n = 0\n    while n < 10 ** 8:\n        n += 1\n    return {'score': 1}\n"
    )
    try:
        await box.prepare(slow)
        first = asyncio.ensure_future(box.run(slow, "p", "r", {}, timeout=3))
        await asyncio.sleep(0.05)
        with pytest.raises(PoolExhaustedError):
            await box.run(slow, "p", "r", {}, timeout=3)
        first.cancel()
        await asyncio.gather(first, return_exceptions=True)
    finally:
        await box.aclose()


async def test_lru_of_warm_bundles_and_aclose_kills_everything() -> None:
    box = ProcessSandbox(LIMITS, max_bundles=2)
    bundles = [CodeBundle(f"def evaluate(p, r, c):\n    return {{'score': 0.{i}}}\n") for i in range(1, 4)]
    for b in bundles:
        _v, _ = await box.run(b, "p", "r", {}, timeout=5)
    assert box.info()["warm_bundles"] == 2
    agents = list(box._agents)
    pids = [a.proc.pid for a in agents]
    dirs = [a.workdir for a in agents]
    await box.aclose()
    for pid in pids:
        assert not _alive(pid)
    assert not any(os.path.exists(d) for d in dirs)


async def test_info_is_honest(sb) -> None:
    info = sb.info()
    assert info["backend"] == "process" and "weaker" in info["isolation"] and info["restricted"] is True
    await sb.run(CodeBundle("def evaluate(p, r, c):\n    return {'score': 1}\n"), "p", "r", {}, timeout=5)
    assert isinstance(sb.info()["netns"], bool)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def test_import_names() -> None:
    assert import_names(["nltk>=3.9", "textblob", "scikit-learn==1.5", "PyYAML", "python-dateutil<3"]) == [
        "nltk",
        "textblob",
        "sklearn",
        "yaml",
        "dateutil",
    ]


async def test_idle_pools_are_closed() -> None:
    box = ProcessSandbox(LIMITS, pool_limits=PoolLimits(idle_timeout_s=0.0))
    first = CodeBundle("def evaluate(p, r, c):\n    return {'score': 0.1}\n")
    second = CodeBundle("def evaluate(p, r, c):\n    return {'score': 0.2}\n")
    try:
        await box.run(first, "p", "r", {}, timeout=5)
        await asyncio.sleep(0.01)
        v, _ = await box.run(second, "p", "r", {}, timeout=5)  # sweeps the idle first pool
        assert v.score == 0.2 and box.info()["warm_bundles"] == 1
    finally:
        await box.aclose()


async def test_classes_defined_by_the_evaluator_can_hold_state(sb) -> None:
    code = (
        "class Counter:\n"
        "    def __init__(self):\n"
        "        self.n = 0\n"
        "    def add(self, k):\n"
        "        self.n = self.n + k\n"
        "        return self\n"
        "def evaluate(prompt, response, context):\n"
        "    c = Counter().add(2).add(3)\n"
        "    from collections import Counter as C, defaultdict\n"
        "    words = C()\n"
        "    words['a'] = words['a'] + 1\n"
        "    dd = defaultdict(list)\n"
        "    dd['k'].append(1)\n"
        "    dd['j'] = [2]\n"
        "    setattr(c, 'tag', 'ok')\n"
        "    return {'score': 1.0, 'details': {'n': c.n, 'tag': c.tag, 'a': words['a'], 'dd': dict(dd)}}\n"
    )
    v, _ = await sb.run(CodeBundle(code), "p", "r", {}, timeout=5)
    assert v.details == {"n": 5, "tag": "ok", "a": 1, "dd": {"k": [1], "j": [2]}}
