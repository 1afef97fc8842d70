"""A spare warm sandbox (``PoolLimits.spare_size``): the next call goes to a clean, ready worker
while the last one resets, and isolation stays exactly as strong.

Sequential calls on one pool alternate between its workers, so each worker serves a call right
after another worker's call and again after its own reset: every call plants leftovers
(files, IPC, environment, a daemon, a thread) and every call must see none of any earlier one.
The number of warm workers never exceeds ``max_size``, and a worker whose reset fails is
destroyed and never serves again.
"""

from __future__ import annotations

import asyncio
import collections

import pytest
import pytest_asyncio

from crossaudit.kernel.limits import PoolLimits
from sandbox.base import CodeBundle
from sandbox.docker.backend import DockerSandbox
from sandbox.docker.container import POOL_LABEL
from sandbox.process.backend import ProcessSandbox
from sandbox.procfs import alive as _alive
from tests.integration._docker import bundle_containers
from tests.security.test_sandbox_isolation import CALL_TIMEOUT, CLEAN, LEAKY, LIMITS, PROC_LEAKY, PROC_LIMITS

pytestmark = [pytest.mark.security]
IN_MODULE_LOOP = pytest.mark.asyncio(loop_scope="module")

SPARE_POOL = PoolLimits(min_size=1, max_size=2, spare_size=1, queue_wait_s=10.0)
CALLS = 6
READY_POLLS = 600  # x 0.05 s: the spare's start (a container start and load) off the request path


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def dsb(docker_daemon):
    sandbox = DockerSandbox(LIMITS, pool_limits=SPARE_POOL)
    yield sandbox
    await sandbox.aclose()


async def _with_spare(stats, bundle: CodeBundle) -> None:
    """Wait (bounded) until the pool holds two ready workers: the one in use and its spare."""
    for _ in range(READY_POLLS):
        s = stats(bundle)
        if s and s["idle"] == 2 and not s["starting"] and not s["settling"]:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"the spare never became ready: {stats(bundle)}")


def _pool_containers(client, bundle: CodeBundle) -> list[dict]:
    return [c for c in bundle_containers(client, bundle.digest) if c["Labels"].get(POOL_LABEL) == bundle.pool_key[:32]]


@pytest.mark.docker
@IN_MODULE_LOOP
async def test_alternating_containers_carry_nothing_from_any_earlier_call(dsb, docker_daemon):
    bundle = CodeBundle(LEAKY, tenant="spare-leaky")
    await dsb.prepare(bundle)
    try:
        await dsb.run(bundle, "warm-up", "", {}, timeout=CALL_TIMEOUT)  # a call in use: the spare starts
        await _with_spare(dsb.pool_stats, bundle)
        uids = []
        for i in range(CALLS):  # back to back: each call plants, the next one (same pool, at once) looks
            verdict, _ = await dsb.run(bundle, f"marker-of-caller-{i}", "", {"plant": True}, timeout=CALL_TIMEOUT)
            assert verdict.details["seen"] == CLEAN, (i, verdict.details["seen"])
            uids.append(verdict.details["uid"])  # one uid per container
            assert len(_pool_containers(docker_daemon, bundle)) <= SPARE_POOL.max_size
        # Both containers served calls right after the other's and again after their own reset.
        assert len(set(uids)) == 2 and min(collections.Counter(uids).values()) >= 2, uids
        stats = dsb.pool_stats(bundle)
        assert stats["cleanup_failures"] == 0 and stats["replaced"] == 0
        assert stats["idle"] + stats["busy"] + stats["starting"] <= SPARE_POOL.max_size
    finally:
        await dsb.evict(bundle)


@pytest.mark.docker
@IN_MODULE_LOOP
async def test_a_container_whose_reset_fails_never_serves_again(dsb, docker_daemon):
    """A process the agent cannot kill (root, started from outside) fails that container's reset."""
    bundle = CodeBundle(LEAKY, tenant="spare-unkillable")
    await dsb.prepare(bundle)
    try:
        await dsb.run(bundle, "warm-up", "", {}, timeout=CALL_TIMEOUT)
        await _with_spare(dsb.pool_stats, bundle)
        both = _pool_containers(docker_daemon, bundle)
        assert len(both) == 2
        probe, _ = await dsb.run(bundle, "probe", "", {}, timeout=CALL_TIMEOUT)  # the oldest idle one
        await _with_spare(dsb.pool_stats, bundle)
        # Plant the unkillable process in the container that will serve next (not the one just used).
        next_id = next(c["Id"] for c in both if _uid_of(docker_daemon, c["Id"]) != probe.details["uid"])
        exe = docker_daemon.api.exec_create(next_id, ["python3", "-c", "import time; time.sleep(60)"], user="0")
        docker_daemon.api.exec_start(exe["Id"], detach=True)
        first, _ = await dsb.run(bundle, "p", "", {"plant": True}, timeout=CALL_TIMEOUT)  # answered, then reset fails
        assert first.details["uid"] == _uid_of(docker_daemon, next_id)
        later = []
        for i in range(4):
            verdict, _ = await dsb.run(bundle, f"after-{i}", "", {}, timeout=CALL_TIMEOUT + LIMITS.cleanup_s)
            assert verdict.details["seen"] == CLEAN
            later.append(verdict.details["uid"])
        assert first.details["uid"] not in later, later  # the unclean container never served again
        for _ in range(READY_POLLS):
            stats = dsb.pool_stats(bundle)
            if stats["cleanup_failures"]:
                break
            await asyncio.sleep(0.05)
        assert stats["cleanup_failures"] == 1 and stats["replaced"] >= 1
        assert next_id not in {c["Id"] for c in _pool_containers(docker_daemon, bundle)}
    finally:
        await dsb.evict(bundle)


