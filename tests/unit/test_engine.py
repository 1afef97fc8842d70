"""Engine semantics with in-process evaluators (the runners are covered by integration tests).

Policies are real YAML; evaluators are small scripted Evaluator implementations so that
ordering, concurrency, retries, timeouts, caching and fallbacks can be observed exactly.
"""

from __future__ import annotations

import asyncio
import itertools
import textwrap
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from crossaudit.kernel.errors import EvaluatorUnavailableError, SandboxCodeError
from crossaudit.kernel.limits import EngineLimits
from crossaudit.kernel.results import Action, Status, Verdict
from orchestrator.engine.cache import ResultCache
from orchestrator.engine.engine import Engine, plan
from orchestrator.engine.thresholds import FeedbackStats
from orchestrator.evaluators.base import (
    PROVENANCE_MAX_KEYS,
    PROVENANCE_MAX_VALUE_CHARS,
    Called,
    EvaluationInput,
    Evaluator,
    merge_provenance,
)
from orchestrator.policy import load_policy

Behaviour = Callable[[EvaluationInput, float, int], Awaitable[Verdict]]


class Scripted(Evaluator):
    kind = "custom"

    def __init__(self, name: str, behaviour: Behaviour, log: list[tuple[str, str]]) -> None:
        super().__init__(name)
        self.behaviour = behaviour
        self.calls = 0
        self.log = log

    async def evaluate(self, inp: EvaluationInput, *, timeout: float) -> Verdict:
        self.calls += 1
        self.log.append(("start", self.name))
        try:
            return await self.behaviour(inp, timeout, self.calls)
        finally:
            self.log.append(("end", self.name))


class Factory:
    def __init__(self, behaviours: dict[str, Behaviour]) -> None:
        self.log: list[tuple[str, str]] = []
        self.built: dict[str, Scripted] = {}
        self.behaviours = behaviours

    def build(self, spec: Any, policy: Any) -> Evaluator:
        ev = Scripted(spec.name, self.behaviours[spec.name], self.log)
        self.built[spec.name] = ev
        return ev


def score(value: float, **kw: Any) -> Behaviour:
    async def run(inp: EvaluationInput, timeout: float, n: int) -> Verdict:
        await asyncio.sleep(kw.pop("delay", 0) if False else kw.get("delay", 0))
        return Verdict(score=value, **{k: v for k, v in kw.items() if k != "delay"})

    return run


def policy_yaml(evaluators: list[str], rules: str, settings: str = "") -> Any:
    evs = "".join(
        f"  - name: {n}\n    type: custom\n    config: {{code: 'def evaluate(p, r, c): return {{}}'}}\n"
        for n in evaluators
    )
    text = f'name: T\ndescription: d\nversion: "1.0"\nevaluators:\n{evs}rules:\n{textwrap.dedent(rules)}{settings}'
    return load_policy(text)


async def run(policy: Any, factory: Factory, response: str = "text", context: dict | None = None, **kw: Any):
    engine = Engine(factory, **kw)
    return await engine.evaluate(policy, "prompt", response, context or {})


async def test_priority_order_and_chaining_reads_previous_result() -> None:
    policy = policy_yaml(
        ["lang", "en", "es"],
        """\
        - {name: english, evaluator: en, priority: 90, threshold: 0.5,
           conditions: [{field: previous_rule.detect.detected_language, operator: equals, value: en}]}
        - {name: detect, evaluator: lang, priority: 100, threshold: 0.8, action: continue}
        - {name: spanish, evaluator: es, priority: 90, threshold: 0.5,
           conditions: [{field: previous_rule.detect.detected_language, operator: equals, value: es}]}
        """,
    )
    assert [r.name for r in plan(policy)] == ["detect", "english", "spanish"]
    f = Factory({"lang": score(0.99, details={"detected_language": "en"}), "en": score(0.1), "es": score(0.1)})
    d = await run(policy, f)
    assert [r.rule for r in d.rules] == ["detect", "english", "spanish"]
    assert d.rule("english").status is Status.FAIL and d.rule("spanish").status is Status.SKIPPED
    assert "es" not in f.built or f.built["es"].calls == 0
    assert d.action is Action.BLOCK and not d.passed


