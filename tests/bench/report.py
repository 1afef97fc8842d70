"""What a ``make bench`` run measured: scenarios, targets beside their figures, a results file, a plot.

Benchmarks call :func:`record` for each scenario they measure; ``python -m tests.bench`` then
prints every target next to its measured figure and, when asked (``--out DIR``), writes
``results.json`` (machine-readable) and ``results.png`` (latency percentiles and throughput per
scenario). Targets are figures to read, not assertions: these machines are shared and noisy.
"""

from __future__ import annotations

import json
import platform
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Scenario:
    name: str  # unique key, e.g. "grpc.cached.c16"
    label: str  # for people and the plot
    unit: str  # what throughput counts: "decisions/s", "calls/s", "validations/s"
    concurrency: int
    samples: int
    p50_ms: float
    p95_ms: float
    p99_ms: float
    throughput: float
    group: str = ""  # scenarios plotted together
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Target:
    scenario: str
    metric: str  # "p50_ms" | "throughput" | a ratio key of RATIOS
    bound: float
    at_most: bool  # True: measured <= bound passes; False: measured >= bound
    text: str


# The targets (docs/performance.md explains each, and any that is missed).
TARGETS = (
    Target("grpc.cached.c1", "p50_ms", 1.2, True, "gRPC Evaluate, cached evaluators, 1 client: p50 <= 1.2 ms"),
    Target("grpc.cached.c16", "throughput", 1500, False, "gRPC Evaluate, cached evaluators, 16 clients: >= 1,500/s"),
    Target("ratio.grpc_vs_inprocess.c16", "ratio", 0.75, False, "gRPC vs in-process throughput, 16 clients: >= 0.75x"),
    Target("docker.warm.c1", "p50_ms", 2.0, True, "Docker warm call, sequential, cleanup included: p50 <= 2.0 ms"),
    Target("docker.warm.c4", "throughput", 600, False, "Docker warm calls at 4 concurrent: >= 600 calls/s"),
    Target(
        "ratio.neighbours.cpu",
        "ratio",
        2.0,
        True,
        "another tenant's p50, one tenant at 120 CPU-burning calls: <= 2x idle",
    ),
    Target("ratio.neighbours.audit", "ratio", 2.0, True, "another tenant's p50, one tenant flooding audit: <= 2x idle"),
    Target(
        "replay.threshold",
        "throughput",
        2000,
        False,
        "replay of a threshold-only change (recorded verdicts, nothing re-run): >= 2,000 decisions/s",
    ),
    Target(
        "ratio.shadow.cached.c16",
        "ratio",
        1.05,
        True,
        "live p50 with a shadow at --sample 0.1, 16 clients, cached evaluators: <= 1.05x shadow off",
    ),
    Target(
        "ratio.shadow.uncached.c16",
        "ratio",
        1.05,
        True,
        "live p50 with a shadow at --sample 0.1, 16 clients, evaluators run: <= 1.05x shadow off",
    ),
    Target(
        "evidence.verify.store",
        "throughput",
        50_000,
        False,
        "audit verify --store of a 10-rule log (every core): >= 50,000 records/s",
    ),
    Target(
        "ratio.evidence.cpu",
        "ratio",
        1.05,
        True,
        "server CPU per decision with the decision log on, cached 10-rule policy, 16 clients: <= 1.05x log off",
    ),
    Target(
        "proxy_stream.ttft_over_first_window_ms",
        "ratio",
        50,
        True,
        "proxy stream TTFT, 400 tokens at 10 ms: at most the upstream's first window + 50 ms (excess in ms)",
    ),
    Target(
        "proxy_redacted.neighbour_p50_over_idle",
        "ratio",
        2.0,
        True,
        "proxy: a small stream's p50 beside 40,000-character redacted streams: <= 2x idle",
    ),
    Target(
        "ratio.agents.tool_stage_over_output_decision",
        "ratio",
        1.5,
        True,
        "proxy: the added p50 of an answer's 4 tool calls (cached evaluators): <= 1.5x one output-stage decision",
    ),
    Target(
        "ratio.workers.c16",
        "ratio",
        1.35,
        False,
        "serve --workers 2 vs --workers 1, 16 client processes, cached 10-rule policy: >= 1.35x decisions/s",
    ),
    Target(
        "eval.custom.cached",
        "throughput",
        1000,
        False,
        "crossaudit eval, 10,000 rows, 10 rules of deterministic custom evaluators (engine cache on), "
        "measures included: >= 1,000 rows/s",
    ),
    Target(
        "server_cpu_ms_per_decision",
        "ratio",
        1.2,
        True,
        "server CPU per cached 10-rule decision, 16 clients (bench_cpu, beside a bare grpc.aio call): <= 1.2 ms",
    ),
    Target(
        "ratio.p50_vs_health.c1",
        "ratio",
        3.0,
        True,
        "gRPC Evaluate p50 at 1 client, cached 10-rule policy: <= 3x the health-check round trip (bench_cpu)",
    ),
)

