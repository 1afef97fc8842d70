"""Prometheus metrics: decisions, rules, evaluators, sandbox pools."""

from __future__ import annotations

from prometheus_client import generate_latest

from crossaudit.kernel.pricing import DEFAULT_LLM_PRICES, LLMPrice, price_for
from crossaudit.kernel.results import Action, Decision, EvaluatorResult, RuleResult, Status
from crossaudit.service.config import MetricsLimits
from crossaudit.service.metrics import OTHER, BoundedLabels, ServiceMetrics


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
    m.observe_decision(d, 0.02, "acme")
    m.observe_decision(d, 0.02, "acme")  # the cached children count on
    body = scrape(m)
    assert 'crossaudit_decisions_total{action="block",passed="false",policy="p",tenant="acme"} 2.0' in body
    assert 'crossaudit_decision_latency_seconds_count{policy="p",tenant="acme"} 2.0' in body
    assert 'crossaudit_evaluator_results_total{kind="custom",status="timeout"} 2.0' in body
    assert 'crossaudit_rule_latency_seconds_count{policy="p",rule="r"} 2.0' in body


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


def _decision(policy: str = "p") -> Decision:
    return Decision(policy=policy, policy_version="1", passed=True, action=Action.ALLOW, rules=[])


def test_tenant_label_is_bounded_first_come_first_named() -> None:
    m = ServiceMetrics(MetricsLimits(max_tenant_labels=2))
    for tenant in ("acme", "globex", "initech", "umbrella", "acme"):
        m.observe_decision(_decision(), 0.001, tenant)
    body = scrape(m)
    assert 'passed="true",policy="p",tenant="acme"} 2.0' in body
    assert 'passed="true",policy="p",tenant="globex"} 1.0' in body
    assert f'passed="true",policy="p",tenant="{OTHER}"}} 2.0' in body  # initech and umbrella
    assert "initech" not in body and "umbrella" not in body


def test_bounded_labels_remember_only_a_bounded_number_of_values() -> None:
    """Model names are tenant-chosen text: millions of them must not grow memory."""
    labels = BoundedLabels(3, always=("gpt-4o",))
    names = [labels(f"model-{i}") for i in range(10_000)]
    assert names[:3] == ["model-0", "model-1", "model-2"] and set(names[3:]) == {OTHER}
    assert labels("gpt-4o") == "gpt-4o"  # a priced model keeps its name beyond the bound
    assert len(labels._known) <= 4 * 3 + 1 + 1


def test_llm_tokens_and_cost_by_tenant_provider_and_model() -> None:
    prices = {**DEFAULT_LLM_PRICES, "judge-1": LLMPrice(prompt=2.0, completion=10.0)}
    m = ServiceMetrics(prices=prices)
    record = m.llm_usage("acme")
    record("openai_compatible", "judge-1", 1_000, 200)
    record("openai_compatible", "judge-1", 1_000, 200)
    record("openai", "unpriced-model", 50, 5)
    record("anthropic", "claude-3-5-haiku-20241022", 1_000_000, 0)  # a dated snapshot: its model's price
    body = scrape(m)
    labels = 'model="judge-1",provider="openai_compatible",tenant="acme"'
    assert f'crossaudit_llm_tokens_total{{kind="prompt",{labels}}} 2000.0' in body
    assert f'crossaudit_llm_tokens_total{{kind="completion",{labels}}} 400.0' in body
    # (2 * (1000 * 2.0 + 200 * 10.0)) / 1e6 USD
    assert f"crossaudit_llm_cost_usd_total{{{labels}}} 0.008" in body
    unpriced = 'model="unpriced-model",provider="openai",tenant="acme"'
    assert f'crossaudit_llm_tokens_total{{kind="prompt",{unpriced}}} 50.0' in body
    assert 'model="unpriced-model"' not in body.split("crossaudit_llm_cost_usd_total", 1)[1].split("# HELP", 1)[0]
    claude = 'model="claude-3-5-haiku-20241022",provider="anthropic",tenant="acme"'
    assert f"crossaudit_llm_cost_usd_total{{{claude}}} 0.8" in body


def test_price_lookup_exact_then_snapshot_base() -> None:
    assert price_for(DEFAULT_LLM_PRICES, "gpt-4o-mini") == DEFAULT_LLM_PRICES["gpt-4o-mini"]
    assert price_for(DEFAULT_LLM_PRICES, "gpt-4o-mini-2024-07-18") == DEFAULT_LLM_PRICES["gpt-4o-mini"]
    assert price_for(DEFAULT_LLM_PRICES, "gpt-4o-audio-preview") is None  # not a snapshot of gpt-4o
    assert price_for(DEFAULT_LLM_PRICES, "my-local-llama") is None


def test_cache_hits_and_misses_per_tenant_are_read_at_scrape_time() -> None:
    m = ServiceMetrics(MetricsLimits(max_tenant_labels=1))
    stats = [("acme", 3, 1, 2)]
    m.watch_caches(lambda: stats)
    body = scrape(m)
    assert 'crossaudit_result_cache_hits_total{tenant="acme"} 3.0' in body
    assert 'crossaudit_result_cache_misses_total{tenant="acme"} 1.0' in body
    assert 'crossaudit_result_cache_entries{tenant="acme"} 2.0' in body
    stats.extend([("globex", 1, 1, 1), ("initech", 2, 0, 1)])  # beyond the bound: summed as other
    body = scrape(m)
    assert 'crossaudit_result_cache_hits_total{tenant="other"} 3.0' in body


def test_process_metrics_are_on_the_service_registry() -> None:
    body = scrape(ServiceMetrics())
    assert "process_cpu_seconds_total" in body and "process_resident_memory_bytes" in body
    assert "python_info{" in body
