"""The Docker sandbox against the real daemon: images, hardening, guide evaluator, pools, reaping.

Under CI=true a missing daemon fails these tests (``docker_daemon`` fixture); elsewhere they skip.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket

import pytest
import pytest_asyncio

from crossaudit.kernel.depspec import validate_dependencies
from crossaudit.kernel.errors import (
    ConfigurationError,
    DependencyRejectedError,
    EvaluatorCodeError,
    EvaluatorTimeoutError,
    PoolExhaustedError,
    SandboxCodeError,
)
from crossaudit.kernel.limits import PoolLimits, SandboxLimits
from sandbox.base import CodeBundle
from sandbox.docker import container as container_mod
from sandbox.docker.backend import DockerSandbox
from sandbox.docker.container import (
    BUNDLE_LABEL,
    CHANNEL_MOUNT,
    CHANNEL_SOCKET,
    OWNER_LABEL,
    SANDBOX_UID_RANGE,
    UID_LABEL,
    owner_id,
)
from sandbox.docker.images import LABEL, SANDBOX_UID
from sandbox.docker.reaper import reap
from tests.integration._docker import (
    BENIGN_CODE,
    GUIDE_PROFANITY_CODE,
    GUIDE_PROFANITY_DEPS,
    SENTIMENT_CODE,
    bundle_containers,
    wait_gone,
)

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]

# The deadline of a call that must succeed: a warm call takes milliseconds, a cold or replacement
# container about a second when idle, far more on a loaded 2-core machine. Calls that must time
# out pass their own short deadline.
ROOM_S = 60.0
LIMITS = SandboxLimits(timeout_s=ROOM_S)


async def _wait_busy(sandbox: DockerSandbox, bundle: CodeBundle) -> None:
    """Until a call holds one of ``bundle``'s containers (bounded)."""
    for _ in range(600):
        if sandbox.pool_stats(bundle)["busy"] >= 1:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("no call took a container")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def sb(docker_daemon):
    sandbox = DockerSandbox(LIMITS, pool_limits=PoolLimits(min_size=1, max_size=2, queue_wait_s=2.0))
    yield sandbox
    await sandbox.aclose()


def _bundle(code: str, deps: tuple[str, ...] = (), tag: str = "") -> CodeBundle:
    # ``tag`` makes a distinct bundle (digest) with the same behaviour: a fresh pool per test.
    return CodeBundle(code=code + (f"\n# {tag}\n" if tag else ""), dependencies=deps)


async def test_prepare_builds_images_once_and_streams_progress(sb):
    events: list[tuple[str, float]] = []
    bundle = _bundle(GUIDE_PROFANITY_CODE, GUIDE_PROFANITY_DEPS)
    await sb.prepare(bundle, lambda m, f: events.append((m, f)))
    assert events and events[-1] == ("evaluator ready", 1.0)
    assert all(0.0 <= f <= 1.0 for _, f in events)
    # A second prepare finds everything by content tag: no build, no download.
    again: list[tuple[str, float]] = []
    await sb.prepare(_bundle(GUIDE_PROFANITY_CODE, GUIDE_PROFANITY_DEPS, "other"), lambda m, f: again.append((m, f)))
    assert not any("Step" in m or "downloading" in m for m, _ in again)
    image = sb._images.find(validate_dependencies(GUIDE_PROFANITY_DEPS))
    assert image is not None and image.tag.startswith("crossaudit/deps:")
    assert {"nltk", "textblob"} <= set(image.preload)


async def test_guide_profanity_filter_runs_as_written(sb):
    bundle = _bundle(GUIDE_PROFANITY_CODE, GUIDE_PROFANITY_DEPS)
    await sb.prepare(bundle)
    clean, diag = await sb.run(bundle, "hi", "a perfectly polite answer", {}, timeout=ROOM_S)
    assert clean.score == 1.0 and clean.passed is True and clean.violations == []
    assert clean.details == {"checked_words": 2, "found_violations": 0}
    dirty, _ = await sb.run(bundle, "hi", "this has BADWORD1 and badword2", {}, timeout=ROOM_S)
    assert dirty.score == pytest.approx(0.6) and dirty.passed is False
    assert dirty.violations == ["badword1", "badword2"]
    assert diag.extra["backend"] == "docker"


