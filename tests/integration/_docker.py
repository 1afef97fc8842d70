"""Shared helpers of the Docker sandbox tests (integration, security, bench)."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import socket
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from sandbox.docker.container import BUNDLE_LABEL
from sandbox.docker.images import LABEL

# The guide's custom_profanity_filter, verbatim (spec/policy-dsl-guide.md, "Custom Code Evaluators").
GUIDE_PROFANITY_CODE = '''import re
from typing import Dict, Any

def evaluate(prompt: str, response: str, context: Dict[str, Any]) -> Dict[str, Any]:
    profanity_words = ["badword1", "badword2"]
    violations = []
    
    for word in profanity_words:
        if word.lower() in response.lower():
            violations.append(word)
    
    safety_score = 1.0 - (len(violations) * 0.2)
    
    return {
        "safety_score": max(0.0, safety_score),
        "violations": violations,
        "passed": len(violations) == 0,
        "details": {
            "checked_words": len(profanity_words),
            "found_violations": len(violations)
        }
    }
'''  # noqa: W293 - the guide's blank lines carry indentation; kept verbatim
GUIDE_PROFANITY_DEPS = ("nltk", "textblob")

SENTIMENT_CODE = '''
from textblob import TextBlob

def evaluate(prompt, response, context):
    polarity = TextBlob(response).sentiment.polarity
    return {"score": (polarity + 1.0) / 2.0, "passed": polarity >= 0, "details": {"polarity": polarity}}
'''

BENIGN_CODE = '''
def evaluate(prompt, response, context):
    return {"score": 1.0, "passed": True, "details": {"echo": response[:50]}}
'''

# Module bodies that try to burn CPU with no call in flight (security tests, bench). The fork
# chain moves to a new process every 0.2 s, so a per-process RLIMIT_CPU never stops it.
IDLE_BURNER_CODE = {
    "fork_chain": """
import os, time

def _chain():
    while True:
        try:
            if os.fork():
                os._exit(0)
        except OSError:
            pass
        end = time.monotonic() + 0.2
        while time.monotonic() < end:
            pass

if os.fork() == 0:
    os.setsid()
    _chain()

def evaluate(prompt, response, context):
    return {"score": 1.0, "details": {"ok": True}}
""",
    "spinning_threads": """
import threading

def _spin():
    while True:
        pass

for _ in range(2):
    threading.Thread(target=_spin, daemon=True).start()

def evaluate(prompt, response, context):
    return {"score": 1.0, "details": {"ok": True}}
""",
}


def bundle_containers(client: Any, digest: str | None = None, *, running_only: bool = True) -> list[dict[str, Any]]:
    """Sandbox containers (optionally of one bundle) as docker-py summaries."""
    labels = [f"{LABEL}=1"] + ([f"{BUNDLE_LABEL}={digest[:32]}"] if digest else [])
    found = client.api.containers(all=not running_only, filters={"label": labels})
    return list(found)


async def wait_gone(client: Any, digest: str, timeout: float = 60.0) -> list[dict[str, Any]]:
    """Poll (bounded: generous, since removal on a loaded machine is slow and a pass ends the poll
    at once) until no container of ``digest`` exists; return what is left."""
    deadline = time.monotonic() + timeout
    left: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        left = await asyncio.to_thread(bundle_containers, client, digest, running_only=False)
        if not left:
            return []
        await asyncio.sleep(0.2)
    return left


def own_addresses(client: Any) -> list[str]:
    """IPv4 addresses of *this machine* a container could aim at: the docker bridge gateway and the
    host's own interface address. Each is verified local by binding to it; nothing else is returned."""
    candidates: list[str] = []
    try:
        net = client.api.inspect_network("bridge")
        for cfg in (net.get("IPAM") or {}).get("Config") or []:
            if cfg.get("Gateway"):
                candidates.append(cfg["Gateway"])
            elif cfg.get("Subnet"):
                subnet = ipaddress.ip_network(cfg["Subnet"], strict=False)
                if subnet.version == 4:
                    candidates.append(str(next(subnet.hosts())))
    except Exception:
        pass
    with contextlib.suppress(OSError):
        candidates += [ai[4][0] for ai in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)]
    out = []
    for ip in dict.fromkeys(candidates):
        if ipaddress.ip_address(ip).is_loopback:
            continue
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.bind((ip, 0))  # only succeeds for an address of this machine
            out.append(ip)
        except OSError:
            continue
    return out


@dataclass
class LoopMonitor:
    """Samples event-loop responsiveness plus a health probe every ``period_s``; the worst gap is
    compared by the hostile tests with the call's own length (a blocked loop stalls for all of it)."""

    probe: Any = None
    period_s: float = 0.05
    worst_s: float = 0.0
    samples: int = 0
    _task: asyncio.Task[None] | None = field(default=None, repr=False)
    _stop: bool = False

    async def _run(self) -> None:
        last = time.monotonic()
        for _ in range(1_000_000):
            if self._stop:
                return
            await asyncio.sleep(self.period_s)
            if self.probe is not None:
                self.probe()
            now = time.monotonic()
            self.worst_s = max(self.worst_s, now - last - self.period_s)
            self.samples += 1
            last = now

    def start(self) -> LoopMonitor:
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    async def stop(self) -> None:
        self._stop = True
        if self._task is not None:
            await self._task


class ConnectionCounter:
    """A TCP listener and a UDP socket on loopback and this machine's own addresses (``own_addresses``),
    one port for all, counting what arrives (stands in for the orchestrator's own port in egress probes).
    Never all interfaces: only addresses verified to be this machine's."""

    def __init__(self, hosts: list[str] | None = None) -> None:
        self.hosts = ["127.0.0.1", *[h for h in (hosts or []) if h != "127.0.0.1"]]
        self.tcp_connections = 0
        self.udp_datagrams = 0
        self.servers: list[asyncio.base_events.Server] = []
        self.udps: list[asyncio.DatagramTransport] = []
        self.port = 0
        self.udp_port = 0

    async def __aenter__(self) -> ConnectionCounter:
        async def on_conn(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.tcp_connections += 1
            writer.close()

        counter = self

        class Udp(asyncio.DatagramProtocol):
            def datagram_received(self, data: bytes, addr: Any) -> None:
                counter.udp_datagrams += 1

        loop = asyncio.get_running_loop()
        for host in self.hosts:  # the first bind picks the port; the others share it where free
            with contextlib.suppress(OSError):
                server = await asyncio.start_server(on_conn, host=host, port=self.port)
                self.servers.append(server)
                self.port = self.port or server.sockets[0].getsockname()[1]
            with contextlib.suppress(OSError):
                transport, _ = await loop.create_datagram_endpoint(Udp, local_addr=(host, self.udp_port))
                self.udps.append(transport)
                self.udp_port = self.udp_port or transport.get_extra_info("sockname")[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        for server in self.servers:
            server.close()
            await server.wait_closed()
        for transport in self.udps:
            transport.close()


def container_cpu_ns(client: Any, cid: str) -> tuple[int, float]:
    """CPU time a container has used so far (ns, the daemon's cgroup figure) and when it was read."""
    stats = client.api.stats(cid, stream=False, one_shot=True)
    return int(stats["cpu_stats"]["cpu_usage"]["total_usage"]), time.monotonic()


def percentile(values: Iterable[float], q: float) -> float:
    data = sorted(values)
    if not data:
        return float("nan")
    k = min(len(data) - 1, max(0, round(q / 100 * (len(data) - 1))))
    return data[k]
