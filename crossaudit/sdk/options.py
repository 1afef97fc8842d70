"""How a client connects: default deadlines, message caps, TLS credentials and the API key, and
what a client says when it gets no answer or would send too much."""

from __future__ import annotations

import ipaddress
import json
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TypeAlias

import grpc

from crossaudit.api.limits import DEFAULT_MAX_REQUEST_BYTES, REQUEST_LIMIT_ENV, TRANSPORT_MARGIN_BYTES
from crossaudit.kernel.errors import InvalidInputError, RequestTooLargeError, ServerUnavailableError

SERVER_ENV = "CROSSAUDIT_SERVER"  # where a Client with no target connects
API_KEY_ENV = "CROSSAUDIT_API_KEY"  # the key a Client sends when it is given none
DEFAULT_SERVER = "127.0.0.1:50051"
DEFAULT_CALL_TIMEOUT_S = 30.0  # deadline of calls other than evaluate/upload when none is given
DEFAULT_UPLOAD_TIMEOUT_S = 1_800.0  # an upload may build an image
# The largest answer a client accepts: the server's own cap on answers (limits.max_send_message_bytes).
MAX_ANSWER_BYTES = 8 * 1024 * 1024
CHANNEL_OPTIONS = [("grpc.max_receive_message_length", MAX_ANSWER_BYTES)]
Target: TypeAlias = str | Sequence[str]  # "host:port", "h1:p1,h2:p2", ["h1:p1", "h2:p2"], "dns:///name:port"
MAX_ADDRESSES = 64
# Several replicas: one subchannel per address, calls spread over the ready ones (round_robin);
# a call that failed UNAVAILABLE (its replica went away) is retried on another, at most twice.
BALANCED_SERVICE_CONFIG = {
    "loadBalancingConfig": [{"round_robin": {}}],
    "methodConfig": [{
        "name": [{}],
        "retryPolicy": {
            "maxAttempts": 3,
            "initialBackoff": "0.05s",
            "maxBackoff": "1s",
            "backoffMultiplier": 2,
            "retryableStatusCodes": ["UNAVAILABLE"],
        },
    }],
}
_SCHEMES = ("dns:", "ipv4:", "ipv6:", "unix:", "unix-abstract:", "vsock:")
TlsOption: TypeAlias = bool | grpc.ChannelCredentials | str | os.PathLike[str]


def credentials(tls: TlsOption) -> grpc.ChannelCredentials | None:
    """``tls``: False (plaintext), True (system roots), a CA file path, or ready credentials."""
    if tls is False or tls is None:
        return None
    if tls is True:
        return grpc.ssl_channel_credentials()
    if isinstance(tls, grpc.ChannelCredentials):
        return tls
    try:
        return grpc.ssl_channel_credentials(root_certificates=Path(tls).read_bytes())
    except OSError as e:
        raise InvalidInputError(f"cannot read CA certificate {tls}: {e.strerror}") from None


def request_limit(value: int | None = None) -> int:
    """The request limit a client checks: ``value``, else ``$CROSSAUDIT_LIMITS__MAX_REQUEST_BYTES``
    (the server's variable too, so a shell that raises one raises both), else the default."""
    if value is None:
        text = os.environ.get(REQUEST_LIMIT_ENV, "").strip()
        if not text:
            return DEFAULT_MAX_REQUEST_BYTES
        try:
            value = int(text)
        except ValueError:
            raise InvalidInputError(f"{REQUEST_LIMIT_ENV}={text!r}: a whole number of bytes") from None
        if value < 1:
            raise InvalidInputError(f"{REQUEST_LIMIT_ENV}={text!r}: a positive number of bytes")
        return value
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidInputError(f"max_request_bytes={value!r}: a positive whole number of bytes")
    return value


def send_options(limit: int) -> list[tuple[str, object]]:
    """grpc's own send cap, above the checked limit (the check, not grpc, refuses first)."""
    return [("grpc.max_send_message_length", limit + TRANSPORT_MARGIN_BYTES)]


def request_too_large(size: int, limit: int) -> RequestTooLargeError:
    """The client's refusal of a ``size``-byte request, before anything is sent."""
    return RequestTooLargeError(
        f"the request is {size} bytes, over this client's limit of {limit} bytes "
        f"(max_request_bytes: Client(max_request_bytes=...) or {REQUEST_LIMIT_ENV}; "
        "the server must accept it too: its limits.max_request_bytes)",
        size=size,
        limit=limit,
        setting="max_request_bytes",
    )


