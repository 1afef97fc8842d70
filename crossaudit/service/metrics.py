"""Prometheus metrics of the service, on their own registry (served on ``--metrics-port``).

Per-tenant series carry a ``tenant`` label of bounded cardinality (:class:`BoundedLabels`:
``MetricsLimits.max_tenant_labels``), and so do LLM model names, which tenants choose. Labelled
children are looked up once and kept, so a decision costs dictionary lookups, not ``labels()``
calls. docs/configuration.md lists the metrics.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    start_http_server,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from crossaudit.kernel.pricing import DEFAULT_LLM_PRICES, LLMPrice, cost_usd, price_for
from crossaudit.kernel.results import Decision
from crossaudit.service.config import MetricsLimits

OTHER = "other"  # the label of every tenant (or model) beyond the bound


class BoundedLabels:
    """The first ``limit`` distinct values keep their name; later ones are :data:`OTHER`.

    Values in ``always`` keep their name without counting towards the bound. Read from the
    event loop and the scrape thread: the fast path is one dict lookup; adding takes a lock."""

    def __init__(self, limit: int, always: Iterable[str] = ()) -> None:
        self.limit = limit
        self._always = frozenset(always)
        self._known: dict[str, str] = {}
        self._lock = threading.Lock()

    def __call__(self, value: str) -> str:
        found = self._known.get(value)
        if found is not None:
            return found
        with self._lock:
            found = self._known.get(value)
            if found is None:
                kept = value in self._always or len(self._known) < self.limit
                found = self._known[value] = value if kept else OTHER
                if not kept and len(self._known) > 4 * self.limit + len(self._always):
                    self._known.pop(value)  # remember few of the values beyond the bound
            return found


class _CacheCollector(Collector):
    """Result-cache hits, misses and size per tenant, read from the engines' own counters at
    scrape time (nothing is counted on the decision path)."""

    def __init__(self, stats: Callable[[], Iterable[tuple[str, int, int, int]]], label: BoundedLabels) -> None:
        self._stats = stats
        self._label = label

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        hits = CounterMetricFamily(
            "crossaudit_result_cache_hits", "Evaluator results served from the result cache", labels=["tenant"]
        )
        misses = CounterMetricFamily(
            "crossaudit_result_cache_misses",
            "Cacheable evaluator calls the result cache could not serve",
            labels=["tenant"],
        )
        size = GaugeMetricFamily("crossaudit_result_cache_entries", "Entries in the result cache", labels=["tenant"])
        totals: dict[str, list[int]] = {}
        try:
            rows = list(self._stats())
        except Exception:  # a collector must never break the scrape
            rows = []
        for tenant, h, m, n in rows:
            t = totals.setdefault(self._label(tenant), [0, 0, 0])
            t[0] += h
            t[1] += m
            t[2] += n
        for tenant, (h, m, n) in sorted(totals.items()):
            hits.add_metric([tenant], h)
            misses.add_metric([tenant], m)
            size.add_metric([tenant], n)
        yield hits
        yield misses
        yield size


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


class _Endpoint:
    """A registry served on a /metrics HTTP endpoint: what the server's and the supervisor's
    metrics share."""

    registry: CollectorRegistry
    _http: Any = None

    def serve(self, host: str, port: int) -> int:
        """Start the /metrics HTTP endpoint; returns the bound port (``port=0``: ephemeral)."""
        self._http, _thread = start_http_server(port, addr=host, registry=self.registry)
        return int(self._http.server_port)

    def close(self) -> None:
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
        self._http = None


class ServiceMetrics(_Endpoint):
    def __init__(self, limits: MetricsLimits | None = None, prices: Mapping[str, LLMPrice] | None = None) -> None:
        self.limits = limits or MetricsLimits()
        self.prices = dict(DEFAULT_LLM_PRICES if prices is None else prices)
        self.tenant_label = BoundedLabels(self.limits.max_tenant_labels)
        self.model_label = BoundedLabels(self.limits.max_model_labels, always=self.prices)
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        ProcessCollector(registry=r)  # process_cpu_seconds_total, process_resident_memory_bytes, fds ...
        PlatformCollector(registry=r)  # python_info
        self.decisions = Counter(
            "crossaudit_decisions_total", "Decisions by outcome", ["tenant", "policy", "action", "passed"], registry=r
        )
        self.decision_latency = Histogram(
            "crossaudit_decision_latency_seconds",
            "Decision latency",
            ["tenant", "policy"],
            buckets=LATENCY_BUCKETS,
            registry=r,
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
        # summed over the live workers of `serve --workers N` (multiprocess mode; one process: its own)
        self.inflight = Gauge(
            "crossaudit_inflight_evaluations", "Decisions being made now", registry=r, multiprocess_mode="livesum"
        )
        self.uploads = Counter("crossaudit_evaluator_uploads_total", "Evaluator uploads", ["created"], registry=r)
        self.llm_tokens = Counter(
            "crossaudit_llm_tokens_total",
            "Tokens of LLM evaluator calls, by tenant, provider, model and kind (prompt | completion)",
            ["tenant", "provider", "model", "kind"],
            registry=r,
        )
        self.llm_cost = Counter(
            "crossaudit_llm_cost_usd_total",
            "Cost of LLM evaluator calls in USD, from the price table (models not in it: no cost)",
            ["tenant", "provider", "model"],
            registry=r,
        )
        self.shadow_samples = Counter(
            "crossaudit_shadow_samples_total",
            "Decisions sampled for a shadow candidate, by outcome (evaluated | errored | dropped: the shadow queue "
            "was full)",
            ["tenant", "outcome"],
            registry=r,
        )
        self.canary_rollbacks = Counter(
            "crossaudit_canary_rollbacks_total", "Canaries rolled back automatically", ["tenant"], registry=r
        )
        # Labelled children, looked up once (labels() hashes and locks on every call).
        self._children: dict[tuple[Any, ...], Any] = {}
        self._read_at_scrape: list[Collector] = []  # the collectors below that read state when scraped

    def _child(self, metric: Any, *labels: str) -> Any:
        key = (id(metric), *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def shadow_sample(self, tenant: str, outcome: str) -> None:
        self._child(self.shadow_samples, self.tenant_label(tenant), outcome).inc()

    def watch_sandbox(self, info: Callable[[], dict[str, Any]]) -> None:
        self._watch(_SandboxCollector(info))

    def watch_caches(self, stats: Callable[[], Iterable[tuple[str, int, int, int]]]) -> None:
        """``stats()``: (tenant, hits, misses, entries) of each tenant's result cache, at scrape time."""
        self._watch(_CacheCollector(stats, self.tenant_label))

    def _watch(self, collector: Collector) -> None:
        self.registry.register(collector)
        self._read_at_scrape.append(collector)

    def shared_copy(self) -> Callable[[], None]:
        """For a worker of ``serve --workers N``: the collectors that read this process's state at
        scrape time (sandbox pools, result caches) have no file the supervisor's endpoint reads,
        so the returned function copies what they read now into multiprocess gauges of the same
        series names, summed over the live workers. Call it every few seconds: the endpoint shows
        those series as of the last copy (their counters as gauges, which ``rate()`` still reads;
        a worker's death drops its part, as a counter reset)."""
        gauges: dict[str, Gauge] = {}

        def copy() -> None:
            for collector in self._read_at_scrape:
                for family in collector.collect():
                    for sample in family.samples:
                        gauge = gauges.get(sample.name)
                        if gauge is None:
                            gauge = gauges[sample.name] = Gauge(
                                sample.name,
                                family.documentation,
                                list(sample.labels),
                                registry=None,
                                multiprocess_mode="livesum",
                            )
                        (gauge.labels(**sample.labels) if sample.labels else gauge).set(sample.value)

        return copy

    def observe_decision(self, decision: Decision, seconds: float, tenant: str = "") -> None:
        policy = decision.policy
        label = self.tenant_label(tenant)
        child = self._child
        child(self.decisions, label, policy, decision.action.value, str(decision.passed).lower()).inc()
        child(self.decision_latency, label, policy).observe(seconds)
        results: dict[tuple[str, str], int] = {}  # counted here, then one increment per label set
        for rule in decision.rules:
            child(self.rule_latency, policy, rule.rule).observe(rule.latency_ms / 1000.0)
            for ev in rule.evaluators:
                kind = ev.kind or "unknown"
                key = (kind, ev.status.value)
                results[key] = results.get(key, 0) + 1
                if not ev.cached:
                    child(self.evaluator_latency, kind).observe(ev.latency_ms / 1000.0)
        for (kind, status), n in results.items():
            child(self.evaluator_results, kind, status).inc(n)

    def llm_usage(self, tenant: str) -> Callable[[str, str, int, int], None]:
        """The callback a tenant's LLM evaluators report each call's tokens to
        (``orchestrator.evaluators.llm.UsageSink``)."""
        label = self.tenant_label(tenant)

        def record(provider: str, model: str, prompt_tokens: int, completion_tokens: int) -> None:
            name = self.model_label(model)
            if prompt_tokens > 0:
                self._child(self.llm_tokens, label, provider, name, "prompt").inc(prompt_tokens)
            if completion_tokens > 0:
                self._child(self.llm_tokens, label, provider, name, "completion").inc(completion_tokens)
            price = price_for(self.prices, model)
            if price is not None:
                self._child(self.llm_cost, label, provider, name).inc(cost_usd(price, prompt_tokens, completion_tokens))

        return record

    def count_inflight_in(self, slot: Any, index: int) -> None:
        """Also count the decisions in flight in ``slot[index]`` (shared memory a supervisor reads
        when this worker dies: those calls are lost). Only the event loop moves the count."""
        self.inflight = _SlotGauge(self.inflight, slot, index)


