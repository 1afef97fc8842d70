"""Where a tenant's webhooks may go: the operator's per-tenant grant, and the SSRF guard.

In the API-keys file, next to the tenant's keys::

    tenants:
      acme:
        keys: [...]
        webhooks:
          allow: ["https://hooks.acme.example", "https://alerts.acme.example:8443"]
          allow_networks: ["10.20.0.0/16"]          # private addresses this tenant may reach
          signing_secret: {env: ACME_WEBHOOK_SECRET}  # or {file: /run/secrets/acme_webhook}

- ``allow``: origins (scheme, host, port); a webhook URL must match one exactly (the port
  defaults by scheme). No entry, no webhooks.
- Every address the host resolves to must be public (globally routable), or inside
  ``allow_networks``: loopback, private, link-local (cloud metadata), shared, multicast and
  reserved ranges are refused otherwise. The request then goes to the address that was checked
  (the connection is pinned to it: a DNS answer that changes between check and connect
  cannot redirect it), with the original host as Host header and TLS server name.
- Redirects are never followed, and the server's proxy settings are not used.

``--dev`` (one local user): any origin and any address; the signing secret is
``CROSSAUDIT_WEBHOOK_SIGNING_SECRET`` of the local environment.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from crossaudit.kernel.errors import ConfigurationError
from crossaudit.orchestrator.secrets import SecretGrant
from crossaudit.service.outbox import signing

WEBHOOKS_KEY = "webhooks"
DEV_SECRET_ENV = "CROSSAUDIT_WEBHOOK_SIGNING_SECRET"
DEFAULT_PORTS = {"http": 80, "https": 443}
MAX_ALLOWED_ORIGINS = 100  # origins one tenant may list
MAX_ALLOWED_NETWORKS = 100

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


class DestinationRefused(Exception):
    """The URL may not be called for this tenant (not allowlisted, or a refused address)."""


@dataclass(frozen=True)
class Origin:
    scheme: str
    host: str  # lower-case, IDNA-encoded; an IPv6 literal without brackets
    port: int

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}"


def origin_of(url: str) -> Origin:
    """The origin of an http(s) URL; ValueError names what is wrong."""
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError as exc:
        raise ValueError(f"not a valid URL ({exc})") from None
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS:
        raise ValueError("the scheme must be http or https")
    if parts.username is not None or parts.password is not None:
        raise ValueError("credentials in a webhook URL are not allowed (use a header with a ${SECRET})")
    host = (parts.hostname or "").rstrip(".")
    if not host:
        raise ValueError("the URL has no host")
    try:
        host = host.encode("idna").decode("ascii").lower() if not _is_ip(host) else str(ipaddress.ip_address(host))
    except UnicodeError:
        raise ValueError("the host is not a valid name") from None
    return Origin(scheme, host, port or DEFAULT_PORTS[scheme])


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def refused_address(ip: IPAddress) -> bool:
    """Not globally routable: loopback, private, link-local, shared (CGNAT), multicast, reserved..."""
    if isinstance(ip, ipaddress.IPv6Address):
        mapped = ip.ipv4_mapped or ip.sixtofour
        if mapped is not None:
            return refused_address(mapped)
    return not ip.is_global or ip.is_multicast


@dataclass(frozen=True)
class WebhookGrant:
    allow: tuple[Origin, ...] = ()
    allow_networks: tuple[IPNetwork, ...] = ()
    signing_secret: SecretGrant | None = None
    development: bool = False  # --dev: any origin, any address, the secret from the environment

    def secret(self) -> str | None:
        """The signing secret now (read at each attempt, so a rotated file applies at once)."""
        if self.development and self.signing_secret is None:
            return SecretGrant("signing_secret", env=DEV_SECRET_ENV).read()
        return self.signing_secret.read() if self.signing_secret is not None else None

    def url_problem(self, url: str) -> str | None:
        """Why ``url`` may not be a webhook of this tenant, judged without DNS (deploy time)."""
        try:
            origin = origin_of(url)
        except ValueError as exc:
            return f"webhook_url {exc}"
        if self.development:
            return None
        if origin not in self.allow:
            listed = ", ".join(str(o) for o in self.allow) or "none"
            return (
                f"webhook_url's origin {origin} is not in this tenant's webhook allowlist (allowed: {listed}); "
                f"the operator grants origins in the API-keys file under tenants.<tenant>.{WEBHOOKS_KEY}.allow"
            )
        if _is_ip(origin.host) and not self._address_allowed(ipaddress.ip_address(origin.host)):
            return (
                f"webhook_url names {origin.host}, a loopback/private/link-local address: the operator must "
                f"list its network under tenants.<tenant>.{WEBHOOKS_KEY}.allow_networks"
            )
        if self.signing_secret is None:
            return (
                "this tenant has no webhook signing secret: the operator grants one in the API-keys file "
                f"under tenants.<tenant>.{WEBHOOKS_KEY}.signing_secret"
            )
        return None

    def _address_allowed(self, ip: IPAddress) -> bool:
        if self.development or not refused_address(ip):
            return True
        return any(ip in net for net in self.allow_networks)

    async def pin(self, url: str) -> tuple[Origin, str]:
        """(origin, the address to connect to): every resolved address checked, the first used."""
        problem = self.url_problem(url)
        if problem:
            raise DestinationRefused(problem)
        origin = origin_of(url)
        if _is_ip(origin.host):
            addresses = [origin.host]
        else:
            loop = asyncio.get_running_loop()
            try:
                infos = await loop.getaddrinfo(origin.host, origin.port, type=socket.SOCK_STREAM)
            except OSError as exc:
                raise OSError(f"cannot resolve {origin.host}: {exc.strerror or exc}") from None
            addresses = list(dict.fromkeys(str(info[4][0]).split("%")[0] for info in infos))
        if not addresses:
            raise OSError(f"{origin.host} has no address")
        refused = [a for a in addresses if not self._address_allowed(ipaddress.ip_address(a))]
        if refused:
            raise DestinationRefused(
                f"{origin.host} resolves to {', '.join(refused)}: loopback, private and link-local addresses are "
                f"refused unless the operator lists their network under {WEBHOOKS_KEY}.allow_networks"
            )
        return origin, addresses[0]


def parse_webhooks(value: Any, where: str, parse_secret: Callable[[Any, str], SecretGrant]) -> WebhookGrant:
    """A tenant's ``webhooks:`` entry of the API-keys file; ``parse_secret`` reads an ``{env|file}``
    grant the way every secret of the file is read (``crossaudit.service.grants``)."""
    if value is None:
        return WebhookGrant()
    if not isinstance(value, dict):
        raise ConfigurationError(f"{where}: {WEBHOOKS_KEY} must be a mapping (allow, allow_networks, signing_secret)")
    unknown = sorted(set(value) - {"allow", "allow_networks", "signing_secret"})
    if unknown:
        raise ConfigurationError(f"{where}: {WEBHOOKS_KEY}: unknown field(s) {unknown}")
    origins: list[Origin] = []
    for url in _strings(value.get("allow"), f"{where}: {WEBHOOKS_KEY}.allow", MAX_ALLOWED_ORIGINS):
        try:
            origin = origin_of(url)
        except ValueError as exc:
            raise ConfigurationError(f"{where}: {WEBHOOKS_KEY}.allow: {url!r}: {exc}") from None
        if urlsplit(url).path not in ("", "/"):
            raise ConfigurationError(f"{where}: {WEBHOOKS_KEY}.allow: {url!r} must be an origin (no path)")
        origins.append(origin)
    networks: list[IPNetwork] = []
    for net in _strings(value.get("allow_networks"), f"{where}: {WEBHOOKS_KEY}.allow_networks", MAX_ALLOWED_NETWORKS):
        try:
            networks.append(ipaddress.ip_network(net, strict=True))
        except ValueError as exc:
            raise ConfigurationError(f"{where}: {WEBHOOKS_KEY}.allow_networks: {exc}") from None
    secret = None
    if value.get("signing_secret") is not None:
        secret = parse_secret(value["signing_secret"], f"{where}: {WEBHOOKS_KEY}")
        if secret.env is not None:  # a file is read at each attempt; an env var can be checked now
            current = secret.read()
            if current is not None and len(signing.secret_key(current)) < signing.MIN_SECRET_BYTES:
                raise ConfigurationError(
                    f"{where}: {WEBHOOKS_KEY}.signing_secret is shorter than {signing.MIN_SECRET_BYTES} bytes"
                )
    return WebhookGrant(tuple(origins), tuple(networks), secret)


def _strings(value: Any, where: str, cap: int) -> Iterable[str]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
        raise ConfigurationError(f"{where} must be a list of strings")
    if len(value) > cap:
        raise ConfigurationError(f"{where}: more than {cap} entries")
    return [v.strip() for v in value]
