"""Another caller's small stream through the guard proxy, beside one caller's long redacted
streams, against the same small stream with the proxy idle.

The attack (docs/threat-model.md): a streamed answer of 40,000 characters with one e-mail address
in it made the proxy's last release diff the whole answer on its event loop (quadratic: 36 s), so
every other caller's stream stood still meanwhile. A real ``crossaudit serve`` decides (the guard
proxy's e2e test policy: its ``redact_emails`` rule redacts the address); the upstream stub, in a
process of its own, answers the model ``long`` with the 40,000 characters and any other with a
short answer. Target: the small stream's p50 beside the long ones within 2x its p50 idle.
"""

from __future__ import annotations

import json
import multiprocessing
import statistics
import tempfile
import threading
import time
from multiprocessing.synchronize import Event
from pathlib import Path

import httpx

from crossaudit import Client
from tests.bench import report
from tests.e2e.conftest import ServerProcess, key
from tests.e2e.test_proxy import APP_KEY, GUARD, PROXY_ENV, ProxyProcess, proxy_config
from tests.e2e.upstream_stub import UpstreamStub

LONG_CHARS = 40_000
ADDRESS = "jane.doe@example.com"
SMALL = "The weather today is mild and pleasant, with a light breeze. " * 3  # one window
SMALL_RUNS = 20  # the small stream, idle and then beside the long ones
WORDS = "sun", "sky", "air", "sea", "oak", "elm", "fog", "ice"


def _long() -> str:
    words = "".join(f"{WORDS[i % len(WORDS)]} " for i in range(LONG_CHARS // 4))
    half = len(words) // 2
    return words[:half] + f"write to {ADDRESS} today " + words[half:]


def _upstream(ports: multiprocessing.Queue[int], stop: Event) -> None:
    stub = UpstreamStub()
    stub.reset(reply=SMALL)
    stub.by_model = {"long": _long(), "long_clean": _long().replace(ADDRESS, "jane at example")}
    ports.put(stub.port)
    stop.wait(900)
    stub.close()


def _stream(client: httpx.Client, url: str, model: str) -> tuple[float, str]:
    """The whole stream's time in ms, and its text."""
    body = {"model": model, "messages": [{"role": "user", "content": "weather?"}], "stream": True}
    text = ""
    t0 = time.perf_counter()
    headers = {"authorization": f"Bearer {APP_KEY}"}
    with client.stream("POST", url + "/chat/completions", json=body, headers=headers, timeout=300) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                for choice in json.loads(line[6:]).get("choices") or []:
                    text += (choice.get("delta") or {}).get("content") or ""
    return (time.perf_counter() - t0) * 1000, text


def main() -> None:
    ports: multiprocessing.Queue[int] = multiprocessing.Queue()
    stop = multiprocessing.Event()
    upstream = multiprocessing.Process(target=_upstream, args=(ports, stop), daemon=True)
    upstream.start()
    upstream_url = f"http://127.0.0.1:{ports.get(timeout=30)}/v1"
    root = Path(tempfile.mkdtemp(prefix="bench-proxy-redacted-"))
    server = ServerProcess(root / "server")
    proxy: ProxyProcess | None = None
    idle: list[float] = []
    beside: list[float] = []  # beside long redacted streams
    clean: list[float] = []  # beside the same long streams without the address (nothing redacted): the control
    long_ms: list[float] = []
    expected = {
        "long": _long().replace(ADDRESS, "[EMAIL_ADDRESS]"),
        "long_clean": _long().replace(ADDRESS, "jane at example"),
    }
    try:
        server.start()
        with Client(server.address, api_key=key("acme")) as c:
            c.deploy_policy(GUARD, environment="production")
        callers = {"app": {"keys": [APP_KEY], "policies": ["proxy-guard"], "default_policy": "proxy-guard"}}
        proxy = ProxyProcess(root / "proxy", proxy_config(server.address, upstream_url, callers), PROXY_ENV).start()
        with httpx.Client(trust_env=False) as client:
            _stream(client, proxy.url, "small")  # warm: connections, the server's caches
            for _ in range(SMALL_RUNS):
                idle.append(_stream(client, proxy.url, "small")[0])
            for model, out in (("long_clean", clean), ("long", beside)):
                done = threading.Event()

                def heavy(model: str = model, done: threading.Event = done) -> None:  # until the small ones end
                    with httpx.Client(trust_env=False) as own:
                        while not done.is_set():
                            ms, text = _stream(own, proxy.url, model)
                            assert text == expected[model], "the long answer changed on its way"
                            if model == "long":
                                long_ms.append(ms)

                worker = threading.Thread(target=heavy, daemon=True)
                worker.start()
                time.sleep(1.0)  # the first long stream under way
                for _ in range(SMALL_RUNS):
                    out.append(_stream(client, proxy.url, "small")[0])
                done.set()
                worker.join(600)
    finally:
        if proxy is not None:
            proxy.stop()
        server.stop()
        stop.set()
        upstream.join(10)
    p50_idle, p50_beside = statistics.median(idle), statistics.median(beside)
    report.record(
        "proxy_redacted.idle", "small stream, proxy idle", idle, sum(idle) / 1000,
        unit="streams/s", concurrency=1, group="proxy_redacted",
    )  # fmt: skip
    report.record(
        "proxy_redacted.beside", f"small stream beside {LONG_CHARS:,}-char redacted streams", beside,
        sum(beside) / 1000, unit="streams/s", concurrency=1, group="proxy_redacted",
    )  # fmt: skip
    report.ratio("proxy_redacted.neighbour_p50_over_idle", p50_beside / p50_idle)
    worst = max(beside) / max(idle)  # a stream that waited out a long release shows here, not in the p50
    print(f"{SMALL_RUNS} small streams ({len(SMALL)} characters) each; long: {LONG_CHARS:,} characters, one address")
    print(f"{'small stream':<34} {'p50 ms':>8} {'p90 ms':>8}")
    rows = (("proxy idle", idle), ("beside long clean streams", clean), ("beside long redacted streams", beside))
    for name, xs in rows:
        p90 = statistics.quantiles(xs, n=10)[-1]
        print(f"{name:<34} {statistics.median(xs):>8.1f} {p90:>8.1f}")
    long_p50 = statistics.median(long_ms) if long_ms else float("nan")
    print(f"long redacted streams: {len(long_ms)}, p50 {long_p50:.0f} ms")
    print(f"small stream p50 beside / idle: {p50_beside / p50_idle:.2f}x (target <= 2x); slowest: {worst:.1f}x")
    control = statistics.median(clean)
    print(
        f"beside redacted / beside clean (what the redaction itself costs the neighbour): {p50_beside / control:.2f}x"
    )
