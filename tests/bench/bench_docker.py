"""Docker sandbox benchmark: warm pool vs ``docker run`` per call, cold start, image build, throughput,
the per-call reset after each answer, and the CPU an idle pool burns.

The warm sequential call is measured on the default pool sizing with its spare
(``PoolLimits.spare_size=1``: the next call goes to a ready container while the last one resets)
side by side with the same pool without a spare (the old path: the next call waits for the
reset), in interleaved rounds, with the agent's part and the host's part of each call.

Run: ``python -m tests.bench docker`` (or ``make bench``). Prints figures measured side by side
in one run; asserts nothing (shared, noisy machines). Needs a Docker daemon.
Every loop is bounded in count and in time.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from crossaudit.kernel.depspec import validate_dependencies
from crossaudit.kernel.limits import PoolLimits, SandboxLimits
from sandbox.base import CodeBundle
from sandbox.deps import default_cache_dir, dependency_key
from sandbox.docker.backend import DockerSandbox, docker_client
from sandbox.docker.container import (
    AGENT_NOFILE_HEADROOM,
    AGENT_PIDS_HEADROOM,
    DEFAULT_ENV,
    OWNER_LABEL,
    POOL_LABEL,
    SCRATCH_DIRS,
    ipc_sysctls,
    owner_id,
)
from sandbox.docker.images import SANDBOX_UID, ImageManager
from sandbox.protocol import AgentChannel
from tests.bench import report
from tests.integration._docker import (
    GUIDE_PROFANITY_CODE,
    GUIDE_PROFANITY_DEPS,
    IDLE_BURNER_CODE,
    container_cpu_ns,
    percentile,
)

WARM_CALLS = 500
WARM_ROUNDS = 4  # interleaved rounds of WARM_CALLS / WARM_ROUNDS calls per variant (spare on / off)
RUN_PER_CALL = 10
THROUGHPUT_CALLS = 400
LEVEL_BUDGET_S = 60.0
IDLE_WINDOW_S = 3.0
LIMITS = SandboxLimits()


def _docker_run_argv(image: str, limits: SandboxLimits) -> list[str]:
    """The same hardening as the pool's containers, as ``docker run`` flags."""
    mem = str(limits.container_memory_bytes)
    nofile = limits.nofile + AGENT_NOFILE_HEADROOM
    scratch = f"rw,noexec,nosuid,nodev,size={limits.tmpfs_bytes},nr_inodes={limits.tmpfs_inodes},mode=1777"
    argv = [
        "docker", "run", "-i", "--rm", "--network", "none", "--read-only", "--ipc", "private",
        *(x for d in SCRATCH_DIRS for x in ("--tmpfs", f"{d}:{scratch}")),
        *(x for k, v in ipc_sysctls(limits).items() for x in ("--sysctl", f"{k}={v}")), "--cap-drop", "ALL",
        "--security-opt", "no-new-privileges", "--memory", mem, "--memory-swap", mem,
        "--pids-limit", str(limits.pids + AGENT_PIDS_HEADROOM), "--cpus", str(limits.cpus),
        "--ulimit", f"nofile={nofile}:{nofile}", "--ulimit", "core=0:0", "--log-driver", "none",
        "--user", f"{SANDBOX_UID}:{SANDBOX_UID}", "--label", "crossaudit.sandbox=1",
        "--label", f"{OWNER_LABEL}={owner_id()}",  # a live owner: reapers of other processes leave it alone
    ]  # fmt: skip
    for k, v in DEFAULT_ENV.items():
        argv += ["-e", f"{k}={v}"]
    return [*argv, image]


def docker_run_per_call(image: str, preload: tuple[str, ...], n: int) -> list[float]:
    """Wall time of a whole ``docker run`` (start, load with preload, one call, exit, remove) per call."""
    if shutil.which("docker") is None:
        return []
    load = AgentChannel.load_frame(GUIDE_PROFANITY_CODE, preload=preload, restricted=False, limits=LIMITS)
    _, call = AgentChannel.call_frame("p", "some badword1 text", {})
    stdin = (json.dumps(load) + "\n" + json.dumps(call) + "\n").encode()
    out = []
    deadline = time.monotonic() + 300
    for _ in range(n):
        if time.monotonic() > deadline:
            break
        t0 = time.perf_counter()
        proc = subprocess.run(_docker_run_argv(image, LIMITS), input=stdin, capture_output=True, timeout=60)
        if b'"op":"result"' in proc.stdout:
            out.append((time.perf_counter() - t0) * 1000)
        else:
            print(f"  docker run gave no result (rc={proc.returncode}): {proc.stderr[-200:]!r}")
    return out