async def test_equal_priority_reader_runs_after_what_it_reads() -> None:
    policy = policy_yaml(
        ["a", "b"],
        """\
        - {name: reader, evaluator: a,
           conditions: [{field: previous_rule.source.score, operator: less_than, value: 0.5}]}
        - {name: source, evaluator: b, action: continue}
        """,
    )
    assert [r.name for r in plan(policy)] == ["source", "reader"]


async def test_independent_evaluators_run_concurrently_and_shared_calls_run_once() -> None:
    policy = policy_yaml(
        ["slow1", "slow2"],
        """\
        - {name: r1, evaluator: slow1, priority: 3}
        - {name: r2, evaluator: slow2, priority: 2}
        - {name: r3, evaluator: slow1, priority: 1, action: flag}
        """,
    )
    f = Factory({"slow1": score(0.9, delay=0.05), "slow2": score(0.9, delay=0.05)})
    d = await run(policy, f)
    assert d.passed
    starts = [i for i, (kind, _) in enumerate(f.log) if kind == "start"]
    ends = [i for i, (kind, _) in enumerate(f.log) if kind == "end"]
    assert max(starts) < min(ends)  # both started before either finished
    assert f.built["slow1"].calls == 1  # r1 and r3 share one call


async def test_block_stops_lower_priority_rules() -> None:
    policy = policy_yaml(
        ["bad", "other"],
        """\
        - {name: gate, evaluator: bad, priority: 10, action: block}
        - {name: later, evaluator: other, priority: 1, action: flag}
        """,
    )
    d = await run(policy, Factory({"bad": score(0.1), "other": score(0.1)}))
    assert d.action is Action.BLOCK
    assert d.rule("later").status is Status.SKIPPED and "stopped" in d.rule("later").reason
    policy.settings.stop_on_block = False
    d = await run(policy, Factory({"bad": score(0.1), "other": score(0.1)}))
    assert d.rule("later").status is Status.FAIL


async def test_warn_with_continue_processing_false_stops() -> None:
    policy = policy_yaml(
        ["a", "b"],
        """\
        - {name: w, evaluator: a, priority: 10, action: warn, action_config: {continue_processing: false}}
        - {name: later, evaluator: b, priority: 1, action: flag}
        """,
    )
    d = await run(policy, Factory({"a": score(0.1), "b": score(0.1)}))
    assert d.action is Action.WARN and d.rule("later").status is Status.SKIPPED


async def test_outcome_severity_and_continue_does_not_fail() -> None:
    policy = policy_yaml(
        ["a", "b", "c"],
        """\
        - {name: cont, evaluator: a, action: continue, priority: 3}
        - {name: warn, evaluator: b, action: warn, priority: 2}
        - {name: review, evaluator: c, action: require_review, priority: 1,
           action_config: {reviewer_role: compliance_officer, max_review_time: 2h}}
        """,
    )
    d = await run(policy, Factory({"a": score(0.1), "b": score(0.1), "c": score(0.1)}))
    assert d.action is Action.REQUIRE_REVIEW and not d.passed
    review = next(o for o in d.outcomes if o.rule == "review")
    assert review.params["reviewer_role"] == "compliance_officer" and "review_due_at" in review.params
    only_continue = policy_yaml(["a"], "- {name: cont, evaluator: a, action: continue}\n")
    d = await run(only_continue, Factory({"a": score(0.1)}))
    assert d.passed and d.action is Action.ALLOW and d.rule("cont").passed is False


async def test_evaluator_explicit_passed_false_fails_the_rule() -> None:
    policy = policy_yaml(["a"], "- {name: r, evaluator: a, threshold: 0.5}\n")
    d = await run(policy, Factory({"a": score(0.8, passed=False)}))
    assert not d.passed and d.rule("r").status is Status.FAIL


