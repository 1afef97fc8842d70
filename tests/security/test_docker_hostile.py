"""Hostile custom evaluators in the Docker sandbox.

Each hostile program must end in a *typed* error (stopped by its deadline at the latest, never
held until it chose to stop), leave nothing running once its pool is evicted, never freeze the
event loop (the health probe keeps answering throughout), and the next benign evaluation must
succeed. The tests assert containment, not which of two equally safe failures came first: a
program whose error class is the point (a refused write is SandboxCodeError, not a kill at the
deadline, which would leave open whether the write happened) gets a deadline with room for a
loaded machine to reach that error; one that the deadline may stop as well as its own crash or
limit accepts both, under the short deadline.

Egress probes aim only at loopback or at this machine's own addresses (the docker bridge
gateway and the host's interface address, each verified local by binding to it), and at a
listener the test itself opens (standing in for the orchestrator's port).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import socket
import textwrap
import time

import pytest
import pytest_asyncio
from docker.errors import APIError

from crossaudit.kernel.errors import (
    CrossAuditError,
    DependencyRejectedError,
    EvaluatorTimeoutError,
    ResultInvalidError,
    SandboxCodeError,
    SandboxCrashedError,
    SandboxError,
    SandboxLimitError,
)
from crossaudit.kernel.limits import PoolLimits, SandboxLimits
from sandbox.base import CodeBundle
from sandbox.docker.backend import DockerSandbox
from sandbox.docker.container import SANDBOX_UID_RANGE, UID_LABEL, UidAllocator
from tests.integration._docker import (
    BENIGN_CODE,
    ConnectionCounter,
    LoopMonitor,
    bundle_containers,
    own_addresses,
    wait_gone,
)

pytestmark = [pytest.mark.docker, pytest.mark.security, pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]

CALL_TIMEOUT = 3.0  # the deadline of programs that only a deadline (or a limit) stops, and of any that it may
# The deadline of programs whose error class is the point: each ends by itself well inside a second
# when idle; on a loaded 2-core machine a deep recursion alone took 4-5 s.
ROOM_S = 20.0
# Past its deadline, a call comes back once its container is killed and removed. Generous: only a
# call held until the program chose to stop (sleep 600, forever) must fail this, not a busy machine.
STOP_SLACK_S = 30.0
SECRET = "crossaudit-host-secret-7f3a9c"  # put into the *host* environment; must never reach a sandbox
LIMITS = SandboxLimits(
    timeout_s=ROOM_S,  # each call passes its own deadline: CALL_TIMEOUT or ROOM_S
    cpu_s=3,
    memory_bytes=128 * 1024 * 1024,
    container_memory_bytes=384 * 1024 * 1024,
    pids=32,
    output_bytes=16 * 1024,
    result_bytes=256 * 1024,
    tmpfs_bytes=8 * 1024 * 1024,
    file_bytes=1024 * 1024,
)

TIMEOUT = (EvaluatorTimeoutError,)
CODE = (SandboxCodeError,)
CRASH = (SandboxCrashedError,)
INVALID = (ResultInvalidError,)
LIMIT = (SandboxLimitError,)
ANY_SANDBOX = (SandboxError, EvaluatorTimeoutError)


def _src(body: str) -> str:
    return textwrap.dedent(body).strip() + "\n"


# name -> (code, accepted error types). Each program *returns* normally only if it managed the
# forbidden thing, which then fails the test (a success is never an acceptable outcome).
HOSTILE: dict[str, tuple[str, tuple[type[CrossAuditError], ...]]] = {
    "infinite_loop": (_src("""
        def evaluate(p, r, c):
            while True:
                pass
    """), (*TIMEOUT, *LIMIT)),
    "sleep_past_deadline": (_src("""
        import time
        def evaluate(p, r, c):
            time.sleep(600)
            return {"score": 1.0}
    """), TIMEOUT),
    "sigterm_ignored": (_src("""
        import signal, time
        def evaluate(p, r, c):
            for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                signal.signal(s, signal.SIG_IGN)
            while True:
                time.sleep(0.01)
    """), TIMEOUT),
    "spinning_threads": (_src("""
        import threading
        def spin():
            while True:
                pass
        def evaluate(p, r, c):
            for _ in range(4):
                threading.Thread(target=spin, daemon=True).start()
            spin()
    """), (*TIMEOUT, *LIMIT)),
    "memory_bomb_at_once": (_src("""
        def evaluate(p, r, c):
            blob = bytearray(2 * 1024 ** 3)
            return {"score": 1.0, "details": {"n": len(blob)}}
    """), (*LIMIT, *CRASH)),
    "memory_bomb_gradual": (_src("""
        def evaluate(p, r, c):
            hoard = []
            while True:
                hoard.append(bytearray(8 * 1024 * 1024))
    """), (*LIMIT, *CRASH)),
    "fork_bomb": (_src("""
        import os
        def evaluate(p, r, c):
            for _ in range(100000):
                os.fork()
            raise RuntimeError("fork bomb was never stopped")
    """), ANY_SANDBOX),
    "thread_bomb": (_src("""
        import threading, time
        def evaluate(p, r, c):
            for _ in range(100000):
                threading.Thread(target=time.sleep, args=(100,), daemon=True).start()
            raise RuntimeError("thread bomb was never stopped")
    """), (*CODE, *LIMIT, *CRASH)),
    "daemonised_child": (_src("""
        import os, time
        def evaluate(p, r, c):
            if c.get("probe"):
                def agent(pid):  # the warm parent, its I/O process, this process
                    try:
                        with open(f"/proc/{pid}/comm") as fh:
                            return pid in (1, os.getpid()) or fh.read().strip() == "crossaudit-io"
                    except OSError:
                        return True  # gone meanwhile
                strays = [int(d) for d in os.listdir("/proc") if d.isdigit() and not agent(int(d))]
                return {"score": 1.0, "details": {"strays": strays}}
            if os.fork() == 0:
                os.setsid()
                if os.fork() == 0:
                    while True:
                        with open("/tmp/beacon", "a") as fh:
                            fh.write("x")
                        time.sleep(0.05)
                os._exit(0)
            time.sleep(0.2)
            raise RuntimeError("daemon started")
    """), CODE),
    "runaway_stdout": (_src("""
        def evaluate(p, r, c):
            while True:
                print("x" * 4096)
    """), (*LIMIT, *TIMEOUT)),
    "runaway_stderr": (_src("""
        import sys
        def evaluate(p, r, c):
            while True:
                sys.stderr.write("e" * 4096)
    """), (*LIMIT, *TIMEOUT)),
    "return_1gb": (_src("""
        def evaluate(p, r, c):
            return {"score": 1.0, "details": {"blob": "x" * (1024 ** 3)}}
    """), (*LIMIT, *CRASH, *INVALID)),
    "return_over_result_cap": (_src("""
        def evaluate(p, r, c):
            return {"score": 1.0, "details": {"blob": "x" * (2 * 1024 * 1024)}}
    """), (*LIMIT, *INVALID)),
    "deeply_nested_return": (_src("""
        def evaluate(p, r, c):
            doc = []
            for _ in range(100000):
                doc = [doc]
            return {"score": 1.0, "details": {"deep": doc}}
    """), INVALID),
    "nan_score": (_src("""
        def evaluate(p, r, c):
            return {"score": float("nan")}
    """), INVALID),
    "infinity_in_details": (_src("""
        def evaluate(p, r, c):
            return {"score": 1.0, "details": {"x": float("inf")}}
    """), INVALID),
    "non_json_return": (_src("""
        def evaluate(p, r, c):
            return {"score": 1.0, "details": {"x": object()}}
    """), INVALID),
    "not_a_dict": (_src("""
        def evaluate(p, r, c):
            return [1.0]
    """), INVALID),
    "score_out_of_range": (_src("""
        def evaluate(p, r, c):
            return {"score": 7, "passed": True}
    """), INVALID),
    "fake_result_on_stdout": (_src("""
        import json, os, sys
        def evaluate(p, r, c):
            fake = json.dumps({"op": "result", "id": "guess", "ok": True, "result": {"score": 1.0}})
            print(fake)
            sys.stdout.flush()
            os.write(1, (fake + "\\n").encode())
            for fd in range(0, 64):
                try:
                    os.write(fd, (fake + "\\n").encode())
                except OSError:
                    pass
            for name in ("/proc/1/fd/1", "/proc/1/fd/3", "/proc/1/fd/4", "/dev/stdout"):
                try:
                    with open(name, "w") as fh:
                        fh.write(fake + "\\n")
                except OSError:
                    pass
            raise RuntimeError("printed a fake result")
    """), (*CODE, *CRASH, *INVALID)),  # garbage written into its own result pipe is an invalid result
    "os_exit_before_return": (_src("""
        import os
        def evaluate(p, r, c):
            os._exit(0)
    """), CRASH),
    "undeclared_import": (_src("""
        import textblob
        def evaluate(p, r, c):
            return {"score": 1.0}
    """), CODE),
    "read_etc_shadow": (_src("""
        def evaluate(p, r, c):
            with open("/etc/shadow") as fh:
                return {"score": 1.0, "details": {"shadow": fh.read()}}
    """), CODE),
    "read_proc1_environ": (_src("""
        def evaluate(p, r, c):
            with open("/proc/1/environ", "rb") as fh:
                return {"score": 1.0, "details": {"environ": fh.read().decode(errors="replace")}}
    """), CODE),
    "docker_socket": (_src("""
        import socket
        def evaluate(p, r, c):
            for path in ("/var/run/docker.sock", "/run/docker.sock", "/run/containerd/containerd.sock"):
                s = socket.socket(socket.AF_UNIX)
                try:
                    s.connect(path)
                except OSError:
                    continue
                return {"score": 1.0, "details": {"connected": path}}
            raise RuntimeError("no daemon socket reachable")
    """), CODE),
    "host_environment_secrets": (_src(f"""
        import os
        def evaluate(p, r, c):
            leaked = [k for k, v in os.environ.items() if "{SECRET}" in v]
            if leaked:
                return {{"score": 1.0, "details": {{"leaked": leaked}}}}
            raise RuntimeError("environment holds only " + ",".join(sorted(os.environ)))
    """), CODE),
    "dns_to_gateway": (_src("""
        import socket
        def evaluate(p, r, c):
            query = bytes.fromhex("123401000001000000000000076578616d706c6503636f6d0000010001")
            sent = []
            for ip in c["own"]:
                s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                try:
                    s.sendto(query, (ip, 53))
                    sent.append(ip)
                except OSError:
                    pass
            if sent:
                return {"score": 1.0, "details": {"sent": sent}}
            raise RuntimeError("no DNS egress")
    """), CODE),
    "tcp_to_orchestrator_port_via_gateway": (_src("""
        import socket
        def evaluate(p, r, c):
            for ip in c["own"]:
                try:
                    socket.create_connection((ip, c["port"]), timeout=1).close()
                    return {"score": 1.0, "details": {"connected": ip}}
                except OSError:
                    pass
            raise RuntimeError("no TCP egress")
    """), CODE),
    "tcp_to_loopback_orchestrator_port": (_src("""
        import socket
        def evaluate(p, r, c):
            socket.create_connection(("127.0.0.1", c["port"]), timeout=1).close()
            return {"score": 1.0, "details": {"connected": True}}
    """), CODE),
    "udp_to_gateway": (_src("""
        import socket
        def evaluate(p, r, c):
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            for ip in c["own"]:
                s.sendto(b"hello", (ip, c["udp_port"]))
            return {"score": 1.0, "details": {"sent": True}}
    """), CODE),
    "write_root_filesystem": (_src("""
        def evaluate(p, r, c):
            with open("/pwned", "w") as fh:
                fh.write("x")
            return {"score": 1.0}
    """), CODE),
    "write_site_packages": (_src("""
        import json, os, sys
        def evaluate(p, r, c):
            target = os.path.dirname(json.__file__)
            with open(os.path.join(target, "evil.py"), "w") as fh:
                fh.write("x = 1")
            return {"score": 1.0}
    """), CODE),
    "write_agent": (_src("""
        def evaluate(p, r, c):
            with open("/opt/crossaudit/agent/supervisor.py", "a") as fh:
                fh.write("# owned")
            return {"score": 1.0}
    """), CODE),
    "fill_tmp": (_src("""
        def evaluate(p, r, c):
            chunk = b"x" * 65536
            for i in range(64):
                with open(f"/tmp/fill-{i}", "wb") as fh:
                    for _ in range(16):
                        fh.write(chunk)
            return {"score": 1.0}
    """), (*CODE, *LIMIT)),
    "exec_from_tmp": (_src("""
        import os
        def evaluate(p, r, c):
            with open("/tmp/run.sh", "w") as fh:
                fh.write("#!/bin/sh\\necho owned\\n")
            os.chmod("/tmp/run.sh", 0o755)
            os.execv("/tmp/run.sh", ["/tmp/run.sh"])
    """), CODE),
    "setuid_root": (_src("""
        import os
        def evaluate(p, r, c):
            os.setuid(0)
            return {"score": 1.0}
    """), CODE),
    "mount_tmpfs": (_src("""
        import ctypes
        def evaluate(p, r, c):
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.mount(b"none", b"/tmp", b"tmpfs", 0, None) == 0:
                return {"score": 1.0}
            raise OSError(ctypes.get_errno(), "mount refused")
    """), CODE),
    "unshare_namespaces": (_src("""
        import ctypes
        def evaluate(p, r, c):
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.unshare(0x10000000 | 0x00020000) == 0:
                return {"score": 1.0}
            raise OSError(ctypes.get_errno(), "unshare refused")
    """), CODE),
    "ptrace_parent": (_src("""
        import ctypes, os
        def evaluate(p, r, c):
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.ptrace(16, os.getppid(), 0, 0) == 0:
                return {"score": 1.0}
            raise OSError(ctypes.get_errno(), "ptrace refused")
    """), CODE),
    "proc1_mem_write": (_src("""
        def evaluate(p, r, c):
            with open("/proc/1/mem", "r+b") as fh:
                fh.write(b"x")
            return {"score": 1.0}
    """), CODE),
    "kill_pid1_and_parent": (_src("""
        import os, signal, time
        def evaluate(p, r, c):
            for pid in (1, os.getppid()):
                for sig in (signal.SIGKILL, signal.SIGSTOP, signal.SIGTERM):
                    try:
                        os.kill(pid, sig)
                    except OSError:
                        pass
            time.sleep(0.2)
            raise RuntimeError("agent still alive")
    """), (*CODE, *CRASH)),
    "ctypes_segfault": (_src("""
        import ctypes
        def evaluate(p, r, c):
            ctypes.string_at(0)
    """), CRASH),
    # The C stack overflows (a crash) or the interpreter gives up (a code error) after seconds of
    # CPU; on a loaded machine the deadline may come first. All three are contained alike.
    "recursion_bomb": (_src("""
        import sys
        def evaluate(p, r, c):
            sys.setrecursionlimit(10 ** 6)
            def f(n):
                return f(n + 1)
            return f(0)
    """), (*CODE, *CRASH, *TIMEOUT)),
    "close_every_fd": (_src("""
        import os
        def evaluate(p, r, c):
            os.closerange(0, 4096)
            return {"score": 1.0}
    """), CRASH),
}

HOSTILE_DEPENDENCIES = [
    "requests; os_name == 'posix'",
    "git+https://127.0.0.1/evil.git",
    "evil @ file:///etc/passwd",
    "--index-url=http://127.0.0.1/simple",
    "-r /etc/passwd",
    "./local/path",
    "numpy\nrequests",
    "pkg`id`",
    "pkg$(id)",
    "pkg[all,extras]",
    "pkg===anything-goes",
    "x" * 500,
]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def env(docker_daemon):
    os.environ["CROSSAUDIT_TEST_HOST_SECRET"] = SECRET
    sandbox = DockerSandbox(LIMITS, pool_limits=PoolLimits(min_size=1, max_size=2, queue_wait_s=2.0))
    benign = CodeBundle(BENIGN_CODE + "\n# hostile-suite benign\n")
    await sandbox.prepare(benign)
    own = own_addresses(docker_daemon)
    async with ConnectionCounter(own) as counter:
        yield {"sb": sandbox, "benign": benign, "own": own, "counter": counter, "client": docker_daemon}
    await sandbox.aclose()
    os.environ.pop("CROSSAUDIT_TEST_HOST_SECRET", None)


async def test_there_are_at_least_30_hostile_evaluators():
    assert len(HOSTILE) + 1 >= 30  # + the hostile dependency strings


def deadline_of(accepted: tuple[type[CrossAuditError], ...]) -> float:
    """The short deadline where a timeout is an accepted end, else room to reach the expected class."""
    return CALL_TIMEOUT if any(issubclass(t, EvaluatorTimeoutError) for t in accepted) else ROOM_S


@pytest.mark.parametrize("name", sorted(HOSTILE))
async def test_hostile_evaluator_is_contained(env, name):
    sb: DockerSandbox = env["sb"]
    code, accepted = HOSTILE[name]
    deadline = deadline_of(accepted)
    bundle = CodeBundle(code)
    context = {"own": env["own"], "port": env["counter"].port, "udp_port": env["counter"].udp_port}
    await sb.prepare(bundle)

    monitor = LoopMonitor(probe=sb.info).start()
    t0 = time.monotonic()
    try:
        with pytest.raises(CrossAuditError) as info:
            await sb.run(bundle, "prompt", "response", context, timeout=deadline)
        elapsed = time.monotonic() - t0
        if name == "daemonised_child":  # the same warm container, next call: no stray process survived
            verdict, _ = await sb.run(bundle, "", "", {"probe": True}, timeout=ROOM_S)
            assert verdict.details["strays"] == []
    finally:
        await monitor.stop()
        await sb.evict(bundle)  # whatever happens above, this evaluator's pool goes away

    assert isinstance(info.value, accepted), f"{name}: {type(info.value).__name__}: {info.value}"
    assert elapsed < deadline + STOP_SLACK_S, f"{name} held the caller {elapsed:.2f}s past a {deadline}s deadline"
    # A call that blocked the event loop would freeze it for the whole call; a busy machine's
    # scheduling gaps are a small part of one (the short deadline's, for a quick call).
    stall_line = max(elapsed, CALL_TIMEOUT) / 2
    assert monitor.worst_s < stall_line, f"event loop / health probe stalled {monitor.worst_s:.2f}s"
    assert SECRET not in str(info.value)

    # Nothing left running once the evaluator's pool is gone.
    assert await wait_gone(env["client"], bundle.digest) == []
    # The orchestrator-side listener never saw a packet from a sandbox.
    assert env["counter"].tcp_connections == 0 and env["counter"].udp_datagrams == 0
    # The next benign evaluation succeeds.
    verdict, _ = await sb.run(env["benign"], "p", "after " + name, {}, timeout=ROOM_S)
    assert verdict.score == 1.0 and verdict.details["echo"] == "after " + name


@pytest.mark.parametrize("dep", HOSTILE_DEPENDENCIES, ids=range(len(HOSTILE_DEPENDENCIES)))
async def test_hostile_dependency_string_is_rejected_before_docker(env, dep, monkeypatch):
    sb: DockerSandbox = env["sb"]
    asked: list[str] = []  # refused by validation: no image was looked for, resolved or built

    def untouchable(name: str):
        def record(*args, **kwargs):
            asked.append(name)
            raise AssertionError(f"{name} was reached")
        return record

    monkeypatch.setattr(sb._images, "ensure_deps", untouchable("ensure_deps"))
    monkeypatch.setattr(sb._images, "find", untouchable("find"))
    with pytest.raises(DependencyRejectedError):
        await sb.prepare(CodeBundle(BENIGN_CODE, dependencies=(dep,)))
    with pytest.raises(DependencyRejectedError):
        await sb.run(CodeBundle(BENIGN_CODE + "\n# run\n", dependencies=(dep,)), "", "", {}, timeout=CALL_TIMEOUT)
    assert asked == []


async def test_egress_probes_had_own_addresses(env):
    """The gateway probes above are only meaningful if an own address was found to aim at."""
    assert env["own"], "no address of this machine found for egress probes"


async def test_too_many_dependencies_rejected(env):
    deps = tuple(f"pkg{i}" for i in range(LIMITS.pids + 100))
    with pytest.raises(DependencyRejectedError, match="too many"):
        await env["sb"].prepare(CodeBundle(BENIGN_CODE, dependencies=deps))


async def test_suite_left_no_running_hostile_containers(env):
    await asyncio.sleep(0)
    running = env["client"].api.containers(filters={"label": "crossaudit.sandbox=1"})
    ours = [c for c in running if c["Labels"].get("crossaudit.bundle") != env["benign"].digest[:32]]
    owner = f"{socket.gethostname()}:{os.getpid()}"
    assert not [c for c in ours if c["Labels"].get("crossaudit.owner") == owner]


HOG_CODE = _src("""
    import os, time
    def evaluate(p, r, c):
        kids = 0
        for _ in range(200):
            try:
                if os.fork() == 0:
                    time.sleep(30)
                    os._exit(0)
                kids += 1
            except OSError:
                break
        time.sleep(float(c.get("hold", 2)))
        raise RuntimeError(f"held {kids} processes")