async def warm_latencies(
    sb: DockerSandbox, bundle: CodeBundle, n: int, agent_ms: list[float], sizes: list[int] | None = None
) -> list[float]:
    """``n`` sequential calls, each issued as soon as the last one answered; appends each call's
    agent part (``agent_ms``: inside the container, from the call frame to the answer) to ``agent_ms``
    and the pool's worker count after it (serving, resetting, spare, starting) to ``sizes``."""
    lat = []
    for i in range(n):
        t0 = time.perf_counter()
        _, diag = await sb.run(bundle, "p", f"text {i} with badword1", {}, timeout=10)
        lat.append((time.perf_counter() - t0) * 1000)
        if sizes is not None:
            sizes.append(sb._pools[bundle.pool_key].total)
        if isinstance(diag.extra.get("agent_ms"), int | float):
            agent_ms.append(float(diag.extra["agent_ms"]))
    return lat


SEQUENTIAL_POOL = PoolLimits(min_size=1, max_size=4, queue_wait_s=10.0)  # the default sizing
NEW_PATH, OLD_PATH = "spare + idle reset", "old path"
SPARE_VARIANTS = {  # label: (PoolLimits.spare_size, reset at SCHED_IDLE)
    NEW_PATH: (1, True),
    "spare, reset at normal priority": (1, False),
    OLD_PATH: (0, False),  # the next call waits for the reset; the reset competes with calls for the CPUs
}


