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
- Every address the host resolves to must be an ordinary global unicast address, or inside
  ``allow_networks`` (:func:`address_refusal`). The table is the IANA IPv4 and IPv6
  Special-Purpose Address Registries (:data:`SPECIAL_PURPOSE`), plus the deprecated forms
  they no longer list: an IPv6 address that carries an IPv4 one (IPv4-mapped, -compatible,
  SIIT, NAT64, 6to4, Teredo) is judged by the IPv4 it carries as well, since on an IPv6-only
  network with NAT64 ``64:ff9b::10.0.0.1`` *is* 10.0.0.1. Python's ``ipaddress.is_global`` is
  only a backstop: on 3.11 it calls ``::10.0.0.1``, ``64:ff9b::10.0.0.1``, ``fec0::1`` and
  ``192.0.0.8`` global. The request then goes to the address that was checked
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
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from crossaudit.kernel.errors import ConfigurationError
from crossaudit.outbox import signing
from orchestrator.secrets import SecretGrant

WEBHOOKS_KEY = "webhooks"
DEV_SECRET_ENV = "CROSSAUDIT_WEBHOOK_SIGNING_SECRET"
DEFAULT_PORTS = {"http": 80, "https": 443}
MAX_ALLOWED_ORIGINS = 100  # origins one tenant may list
MAX_ALLOWED_NETWORKS = 100

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


class DestinationRefused(Exception):
    """The URL may not be called for this tenant (not allowlisted, or a refused address)."""

    # Internal only, not in crossaudit.kernel.errors: the webhook sender turns it into a
    # permanent failed attempt of the outbox row; it never crosses the gRPC edge.


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


@dataclass(frozen=True)
class Special:
    """One special-purpose block: its registry name and RFC, and the registry's "Globally
    Reachable" value (None where the registry says N/A). ``carries_ipv4``: the block embeds an
    IPv4 address that decides where a packet really goes."""

    network: IPNetwork
    name: str
    rfc: str
    globally_reachable: bool | None
    carries_ipv4: bool = False


def _special(block: str, name: str, rfc: str, reachable: bool | None, carries_ipv4: bool = False) -> Special:
    return Special(ipaddress.ip_network(block), name, rfc, reachable, carries_ipv4)


