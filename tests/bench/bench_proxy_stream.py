"""Time to first token of a streamed answer through the guard proxy, side by side with the same
stream read directly from the upstream, and with the proxy buffering the stream (``stream:
buffered``, the proxy's only way before windows).

A real ``crossaudit serve`` decides (the guard proxy's e2e test policy: custom evaluators in the
process sandbox, one output rule that blocks, one that redacts); the upstream is the loopback
stub streaming 400 tokens (4 characters each) at 10 ms each, in a process of its own. Modes:
``windows`` (input_mode blocking: the upstream is called once the input stage passed), ``parallel``
(input_mode parallel: called at once) and ``buffered``. The upstream's "first window" is
when a direct reader has received ``stream_window_chars`` characters: the proxy cannot release
anything before its first window has arrived, so the target is its TTFT minus that time.
"""

from __future__ import annotations

import json
import multiprocessing
import statistics
import tempfile
import time
from multiprocessing.synchronize import Event
from pathlib import Path

import httpx

from crossaudit import Client
from crossaudit.proxy.config import ProxyLimits
from tests.bench import report
from tests.e2e.conftest import ServerProcess, key
from tests.e2e.test_proxy import APP_KEY, GUARD, PROXY_ENV, ProxyProcess, proxy_config
from tests.e2e.upstream_stub import STREAM_PIECE_CHARS, UpstreamStub

TOKENS = 400
TOKEN_DELAY_S = 0.010
RUNS = 5  # per mode; each stream takes ~4 s
DECISIONS = 30  # a window's decision timed alone
WINDOW = ProxyLimits.stream_window_chars
WORDS = "sun", "sky", "air", "sea", "oak", "elm", "fog", "ice"


def _reply() -> str:
    text = "".join(f"{WORDS[i % len(WORDS)]} " for i in range(TOKENS))
    assert len(text) == TOKENS * STREAM_PIECE_CHARS
    return text


def _read(client: httpx.Client, url: str, headers: dict[str, str]) -> tuple[float, float, float, str]:
    """(first token, first window's worth of text, end) in ms from the request, and the text."""
    body = {"model": "stub-model", "messages": [{"role": "user", "content": "weather?"}], "stream": True}
    first = window = 0.0
    text = ""
    t0 = time.perf_counter()
    with client.stream("POST", url + "/chat/completions", json=body, headers=headers, timeout=60) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            for choice in json.loads(line[6:]).get("choices") or []:
                text += (choice.get("delta") or {}).get("content") or ""
            now = (time.perf_counter() - t0) * 1000
            if text and not first:
                first = now
            if len(text) >= WINDOW and not window:
                window = now
    return first, window, (time.perf_counter() - t0) * 1000, text


def _upstream(ports: multiprocessing.Queue[int], stop: Event) -> None:
    """The stub in a process of its own: the bench's readers do not share its interpreter."""
    stub = UpstreamStub()
    stub.reset(reply=_reply())
    stub.piece_delay_s = TOKEN_DELAY_S
    ports.put(stub.port)
    stop.wait(600)
    stub.close()


def main() -> None:
    reply = _reply()
    ports: multiprocessing.Queue[int] = multiprocessing.Queue()
    stop = multiprocessing.Event()
    upstream = multiprocessing.Process(target=_upstream, args=(ports, stop), daemon=True)
    upstream.start()
    upstream_url = f"http://127.0.0.1:{ports.get(timeout=30)}/v1"
    root = Path(tempfile.mkdtemp(prefix="bench-proxy-stream-"))
    server = ServerProcess(root / "server")
    proxies: list[ProxyProcess] = []
    try:
        server.start()
        with Client(server.address, api_key=key("acme")) as c:
            c.deploy_policy(GUARD, environment="production")
            decide: list[float] = []  # one first window's decision, as the proxy asks for it
            for i in range(DECISIONS):
                t0 = time.perf_counter()
                c.evaluate("proxy-guard", "weather?", reply[i : i + WINDOW], stage="output", provisional=True)
                decide.append((time.perf_counter() - t0) * 1000)
        callers = {"app": {"keys": [APP_KEY], "policies": ["proxy-guard"], "default_policy": "proxy-guard"}}
        modes = {"windows": {}, "parallel": {"input_mode": "parallel"}, "buffered": {"stream": "buffered"}}
        for mode, settings in modes.items():
            config = proxy_config(server.address, upstream_url, callers, **settings)
            proxies.append(ProxyProcess(root / mode, config, PROXY_ENV).start())
        auth = {"authorization": f"Bearer {APP_KEY}"}
        targets = {"direct": (upstream_url, {})} | {m: (p.url, auth) for m, p in zip(modes, proxies, strict=True)}
        runs: dict[str, list[tuple[float, float, float, str]]] = {name: [] for name in targets}
        with httpx.Client(trust_env=False) as client:  # one client: its setup is not in any figure
            for url, headers in targets.values():  # warm: connections, the server's caches
                _read(client, url, headers)
            for _ in range(RUNS):  # alternating, so the modes share the machine's moments alike
                for name, (url, headers) in targets.items():
                    runs[name].append(_read(client, url, headers))
    finally:
        for p in proxies:
            p.stop()
        server.stop()
        stop.set()
        upstream.join(10)
    for name, rs in runs.items():
        assert all(r[3] == reply for r in rs), f"{name}: the answer changed on its way"
    first_window = statistics.median(r[1] for r in runs["direct"])
    print(f"upstream: {TOKENS} tokens at {TOKEN_DELAY_S * 1000:g} ms; window {WINDOW} characters; {RUNS} runs each")
    print(f"{'mode':<10} {'TTFT p50 ms':>12} {'first window ms':>16} {'whole ms':>10}")
    for name, rs in runs.items():
        ttft = [r[0] for r in rs]
        report.record(
            f"proxy_stream.{name}", f"stream TTFT, {name}", ttft, sum(r[2] for r in rs) / 1000,
            unit="streams/s", concurrency=1, group="proxy_stream",
        )  # fmt: skip
        print(
            f"{name:<10} {statistics.median(ttft):>12.1f} {statistics.median(r[1] for r in rs):>16.1f} "
            f"{statistics.median(r[2] for r in rs):>10.1f}"
        )
    for mode in ("windows", "parallel"):
        excess = statistics.median(r[0] for r in runs[mode]) - first_window
        print(f"{mode} TTFT - the upstream's first window: {excess:+.1f} ms")
    report.ratio("proxy_stream.ttft_over_first_window_ms", excess)  # input_mode: parallel, as the target's
    print(f"one window's decision (Evaluate, output, {WINDOW} characters): p50 {statistics.median(decide):.1f} ms")
    buffered = statistics.median(r[0] for r in runs["buffered"])
    print(f"buffered TTFT: {buffered:.0f} ms ({buffered / statistics.median(r[0] for r in runs['parallel']):.1f}x)")