""")
THREADS_CODE = _src("""
    import threading
    def evaluate(p, r, c):
        threads = [threading.Thread(target=lambda: None) for _ in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return {"score": 1.0, "details": {"threads": len(threads)}}
""")


def _process_counts(client, digest: str) -> list[int]:
    counts = []
    for c in bundle_containers(client, digest):
        with contextlib.suppress(APIError):  # gone meanwhile
            counts.append(len(client.api.top(c["Id"]).get("Processes") or []))
    return counts


async def wait_processes(client, digest: str, at_least: int, bound_s: float = ROOM_S) -> int:
    """Poll (bounded) until a running container of ``digest`` holds ``at_least`` processes; the most seen."""
    most = 0
    end = time.monotonic() + bound_s
    while time.monotonic() < end and most < at_least:
        most = max([most, *await asyncio.to_thread(_process_counts, client, digest)])
        await asyncio.sleep(0.1)
    return most


async def test_two_orchestrators_walking_one_uid_range_never_share_a_uid(docker_daemon):
    """Exploit (seen as a flake with a second suite on the machine): each orchestrator process walks
    the uid range from its own random start; where two walks met, two tenants' containers got one
    uid, and the hog's processes refused the victim's threads (process accounting is per uid).
    Here the walks are made to meet: the second skips the uid the first's container holds."""
    first = DockerSandbox(LIMITS, pool_limits=PoolLimits(min_size=1, max_size=1))
    second = DockerSandbox(LIMITS, pool_limits=PoolLimits(min_size=1, max_size=1))
    hog, victim = CodeBundle(HOG_CODE + "\n# walks meet\n"), CodeBundle(THREADS_CODE + "\n# walks meet\n")
    lo, hi = SANDBOX_UID_RANGE
    start = lo + secrets.randbelow(hi - lo - 16)
    hog_call: asyncio.Future | None = None
    try:
        await asyncio.gather(first.start(), second.start())
        first._rt.uids, second._rt.uids = UidAllocator(start=start), UidAllocator(start=start)
        await first.prepare(hog)
        hog_call = asyncio.ensure_future(first.run(hog, "", "", {"hold": 600}, timeout=ROOM_S))
        held = await wait_processes(docker_daemon, hog.digest, LIMITS.pids)
        assert held >= LIMITS.pids, f"the hog's container never held its {LIMITS.pids} processes (at most {held})"
        await second.prepare(victim)
        verdict, _ = await second.run(victim, "", "", {}, timeout=ROOM_S)
        assert verdict.details["threads"] == 16  # no thread refused: its uid is its own
        containers = [c for d in (hog.digest, victim.digest) for c in bundle_containers(docker_daemon, d)]
        labels = [c["Labels"][UID_LABEL] for c in containers]
        assert len(set(labels)) == len(labels), labels
    finally:
        await asyncio.gather(first.aclose(), second.aclose())
        if hog_call is not None:
            with pytest.raises(ANY_SANDBOX):  # closed under it (a crash), or its deadline: contained either way
                await hog_call


async def test_one_evaluators_process_hog_does_not_starve_another(env):
    """Process accounting is per uid; every container has its own, so a hog stays contained."""
    sb: DockerSandbox = env["sb"]
    hog, victim = CodeBundle(HOG_CODE), CodeBundle(THREADS_CODE)
    await asyncio.gather(sb.prepare(hog), sb.prepare(victim))
    # The hog holds its processes until its pool is evicted below: the victim runs while it does,
    # whatever the machine's speed (no race with the hog's own end).
    hog_call = asyncio.ensure_future(sb.run(hog, "", "", {"hold": 600}, timeout=ROOM_S))
    try:
        held = await wait_processes(env["client"], hog.digest, LIMITS.pids)
        assert held >= LIMITS.pids, f"the hog's container never held its {LIMITS.pids} processes (at most {held})"
        verdict, _ = await sb.run(victim, "", "", {}, timeout=ROOM_S)
        assert verdict.details["threads"] == 16
        assert not hog_call.done()  # it still held its whole budget while the victim ran
    finally:
        await asyncio.gather(sb.evict(hog), sb.evict(victim))
    with pytest.raises(ANY_SANDBOX):  # evicted (a crash), or its deadline: contained either way
        await hog_call
