"""The review console: a small web UI for reviewers, served by ``crossaudit serve --console-port``
(and by ``crossaudit serve --dev`` unless ``--console-port off``).

Starlette + Jinja2 on uvicorn, in the same asyncio loop as the grpc.aio server (started by
:func:`start_console`, stopped with the server). No JavaScript, no external assets: one static
stylesheet served by the app. Pages and security design: :mod:`crossaudit.console.app`
and docs/review-console.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from crossaudit.governance.records import Records
from crossaudit.kernel.errors import ConfigurationError
from crossaudit.kernel.listen import LOOPBACK_HOSTS, bind_tcp, head_deadline_protocol
from crossaudit.service.auth import Authenticator
from crossaudit.service.config import CONSOLE_OFF, ServerConfig

log = logging.getLogger("crossaudit.console")
START_TIMEOUT_S = 10.0  # uvicorn's startup on a bound socket
STOP_TIMEOUT_S = 5.0  # open connections get this long when the server stops
KEEP_ALIVE_S = 5


def check_console_config(config: ServerConfig) -> None:
    """The console takes API keys in a form: beyond loopback only over TLS."""
    port = config.console_listen_port
    if port is None:
        return
    if not 0 <= port <= 65535:
        raise ConfigurationError(f"invalid --console-port {port}")
    if config.console_host not in LOOPBACK_HOSTS and not (config.tls_cert and config.tls_key):
        raise ConfigurationError(
            f"the console signs in with API keys: serve it on {config.console_host!r} only with "
            "--tls-cert/--tls-key (or keep --console-host on loopback)"
        )


@dataclass
class ConsoleServer:
    host: str
    port: int
    tls: bool
    server: Any  # uvicorn.Server
    task: asyncio.Task[None]
    app: Any  # ConsoleApp

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host and not self.host.startswith("[") else self.host
        return f"{'https' if self.tls else 'http'}://{host}:{self.port}"

    async def stop(self) -> None:
        self.server.should_exit = True
        try:
            await asyncio.wait_for(asyncio.shield(self.task), STOP_TIMEOUT_S + 1)
        except (TimeoutError, asyncio.CancelledError):
            self.task.cancel()
        except Exception:
            log.exception("the console stopped with an error")


def bind_console(config: ServerConfig) -> socket.socket:
    """The console's listening socket (``config.console_listen_port``), refused with one line."""
    check_console_config(config)
    port = config.console_listen_port
    assert port is not None
    try:
        return bind_tcp(config.console_host, port, what="review console")
    except ConfigurationError as e:
        if not config.console_default_port:
            raise
        # --dev chose the port: say how to choose another (one line, as every start-up refusal)
        raise ConfigurationError(
            f"{e.message}; --dev serves the review console on port {port} by default: choose another "
            f"with --console-port PORT (0 = any free port), or turn it off with --console-port {CONSOLE_OFF}"
        ) from None


async def start_console(
    config: ServerConfig,
    records: Records,
    auth: Authenticator,
    rollout: Any = None,
    labels: Any = None,
    sock: socket.socket | None = None,
) -> ConsoleServer:
    """Bind the console's port (or serve ``sock``, already listening: a supervisor's, which keeps
    the port while a worker restarts) and serve it in this loop (returns once it accepts requests)."""
    import uvicorn

    from crossaudit.console.app import ConsoleApp

    check_console_config(config)
    if sock is None:
        sock = bind_console(config)
    port = sock.getsockname()[1]
    tls = bool(config.tls_cert and config.tls_key)
    loopback = config.console_host in LOOPBACK_HOSTS
    app = ConsoleApp(
        records, auth, config.console_limits, tls=tls, loopback_only=loopback, rollout=rollout, labels=labels
    )

    class Server(uvicorn.Server):
        """uvicorn without its signal handlers: ``crossaudit serve`` owns SIGINT/SIGTERM."""

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield

        def install_signal_handlers(self) -> None:  # uvicorn < 0.29
            pass

    limits = config.console_limits
    uv_config = uvicorn.Config(
        app.asgi,
        lifespan="off",
        ws="none",
        log_level="warning",
        access_log=False,
        server_header=False,
        proxy_headers=False,
        # the guard below counts requests in flight and bounds connections per client and in
        # all; uvicorn's limit_concurrency would count idle sockets against requests (503s)
        http=head_deadline_protocol(
            limits.header_timeout_s,
            max_connections=limits.max_connections,
            max_connections_per_client=limits.max_connections_per_client,
            max_requests=limits.max_concurrent_requests,
        ),
        limit_concurrency=None,
        timeout_keep_alive=KEEP_ALIVE_S,
        timeout_graceful_shutdown=int(STOP_TIMEOUT_S),
        ssl_certfile=str(Path(config.tls_cert)) if tls and config.tls_cert else None,
        ssl_keyfile=str(Path(config.tls_key)) if tls and config.tls_key else None,
    )
    server = Server(uv_config)
    task = asyncio.create_task(server.serve(sockets=[sock]), name="review-console")
    loop = asyncio.get_running_loop()
    deadline = loop.time() + START_TIMEOUT_S
    while not server.started:
        if task.done():
            sock.close()
            exc = task.exception()
            raise ConfigurationError(f"the console did not start: {exc or 'it stopped'}")
        if loop.time() > deadline:
            server.should_exit = True
            task.cancel()
            sock.close()
            raise ConfigurationError("the console did not start in time")
        await asyncio.sleep(0.01)
    port = sock.getsockname()[1]
    return ConsoleServer(config.console_host, port, tls, server, task, app)
