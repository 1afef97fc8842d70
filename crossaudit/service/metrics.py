"""Prometheus metrics of the service, on their own registry (served on ``--metrics-port``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from crossaudit.kernel.results import Decision

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class _SandboxCollector(Collector):
    """The sandbox backend's state from ``sandbox.info()``: warm pools summed over evaluators
    (idle, busy, starting, waiting, ...), plus other top-level numbers (agents, warm bundles)."""

    def __init__(self, info: Callable[[], dict[str, Any]]) -> None:
        self._info = info

    def collect(self) -> Iterator[GaugeMetricFamily]:
        state = GaugeMetricFamily(
            "crossaudit_sandbox_state", "Sandbox backend state (top-level numbers of its info())", labels=["key"]
        )
        pools = GaugeMetricFamily(
            "crossaudit_sandbox_pool", "Warm sandbox pools, summed over evaluators", labels=["state"]
        )
        try:
            info = self._info() or {}
        except Exception:  # a collector must never break the scrape
            info = {}
        for key, value in info.items():
            if isinstance(value, int | float):  # bool included
                state.add_metric([key], float(value))
        per_pool = info.get("pools")
        if isinstance(per_pool, dict):
            totals: dict[str, float] = {"pools": float(len(per_pool))}
            for stats in per_pool.values():
                for k, v in (stats or {}).items() if isinstance(stats, dict) else ():
                    if isinstance(v, int | float):
                        totals[k] = totals.get(k, 0.0) + float(v)
            for k, v in sorted(totals.items()):
                pools.add_metric([k], v)
        yield state
        yield pools


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
