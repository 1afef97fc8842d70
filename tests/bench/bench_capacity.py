"""Capacity model (docs/capacity.md): CPU per decision by evaluator kind, and memory per part.

Wall decisions/s on a shared 2-core machine mostly says who else was running: the clients, the
server and other jobs take turns on the same cores. What a decision costs the serving side in
CPU seconds does not depend on that, so that is what is measured, and ``decisions / serving CPU
seconds`` is the decisions/s one core sustains.

Each scenario starts a real ``crossaudit serve`` (a separate process) with a policy of ONE
evaluator kind, warms it up, then drives it with ``CLIENTS`` concurrent gRPC clients for
``DURATION_S`` (at most ``MAX_DECISIONS``). Over that window it accounts:

- the server process and all its descendants (model servers, process-sandbox agents and the
  children they fork and reap): utime + stime + cutime + cstime from ``/proc/<pid>/stat``;
- Docker sandboxes: each of the server's containers' cgroup CPU (``container_cpu_ns``), plus the
  Docker daemon side, reported separately: dockerd, containerd, and the containerd-shim and
  fuse-overlayfs processes of those containers (the attach channel's frames cross dockerd and the
  shim; the default socket channel bypasses both);
- the clients' CPU (this process, the LLM stub's threads included): reported, not counted.

Memory is read after the window: the server's RSS/PSS, each model server's, the process agents',
and each warm sandbox container's cgroup memory (``usage`` less inactive file pages, as ``docker
stats`` shows it). PostgreSQL writes per decision are ``python -m tests.bench replicas``'s.

Run: ``python -m tests.bench capacity``. Every loop is bounded in count and time; asserts nothing.
``CROSSAUDIT_BENCH_CAPACITY=detoxify,llm`` runs only those scenarios; ``CROSSAUDIT_BENCH_SCALE``
multiplies the durations.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import os
import resource
import socket
import statistics
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from crossaudit.kernel.ownership import OWNER_LABEL
from crossaudit.sdk.client import AsyncClient
from tests.bench import report
from tests.bench.bench_builtins import BERT_BASE_SHAPE, DECISION_RESPONSES
from tests.e2e.conftest import ServerProcess, key
from tests.e2e.policies import ten_rules
from tests.integration._docker import BENIGN_CODE, SENTIMENT_CODE, container_cpu_ns, percentile
from tests.openai_stub import OpenAIStub

SCALE = float(os.environ.get("CROSSAUDIT_BENCH_SCALE", "1"))  # multiplies the durations
ONLY = tuple(k for k in os.environ.get("CROSSAUDIT_BENCH_CAPACITY", "").split(",") if k)  # scenario keys; all
CLIENTS = 16
WARMUP_SEQUENTIAL = 5  # decisions checked one by one: the harness must work before it is timed
WARMUP_S = 5.0 * SCALE  # then concurrent load: pools grow, model servers see their batch shapes
SETTLE_S = 0.5
DURATION_S = 12.0 * SCALE
MAX_DECISIONS = 20_000  # bound per scenario
CALL_TIMEOUT_S = 30.0
FIRST_CALL_TIMEOUT_S = 300.0  # the first decision starts model servers / builds images
IDLE_S = 2.0  # the serving side's (and Docker daemon side's) background CPU, read before the window
PROMPT = "Summarise the answer for the customer."
CLK_TCK = os.sysconf("SC_CLK_TCK")
DAEMON_COMMS = ("dockerd", "containerd")


# --- policies: one evaluator kind each ------------------------------------------------------------


def _one_rule(name: str, evaluator: str) -> str:
    return f"""
name: {name}
description: one evaluator kind, for the capacity benchmark
version: "1.0"
evaluators:
{textwrap.indent(evaluator.strip(), "  ")}
rules:
  - name: only
    evaluator: e
    threshold: 0.5
    action: warn