async def test_every_action_outcome() -> None:
    policy = policy_yaml(
        ["a"],
        """\
        - {name: b, evaluator: a, action: block, priority: 6,
           action_config: {message: no, error_code: SAFETY_VIOLATION, http_status: 451}}
        - {name: w, evaluator: a, action: warn, priority: 5, action_config: {message: careful, log_level: warning}}
        - {name: f, evaluator: a, action: flag, priority: 4,
           action_config: {severity: high, assignee: team, auto_escalate_after: 24h}}
        - {name: m, evaluator: a, action: modify, priority: 3, action_config: {strategy: replace, replacement_text: X}}
        - {name: rr, evaluator: a, action: require_review, priority: 2, action_config: {auto_approve_after: 24h}}
        - name: c
          evaluator: a
          action: custom
          priority: 1
          action_config:
            webhook_url: https://hooks.example/x
            headers: {Authorization: "Bearer ${HOOK_TOKEN}"}
            payload: {violation_type: "{{rule.name}}", content_hash: "{{content.hash}}", ts: "{{timestamp}}"}
        """,
        "settings: {stop_on_block: false}\n",
    )
    d = await run(policy, Factory({"a": score(0.0)}), response="abc")
    by = {o.rule: o for o in d.outcomes}
    assert by["b"].params["error_code"] == "SAFETY_VIOLATION" and by["b"].params["http_status"] == 451
    assert by["w"].params == {"message": "careful", "log_level": "warning", "continue_processing": True}
    assert (
        by["f"].params["severity"] == "high"
        and by["f"].params["assignee"] == "team"
        and "escalate_at" in by["f"].params
    )
    assert d.modified_response == "X"
    assert "auto_approve_at" in by["rr"].params
    import hashlib

    assert by["c"].params["payload"]["violation_type"] == "c"
    assert by["c"].params["payload"]["content_hash"] == hashlib.sha256(b"abc").hexdigest()
    assert by["c"].params["request"]["headers"]["Authorization"] == "Bearer ${HOOK_TOKEN}"  # never expanded here
    from orchestrator.engine.actions import webhook_request

    req = webhook_request(by["c"], {"HOOK_TOKEN": "t0k"})
    assert req["headers"]["Authorization"] == "Bearer t0k" and req["method"] == "POST"
    assert d.action is Action.BLOCK


async def test_retry_on_retryable_errors_only() -> None:
    async def flaky(inp: EvaluationInput, timeout: float, n: int) -> Verdict:
        if n == 1:
            raise EvaluatorUnavailableError("model server restarting")
        return Verdict(score=0.9)

    async def broken(inp: EvaluationInput, timeout: float, n: int) -> Verdict:
        raise SandboxCodeError("ValueError: bug")

    policy = policy_yaml(
        ["flaky", "broken"],
        """\
        - {name: r1, evaluator: flaky, settings: {retry_on_failure: true}}
        - {name: r2, evaluator: broken, action: flag, settings: {retries: 3}}
        """,
    )
    f = Factory({"flaky": flaky, "broken": broken})
    d = await run(policy, f)
    assert d.rule("r1").passed and d.rule("r1").evaluators[0].attempts == 2
    assert d.rule("r2").status is Status.ERROR and d.rule("r2").evaluators[0].attempts == 1
    assert d.errored_rules == ["r2"] and d.action is Action.FLAG  # fail-closed with the rule's action
    no_retry = policy_yaml(
        ["flaky"], "- {name: r1, evaluator: flaky, settings: {retry_on_failure: false}}\n", "settings: {retries: 3}\n"
    )
    d = await run(no_retry, Factory({"flaky": flaky}))
    assert d.rule("r1").status is Status.ERROR and d.rule("r1").evaluators[0].attempts == 1


async def test_retries_back_off_doubling_honour_retry_after_and_stop_at_the_deadline() -> None:
    """The one retry policy (tenacity's): ``retries`` more attempts of a retryable error, waits of
    ``retry_backoff_s`` doubling or the error's Retry-After when longer, none begun that would end
    past the deadline; an adapter's untyped bug is an EvaluatorError, not retried."""
    loop = asyncio.get_running_loop()
    starts: list[float] = []

    async def busy(inp: EvaluationInput, timeout: float, n: int) -> Verdict:
        starts.append(loop.time())
        raise EvaluatorUnavailableError("busy")

    async def throttled(inp: EvaluationInput, timeout: float, n: int) -> Verdict:
        starts.append(loop.time())
        if n == 1:
            err = EvaluatorUnavailableError("429")
            err.retry_after = 0.3
            raise err
        return Verdict(score=0.9)

    async def buggy(inp: EvaluationInput, timeout: float, n: int) -> Verdict:
        raise KeyError("oops")

    limits = EngineLimits(retry_backoff_s=0.05)
    rule = "- {name: r, evaluator: e, settings: {retries: 3}}\n"
    d = await run(policy_yaml(["e"], rule), Factory({"e": busy}), limits=limits)
    assert d.rule("r").status is Status.ERROR and d.rule("r").evaluators[0].attempts == 4
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    assert all(gap >= wait - 0.005 for gap, wait in zip(gaps, (0.05, 0.1, 0.2), strict=True)), gaps

    starts.clear()
    d = await run(policy_yaml(["e"], rule), Factory({"e": throttled}), limits=limits)
    assert d.rule("r").passed and d.rule("r").evaluators[0].attempts == 2
    assert starts[1] - starts[0] >= 0.29

    starts.clear()
    slow = EngineLimits(retry_backoff_s=5.0)  # the first wait would outlast the 1 s deadline
    engine = Engine(Factory({"e": busy}), limits=slow)
    d = await engine.evaluate(policy_yaml(["e"], rule), "prompt", "text", {}, timeout=1.0)
    result = d.rule("r").evaluators[0]
    assert (result.attempts, result.error_type) == (1, "EvaluatorUnavailableError")

    d = await run(policy_yaml(["e"], rule), Factory({"e": buggy}), limits=limits)
    result = d.rule("r").evaluators[0]
    assert (result.attempts, result.error_type) == (1, "EvaluatorError") and "KeyError" in result.error


