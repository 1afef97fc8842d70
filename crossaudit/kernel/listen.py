"""Listening for the HTTP servers CrossAudit runs beside gRPC (console, proxy): the socket, and
the one connection guard both put in front of uvicorn.

The socket is bound here, before uvicorn starts, so that a port in use or an address that is not
local is one clear ConfigurationError at start, and port 0 yields the real port to print.

uvicorn alone keeps a connection open for as long as its client likes until the first request
head arrives, and counts every open connection against ``limit_concurrency``: a few dozen
sockets that never send a byte answer everyone else 503. :func:`head_deadline_protocol` closes a
connection whose request head is late and, where a server asks for it, bounds connections per
client address and in all (an idle one is closed to make room, never a request under way) and
counts requests in flight rather than sockets.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from crossaudit.kernel.errors import ConfigurationError

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "::1", "localhost", "[::1]"})  # where a plain-text listener may bind
LISTEN_BACKLOG = 128  # connections the kernel queues before the server accepts them
# An IPv6 client is counted by its /64: one host or one customer is routinely given a whole
# /64, so a per-address cap would not bind it at all.
IPV6_CLIENT_PREFIX = 64


def bind_tcp(host: str, port: int, *, what: str) -> socket.socket:
    """A non-blocking socket listening on ``host:port``; ``what`` names the server in errors."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host.strip("[]"), port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        sock = socket.socket(family, kind, proto)
    except OSError as e:
        raise ConfigurationError(f"cannot serve the {what} on {host}:{port}: {e.strerror or e}") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(LISTEN_BACKLOG)
    except OSError as e:
        sock.close()
        raise ConfigurationError(
            f"cannot serve the {what} on {host}:{port} (in use, or not a local address): {e.strerror or e}"
        ) from None
    sock.setblocking(False)
    return sock


def client_key(host: str | None) -> str:
    """What per-client limits count by: an IPv4 address (IPv4-mapped IPv6 too), an IPv6
    address's /64; anything else (a unix socket, no address) as given."""
    if not host:
        return "?"
    try:
        ip = ipaddress.ip_address(host.strip("[]").split("%", 1)[0])
    except ValueError:
        return host
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, IPV6_CLIENT_PREFIX), strict=False))
    return str(ip)


Receive = Callable[[], Awaitable[Any]]
Send = Callable[[Any], Awaitable[None]]
ASGIApp = Callable[[MutableMapping[str, Any], Receive, Send], Awaitable[None]]


def _busy_app(max_requests: int) -> ASGIApp:
    body = f"busy: more than {max_requests} requests at once; try again in a moment\n".encode()

    async def busy(scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": 503,
                "headers": [
                    (b"content-type", b"text/plain; charset=utf-8"),
                    (b"content-length", str(len(body)).encode()),
                    (b"retry-after", b"1"),
                    (b"cache-control", b"no-store"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})

    return busy


# Long: a class factory: the protocol class closes over this server's caps and connection table,
# so it is defined here, whole; its methods are each short.
def head_deadline_protocol(
    header_timeout_s: float,
    *,
    max_connections: int | None = None,
    max_connections_per_client: int | None = None,
    max_requests: int | None = None,
) -> type:
    """uvicorn's h11 protocol, closing a connection whose request head (request line and
    headers) has not arrived within ``header_timeout_s`` of its start or of the previous answer.

    Why: uvicorn counts open connections against ``limit_concurrency`` and times out only idle
    keep-alive connections; a connection that sends nothing, or a header a byte at a time, is
    never closed, so that many such connections would answer every other caller 503 for as
    long as they stay open.

    Optional, for a server that passes ``limit_concurrency=None`` to uvicorn:
    ``max_connections_per_client``: open connections of one :func:`client_key`; a new one first
    closes that client's own oldest connection still waiting for a request head, else it is
    closed at once. ``max_connections``: open connections in all; a new one closes the oldest
    waiting connection of the client holding the most, else it is closed at once (a request
    under way is never cut). ``max_requests``: requests in flight; more are answered 503 — so
    idle sockets, however many, no longer count against what requests may use."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    by_client: dict[str, dict[Any, None]] = {}  # client key -> its connections, oldest first
    in_flight = [0]  # requests under way (a list: shared by every connection of this server)
    counted = [0]  # connections in by_client

    def forget(conn: Any) -> None:
        mine = by_client.get(conn._client_key)
        if mine is not None and conn in mine:
            del mine[conn]
            counted[0] -= 1
            if not mine:
                del by_client[conn._client_key]

    def waiting(conns: dict[Any, None]) -> Any:
        """The oldest of ``conns`` still waiting for a request head (None: all are serving one)."""
        return next((c for c in conns if c._head_timer is not None), None)

    def limited(app: ASGIApp, limit: int) -> ASGIApp:
        busy = _busy_app(limit)

        async def guarded(scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
            if scope.get("type") != "http" or in_flight[0] >= limit:
                await (busy if scope.get("type") == "http" else app)(scope, receive, send)
                return
            in_flight[0] += 1
            try:
                await app(scope, receive, send)
            finally:
                in_flight[0] -= 1

        return guarded

    class HeadDeadlineH11(H11Protocol):
        _head_timer: asyncio.TimerHandle | None = None
        _client_key: str = ""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            if max_requests is not None:
                self.app = limited(self.app, max_requests)

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()
            if max_connections is None and max_connections_per_client is None:
                return
            self._client_key = client_key(self.client[0] if self.client else None)
            if not self._make_room():
                self._drop()
                return
            by_client.setdefault(self._client_key, {})[self] = None
            counted[0] += 1

        def _make_room(self) -> bool:
            """Room for this new connection, closing an idle one where a cap is reached."""
            mine = by_client.get(self._client_key, {})
            if max_connections_per_client is not None and len(mine) >= max_connections_per_client:
                victim = waiting(mine)
                if victim is None:
                    return False
                victim._drop()
            if max_connections is not None and counted[0] >= max_connections:
                victim = waiting(max(by_client.values(), key=len)) if by_client else None
                if victim is None:  # the biggest client is all requests: any idle connection
                    victim = next((v for conns in by_client.values() if (v := waiting(conns))), None)
                if victim is None:
                    return False
                victim._drop()
            return True

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            forget(self)
            super().connection_lost(exc)

        def handle_events(self) -> None:
            cycle = self.cycle
            super().handle_events()
            if self.cycle is not cycle:  # a whole request head arrived: its request is under way
                self._disarm()

        def on_response_complete(self) -> None:
            self._arm()  # before: the next (pipelined) request may start in there
            super().on_response_complete()

        def _arm(self) -> None:
            self._disarm()
            self._head_timer = self.loop.call_later(header_timeout_s, self._head_late)

        def _disarm(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _head_late(self) -> None:
            self._head_timer = None
            self._drop()

        def _drop(self) -> None:
            """Close this connection now and stop counting it (connection_lost comes later)."""
            self._disarm()
            forget(self)
            if not self.transport.is_closing():
                self.transport.close()

    return HeadDeadlineH11
