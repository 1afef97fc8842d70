"""Attacks on the Docker sandbox's socket channel (docs/sandbox-docker.md, "Calls: the agent
protocol over a private socket, or over attach").

Per container the backend listens on a unix socket in a host directory bound read-only at
``/run/crossaudit``; the agent connects once, before loading anything. What is attacked here:
a host process that connects before the agent (the socket is reachable from the host for the
whole container start), evaluator code reaching the protocol socket held by the agent's own
processes, channel directories left on the host (a container killed, an agent that never
connects, the orchestrator killed), and a tenant's dependency switching every tenant to the
attach stream by making its own agent fail to connect.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import io
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import zipfile
from pathlib import Path

import pytest

from crossaudit.kernel.errors import CrossAuditError
from crossaudit.kernel.limits import PoolLimits, SandboxLimits
from sandbox.base import CodeBundle
from sandbox.docker import container as container_mod
from sandbox.docker.backend import DockerSandbox
from sandbox.docker.container import CHANNEL_PREFIX, CHANNEL_SOCKET
from tests.conftest import ROOT
from tests.integration._docker import BENIGN_CODE, bundle_containers

pytestmark = [pytest.mark.docker, pytest.mark.security, pytest.mark.slow]

LIMITS = SandboxLimits(timeout_s=10.0, memory_bytes=128 * 1024 * 1024, container_memory_bytes=384 * 1024 * 1024)
START_S = 60.0  # a container start on a loaded 2-core machine, image builds excluded
SYSTEM_PYTHON = shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin") or sys.executable  # runs as any uid
MARKER = "tenant-code-marker-5b1d"  # in the tenant's code: must reach the agent only

# A host process of the container's uid (root orchestrator) or of any uid (unprivileged
# orchestrator: the socket is 0666) connecting to the channel socket first. It prints every
# byte it receives and answers as an agent would: a forged "loaded", then forged results.
SQUATTER = r"""
import json, socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(sys.argv[1])
print("connected", flush=True)
buf = b""
s.settimeout(float(sys.argv[2]))
try:
    while True:
        data = s.recv(65536)
        if not data:
            break
        sys.stdout.write("got " + data.decode("utf-8", "replace").replace("\n", " ") + "\n")
        sys.stdout.flush()
        buf += data
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            frame = json.loads(line)
            if frame.get("op") == "load":
                answer = {"op": "loaded", "ok": True, "pid": 1, "warnings": [], "isolation": {}}
            elif frame.get("op") == "call":
                answer = {"op": "result", "id": frame["id"], "ok": True, "stdout": "", "stderr": "",
                          "truncated": False, "wall_ms": 1.0,
                          "result": {"score": 0.0, "details": {"echo": "forged"}}}
            else:
                continue
            s.sendall(json.dumps(answer).encode() + b"\n")
except OSError:
    pass