SCENARIOS: dict[str, Scenario] = {}
RATIOS: dict[str, float] = {}


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def record(
    name: str,
    label: str,
    latencies_ms: Sequence[float],
    wall_s: float,
    *,
    unit: str,
    concurrency: int,
    group: str = "",
    **extra: Any,
) -> Scenario:
    """Record a scenario from its latencies and the wall time they took (throughput = n / wall)."""
    s = Scenario(
        name=name,
        label=label,
        unit=unit,
        concurrency=concurrency,
        samples=len(latencies_ms),
        p50_ms=statistics.median(latencies_ms),
        p95_ms=percentile(latencies_ms, 0.95),
        p99_ms=percentile(latencies_ms, 0.99),
        throughput=len(latencies_ms) / wall_s if wall_s > 0 else 0.0,
        group=group or name.split(".")[0],
        extra=extra,
    )
    SCENARIOS[name] = s
    return s


def ratio(name: str, value: float) -> None:
    RATIOS[name] = value


def _measured(t: Target) -> float | None:
    if t.metric == "ratio":
        return RATIOS.get(t.scenario)
    s = SCENARIOS.get(t.scenario)
    return None if s is None else float(getattr(s, t.metric))


def target_lines() -> list[str]:
    lines = []
    for t in TARGETS:
        got = _measured(t)
        if got is None:
            lines.append(f"  [not run]  {t.text}")
            continue
        lines.append(f"  [{'met' if _met(t, got) else 'MISSED':<6}]  {t.text}: measured {got:,.2f}")
    return lines


def results() -> dict[str, Any]:
    return {
        "generated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"cpus": _cpus(), "python": platform.python_version(), "system": platform.system()},
        "scenarios": [asdict(s) for s in SCENARIOS.values()],
        "ratios": RATIOS,
        "targets": [_target_result(t) for t in TARGETS],
    }


def _target_result(t: Target) -> dict[str, Any]:
    got = _measured(t)
    return {**asdict(t), "measured": got, "met": None if got is None else _met(t, got)}


def _met(t: Target, got: float) -> bool:
    return got <= t.bound if t.at_most else got >= t.bound


def _cpus() -> int:
    import os

    return len(os.sched_getaffinity(0))


def write(out: Path) -> tuple[Path, Path]:
    """``results.json`` and ``results.png`` in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    data = out / "results.json"
    data.write_text(json.dumps(results(), indent=2) + "\n")
    png = out / "results.png"
    plot(png)
    return data, png


def plot(path: Path) -> None:
    """Two panels per group of scenarios: latency percentiles (log scale) and throughput."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    groups: dict[str, list[Scenario]] = {}
    for s in SCENARIOS.values():
        groups.setdefault(s.group, []).append(s)
    if not groups:
        return
    fig, axes = plt.subplots(len(groups), 2, figsize=(13, 3.2 * len(groups)), squeeze=False)
    for row, (group, items) in enumerate(groups.items()):
        lat, thr = axes[row]
        labels = [s.label for s in items]
        x = range(len(items))
        width = 0.27
        for i, (key, name) in enumerate((("p50_ms", "p50"), ("p95_ms", "p95"), ("p99_ms", "p99"))):
            lat.bar([v + (i - 1) * width for v in x], [getattr(s, key) for s in items], width, label=name)
        lat.set_yscale("log")
        lat.set_ylabel("latency (ms, log)")
        lat.set_title(f"{group}: latency percentiles")
        lat.set_xticks(list(x), labels, rotation=20, ha="right", fontsize=8)
        lat.legend(fontsize=8)
        thr.bar(list(x), [s.throughput for s in items], color="tab:green")
        thr.set_ylabel(" / ".join(sorted({s.unit for s in items})))
        thr.set_title(f"{group}: throughput")
        thr.set_xticks(list(x), labels, rotation=20, ha="right", fontsize=8)
        for t in TARGETS:
            if t.metric == "throughput" and t.scenario in {s.name for s in items}:
                thr.axhline(t.bound, color="tab:red", linestyle="--", linewidth=1)
            if t.metric == "p50_ms" and t.scenario in {s.name for s in items}:
                lat.axhline(t.bound, color="tab:red", linestyle="--", linewidth=1)
    fig.suptitle(f"CrossAudit benchmarks ({_cpus()} CPUs; red dashed: targets)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