def _uid_of(client, cid: str) -> int:
    user = client.api.inspect_container(cid)["Config"]["User"]
    return int(user.split(":")[0])


# --------------------------------------------------------------------------- process backend


async def test_process_agents_alternate_and_carry_nothing_between_calls():
    box = ProcessSandbox(PROC_LIMITS, restricted=False, pool_limits=SPARE_POOL)
    bundle = CodeBundle(PROC_LEAKY, tenant="proc-spare")
    pool_stats = lambda b: box._pools.get(b.pool_key).stats()  # noqa: E731 - the backend has no pool_stats
    try:
        await box.prepare(bundle)
        assert box.info()["agents"] == 1  # at rest: min_size, which is the spare itself
        await box.run(bundle, "warm-up", "", {}, timeout=CALL_TIMEOUT)
        await _with_spare(pool_stats, bundle)
        agents, daemons = [], []
        for i in range(CALLS):
            verdict, _ = await box.run(bundle, f"marker-{i}", "", {"plant": True}, timeout=CALL_TIMEOUT)
            seen = verdict.details["seen"]
            assert seen == {"cwd": [], "tmpdir": [], "env": None, "agent": seen["agent"]}, (i, seen)
            agents.append(seen["agent"])
            daemons.append(verdict.details["daemon"])
            assert box.info()["agents"] <= SPARE_POOL.max_size  # live agent processes, spare included
        assert len(set(agents)) == 2 and min(collections.Counter(agents).values()) >= 2, agents
        await _with_spare(pool_stats, bundle)  # every reset reported
        assert all(d > 0 and not _alive(d) for d in daemons)
        assert pool_stats(bundle)["cleanup_failures"] == 0
    finally:
        await box.aclose()


async def test_without_a_spare_a_pool_of_one_stays_one():
    """``spare_size=0`` keeps the old sizing: sequential calls on one worker, each after its reset."""
    box = ProcessSandbox(PROC_LIMITS, restricted=False, pool_limits=PoolLimits(min_size=1, max_size=1, spare_size=0))
    bundle = CodeBundle(PROC_LEAKY, tenant="proc-no-spare")
    try:
        agents = set()
        for i in range(3):
            verdict, _ = await box.run(bundle, f"m{i}", "", {"plant": True}, timeout=CALL_TIMEOUT)
            assert verdict.details["seen"]["cwd"] == []
            agents.add(verdict.details["seen"]["agent"])
        assert len(agents) == 1 and box.info()["agents"] == 1
        assert box._pools.get(bundle.pool_key).stats()["reset_waits"] >= 1  # it did wait for its own reset
    finally:
        await box.aclose()


# --------------------------------------------------------------------------- idle-priority reset

PRIORITY = """
import os

def _policy(pid):
    with open(f"/proc/{pid}/stat") as fh:
        return int(fh.read().rsplit(")", 1)[1].split()[38])  # field 41: the scheduling policy

def evaluate(prompt, response, context):
    try:
        os.setpriority(os.PRIO_PROCESS, 0, -1)
        below_zero = True
    except OSError:
        below_zero = False
    return {"score": 1.0, "details": {"policy": os.sched_getscheduler(0), "nice": os.getpriority(os.PRIO_PROCESS, 0),
                                      "parent_policy": _policy(int(context.get("parent") or os.getppid())),
                                      "below_zero": below_zero}}
"""


@pytest.mark.docker
@IN_MODULE_LOOP
async def test_calls_run_at_normal_priority_after_an_idle_reset(dsb):
    """The reset and the fork run at SCHED_IDLE; the call's own process, and the warm parent while
    a call runs, are back at SCHED_OTHER, and nothing can take a niceness below 0."""
    bundle = CodeBundle(PRIORITY, tenant="spare-priority")
    await dsb.prepare(bundle)
    try:
        for _ in range(3):  # the first child was forked after the load, the others after a reset
            verdict, _ = await dsb.run(bundle, "", "", {"parent": 1}, timeout=CALL_TIMEOUT)
            assert verdict.details == {"policy": 0, "nice": 0, "parent_policy": 0, "below_zero": False}
    finally:
        await dsb.evict(bundle)


async def test_process_calls_run_at_the_agents_priority_after_a_reset():
    box = ProcessSandbox(PROC_LIMITS, restricted=False, pool_limits=SPARE_POOL)
    bundle = CodeBundle(PRIORITY, tenant="proc-priority")
    try:
        for _ in range(3):
            verdict, _ = await box.run(bundle, "", "", {}, timeout=CALL_TIMEOUT)
            assert verdict.details["policy"] == 0 and verdict.details["parent_policy"] == 0
            assert verdict.details["nice"] == PROC_LIMITS.nice and verdict.details["below_zero"] is False
    finally:
        await box.aclose()
