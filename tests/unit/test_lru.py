"""The one bounded-map mechanism (cachetools) and its users' eviction hooks: what an LRU drops for
room is released (clients closed, evaluators closed, load times forgotten), capacity holds, and
the result cache's entries expire on an injected clock."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import grpc
import pytest

from crossaudit.kernel.errors import ConfigurationError
from crossaudit.kernel.limits import EngineLimits
from crossaudit.kernel.lru import EvictingLRU
from crossaudit.kernel.results import Verdict
from crossaudit.modelserver.builtins.base import ModelRuntime
from crossaudit.proxy import guard as guard_module
from crossaudit.proxy.config import build
from crossaudit.proxy.guard import Guard
from orchestrator.engine.cache import ResultCache
from orchestrator.engine.engine import Engine
from orchestrator.evaluators.base import EvaluationInput, Evaluator
from orchestrator.policy import load_policy
from orchestrator.secrets import SecretGrant

# -- EvictingLRU -----------------------------------------------------------------------------


def test_evicting_lru_reports_the_least_recently_used_and_keeps_its_capacity() -> None:
    evicted: list[tuple[str, int]] = []
    lru: EvictingLRU[str, int] = EvictingLRU(2, lambda k, v: evicted.append((k, v)))
    lru["a"], lru["b"] = 1, 2
    assert lru.get("a") == 1  # "b" is now the least recently used
    lru["c"] = 3
    assert evicted == [("b", 2)] and sorted(lru) == ["a", "c"] and len(lru) == 2
    lru["a"] = 10  # replacing a key evicts nothing
    assert evicted == [("b", 2)] and lru["a"] == 10


def test_evicting_lru_explicit_removals_peek_and_drain_are_not_evictions() -> None:
    evicted: list[str] = []
    lru: EvictingLRU[str, int] = EvictingLRU(2, lambda k, _v: evicted.append(k))
    lru["a"], lru["b"] = 1, 2
    assert sorted(lru.peek()) == [("a", 1), ("b", 2)]  # peek leaves "a" least recently used
    lru["c"] = 3
    assert evicted == ["a"]
    assert lru.pop("b") == 2 and evicted == ["a"]
    assert lru.drain() == [3] and len(lru) == 0 and evicted == ["a"]


def test_evicting_lru_holds_at_least_one() -> None:
    evicted: list[str] = []
    lru: EvictingLRU[str, int] = EvictingLRU(0, lambda k, _v: evicted.append(k))
    lru["a"], lru["b"] = 1, 2
    assert list(lru) == ["b"] and evicted == ["a"]


# -- the result cache ------------------------------------------------------------------------


def test_result_cache_entries_expire_on_the_injected_clock() -> None:
    now = [100.0]
    cache = ResultCache(10, clock=lambda: now[0])
    cache.put("short", Verdict(score=0.1), ttl=5)
    cache.put("long", Verdict(score=0.2), ttl=60)
    cache.put("never", Verdict(score=0.3), ttl=0)  # no ttl: not cached
    assert cache.get("short") == Verdict(score=0.1) and len(cache) == 2
    now[0] += 5  # an entry is gone at its expiry, not after
    assert cache.get("short") is None and cache.get("never") is None
    assert cache.get("long") == Verdict(score=0.2) and len(cache) == 1
    assert (cache.hits, cache.misses) == (2, 2)


def test_result_cache_evicts_the_least_recently_used_beyond_its_size() -> None:
    cache = ResultCache(2, clock=lambda: 0.0)
    cache.put("a", Verdict(score=0.1), ttl=60)
    cache.put("b", Verdict(score=0.2), ttl=60)
    assert cache.get("a") is not None
    cache.put("c", Verdict(score=0.3), ttl=60)
    assert cache.get("b") is None and cache.get("a") is not None and cache.get("c") is not None
    assert len(cache) == 2


# -- the engine's built evaluators ------------------------------------------------------------


class Closing(Evaluator):
    kind = "custom"

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.closed = False

    async def evaluate(self, inp: EvaluationInput, *, timeout: float) -> Verdict:
        return Verdict(score=1.0)

    async def aclose(self) -> None:
        self.closed = True


class Factory:
    def __init__(self) -> None:
        self.built: list[Closing] = []

    def build(self, spec: Any, policy: Any) -> Evaluator:
        self.built.append(Closing(spec.name))
        return self.built[-1]


def _policy(rule: str) -> Any:
    return load_policy(
        'name: T\ndescription: d\nversion: "1.0"\nevaluators:\n'
        "  - name: a\n    type: custom\n    config: {code: 'def evaluate(p, r, c): return {}'}\n"
        f"rules:\n- {{name: {rule}, evaluator: a}}\n"
    )


async def test_an_evaluator_evicted_from_the_engine_is_closed() -> None:
    factory = Factory()
    engine = Engine(factory, limits=EngineLimits(evaluator_instances=2))
    for version in range(3):  # three policy versions: the first one's evaluator is evicted
        decision = await engine.evaluate(_policy(f"r{version}"), "p", "r", {})
        assert decision.rule(f"r{version}").score == 1.0
    await asyncio.gather(*engine._closing)
    assert [ev.closed for ev in factory.built] == [True, False, False]
    await engine.aclose()
    assert all(ev.closed for ev in factory.built)


# -- the guard proxy's clients ---------------------------------------------------------------


async def test_a_client_evicted_from_the_guard_is_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(guard_module, "MAX_CLIENTS", 2)
    config = build(None, upstream="http://127.0.0.1:9/v1", dev=True)
    assert config.dev_caller is not None
    guard = Guard(config)
    clients = []
    for i in range(3):
        monkeypatch.setenv(f"LRU_TEST_KEY_{i}", f"key-{i}")
        caller = dataclasses.replace(config.dev_caller, crossaudit_key=SecretGrant("k", env=f"LRU_TEST_KEY_{i}"))
        clients.append(guard._client(caller))
    for _ in range(5):  # the close runs as a task
        await asyncio.sleep(0)
    states = [c._channel.get_state() for c in clients]
    assert states[0] is grpc.ChannelConnectivity.SHUTDOWN
    assert grpc.ChannelConnectivity.SHUTDOWN not in states[1:]
    await guard.aclose()
    assert all(c._channel.get_state() is grpc.ChannelConnectivity.SHUTDOWN for c in clients)


# -- a model server's loaded models ----------------------------------------------------------


class Loading(ModelRuntime):
    kind = "langdetect"

    def __init__(self) -> None:
        super().__init__(max_loaded=2)
        self.loads: list[str] = []

    def _key(self, cfg: Any) -> tuple[str, ...]:
        return (cfg,)

    def _load(self, cfg: Any) -> Any:
        if cfg == "broken":
            raise ConfigurationError("no such model")
        self.loads.append(cfg)
        return f"model {cfg}"

    def _analyze(self, model: Any, cfg: Any, text: str) -> Verdict:
        return Verdict(score=0.0)


def test_a_model_evicted_from_a_runtime_is_dropped_with_its_load_time() -> None:
    rt = Loading()
    assert rt.model_for("a") == "model a" and rt.model_for("b") == "model b"
    assert rt.model_for("a") == "model a"  # "b" is now the least recently used
    rt.model_for("c")
    assert set(rt.load_ms) == {("a",), ("c",)}
    assert rt.model_for("a") == "model a" and rt.loads == ["a", "b", "c"]  # still loaded
    rt.model_for("b")  # loaded again; "c" goes
    assert rt.loads == ["a", "b", "c", "b"] and set(rt.load_ms) == {("a",), ("b",)}
    with pytest.raises(ConfigurationError):
        rt.model_for("broken")
    assert set(rt.load_ms) == {("a",), ("b",)}
