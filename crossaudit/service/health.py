"""``grpc.health.v1.Health`` with all three methods (Check, Watch, List), following the store.

grpcio-health-checking's asyncio servicer implements Check and Watch but inherits List from the
generated base class, which raises ``NotImplementedError``: every ``Health/List`` call (grpcurl,
some load balancers, reflection-driven tools) logged an ERROR traceback. List answers here from
the same statuses Check reads.

Every call needs the store (a decision is in the audit log before it is answered), so
:class:`StoreHealth` turns the server's statuses NOT_SERVING while the store is unreachable and
SERVING again when it answers. :data:`LIVENESS_SERVICE` is left alone: a restart cannot bring a
database back, so a liveness probe must not follow it (it would turn an outage into a crash loop).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2

from crossaudit.kernel.errors import CrossAuditError
from crossaudit.store.base import Store

log = logging.getLogger("crossaudit.service")

# The protocol lets a server refuse List with RESOURCE_EXHAUSTED when it has too many services;
# this server registers about ten, so the bound only keeps the answer's size fixed.
MAX_HEALTH_LIST_SERVICES = 100
# SERVING from start to shutdown whatever the store does: what liveness probes check.
LIVENESS_SERVICE = "liveness"

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class HealthServicer(health.aio.HealthServicer):
    """The library's servicer plus ``List``: a snapshot of every service's status ("" = the server).

    The server starts NOT_SERVING (the library starts it SERVING): it serves once start-up is done."""

    def __init__(self) -> None:
        super().__init__()
        self._server_status[""] = NOT_SERVING

    async def List(self, request: health_pb2.HealthListRequest, context: Any) -> health_pb2.HealthListResponse:
        statuses = dict(self._server_status)  # the library's table (what Check answers from)
        if len(statuses) > MAX_HEALTH_LIST_SERVICES:
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED, f"more than {MAX_HEALTH_LIST_SERVICES} services to list"
            )
        return health_pb2.HealthListResponse(
            statuses={name: health_pb2.HealthCheckResponse(status=status) for name, status in statuses.items()}
        )


class StoreHealth:
    """Checks the store every ``interval_s`` (each check bounded by ``timeout_s``) and sets
    ``names`` NOT_SERVING on the first failure, SERVING on the first success after it. Transitions
    are logged once each, as one line (never a traceback)."""

    def __init__(
        self, health: HealthServicer, store: Store, names: Sequence[str], *, interval_s: float, timeout_s: float
    ) -> None:
        self.health = health
        self.store = store
        self.names = list(names)
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.serving = True  # what start-up set
        self.down_since: float | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._watch(), name="crossaudit-store-health")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            await self.check_once()

    async def check_once(self) -> bool:
        """One check; returns whether the store answered."""
        try:
            await self.store.check(self.timeout_s)
        except CrossAuditError as exc:
            await self._set(False, str(exc))
            return False
        except Exception as exc:  # an untyped failure still means "no store": keep serving health
            await self._set(False, f"{type(exc).__name__}: {exc}")
            return False
        await self._set(True, "")
        return True

    async def _set(self, ok: bool, reason: str) -> None:
        if ok == self.serving:
            return
        self.serving = ok
        if ok:
            down = time.monotonic() - self.down_since if self.down_since is not None else 0.0
            self.down_since = None
            log.warning("the store answers again after %.1f s: health SERVING", down)
        else:
            self.down_since = time.monotonic()
            log.warning("the store is unreachable (%s): health NOT_SERVING until it answers", reason)
        for name in self.names:
            await self.health.set(name, SERVING if ok else NOT_SERVING)
