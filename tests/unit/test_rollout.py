"""Shadow and canary candidates below the server: the store's contract on both backends, the
bounded shadow queue (full: dropped and counted, never waited for), sampling and stickiness, and
the canary's bounds. The same behaviour through a real server: tests/e2e/test_rollout.py."""

from __future__ import annotations

import asyncio
import dataclasses
import math
from typing import Any

import pytest

from crossaudit.api.models import RevisionCounts
from crossaudit.api.records import CandidateMode, CandidateRecord, CandidateState, ShadowDiffRecord
from crossaudit.governance.rollout import canary_routes, sampled
from crossaudit.kernel.errors import CandidateStateError, InvalidInputError, NotFoundError
from crossaudit.kernel.results import Decision
from crossaudit.service.config import RolloutLimits
from tests.records import audit_record
from tests.unit.test_service_core import POLICY, ScriptedEngine, service

ENV = "production"
POLICY_V2 = POLICY.replace('version: "1.0"', 'version: "2.0"')


@pytest.fixture
def store(any_store):  # both backends (tests/conftest.py)
    return any_store


async def start(store: Any, tenant: str = "t1", content: str = "b", **kw: Any) -> CandidateRecord:
    options: dict[str, Any] = {"mode": CandidateMode.SHADOW, "share": 1.0, **kw}
    _, cand, _ = await store.start_candidate(
        tenant, name="p", declared_version="2", description="", content=content, environment=ENV, **options
    )
    return cand


def diff(
    cand: CandidateRecord, decision_id: str, *, live: bool, candidate: bool, rule_flipped: bool
) -> ShadowDiffRecord:
    return ShadowDiffRecord(
        tenant=cand.tenant,
        candidate_id=cand.id,
        decision_id=decision_id,
        created_at=float(decision_id[-1]) if decision_id[-1].isdigit() else 0.0,
        live_passed=live,
        live_action="allow" if live else "block",
        candidate_passed=candidate,
        candidate_action="allow" if candidate else "block",
        rules=[{"rule": "r", "flipped": rule_flipped}],
        changed=live != candidate,
    )


async def test_one_running_candidate_per_policy_and_environment(store: Any) -> None:
    with pytest.raises(NotFoundError):  # nothing active to try it beside
        await start(store)
    await store.deploy_policy("t1", name="p", declared_version="1", description="", content="a", environment=ENV)
    with pytest.raises(CandidateStateError):  # the active version itself
        await start(store, content="a")
    cand = await start(store)
    assert (cand.version, cand.active_version, cand.state) == (2, 1, CandidateState.RUNNING)
    with pytest.raises(CandidateStateError):
        await start(store, content="c", mode=CandidateMode.CANARY, canary_key="user")
    assert (await store.get_deployed_policy("t1", "p", ENV)).version == 1  # stored, not active
    # another tenant sees nothing of it
    with pytest.raises(NotFoundError):
        await store.get_candidate("t2", "p", ENV)
    assert await store.running_candidate("t2", "p", ENV) is None
    with pytest.raises(CandidateStateError):
        await store.end_candidate("t2", "p", ENV, state=CandidateState.DISCARDED)
    assert await store.shadow_rule_flips("t2", cand.id) == {}
    ended, dep = await store.end_candidate("t1", "p", ENV, state=CandidateState.DISCARDED, reason="no")
    assert (ended.state, ended.reason, dep) == (CandidateState.DISCARDED, "no", None)
    assert (await store.get_candidate("t1", "p", ENV)).state is CandidateState.DISCARDED  # the last one
    again = await start(store, content="c")  # a new one may start once it ended
    assert again.version == 3


