"""The hardened settings every CrossAudit container runs with: sandbox containers (untrusted code,
:func:`sandbox.docker.container.container_spec`) and model-server containers (model libraries
parsing untrusted text, :func:`crossaudit.modelserver.containers.run`) alike.

:meth:`Hardening.settings` gives them as keyword arguments that docker-py takes both in
``APIClient.create_host_config`` and in ``containers.run``: no network, a read-only root
filesystem, writable scratch only on size-capped ``noexec`` tmpfs, no capabilities, no privilege
gain, memory without extra swap, a pids cap. Each user adds what is its own on top (the sandbox:
ulimits, CPU, IPC caps, ...); none of these may be dropped or loosened by one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

TMPFS_OPTIONS = "rw,noexec,nosuid,nodev"  # every scratch tmpfs: no executables, setuid or devices


def scratch_tmpfs(size_bytes: int, inodes: int | None = None) -> str:
    """A scratch tmpfs's mount options: ``size`` (and ``nr_inodes``) capped, world-writable sticky."""
    caps = f",size={int(size_bytes)}" + (f",nr_inodes={int(inodes)}" if inodes is not None else "")
    return f"{TMPFS_OPTIONS}{caps},mode=1777"


@dataclass(frozen=True)
class Hardening:
    """One container's caps. ``scratch_dirs``: its only writable filesystems, each a tmpfs of
    ``tmpfs_bytes`` (and ``tmpfs_inodes`` inodes, when given)."""

    memory_bytes: int
    pids: int
    tmpfs_bytes: int
    scratch_dirs: tuple[str, ...] = ("/tmp",)
    tmpfs_inodes: int | None = None

    def settings(self) -> dict[str, Any]:
        """The hardened settings as docker-py keyword arguments (host configuration)."""
        mem = int(self.memory_bytes)
        return {
            "network_mode": "none",  # no interface but loopback
            "read_only": True,  # root filesystem read-only (site-packages, app, /etc)
            "tmpfs": dict.fromkeys(self.scratch_dirs, scratch_tmpfs(self.tmpfs_bytes, self.tmpfs_inodes)),
            "cap_drop": ["ALL"],
            "security_opt": ["no-new-privileges"],
            "mem_limit": mem,
            "memswap_limit": mem,  # memory == memory+swap: no extra swap
            "pids_limit": int(self.pids),
        }
