"""CrossAuditService behaviour with a scripted engine (the e2e tests use the real one)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from crossaudit.kernel.canonical import sha256_text
from crossaudit.kernel.errors import (
    DeadlineExceededError,
    DependencyRejectedError,
    EvaluatorCodeError,
    InvalidInputError,
    NotFoundError,
    PolicyValidationError,
    RateLimitedError,
)
from crossaudit.kernel.results import Action, ActionOutcome, Decision, RuleResult, Status
from crossaudit.service.config import ServiceLimits
from crossaudit.service.core import CrossAuditService
from crossaudit.service.tenants import TenantFeedback, UploadedEvaluators
from crossaudit.store import SQLiteStore
from orchestrator.engine.thresholds import FeedbackStats
from orchestrator.policy import Policy
from orchestrator.reviews import ReviewState

POLICY = """
name: p
description: d
version: "1.0"
evaluators:
  - name: e
    type: custom
    config:
      code: |
        def evaluate(prompt, response, context):
            return {"score": 1.0}
rules:
  - name: r1
    evaluator: e
    threshold: 0.5
    action: flag
  - name: r2
    evaluator: e
    threshold: 0.5
    action: require_review
"""
CODE = "def evaluate(prompt, response, context):\n    return {'score': 1.0}\n"


class ScriptedEngine:
    def __init__(self, *, delay: float = 0.0, fail: tuple[str, ...] = ()) -> None:
        self.delay = delay
        self.fail = fail
        self.timeouts: list[float | None] = []
        self.closed = False

    async def evaluate(
        self,
        policy: Policy,
        prompt: str,
        response: str,
        context: Mapping[str, Any] | None = None,
        *,
        timeout: float | None = None,
        decision_id: str | None = None,
        stage: str = "",
        replay: Any = None,  # scripted verdicts: nothing recorded to reuse
    ) -> Decision:
        self.timeouts.append(timeout)
        if self.delay:
            await asyncio.sleep(self.delay)
        rules = []
        for r in policy.rules:
            failed = r.name in self.fail
            rules.append(
                RuleResult(
                    rule=r.name,
                    status=Status.FAIL if failed else Status.PASS,
                    passed=not failed,
                    score=0.1 if failed else 1.0,
                    action=r.action if failed else None,
                    outcome=ActionOutcome(rule=r.name, action=r.action, params={"k": 1}) if failed else None,
                )
            )
        worst = max((r.action for r in rules if r.action), key=lambda a: a.severity, default=Action.ALLOW)
        return Decision(
            policy=policy.name,
            policy_version=policy.version,
            passed=not self.fail,
            action=worst,
            rules=rules,
            decision_id=decision_id or "",
        )

    async def aclose(self) -> None:
        self.closed = True


@pytest.fixture
async def store(tmp_path: Path):
    s = SQLiteStore(tmp_path / "db.sqlite")
    yield s
    await s.aclose()


def service(store: SQLiteStore, engine: ScriptedEngine, **kw: Any) -> CrossAuditService:
    seen: dict[str, UploadedEvaluators] = {}

    def provider(tenant: str, uploads: UploadedEvaluators, feedback: TenantFeedback) -> ScriptedEngine:
        seen[tenant] = uploads
        seen[tenant + ":feedback"] = feedback  # type: ignore[assignment]
        return engine

    svc = CrossAuditService(store, provider, **kw)
    svc.seen = seen  # type: ignore[attr-defined]
    return svc


async def test_decision_is_audited_with_hashes_and_creates_reviews(store: SQLiteStore) -> None:
    svc = service(store, ScriptedEngine(fail=("r1", "r2")))
    await svc.deploy_policy("t1", POLICY)
    out = await svc.evaluate("t1", policy="p", prompt="hello", response="secret text", context={"user": {"id": 1}})
    audit = await store.get_decision("t1", out.decision.decision_id)
    assert audit.prompt is None and audit.response is None
    assert audit.response_sha256 == sha256_text("secret text") and audit.policy_revision == 1
    assert [r["rule"] for r in audit.rules] == ["r1", "r2"]
    reviews = await store.list_reviews("t1", state=ReviewState.OPEN)
    assert sorted(r.kind.value for r in reviews) == ["flag", "require_review"]
    assert sorted(out.review_ids) == sorted(r.id for r in reviews)
    assert reviews[0].params == {"k": 1}


async def test_raw_text_is_audited_only_when_configured(store: SQLiteStore) -> None:
    svc = service(store, ScriptedEngine(), audit_raw_text=True)
    await svc.deploy_policy("t1", POLICY)
    out = await svc.evaluate("t1", policy="p", prompt="hello", response="world")
    audit = await store.get_decision("t1", out.decision.decision_id)
    assert (audit.prompt, audit.response) == ("hello", "world")


async def test_engine_gets_what_is_left_of_the_deadline(store: SQLiteStore) -> None:
    engine = ScriptedEngine()
    svc = service(store, engine, limits=ServiceLimits(default_deadline_s=7.0))
    await svc.deploy_policy("t1", POLICY)
    margin = ServiceLimits().answer_margin_s
    # Upper bounds: the answer's margin is held back. Lower bounds: less only what this very call
    # spent before the engine ran (the machine's time, measured, not assumed small).
    t0 = time.monotonic()
    await svc.evaluate("t1", policy="p", prompt="", response="", time_remaining=5.0)
    spent = time.monotonic() - t0
    assert 5.0 - margin - spent <= engine.timeouts[0] <= 5.0 - margin
    t0 = time.monotonic()
    await svc.evaluate("t1", policy="p", prompt="", response="")
    spent = time.monotonic() - t0
    assert 7.0 - spent <= engine.timeouts[1] <= 7.0  # no deadline: the default
    # A tight deadline keeps only a share back (the whole margin would leave none). Its arithmetic
    # alone: through the service, a loaded machine may spend all of 0.04 s before the engine runs.
    assert 0 < svc.admission.budget(0.04) <= 0.03
    with pytest.raises(DeadlineExceededError):
        await svc.evaluate("t1", policy="p", prompt="", response="", time_remaining=0.0)


async def test_an_engine_that_overruns_is_cut_at_the_deadline(store: SQLiteStore) -> None:
    # The engine would answer long after the test's own timeout: only the cut at the deadline
    # (DEADLINE_EXCEEDED, nothing audited) ends the call.
    svc = service(store, ScriptedEngine(delay=3600.0), limits=ServiceLimits(cutoff_margin_s=0.02))
    await svc.deploy_policy("t1", POLICY)
    with pytest.raises(DeadlineExceededError):
        await svc.evaluate("t1", policy="p", prompt="", response="", time_remaining=0.1)
    assert await store.count_decisions() == 0


async def test_concurrency_per_tenant_is_rate_limited(store: SQLiteStore) -> None:
    svc = service(store, ScriptedEngine(delay=0.2), limits=ServiceLimits(max_inflight_evaluations_per_tenant=1))
    await svc.deploy_policy("t1", POLICY)
    await svc.deploy_policy("t2", POLICY)
    first = asyncio.create_task(svc.evaluate("t1", policy="p", prompt="", response=""))
    await asyncio.sleep(0.05)
    with pytest.raises(RateLimitedError):
        await svc.evaluate("t1", policy="p", prompt="", response="")
    await svc.evaluate("t2", policy="p", prompt="", response="")  # another tenant is not affected
    await first


async def test_uploaded_evaluator_ids_are_per_tenant(store: SQLiteStore) -> None:
    svc = service(store, ScriptedEngine())
    rec, created = await svc.upload_evaluator("t1", name="scorer", code=CODE)
    assert created
    policy = f"""