async def test_shadow_totals_flips_and_the_diff_cap(store: Any) -> None:
    await store.deploy_policy("t1", name="p", declared_version="1", description="", content="a", environment=ENV)
    cand = await start(store)
    cases = [(True, False, True), (False, True, True), (True, True, False)]
    first = [diff(cand, f"d{i}", live=live, candidate=new, rule_flipped=f) for i, (live, new, f) in enumerate(cases)]
    await store.record_shadow_diffs(first, dropped={cand.id: ("t1", 3)}, max_diffs=2)
    errored = ShadowDiffRecord("t1", cand.id, "e", 9.0, True, "allow", True, "", [], error="boom", changed=True)
    await store.record_shadow_diffs([errored], max_diffs=10)
    await store.record_shadow_diffs([], dropped={cand.id: ("t1", 4)}, max_diffs=10)
    # another tenant cannot add to it, even knowing its id
    await store.record_shadow_diffs(
        [dataclasses.replace(errored, tenant="t2")], dropped={cand.id: ("t2", 9)}, max_diffs=10
    )
    got = await store.get_candidate("t1", "p", ENV)
    totals = (got.evaluated, got.agreed, got.pass_to_fail, got.fail_to_pass, got.action_changes, got.errors)
    assert totals == (4, 1, 1, 1, 2, 1)
    assert (got.dropped, got.diffs_stored) == (3 + 4, 3)  # the third diff was past the cap of 2
    assert await store.shadow_rule_flips("t1", cand.id) == {"r": 2}
    # changed ones, most recent first (d2 agreed, and was past the cap anyway)
    assert [d.decision_id for d in await store.list_shadow_diffs("t1", cand.id)] == ["e", "d1", "d0"]
    assert await store.list_shadow_diffs("t2", cand.id) == []
    await store.end_candidate("t1", "p", ENV, state=CandidateState.PROMOTED)
    late = diff(cand, "late", live=True, candidate=False, rule_flipped=True)
    await store.record_shadow_diffs([late], max_diffs=10)  # ended: nothing written
    assert (await store.get_candidate("t1", "p", ENV)).evaluated == 4


async def test_promote_deploys_and_a_deploy_supersedes_while_rollback_skips_candidates(store: Any) -> None:
    await store.deploy_policy("t1", name="p", declared_version="1", description="", content="a", environment=ENV)
    await start(store)
    cand, dep = await store.end_candidate("t1", "p", ENV, state=CandidateState.PROMOTED, reason="promoted")
    assert dep is not None and dep.version == 2 and cand.state is CandidateState.PROMOTED
    assert (await store.get_deployed_policy("t1", "p", ENV)).version == 2
    await start(store, content="c")  # v3 beside v2
    await store.deploy_policy("t1", name="p", declared_version="4", description="", content="d", environment=ENV)
    superseded = await store.get_candidate("t1", "p", ENV)
    assert superseded.state is CandidateState.DISCARDED and superseded.reason == "superseded by a deploy to v4"
    kinds = [(h.kind, h.version) for h in await store.list_history("t1", "p", ENV)]
    assert kinds == [("deploy", 4), ("discard", 3), ("shadow", 3), ("promote", 2), ("shadow", 2), ("deploy", 1)]
    dep, previous = await store.rollback_policy("t1", "p", ENV)
    assert (dep.version, previous) == (2, 4)  # v3 never was active: rollback goes to v2


async def test_revision_counts_come_from_the_audit_log(store: Any) -> None:
    for i, (rev, errored, action) in enumerate([(1, [], "allow"), (2, ["r"], "block"), (2, [], "allow")]):
        rec = audit_record(f"d{i}", policy_revision=rev, errored_rules=errored, action=action)
        await store.record_decision(rec, [])
    assert await store.revision_counts("t1", "p", ENV, 0.0, [1, 2]) == {1: (1, 0, 0), 2: (2, 1, 1)}
    assert await store.revision_counts("t2", "p", ENV, 0.0, [1, 2]) == {}


