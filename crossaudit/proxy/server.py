"""Serve the guard proxy on uvicorn: check CrossAudit (reachable, every caller's key accepted; a
proxy that would answer every call with an error does not start), bind, print the start line once
requests are accepted, run until SIGINT/SIGTERM, then let open requests finish and exit 0 (a stop
asked for is not a failure)."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from collections.abc import Iterator
from urllib.parse import urlsplit

from crossaudit.kernel.errors import ConfigurationError
from crossaudit.kernel.listen import bind_tcp, head_deadline_protocol
from crossaudit.proxy.app import ProxyApp
from crossaudit.proxy.config import ProxyConfig
from crossaudit.sdk.options import DEFAULT_SERVER

STOP_TIMEOUT_S = 10  # open requests get this long when the proxy stops


def _shown(url: str) -> str:
    """The upstream URL without credentials a user may have put in it."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{host}{port}{parts.path}"


async def serve(config: ProxyConfig) -> None:
    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn stopping on SIGINT/SIGTERM without re-raising the signal when done."""

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, self.handle_exit, sig, None)
            try:
                yield
            finally:
                for sig in (signal.SIGINT, signal.SIGTERM):
                    loop.remove_signal_handler(sig)

    app = ProxyApp(config)
    try:
        await app.guard.check_connection()
    except BaseException:
        await app.guard.aclose()
        raise
    sock = bind_tcp(config.host, config.port, what="proxy")
    tls = bool(config.tls_cert and config.tls_key)
    uv = Server(
        uvicorn.Config(
            app.asgi,
            lifespan="on",
            http=head_deadline_protocol(config.limits.header_timeout_s),
            ws="none",
            log_level="warning",
            access_log=False,
            server_header=False,
            proxy_headers=False,
            limit_concurrency=config.limits.max_concurrent_requests,
            timeout_keep_alive=int(max(1, config.limits.keep_alive_s)),
            timeout_graceful_shutdown=STOP_TIMEOUT_S,
            ssl_certfile=config.tls_cert if tls else None,
            ssl_keyfile=config.tls_key if tls else None,
        )
    )
    task = asyncio.create_task(uv.serve(sockets=[sock]))
    while not uv.started and not task.done():
        await asyncio.sleep(0.02)
    if uv.started:
        host, port = sock.getsockname()[:2]
        shown = f"[{host}]" if ":" in host else host
        anthropic = f", anthropic {_shown(config.anthropic_url)}" if config.anthropic_url else ""
        mode = "dev (no caller keys)" if config.dev else f"{len(config.callers_list())} caller(s)"
        print(
            f"crossaudit proxy on {'https' if tls else 'http'}://{shown}:{port}/v1, upstream "
            f"{_shown(config.upstream_url)}{anthropic}, CrossAudit {config.server or DEFAULT_SERVER} "
            f"({config.environment}), {mode}, on_block={config.on_block}, "
            f"{'fail-open' if config.fail_open else 'fail-closed'}",
            flush=True,
        )
    await task
    if not uv.started:
        sys.stderr.flush()
        raise ConfigurationError("the proxy did not start")
