"""The webhook address guard against IPv6 spellings of private IPv4 and special-purpose ranges.

An allowlisted name may resolve to anything its owner writes in DNS (or a DNS64 resolver
synthesises): an IPv6 address that embeds a private IPv4 (NAT64 ``64:ff9b::10.0.0.1`` reaches
10.0.0.1 on an IPv6-only network), a deprecated form (IPv4-compatible ``::a.b.c.d``, SIIT,
site-local), or a special-purpose range Python's ``ipaddress`` (3.11) calls global
(``192.0.0.8``, ``3fff::/20``). Nothing here resolves a name on the network or sends traffic
beyond loopback: the guard's decision is tested on literal addresses, and the sender's real path
through a local resolver hook (``WebhookSender(resolve=...)``).
"""

from __future__ import annotations

import ipaddress

import pytest

from crossaudit.api.records import OutboxRecord
from crossaudit.outbox.destinations import (
    SPECIAL_PURPOSE,
    WebhookGrant,
    address_refusal,
    origin_of,
    parse_webhooks,
    refused_address,
)
from crossaudit.outbox.limits import DeliveryLimits
from crossaudit.outbox.webhooks import WebhookSender
from orchestrator.secrets import EnvironmentSecrets, SecretGrant
from tests.webhook_receiver import Receiver

pytestmark = pytest.mark.security

SECRET = "a-signing-secret-of-32-characters"

REFUSED = {
    # embedded IPv4, private or special
    "::10.0.0.1": "IPv4-compatible",
    "::169.254.169.254": "IPv4-compatible",
    "::ffff:10.0.0.1": "IPv4-mapped",
    "::ffff:127.0.0.1": "IPv4-mapped",
    "::ffff:8.8.8.8": "IPv4-mapped",  # the registry: never on the wire, not globally reachable
    "64:ff9b::10.0.0.1": "Private-Use",
    "64:ff9b::169.254.169.254": "Link Local",
    "64:ff9b::127.0.0.1": "Loopback",
    "64:ff9b::100.64.0.1": "Shared Address Space",
    "64:ff9b::192.0.0.8": "IPv4 dummy address",
    "64:ff9b:1::a00:1": "IPv4-IPv6 Translat.",  # local-use NAT64 (RFC 8215), whatever it embeds
    "64:ff9b:1:a00:0:100::": "IPv4-IPv6 Translat.",
    "::ffff:0:10.0.0.1": "IPv4-translated",  # SIIT
    "::ffff:0:8.8.8.8": "IPv4-translated",
    "2002:a00:1::": "Private-Use",  # 6to4 of 10.0.0.1
    "2002:c000:8::1": "IPv4 dummy address",  # 6to4 of 192.0.0.8
    "2002:c058:6301::": "6to4 Relay Anycast",  # 6to4 of 192.88.99.1
    "2001:0:a00:1::": "Private-Use",  # Teredo, server 10.0.0.1
    "2001:0:4136:e378:8000:63bf:f5ff:fffe": "Private-Use",  # Teredo, client 10.0.0.1 (obfuscated)
    # deprecated
    "fec0::1": "Site-Local",
    "2001:10::1": "ORCHID",
    # IPv4 special-purpose ranges Python 3.11 calls global
    "192.0.0.8": "IPv4 dummy address",
    "192.0.0.100": "IETF Protocol Assignments",
    "192.88.99.1": "6to4 Relay Anycast",
    "192.88.99.2": "6a44",
    # IPv6 special-purpose ranges Python 3.11 calls global
    "3fff::1": "Documentation",
    "5f00::1": "Segment Routing",
    "100:0:0:1::1": "Dummy IPv6 Prefix",
    # globally reachable per the registry, yet protocol infrastructure, never a receiver
    "192.0.0.9": "Port Control Protocol Anycast",
    "2001:1::1": "Port Control Protocol Anycast",
    "2620:4f:8000::53": "AS112",
    # outside what IANA allocates for global unicast, and multicast
    "4000::1": "2000::/3",
    "ff0e::1": "Multicast",
    "224.0.0.251": "Multicast",
    # the usual ones stay refused
    "127.0.0.1": "Loopback",
    "169.254.169.254": "Link Local",
    "::1": "Loopback Address",
    "fd00::1": "Unique-Local",
    "fe80::1": "Link-Local Unicast",
}


@pytest.mark.parametrize("address", sorted(REFUSED))
def test_special_and_embedded_addresses_are_refused(address: str) -> None:
    ip = ipaddress.ip_address(address)
    why = address_refusal(ip)
    assert why is not None and REFUSED[address] in why, (address, why)
    assert refused_address(ip)


@pytest.mark.parametrize(
    "address",
    [
        "93.184.216.34",
        "8.8.8.8",
        "2606:4700::1",
        "64:ff9b::8.8.8.8",  # NAT64 of a public address: globally reachable (RFC 6052)
        "2002:808:808::1",  # 6to4 of 8.8.8.8
        "2001:0:4136:e378:8000:63bf:f7f7:f7f7",  # Teredo, server 65.54.227.120, client 8.8.8.8
    ],
)
def test_public_addresses_and_their_translations_pass(address: str) -> None:
    assert address_refusal(ipaddress.ip_address(address)) is None