class GatedEngine(ScriptedEngine):
    """Decides at once for the active version; the candidate's (v2.0) evaluations wait for ``gate``."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()

    async def evaluate(self, policy: Any, *args: Any, **kw: Any) -> Decision:
        if policy.version == "2.0":
            await self.gate.wait()
        return await super().evaluate(policy, *args, **kw)


async def test_a_full_shadow_queue_drops_and_counts_never_waits(tmp_path: Any) -> None:
    from crossaudit.store import SQLiteStore

    store = SQLiteStore(tmp_path / "db.sqlite")
    engine = GatedEngine()
    svc = service(store, engine, rollout_limits=RolloutLimits(shadow_queue_size=1, shadow_workers=1))
    try:
        await svc.deploy_policy("t1", POLICY)
        await svc.deploy_candidate("t1", POLICY_V2, mode="shadow", share=1.0)
        # The worker takes the first sample and waits on the gate, the queue holds the second,
        # the other two are dropped: every answer comes back meanwhile.
        outs = [await svc.evaluate("t1", policy="p", prompt="", response=f"r{i}") for i in range(4)]
        assert all(o.revision == 1 and o.decision.passed for o in outs)
        assert svc.rollout.queued() == 1
        report = await svc.shadow_report("t1", "p")
        assert (
            report.candidate.dropped == 2 and report.candidate.evaluated == 0
        )  # this process's count, not yet written
        engine.gate.set()
        await svc.rollout.drain()
        got = (await svc.shadow_report("t1", "p")).candidate
        assert (got.evaluated, got.agreed, got.dropped) == (2, 2, 2)
        metric = svc.metrics.registry.get_sample_value
        assert metric("crossaudit_shadow_samples_total", {"tenant": "t1", "outcome": "dropped"}) == 2
        assert metric("crossaudit_shadow_samples_total", {"tenant": "t1", "outcome": "evaluated"}) == 2
    finally:
        await svc.aclose()
        await store.aclose()


async def test_candidate_inputs_are_checked(tmp_path: Any) -> None:
    from crossaudit.store import SQLiteStore

    store = SQLiteStore(tmp_path / "db.sqlite")
    svc = service(store, ScriptedEngine())
    try:
        await svc.deploy_policy("t1", POLICY)
        for kw, words in [
            ({"mode": "blue", "share": 0.1}, "shadow' or 'canary"),
            ({"mode": "shadow", "share": 0.0}, "--sample"),
            ({"mode": "shadow", "share": math.nan}, "--sample"),
            ({"mode": "canary", "share": 1.5, "canary_key": "u"}, "--canary"),
            ({"mode": "canary", "share": 0.1}, "--canary-key"),
            ({"mode": "shadow", "share": 0.1, "notify_url": "http://127.0.0.1:1/x"}, "--notify is for a canary"),
            ({"mode": "canary", "share": 0.1, "canary_key": "u", "notify_url": "http://127.0.0.1:1/x"}, "allowlist"),
        ]:
            with pytest.raises(InvalidInputError, match=words):
                await svc.deploy_candidate("t1", POLICY_V2, **kw)
        with pytest.raises(NotFoundError):
            await svc.shadow_report("t1", "p")
    finally:
        await svc.aclose()
        await store.aclose()


def cand(**kw: Any) -> CandidateRecord:
    base: dict[str, Any] = dict(
        id="c", tenant="t", name="p", environment=ENV, mode=CandidateMode.CANARY, version=2, active_version=1,
        share=0.2, canary_key="user", notify_url="", bounds={}, state=CandidateState.RUNNING, started_at=0.0,
    )  # fmt: skip
    return CandidateRecord(**{**base, **kw})


def test_canary_share_is_sticky_and_close_to_its_fraction() -> None:
    c = cand()
    picks = [canary_routes(c, {"user": f"u{i}"}) for i in range(5_000)]
    assert picks == [canary_routes(c, {"user": f"u{i}", "other": 1}) for i in range(5_000)]  # the key alone decides
    assert 0.17 < sum(picks) / len(picks) < 0.23
    assert not canary_routes(c, {}) and not canary_routes(c, None) and not canary_routes(c, {"user": None})
    other = [canary_routes(cand(version=3), {"user": f"u{i}"}) for i in range(5_000)]
    assert other != picks  # a new candidate version draws a new share
    assert [sampled(f"d{i}", 0.1) for i in range(100)] == [sampled(f"d{i}", 0.1) for i in range(100)]
    assert 300 < sum(sampled(f"d{i}", 0.1) for i in range(5_000)) < 700


def test_canary_bounds_after_the_minimum(tmp_path: Any) -> None:
    from crossaudit.store import SQLiteStore

    store = SQLiteStore(tmp_path / "db.sqlite")
    svc = service(store, ScriptedEngine())
    r = svc.rollout
    bounds = {"canary_min_decisions": 10, "canary_max_error_rate_increase": 0.05, "canary_max_block_rate_increase": 0.1}
    c = cand(bounds=bounds)
    assert r.verdict(c, RevisionCounts(9, 9, 9), RevisionCounts(100, 0, 0)) == ""  # below the minimum
    assert r.verdict(c, RevisionCounts(20, 1, 2), RevisionCounts(100, 0, 0)) == ""  # 5% and 10%: within
    assert "evaluator-error rate 10.0%" in r.verdict(c, RevisionCounts(20, 2, 0), RevisionCounts(100, 0, 0))
    assert "block rate 15.0%" in r.verdict(c, RevisionCounts(20, 0, 3), RevisionCounts(100, 0, 0))
    assert r.verdict(c, RevisionCounts(20, 0, 3), RevisionCounts(100, 0, 10)) == ""  # the active blocks as much
    asyncio.run(store.aclose())


def test_cli_candidate_flags() -> None:
    import argparse

    from crossaudit.cli.rollout import candidate_kwargs, parse_share

    assert parse_share("5%", "--canary") == 0.05 and parse_share("0.05", "--canary") == 0.05
    assert parse_share("100%", "--canary") == 1.0
    for bad in ("0%", "5", "101%", "nan", "x%", "-1%"):
        with pytest.raises(InvalidInputError, match="--canary"):
            parse_share(bad, "--canary")

    def flags(**kw: Any) -> argparse.Namespace:
        return argparse.Namespace(
            **{"shadow": False, "canary": None, "sample": None, "canary_key": "", "notify": "", **kw}
        )

    assert candidate_kwargs(flags()) == {}
    assert candidate_kwargs(flags(shadow=True)) == {"shadow": 0.1}
    assert candidate_kwargs(flags(shadow=True, sample=0.5)) == {"shadow": 0.5}
    got = candidate_kwargs(flags(canary="5%", canary_key="user_id", notify="https://h/x"))
    assert got == {"canary": 0.05, "canary_key": "user_id", "notify": "https://h/x"}
    for bad, words in [
        (flags(canary="5%"), "--canary-key"),
        (flags(canary="5%", canary_key="u", sample=0.1), "--sample is for --shadow"),
        (flags(sample=0.1), "--sample is an option of --shadow"),
        (flags(shadow=True, canary_key="u"), "options of --canary"),
    ]:
        with pytest.raises(InvalidInputError, match=words):
            candidate_kwargs(bad)


async def test_a_sample_over_the_queue_byte_bound_is_dropped(tmp_path: Any) -> None:
    from crossaudit.store import SQLiteStore

    store = SQLiteStore(tmp_path / "db.sqlite")
    limits = RolloutLimits(shadow_queue_bytes=4_096)
    svc = service(store, ScriptedEngine(), rollout_limits=limits)
    try:
        await svc.deploy_policy("t1", POLICY)
        await svc.deploy_candidate("t1", POLICY_V2, mode="shadow", share=1.0)
        big = await svc.evaluate("t1", policy="p", prompt="", response="x" * 5_000)
        small = await svc.evaluate("t1", policy="p", prompt="", response="short")
        assert big.decision.passed and small.decision.passed  # both answered all the same
        await svc.rollout.drain()
        got = (await svc.shadow_report("t1", "p")).candidate
        assert (got.evaluated, got.dropped) == (1, 1)
    finally:
        await svc.aclose()
        await store.aclose()


# --- a shadow reuses the live decision's verdicts (docs/rollout.md, "Its own engine") -------------

REUSE_POLICY = """
name: p
description: d
version: "{version}"
evaluators:
  - name: tox
    type: custom
    config: {{code: "def evaluate(p, r, c): return {{}}{tox_tail}", rate_limit: 600}}
  - name: judge
    type: llm
    config: {{provider: openai, model: gpt-4o-mini, system_prompt: "Rate the response"}}