async def sequential_side_by_side(bundle: CodeBundle) -> dict[str, dict]:
    """Warm sequential calls, cleanup included, on the default pool with and without its spare:
    two sandboxes (one pool each), warmed up, then measured in interleaved rounds."""
    boxes = {}
    out: dict[str, dict] = {}
    try:
        for label, (spare, idle) in SPARE_VARIANTS.items():
            sb = DockerSandbox(LIMITS, pool_limits=dataclasses.replace(SEQUENTIAL_POOL, spare_size=spare))
            await sb.start()
            assert sb._rt is not None
            sb._rt.idle_reset = idle
            await sb.prepare(bundle)
            await warm_latencies(sb, bundle, 20, [])  # the spare starts (off the path) during these
            boxes[label] = sb
            out[label] = {"lat": [], "agent": [], "waits": 0, "sizes": [], "resets": []}
        await asyncio.sleep(3.0)
        for _ in range(WARM_ROUNDS):
            for label, sb in boxes.items():
                pool = sb._pools[bundle.pool_key]
                waits, pool.resets = pool.reset_waits, collections.deque(maxlen=pool.resets.maxlen)
                row = out[label]
                row["lat"] += await warm_latencies(sb, bundle, WARM_CALLS // WARM_ROUNDS, row["agent"], row["sizes"])
                await asyncio.sleep(0.3)  # the last reset is reported after its answer
                row["waits"] += pool.reset_waits - waits
                row["resets"] += list(pool.resets)
                row["failures"] = pool.cleanup_failures
    finally:
        for sb in boxes.values():
            await sb.aclose()
    return out


def reset_figures(resets: list[dict]) -> str:
    """The agent's reset after each answer (off the request path), from its ``reset`` frames."""
    def p(key: str, q: float) -> float:
        return percentile([float(r.get(key) or 0.0) for r in resets], q)

    return (f"cleanup p50 {p('cleanup_ms', 50):.2f} ms  p99 {p('cleanup_ms', 99):.2f} ms  max "
            f"{max(float(r['cleanup_ms']) for r in resets):.2f} ms (of which waiting for the call's processes "
            f"to exit: p50 {p('reap_ms', 50):.2f} ms); then the fork of the next child p50 {p('spawn_ms', 50):.2f} ms")


async def idle_cpu(client) -> dict[str, float]:
    """Fraction of one core a warm container uses with no call in flight, after one call whose module
    body tried to burn CPU (a fork chain, spinning threads): read from the container's cgroup."""
    out: dict[str, float] = {}
    sb = DockerSandbox(LIMITS, pool_limits=PoolLimits(min_size=1, max_size=1))
    try:
        for name, code in IDLE_BURNER_CODE.items():
            bundle = CodeBundle(code, tenant=f"bench-idle-{name}")
            await sb.prepare(bundle)
            found = client.api.containers(filters={"label": f"{POOL_LABEL}={bundle.pool_key[:32]}"})
            await sb.run(bundle, "", "", {}, timeout=10)  # the module body runs inside this call
            await asyncio.sleep(0.5)
            n0, t0 = await asyncio.to_thread(container_cpu_ns, client, found[0]["Id"])
            await asyncio.sleep(IDLE_WINDOW_S)
            n1, t1 = await asyncio.to_thread(container_cpu_ns, client, found[0]["Id"])
            out[name] = (n1 - n0) / 1e9 / (t1 - t0)
            await sb.evict(bundle)
    finally:
        await sb.aclose()
    return out


async def throughput(
    sb: DockerSandbox, bundle: CodeBundle, concurrency: int, total: int
) -> tuple[float, int, list[float], float]:
    """Calls/s with ``concurrency`` workers sharing ``total`` calls (bounded by LEVEL_BUDGET_S);
    also the calls' latencies (ms) and the wall time."""
    remaining = total
    errors = 0
    deadline = time.monotonic() + LEVEL_BUDGET_S
    latencies: list[float] = []

    async def worker() -> None:
        nonlocal remaining, errors
        while remaining > 0 and time.monotonic() < deadline:
            remaining -= 1
            t0 = time.perf_counter()
            try:
                await sb.run(bundle, "p", "a fine answer", {}, timeout=10)
                latencies.append((time.perf_counter() - t0) * 1000)
            except Exception:
                errors += 1

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = time.perf_counter() - t0
    return len(latencies) / wall, errors, latencies, wall


def build_time_with_warm_wheels(client, deps) -> float:
    """Rebuild the nltk+textblob image from cached wheels: pip install (no index) + docker build, no cache."""
    key = dependency_key(deps)
    wheels = default_cache_dir() / "wheels" / key
    if not (wheels / ".complete").is_file():
        return float("nan")
    with tempfile.TemporaryDirectory(prefix="bench-cache-") as tmp:
        shutil.copytree(wheels, Path(tmp) / "wheels" / key)
        mgr = ImageManager(client, cache_dir=Path(tmp))
        t0 = time.perf_counter()
        mgr.ensure_deps(deps, force=True)
        return time.perf_counter() - t0


async def run() -> None:
    client = docker_client()
    deps = validate_dependencies(GUIDE_PROFANITY_DEPS)
    print(f"cores={os.cpu_count()} docker={client.version().get('Version')} limits: cpus={LIMITS.cpus} "
          f"container_memory={LIMITS.container_memory_bytes >> 20} MiB")

    # First call of a *new* evaluator whose dependency image is cached, on a quiet default pool
    # (min_size 1), before the big pool below competes for the CPUs.
    small = DockerSandbox(LIMITS)
    try:
        t0 = time.perf_counter()
        await small.prepare(CodeBundle(GUIDE_PROFANITY_CODE, dependencies=GUIDE_PROFANITY_DEPS))
        print(f"prepare (images cached or built now): {time.perf_counter() - t0:.2f} s")
        await asyncio.sleep(1.0)
        firsts_prepared, firsts_cold = [], []
        for i in range(3):
            fresh = CodeBundle(GUIDE_PROFANITY_CODE + f"\n# bench {i} {time.time_ns()}\n", GUIDE_PROFANITY_DEPS)
            t0 = time.perf_counter()
            await small.prepare(fresh)
            await small.run(fresh, "p", "hello", {}, timeout=10)
            firsts_prepared.append((time.perf_counter() - t0) * 1000)
            await small.evict(fresh)
            cold = CodeBundle(GUIDE_PROFANITY_CODE + f"\n# cold {i} {time.time_ns()}\n", GUIDE_PROFANITY_DEPS)
            t0 = time.perf_counter()
            await small.run(cold, "p", "hello", {}, timeout=10)
            firsts_cold.append((time.perf_counter() - t0) * 1000)
            await small.evict(cold)
        image = small._images.find(deps)
        assert image is not None
    finally:
        await small.aclose()

    pool = PoolLimits(min_size=4, max_size=4, queue_wait_s=10.0)
    sb = DockerSandbox(LIMITS, pool_limits=pool)
    try:
        bundle = CodeBundle(GUIDE_PROFANITY_CODE, dependencies=GUIDE_PROFANITY_DEPS)
        await sb.prepare(bundle)
        await asyncio.sleep(3.0)  # let the pool reach min_size off the request path
        per_call = await asyncio.to_thread(docker_run_per_call, image.tag, image.preload, RUN_PER_CALL)
        run_p50 = percentile(per_call, 50) if per_call else float("nan")

        rates = {}
        for conc in (1, 4, 16):
            rates[conc] = await throughput(sb, bundle, conc, THROUGHPUT_CALLS)
    finally:
        await sb.aclose()
    sequential = await sequential_side_by_side(CodeBundle(GUIDE_PROFANITY_CODE, dependencies=GUIDE_PROFANITY_DEPS))
    seq = sequential[NEW_PATH]
    warm, resets, failures = seq["lat"], seq["resets"], seq["failures"]
    p50 = percentile(warm, 50)

    idle = await idle_cpu(client)
    build_s = await asyncio.to_thread(build_time_with_warm_wheels, client, deps)

    print(f"evaluator: the guide's custom_profanity_filter, dependencies {list(GUIDE_PROFANITY_DEPS)}")
    print(f"warm call, sequential, cleanup included (pool min {SEQUENTIAL_POOL.min_size} max "
          f"{SEQUENTIAL_POOL.max_size}; {WARM_ROUNDS} interleaved rounds of {WARM_CALLS // WARM_ROUNDS} calls each):")
    for label, row in sequential.items():
        agent50 = percentile(row["agent"], 50)
        host50 = percentile([t - a for t, a in zip(row["lat"], row["agent"], strict=False)], 50)
        print(f"  {label:<32} p50 {percentile(row['lat'], 50):.2f} ms   p99 {percentile(row['lat'], 99):.2f} ms   "
              f"agent p50 {agent50:.2f} ms + host p50 {host50:.2f} ms   calls that waited for a reset "
              f"{row['waits']}/{len(row['lat'])}   warm containers "
              f"{collections.Counter(row['sizes']).most_common(1)[0][0]} mostly, {max(row['sizes'])} at most")
    old = sequential[OLD_PATH]
    print(f"  ratio old path / new p50: {percentile(old['lat'], 50) / p50:.2f}x")
    print(f"reset after each warm call with the spare ({len(resets)} resets, {failures} failed): "
          f"{reset_figures(resets)}")
    print(f"docker run per call ({len(per_call)} runs): p50 {run_p50:.0f} ms")
    print(f"ratio docker-run / warm p50: {run_p50 / p50:.0f}x")
    print(f"first call of a new evaluator, dependency image cached (median of 3): prepare+call "
          f"{percentile(firsts_prepared, 50):.0f} ms; run() without prepare {percentile(firsts_cold, 50):.0f} ms")
    print(f"image build nltk+textblob, warm wheel cache (pip install --no-index + docker build --no-cache): "
          f"{build_s:.1f} s")
    for conc, (rate, errors, lat, wall) in rates.items():
        print(f"throughput at {conc:>2} concurrent (pool max {pool.max_size}): {rate:7.1f} calls/s  errors={errors}"
              f"  p50 {percentile(lat, 50):.2f} ms")
        report.record(f"docker.warm.c{conc}", f"docker warm c={conc}", lat, wall, unit="calls/s",
                      concurrency=conc, group="docker sandbox", errors=errors)
    report.record("docker.warm.c1", "docker warm c=1 (sequential)", warm, sum(warm) / 1000, unit="calls/s",
                  concurrency=1, group="docker sandbox", agent_p50_ms=percentile(seq["agent"], 50),
                  old_path_p50_ms=percentile(old["lat"], 50), reset_waits=seq["waits"])
    print(f"idle CPU over {IDLE_WINDOW_S:.0f} s after one call, module body that tries to burn it: "
          + ", ".join(f"{name} {share:.1%} of a core" for name, share in idle.items()))


def main() -> None:
    if not DockerSandbox.available():
        print("no Docker daemon answers: docker benchmark skipped")
        return
    asyncio.run(run())


if __name__ == "__main__":
    main()
