"""Client helpers that need no server: policy sources, review states, TLS options, the request
limit checked before sending, and what a client says when nothing answers (a closed port)."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest

from crossaudit.api.limits import REQUEST_LIMIT_ENV
from crossaudit.kernel.errors import ErrorCode, InvalidInputError, RequestTooLargeError, ServerUnavailableError
from crossaudit.proxy.config import ProxyLimits
from crossaudit.sdk.client import AsyncClient, Client, _state
from crossaudit.sdk.options import credentials as _credentials
from crossaudit.sdk.options import request_limit, unreachable
from crossaudit.sdk.sources import policy_source as _policy_source
from crossaudit.service.config import ServiceLimits
from crossaudit.service.settings import env_name


def test_policy_source_reads_paths_and_passes_text(tmp_path: Path) -> None:
    p = tmp_path / "p.yaml"
    p.write_text("name: x\n")
    assert _policy_source(p) == ("name: x\n", str(p))
    assert _policy_source(str(p)) == ("name: x\n", str(p))
    assert _policy_source("name: x\ndescription: y\n") == ("name: x\ndescription: y\n", "")
    with pytest.raises(InvalidInputError, match="not found"):
        _policy_source(str(tmp_path / "missing.yaml"))


def test_review_states() -> None:
    assert _state(None) == _state("any") == _state("") == 0
    assert _state("approved") != 0
    with pytest.raises(InvalidInputError, match="invalid review state"):
        _state("maybe")


def test_tls_options(tmp_path: Path) -> None:
    assert _credentials(False) is None
    assert _credentials(True) is not None
    with pytest.raises(InvalidInputError, match="CA certificate"):
        _credentials(tmp_path / "nope.pem")


def test_async_client_has_every_method_of_client_with_the_same_parameters() -> None:
    import inspect

    from crossaudit.sdk.client import AsyncClient, Client

    def methods(cls: type) -> dict[str, inspect.Signature]:
        return {
            name: inspect.signature(fn).replace(return_annotation=inspect.Signature.empty)
            for name, fn in inspect.getmembers(cls, inspect.isfunction)
            if not name.startswith("_")
        }

    sync, asynchronous = methods(Client), methods(AsyncClient)
    assert sync == asynchronous and len(sync) >= 17
    streams = {"evaluate_many", "read_log"}  # async iterators, not coroutines
    assert all(inspect.iscoroutinefunction(getattr(AsyncClient, n)) for n in asynchronous if n not in streams)
    assert inspect.isasyncgenfunction(AsyncClient.evaluate_many)
    assert inspect.signature(AsyncClient.read_log).return_annotation == "AsyncIterator[LogChunk]"


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_request_limit_is_one_setting_with_one_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(REQUEST_LIMIT_ENV, raising=False)
    assert request_limit() == ServiceLimits().max_request_bytes == ProxyLimits().max_request_bytes == 4 * 1024 * 1024
    assert env_name(("limits", "max_request_bytes")) == REQUEST_LIMIT_ENV  # the server's variable
    monkeypatch.setenv(REQUEST_LIMIT_ENV, "1000")
    assert request_limit() == 1000 and request_limit(64) == 64  # Client(max_request_bytes=) wins
    assert Client("127.0.0.1:1").max_request_bytes == 1000
    for bad in ("lots", "0", "-5"):
        monkeypatch.setenv(REQUEST_LIMIT_ENV, bad)
        with pytest.raises(InvalidInputError, match=REQUEST_LIMIT_ENV):
            request_limit()
    with pytest.raises(InvalidInputError, match="max_request_bytes"):
        request_limit(0)


def test_a_request_over_the_limit_is_refused_before_it_is_sent(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing listens at the address: a request that were sent would fail as unreachable."""
    monkeypatch.delenv(REQUEST_LIMIT_ENV, raising=False)
    address = f"127.0.0.1:{closed_port()}"
    with Client(address, max_request_bytes=1000) as c, pytest.raises(RequestTooLargeError) as info:
        c.evaluate("p", "x" * 2000, "")
    err = info.value
    assert err.code is ErrorCode.INVALID_ARGUMENT and not err.retryable
    assert err.limit == 1000 and err.size is not None and err.size > 2000 and err.setting == "max_request_bytes"
    assert "over this client's limit of 1000 bytes" in err.message and REQUEST_LIMIT_ENV in err.message
    assert "limits.max_request_bytes" in err.message  # ... and the server's, which must allow it too

    async def stream() -> None:
        async with AsyncClient(address, max_request_bytes=1000) as c:
            items = [{"prompt": "small", "response": ""}, {"prompt": "x" * 2000, "response": ""}]
            async for _ in c.evaluate_many("p", items):
                pass

    with pytest.raises(RequestTooLargeError, match="1000 bytes"):
        asyncio.run(stream())


def test_a_server_that_does_not_answer_says_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    address = f"127.0.0.1:{closed_port()}"
    with Client(address, timeout=5) as c, pytest.raises(ServerUnavailableError) as info:
        c.list_policies()
    err = info.value
    assert err.retryable and err.code is ErrorCode.UNAVAILABLE and err.address == address
    assert err.message.startswith(f"cannot reach the CrossAudit server at {address}: nothing listens there")
    assert "`crossaudit serve --dev`" in err.message and "--server or CROSSAUDIT_SERVER" in err.message
    assert "failed to connect to all addresses" not in err.message  # grpc's words, not the user's
    monkeypatch.setenv("CROSSAUDIT_SERVER", address)
    with Client(timeout=5) as c, pytest.raises(ServerUnavailableError, match=f"at {address}: "):
        c.server_info()  # the address as the environment gave it


def test_why_a_server_did_not_answer_in_plain_words() -> None:
    dns = "errors resolving nosuch.invalid:50051: [...: Domain name not found]"
    assert "the name does not resolve" in unreachable("nosuch.invalid:50051", dns).message
    tls = "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:9: Tls handshake failed (TSI_...)"
    message = unreachable("127.0.0.1:9", tls).message
    assert "TLS handshake failed" in message and "--tls" in message and "--tls-cert" in message
    prefix = "failed to connect to all addresses; last error: UNAVAILABLE: ipv4:127.0.0.1:9: "
    closed = unreachable("127.0.0.1:9", prefix + "Socket closed")  # a plaintext client, a TLS server
    assert "it closed the connection" in closed.message and "needs --tls or --ca-cert" in closed.message
    other = unreachable("127.0.0.1:9", "failed to connect to all addresses; last error: UNKNOWN: ipv4:x:9: Odd thing")
    assert "at 127.0.0.1:9: Odd thing; is it running? Start one with `crossaudit serve --dev`" in other.message