async def test_each_tenants_containers_run_under_its_own_cgroup_parent(sb, docker_daemon):
    """Tenants split the CPU before containers: each tenant's containers share one cgroup parent,
    so a tenant running many containers does not get a core share per container."""
    from sandbox.cpugroups import docker_parent

    driver = docker_daemon.info()["CgroupDriver"]
    for tenant in ("acme", "globex"):
        bundle = CodeBundle(code=BENIGN_CODE + "\n# cgroup\n", tenant=tenant)
        await sb.prepare(bundle)
        [summary] = [c for c in bundle_containers(docker_daemon, bundle.digest)
                     if c["Labels"].get("crossaudit.pool") == bundle.pool_key[:32]][:1]  # fmt: skip
        info = docker_daemon.api.inspect_container(summary["Id"])
        assert info["HostConfig"]["CgroupParent"] == docker_parent(tenant, driver)
    assert docker_parent("acme", driver) != docker_parent("globex", driver)


async def test_textblob_sentiment_polarity_sign(sb):
    bundle = _bundle(SENTIMENT_CODE, GUIDE_PROFANITY_DEPS)
    await sb.prepare(bundle)
    good, _ = await sb.run(bundle, "", "I love this, it is a wonderful and great answer", {}, timeout=ROOM_S)
    bad, _ = await sb.run(bundle, "", "This is terrible, awful and horrible", {}, timeout=ROOM_S)
    assert good.details["polarity"] > 0 and good.passed is True and good.score > 0.5
    assert bad.details["polarity"] < 0 and bad.passed is False and bad.score < 0.5


async def test_container_hardening_matches_limits(sb, docker_daemon):
    bundle = _bundle(BENIGN_CODE, tag="hardening")
    await sb.prepare(bundle)
    [summary] = bundle_containers(docker_daemon, bundle.digest)[:1]
    info = docker_daemon.api.inspect_container(summary["Id"])
    hc, cfg = info["HostConfig"], info["Config"]
    assert hc["NetworkMode"] == "none"
    assert hc["ReadonlyRootfs"] is True
    assert hc["CapDrop"] == ["ALL"] and not hc.get("CapAdd")
    assert "no-new-privileges" in hc["SecurityOpt"]
    assert hc["Privileged"] is False
    assert hc["Memory"] == LIMITS.container_memory_bytes == hc["MemorySwap"]
    assert hc["PidsLimit"] >= LIMITS.pids and hc["PidsLimit"] <= LIMITS.pids + 32
    assert hc["NanoCpus"] == int(LIMITS.cpus * 1e9)
    ulimits = {u["Name"]: (u["Soft"], u["Hard"]) for u in hc["Ulimits"]}
    assert ulimits["core"] == (0, 0)
    assert ulimits["nofile"][1] <= LIMITS.nofile + 64
    tmpfs = hc["Tmpfs"]["/tmp"]
    assert "noexec" in tmpfs and "nosuid" in tmpfs and f"size={LIMITS.tmpfs_bytes}" in tmpfs
    assert hc["AutoRemove"] is True
    # At most one bind: the container's own channel directory, read-only, removed from the host
    # once the agent connected (the socket channel; this machine's daemon is local).
    assert sb.info()["socket_channel"] is True
    [bind] = hc["Binds"]
    source, target, mode = bind.split(":")
    assert target == CHANNEL_MOUNT and mode == "ro"
    assert os.path.basename(source).startswith(f"crossaudit-channel-{os.getpid()}-")
    assert not os.path.exists(source)
    assert all(m["Type"] == "tmpfs" for m in info.get("Mounts") or [] if m.get("Destination") != CHANNEL_MOUNT)
    assert hc["LogConfig"]["Type"] == "none"
    uid, gid = (int(x) for x in cfg["User"].split(":"))
    assert SANDBOX_UID_RANGE[0] <= uid < SANDBOX_UID_RANGE[1] and gid == SANDBOX_UID
    assert cfg["Labels"][UID_LABEL] == str(uid)  # what other orchestrators' allocators skip
    assert cfg["Labels"][LABEL] == "1" and cfg["Labels"][OWNER_LABEL] == owner_id()
    assert cfg["Labels"][BUNDLE_LABEL] == bundle.digest[:32]
    env_keys = {e.split("=", 1)[0] for e in cfg["Env"]}
    host_only = {k for k in os.environ if k not in env_keys}
    assert "DOCKER_HOST" not in env_keys and "HOME" in env_keys
    assert host_only  # the host's environment is not copied in
    assert not any(k.endswith(("_KEY", "_TOKEN", "_SECRET")) for k in env_keys)


