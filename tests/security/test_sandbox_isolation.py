"""Tenant isolation of warm sandboxes: nothing one call leaves behind is seen by the next call,
tenants never share a warm container, and a pool with no call in flight burns no CPU.

Each Docker test pins its pool to one container (``max_size=1``) and checks that both calls ran
there (every container has its own uid), so a leak would really be observable. The process
backend gets the checks that make sense for it (its agents share the host's filesystem view).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest
import pytest_asyncio

from crossaudit.kernel.limits import PoolLimits, SandboxLimits
from sandbox.base import CodeBundle
from sandbox.docker.backend import DockerSandbox
from sandbox.docker.container import BUNDLE_LABEL, POOL_LABEL, container_spec
from sandbox.process.backend import AGENT_PATH, ProcessSandbox
from sandbox.procfs import alive as _alive
from sandbox.protocol import AgentChannel
from tests.integration._docker import BENIGN_CODE, IDLE_BURNER_CODE, bundle_containers, container_cpu_ns

pytestmark = [pytest.mark.security]
IN_MODULE_LOOP = pytest.mark.asyncio(loop_scope="module")  # the docker tests share one sandbox

CALL_TIMEOUT = 5.0
LIMITS = SandboxLimits(timeout_s=CALL_TIMEOUT, cpu_s=5, tmpfs_inodes=8192, cleanup_s=1.5)
ONE_CONTAINER = PoolLimits(min_size=1, max_size=1, queue_wait_s=10.0)
IDLE_WINDOW_S = 2.0
IDLE_CPU_BOUND = 0.05  # of one core: an isolation property, not a speed figure


def _src(body: str) -> str:
    return textwrap.dedent(body).strip() + "\n"


# Call 1 (context.plant) leaves state everywhere it can, then call 2 reports what it observes.
LEAKY = _src("""
    import ctypes, os, threading, time

    libc = ctypes.CDLL(None, use_errno=True)
    libc.shmat.restype = ctypes.c_void_p
    KEY, IPC_CREAT = 0x5EED, 0o1000

    class Msg(ctypes.Structure):
        _fields_ = [("mtype", ctypes.c_long), ("mtext", ctypes.c_char * 64)]

    def plant(marker):
        data = marker.encode()
        for path in ("/tmp/x", "/dev/shm/x", "/dev/shm/sem.x"):
            with open(path, "w") as fh:
                fh.write(marker)
        os.makedirs("/tmp/d/e", exist_ok=True)
        with open("/tmp/d/e/x", "w") as fh:
            fh.write(marker)
        shm = libc.shmget(KEY, 4096, IPC_CREAT | 0o600)
        addr = libc.shmat(shm, None, 0)
        ctypes.memmove(addr, data, len(data))
        libc.shmdt(ctypes.c_void_p(addr))
        libc.shmget(0, 4096, IPC_CREAT | 0o600)  # IPC_PRIVATE, attached by nobody
        libc.semget(KEY, 1, IPC_CREAT | 0o600)
        msq = libc.msgget(KEY, IPC_CREAT | 0o600)
        msg = Msg(1, data[:63])
        libc.msgsnd(msq, ctypes.byref(msg), 64, 0)
        mq = libc.mq_open(b"/x", os.O_CREAT | os.O_RDWR, 0o600, None)
        if mq >= 0:
            libc.mq_send(mq, data, len(data), 0)
        os.environ["CROSSAUDIT_MARKER"] = marker
        threading.Thread(target=time.sleep, args=(600,), daemon=True).start()
        if os.fork() == 0:  # a daemon (double fork + setsid) that keeps handing the marker on
            os.setsid()
            if os.fork() == 0:
                while True:
                    try:
                        with open("/tmp/x", "w") as fh:
                            fh.write(marker)
                        libc.shmget(KEY, 4096, IPC_CREAT | 0o600)
                    except OSError:
                        pass
                    time.sleep(0.005)
            os._exit(0)
        time.sleep(0.05)

    def observe():
        found = {}
        for d in ("/tmp", "/dev/shm", "/dev/mqueue"):
            try:
                found[d] = sorted(os.listdir(d))
            except OSError as exc:
                found[d] = str(exc)
        for kind in ("shm", "sem", "msg"):
            with open(f"/proc/sysvipc/{kind}") as fh:
                found["sysv_" + kind] = fh.read().splitlines()[1:]
        found["env"] = os.environ.get("CROSSAUDIT_MARKER")
        found["procs"] = sorted(int(p) for p in os.listdir("/proc") if p.isdigit() and not agent(int(p)))
        found["threads"] = len(os.listdir("/proc/self/task"))
        return found

    def agent(pid):  # the warm parent (PID 1), its I/O process, and this call's process
        try:
            with open(f"/proc/{pid}/comm") as fh:
                return pid in (1, os.getpid()) or fh.read().strip() == "crossaudit-io"
        except OSError:
            return True  # gone meanwhile

    def evaluate(prompt, response, context):
        seen = observe()
        if context.get("plant"):
            plant(prompt)
        return {"score": 1.0, "details": {"seen": seen, "uid": os.getuid()}}
