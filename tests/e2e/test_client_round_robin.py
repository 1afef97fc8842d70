"""A client given several replicas spreads its calls over them (gRPC client-side ``round_robin``)
and keeps working when one of them stops. Two real ``crossaudit serve`` processes, each with its
own store, so each server's audit log counts the decisions it answered."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest

from crossaudit import AsyncClient, Client
from tests.e2e.conftest import ServerProcess, key
from tests.e2e.policies import KEYWORDS

pytestmark = pytest.mark.e2e

CALLS = 40
CALL_TIMEOUT_S = 10.0
READY_TIMEOUT_S = 20.0


@pytest.fixture
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[ServerProcess]]:
    started: list[ServerProcess] = []
    try:
        for n in range(2):
            srv = ServerProcess(tmp_path_factory.mktemp(f"replica-{n}"))
            srv.start()
            started.append(srv)
            with Client(srv.address, api_key=key("acme")) as c:  # each replica has its own store here
                c.deploy_policy(KEYWORDS)
        yield started
    finally:
        for srv in started:
            srv.stop()


def _answered(srv: ServerProcess) -> int:
    with Client(srv.address, api_key=key("acme")) as c:
        return len(c.list_decisions(policy="keywords"))


def _both_connected(client: Client, servers: list[ServerProcess]) -> None:
    """round_robin connects every address in the background: wait (bounded) until both answered."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        client.evaluate("keywords", prompt="p", response="fine", timeout=CALL_TIMEOUT_S)
        if all(_answered(s) for s in servers):
            return
        time.sleep(0.05)
    pytest.fail("the balanced client never reached both replicas")


def test_calls_spread_over_replicas_and_survive_one_stopping(servers: list[ServerProcess]) -> None:
    a, b = servers
    with Client([a.address, b.address], api_key=key("acme")) as client:
        assert client.target.startswith("ipv4:127.0.0.1:")
        _both_connected(client, servers)
        before = [_answered(a), _answered(b)]
        for i in range(CALLS):
            d = client.evaluate("keywords", prompt="p", response=f"fine {i}", timeout=CALL_TIMEOUT_S)
            assert d.passed
        spread = [_answered(a) - before[0], _answered(b) - before[1]]
        assert sum(spread) == CALLS
        assert min(spread) >= CALLS // 4, f"round_robin should spread the calls evenly, got {spread}"

        assert a.stop() == 0
        after_stop = _answered(b)
        for i in range(CALLS):
            d = client.evaluate("keywords", prompt="p", response=f"still fine {i}", timeout=CALL_TIMEOUT_S)
            assert d.passed
        assert _answered(b) - after_stop == CALLS  # every call of the second half went to the survivor


def test_async_client_takes_a_comma_separated_string(servers: list[ServerProcess]) -> None:
    a, b = servers
    before = [_answered(a), _answered(b)]

    async def main() -> None:
        async with AsyncClient(f"{a.address},{b.address}", api_key=key("acme")) as client:
            for i in range(CALLS):
                d = await client.evaluate("keywords", prompt="p", response=f"ok {i}", timeout=CALL_TIMEOUT_S)
                assert d.passed

    asyncio.run(asyncio.wait_for(main(), timeout=CALLS * CALL_TIMEOUT_S))
    spread = [_answered(a) - before[0], _answered(b) - before[1]]
    assert sum(spread) == CALLS
    assert min(spread) >= 1, f"both replicas should answer some calls, got {spread}"
