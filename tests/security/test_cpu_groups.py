"""CPU shares per tenant (sandbox/cpugroups.py): niceness counts processes, so a
tenant running many calls took the CPU from a tenant running one; a control group per tenant
counts tenants. The layout logic runs against a cgroup tree in a temp dir (v1 and v2); the
real kernel's groups are checked with real agents of two tenants where the server may write
them (root here; under CI=true that is required, not skipped)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from crossaudit.kernel.limits import SandboxLimits
from sandbox.base import CodeBundle
from sandbox.cpugroups import CGROUP_ROOT, TenantCpuGroups, docker_parent, group_name, tree_name
from sandbox.docker.container import container_spec
from sandbox.process.backend import ProcessSandbox

pytestmark = pytest.mark.security

CODE = (
    "def evaluate(prompt, response, context):\n"
    "    return {'score': 1.0, 'details': {'cgroup': open('/proc/self/cgroup').read()}}\n"
)


def v1_tree(root: Path) -> Path:
    cpu = root / "cpu"
    cpu.mkdir(parents=True)
    (cpu / "cpu.shares").write_text("1024")
    return cpu


def test_v1_groups_are_weighted_by_share_and_removed_on_close(tmp_path: Path) -> None:
    cpu = v1_tree(tmp_path)
    groups = TenantCpuGroups({"gold": 3.0}, root=tmp_path, own="/")
    assert groups.enabled and groups.version == 1
    gold, plain = groups.group("gold"), groups.group("plain")
    assert gold is not None and plain is not None and gold != plain
    assert gold.parent == cpu / tree_name()
    assert (gold / "cpu.shares").read_text() == "3072" and (plain / "cpu.shares").read_text() == "1024"
    assert groups.place(4242, "gold") and (gold / "cgroup.procs").read_text() == "4242"
    for f in (gold / "cpu.shares", gold / "cgroup.procs", plain / "cpu.shares"):
        f.unlink()  # a real cgroup directory has no files to remove: rmdir is enough
    groups.close()
    assert not (cpu / tree_name()).exists() and not groups.enabled


def test_v2_hands_the_cpu_controller_down(tmp_path: Path) -> None:
    (tmp_path / "cgroup.controllers").write_text("cpuset cpu io memory pids")
    (tmp_path / "cgroup.subtree_control").write_text("")
    tree = tmp_path / tree_name()
    tree.mkdir()
    (tree / "cgroup.subtree_control").write_text("")
    groups = TenantCpuGroups({"half": 0.5}, root=tmp_path, own="/")
    assert groups.version == 2
    assert (tmp_path / "cgroup.subtree_control").read_text() == "+cpu"
    assert (tree / "cgroup.subtree_control").read_text() == "+cpu"
    half = groups.group("half")
    assert half is not None and (half / "cpu.weight").read_text() == "50"


def test_tenant_names_never_become_paths(tmp_path: Path) -> None:
    v1_tree(tmp_path)
    groups = TenantCpuGroups(root=tmp_path, own="/")
    for hostile in ("../../etc", "/abs", "a/b", "\x00", "." * 300):
        path = groups.group(hostile)
        assert path is not None and path.parent == groups.tree and path.name == group_name(hostile)
    assert docker_parent("../x", "cgroupfs") == f"/crossaudit/{group_name('../x')}"
    assert docker_parent("../x", "systemd").endswith(".slice") and "/" not in docker_parent("../x", "systemd")


def test_no_writable_hierarchy_turns_groups_off_with_a_reason(tmp_path: Path) -> None:
    groups = TenantCpuGroups(root=tmp_path / "missing", own="/")
    assert not groups.enabled and "no cpu controller" in groups.reason
    assert groups.group("t") is None and groups.place(1, "t") is False
    assert groups.info()["cgroup"] == "off"


def test_stale_trees_of_dead_servers_are_swept(tmp_path: Path) -> None:
    cpu = v1_tree(tmp_path)
    dead = cpu / tree_name(999_999_999)
    (dead / "t-0000").mkdir(parents=True)
    other_namespace = cpu / "crossaudit-1-999999999"  # a server this pid namespace cannot see
    (other_namespace / "t-0000").mkdir(parents=True)
    TenantCpuGroups(root=tmp_path, own="/")
    assert not dead.exists()
    assert other_namespace.exists()  # a pid seen from here says nothing of it


def test_a_group_removed_under_the_server_is_made_again(tmp_path: Path) -> None:
    v1_tree(tmp_path)
    groups = TenantCpuGroups(root=tmp_path, own="/")
    path = groups.group("t")
    assert path is not None
    (path / "cpu.shares").unlink()
    path.rmdir()  # another server's sweep, or an operator
    assert groups.place(4242, "t") and (path / "cgroup.procs").read_text() == "4242"


def test_docker_containers_go_under_their_tenants_parent() -> None:
    class Api:
        def create_host_config(self, **kw):
            return kw

    spec = container_spec(Api(), "img", SandboxLimits(), {}, {}, cgroup_parent=docker_parent("acme", "cgroupfs"))
    assert spec["host_config"]["cgroup_parent"] == f"/crossaudit/{group_name('acme')}"
    assert container_spec(Api(), "img", SandboxLimits(), {}, {})["host_config"]["cgroup_parent"] is None


def _kernel_groups_writable() -> bool:
    probe = TenantCpuGroups()
    try:
        return probe.enabled
    finally:
        probe.close()


async def test_agents_of_two_tenants_run_in_their_own_weighted_groups() -> None:
    if not _kernel_groups_writable():
        if os.environ.get("CI") == "true":
            pytest.fail("CI=true: the kernel's cpu cgroup hierarchy is not writable here")
        pytest.skip("the cpu cgroup hierarchy is not writable here (needs root)")
    box = ProcessSandbox(SandboxLimits(), restricted=False)
    box.tenant_shares = {"gold": 2.0}
    try:
        seen = {}
        for tenant in ("gold", "plain"):
            verdict, _ = await box.run(CodeBundle(CODE, tenant=tenant), "p", "r", {}, timeout=10.0)
            seen[tenant] = verdict.details["cgroup"]
        assert box.info()["cgroup"].startswith("v")
        for tenant, text in seen.items():
            assert group_name(tenant) in text, text  # the call's own process, as the kernel reports it
        groups = box._cpu_groups
        assert groups is not None and groups.tree is not None
        weight = "cpu.weight" if groups.version == 2 else "cpu.shares"
        gold = int((groups.tree / group_name("gold") / weight).read_text())
        plain = int((groups.tree / group_name("plain") / weight).read_text())
        assert gold == 2 * plain
        tree = groups.tree
    finally:
        await box.aclose()
    assert not tree.exists()  # removed with the sandbox
    assert str(CGROUP_ROOT) in str(tree)


def test_docker_parents_only_where_the_daemon_can_make_them() -> None:
    from sandbox.docker.backend import cgroup_driver

    class Client:
        def __init__(self, info: dict) -> None:
            self._info = info

        def info(self) -> dict:
            return self._info

    assert cgroup_driver(Client({"CgroupDriver": "cgroupfs", "SecurityOptions": ["name=seccomp"]})) == "cgroupfs"
    assert cgroup_driver(Client({"CgroupDriver": "systemd"})) == "systemd"
    assert cgroup_driver(Client({"CgroupDriver": "systemd", "SecurityOptions": ["name=rootless"]})) == ""
    assert cgroup_driver(Client({"CgroupDriver": "none"})) == ""


def test_close_kills_what_is_left_in_a_group_and_removes_it() -> None:
    """What an agent forked may outlive it; at close it is killed and the group removed (before:
    a group still holding a call's process was left behind, busy)."""
    import subprocess

    if not _kernel_groups_writable():
        if os.environ.get("CI") == "true":
            pytest.fail("CI=true: the kernel's cpu cgroup hierarchy is not writable here")
        pytest.skip("the cpu cgroup hierarchy is not writable here (needs root)")
    groups = TenantCpuGroups()
    leftover = subprocess.Popen(["sleep", "60"])
    try:
        assert groups.place(leftover.pid, "t")
        tree = groups.tree
        assert tree is not None
        groups.close()
        assert leftover.wait(timeout=5) == -9
        assert not tree.exists()
    finally:
        leftover.kill()
        leftover.wait()
        groups.close()