""")
# Every earlier caller's prompt this call finds in its own memory (freed buffers included): a
# call child that was forked from a process which had read earlier calls would find them.
MEMORY_SCAN = _src("""
    import ctypes, re

    def evaluate(prompt, response, context):
        found = set()
        pattern = re.compile(rb"CALLER-[0-9]{6}-SECRET")
        with open("/proc/self/maps") as fh:
            regions = [line.split() for line in fh]
        for region in regions:
            lo, hi = (int(x, 16) for x in region[0].split("-"))
            name = region[5] if len(region) > 5 else ""
            if "r" not in region[1] or hi - lo > 256 << 20 or (name.startswith("[") and name != "[heap]"):
                continue
            try:
                found.update(m.decode() for m in pattern.findall(ctypes.string_at(lo, hi - lo)))
            except Exception:
                continue
        return {"score": 1.0, "details": {"others": sorted(found - {prompt}), "saw_own": prompt in found}}
""")

CLEAN = {"/tmp": [], "/dev/shm": [], "/dev/mqueue": [], "sysv_shm": [], "sysv_sem": [], "sysv_msg": [],
         "env": None, "procs": [], "threads": 1}  # fmt: skip

# Thousands of files, a directory tree deeper than PATH_MAX, and files up to the inode cap.
LITTER = _src("""
    import os
    def evaluate(prompt, response, context):
        before = sorted(os.listdir("/tmp")) + sorted(os.listdir("/dev/shm"))
        made = 0
        for i in range(int(context.get("files", 0))):
            try:
                open(f"/tmp/f{i}", "w").close()
                made += 1
            except OSError:
                break  # ENOSPC: the tmpfs inode cap
        depth = 0
        if context.get("deep"):
            os.chdir("/tmp")
            for depth in range(1, 2500):  # 2 characters per level: deeper than PATH_MAX (4096)
                os.mkdir("d")
                os.chdir("d")
            open("leaf", "w").close()
            os.chmod(".", 0)  # and an unreadable directory at the bottom
        if context.get("locked"):
            os.makedirs("/dev/shm/locked/inner")
            open("/dev/shm/locked/inner/f", "w").close()
            os.chmod("/dev/shm/locked/inner", 0)
            os.chmod("/dev/shm/locked", 0)
        return {"score": 1.0, "details": {"before": before, "made": made, "depth": depth, "uid": os.getuid()}}
""")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def dsb(docker_daemon):
    sandbox = DockerSandbox(LIMITS, pool_limits=ONE_CONTAINER)
    yield sandbox
    await sandbox.aclose()


def _only_container(client, bundle: CodeBundle) -> dict:
    found = [c for c in bundle_containers(client, bundle.digest) if c["Labels"].get(POOL_LABEL) == bundle.pool_key[:32]]
    assert len(found) == 1, found
    return found[0]


async def _settled(sb: DockerSandbox, bundle: CodeBundle, cleanups: int) -> dict:
    """The pool's stats once ``cleanups`` resets were reported (they come after the answers)."""
    for _ in range(100):
        stats = sb.pool_stats(bundle)
        if stats and stats["cleanups"] >= cleanups and not stats["settling"]:
            break
        await asyncio.sleep(0.05)
    return stats


# --------------------------------------------------------------------------- docker: call to call


