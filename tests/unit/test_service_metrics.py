"""Prometheus metrics: decisions, rules, evaluators, sandbox pools."""

from __future__ import annotations

from prometheus_client import generate_latest

from crossaudit.kernel.results import Action, Decision, EvaluatorResult, RuleResult, Status
from crossaudit.service.metrics import ServiceMetrics


def scrape(m: ServiceMetrics) -> str:
    return generate_latest(m.registry).decode()


def test_decisions_rules_and_evaluators_are_counted() -> None:
    m = ServiceMetrics()
    d = Decision(
        policy="p",
        policy_version="1",
        passed=False,
        action=Action.BLOCK,
        rules=[
            RuleResult(
                rule="r",
                status=Status.TIMEOUT,
                passed=False,
                latency_ms=12.0,
                evaluators=[EvaluatorResult(evaluator="e", kind="custom", status=Status.TIMEOUT, latency_ms=11.0)],
            )
        ],
    )
    m.observe_decision(d, 0.02)
    body = scrape(m)
    assert 'crossaudit_decisions_total{action="block",passed="false",policy="p"} 1.0' in body
    assert 'crossaudit_evaluator_results_total{kind="custom",status="timeout"} 1.0' in body
    assert 'crossaudit_rule_latency_seconds_count{policy="p",rule="r"} 1.0' in body


def test_sandbox_pools_are_summed_and_a_failing_info_never_breaks_the_scrape() -> None:
    m = ServiceMetrics()
    m.watch_sandbox(
        lambda: {"backend": "docker", "agents": 3, "pools": {"a": {"idle": 1, "busy": 2}, "b": {"idle": 2}}}
    )
    body = scrape(m)
    assert 'crossaudit_sandbox_pool{state="idle"} 3.0' in body and 'crossaudit_sandbox_pool{state="pools"} 2.0' in body
    assert 'crossaudit_sandbox_state{key="agents"} 3.0' in body

    def broken() -> dict:
        raise RuntimeError("boom")

    m2 = ServiceMetrics()
    m2.watch_sandbox(broken)
    assert "crossaudit_sandbox_state" in scrape(m2)
