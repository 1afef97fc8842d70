"""CPU shares per tenant for sandboxed code: one Linux control group per tenant.

Niceness puts tenant code below the orchestrator, but among tenants it counts processes: a
tenant keeping eight calls busy gets eight times the CPU of a tenant running one. A control group
per tenant counts tenants instead: the scheduler first splits the CPU between the groups by
weight (the tenant's ``share:`` from the API-keys file, default 1), then within a group between
its processes. A tenant running one call beside a flood of another's gets its share at once.

Layout: ``<parent>/crossaudit-<pid namespace>-<pid>/t-<hash of the tenant>``, where ``<parent>``
is the server's own cgroup in the ``cpu`` hierarchy (cgroup v1: ``cpu.shares``; v2:
``cpu.weight``). Every server process has one such tree, removed when it closes; trees of
servers that died are removed at the next start, only those of this pid namespace (a pid seen
from here says nothing of a server in another namespace sharing the cgroup).

Where the hierarchy is not writable (an unprivileged server, a container without a delegated
cgroup; on cgroup v2 also a server whose own cgroup holds processes, which may not hand the cpu
controller down), the groups are off, the reason is in the sandbox's ``info()`` and niceness
alone applies (docs/threat-model.md).

Docker sandboxes get the same split through the daemon: each container is created under a
``cgroup_parent`` of its tenant (:func:`docker_parent`), equal between tenants (``share:`` is not
applied there: the parents are the daemon's, and it sets their weight).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import signal
import time
from collections.abc import Mapping
from pathlib import Path

from sandbox.procfs import pid_exists

log = logging.getLogger("crossaudit.sandbox")

CGROUP_ROOT = Path("/sys/fs/cgroup")
TREE_PREFIX = "crossaudit-"  # + the server's pid namespace and pid
DOCKER_PARENT = "crossaudit"  # docker cgroupfs driver: /crossaudit/t-<hash> under each controller
V1_BASE_SHARES = 1024  # cpu.shares of share 1 (v1: 2..262144)
V2_BASE_WEIGHT = 100  # cpu.weight of share 1 (v2: 1..10000)
MAX_STALE_TREES = 1_000  # stale trees examined at start
CLOSE_WAIT_ROUNDS = 50  # at close, a group's leftover processes are killed and waited for this many times ...
CLOSE_WAIT_STEP_S = 0.02  # ... this long apart (one second in all at most)


def _pid_namespace() -> int:
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def tree_name(pid: int | None = None) -> str:
    return f"{TREE_PREFIX}{_pid_namespace()}-{os.getpid() if pid is None else pid}"


def group_name(tenant: str) -> str:
    """A file name for any tenant string (names may hold anything the API accepts)."""
    return "t-" + hashlib.sha256(tenant.encode()).hexdigest()[:16]


def _own_cgroup(version: int) -> str:
    """This process's cgroup path in the cpu hierarchy ('' when not found)."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return ""
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if version == 2 and parts[0] == "0" and parts[1] == "":
            return parts[2]
        if version == 1 and "cpu" in parts[1].split(","):
            return parts[2]
    return ""