INSIDE_CODE = r'''
import os, socket, json
def evaluate(prompt, response, context):
    facts = {"uid": os.getuid(), "gid": os.getgid(), "pid": os.getpid()}
    try:
        open("/root-write-probe", "w")
        facts["root_writable"] = True
    except OSError as e:
        facts["root_writable"] = False
    with open("/tmp/probe.txt", "w") as fh:
        fh.write("ok")
    facts["tmp_writable"] = True
    with open("/proc/net/dev") as fh:
        facts["interfaces"] = sorted(l.split(":")[0].strip() for l in fh.readlines()[2:])
    with open("/proc/self/status") as fh:
        caps = dict(l.split(":", 1) for l in fh if l.startswith(("CapEff", "CapPrm", "NoNewPrivs")))
    facts["caps"] = {k: v.strip() for k, v in caps.items()}
    with open("/proc/self/mounts") as fh:
        facts["tmp_mount"] = [l for l in fh if " /tmp " in l][0]
    facts["env"] = sorted(os.environ)
    channel = "/run/crossaudit"
    try:
        facts["channel_listing"] = os.listdir(channel)
    except OSError as e:
        facts["channel_listing"] = type(e).__name__
    try:
        open(channel + "/planted", "w")
        facts["channel_writable"] = True
    except OSError:
        facts["channel_writable"] = False
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(channel + "/agent.sock")
        facts["channel_connect"] = "connected"
    except OSError as e:
        facts["channel_connect"] = type(e).__name__
    return {"score": 1.0, "details": facts}
'''


async def test_inside_view_of_a_sandbox(sb):
    bundle = _bundle(INSIDE_CODE)
    await sb.prepare(bundle)
    v, _ = await sb.run(bundle, "", "", {}, timeout=ROOM_S)
    f = v.details
    assert SANDBOX_UID_RANGE[0] <= f["uid"] < SANDBOX_UID_RANGE[1] and f["gid"] == SANDBOX_UID
    assert f["root_writable"] is False and f["tmp_writable"] is True
    assert f["interfaces"] == ["lo"]
    assert int(f["caps"]["CapEff"], 16) == 0 and int(f["caps"]["CapPrm"], 16) == 0
    assert f["caps"]["NoNewPrivs"] == "1"
    assert "noexec" in f["tmp_mount"] and "nosuid" in f["tmp_mount"]
    # The agent's channel: nothing to list or plant, and nobody left to connect to.
    assert f["channel_listing"] in ("PermissionError", []) and f["channel_writable"] is False
    assert f["channel_connect"] in ("FileNotFoundError", "ConnectionRefusedError")
    assert set(f["env"]) <= {
        "PATH", "HOME", "LANG", "HOSTNAME", "PYTHONPATH", "PYTHONDONTWRITEBYTECODE", "PYTHONUNBUFFERED",
        "PYTHONNOUSERSITE", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
        "TOKENIZERS_PARALLELISM", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "GPG_KEY", "PYTHON_VERSION",
        "PYTHON_SHA256", "LC_CTYPE",
    }


STATE_CODE = '''
import os
COUNTER = []
def evaluate(prompt, response, context):
    COUNTER.append(1)
    return {"score": 1.0, "details": {"pid": os.getpid(), "ppid": os.getppid(), "calls_seen": len(COUNTER)}}
'''


async def test_warm_calls_share_a_container_but_not_state(sb):
    bundle = _bundle(STATE_CODE)
    await sb.prepare(bundle)
    seen = []
    for _ in range(5):
        v, diag = await sb.run(bundle, "", "", {}, timeout=ROOM_S)
        seen.append(v.details)
    assert all(d["calls_seen"] == 1 for d in seen)  # a fresh process per call
    assert len({d["pid"] for d in seen}) == 5
    assert len({d["ppid"] for d in seen}) == 1  # ... forked from one warm parent
    assert sb.pool_stats(bundle)["started"] == 1
    assert diag.extra["warm"] is True


SLOW_CODE = '''
import time
def evaluate(prompt, response, context):
    time.sleep(float(context.get("sleep", 0)))
    return {"score": 1.0}
'''


async def test_concurrency_beyond_pool_queues_then_is_exhausted(docker_daemon):
    sandbox = DockerSandbox(LIMITS, pool_limits=PoolLimits(min_size=1, max_size=1, queue_wait_s=0.5))
    try:
        bundle = _bundle(SLOW_CODE, tag="exhaust")
        await sandbox.prepare(bundle)
        # Short calls queue behind each other and all succeed.
        results = await asyncio.gather(
            *(sandbox.run(bundle, "", "", {"sleep": 0.1}, timeout=ROOM_S) for _ in range(3))
        )
        assert len(results) == 3
        # A long call holds the only container (for 5 s: ten times queue_wait_s): the queued one
        # gives up after queue_wait_s.
        first = asyncio.ensure_future(sandbox.run(bundle, "", "", {"sleep": 5}, timeout=ROOM_S))
        await _wait_busy(sandbox, bundle)
        with pytest.raises(PoolExhaustedError) as info:
            await sandbox.run(bundle, "", "", {}, timeout=ROOM_S)
        assert info.value.retryable and info.value.code.value == "resource_exhausted"
        await first
    finally:
        await sandbox.aclose()