# The IANA IPv4 and IPv6 Special-Purpose Address Registries (RFC 6890, RFC 8190), as of their
# 2025 revisions, then what they do not list: multicast (its own registries) and the deprecated
# IPv6 forms. A webhook receiver is an ordinary global unicast host, so every entry is refused,
# the globally reachable ones too (anycast PCP/TURN/DNS-SD servers, AMT relays, AS112 sinks and
# ORCHID/DET identifiers are infrastructure, served by the nearest, often the local, instance),
# except the blocks that carry an IPv4 address and are not "False" in the registry (NAT64's
# 64:ff9b::/96, 6to4, Teredo): those are judged by the IPv4 they carry. An operator who needs
# one of them lists its network under allow_networks.
SPECIAL_PURPOSE: tuple[Special, ...] = (
    # IANA IPv4 Special-Purpose Address Registry
    _special("0.0.0.0/8", '"This network"', "RFC 791, Section 3.2", False),
    _special("0.0.0.0/32", '"This host on this network"', "RFC 1122, Section 3.2.1.3", False),
    _special("10.0.0.0/8", "Private-Use", "RFC 1918", False),
    _special("100.64.0.0/10", "Shared Address Space", "RFC 6598", False),
    _special("127.0.0.0/8", "Loopback", "RFC 1122, Section 3.2.1.3", False),
    _special("169.254.0.0/16", "Link Local", "RFC 3927", False),
    _special("172.16.0.0/12", "Private-Use", "RFC 1918", False),
    _special("192.0.0.0/24", "IETF Protocol Assignments", "RFC 6890, Section 2.1", False),
    _special("192.0.0.0/29", "IPv4 Service Continuity Prefix", "RFC 7335", False),
    _special("192.0.0.8/32", "IPv4 dummy address", "RFC 7600", False),
    _special("192.0.0.9/32", "Port Control Protocol Anycast", "RFC 7723", True),
    _special("192.0.0.10/32", "Traversal Using Relays around NAT Anycast", "RFC 8155", True),
    _special("192.0.0.170/32", "NAT64/DNS64 Discovery", "RFC 8880, RFC 7050 Section 2.2", False),
    _special("192.0.0.171/32", "NAT64/DNS64 Discovery", "RFC 8880, RFC 7050 Section 2.2", False),
    _special("192.0.2.0/24", "Documentation (TEST-NET-1)", "RFC 5737", False),
    _special("192.31.196.0/24", "AS112-v4", "RFC 7535", True),
    _special("192.52.193.0/24", "AMT", "RFC 7450", True),
    _special("192.88.99.0/24", "Deprecated (6to4 Relay Anycast)", "RFC 7526", None),
    _special("192.88.99.2/32", "6a44-relay anycast address", "RFC 6751", False),
    _special("192.168.0.0/16", "Private-Use", "RFC 1918", False),
    _special("192.175.48.0/24", "Direct Delegation AS112 Service", "RFC 7534", True),
    _special("198.18.0.0/15", "Benchmarking", "RFC 2544", False),
    _special("198.51.100.0/24", "Documentation (TEST-NET-2)", "RFC 5737", False),
    _special("203.0.113.0/24", "Documentation (TEST-NET-3)", "RFC 5737", False),
    _special("240.0.0.0/4", "Reserved", "RFC 1112, Section 4", False),
    _special("255.255.255.255/32", "Limited Broadcast", "RFC 8190, RFC 919 Section 7", False),
    # IANA IPv6 Special-Purpose Address Registry
    _special("::1/128", "Loopback Address", "RFC 4291", False),
    _special("::/128", "Unspecified Address", "RFC 4291", False),
    _special("::ffff:0:0/96", "IPv4-mapped Address", "RFC 4291", False, carries_ipv4=True),
    _special("64:ff9b::/96", "IPv4-IPv6 Translat.", "RFC 6052", True, carries_ipv4=True),
    _special("64:ff9b:1::/48", "IPv4-IPv6 Translat.", "RFC 8215", False),  # local-use NAT64
    _special("100::/64", "Discard-Only Address Block", "RFC 6666", False),
    _special("100:0:0:1::/64", "Dummy IPv6 Prefix", "RFC 9780", False),
    _special("2001::/23", "IETF Protocol Assignments", "RFC 2928", False),
    _special("2001::/32", "TEREDO", "RFC 4380, RFC 8190", None, carries_ipv4=True),
    _special("2001:1::1/128", "Port Control Protocol Anycast", "RFC 7723", True),
    _special("2001:1::2/128", "Traversal Using Relays around NAT Anycast", "RFC 8155", True),
    _special("2001:1::3/128", "DNS-SD Service Registration Protocol Anycast", "RFC 9665", True),
    _special("2001:2::/48", "Benchmarking", "RFC 5180", False),
    _special("2001:3::/32", "AMT", "RFC 7450", True),
    _special("2001:4:112::/48", "AS112-v6", "RFC 7535", True),
    _special("2001:10::/28", "Deprecated (previously ORCHID)", "RFC 4843", None),
    _special("2001:20::/28", "ORCHIDv2", "RFC 7343", True),
    _special("2001:30::/28", "Drone Remote ID Protocol Entity Tags (DETs) Prefix", "RFC 9374", True),
    _special("2001:db8::/32", "Documentation", "RFC 3849", False),
    _special("2002::/16", "6to4", "RFC 3056", None, carries_ipv4=True),
    _special("2620:4f:8000::/48", "Direct Delegation AS112 Service", "RFC 7534", True),
    _special("3fff::/20", "Documentation", "RFC 9637", False),
    _special("5f00::/16", "Segment Routing (SRv6) SIDs", "RFC 9602", False),
    _special("fc00::/7", "Unique-Local", "RFC 4193, RFC 8190", False),
    _special("fe80::/10", "Link-Local Unicast", "RFC 4291", False),
    # not in those registries: multicast, and deprecated IPv6 forms
    _special("224.0.0.0/4", "Multicast", "RFC 5771", False),
    _special("ff00::/8", "Multicast", "RFC 4291", False),
    _special("::/96", "IPv4-compatible Address (deprecated)", "RFC 4291, Section 2.5.5.1", False, carries_ipv4=True),
    _special("::ffff:0:0:0/96", "IPv4-translated Address (SIIT, deprecated)", "RFC 2765", False, carries_ipv4=True),
    _special("fec0::/10", "Site-Local (deprecated)", "RFC 3879", False),
)
GLOBAL_UNICAST = ipaddress.ip_network("2000::/3")  # all IANA allocates IPv6 unicast from (RFC 4291)
_BY_LENGTH = sorted(SPECIAL_PURPOSE, key=lambda s: s.network.prefixlen, reverse=True)  # longest match first
_LOW_32_FORMS = (  # IPv6 forms whose last 32 bits are the IPv4 address
    (ipaddress.ip_network("::ffff:0:0/96"), "IPv4-mapped"),
    (ipaddress.ip_network("::/96"), "IPv4-compatible"),
    (ipaddress.ip_network("::ffff:0:0:0/96"), "IPv4-translated (SIIT)"),
    (ipaddress.ip_network("64:ff9b::/96"), "NAT64"),
)


def special_block(ip: IPAddress) -> Special | None:
    """The most specific table entry holding ``ip`` (the registries' nested entries override
    their parents: 192.0.0.9 is not 192.0.0.0/24's)."""
    return next((s for s in _BY_LENGTH if s.network.version == ip.version and ip in s.network), None)