_GRPC_PREFIX = re.compile(r"^failed to connect to all addresses; last error: [A-Z_]+: \S+: ")


def unreachable(address: str, details: str) -> ServerUnavailableError:
    """A server that did not answer, in words that say what to check. ``details`` is grpc's text
    (``failed to connect to all addresses; last error: ...: Connection refused``)."""
    low = details.lower()
    start = "Start one with `crossaudit serve --dev`, or give its address with --server or CROSSAUDIT_SERVER"
    if "connection refused" in low:
        why, hint = "nothing listens there (connection refused)", f"is it running? {start}"
    elif "resolv" in low or "domain name not found" in low or "dns" in low:
        why, hint = "the name does not resolve", "check the address given by --server or CROSSAUDIT_SERVER"
    elif "handshake" in low or "ssl" in low or "tls" in low:
        why = "the TLS handshake failed"
        hint = "TLS must be on at both ends or at neither: --tls / --ca-cert (Client(tls=...)) with a --tls-cert server"
    elif "socket closed" in low or "connection reset" in low:
        why = "it closed the connection"
        hint = f"a TLS server (--tls-cert) needs --tls or --ca-cert (Client(tls=...)); else, is it running? {start}"
    elif "timeout" in low or "timed out" in low:
        why, hint = "no connection in time", f"is it running and reachable? {start}"
    else:
        why = _GRPC_PREFIX.sub("", details.strip()) or "no answer"
        hint = f"is it running? {start}"
    return ServerUnavailableError(
        f"cannot reach the CrossAudit server at {address}: {why}; {hint}", address=address
    )


def call_metadata(api_key: str | None) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {api_key}"),) if api_key else ()


def _split_host_port(address: str) -> tuple[str, str]:
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise InvalidInputError(f"invalid server address {address!r}: expected host:port")
    return host, port


def _ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host[1:-1] if host.startswith("[") and host.endswith("]") else host)
    except ValueError:
        return None


def channel_target(target: Target) -> tuple[str, list[tuple[str, object]]]:
    """The gRPC target and channel options for one server or several replicas.

    * one ``host:port`` with an IP address: that address, as before;
    * one DNS name (``name:port`` or ``dns:///name:port``; a headless Service): ``dns:///name:port``,
      balanced ``round_robin`` over every address the name resolves to (re-resolved as replicas come
      and go);
    * several addresses (a list, or ``"h1:p1,h2:p2"``), IP literals or ``localhost``:
      ``ipv4:a:p1,b:p2`` (or ``ipv6:``), balanced ``round_robin``;
    * another explicit gRPC target (``ipv4:…``, ``unix:…``): as given, balanced.

    Balanced channels retry a call that failed ``UNAVAILABLE`` on another replica (twice at most).
    """
    if isinstance(target, str):
        text = target.strip()
        addresses = [a.strip() for a in text.split(",")] if "," in text and not text.startswith(_SCHEMES) else [text]
    else:
        addresses = [str(a).strip() for a in target]
    if not addresses or any(not a for a in addresses):
        raise InvalidInputError(f"invalid server address {target!r}: empty")
    if len(addresses) > MAX_ADDRESSES:
        raise InvalidInputError(f"{len(addresses)} server addresses: at most {MAX_ADDRESSES}")
    options: list[tuple[str, object]] = list(CHANNEL_OPTIONS)
    balanced = [*options, ("grpc.service_config", json.dumps(BALANCED_SERVICE_CONFIG)), ("grpc.enable_retries", 1)]
    if len(addresses) == 1:
        (address,) = addresses
        if address.startswith(_SCHEMES):
            return address, balanced
        host, port = _split_host_port(address)
        if _ip(host) is not None:
            return address, options
        return f"dns:///{host}:{port}", balanced
    hosts = []
    for address in addresses:
        host, port = _split_host_port(address)
        ip = _ip(host) if host != "localhost" else ipaddress.ip_address("127.0.0.1")
        if ip is None:
            raise InvalidInputError(
                f"server address {address!r}: several addresses must be IP addresses; for names, give one DNS "
                "name that resolves to every replica (e.g. a headless Service: dns:///name:port)"
            )
        hosts.append((ip, port))
    versions = {ip.version for ip, _ in hosts}
    if len(versions) > 1:
        raise InvalidInputError(f"server addresses {addresses!r}: all IPv4 or all IPv6, not both")
    if versions == {4}:
        return "ipv4:" + ",".join(f"{ip}:{port}" for ip, port in hosts), balanced
    return "ipv6:" + ",".join(f"[{ip}]:{port}" for ip, port in hosts), balanced
