"""Taking the review console away from other tenants, against a real ``crossaudit serve``:
sign-ins that fill the shared session table, and sockets that never send a request.

Clients come from several loopback addresses (127.0.0.2, 127.0.0.3, ...: Linux routes all of
127/8 to lo), so the console sees an attacker and its victim as different clients, as it would
on a network. Every wait is bounded."""

from __future__ import annotations

import contextlib
import re
import socket
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from tests.e2e.conftest import ServerProcess
from tests.e2e.console_http import console_url
from tests.e2e.roles import KEYS, KEYS_FILE

pytestmark = [pytest.mark.e2e, pytest.mark.security]

VICTIM_ADDRESS = "127.0.0.1"


@contextlib.contextmanager
def console(tmp_path: Path, *settings: str) -> Iterator[str]:
    """A real server with the roles' keys file, serving the console with ``settings`` (--set)."""
    extra: list[str] = ["--console-port", "0"]
    for s in settings:
        extra += ["--set", s]
    with ServerProcess(tmp_path, keys_text=KEYS_FILE, extra=tuple(extra)) as srv:
        yield console_url(srv.start_line)


def browser(url: str, address: str = VICTIM_ADDRESS) -> httpx.Client:
    """An HTTP client connecting from ``address`` (a loopback address of its own)."""
    transport = httpx.HTTPTransport(local_address=address)
    return httpx.Client(base_url=url, transport=transport, follow_redirects=False, timeout=10)


def sign_in(h: httpx.Client, key: str) -> httpx.Response:
    """One sign-in (the form's double-submit token, as a browser sends it)."""
    h.cookies.delete("crossaudit_session")  # a new session each time, as from another browser
    page = h.get("/signin")
    token = re.search(r'name="csrf_token" value="([^"]+)"', page.text)
    assert token, page.text
    return h.post("/signin", data={"csrf_token": token.group(1), "api_key": key, "next": "/queue"})


def signed_in(url: str, key: str, address: str = VICTIM_ADDRESS) -> httpx.Client:
    h = browser(url, address)
    r = sign_in(h, key)
    assert r.status_code == 303 and r.headers["location"] == "/queue", r.text
    return h


def still_signed_in(h: httpx.Client) -> bool:
    r = h.get("/queue")
    return r.status_code == 200


# --- 1. sessions ------------------------------------------------------------------------------


def test_one_tenants_sign_ins_never_sign_out_another_tenants_reviewers(tmp_path: Path) -> None:
    """The exploit: the table held 10,000 sessions of every tenant together and dropped the least
    recently used, so 10,001 sign-ins of one reviewer key signed everyone else out. Here the table
    holds 30 (and sign-in rates are raised so that only the table is tested): 40 sign-ins of
    acme's reviewer key must leave globex's reviewer signed in, and acme's key at its own share."""
    with console(
        tmp_path,
        "console_limits.max_sessions=30",
        "console_limits.signins_per_minute_per_key=1000",
        "console_limits.signins_per_minute_per_client=1000",
    ) as url:
        carol = signed_in(url, KEYS["globex_reviewer"])
        attacker = browser(url, "127.0.0.2")
        statuses = [sign_in(attacker, KEYS["reviewer"]).status_code for _ in range(40)]
        assert statuses == [303] * 40  # the attacker only signs its own oldest sessions out
        assert still_signed_in(carol), "another tenant's sign-ins signed globex's reviewer out"


def test_a_full_table_refuses_new_sign_ins_instead_of_signing_anyone_out(tmp_path: Path) -> None:
    with console(
        tmp_path,
        "console_limits.max_sessions=8",
        "console_limits.max_sessions_per_key=3",
        "console_limits.max_sessions_per_tenant=5",
        "console_limits.signins_per_minute_per_key=1000",
        "console_limits.signins_per_minute_per_client=1000",
    ) as url:
        acme = [signed_in(url, KEYS[k], "127.0.0.2") for k in ("reviewer", "reviewer", "reviewer", "moderator")]
        acme += [signed_in(url, KEYS["admin"], "127.0.0.2") for _ in range(3)]  # 7 of acme: its share is 5
        assert [still_signed_in(h) for h in acme] == [False, False, True, True, True, True, True]
        globex = [signed_in(url, KEYS["globex_reviewer"]) for _ in range(3)]  # 5 + 3: the table is full
        late = browser(url, "127.0.0.3")
        r = sign_in(late, KEYS["globex_admin"])
        assert r.status_code == 503, r.text
        assert "as many sessions as it may hold" in r.text and "console_limits.max_sessions" in r.text
        assert all(still_signed_in(h) for h in acme[2:] + globex), "a refused sign-in signed someone out"