def carried_ipv4(ip: ipaddress.IPv6Address) -> list[tuple[str, ipaddress.IPv4Address]]:
    """The IPv4 addresses an IPv6 address carries, with the form's name: the low 32 bits of
    IPv4-mapped, -compatible (not ``::``/``::1``), SIIT and NAT64 (64:ff9b::/96, RFC 6052)
    addresses, 6to4's bits 16-47, Teredo's server and (de-obfuscated) client. Local-use NAT64
    (64:ff9b:1::/48) places the IPv4 by a prefix length only its network knows: refused whole."""
    out: list[tuple[str, ipaddress.IPv4Address]] = []
    low = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    for block, form in _LOW_32_FORMS:
        if ip in block and int(ip) > 1:
            out.append((form, low))
    if ip.sixtofour is not None:
        out.append(("6to4", ip.sixtofour))
    if ip.teredo is not None:
        server, client = ip.teredo
        out += [("Teredo server", server), ("Teredo client", client)]
    return out


def address_refusal(ip: IPAddress, allow_networks: Sequence[IPNetwork] = ()) -> str | None:
    """Why a webhook may not go to ``ip``, naming the registry entry and its RFC; None when it
    may. An address inside ``allow_networks`` may; so may an IPv6 address of a block that is
    judged by the IPv4 it carries (NAT64 64:ff9b::/96, 6to4, Teredo) when that IPv4 may."""
    if any(ip.version == net.version and ip in net for net in allow_networks):
        return None
    if isinstance(ip, ipaddress.IPv6Address):
        for form, v4 in carried_ipv4(ip):
            why = address_refusal(v4, allow_networks)
            if why is not None:
                return f"it carries IPv4 {v4} ({form}), {why}"
    special = special_block(ip)
    if special is not None:
        if special.carries_ipv4 and special.globally_reachable is not False:
            return None  # judged above by the address it carries
        where = f"{special.name} ({special.network}, {special.rfc})"
        if special.globally_reachable:
            return f"{where}: protocol infrastructure, not a webhook receiver"
        return f"{where}: not globally reachable"
    if isinstance(ip, ipaddress.IPv6Address) and ip not in GLOBAL_UNICAST:
        return f"outside {GLOBAL_UNICAST}, the IPv6 global unicast space (RFC 4291): reserved"
    if not ip.is_global:  # a backstop: Python's own table, should a registry entry be missing here
        return "not global (Python's ipaddress)"
    return None


def refused_address(ip: IPAddress) -> bool:
    """Not an ordinary globally reachable unicast address (:func:`address_refusal`)."""
    return address_refusal(ip) is not None


Resolver = Callable[[str, int], Awaitable[Sequence[str]]]


async def system_resolve(host: str, port: int) -> list[str]:
    """The host's addresses from the system resolver (OSError when it has none)."""
    loop = asyncio.get_running_loop()
    try:
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise OSError(f"cannot resolve {host}: {exc.strerror or exc}") from None
    return [str(info[4][0]) for info in infos]


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
        if _is_ip(origin.host):
            why = self._address_refusal(ipaddress.ip_address(origin.host))
            if why is not None:
                return (
                    f"webhook_url names {origin.host}, which is refused ({why}): the operator must "
                    f"list its network under tenants.<tenant>.{WEBHOOKS_KEY}.allow_networks"
                )
        if self.signing_secret is None:
            return (
                "this tenant has no webhook signing secret: the operator grants one in the API-keys file "
                f"under tenants.<tenant>.{WEBHOOKS_KEY}.signing_secret"
            )
        return None

    def _address_refusal(self, ip: IPAddress) -> str | None:
        return None if self.development else address_refusal(ip, self.allow_networks)

    async def pin(self, url: str, resolve: Resolver = system_resolve) -> tuple[Origin, str]:
        """(origin, the address to connect to): every resolved address checked, the first used.
        ``resolve`` is the system resolver; tests give a local one, so no name leaves the machine."""
        problem = self.url_problem(url)
        if problem:
            raise DestinationRefused(problem)
        origin = origin_of(url)
        if _is_ip(origin.host):
            addresses = [origin.host]
        else:
            addresses = list(dict.fromkeys(str(a).split("%")[0] for a in await resolve(origin.host, origin.port)))
        if not addresses:
            raise OSError(f"{origin.host} has no address")
        refused: list[tuple[str, str]] = []
        for a in addresses:
            try:
                why = self._address_refusal(ipaddress.ip_address(a))
            except ValueError:
                why = "not an IP address"
            if why is not None:
                refused.append((a, why))
        if refused:
            first, why = refused[0]
            others = f" (and {len(refused) - 1} more refused)" if len(refused) > 1 else ""
            raise DestinationRefused(
                f"{origin.host} resolves to {first}, which is refused ({why}){others}: only globally reachable "
                f"unicast addresses are called, unless the operator lists their network under "
                f"{WEBHOOKS_KEY}.allow_networks"
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
        current = secret.read()  # a file is read again at each attempt; one missing now is checked then
        problem = signing.secret_problem(current) if current is not None else None
        if problem is not None:
            raise ConfigurationError(f"{where}: {WEBHOOKS_KEY}.signing_secret ({secret.describe()}) {problem}")
    return WebhookGrant(tuple(origins), tuple(networks), secret)


def _strings(value: Any, where: str, cap: int) -> Iterable[str]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
        raise ConfigurationError(f"{where} must be a list of strings")
    if len(value) > cap:
        raise ConfigurationError(f"{where}: more than {cap} entries")
    return [v.strip() for v in value]
