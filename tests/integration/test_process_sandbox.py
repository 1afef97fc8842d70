"""The process backend end to end with real subprocesses: benign evaluators, pools, lifecycle."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from crossaudit.kernel.errors import EvaluatorCodeError, PoolExhaustedError, SandboxCodeError
from crossaudit.kernel.limits import PoolLimits, SandboxLimits
from sandbox.base import CodeBundle
from sandbox.process.backend import ProcessSandbox, import_names
from sandbox.procfs import alive as _alive

# The guide's examples live verbatim in policies/guide/ (CI has no other copy of the guide).
GUIDE_EVALUATORS = Path(__file__).resolve().parents[2] / "policies" / "guide" / "03_evaluator_types.yaml"
# The deadline of calls that must succeed (or fail by their code): milliseconds when idle, an agent
# start on a loaded 2-core machine far more; a deadline is the subject of none of these tests.
ROOM_S = 60.0
LIMITS = SandboxLimits(timeout_s=ROOM_S)


def guide_profanity_code() -> str:
    """The guide's custom_profanity_filter code, verbatim (from its example policy file)."""
    from orchestrator.policy import load_policy_file

    spec = load_policy_file(GUIDE_EVALUATORS).evaluator("custom_profanity_filter")
    return spec.typed_config.code


@pytest.fixture
async def sb():
    s = ProcessSandbox(LIMITS)
    yield s
    await s.aclose()


async def test_guide_profanity_filter(sb) -> None:
    bundle = CodeBundle(guide_profanity_code(), ("nltk", "textblob"))
    await sb.prepare(bundle)
    clean, _ = await sb.run(bundle, "hi", "a perfectly nice answer", {}, timeout=ROOM_S)
    assert clean.score == 1.0 and clean.passed is True and clean.violations == []
    assert clean.details == {"checked_words": 2, "found_violations": 0}
    one, _ = await sb.run(bundle, "hi", "this has BadWord1 in it", {}, timeout=ROOM_S)
    assert one.score == pytest.approx(0.8) and one.passed is False and one.violations == ["badword1"]
    both, _ = await sb.run(bundle, "hi", "badword1 badword2", {}, timeout=ROOM_S)
    assert both.score == pytest.approx(0.6) and both.violations == ["badword1", "badword2"]
    assert both.details["found_violations"] == 2


async def test_context_passed_through(sb) -> None:
    code = (
        "def evaluate(prompt, response, context):\n"
        "    return {'score': 1.0, 'details': {'ctx': context, 'p': prompt}}\n"
    )
    ctx = {"user": {"id": "u1", "roles": ["admin"]}, "n": 3, "unicode": "héllo ✓"}
    v, _ = await sb.run(CodeBundle(code), "the prompt", "r", ctx, timeout=ROOM_S)
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
        v, _ = await sb.run(bundle, "p", f"r{i}", {}, timeout=ROOM_S)
        assert v.details == {"seen": [f"r{i}"], "n": 1}


async def test_prints_are_diagnostics_only(sb) -> None:
    code = "def evaluate(prompt, response, context):\n    print('debug', len(response))\n    return {'score': 0.5}\n"
    v, diag = await sb.run(CodeBundle(code), "p", "abc", {}, timeout=ROOM_S)
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
    v, _ = await sb.run(CodeBundle(code), "p", "a B a", {}, timeout=ROOM_S)
    assert v.score == 1.0 and v.violations == ["B"] and v.details["n"] == 3 and v.details["year"] == 2024
    assert v.details["m"] is True and v.details["j"] == '{"a": 1}'


async def test_load_error_is_typed_and_cached(sb) -> None:
    bundle = CodeBundle("def nope(a, b, c):\n    return {}\n")
    with pytest.raises(EvaluatorCodeError):
        await sb.run(bundle, "p", "r", {}, timeout=ROOM_S)
    with pytest.raises(EvaluatorCodeError):
        await sb.run(bundle, "p", "r", {}, timeout=ROOM_S)
    with pytest.raises(EvaluatorCodeError):
        await sb.prepare(bundle)