@pytest.mark.docker
@pytest.mark.slow
@IN_MODULE_LOOP
async def test_nothing_a_call_leaves_behind_reaches_the_next_call(dsb, docker_daemon):
    tenant_a = CodeBundle(LEAKY, tenant="tenant-a")
    tenant_b = CodeBundle(LEAKY, tenant="tenant-b")  # identical code, another tenant
    await asyncio.gather(dsb.prepare(tenant_a), dsb.prepare(tenant_b))
    try:
        first, _ = await dsb.run(tenant_a, "marker-of-caller-1", "", {"plant": True}, timeout=CALL_TIMEOUT)
        assert first.details["seen"] == CLEAN  # a fresh container starts clean
        second, _ = await dsb.run(tenant_a, "caller-2", "", {}, timeout=CALL_TIMEOUT)
        other, _ = await dsb.run(tenant_b, "caller-3", "", {}, timeout=CALL_TIMEOUT)
        # The same container served both calls of tenant A (one uid per container), so the
        # leftovers above really were there to be seen ...
        assert second.details["uid"] == first.details["uid"]
        assert dsb.pool_stats(tenant_a)["started"] == 1 and dsb.pool_stats(tenant_a)["replaced"] == 0
        # ... and none of them was: files, POSIX shm/sem/mqueue, SysV shm/sem/msg, environment,
        # the daemon and its thread.
        assert second.details["seen"] == CLEAN
        assert other.details["seen"] == CLEAN and other.details["uid"] != first.details["uid"]
        stats = await _settled(dsb, tenant_a, 2)
        assert stats["cleanup_failures"] == 0
    finally:
        await asyncio.gather(dsb.evict(tenant_a), dsb.evict(tenant_b))


@pytest.mark.docker
@pytest.mark.slow
@IN_MODULE_LOOP
async def test_no_call_finds_an_earlier_callers_data_in_its_memory(dsb):
    bundle = CodeBundle(MEMORY_SCAN, tenant="memory")
    await dsb.prepare(bundle)
    try:
        for i in range(3):
            verdict, _ = await dsb.run(bundle, f"CALLER-{i:06d}-SECRET", "", {}, timeout=CALL_TIMEOUT)
            assert verdict.details == {"others": [], "saw_own": True}  # the scan works, and finds only its own
        assert dsb.pool_stats(bundle)["started"] == 1
    finally:
        await dsb.evict(bundle)


@pytest.mark.docker
@pytest.mark.slow
@IN_MODULE_LOOP
async def test_two_tenants_with_identical_code_get_their_own_pools_and_containers(dsb, docker_daemon):
    a, b = CodeBundle(BENIGN_CODE, tenant="acme"), CodeBundle(BENIGN_CODE, tenant="globex")
    assert a.digest == b.digest and a.pool_key != b.pool_key  # one image, two pools
    await asyncio.gather(dsb.prepare(a), dsb.prepare(b))
    try:
        ca, cb = _only_container(docker_daemon, a), _only_container(docker_daemon, b)
        assert ca["Id"] != cb["Id"]
        assert ca["Labels"][BUNDLE_LABEL] == cb["Labels"][BUNDLE_LABEL] == a.digest[:32]
        pools = dsb.info()["pools"]
        assert a.pool_key[:12] in pools and b.pool_key[:12] in pools
        va, _ = await dsb.run(a, "", "from acme", {}, timeout=CALL_TIMEOUT)
        vb, _ = await dsb.run(b, "", "from globex", {}, timeout=CALL_TIMEOUT)
        assert va.details["echo"] == "from acme" and vb.details["echo"] == "from globex"
        assert dsb.pool_stats(a)["started"] == dsb.pool_stats(b)["started"] == 1
    finally:
        await asyncio.gather(dsb.evict(a), dsb.evict(b))


