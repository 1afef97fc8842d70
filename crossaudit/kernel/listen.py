"""A listening TCP socket for the HTTP servers CrossAudit runs beside gRPC (console, proxy).

Bound here, before uvicorn starts, so that a port in use or an address that is not local is
one clear ConfigurationError at start, and port 0 yields the real port to print.
"""

from __future__ import annotations

import socket

from crossaudit.kernel.errors import ConfigurationError

LISTEN_BACKLOG = 128  # connections the kernel queues before the server accepts them


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