"""


def _ours(pid: int | None = None) -> list[str]:
    """Channel directories of this (or another) orchestrator process in the system temp dir."""
    prefix = f"{CHANNEL_PREFIX}{pid or os.getpid()}-"
    return sorted(n for n in os.listdir(tempfile.gettempdir()) if n.startswith(prefix))


async def test_a_host_process_connecting_first_gets_neither_the_code_nor_the_channel(docker_daemon, monkeypatch):
    """The squatter connects before the container even starts. The backend must refuse it (its
    peer credentials are not the container's init process) and serve the real agent."""
    real = container_mod.open_channel_dir
    squatters: list[subprocess.Popen[str]] = []

    def racing(uid: int):
        listener, path = real(uid)
        proc = subprocess.Popen(
            [SYSTEM_PYTHON, "-c", SQUATTER, os.path.join(path, CHANNEL_SOCKET), "20"], cwd="/",
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, user=uid if os.geteuid() == 0 else None,
        )  # fmt: skip
        assert proc.stdout is not None and proc.stdout.readline().strip() == "connected"
        squatters.append(proc)
        return listener, path

    monkeypatch.setattr(container_mod, "open_channel_dir", racing)
    sb = DockerSandbox(LIMITS, pool_limits=PoolLimits(min_size=0, max_size=1), channel="socket")
    bundle = CodeBundle(BENIGN_CODE + f"\n# {MARKER}\n")
    try:
        verdict, _ = await sb.run(bundle, "p", "the real answer", {}, timeout=START_S)
        assert verdict.details["echo"] == "the real answer"  # not the squatter's forged result
        assert sb.info()["socket_channel"] is True  # the real agent got the channel
    finally:
        await sb.aclose()
        heard = []
        for proc in squatters:
            proc.kill()
            out, _ = proc.communicate(timeout=10)
            heard.append(out)
    assert squatters, "the squatter never ran"
    for out in heard:
        assert MARKER not in out and '"op": "call"' not in out and "the real answer" not in out, out[:500]


# Evaluator code (a call child, after the load) reaching for the protocol socket that the
# agent's warm parent (PID 1) and its I/O process hold: pidfd_getfd, /proc/PID/fd, ptrace.
PROTOCOL_GRAB = textwrap.dedent("""
    import ctypes, os, socket, stat
    SYS_PIDFD_OPEN, SYS_PIDFD_GETFD, PTRACE_ATTACH = 434, 438, 16

    def evaluate(prompt, response, context):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long
        facts = {"stolen": [], "listed": [], "traced": [], "pidfds": 0, "own_sockets": []}
        for fd in range(1024):  # its own fds 0/1 included: where the protocol arrives in the agent
            try:
                if stat.S_ISSOCK(os.fstat(fd).st_mode):
                    facts["own_sockets"].append(fd)
            except OSError:
                pass
        agent = []
        for d in os.listdir("/proc"):
            if d.isdigit():
                try:
                    with open(f"/proc/{d}/comm") as fh:
                        if int(d) == 1 or fh.read().strip() == "crossaudit-io":
                            agent.append(int(d))
                except OSError:
                    pass
        facts["agent"] = agent
        for pid in agent:
            pidfd = libc.syscall(SYS_PIDFD_OPEN, pid, 0)
            if pidfd >= 0:
                facts["pidfds"] += 1
                for n in range(64):
                    fd = libc.syscall(SYS_PIDFD_GETFD, pidfd, n, 0)
                    if fd >= 0:
                        facts["stolen"].append([pid, n])
            try:
                facts["listed"].append([pid, os.listdir(f"/proc/{pid}/fd")])
            except OSError:
                pass
            if libc.ptrace(PTRACE_ATTACH, pid, 0, 0) == 0:
                facts["traced"].append(pid)
        return {"score": 1.0, "details": facts}
""")


async def test_evaluator_code_cannot_reach_the_protocol_socket(docker_daemon):
    sb = DockerSandbox(LIMITS, pool_limits=PoolLimits(min_size=0, max_size=1), channel="socket")
    try:
        verdict, _ = await sb.run(CodeBundle(PROTOCOL_GRAB), "p", "r", {}, timeout=START_S)
        facts = verdict.details
        assert sb.info()["socket_channel"] is True
        assert 1 in facts["agent"] and len(facts["agent"]) == 2, facts  # the warm parent and its I/O process
        assert facts["pidfds"] == 2  # the syscalls exist: what follows is refused, not missing
        assert facts["stolen"] == [] and facts["listed"] == [] and facts["traced"] == [], facts
        assert facts["own_sockets"] == [], facts  # the call child holds no socket: not the protocol's
    finally:
        await sb.aclose()


async def test_no_channel_directory_outlives_its_container(docker_daemon):
    """Connected containers keep no host directory; a container killed from outside or an
    evicted pool leaves none."""
    sb = DockerSandbox(LIMITS, pool_limits=PoolLimits(min_size=0, max_size=2), channel="socket")
    bundle = CodeBundle(BENIGN_CODE + "\n# channel-leak\n")
    try:
        await sb.run(bundle, "p", "warm", {}, timeout=START_S)
        assert sb.info()["socket_channel"] is True
        for _ in range(600):  # the spare (PoolLimits.spare_size) starts after that call; bounded wait
            if not sb.pool_stats(bundle)["starting"]:
                break
            await asyncio.sleep(0.05)
        assert _ours() == []  # each warm container's directory went once its agent connected
        for c in bundle_containers(docker_daemon, bundle.digest):
            docker_daemon.api.kill(c["Id"])  # SIGKILL from outside, as an OOM kill or an operator would
        for _ in range(3):  # the dead container is noticed, replaced, and the call served
            try:
                verdict, _ = await sb.run(bundle, "p", "after kill", {}, timeout=START_S)
                break
            except CrossAuditError:
                await asyncio.sleep(0.5)
        assert verdict.details["echo"] == "after kill"
        await sb.evict(bundle)
        assert _ours() == []
    finally:
        await sb.aclose()
    assert _ours() == []


CRASHING_ORCHESTRATOR = """
import asyncio, os, sys
from crossaudit.kernel.limits import PoolLimits, SandboxLimits
from sandbox.base import CodeBundle
from sandbox.docker import container
from sandbox.docker.backend import DockerSandbox

CODE = "def evaluate(prompt, response, context):\\n    return {'score': 1.0}\\n# crash\\n"

async def main():
    sb = DockerSandbox(SandboxLimits(), pool_limits=PoolLimits(min_size=0, max_size=1), channel="socket")
    await sb.run(CodeBundle(CODE), "p", "r", {}, timeout=60)
    container.open_channel_dir(30000)  # a container start in progress when the process dies
    print("ready", flush=True)
    await asyncio.sleep(600)

asyncio.run(main())
"""


async def test_a_killed_orchestrators_channel_directories_are_removed(docker_daemon):
    proc = subprocess.Popen([sys.executable, "-c", CRASHING_ORCHESTRATOR], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        assert len(_ours(proc.pid)) == 1  # only the start in progress has a directory
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    assert len(_ours(proc.pid)) == 1  # nobody cleaned up after a SIGKILL...
    sb = DockerSandbox(LIMITS, pool_limits=PoolLimits(min_size=0, max_size=1), channel="socket")
    try:
        await sb.start()  # ...until the next backend starts: it reaps what dead owners left
        assert _ours(proc.pid) == []
    finally:
        await sb.aclose()


# A dependency whose import hook (``sitecustomize``, run by the interpreter before the agent's
# first line) ends the process when a channel socket is offered: the agent never connects.
SITE_HOOK = """
import os
if os.environ.get("CROSSAUDIT_AGENT_SOCKET"):
    os._exit(0)
"""
HOOK_DIST = "crossaudit-test-sitehook"


def _wheel(dest: Path) -> Path:
    """A minimal, valid py3-none-any wheel shipping a top-level ``sitecustomize``."""
    name, version = HOOK_DIST.replace("-", "_"), "1.0"
    info = f"{name}-{version}.dist-info"
    files = {
        "sitecustomize.py": SITE_HOOK.encode(),
        f"{name}/__init__.py": b"",
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {HOOK_DIST}\nVersion: {version}\n".encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        f"{info}/top_level.txt": f"{name}\n".encode(),
    }
    record = io.StringIO()
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.write(f"{path},sha256={digest},{len(data)}\n")
    record.write(f"{info}/RECORD,,\n")
    files[f"{info}/RECORD"] = record.getvalue().encode()
    out = dest / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(out, "w") as z:
        for path, data in files.items():
            z.writestr(path, data)
    return out


async def test_a_tenant_dependency_cannot_switch_everyone_to_attach(docker_daemon, monkeypatch, tmp_path):
    links = tmp_path / "links"
    links.mkdir()
    _wheel(links)
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # the dependency comes from this directory, not an index
    monkeypatch.setenv("PIP_FIND_LINKS", str(links))
    sb = DockerSandbox(
        LIMITS, pool_limits=PoolLimits(min_size=0, max_size=1), channel="socket", cache_dir=tmp_path / "cache"
    )
    hooked = CodeBundle(BENIGN_CODE + "\n# hooked\n", dependencies=(HOOK_DIST,))
    try:  # the hooked tenant's container is the backend's first (its pool warms in prepare)
        t0 = time.monotonic()
        with contextlib.suppress(CrossAuditError):  # it is served over attach, or refused: its business
            await sb.prepare(hooked)
            await sb.run(hooked, "p", "hooked", {}, timeout=START_S)
        assert time.monotonic() - t0 < 2 * START_S
        assert sb.info()["socket_channel"] is True  # every other tenant keeps the socket
        other = CodeBundle(BENIGN_CODE + "\n# other tenant\n")
        verdict, _ = await sb.run(other, "p", "other", {}, timeout=START_S)
        assert verdict.details["echo"] == "other"
        [c] = bundle_containers(docker_daemon, other.digest)
        binds = docker_daemon.api.inspect_container(c["Id"])["HostConfig"]["Binds"] or []
        assert any(b.endswith(":/run/crossaudit:ro") for b in binds)  # started with a channel socket
    finally:
        await sb.aclose()
    assert _ours() == []