@pytest.mark.docker
@pytest.mark.slow
@IN_MODULE_LOOP
async def test_thousands_of_files_and_deep_trees_are_gone_for_the_next_call(dsb):
    bundle = CodeBundle(LITTER, tenant="litter")
    await dsb.prepare(bundle)
    try:
        first, _ = await dsb.run(bundle, "", "", {"files": 5000, "deep": True, "locked": True}, timeout=CALL_TIMEOUT)
        assert first.details["made"] == 5000 and first.details["depth"] == 2499
        # answered within its deadline although the cleanup of 5,000 files and a deep tree came first
        second, _ = await dsb.run(bundle, "", "", {"files": 10**6}, timeout=CALL_TIMEOUT)
        assert second.details["uid"] == first.details["uid"]  # same container, cleaned, not replaced
        assert second.details["before"] == []
        # The tmpfs inode cap bounds what a call can leave (and so what the cleanup must remove).
        assert 5000 < second.details["made"] < LIMITS.tmpfs_inodes
        third, _ = await dsb.run(bundle, "", "", {}, timeout=CALL_TIMEOUT)
        assert third.details["before"] == [] and third.details["uid"] == first.details["uid"]
        stats = await _settled(dsb, bundle, 3)
        assert stats["cleanup_failures"] == 0 and stats["replaced"] == 0
        assert stats["cleanup_ms_max"] < LIMITS.cleanup_s * 1000  # bounded, and within its budget
    finally:
        await dsb.evict(bundle)


@pytest.mark.docker
@pytest.mark.slow
@IN_MODULE_LOOP
async def test_a_container_whose_cleanup_fails_is_retired(dsb, docker_daemon):
    """A process the agent cannot kill (here: root, started from outside) fails the cleanup."""
    bundle = CodeBundle(LEAKY, tenant="unkillable")
    await dsb.prepare(bundle)
    try:
        cid = _only_container(docker_daemon, bundle)["Id"]
        exe = docker_daemon.api.exec_create(cid, ["python3", "-c", "import time; time.sleep(60)"], user="0")
        docker_daemon.api.exec_start(exe["Id"], detach=True)
        first, _ = await dsb.run(bundle, "p", "", {}, timeout=CALL_TIMEOUT)  # answered before the cleanup
        second, _ = await dsb.run(bundle, "p", "", {}, timeout=CALL_TIMEOUT + LIMITS.cleanup_s)
        assert second.details["uid"] != first.details["uid"]  # served by a replacement container
        assert second.details["seen"] == CLEAN
        stats = await _settled(dsb, bundle, 2)
        assert stats["cleanup_failures"] == 1 and stats["replaced"] >= 1
    finally:
        await dsb.evict(bundle)


# --------------------------------------------------------------------------- docker: idle CPU


async def _idle_cpu(client, cid: str, window_s: float = IDLE_WINDOW_S) -> float:
    """Fraction of one core the container used over ``window_s`` with no call in flight."""
    n0, t0 = await asyncio.to_thread(container_cpu_ns, client, cid)
    await asyncio.sleep(window_s)
    n1, t1 = await asyncio.to_thread(container_cpu_ns, client, cid)
    return (n1 - n0) / 1e9 / (t1 - t0)


@pytest.mark.docker
@pytest.mark.slow
@IN_MODULE_LOOP
@pytest.mark.parametrize("name", sorted(IDLE_BURNER_CODE))
async def test_an_idle_pool_burns_no_cpu(dsb, docker_daemon, name):
    bundle = CodeBundle(IDLE_BURNER_CODE[name], tenant=f"burner-{name}")
    await dsb.prepare(bundle)
    try:
        cid = _only_container(docker_daemon, bundle)["Id"]
        await asyncio.sleep(0.5)  # anything started at load has had time to show
        after_load = await _idle_cpu(docker_daemon, cid)
        verdict, _ = await dsb.run(bundle, "", "", {}, timeout=CALL_TIMEOUT)  # the module body runs now
        assert verdict.details == {"ok": True}
        await asyncio.sleep(0.5)
        after_call = await _idle_cpu(docker_daemon, cid)
        assert _only_container(docker_daemon, bundle)["Id"] == cid
        assert after_load < IDLE_CPU_BOUND, f"{name}: {after_load:.1%} of a core while idle after load"
        assert after_call < IDLE_CPU_BOUND, f"{name}: {after_call:.1%} of a core while idle after a call"
        again, _ = await dsb.run(bundle, "", "", {}, timeout=CALL_TIMEOUT)
        assert again.details == {"ok": True}
    finally:
        await dsb.evict(bundle)