async def test_module_body_error_is_code_error(sb) -> None:
    code = "raise ValueError('at import')\ndef evaluate(p, r, c):\n    return {'score': 1}\n"
    with pytest.raises(SandboxCodeError, match="at import"):
        await sb.run(CodeBundle(code), "p", "r", {}, timeout=ROOM_S)


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
        results = await asyncio.gather(*(box.run(bundle, "p", str(i), {}, timeout=ROOM_S) for i in range(6)))
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
        first = asyncio.ensure_future(box.run(slow, "p", "r", {}, timeout=ROOM_S))
        for _ in range(1200):  # bounded: until the first call holds the only agent (was: a 0.05 s sleep)
            if dict(box._pools.peek())[slow.pool_key].stats()["busy"] >= 1:
                break
            await asyncio.sleep(0.05)
        with pytest.raises(PoolExhaustedError):  # the first computes for seconds: the queue wait runs out
            await box.run(slow, "p", "r", {}, timeout=ROOM_S)
        first.cancel()
        await asyncio.gather(first, return_exceptions=True)
    finally:
        await box.aclose()


async def test_lru_of_warm_bundles_and_aclose_kills_everything() -> None:
    box = ProcessSandbox(LIMITS, max_bundles=2)
    bundles = [CodeBundle(f"def evaluate(p, r, c):\n    return {{'score': 0.{i}}}\n") for i in range(1, 4)]
    for b in bundles:
        _v, _ = await box.run(b, "p", "r", {}, timeout=ROOM_S)
    assert box.info()["warm_bundles"] == 2
    agents = list(box._agents)
    pids = [a.proc.pid for a in agents]
    dirs = [a.workdir for a in agents]
    await box.aclose()
    for pid in pids:
        assert not _alive(pid)
    assert not any(os.path.exists(d) for d in dirs)


async def test_an_evicted_pool_is_closed_and_its_idle_agents_die() -> None:
    """max_bundles is the LRU's capacity: the least recently used pool is evicted and closed off
    the request path, its idle agents killed; the pool just used keeps its agents."""
    box = ProcessSandbox(LIMITS, pool_limits=PoolLimits(min_size=1), max_bundles=1)
    first = CodeBundle("def evaluate(p, r, c):\n    return {'score': 0.1}\n")
    second = CodeBundle("def evaluate(p, r, c):\n    return {'score': 0.2}\n")
    try:
        await box.run(first, "p", "r", {}, timeout=ROOM_S)
        [(_, evicted)] = box._pools.peek()
        first_pids = [a.proc.pid for a in box._agents]
        v, _ = await box.run(second, "p", "r", {}, timeout=ROOM_S)
        assert v.score == 0.2 and box.info()["warm_bundles"] == 1 and evicted.closed
        await asyncio.gather(*list(box._tasks))  # the eviction's close
        assert first_pids and not any(_alive(pid) for pid in first_pids)
        [(_, kept)] = box._pools.peek()
        assert kept is not evicted and not kept.closed
    finally:
        await box.aclose()


async def test_info_is_honest(sb) -> None:
    info = sb.info()
    assert info["backend"] == "process" and "weaker" in info["isolation"] and info["restricted"] is True
    await sb.run(CodeBundle("def evaluate(p, r, c):\n    return {'score': 1}\n"), "p", "r", {}, timeout=ROOM_S)
    assert isinstance(sb.info()["netns"], bool)


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
        await box.run(first, "p", "r", {}, timeout=ROOM_S)
        await asyncio.sleep(0.01)
        v, _ = await box.run(second, "p", "r", {}, timeout=ROOM_S)  # sweeps the idle first pool
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
    v, _ = await sb.run(CodeBundle(code), "p", "r", {}, timeout=ROOM_S)
    assert v.details == {"n": 5, "tag": "ok", "a": 1, "dd": {"k": [1], "j": [2]}}


# --------------------------------------------------------------------------- the agent's protocol, driven directly