def test_the_table_is_the_iana_registries_with_names_rfcs_and_reachability() -> None:
    """Every IANA special-purpose entry is in the table, once, with a name, an RFC, and the
    registry's "Globally Reachable" value (True, False, or None for N/A)."""
    blocks = [str(s.network) for s in SPECIAL_PURPOSE]
    assert len(blocks) == len(set(blocks))
    for special in SPECIAL_PURPOSE:
        assert special.name and special.rfc.startswith("RFC ") and special.globally_reachable in (True, False, None)
    by_block = {str(s.network): s for s in SPECIAL_PURPOSE}
    for block, reachable in {
        "192.0.0.0/24": False,
        "192.0.0.9/32": True,
        "64:ff9b::/96": True,
        "64:ff9b:1::/48": False,
        "2001::/32": None,
        "2002::/16": None,
        "2001:db8::/32": False,
        "fe80::/10": False,
    }.items():
        assert by_block[block].globally_reachable is reachable, block


def test_a_granted_network_is_reached_in_its_nat64_spelling_too() -> None:
    """allow_networks applies to the IPv4 a NAT64 address carries: a grant of 10.20.0.0/16 is
    usable on an IPv6-only network, and grants nothing else."""
    nets = (ipaddress.ip_network("10.20.0.0/16"),)
    assert address_refusal(ipaddress.ip_address("64:ff9b::10.20.0.5"), nets) is None
    assert address_refusal(ipaddress.ip_address("10.20.0.5"), nets) is None
    assert address_refusal(ipaddress.ip_address("64:ff9b::10.21.0.5"), nets) is not None
    assert address_refusal(ipaddress.ip_address("64:ff9b:1::a14:5"), nets) is not None  # local-use NAT64


def test_a_literal_ipv6_url_is_refused_at_deploy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOOK_SECRET", SECRET)
    url = "http://[64:ff9b::a9fe:a9fe]/latest/meta-data/"
    grant = parse_webhooks(
        {"allow": ["http://[64:ff9b::a9fe:a9fe]"], "signing_secret": {"env": "HOOK_SECRET"}},
        "tenant acme",
        lambda source, where: SecretGrant("signing_secret", env=source["env"]),
    )
    problem = grant.url_problem(url) or ""
    assert "169.254.169.254" in problem and "allow_networks" in problem


# -- the sender's real path, names resolved by a local hook -------------------------------------


def _record(url: str) -> OutboxRecord:
    payload = {"url": url, "method": "POST", "headers": {}, "body": '{"x":1}'}
    return OutboxRecord(id="d-1", tenant="acme", kind="webhook", decision_id="dec-1", rule="r", payload=payload)


def _sender(grant: WebhookGrant, answers: dict[str, list[str]]) -> WebhookSender:
    async def resolve(host: str, port: int) -> list[str]:  # a local DNS: nothing leaves the machine
        return answers[host]

    return WebhookSender(lambda tenant: grant, lambda tenant: EnvironmentSecrets({}), DeliveryLimits(), resolve=resolve)


@pytest.mark.parametrize(
    "answer",
    [
        ["64:ff9b::10.0.0.1"],
        ["::10.0.0.1"],
        ["::ffff:0:10.0.0.1"],
        ["64:ff9b:1::a00:1"],
        ["fec0::1"],
        ["192.0.0.8"],
        ["2002:a00:1::"],
        ["93.184.216.34", "64:ff9b::169.254.169.254"],  # one bad address among good ones
    ],
)
async def test_a_name_resolving_to_a_hidden_private_address_is_dead_at_once(
    monkeypatch: pytest.MonkeyPatch, answer: list[str]
) -> None:
    monkeypatch.setenv("HOOK_SECRET", SECRET)
    grant = WebhookGrant(
        allow=(origin_of("https://hooks.acme.example"),), signing_secret=SecretGrant("s", env="HOOK_SECRET")
    )
    sender = _sender(grant, {"hooks.acme.example": answer})
    try:
        attempt = await sender.send(_record("https://hooks.acme.example/hook"))
    finally:
        await sender.aclose()
    assert not attempt.delivered and attempt.permanent, attempt
    assert "resolves to" in attempt.error and "allow_networks" in attempt.error


async def test_the_resolver_hook_is_the_path_a_delivery_takes(
    monkeypatch: pytest.MonkeyPatch, receiver: Receiver
) -> None:
    """The control: the same path delivers to a granted loopback network through the hook."""
    monkeypatch.setenv("HOOK_SECRET", SECRET)
    origin = origin_of(f"http://hooks.acme.example:{receiver.port}")
    grant = WebhookGrant(
        allow=(origin,),
        allow_networks=(ipaddress.ip_network("127.0.0.1/32"),),
        signing_secret=SecretGrant("s", env="HOOK_SECRET"),
    )
    sender = _sender(grant, {"hooks.acme.example": ["127.0.0.1"]})
    try:
        attempt = await sender.send(_record(f"http://hooks.acme.example:{receiver.port}/hook"))
    finally:
        await sender.aclose()
    assert attempt.delivered, attempt
    [got] = receiver.wait_for(1)
    assert got.path == "/hook" and got.headers["host"] == f"hooks.acme.example:{receiver.port}"