rules:
  - {{name: toxicity, evaluator: tox, threshold: {threshold}, action: block}}
  - {{name: judged, evaluator: judge, threshold: 0.2, action: warn}}
"""


def reuse_policy(version: str, threshold: float = 0.5, tox_tail: str = "") -> str:
    return REUSE_POLICY.format(version=version, threshold=threshold, tox_tail=tox_tail)


class Buckets:
    """The store's own rate_limit buckets (what replicas share), with the keys they were taken from."""

    def __init__(self, store: Any) -> None:
        from crossaudit.service.ratelimits import store_limiters

        self.real = store_limiters(store)
        self.taken: list[str] = []

    def __call__(self, key: str, per_minute: float, burst: int | None, name: str) -> Any:
        bucket = self.real(key, per_minute, burst, name)
        taken = self.taken

        class Recorded:
            async def acquire(self, deadline_s: float) -> float:
                taken.append(key)
                return await bucket.acquire(deadline_s)

        return Recorded()


class Counting:
    """One engine's evaluators (tests/unit/test_replay_engine.py's Counted: real evaluators that
    count their calls, the score is the response text) and the bucket keys it took tokens from."""

    def __init__(self, store: Any) -> None:
        from tests.unit.test_replay_engine import Factory

        self.factory = Factory()
        self.buckets = Buckets(store)

    @property
    def calls(self) -> dict[str, int]:
        return self.factory.calls