async def test_deadline_kills_container_and_pool_refills(sb, docker_daemon):
    bundle = _bundle(SLOW_CODE, tag="deadline")
    await sb.prepare(bundle)
    [before] = [c["Id"] for c in bundle_containers(docker_daemon, bundle.digest)]
    with pytest.raises(EvaluatorTimeoutError):  # it would sleep 30 s: only the deadline ends it this way
        await sb.run(bundle, "", "", {"sleep": 30}, timeout=1.0)
    ids = {c["Id"] for c in bundle_containers(docker_daemon, bundle.digest, running_only=False)}
    assert before not in ids  # killed and removed before the error was raised
    v, _ = await sb.run(bundle, "", "", {}, timeout=ROOM_S)  # a replacement serves the next call
    assert v.score == 1.0


async def test_dead_container_is_replaced(sb, docker_daemon):
    bundle = _bundle(BENIGN_CODE, tag="dead")
    await sb.prepare(bundle)
    [cid] = [c["Id"] for c in bundle_containers(docker_daemon, bundle.digest)]
    docker_daemon.api.kill(cid)
    pool = sb._pools[bundle.pool_key]
    for _ in range(1200):  # bounded: until the pool saw its channel close (was: a 0.3 s sleep)
        if not any(c.alive for c in pool.idle if c.id == cid):
            break
        await asyncio.sleep(0.05)
    v, _ = await sb.run(bundle, "", "still works", {}, timeout=ROOM_S)
    assert v.details["echo"] == "still works"
    assert cid not in {c["Id"] for c in bundle_containers(docker_daemon, bundle.digest)}


async def test_errors_are_typed_and_early(sb):
    with pytest.raises(DependencyRejectedError):
        await sb.prepare(_bundle(BENIGN_CODE, ("requests; os_name=='posix'",)))
    with pytest.raises(EvaluatorCodeError):
        await sb.prepare(_bundle("def not_evaluate(a, b, c):\n    return {}\n"))
    # Never built at call time: a dependency set whose image does not exist is refused.
    with pytest.raises(ConfigurationError):
        await sb.run(_bundle(BENIGN_CODE, ("six<1.0.0.dev7",)), "", "", {}, timeout=ROOM_S)
    bundle = _bundle("def evaluate(p, r, c):\n    raise ValueError('nope')\n")
    await sb.prepare(bundle)
    with pytest.raises(SandboxCodeError, match="ValueError: nope"):
        await sb.run(bundle, "", "", {}, timeout=ROOM_S)


async def test_unprepared_bundle_with_cached_image_starts_cold(sb):
    bundle = _bundle(BENIGN_CODE, tag="cold")
    v, diag = await sb.run(bundle, "", "cold", {}, timeout=ROOM_S)
    assert v.details["echo"] == "cold" and diag.extra["warm"] is False


async def test_reaper_removes_leftovers_of_dead_owners_only(sb, docker_daemon):
    image = sb._images.ensure_runner()
    made = []
    try:
        for owner in (f"{socket.gethostname()}:999999999", owner_id()):  # a dead pid, then ours
            c = docker_daemon.api.create_container(
                image, stdin_open=True,
                labels={LABEL: "1", OWNER_LABEL: owner, BUNDLE_LABEL: "reaper-test"},
                host_config=docker_daemon.api.create_host_config(network_mode="none", auto_remove=True),
            )
            made.append(c["Id"])
            docker_daemon.api.start(c["Id"])
        assert reap(docker_daemon) >= 1
        flt = {"label": f"{BUNDLE_LABEL}=reaper-test"}
        left = {c["Id"] for c in docker_daemon.api.containers(all=True, filters=flt)}
        assert made[0] not in left and made[1] in left  # a live owner's container is kept
    finally:
        for cid in made:
            with contextlib.suppress(Exception):
                docker_daemon.api.remove_container(cid, force=True)


async def test_aclose_removes_every_container(docker_daemon):
    sandbox = DockerSandbox(LIMITS, pool_limits=PoolLimits(min_size=2, max_size=2))
    bundle = _bundle(BENIGN_CODE, tag="aclose")
    await sandbox.prepare(bundle)
    await asyncio.sleep(1.0)
    assert bundle_containers(docker_daemon, bundle.digest)
    info = sandbox.info()
    assert info["backend"] == "docker" and info["started"]
    json.dumps(info)  # health/info answers are plain data
    await sandbox.aclose()
    assert await wait_gone(docker_daemon, bundle.digest) == []