"""


def _custom(name: str, code: str, deps: tuple[str, ...] = ()) -> str:
    dep_line = f"\n    dependencies: {json.dumps(list(deps))}" if deps else ""
    body = textwrap.indent(code.strip(), "      ")
    return _one_rule(name, f"- name: e\n  type: custom\n  config:{dep_line}\n    code: |\n{body}\n")


def _builtin(name: str, config: str) -> str:
    return _one_rule(name, f"- name: e\n  type: builtin\n  config: {config}\n")


def _llm(url: str) -> str:
    return _one_rule(
        "capacity-llm",
        f'- name: e\n  type: llm\n  config: {{provider: openai_compatible, model: judge-1, base_url: "{url}"}}\n',
    )


@dataclass
class Case:
    key: str  # scenario name: capacity.<key>
    label: str
    policy: Callable[[], str]
    name: str  # the policy's name
    sandbox: str = "process"
    env: dict[str, str] = field(default_factory=dict)
    extra: tuple[str, ...] = ()
    same_response: bool = False  # the cached scenario asks the same question every time
    container_memory: bool = False  # read each warm sandbox container's cgroup memory


# --- CPU and memory accounting ----------------------------------------------------------------


def _stat(pid: int) -> tuple[int, int, int] | None:
    """(ppid, own CPU ticks, reaped children's CPU ticks) of ``pid``, or None if it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    rest = text[text.rindex(")") + 2 :].split()  # after "pid (comm) ": state ppid ... (fields 3..)
    return int(rest[1]), int(rest[11]) + int(rest[12]), int(rest[13]) + int(rest[14])


def _processes() -> dict[int, tuple[int, str]]:
    """pid -> (ppid, comm) of every process this machine shows."""
    out: dict[int, tuple[int, str]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            text = Path(entry.path, "stat").read_text()
            comm = text[text.index("(") + 1 : text.rindex(")")]
            out[int(entry.name)] = (int(text[text.rindex(")") + 2 :].split()[1]), comm)
    return out


def _tree(root: int) -> list[int]:
    procs = _processes()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in procs.items():
        children.setdefault(ppid, []).append(pid)
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += children.get(pid, [])
    return out


def tree_cpu_s(root: int) -> float:
    """CPU seconds of ``root`` and its descendants, including children they have reaped: a process
    that exits in the window moves its time into its parent's cutime, so a delta stays whole."""
    total = 0
    for pid in _tree(root):
        st = _stat(pid)
        if st is not None:
            total += st[1] + st[2]
    return total / CLK_TCK


def own_cpu_s(pids: list[int]) -> float:
    """CPU seconds of these processes alone (their children are counted elsewhere: cgroups)."""
    return sum(st[1] for pid in pids if (st := _stat(pid)) is not None) / CLK_TCK


def _daemon_cpu(daemon: dict[str, list[int]]) -> dict[str, float]:
    return {part: own_cpu_s(pids) for part, pids in daemon.items()}


def client_cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def memory_mib(pid: int) -> dict[str, float]:
    """Rss and Pss (MiB) of one process (Pss shares pages among the processes mapping them)."""
    out: dict[str, float] = {}
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            name, _, value = line.partition(":")
            if name in ("Rss", "Pss"):
                out[name.lower()] = round(int(value.split()[0]) / 1024, 1)
    return out


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def server_parts(server_pid: int) -> dict[str, list[int]]:
    """The server's descendants by role: model servers (per model) and process-sandbox agents."""
    parts: dict[str, list[int]] = {}
    for pid in _tree(server_pid)[1:]:
        argv = _cmdline(pid)
        if "crossaudit.modelserver.server" in argv:
            model = argv[argv.index("--model") + 1] if "--model" in argv else "?"
            parts.setdefault(f"model server {model}", []).append(pid)
        elif any(a.endswith("launch.py") for a in argv):  # an agent, its I/O process, a forked child
            parts.setdefault("process sandbox", []).append(pid)
    return parts


class DockerSide:
    """The server's sandbox containers (by owner label) and the daemon-side processes serving them."""

    def __init__(self, server_pid: int) -> None:
        from sandbox.docker.backend import docker_client

        self.client = docker_client()
        self.owner = f"{socket.gethostname()}:{server_pid}"

    def containers(self) -> list[str]:
        found = self.client.api.containers(filters={"label": [f"{OWNER_LABEL}={self.owner}"]})
        return [c["Id"] for c in found]

    def others_running(self) -> int:
        """Containers not of this server: their traffic also costs dockerd/containerd CPU."""
        return len(self.client.api.containers()) - len(self.containers())

    def container_cpu_s(self, ids: list[str]) -> dict[str, float]:
        return {cid: container_cpu_ns(self.client, cid)[0] / 1e9 for cid in ids}

    def daemon_pids(self, ids: list[str]) -> dict[str, list[int]]:
        """dockerd + containerd, and the shims and fuse-overlayfs mounts of these containers."""
        procs = _processes()
        out: dict[str, list[int]] = {"dockerd+containerd": [p for p, (_, c) in procs.items() if c in DAEMON_COMMS]}
        shims, mounts = [], []
        for cid in ids:
            info = self.client.api.inspect_container(cid)
            init = int(info["State"].get("Pid") or 0)
            if init in procs and procs[procs[init][0]][1].startswith("containerd-shim"):
                shims.append(procs[init][0])
            merged = (info.get("GraphDriver") or {}).get("Data", {}).get("MergedDir") or ""
            if merged:
                mounts += [p for p, (_, c) in procs.items() if c == "fuse-overlayfs" and merged in _cmdline(p)]
        out["shims+fuse-overlayfs"] = shims + mounts
        return out

    def memory(self, cid: str) -> dict[str, float]:
        """cgroup memory of one container (MiB): usage, and used = usage less inactive file pages."""
        mem = self.client.api.stats(cid, stream=False, one_shot=True)["memory_stats"]
        stats = mem.get("stats") or {}
        usage = int(mem.get("usage") or 0)
        inactive = stats.get("total_inactive_file", stats.get("inactive_file", 0))
        used = usage - inactive if inactive < usage else usage
        return {
            "usage": round(usage / 2**20, 1),
            "used": round(used / 2**20, 1),
            "rss": round(int(stats.get("total_rss", stats.get("anon", 0))) / 2**20, 1),
        }


# --- one scenario ---------------------------------------------------------------------------------


@dataclass
class Window:
    decisions: int = 0
    errors: int = 0  # calls that raised
    errored: int = 0  # decisions with a rule that got no verdict
    wall_s: float = 0.0
    latencies_ms: list[float] = field(default_factory=list)
    cpu: dict[str, float] = field(default_factory=dict)  # serving-side CPU seconds by part
    daemon: dict[str, float] = field(default_factory=dict)  # Docker daemon side, CPU seconds by part
    idle_per_s: float = 0.0  # serving side's CPU seconds per second with no call in flight
    daemon_idle_per_s: float = 0.0
    client_s: float = 0.0
    others_running: int = 0
    pool: list[int] = field(default_factory=lambda: [0, 0])  # descendants + containers before, after

    @property
    def daemon_s(self) -> float:
        return sum(self.daemon.values())


async def _measure(case: Case, srv: ServerProcess) -> tuple[Window, dict[str, Any]]:
    clients = [AsyncClient(srv.address, api_key=key("acme")) for _ in range(CLIENTS)]
    docker = DockerSide(srv.pid) if case.sandbox == "docker" else None
    w = Window()
    try:
        await clients[0].deploy_policy(case.policy())
        for i in range(WARMUP_SEQUENTIAL):
            d = await clients[0].evaluate(case.name, PROMPT, _response(case, 0, i), timeout=FIRST_CALL_TIMEOUT_S)
            if d.errored_rules:
                raise RuntimeError(f"{case.key}: warm-up decision errored: {[r.model_dump() for r in d.rules]}")
        await _load(case, clients, WARMUP_S, 10**9, Window())

        await asyncio.sleep(SETTLE_S)
        ids: list[str] = []
        daemon: dict[str, list[int]] = {}
        if docker is not None:
            ids = await asyncio.to_thread(docker.containers)
            daemon = await asyncio.to_thread(docker.daemon_pids, ids)
        i0, di0 = tree_cpu_s(srv.pid), _daemon_cpu(daemon)
        await asyncio.sleep(IDLE_S)
        w.idle_per_s = (tree_cpu_s(srv.pid) - i0) / IDLE_S
        w.daemon_idle_per_s = (sum(_daemon_cpu(daemon).values()) - sum(di0.values())) / IDLE_S
        if docker is not None:
            c0 = await asyncio.to_thread(docker.container_cpu_s, ids)
        d0 = _daemon_cpu(daemon)
        s0, o0, k0 = tree_cpu_s(srv.pid), own_cpu_s([srv.pid]), client_cpu_s()
        w.pool = [len(_tree(srv.pid)) - 1 + len(ids), 0]

        await _load(case, clients, DURATION_S, MAX_DECISIONS, w)

        s1, o1, k1, d1 = tree_cpu_s(srv.pid), own_cpu_s([srv.pid]), client_cpu_s(), _daemon_cpu(daemon)
        w.cpu["server process"] = o1 - o0  # its own threads: what one interpreter (one GIL) carries
        w.cpu["its descendants"] = (s1 - s0) - (o1 - o0)  # model servers, process-sandbox agents
        w.client_s = k1 - k0
        w.daemon = {k: d1[k] - d0[k] for k in d0}
        if docker is not None:
            now = await asyncio.to_thread(docker.containers)
            c1 = await asyncio.to_thread(docker.container_cpu_s, now)
            w.cpu["sandbox containers"] = sum(v - c0.get(cid, 0.0) for cid, v in c1.items())
            w.others_running = await asyncio.to_thread(docker.others_running)
            ids = now
        w.pool[1] = len(_tree(srv.pid)) - 1 + len(ids)
        memory = await asyncio.to_thread(_memory, srv.pid, docker, ids if case.container_memory else [])
        return w, memory
    finally:
        for c in clients:
            await c.close()


def _response(case: Case, worker: int, n: int) -> str:
    if case.same_response:
        return DECISION_RESPONSES[0]
    return f"{DECISION_RESPONSES[(worker + n) % len(DECISION_RESPONSES)]} (#{worker}.{n})"


async def _load(case: Case, clients: list[AsyncClient], duration_s: float, bound: int, w: Window) -> None:
    stop = time.perf_counter() + duration_s
    per_client = max(1, bound // len(clients))

    async def worker(i: int, c: AsyncClient) -> None:
        for n in range(per_client):
            if time.perf_counter() > stop:
                return
            t0 = time.perf_counter()
            try:
                d = await c.evaluate(case.name, PROMPT, _response(case, i, n), timeout=CALL_TIMEOUT_S)
            except Exception:  # a refused or failed call still cost CPU: counted, reported
                w.errors += 1
                continue
            w.latencies_ms.append((time.perf_counter() - t0) * 1000)
            w.decisions += 1
            w.errored += bool(d.errored_rules)

    t0 = time.perf_counter()
    await asyncio.gather(*(worker(i, c) for i, c in enumerate(clients)))
    w.wall_s = time.perf_counter() - t0


def _memory(server_pid: int, docker: DockerSide | None, container_ids: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {"server": memory_mib(server_pid)}
    for part, pids in server_parts(server_pid).items():
        out[part] = [memory_mib(p) for p in pids]
    if docker is not None and container_ids:
        out["sandbox containers"] = [docker.memory(cid) for cid in container_ids]
    return out


# --- cases ----------------------------------------------------------------------------------------


@contextlib.contextmanager
def _detoxify_store(root: Path) -> Iterator[tuple[Path | None, str]]:
    """A bert-base-sized Detoxify (random weights: speed is real, scores are not), exported to ONNX
    (fp32 + int8) and imported into a model store, as ``bench_builtins`` builds it."""
    if ONLY and "detoxify" not in ONLY:
        yield None, "not among CROSSAUDIT_BENCH_CAPACITY"
        return
    missing = [
        m for m in ("torch", "transformers", "detoxify", "onnx", "onnxruntime") if not importlib.util.find_spec(m)
    ]
    if missing:
        yield None, f"not installed: {', '.join(missing)} (make models export)"
        return
    from crossaudit.cli.main import main as cli
    from crossaudit.modelserver.export import export_detoxify
    from crossaudit.modelserver.testing import build_tiny_detoxify

    t0 = time.perf_counter()
    tiny = build_tiny_detoxify(root / "ckpt", **BERT_BASE_SHAPE)
    export = export_detoxify(tiny.checkpoint, tiny.config_dir, root / "onnx")
    store = root / "store"
    if cli(["models", "import", "detoxify", str(export.directory), "--store", str(store)]) != 0:
        yield None, "crossaudit models import of the ONNX export failed"
        return
    sizes = ", ".join(f"{k} {os.path.getsize(v) / 1e6:.0f} MB" for k, v in export.files.items())
    yield (
        store,
        f"bert-base-sized Detoxify, random weights, ONNX export ({sizes}), built in {time.perf_counter() - t0:.0f} s",
    )


def _cases(stub_url: str, store: Path | None) -> list[Case]:
    offline = {"HF_HUB_OFFLINE": "1"}
    cases = [
        Case(
            "cached",
            "service + engine + audit, 10 rules, evaluator results cached",
            lambda: ten_rules(cached=True),
            "ten-rules-cached",
            same_response=True,
        ),
        Case(
            "custom_process",
            "custom code, process sandbox (trivial evaluator)",
            lambda: _custom("capacity-custom", BENIGN_CODE),
            "capacity-custom",
        ),
        Case(
            "custom_docker",
            "custom code, warm Docker sandbox (trivial evaluator)",
            lambda: _custom("capacity-custom", BENIGN_CODE),
            "capacity-custom",
            sandbox="docker",
            container_memory=True,
        ),
        Case(
            "custom_docker_attach",
            "custom code, warm Docker sandbox, attach channel (remote daemon, compose)",
            lambda: _custom("capacity-custom", BENIGN_CODE),
            "capacity-custom",
            sandbox="docker",
            extra=("--set", "docker_channel=attach"),
        ),
        Case(
            "textblob_docker",
            "custom code importing textblob + nltk, warm Docker sandbox",
            lambda: _custom("capacity-textblob", SENTIMENT_CODE, ("nltk", "textblob")),
            "capacity-textblob",
            sandbox="docker",
            container_memory=True,
        ),
        Case(
            "langdetect",
            "builtin langdetect (model server)",
            lambda: _builtin("capacity-langdetect", "{model: langdetect}"),
            "capacity-langdetect",
            env=offline,
        ),
        Case(
            "presidio",
            "builtin Presidio, pattern entities (model server, no spaCy model)",
            lambda: _builtin("capacity-presidio", "{model: presidio, entities: [EMAIL, SSN, CREDIT_CARD]}"),
            "capacity-presidio",
            env=offline,
        ),
    ]
    if store is not None:
        cases.append(
            Case(
                "detoxify",
                "builtin Detoxify bert-base, ONNX int8 (model server, micro-batched)",
                lambda: _builtin("capacity-detoxify", "{model: detoxify, categories: [toxicity]}"),
                "capacity-detoxify",
                env={**offline, "CROSSAUDIT_MODEL_STORE": str(store)},
            )
        )
    cases.append(
        Case(
            "llm",
            "LLM evaluator, local OpenAI-compatible stub (the service's own cost)",
            lambda: _llm(stub_url),
            "capacity-llm",
            extra=("--llm-base-url-host", "127.0.0.1"),
        )
    )
    return cases


# --- main -----------------------------------------------------------------------------------------


def _run_case(case: Case, root: Path) -> tuple[Window, dict[str, Any]] | str:
    if case.sandbox == "docker":
        from sandbox.docker.backend import DockerSandbox

        if not DockerSandbox.available():
            return "no Docker daemon answers"
    with ServerProcess(root / case.key, sandbox=case.sandbox, env=case.env, extra=case.extra) as srv:
        return asyncio.run(_measure(case, srv))


def _mean(values: list[float]) -> float:
    return statistics.mean(values) if values else float("nan")


def _fmt_memory(memory: dict[str, Any]) -> str:
    parts = [f"server RSS {memory['server'].get('rss', 0):.0f} MiB (PSS {memory['server'].get('pss', 0):.0f})"]
    for part, values in memory.items():
        if part.startswith("model server"):
            parts += [f"{part} RSS {v.get('rss', 0):.0f} MiB (PSS {v.get('pss', 0):.0f})" for v in values]
        if part.startswith("process sandbox"):  # agents, their I/O processes and waiting children share pages
            rss, pss = sum(v.get("rss", 0.0) for v in values), sum(v.get("pss", 0.0) for v in values)
            parts.append(f"{len(values)} process-sandbox processes: RSS {rss:.0f} MiB in all, PSS {pss:.0f} MiB")
        if part == "sandbox containers":
            used = [v["used"] for v in values]
            parts.append(
                f"{len(values)} warm containers: used {min(used):.1f}-{max(used):.1f} MiB "
                f"(cgroup usage {_mean([v['usage'] for v in values]):.0f}, rss "
                f"{_mean([v['rss'] for v in values]):.1f})"
            )
    return "; ".join(parts)


def main() -> None:
    print(
        f"{os.cpu_count()} cores, load average {' / '.join(f'{x:.2f}' for x in os.getloadavg())}; "
        f"{CLIENTS} clients per scenario, {DURATION_S:g} s (at most {MAX_DECISIONS} decisions) after "
        f"{WARMUP_SEQUENTIAL} checked + {WARMUP_S:g} s concurrent warm-up"
    )
    rows: list[tuple[Case, Window, dict[str, Any]]] = []
    stub = OpenAIStub(score=0.9)
    try:
        with (
            tempfile.TemporaryDirectory(prefix="bench-capacity-") as tmp,
            _detoxify_store(Path(tmp) / "models") as (
                store,
                how,
            ),
        ):
            print(f"Detoxify: {how}" if store is not None else f"Detoxify skipped: {how}")
            for case in _cases(stub.url, store):
                if ONLY and case.key not in ONLY:
                    continue
                print(f"\n[{case.key}] {case.label}", flush=True)
                got = _run_case(case, Path(tmp))
                if isinstance(got, str):
                    print(f"  skipped: {got}")
                    continue
                w, memory = got
                rows.append((case, w, memory))
                _print_case(case, w, memory)
                _record(case, w, memory)
    finally:
        stub.close()
    _summary(rows)


def _serving_s(w: Window) -> float:
    return sum(w.cpu.values()) + w.daemon_s


def _print_case(case: Case, w: Window, memory: dict[str, Any]) -> None:
    n = max(1, w.decisions)
    serving = _serving_s(w)
    print(
        f"  {w.decisions} decisions in {w.wall_s:.1f} s: wall {w.decisions / w.wall_s:.0f} decisions/s, p50 "
        f"{statistics.median(w.latencies_ms):.1f} ms, p95 {percentile(w.latencies_ms, 95):.1f} ms; "
        f"{w.errors} failed calls, {w.errored} decisions with an errored rule"
    )
    parts = ", ".join(f"{k} {v * 1000 / n:.2f}" for k, v in w.cpu.items())
    if case.sandbox == "docker":
        parts += ", Docker daemon side " + " + ".join(f"{v * 1000 / n:.2f} ({k})" for k, v in w.daemon.items())
    print(
        f"  serving CPU {serving:.2f} s = {serving * 1000 / n:.2f} ms/decision ({parts}) -> "
        f"{n / serving:.0f} decisions/s per core"
    )
    if case.sandbox == "docker":
        own = sum(w.cpu.values())
        print(f"  without the Docker daemon side: {own * 1000 / n:.2f} ms/decision -> {n / own:.0f} per core")
    print(
        f"  clients (this process, not counted): {w.client_s * 1000 / n:.2f} ms/decision; busy cores in the "
        f"window: serving {serving / w.wall_s:.2f} + clients {w.client_s / w.wall_s:.2f} of {os.cpu_count()}"
    )
    idle = f"  idle before the window: serving side {w.idle_per_s * 1000:.0f} ms/s"
    if case.sandbox == "docker":
        idle += (
            f", Docker daemon side {w.daemon_idle_per_s * 1000:.0f} ms/s; other containers running: {w.others_running}"
        )
    print(idle + f"; server's processes + containers: {w.pool[0]} before the window, {w.pool[1]} after")
    print(f"  memory after the window: {_fmt_memory(memory)}")


def _record(case: Case, w: Window, memory: dict[str, Any]) -> None:
    n = max(1, w.decisions)
    serving = _serving_s(w)
    report.record(
        f"capacity.{case.key}",
        case.label,
        w.latencies_ms,
        w.wall_s,
        unit="decisions/s",
        concurrency=CLIENTS,
        group="capacity",
        cpu_ms_per_decision=round(serving * 1000 / n, 3),
        per_core=round(n / serving, 1) if serving else None,
        cpu_ms_by_part={k: round(v * 1000 / n, 3) for k, v in w.cpu.items()}
        | {f"docker daemon side: {k}": round(v * 1000 / n, 3) for k, v in w.daemon.items()},
        idle_serving_ms_per_s=round(w.idle_per_s * 1000, 1),
        server_processes_and_containers=list(w.pool),
        client_cpu_ms_per_decision=round(w.client_s * 1000 / n, 3),
        failed_calls=w.errors,
        errored_decisions=w.errored,
        memory_mib=memory,
    )


def _summary(rows: list[tuple[Case, Window, dict[str, Any]]]) -> None:
    print("\nsummary (serving-side CPU per decision, ms; clients excluded; one run on this machine)")
    print(
        f"  {'scenario':<21} {'total':>7} {'per core':>9} {'server':>7} {'children':>9} {'containers':>11} "
        f"{'daemon':>7} {'wall/s':>7} {'p50 ms':>7}"
    )
    for case, w, _ in rows:
        n = max(1, w.decisions)
        serving = _serving_s(w)

        def ms(seconds: float | None, n: int = n) -> str:
            return "-" if seconds is None else f"{seconds * 1000 / n:.2f}"

        docker = case.sandbox == "docker"
        print(
            f"  {case.key:<21} {ms(serving):>7} {n / serving:>9.0f} {ms(w.cpu['server process']):>7} "
            f"{ms(w.cpu['its descendants']):>9} {ms(w.cpu.get('sandbox containers')):>11} "
            f"{ms(w.daemon_s if docker else None):>7} {w.decisions / w.wall_s:>7.0f} "
            f"{statistics.median(w.latencies_ms):>7.1f}"
        )


if __name__ == "__main__":
    main()