async def test_timeouts_per_rule_and_policy() -> None:
    async def hang(inp: EvaluationInput, timeout: float, n: int) -> Verdict:
        await asyncio.sleep(30)
        raise AssertionError("unreachable")

    policy = policy_yaml(
        ["hang", "ok"],
        """\
        - {name: slow, evaluator: hang, settings: {timeout: 0.05}}
        - {name: fast, evaluator: ok, action: flag}
        """,
    )
    d = await run(policy, Factory({"hang": hang, "ok": score(0.9)}))
    slow = d.rule("slow")
    assert slow.status is Status.TIMEOUT and slow.action is Action.BLOCK and not slow.passed
    assert d.rule("fast").passed and d.errored_rules == ["slow"]
    whole = policy_yaml(["hang"], "- {name: slow, evaluator: hang}\n", "settings: {timeout: 0.1}\n")
    d = await Engine(Factory({"hang": hang})).evaluate(whole, "p", "r", {})
    assert d.rule("slow").status is Status.TIMEOUT
    d = await Engine(Factory({"hang": hang})).evaluate(
        policy_yaml(["hang"], "- {name: s, evaluator: hang}\n"), "p", "r", {}, timeout=0.05
    )
    assert d.rule("s").status is Status.TIMEOUT


async def test_fallback_evaluator_then_on_error() -> None:
    async def down(inp: EvaluationInput, timeout: float, n: int) -> Verdict:
        raise SandboxCodeError("RuntimeError: down")

    rules = """\
        - {name: r, evaluator: primary, threshold: 0.8, fallback: {evaluator: backup, on_error: warn}}
        """
    policy = policy_yaml(["primary", "backup"], rules)
    d = await run(policy, Factory({"primary": down, "backup": score(0.9)}))
    r = d.rule("r")
    assert r.passed and r.fallback_used and d.errored_rules == []
    assert [e.evaluator for e in r.evaluators] == ["backup", "primary"]
    d = await run(policy, Factory({"primary": down, "backup": down}))
    assert d.rule("r").action is Action.WARN and d.action is Action.WARN and d.errored_rules == ["r"]
    allow = policy_yaml(["primary"], "- {name: r, evaluator: primary, fallback: {on_error: allow}}\n")
    d = await run(allow, Factory({"primary": down}))
    assert d.passed and d.rule("r").status is Status.ERROR and d.errored_rules == ["r"]
    block = policy_yaml(["primary"], "- {name: r, evaluator: primary, action: flag, fallback: {on_error: block}}\n")
    d = await run(block, Factory({"primary": down}))
    assert d.action is Action.BLOCK


async def test_consensus_rules_through_the_engine() -> None:
    rules = """\
        - name: c
          evaluators: [{name: a, weight: 0.4}, {name: b, weight: 0.4}, {name: c, weight: 0.2}]
          consensus_strategy: {strategy}
          threshold: 0.8
        """
    behaviours = {"a": score(0.9), "b": score(0.8), "c": score(0.2)}
    for strategy, passed in [("weighted_average", False), ("majority", True), ("unanimous", False)]:
        policy = policy_yaml(["a", "b", "c"], rules.replace("{strategy}", strategy))
        d = await run(policy, Factory(behaviours))
        assert d.passed is passed, (strategy, d.rule("c").reason)
        assert len(d.rule("c").evaluators) == 3


