"""A bare grpc.aio server: the health service and nothing else (no interceptor, no logic).

``python -m tests.bench.bare_grpc`` prints ``bare grpc.aio serving on HOST:PORT`` once it listens
and serves until it is terminated. ``bench_cpu`` measures its CPU per call as the floor a
CrossAudit server's CPU per decision is compared with.
"""

from __future__ import annotations

import asyncio

import grpc
from grpc_health.v1 import health, health_pb2_grpc

READY = "bare grpc.aio serving on "


async def _serve() -> None:
    server = grpc.aio.server()
    health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(f"{READY}127.0.0.1:{port}", flush=True)
    await server.wait_for_termination()


if __name__ == "__main__":
    asyncio.run(_serve())