def counting_service(store: Any, failing: frozenset[str] = frozenset(), **kw: Any) -> tuple[Any, list[Counting]]:
    """A service whose tenants get real engines, each with its own Counting, in the order the
    service creates them: the tenant's live engine first, its shadow engine when the first sample
    is evaluated."""
    from crossaudit.service.core import CrossAuditService
    from orchestrator.engine.engine import Engine

    engines: list[Counting] = []

    def provider(tenant: str, uploads: Any, feedback: Any) -> Engine:
        counting = Counting(store)
        counting.factory.failing = failing
        engines.append(counting)
        return Engine(counting.factory, scope=tenant, feedback=feedback, limiters=counting.buckets)

    return CrossAuditService(store, provider, **kw), engines


async def shadow_run(store: Any, candidate: str, responses: list[str]) -> tuple[Counting, list[Any], Any, Counting]:
    """(the live engine's counts, the answers, the report, the shadow engine's counts)."""
    svc, engines = counting_service(store)
    try:
        await svc.deploy_policy("t1", reuse_policy("1.0"))
        await svc.deploy_candidate("t1", candidate, mode="shadow", share=1.0)
        outs = [await svc.evaluate("t1", policy="p", prompt="", response=r) for r in responses]
        await svc.rollout.drain()
        report = await svc.shadow_report("t1", "p")
    finally:
        await svc.aclose()
    assert len(engines) == 2  # the live engine, the shadow engine
    return engines[0], outs, report, engines[1]