class TenantCpuGroups:
    """The tenant groups of one server process (see the module docstring)."""

    def __init__(
        self, weights: Mapping[str, float] | None = None, *, root: Path = CGROUP_ROOT, own: str | None = None
    ) -> None:
        """``own``: this process's cgroup path (default: read from /proc/self/cgroup)."""
        self.weights: Mapping[str, float] = weights if weights is not None else {}  # read at a group's creation
        self.version = 0
        self.reason = ""
        self.tree: Path | None = None
        self._groups: dict[str, Path] = {}
        self._detect(root, own)

    @property
    def enabled(self) -> bool:
        return self.tree is not None

    def info(self) -> dict[str, object]:
        return {"cgroup": f"v{self.version}" if self.enabled else "off", "cgroup_reason": self.reason}

    def _detect(self, root: Path, own: str | None) -> None:
        candidates: list[tuple[int, Path]] = []
        controllers = root / "cgroup.controllers"
        with contextlib.suppress(OSError):
            if "cpu" in controllers.read_text().split():
                candidates.append((2, root / (own if own is not None else _own_cgroup(2)).lstrip("/")))
        for name in ("cpu", "cpu,cpuacct", "cpuacct,cpu"):
            if (root / name / "cpu.shares").exists():
                candidates.append((1, root / name / (own if own is not None else _own_cgroup(1)).lstrip("/")))
                break
        if not candidates:
            self.reason = "no cpu controller under " + str(root)
            return
        for version, parent in candidates:
            try:
                if version == 2:
                    self._enable_v2(parent)
                _sweep_stale(parent)
                tree = parent / tree_name()
                tree.mkdir(exist_ok=True)
                if version == 2:
                    self._enable_v2(tree)
            except OSError as e:
                self.reason = f"cgroup v{version} at {parent} is not writable here ({e.strerror})"
                continue
            self.version, self.tree, self.reason = version, tree, ""
            return

    @staticmethod
    def _enable_v2(path: Path) -> None:
        """v2 hands the cpu controller down one level at a time."""
        control = path / "cgroup.subtree_control"
        if "cpu" not in control.read_text().split():
            control.write_text("+cpu")

    def _weight_file(self) -> str:
        return "cpu.weight" if self.version == 2 else "cpu.shares"

    def _weight_value(self, tenant: str) -> str:
        share = max(0.01, float(self.weights.get(tenant, 1.0)))
        if self.version == 2:
            return str(min(10_000, max(1, round(V2_BASE_WEIGHT * share))))
        return str(min(262_144, max(2, round(V1_BASE_SHARES * share))))

    def group(self, tenant: str) -> Path | None:
        """The tenant's group, created (with its weight) on first use; None when groups are off."""
        if self.tree is None:
            return None
        path = self._groups.get(tenant)
        if path is None:
            path = self.tree / group_name(tenant)
            try:
                path.mkdir(exist_ok=True)
                (path / self._weight_file()).write_text(self._weight_value(tenant))
            except OSError as e:
                log.warning("cpu group for a tenant could not be created: %s", e.strerror)
                return None
            self._groups[tenant] = path
        return path

    def place(self, pid: int, tenant: str) -> bool:
        """Move ``pid`` into the tenant's group (before it forks anything: children inherit it)."""
        path = self.group(tenant)
        if path is None:
            return False
        try:
            (path / "cgroup.procs").write_text(str(pid))
        except ProcessLookupError:
            return False  # gone already: its start fails on its own
        except FileNotFoundError:  # the group was removed under us: made again, once
            log.warning("a tenant's cpu group was removed by someone else: made again")
            self._groups.pop(tenant, None)
            path = self.group(tenant)
            try:
                if path is not None:
                    (path / "cgroup.procs").write_text(str(pid))
                    return True
            except OSError:
                pass
            return False
        except OSError as e:
            log.warning("a sandbox process could not join its tenant's cpu group: %s", e.strerror)
            return False
        return True

    def close(self) -> None:
        """Remove the groups. The sandbox has killed its agents; what they forked may still be
        exiting, and anything left in a group is tenant code of this server: killed, then the
        group removed once empty (bounded wait; a group still busy is left for the next start's sweep)."""
        if self.tree is None:
            return
        for path in self._groups.values():
            _empty(path)
            with contextlib.suppress(OSError):
                path.rmdir()
        self._groups.clear()
        with contextlib.suppress(OSError):
            self.tree.rmdir()
        self.tree = None
        self.reason = "closed"


def _empty(group: Path) -> None:
    """SIGKILL every process left in ``group`` and wait (bounded) until the kernel lists none."""
    for _ in range(CLOSE_WAIT_ROUNDS):
        try:
            pids = [int(p) for p in (group / "cgroup.procs").read_text().split()]
        except (OSError, ValueError):
            return
        if not pids:
            return
        for pid in pids:
            _kill_if_in(group, pid)
        time.sleep(CLOSE_WAIT_STEP_S)


def _kill_if_in(group: Path, pid: int) -> None:
    """SIGKILL ``pid`` only while it is still in ``group``: a pid file descriptor pins the process,
    so a pid reused by another process after the listing is never signalled."""
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return  # gone already (or no pidfd on this kernel: it is waited for, not killed)
    try:
        if f"/{group.name}" in Path(f"/proc/{pid}/cgroup").read_text():
            signal.pidfd_send_signal(fd, signal.SIGKILL)
    except OSError:
        pass
    finally:
        os.close(fd)


def docker_parent(tenant: str, cgroup_driver: str) -> str:
    """``cgroup_parent`` of a tenant's containers: one parent per tenant, so the daemon's
    scheduler splits CPU between tenants before containers (equal weights by default)."""
    name = group_name(tenant)
    if cgroup_driver == "systemd":
        return f"{DOCKER_PARENT}-{name.replace('-', '_')}.slice"
    return f"/{DOCKER_PARENT}/{name}"


def _sweep_stale(parent: Path) -> None:
    """Remove the (empty) trees of servers of this pid namespace that died."""
    ours = f"{TREE_PREFIX}{_pid_namespace()}-"
    for tree in list(parent.glob(f"{ours}*"))[:MAX_STALE_TREES]:
        pid = tree.name[len(ours) :]
        if not pid.isdigit() or int(pid) == os.getpid() or pid_exists(int(pid)):
            continue
        for group in tree.glob("t-*"):
            with contextlib.suppress(OSError):
                group.rmdir()
        with contextlib.suppress(OSError):
            tree.rmdir()