async def test_cache_hit_and_expiry() -> None:
    now = [1000.0]
    clock = lambda: now[0]  # noqa: E731
    policy = policy_yaml(["a"], "- {name: r, evaluator: a}\n", "settings: {cache_results: true, cache_duration: 60}\n")
    f = Factory({"a": score(0.9)})
    engine = Engine(f, cache=ResultCache(100, clock), clock=clock)
    d1 = await engine.evaluate(policy, "p", "same", {"k": 1})
    d2 = await engine.evaluate(policy, "p", "same", {"k": 1})
    assert f.built["a"].calls == 1 and d2.rule("r").evaluators[0].cached and not d1.rule("r").evaluators[0].cached
    await engine.evaluate(policy, "p", "different", {"k": 1})
    assert f.built["a"].calls == 2
    now[0] += 61
    d4 = await engine.evaluate(policy, "p", "same", {"k": 1})
    assert f.built["a"].calls == 3 and not d4.rule("r").evaluators[0].cached
    uncached = policy_yaml(["a"], "- {name: r, evaluator: a}\n")
    f2 = Factory({"a": score(0.9)})
    e2 = Engine(f2)
    await e2.evaluate(uncached, "p", "same", {})
    await e2.evaluate(uncached, "p", "same", {})
    assert f2.built["a"].calls == 2


async def test_cache_key_covers_scope_and_the_evaluator_spec() -> None:
    """One cache shared by two engines (tenants), or by two specs of one name, never crosses over."""
    cache = ResultCache(100)
    settings = "settings: {cache_results: true}\n"
    policy = policy_yaml(["a"], "- {name: r, evaluator: a}\n", settings)
    f1, f2 = Factory({"a": score(0.9)}), Factory({"a": score(0.1)})
    await Engine(f1, cache=cache, scope="acme").evaluate(policy, "p", "same", {})
    d = await Engine(f2, cache=cache, scope="globex").evaluate(policy, "p", "same", {})
    assert f2.built["a"].calls == 1 and not d.rule("r").evaluators[0].cached and d.rule("r").score == 0.1

    engine = Engine(Factory({"a": score(0.5)}), cache=cache, scope="acme")
    rethresholded = policy_yaml(["a"], "- {name: r, evaluator: a, threshold: 0.2}\n", settings)
    hit = await engine.evaluate(rethresholded, "p", "same", {})
    assert hit.rule("r").evaluators[0].cached, "a threshold change leaves the evaluator's verdict valid"
    reconfigured = load_policy(
        'name: T\ndescription: d\nversion: "1.0"\nevaluators:\n'
        "  - name: a\n    type: custom\n    config: {words: [beta], code: 'def evaluate(p, r, c): return {}'}\n"
        f"rules:\n- {{name: r, evaluator: a}}\n{settings}"
    )
    miss = await engine.evaluate(reconfigured, "p", "same", {})
    assert not miss.rule("r").evaluators[0].cached and miss.rule("r").score == 0.5


async def test_feedback_moves_threshold() -> None:
    policy = policy_yaml(
        ["a"],
        """\
        - {name: learn, evaluator: a, threshold: 0.8, action: flag,
           feedback_config: {collect_user_feedback: true, update_model: true, feedback_weight: 0.2,
                             min_feedback_count: 10}}
        """,
    )
    stats = {("T", "learn"): FeedbackStats(total=10, false_positive=10)}
    engine = Engine(Factory({"a": score(0.7)}), feedback=lambda p, r: stats.get((p, r)))
    d = await engine.evaluate(policy, "p", "r", {})
    assert d.passed and d.rule("learn").threshold == pytest.approx(0.6) and "feedback" in d.rule("learn").reason


async def test_adapter_bug_is_contained_and_fail_closed() -> None:
    async def bug(inp: EvaluationInput, timeout: float, n: int) -> Verdict:
        raise KeyError("oops")

    d = await run(policy_yaml(["a"], "- {name: r, evaluator: a}\n"), Factory({"a": bug}))
    assert d.action is Action.BLOCK and d.rule("r").evaluators[0].error_type == "EvaluatorError"