async def test_a_threshold_only_shadow_calls_no_evaluator_and_shows_the_flips(store: Any) -> None:
    responses = ["0.1", "0.6", "0.65", "0.9"]  # the live threshold is 0.5, the candidate's 0.7
    live, outs, report, shadow = await shadow_run(store, reuse_policy("2.0", threshold=0.7), responses)
    assert live.calls == {"tox": 4, "judge": 4}
    assert shadow.calls == {}  # neither the custom evaluator nor the LLM judge was called again
    assert shadow.buckets.taken == []  # nor a rate-limit token taken
    assert live.buckets.taken == ["t1/p/tox"] * 4  # the live answers' own
    cand = report.candidate
    assert (cand.evaluated, cand.errors, cand.pass_to_fail, cand.fail_to_pass) == (4, 0, 2, 0)
    assert report.rule_flips == {"toxicity": 2}
    flipped = {s.decision_id: s.rules[0] for s in report.samples}
    expected = {o.decision.decision_id for o, r in zip(outs, responses, strict=True) if r in ("0.6", "0.65")}
    assert set(flipped) == expected
    assert all(r["live_score"] == r["candidate_score"] and r["candidate_status"] == "fail" for r in flipped.values())


async def test_a_shadow_calls_only_the_evaluator_whose_code_changed_in_buckets_of_its_own(store: Any) -> None:
    responses = ["0.1", "0.9", "0.3"]
    changed = reuse_policy("2.0", tox_tail="  # v2")  # tox's code (so its identity) changes, the judge's not
    live, outs, report, shadow = await shadow_run(store, changed, responses)
    # 'judged' is reached once ("0.9"; the others block first): the live judge's verdict is reused.
    assert shadow.calls == {"tox": len(responses)}
    # The shadow's tokens come from buckets of its own: never the live answers' ones.
    assert shadow.buckets.taken == ["t1/shadow/p/tox"] * len(responses)
    assert live.buckets.taken == ["t1/p/tox"] * len(responses)
    assert (report.candidate.evaluated, report.candidate.agreed, report.candidate.errors) == (3, 3, 0)
    assert [o.decision.passed for o in outs] == [False, True, False]  # the live answers, untouched


async def test_a_shadow_whose_new_evaluator_errors_records_it_as_live_would(store: Any) -> None:
    # Only the candidate's new evaluator fails its calls.
    svc, engines = counting_service(store, failing=frozenset({"tox2"}))
    candidate = (
        reuse_policy("2.0").replace("name: tox\n", "name: tox2\n").replace("evaluator: tox,", "evaluator: tox2,")
    )
    try:
        await svc.deploy_policy("t1", reuse_policy("1.0"))
        await svc.deploy_candidate("t1", candidate, mode="shadow", share=1.0)
        assert (await svc.evaluate("t1", policy="p", prompt="", response="0.9")).decision.passed
        await svc.rollout.drain()
        got = await svc.shadow_report("t1", "p")
    finally:
        await svc.aclose()
    # As on the live path, the rule without a verdict fails closed (its action), where a replay
    # would call the decision not replayable: the diff shows the flip and the error status.
    assert (got.candidate.evaluated, got.candidate.pass_to_fail) == (1, 1)
    assert got.samples[0].rules[0]["candidate_status"] == "error"
    assert [e.calls for e in engines] == [{"tox": 1, "judge": 1}, {"tox2": 1}]  # the judge's live verdict reused


async def test_the_recorded_results_count_in_the_queue_byte_bound(tmp_path: Any) -> None:
    from crossaudit.governance.rollout import recorded_results, results_bytes, sample_bytes
    from crossaudit.kernel.results import EvaluatorResult, RuleResult, Status

    big = EvaluatorResult(evaluator="e", kind="custom", status=Status.PASS, score=1.0, details={"x": "y" * 5_000})
    rules = [
        RuleResult(
            rule="r", status=Status.PASS, passed=True, score=1.0, evaluators=[big.model_copy(update={"identity": "i"})]
        ),
        RuleResult(
            rule="s", status=Status.PASS, passed=True, score=1.0, evaluators=[big]
        ),  # no identity: never matched
    ]
    decision = Decision(policy="p", policy_version="1", passed=True, action="allow", rules=rules)
    recorded = recorded_results(decision)
    assert list(recorded) == ["i"]
    assert results_bytes(recorded) > 5_000 > sample_bytes("", "short", None)
