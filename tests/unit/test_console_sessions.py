"""Review console sessions: idle and absolute expiry, bounded table, sign-in throttling, CSRF tokens."""

from __future__ import annotations

import pytest

from crossaudit.console.app import ConsoleApp, parse_time
from crossaudit.console.sessions import Sessions, SessionsFull, key_id, tokens_match
from crossaudit.service.config import ConsoleLimits
from crossaudit.service.principals import Principal, Role

ALICE = Principal("acme", Role.REVIEWER, "alice", frozenset({"content_moderator"}))
ALICE_KEY = key_id("acme-alice-key-0123456789")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_sessions_expire_when_idle_and_when_old() -> None:
    clock = Clock()
    sessions = Sessions(ConsoleLimits(session_idle_s=60, session_max_age_s=300), clock=clock)
    sid, session = sessions.create(ALICE, ALICE_KEY)
    assert sessions.get(sid) is session and session.principal == ALICE
    clock.now += 59
    assert sessions.get(sid) is session  # use keeps it alive
    clock.now += 61
    assert sessions.get(sid) is None and len(sessions) == 0  # idle too long: gone
    sid, _ = sessions.create(ALICE, ALICE_KEY)
    for _ in range(6):
        clock.now += 55
        alive = sessions.get(sid)
    assert alive is None  # used all along, but older than session_max_age_s
    assert sessions.get("") is None and sessions.get("unknown") is None


def test_ids_are_fresh_a_key_beyond_its_share_signs_out_its_own_oldest_and_sign_out_forgets() -> None:
    sessions = Sessions(ConsoleLimits(max_sessions_per_key=2))
    a, sa = sessions.create(ALICE, ALICE_KEY)
    b, _ = sessions.create(ALICE, ALICE_KEY)
    assert a != b and len(a) >= 40 and sa.csrf not in (a, b)
    c, _ = sessions.create(ALICE, ALICE_KEY)
    assert sessions.get(a) is None and sessions.get(b) and sessions.get(c)  # the key's least recently used went
    sessions.drop(c)
    assert sessions.get(c) is None and sessions.count(key=ALICE_KEY) == 1


def test_a_tenant_beyond_its_share_signs_out_its_own_and_a_full_table_refuses_instead_of_evicting() -> None:
    """10,001 sign-ins of one key once signed every other tenant out (one LRU table for all)."""
    sessions = Sessions(ConsoleLimits())
    carol = Principal("globex", Role.REVIEWER, "carol")
    theirs, _ = sessions.create(carol, key_id("globex-carol-key-0123456789"))
    for _ in range(10_001):
        sessions.create(ALICE, ALICE_KEY)
    assert sessions.get(theirs) is not None
    assert sessions.count(key=ALICE_KEY) == ConsoleLimits().max_sessions_per_key

    small = Sessions(ConsoleLimits(max_sessions=5, max_sessions_per_key=10, max_sessions_per_tenant=3))
    keys = [key_id(f"acme-key-{i}-0123456789") for i in range(4)]
    acme = [small.create(ALICE, keys[i])[0] for i in range(4)]  # 4 keys, one tenant of 3 at most
    assert small.get(acme[0]) is None and all(small.get(s) for s in acme[1:])
    assert small.count(tenant="acme") == 3
    bob = Principal("initech", Role.REVIEWER, "bob")
    other = [small.create(bob, key_id(f"initech-{i}-0123456789"))[0] for i in range(2)]
    with pytest.raises(SessionsFull, match=r"console_limits\.max_sessions"):
        small.create(carol, key_id("globex-carol-key-0123456789"))
    assert all(small.get(s) for s in (*acme[1:], *other))  # nobody was signed out for it
    small.drop(other[0])
    assert small.create(carol, key_id("globex-carol-key-0123456789"))


def test_idle_sessions_make_room_in_a_full_table() -> None:
    clock = Clock()
    sessions = Sessions(ConsoleLimits(max_sessions=2, session_idle_s=60), clock=clock)
    bob = Principal("initech", Role.REVIEWER, "bob")
    sessions.create(ALICE, ALICE_KEY)
    sessions.create(bob, key_id("initech-0123456789"))
    clock.now += 61
    assert sessions.create(Principal("globex", Role.REVIEWER, "carol"), key_id("globex-0123456789"))
    assert len(sessions) == 1


