"""``grpc.health.v1.Health`` with all three methods: Check, Watch and List.

grpcio-health-checking's asyncio servicer implements Check and Watch but inherits List from the
generated base class, which raises ``NotImplementedError``: every ``Health/List`` call (grpcurl,
some load balancers, reflection-driven tools) logged an ERROR traceback. List answers here from
the same statuses Check reads.
"""

from __future__ import annotations

from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2

# The protocol lets a server refuse List with RESOURCE_EXHAUSTED when it has too many services;
# this server registers about ten, so the bound only keeps the answer's size fixed.
MAX_HEALTH_LIST_SERVICES = 100


class HealthServicer(health.aio.HealthServicer):
    """The library's servicer plus ``List``: a snapshot of every service's status ("" = the server)."""

    async def List(self, request: health_pb2.HealthListRequest, context: Any) -> health_pb2.HealthListResponse:
        statuses = dict(self._server_status)  # the library's table (what Check answers from)
        if len(statuses) > MAX_HEALTH_LIST_SERVICES:
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED, f"more than {MAX_HEALTH_LIST_SERVICES} services to list"
            )
        return health_pb2.HealthListResponse(
            statuses={name: health_pb2.HealthCheckResponse(status=status) for name, status in statuses.items()}
        )