ORPHAN_SCRIPT = '''
import asyncio, os, sys
from crossaudit.kernel.limits import PoolLimits
from sandbox.base import CodeBundle
from sandbox.docker.backend import DockerSandbox

async def main():
    sb = DockerSandbox(pool_limits=PoolLimits(min_size=2, max_size=2))
    await sb.prepare(CodeBundle(sys.argv[1]))
    await asyncio.sleep(1.0)
    print("ready", flush=True)
    os.kill(os.getpid(), 9)  # the orchestrator dies without any cleanup

asyncio.run(main())
'''


async def test_containers_go_away_when_the_orchestrator_is_killed(docker_daemon, repo_root):
    """StdinOnce: the dead orchestrator's attach closes, the agent reads EOF, auto_remove deletes."""
    import subprocess
    import sys

    code = BENIGN_CODE + "\n# orphan\n"
    digest = CodeBundle(code).digest
    proc = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-c", ORPHAN_SCRIPT, code], cwd=repo_root,
        capture_output=True, text=True, timeout=120,
    )
    assert "ready" in proc.stdout, proc.stderr[-2000:]
    assert proc.returncode == -9
    assert await wait_gone(docker_daemon, digest, timeout=60) == []


async def test_cancelled_call_does_not_leak_a_busy_container(docker_daemon):
    sandbox = DockerSandbox(LIMITS, pool_limits=PoolLimits(min_size=1, max_size=1, queue_wait_s=5.0))
    try:
        bundle = _bundle(SLOW_CODE, tag="cancel")
        await sandbox.prepare(bundle)
        task = asyncio.ensure_future(sandbox.run(bundle, "", "", {"sleep": 30}, timeout=ROOM_S))
        await _wait_busy(sandbox, bundle)  # cancelled while it holds the container
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        v, _ = await sandbox.run(bundle, "", "", {}, timeout=ROOM_S)  # a fresh container, not the stuck one
        assert v.score == 1.0
        stats = sandbox.pool_stats(bundle)
        assert stats["busy"] == 0 and stats["replaced"] >= 1
    finally:
        await sandbox.aclose()


async def test_sixteen_concurrent_calls_share_a_small_pool(sb):
    bundle = _bundle(STATE_CODE, tag="concurrent")
    await sb.prepare(bundle)
    results = await asyncio.gather(*(sb.run(bundle, "", str(i), {}, timeout=ROOM_S) for i in range(16)))
    assert len(results) == 16 and all(v.details["calls_seen"] == 1 for v, _ in results)
    stats = sb.pool_stats(bundle)
    assert stats["started"] <= 2 and stats["busy"] == 0  # max_size of the module's pool


async def test_a_channel_the_agent_cannot_reach_falls_back_to_attach(docker_daemon, monkeypatch):
    """As with a daemon that cannot bind our paths (remote, rootless, an orchestrator in a
    container): the agent finds no socket, exits, and the backend switches to attach for good."""
    real = container_mod.open_channel_dir

    def unreachable(uid: int):
        listener, path = real(uid)
        os.unlink(os.path.join(path, CHANNEL_SOCKET))  # still listening, but not where the agent looks
        return listener, path

    monkeypatch.setattr(container_mod, "open_channel_dir", unreachable)
    sb = DockerSandbox(LIMITS, pool_limits=PoolLimits(min_size=1, max_size=1), channel="socket")
    try:
        bundle = _bundle(BENIGN_CODE, tag="fallback")
        v, _ = await sb.run(bundle, "p", "fine", {}, timeout=30)
        assert v.score is not None
        assert sb.info()["socket_channel"] is False
        v, _ = await sb.run(bundle, "p", "again", {}, timeout=ROOM_S)
        assert v.score is not None
    finally:
        await sb.aclose()


async def test_attach_channel_still_serves(docker_daemon):
    sb = DockerSandbox(LIMITS, pool_limits=PoolLimits(min_size=1, max_size=1), channel="attach")
    try:
        bundle = _bundle(STATE_CODE, tag="attach")
        first, _ = await sb.run(bundle, "p", "one", {}, timeout=30)
        second, _ = await sb.run(bundle, "p", "two", {}, timeout=ROOM_S)
        assert first.details["calls_seen"] == second.details["calls_seen"] == 1
        assert sb.info()["socket_channel"] is False
    finally:
        await sb.aclose()