def test_successful_sign_ins_are_limited_per_key_and_per_address() -> None:
    clock = Clock()
    sessions = Sessions(ConsoleLimits(signins_per_minute_per_key=2, signins_per_minute_per_client=3), clock=clock)
    for _ in range(2):
        assert sessions.signins_throttled(client="10.0.0.1", key=ALICE_KEY) is None
        sessions.signed_in(client="10.0.0.1", key=ALICE_KEY)
    assert "signins_per_minute_per_key" in (sessions.signins_throttled(client="10.0.0.2", key=ALICE_KEY) or "")
    other = key_id("another-key-0123456789")
    assert sessions.signins_throttled(client="10.0.0.1", key=other) is None
    sessions.signed_in(client="10.0.0.1", key=other)
    assert "signins_per_minute_per_client" in (sessions.signins_throttled(client="10.0.0.1") or "")
    clock.now += 61
    assert sessions.signins_throttled(client="10.0.0.1", key=ALICE_KEY) is None


def test_sign_in_failures_are_throttled_per_address_for_a_minute() -> None:
    clock = Clock()
    sessions = Sessions(ConsoleLimits(signin_failures_per_minute=3), clock=clock)
    for _ in range(3):
        assert not sessions.throttled("10.0.0.1")
        sessions.failed("10.0.0.1")
    assert sessions.throttled("10.0.0.1") and not sessions.throttled("10.0.0.2")
    clock.now += 61
    assert not sessions.throttled("10.0.0.1")


def test_csrf_tokens_compare_in_constant_time_and_never_match_empty() -> None:
    assert tokens_match("abc", "abc") and not tokens_match("abc", "abd")
    assert not tokens_match("abc", None) and not tokens_match("", "")


def test_after_sign_in_only_local_paths_and_times_parse_as_utc() -> None:
    assert ConsoleApp._next("/decisions/x?resolved=1") == "/decisions/x?resolved=1"
    for bad in ("//evil.example/x", "https://evil.example", "/\\evil.example", "", None):
        assert ConsoleApp._next(bad) == "/queue"
    assert parse_time("1970-01-01T00:01", "since") == 60.0
    assert parse_time("  ", "since") is None and parse_time("120.5", "until") == 120.5


def test_the_console_leaves_loopback_only_with_tls(tmp_path) -> None:
    import pytest

    from crossaudit.console import check_console_config
    from crossaudit.kernel.errors import ConfigurationError
    from crossaudit.service.config import ServerConfig

    check_console_config(ServerConfig(console_port=8081))
    check_console_config(ServerConfig(console_port=None, console_host="0.0.0.0"))
    with pytest.raises(ConfigurationError, match="only with --tls-cert/--tls-key"):
        check_console_config(ServerConfig(console_port=8081, console_host="0.0.0.0"))
    check_console_config(
        ServerConfig(console_port=8081, console_host="0.0.0.0", tls_cert=tmp_path / "c", tls_key=tmp_path / "k")
    )
    with pytest.raises(ConfigurationError, match="invalid --console-port"):
        check_console_config(ServerConfig(console_port=70000))


def test_dev_serves_the_console_by_default_and_off_turns_it_off(monkeypatch) -> None:
    """``serve --dev`` (``make serve``) gets the console without knowing the flag: on 8081 next to
    a fixed gRPC port, on an ephemeral one with ``--port 0``; ``off`` however it is written
    (``--set`` reads YAML 1.1, where off is false: never port 0); other servers only when asked."""
    import pytest

    from crossaudit.cli.main import build_parser
    from crossaudit.cli.server import settings_flags
    from crossaudit.kernel.errors import ConfigurationError
    from crossaudit.service.config import DEV_CONSOLE_PORT, ServerConfig
    from crossaudit.service.settings import load_settings

    def port(*argv: str) -> int | None:
        args = build_parser().parse_args(["serve", *argv])
        return load_settings(None, settings_flags(args)).config.console_listen_port

    assert DEV_CONSOLE_PORT == 8081 and ServerConfig(dev=True).console_listen_port == 8081
    assert port("--dev") == 8081 and port("--dev", "--port", "0") == 0 and port() is None
    assert port("--dev", "--console-port", "9000") == 9000 and port("--console-port", "0") == 0
    for off in (("--console-port", "off"), ("--console-port", "OFF"), ("--set", "console_port=off")):
        assert port("--dev", *off) is None, off
    monkeypatch.setenv("CROSSAUDIT_CONSOLE_PORT", "off")
    assert port("--dev") is None
    with pytest.raises(ConfigurationError, match="a port number, 0 for any free port, or off"):
        port("--set", "console_port=true")
    with pytest.raises(SystemExit):
        port("--console-port", "eighty")


def test_clients_are_counted_by_ipv4_address_and_ipv6_64() -> None:
    from crossaudit.kernel.listen import client_key

    assert client_key("10.0.0.1") == "10.0.0.1" and client_key("::ffff:10.0.0.1") == "10.0.0.1"
    assert client_key("2001:db8:1:2::1") == client_key("2001:db8:1:2:ffff::9") == "2001:db8:1:2::/64"
    assert client_key("2001:db8:1:3::1") != client_key("2001:db8:1:2::1")
    assert client_key(None) == "?" and client_key("not-an-address") == "not-an-address"