class _AgentProc:
    """``python -I .../agent/launch.py`` with raw frame I/O (what both backends speak)."""

    def __init__(self) -> None:
        import subprocess
        import sys

        from sandbox.process.backend import AGENT_PATH

        self.proc = subprocess.Popen(
            [sys.executable, "-I", str(AGENT_PATH)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env={"PATH": "/usr/bin:/bin"},
        )

    def send(self, frame: dict | bytes) -> None:
        import json

        assert self.proc.stdin is not None
        data = frame if isinstance(frame, bytes) else (json.dumps(frame) + "\n").encode()
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def recv(self) -> dict:
        import json

        assert self.proc.stdout is not None
        return json.loads(self.proc.stdout.readline())

    def close(self) -> int:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        return self.proc.wait(timeout=10)


def _load(agent: _AgentProc, code: str, restricted: bool = True) -> dict:
    from sandbox.protocol import AgentChannel

    agent.send(AgentChannel.load_frame(code, restricted=restricted, limits=SandboxLimits(timeout_s=5)))
    return agent.recv()


def test_agent_protocol_frames() -> None:
    agent = _AgentProc()
    try:
        agent.send({"op": "call", "id": "early", "prompt": "p", "response": "r", "context": {}})
        early = agent.recv()
        assert early["id"] == "early" and early["ok"] is False and early["error"]["type"] == "load_error"
        agent.send(b"this is not json\n")
        assert agent.recv()["op"] == "error"
        agent.send({"op": "dance"})
        assert agent.recv()["op"] == "error"
        loaded = _load(agent, "def evaluate(p, r, c):\n    print('{\"op\": \"result\"}')\n    return {'score': 0.5}\n")
        assert loaded["op"] == "loaded" and loaded["ok"] is True and isinstance(loaded["pid"], int)
        assert set(loaded["isolation"]) >= {"netns", "uid_drop", "restricted"}
        for nonce in ("n1", "n2"):
            agent.send({"op": "call", "id": nonce, "prompt": "p", "response": "r", "context": {}})
            frame = agent.recv()
            assert frame["op"] == "result" and frame["id"] == nonce and frame["result"] == {"score": 0.5}
            assert frame["stdout"] == '{"op": "result"}\n'
        second = _load(agent, "def evaluate(p, r, c):\n    return {}\n")
        assert second["ok"] is False and second["error"]["type"] == "load_error"
    finally:
        assert agent.close() == 0


def test_agent_load_errors() -> None:
    for code, etype in (
        ("def evaluate(p, r, c)\n", "load_error"),
        ("def other(p, r, c):\n    pass\n", "load_error"),
        ("def evaluate(p, r, c):\n    return ().__class__\n", "security"),
    ):
        agent = _AgentProc()
        try:
            frame = _load(agent, code)
            assert frame["ok"] is False and frame["error"]["type"] == etype
        finally:
            agent.close()


def test_agent_unrestricted_runs_without_restrictedpython_semantics() -> None:
    agent = _AgentProc()
    try:
        code = (
            "import os\ndef evaluate(p, r, c):\n    return {'score': 1.0, 'pid_differs': os.getpid() != c['agent']}\n"
        )
        loaded = _load(agent, code, restricted=False)
        agent.send({"op": "call", "id": "x", "prompt": "p", "response": "r", "context": {"agent": loaded["pid"]}})
        frame = agent.recv()
        assert frame["ok"] is True and frame["result"]["pid_differs"] is True  # ran in a child, not the agent
    finally:
        agent.close()


def test_stale_workdirs_of_dead_orchestrators_are_removed(tmp_path, monkeypatch) -> None:
    import tempfile

    from sandbox.process.backend import WORKDIR_PREFIX, reap_stale_workdirs

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dead = tmp_path / f"{WORKDIR_PREFIX}999999999-abc"
    live = tmp_path / f"{WORKDIR_PREFIX}{os.getpid()}-abc"
    other = tmp_path / "unrelated-dir"
    for d in (dead, live, other):
        d.mkdir()
    assert reap_stale_workdirs() == 1
    assert not dead.exists() and live.exists() and other.exists()