class _SlotGauge:
    """A gauge whose moves are mirrored in one slot of a shared array."""

    def __init__(self, gauge: Gauge, slot: Any, index: int) -> None:
        self._gauge = gauge
        self._slot = slot
        self._index = index

    def inc(self, amount: float = 1) -> None:
        self._gauge.inc(amount)
        self._slot[self._index] += int(amount)

    def dec(self, amount: float = 1) -> None:
        self._gauge.dec(amount)
        self._slot[self._index] -= int(amount)


# Kinds of multiprocess files whose values are summed over processes: a dead worker's are folded
# into one file per kind named so (prometheus_client reads a pid from gauge file names only).
SUMMED_KINDS = ("counter", "histogram", "summary")
FOLDED_FILE = "dead-workers"


class _SharedFiles(Collector):
    """prometheus_client's MultiProcessCollector over the files that are ready: a worker (re)starting
    creates its file empty and only then sizes it, and a scrape reading it in between would fail to
    unpack its header (a 500 for the whole scrape). An empty file holds no sample yet: skipped."""

    def __init__(self, directory: str, lock: threading.Lock) -> None:
        from prometheus_client import multiprocess

        self._directory = directory
        self._lock = lock  # a scrape never reads a dead worker's file while it is folded
        self._files = multiprocess.MultiProcessCollector(None, path=directory)

    def collect(self) -> Iterable[Any]:
        with self._lock:
            return self._files.merge(self._ready(), accumulate=True)

    def _ready(self) -> list[str]:
        ready = []
        for entry in os.scandir(self._directory):
            with contextlib.suppress(OSError):  # a dead worker's file removed meanwhile
                if entry.name.endswith(".db") and entry.stat().st_size > 0:
                    ready.append(entry.path)
        return ready