def test_container_spec_caps_what_a_call_can_leave():
    import docker

    api = docker.APIClient(base_url="unix:///nonexistent.sock", version="1.41")
    limits = SandboxLimits(tmpfs_bytes=4_000_000, tmpfs_inodes=1234, ipc_objects=7)
    hc = container_spec(api, "img:tag", limits, {}, {})["host_config"]
    for scratch in ("/tmp", "/dev/shm"):
        assert "size=4000000" in hc["Tmpfs"][scratch] and "nr_inodes=1234" in hc["Tmpfs"][scratch]
        assert "noexec" in hc["Tmpfs"][scratch]
    assert hc["IpcMode"] == "private" and "ShmSize" not in hc
    assert hc["Sysctls"]["kernel.shmmni"] == hc["Sysctls"]["kernel.msgmni"] == "7"
    assert hc["Sysctls"]["kernel.sem"].split()[3] == "7" and hc["Sysctls"]["fs.mqueue.queues_max"] == "7"
    assert hc["Sysctls"]["kernel.shm_rmid_forced"] == "1"


# --------------------------------------------------------------------------- process backend


PROC_LIMITS = SandboxLimits(timeout_s=CALL_TIMEOUT, cpu_s=5, cleanup_s=1.5)

PROC_LEAKY = _src("""
    import _thread, os, time

    def evaluate(prompt, response, context):
        agent = os.getppid()  # the warm agent forks every call's process
        seen = {"cwd": sorted(os.listdir(".")), "tmpdir": sorted(os.listdir(os.environ["TMPDIR"])),
                "env": os.environ.get("CROSSAUDIT_MARKER"), "agent": agent}
        daemon = 0
        if context.get("plant"):
            for name in ("x", os.path.join(os.environ["TMPDIR"], "y")):
                with open(name, "w") as fh:
                    fh.write(prompt)
            os.makedirs("d/e")
            os.environ["CROSSAUDIT_MARKER"] = prompt
            _thread.start_new_thread(time.sleep, (600,))  # a builtin: importable by the dropped uid too
            r, w = os.pipe()
            if os.fork() == 0:
                os.setsid()
                pid = os.fork()
                if pid == 0:
                    while True:
                        try:
                            with open("x", "w") as fh:
                                fh.write(prompt)
                        except OSError:
                            pass
                        time.sleep(0.005)
                os.write(w, str(pid).encode())
                os._exit(0)
            daemon = int(os.read(r, 32))
        return {"score": 1.0, "details": {"seen": seen, "daemon": daemon}}
""")


async def test_process_backend_carries_nothing_between_calls():
    """Unrestricted mode (the rlimit layer alone) can write files: its workdir is wiped per call."""
    box = ProcessSandbox(PROC_LIMITS, restricted=False, pool_limits=ONE_CONTAINER)
    bundle = CodeBundle(PROC_LEAKY, tenant="proc")
    try:
        await box.prepare(bundle)
        first, _ = await box.run(bundle, "marker-1", "", {"plant": True}, timeout=CALL_TIMEOUT)
        daemon = first.details["daemon"]
        second, _ = await box.run(bundle, "caller-2", "", {}, timeout=CALL_TIMEOUT)
        assert second.details["seen"]["agent"] == first.details["seen"]["agent"]  # the same warm agent
        assert second.details["seen"] == {"cwd": [], "tmpdir": [], "env": None, "agent": first.details["seen"]["agent"]}
        assert daemon > 0 and not _alive(daemon)
    finally:
        await box.aclose()


async def test_process_backend_call_memory_holds_no_earlier_call():
    box = ProcessSandbox(PROC_LIMITS, restricted=False, pool_limits=ONE_CONTAINER)
    try:
        bundle = CodeBundle(MEMORY_SCAN)
        for i in range(3):
            verdict, _ = await box.run(bundle, f"CALLER-{i:06d}-SECRET", "", {}, timeout=CALL_TIMEOUT)
            assert verdict.details == {"others": [], "saw_own": True}
        assert box.info()["agents"] == 1
    finally:
        await box.aclose()


