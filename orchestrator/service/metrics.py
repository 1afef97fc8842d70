"""Prometheus metrics of the service, on their own registry (served on ``--metrics-port``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from orchestrator.results import Decision

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class _SandboxCollector(Collector):
    """Numeric values of ``sandbox.info()`` (pool sizes, busy/idle counts) as gauges."""

    def __init__(self, info: Callable[[], dict[str, Any]]) -> None:
        self._info = info

    def collect(self) -> Iterator[GaugeMetricFamily]:
        fam = GaugeMetricFamily("crossaudit_sandbox_state", "Sandbox backend state (pools, containers)", labels=["key"])
        try:
            info = self._info() or {}
        except Exception:  # a collector must never break the scrape
            info = {}
        for key, value in _flatten(info):
            fam.add_metric([key], float(value))
        yield fam


def _flatten(doc: dict[str, Any], prefix: str = "", depth: int = 0) -> Iterator[tuple[str, float]]:
    if depth > 4:
        return
    for k, v in doc.items():
        key = f"{prefix}{k}"
        if isinstance(v, int | float):  # bool included
            yield key, float(v)
        elif isinstance(v, dict):
            yield from _flatten(v, key + ".", depth + 1)


class ServiceMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.decisions = Counter(
            "crossaudit_decisions_total", "Decisions by outcome", ["policy", "action", "passed"], registry=r
        )
        self.decision_latency = Histogram(
            "crossaudit_decision_latency_seconds", "Decision latency", ["policy"], buckets=LATENCY_BUCKETS, registry=r
        )
        self.rule_latency = Histogram(
            "crossaudit_rule_latency_seconds", "Rule latency", ["policy", "rule"], buckets=LATENCY_BUCKETS, registry=r
        )
        self.evaluator_latency = Histogram(
            "crossaudit_evaluator_latency_seconds",
            "Evaluator call latency by kind",
            ["kind"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.evaluator_results = Counter(
            "crossaudit_evaluator_results_total",
            "Evaluator results by kind and status (error and timeout included)",
            ["kind", "status"],
            registry=r,
        )
        self.rpcs = Counter("crossaudit_rpcs_total", "RPCs by method and status code", ["method", "code"], registry=r)
        self.inflight = Gauge("crossaudit_inflight_evaluations", "Decisions being made now", registry=r)
        self.uploads = Counter("crossaudit_evaluator_uploads_total", "Evaluator uploads", ["created"], registry=r)
        self._http: Any = None

    def watch_sandbox(self, info: Callable[[], dict[str, Any]]) -> None:
        self.registry.register(_SandboxCollector(info))

    def observe_decision(self, decision: Decision, seconds: float) -> None:
        policy = decision.policy
        self.decisions.labels(policy, decision.action.value, str(decision.passed).lower()).inc()
        self.decision_latency.labels(policy).observe(seconds)
        for rule in decision.rules:
            self.rule_latency.labels(policy, rule.rule).observe(rule.latency_ms / 1000.0)
            for ev in rule.evaluators:
                kind = ev.kind or "unknown"
                self.evaluator_results.labels(kind, ev.status.value).inc()
                if not ev.cached:
                    self.evaluator_latency.labels(kind).observe(ev.latency_ms / 1000.0)

    def serve(self, host: str, port: int) -> int:
        """Start the /metrics HTTP endpoint; returns the bound port (``port=0``: ephemeral)."""
        server, _thread = start_http_server(port, addr=host, registry=self.registry)
        self._http = server
        return int(server.server_port)

    def close(self) -> None:
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            self._http = None
