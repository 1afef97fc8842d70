"""How a client connects: default deadlines, message caps, TLS credentials and the API key."""

from __future__ import annotations

import ipaddress
import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeAlias

import grpc

from crossaudit.kernel.errors import InvalidInputError

SERVER_ENV = "CROSSAUDIT_SERVER"  # where a Client with no target connects
API_KEY_ENV = "CROSSAUDIT_API_KEY"  # the key a Client sends when it is given none
DEFAULT_SERVER = "127.0.0.1:50051"
DEFAULT_CALL_TIMEOUT_S = 30.0  # deadline of calls other than evaluate/upload when none is given
DEFAULT_UPLOAD_TIMEOUT_S = 1_800.0  # an upload may build an image
MAX_MESSAGE_BYTES = 8 * 1024 * 1024
CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
]
ProgressCallback = Callable[[str, float], None]  # (message, fraction 0..1) of an upload
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