async def test_process_backend_restricted_module_state_is_per_call():
    code = _src("""
        seen = []
        def evaluate(prompt, response, context):
            seen.append(prompt)
            return {"score": 1.0, "details": {"seen": list(seen)}}
    """)
    box = ProcessSandbox(PROC_LIMITS, pool_limits=ONE_CONTAINER)
    try:
        bundle = CodeBundle(code)
        for prompt in ("a", "b", "c"):
            verdict, _ = await box.run(bundle, prompt, "", {}, timeout=CALL_TIMEOUT)
            assert verdict.details["seen"] == [prompt]
    finally:
        await box.aclose()


# --------------------------------------------------------------------------- the agent's load, driven directly


class _Agent:
    """The agent with raw frame I/O; ``site`` is importable by its preload (like a dependency)."""

    def __init__(self, site: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-s", str(AGENT_PATH)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(site)}, cwd=site,
        )  # fmt: skip

    def send(self, frame: dict) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(frame) + "\n").encode())
        self.proc.stdin.flush()

    def recv(self) -> dict:
        assert self.proc.stdout is not None
        return json.loads(self.proc.stdout.readline())

    def load(self, preload: list[str], code: str = "def evaluate(p, r, c):\n    return {'score': 1.0}\n", **kw) -> dict:
        self.send(AgentChannel.load_frame(code, preload=preload, restricted=False, limits=PROC_LIMITS, **kw))
        return self.recv()

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def _module(site: Path, name: str, body: str) -> None:
    (site / f"{name}.py").write_text(_src(body))


def test_preload_that_leaves_threads_is_refused(tmp_path):
    _module(
        tmp_path,
        "threader",
        """
        import threading, time
        threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
    """,
    )
    agent = _Agent(tmp_path)
    try:
        loaded = agent.load(["threader"])
        assert loaded["ok"] is False and loaded["error"]["type"] == "load_error"
        assert "thread" in loaded["error"]["message"]
    finally:
        agent.close()


def test_preload_leftover_processes_are_killed_before_the_load_answers(tmp_path):
    _module(
        tmp_path,
        "leaver",
        """
        import os, time
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                with open("leaver.pid", "w") as fh:
                    fh.write(str(os.getpid()))
                while True:
                    time.sleep(0.01)
            os._exit(0)
        for _ in range(500):
            if os.path.exists("leaver.pid") and os.path.getsize("leaver.pid"):
                break
            time.sleep(0.01)
    """,
    )
    agent = _Agent(tmp_path)
    try:
        loaded = agent.load(["leaver"])
        assert loaded["ok"] is True, loaded
        pid = int((tmp_path / "leaver.pid").read_text())
        assert not _alive(pid)
    finally:
        agent.close()


def test_agent_reports_each_reset_and_wipes_its_scratch_dir(tmp_path):
    scratch = Path(tempfile.mkdtemp(prefix="crossaudit-test-scratch-"))
    scratch.chmod(0o777)  # run as root, the agent drops its call children to an unprivileged uid
    code = _src(f"""
        import os
        def evaluate(p, r, c):
            before = sorted(os.listdir({str(scratch)!r}))
            os.makedirs({str(scratch / "a" / "b")!r})
            open({str(scratch / "a" / "b" / "f")!r}, "w").close()
            return {{"score": 1.0, "details": {{"before": before}}}}
    """)
    agent = _Agent(tmp_path)
    try:
        assert agent.load([], code, reset={"paths": [str(scratch)], "ipc": False})["ok"] is True
        for nonce in ("c1", "c2"):
            agent.send({"op": "call", "id": nonce, "prompt": "", "response": "", "context": {}})
            result = agent.recv()
            assert result["op"] == "result" and result["ok"] is True and result["result"]["details"]["before"] == []
            reset = agent.recv()
            assert reset["op"] == "reset" and reset["ok"] is True and reset["cleanup_ms"] >= 0
            assert list(scratch.iterdir()) == []
    finally:
        agent.close()
        shutil.rmtree(scratch, ignore_errors=True)


def test_agent_refuses_a_reset_path_that_is_not_a_plain_absolute_dir(tmp_path):
    for bad in ("/", "relative", "/tmp/../etc", 7):
        agent = _Agent(tmp_path)
        try:
            loaded = agent.load([], reset={"paths": [bad], "ipc": False})
            assert loaded["ok"] is False and loaded["error"]["type"] == "load_error", bad
        finally:
            agent.close()