name: uses
description: d
version: "1.0"
evaluators:
  - id: "{rec.id}"
    name: scorer
rules:
  - name: r
    evaluator: scorer
    threshold: 0.5
"""
    await svc.deploy_policy("t1", policy)
    await svc.evaluate("t1", policy="uses", prompt="", response="")
    assert svc.seen["t1"].by_id(rec.id).code == CODE  # type: ignore[attr-defined]
    with pytest.raises(PolicyValidationError) as err:
        await svc.deploy_policy("t2", policy)
    assert err.value.issues[0].path == "evaluators[0].id"


@pytest.mark.parametrize(
    ("kwargs", "exc"),
    [
        ({"name": "bad name", "code": CODE}, InvalidInputError),
        ({"name": "ok", "code": "def nope(:"}, EvaluatorCodeError),
        ({"name": "ok", "code": "def other(a, b, c):\n    return {}\n"}, EvaluatorCodeError),
        ({"name": "ok", "code": CODE, "dependencies": ["--index-url=x"]}, DependencyRejectedError),
        ({"name": "ok", "code": CODE, "language": "ruby"}, InvalidInputError),
    ],
)
async def test_uploads_are_validated_before_storing(store: SQLiteStore, kwargs: dict, exc: type) -> None:
    svc = service(store, ScriptedEngine())
    with pytest.raises(exc):
        await svc.upload_evaluator("t1", **kwargs)
    assert await store.list_evaluators("t1") == []


async def test_unknown_policy_and_environment_errors(store: SQLiteStore) -> None:
    svc = service(store, ScriptedEngine())
    with pytest.raises(NotFoundError):
        await svc.evaluate("t1", policy="p", prompt="", response="")
    with pytest.raises(InvalidInputError, match="environment"):
        await svc.deploy_policy("t1", POLICY, environment="Prod Env")


async def test_bootstrap_runs_once_and_reports_bad_files(store: SQLiteStore) -> None:
    svc = service(store, ScriptedEngine())
    files = [("good.yaml", POLICY), ("bad.yaml", "name: [\n")]
    problems = await svc.bootstrap(["a", "b"], files, "development")
    assert len(problems) == 2 and all("bad.yaml" in p for p in problems)
    assert [p.name for p in await store.list_policies("b", "development")] == ["p"]
    assert await svc.bootstrap(["a"], [("other.yaml", POLICY.replace("name: p", "name: q"))], "development") == []
    assert [p.name for p in await store.list_policies("a")] == ["p"]


async def test_rule_feedback_reaches_the_engine(store: SQLiteStore) -> None:
    svc = service(store, ScriptedEngine(fail=("r1",)))
    await svc.deploy_policy("t1", POLICY)
    out = await svc.evaluate("t1", policy="p", prompt="", response="")
    await svc.submit_feedback("t1", out.decision.decision_id, rule="r1", label="false_positive")
    await svc.submit_feedback("t1", out.decision.decision_id, label="correct")  # decision-level
    feedback = svc.seen["t1:feedback"]  # type: ignore[attr-defined]
    # the label carries the rule's recorded score (0.1) for calibration (docs/calibration.md)
    assert feedback("p", "r1") == FeedbackStats(total=1, false_positive=1, scores=((0.1, True),))
    fresh = service(store, ScriptedEngine())  # a restarted service loads the counts and the scores
    await fresh.evaluate("t1", policy="p", prompt="", response="")
    assert fresh.seen["t1:feedback"]("p", "r1") == feedback("p", "r1")  # type: ignore[attr-defined]


def test_escalated_and_overdue_are_computed_when_read() -> None:
    from crossaudit.api.convert import review_to_pb
    from crossaudit.api.records import ReviewRecord
    from orchestrator.reviews import ReviewKind

    rec = ReviewRecord(
        id="r",
        tenant="t",
        decision_id="d",
        policy="p",
        policy_revision=1,
        environment="production",
        rule="x",
        kind=ReviewKind.FLAG,
        state=ReviewState.OPEN,
        params={"escalate_at": "2020-01-01T00:00:00+00:00", "review_due_at": "2999-01-01T00:00:00+00:00"},
    )
    msg = review_to_pb(rec)
    assert msg.escalated and not msg.overdue
    import dataclasses

    assert not review_to_pb(dataclasses.replace(rec, state=ReviewState.DISMISSED)).escalated


class SlowPrepareSandbox:
    """A sandbox whose first prepare() holds until the test releases it (stands in for an image
    build); the others go through."""

    limits = None

    def __init__(self) -> None:
        from crossaudit.kernel.limits import SandboxLimits

        self.limits = SandboxLimits()
        self.prepared: list[str] = []
        self.building = asyncio.Event()  # the first prepare is under way
        self.release = asyncio.Event()  # and holds until this is set

    async def prepare(self, bundle: Any, progress: Any = None) -> None:
        if progress:
            progress("building", 0.5)
        if not self.building.is_set():
            self.building.set()
            await asyncio.wait_for(self.release.wait(), 60)  # bounded
        self.prepared.append(bundle.digest)

    def info(self) -> dict:
        return {}


async def test_uploads_are_prepared_and_limited_per_tenant(store: SQLiteStore) -> None:
    box = SlowPrepareSandbox()
    svc = service(store, ScriptedEngine(), sandbox=box, limits=ServiceLimits(max_concurrent_uploads_per_tenant=1))
    events: list[tuple[str, float]] = []
    first = asyncio.create_task(
        svc.upload_evaluator("t1", name="a", code=CODE, progress=lambda m, f: events.append((m, f)))
    )
    await asyncio.wait_for(box.building.wait(), 60)  # t1's one upload slot is held from here
    with pytest.raises(RateLimitedError, match="upload"):
        await svc.upload_evaluator("t1", name="b", code=CODE)
    other = await svc.upload_evaluator("t2", name="b", code=CODE)  # other tenants are not affected
    box.release.set()
    _rec, created = await first
    assert created and other[1] and events == [("building", 0.5)]
    assert len(box.prepared) == 2
    await svc.upload_evaluator("t1", name="c", code=CODE)  # the slot is free again


async def test_a_deploy_by_another_replica_applies_within_the_recheck_bound(tmp_path: Path) -> None:
    """Two services on one store (as two replicas on one database): B follows A's deploys and
    rollbacks once it re-reads, which it does every ``deployment_recheck_s``."""
    limits = ServiceLimits(deployment_recheck_s=0.3)
    store_a, store_b = SQLiteStore(tmp_path / "db.sqlite"), SQLiteStore(tmp_path / "db.sqlite")
    try:
        a = service(store_a, ScriptedEngine(), limits=limits)
        b = service(store_b, ScriptedEngine(), limits=limits)
        await a.deploy_policy("t1", POLICY)
        assert (await b.evaluate("t1", policy="p", prompt="", response="")).revision == 1
        await a.deploy_policy("t1", POLICY.replace('version: "1.0"', 'version: "2.0"'))
        for _ in range(200):  # bounded: converges once B re-reads (the bound itself is measured, not asserted)
            if (await b.evaluate("t1", policy="p", prompt="", response="")).revision == 2:
                break
            await asyncio.sleep(0.05)
        assert (await b.evaluate("t1", policy="p", prompt="", response="")).revision == 2
        await a.rollback_policy("t1", "p")
        await asyncio.sleep(limits.deployment_recheck_s)
        assert (await b.evaluate("t1", policy="p", prompt="", response="")).revision == 1
    finally:
        await store_a.aclose()
        await store_b.aclose()


class SlowToStopEngine(ScriptedEngine):
    """An engine whose cancelled work takes ``cleanup`` seconds to really stop, as a sandbox
    kill does; it counts the work running at once (cleanup included)."""

    def __init__(self, *, delay: float, cleanup: float) -> None:
        super().__init__(delay=delay)
        self.cleanup = cleanup
        self.running = 0
        self.peak = 0

    async def evaluate(self, policy: Policy, *args: Any, **kw: Any) -> Decision:
        self.running += 1
        self.peak = max(self.peak, self.running)
        try:
            return await super().evaluate(policy, *args, **kw)
        except asyncio.CancelledError:
            await asyncio.sleep(self.cleanup)  # stopping the work is not instant
            raise
        finally:
            self.running -= 1


async def test_the_inflight_cap_holds_while_cancelled_work_stops(store: SQLiteStore) -> None:
    """Exploit: a tenant sending very short deadlines (and hanging up) got its slots back while its
    cancelled work was still stopping, so more than the cap ran at once. A slot is now freed only
    when the work has stopped; the calls over the cap are refused (RESOURCE_EXHAUSTED)."""
    cap = 4
    # Deadlines long enough for a loaded machine to reach the engine within them (the exploit needs
    # work started, then cancelled); cleanup far longer, so the next waves meet work still stopping.
    engine = SlowToStopEngine(delay=3600.0, cleanup=2.0)
    svc = service(store, engine, limits=ServiceLimits(max_inflight_evaluations_per_tenant=cap))
    await svc.deploy_policy("t1", POLICY)
    outcomes: dict[str, int] = {}

    async def call(hang_up: bool) -> None:
        try:
            if hang_up:  # the client goes away before its deadline
                await asyncio.wait_for(svc.evaluate("t1", policy="p", prompt="", response=""), timeout=0.3)
            else:
                await svc.evaluate("t1", policy="p", prompt="", response="", time_remaining=0.4)
        except (DeadlineExceededError, RateLimitedError, TimeoutError) as exc:
            outcomes[type(exc).__name__] = outcomes.get(type(exc).__name__, 0) + 1

    deadline = time.monotonic() + 30
    for i in range(60):  # bounded: 60 waves of 8 calls, 30 s; until the cap was reached and defended
        if time.monotonic() > deadline or (i >= 3 and engine.peak == cap and outcomes.get("RateLimitedError")):
            break
        await asyncio.gather(*(call(hang_up=(i + j) % 2 == 0) for j in range(8)))
        assert engine.peak <= cap, f"{engine.peak} evaluations ran at once, over the cap of {cap}"
    for _ in range(1500):  # bounded (30 s): the cancelled work stops after its cleanup, then frees its slot
        if engine.running == 0 and svc.admission._inflight["t1"] == 0:
            break
        await asyncio.sleep(0.02)
    assert engine.peak == cap
    assert outcomes.get("RateLimitedError", 0) > 0
    assert svc.admission._inflight["t1"] == 0  # every slot came back once its work stopped