class WorkerMetrics(_Endpoint):
    """The one /metrics endpoint of ``serve --workers N``, served by the supervisor: every worker's
    metrics from the multiprocess directory (prometheus_client's multiprocess mode, summed across
    workers), plus the supervisor's own counters and process figures.

    Collectors that read a process's state at scrape time (result caches, sandbox pools) are
    copied by each worker into multiprocess gauges every second (:meth:`ServiceMetrics.shared_copy`);
    the workers' process_* figures are not here: those are the supervisor's (docs/service.md,
    "Workers")."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self._files = threading.Lock()  # a scrape never reads a dead worker's file while it is folded
        r.register(_SharedFiles(directory, self._files))
        ProcessCollector(registry=r)  # the supervisor's own
        self.restarts = Counter(
            "crossaudit_worker_restarts_total", "Worker processes restarted after they died", registry=r
        )
        self.lost_calls = Counter(
            "crossaudit_worker_lost_calls_total",
            "Decisions in flight in a worker when it died (their callers got UNAVAILABLE)",
            registry=r,
        )
        self.live = Gauge("crossaudit_workers", "Worker processes serving now", registry=r)

    def worker_died(self, pid: int) -> None:
        """Forget a dead worker's live gauges; fold its counters and histograms into one file per
        kind, so they stay in the sums while a worker that keeps dying does not add files (and
        scrape work) for every life it had."""
        from prometheus_client import multiprocess
        from prometheus_client.mmap_dict import MmapedDict

        multiprocess.mark_process_dead(pid, self.directory)
        with self._files:
            for kind in SUMMED_KINDS:
                dead = os.path.join(self.directory, f"{kind}_{pid}.db")
                if not os.path.exists(dead):
                    continue
                folded = MmapedDict(os.path.join(self.directory, f"{kind}_{FOLDED_FILE}.db"))
                try:
                    for key, value, _ts, _pos in MmapedDict.read_all_values_from_file(dead):
                        folded.write_value(key, folded.read_value(key)[0] + value, 0.0)
                finally:
                    folded.close()
                os.remove(dead)