def test_successful_sign_ins_are_rate_limited_per_key_and_per_address(tmp_path: Path) -> None:
    with console(tmp_path, "console_limits.signins_per_minute_per_client=12") as url:
        h = browser(url, "127.0.0.2")
        assert [sign_in(h, KEYS["reviewer"]).status_code for _ in range(10)] == [303] * 10
        r = sign_in(h, KEYS["reviewer"])  # the key's 11th in a minute
        assert r.status_code == 429 and "signins_per_minute_per_key" in r.text, r.text
        assert sign_in(h, KEYS["moderator"]).status_code == 303  # another key from here: 11
        assert sign_in(h, KEYS["admin"]).status_code == 303  # 12
        r = sign_in(h, KEYS["globex_reviewer"])
        assert r.status_code == 429 and "signins_per_minute_per_client" in r.text, r.text
        assert sign_in(browser(url, "127.0.0.3"), KEYS["globex_reviewer"]).status_code == 303  # others: not


# --- 2. connections ---------------------------------------------------------------------------


def idle_sockets(url: str, address: str, n: int) -> list[socket.socket]:
    """``n`` connections from ``address`` that never send a byte."""
    parts = urlsplit(url)
    out = []
    for _ in range(n):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.bind((address, 0))
        s.settimeout(5)
        s.connect((parts.hostname, parts.port))
        out.append(s)
    return out


def closed_by_server(s: socket.socket, within_s: float) -> bool:
    """Whether the server closed ``s`` (EOF or reset) within ``within_s`` seconds."""
    s.settimeout(within_s)
    try:
        return s.recv(1) == b""
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False


def close_all(sockets: list[socket.socket]) -> None:
    for s in sockets:
        with contextlib.suppress(OSError):
            s.close()


def test_idle_sockets_from_one_address_never_lock_the_console(tmp_path: Path) -> None:
    """The exploit: 64 sockets that never send a request (max_concurrent_requests, which counted
    open connections) answered everyone else 503, for as long as they stayed open."""
    with console(tmp_path, "console_limits.header_timeout_s=2") as url:
        sockets = idle_sockets(url, "127.0.0.2", 80)
        try:
            with browser(url) as h:
                r = h.get("/signin")
            assert r.status_code == 200, f"{r.status_code}: idle sockets locked the console out"
            # one address keeps at most max_connections_per_client (16): the rest are closed at once
            open_ = [s for s in sockets if not closed_by_server(s, 0.05)]
            assert len(open_) <= 16, len(open_)
            # ... and those by the head deadline (2 s here; bounded generously: being closed is the outcome)
            assert all(closed_by_server(s, 30.0) for s in open_)
        finally:
            close_all(sockets)


def test_a_request_head_sent_a_byte_at_a_time_is_cut_at_the_deadline(tmp_path: Path) -> None:
    with console(tmp_path, "console_limits.header_timeout_s=2") as url:
        [s] = idle_sockets(url, "127.0.0.2", 1)
        try:
            closed = False
            for byte in b"GET /signin HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 40:  # bounded: 87 bytes, ~20 s
                try:
                    s.sendall(bytes([byte]))
                except OSError:
                    closed = True
                    break
                if closed_by_server(s, 0.25):
                    closed = True
                    break
            # the trickle (~20 s) outlasts the 2 s head deadline many times over: being cut is the outcome
            assert closed, "a trickled request head kept its connection open"
        finally:
            close_all([s])


def test_idle_sockets_from_many_addresses_make_room_for_a_request(tmp_path: Path) -> None:
    """Beyond max_connections (48 here), a new connection closes the oldest idle one of the
    client holding the most: 6 addresses x 16 idle sockets still leave room for a reviewer."""
    with console(tmp_path, "console_limits.max_connections=48", "console_limits.header_timeout_s=30") as url:
        sockets: list[socket.socket] = []
        try:
            for i in range(2, 8):
                sockets += idle_sockets(url, f"127.0.0.{i}", 16)
            for _ in range(3):
                with browser(url) as h:
                    r = h.get("/signin")
                assert r.status_code == 200, f"{r.status_code}: idle sockets of many addresses locked the console"
            still_open = [s for s in sockets if not closed_by_server(s, 0.02)]
            assert len(still_open) <= 48
        finally:
            close_all(sockets)
