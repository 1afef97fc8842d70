"""Run the gRPC server until SIGINT/SIGTERM: in this process, or as the supervisor of
``serve --workers N`` (crossaudit.service.workers); both assemble it with crossaudit.service.assembly."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import signal
from typing import Any

from crossaudit.service.assembly import sandbox_backend, start_line, start_server
from crossaudit.service.config import ServerConfig


async def serve(config: ServerConfig, *, announce: Any = print) -> None:
    """Run until SIGINT/SIGTERM, then shut down gracefully. ``workers`` > 1: this process
    supervises that many server processes on one port (crossaudit.service.workers)."""
    if config.worker_count > 1:
        from crossaudit.service.workers import supervise

        await supervise(config, announce=announce)
        return
    running = await start_server(config)
    # What start-up built (policies, schemas, modules) lives as long as the process: moved out of
    # the collector's generations, a full collection no longer walks it again and again.
    gc.freeze()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    backend = sandbox_backend(running)
    tenants = running.auth.tenants if running.auth else []
    console = running.console.url if running.console is not None else None
    announce(start_line(config, running.port, len(tenants), backend, console, running.metrics_port), flush=True)
    try:
        await stop.wait()
    finally:
        announce("crossaudit shutting down", flush=True)
        await running.stop()