async def test_disabled_rules_are_reported_skipped() -> None:
    policy = policy_yaml(["a"], "- {name: off, evaluator: a, enabled: false}\n- {name: on, evaluator: a}\n")
    d = await run(policy, Factory({"a": score(1.0)}))
    assert d.rule("off").status is Status.SKIPPED and d.rule("off").reason == "disabled"


async def test_built_evaluators_are_bounded_lru() -> None:
    from crossaudit.kernel.limits import EngineLimits

    f = Factory({"a": score(1.0)})
    engine = Engine(f, limits=EngineLimits(evaluator_instances=2))
    for version in range(4):  # four policy versions -> four digests
        policy = policy_yaml(["a"], f"- {{name: r{version}, evaluator: a}}\n")
        await engine.evaluate(policy, "p", "r", {})
    assert len(engine._evaluators) == 2


async def test_rules_sharing_a_call_get_their_own_copies_of_its_result() -> None:
    """One call, two rules with different thresholds: each rule's copy has its own status and
    containers (nested details too), so nothing one rule's result holds leaks into the other's."""
    policy = policy_yaml(
        ["shared"],
        """\
        - {name: strict, evaluator: shared, threshold: 0.9, action: flag}
        - {name: lenient, evaluator: shared, threshold: 0.5, action: flag}
        """,
    )
    f = Factory({"shared": score(0.7, violations=["v"], details={"flat": 1, "nested": {"k": [1]}})})
    d = await run(policy, f)
    strict, lenient = d.rule("strict").evaluators[0], d.rule("lenient").evaluators[0]
    assert f.built["shared"].calls == 1
    assert (strict.status, lenient.status) == (Status.FAIL, Status.PASS)
    strict.violations.append("mutated")
    strict.details["nested"]["k"].append(2)
    strict.details["flat"] = 2
    assert lenient.violations == ["v"] and lenient.details == {"flat": 1, "nested": {"k": [1]}}


class Traced(Evaluator):
    """An adapter with static provenance and facts of each call (as the llm adapter's response id)."""

    kind = "llm"

    def __init__(self, name: str, facts: dict[str, Any]) -> None:
        super().__init__(name)
        self.facts = facts
        self.calls = 0

    def provenance(self) -> dict[str, str]:
        return {"kind": "claimed", "provider": "p", "model": "m"}

    async def evaluate(self, inp: EvaluationInput, *, timeout: float) -> Verdict:
        return (await self.call(inp, timeout=timeout)).verdict

    async def call(self, inp: EvaluationInput, *, timeout: float) -> Called:
        self.calls += 1
        return Called(Verdict(score=0.9), {**self.facts, "response_id": f"resp-{self.calls}"})


class TracedFactory:
    def __init__(self, facts: dict[str, Any]) -> None:
        self.facts = facts

    def build(self, spec: Any, policy: Any) -> Evaluator:
        return Traced(spec.name, self.facts)


async def test_provenance_is_static_facts_then_the_calls_own_never_overridden() -> None:
    policy = policy_yaml(["j"], "- {name: r, evaluator: j, threshold: 0.5}\n")
    facts = {"provider": "forged", "model": 3, "extra": "x" * (PROVENANCE_MAX_VALUE_CHARS + 10)}
    d = await run(policy, TracedFactory(facts))  # type: ignore[arg-type]
    assert d.rule("r").evaluators[0].provenance == {
        "kind": "llm",  # the evaluator's kind, whatever its provenance() says
        "provider": "p",
        "model": "m",
        "extra": "x" * PROVENANCE_MAX_VALUE_CHARS,
        "response_id": "resp-1",
    }


async def test_an_errored_result_carries_the_static_facts() -> None:
    async def broken(inp: EvaluationInput, timeout: float, n: int) -> Verdict:
        raise EvaluatorUnavailableError("down")

    policy = policy_yaml(["x"], "- {name: r, evaluator: x, threshold: 0.5}\n")
    d = await run(policy, Factory({"x": broken}))
    result = d.rule("r").evaluators[0]
    assert result.status is Status.ERROR and result.provenance == {"kind": "custom"}


def test_merge_provenance_is_bounded() -> None:
    many = {f"k{i}": "v" for i in range(PROVENANCE_MAX_KEYS + 5)}
    assert len(merge_provenance({"kind": "custom"}, many)) == PROVENANCE_MAX_KEYS
    assert merge_provenance({}, {"": "v", "k" * 100: "v", "n": ""}) == {}
