"""The Docker backend's warm pool: :class:`sandbox.pool.WarmPool` over containers.

What is Docker-specific: a worker is a hardened container of the bundle's dependency image
whose agent preloads the declared imports, and its per-call reset empties the tmpfs mounts
(``RESET_PATHS``) and removes SysV IPC objects as well.
"""

from __future__ import annotations

from typing import Any

from crossaudit.kernel.errors import CrossAuditError
from sandbox.base import CodeBundle
from sandbox.docker.container import RESET_PATHS, ContainerRuntime, WarmContainer
from sandbox.pool import WarmPool
from sandbox.protocol import AgentChannel, error_from_frame


class ContainerPool(WarmPool[WarmContainer]):
    """Containers for one bundle (code + dependency image)."""

    def __init__(
        self,
        rt: ContainerRuntime,
        bundle: CodeBundle,
        image: str,
        preload: tuple[str, ...],
        provenance: dict[str, str] | None = None,
    ) -> None:
        super().__init__(rt.pool_limits, bundle)
        self.rt = rt
        self.image = image
        self.preload = preload
        self.provenance = dict(provenance or {})  # the image's id and digests (DepsImage.provenance)

    def stats(self) -> dict[str, Any]:
        return {"image": self.image, **super().stats()}

    def load_frame(self) -> dict[str, Any]:
        return AgentChannel.load_frame(
            self.bundle.code,
            entrypoint=self.bundle.entrypoint,
            preload=self.preload,
            restricted=False,
            limits=self.rt.limits,
            # The container's cgroup pids cap (pids + AGENT_PIDS_HEADROOM) counts its own tasks exactly;
            # RLIMIT_NPROC counts the uid's tasks host-wide, so a uid another container held a moment
            # ago (tasks still exiting) or holds at once would refuse this one's forks and threads.
            rlimit_nproc=False,
            reset={"paths": RESET_PATHS, "ipc": True, "idle": self.rt.idle_reset},
        )

    async def new_worker(self) -> WarmContainer:
        # started from the image id the provenance records (the tag names it; a rebuild could move the tag)
        image = self.provenance.get("image_id") or self.image
        container = WarmContainer(self.rt, image, self.bundle.digest, self.bundle.pool_key, tenant=self.bundle.tenant)
        try:
            frame = await container.start(self.load_frame(), self.limits.start_timeout_s)
        except BaseException:
            await container.destroy()
            raise
        if not frame.get("ok"):
            await container.destroy()
            error: CrossAuditError = error_from_frame(frame)
            raise error
        return container
