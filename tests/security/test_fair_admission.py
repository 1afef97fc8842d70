"""Fair shares of the server's evaluation slots: one tenant flooding the server with many slow
calls must not make another tenant's calls wait behind the whole flood. Through a real server
(process sandbox) with ``limits.max_concurrent_evaluations=4``: acme sends 24 concurrent calls
whose custom code burns CPU for a while; globex's calls, sent while the flood waits, get the next freed slots.
Asserted by admission order (evaluations' start times as the sandbox saw them, counted), not by
latency. The unit tests drive :class:`FairSlots` directly: weights, deadlines, cancellation."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from crossaudit import AsyncClient
from crossaudit.kernel.errors import ConfigurationError, DeadlineExceededError
from crossaudit.kernel.limits import SandboxLimits
from crossaudit.service.auth import load_tenants_file
from crossaudit.service.fairness import FairSlots
from sandbox.base import CodeBundle
from sandbox.process.backend import ProcessSandbox
from tests.e2e.conftest import TENANT_KEYS, ServerProcess
from tests.e2e.policies import burner

pytestmark = pytest.mark.security

SLOTS = 4
FLOOD = 24
SLEEP_S = 1.5


def policy(name: str, sleep_s: float) -> str:
    """Reports when its evaluation started, then burns CPU for ``sleep_s``."""
    return burner(name, sleep_s, evaluator="stamp", rule="stamped")


def started(decision) -> float:
    return float(decision.rules[0].evaluators[0].details["start"])


def ended(decision) -> float:
    return float(decision.rules[0].evaluators[0].details["end"])


@pytest.mark.e2e
async def test_a_flooding_tenant_does_not_keep_another_tenant_waiting_behind_its_flood(tmp_path: Path) -> None:
    with ServerProcess(tmp_path, extra=("--set", f"limits.max_concurrent_evaluations={SLOTS}")) as srv:
        async with (
            AsyncClient(srv.address, api_key=TENANT_KEYS["acme"]) as acme,
            AsyncClient(srv.address, api_key=TENANT_KEYS["globex"]) as globex,
        ):
            await acme.deploy_policy(policy("slow", SLEEP_S), environment="production")
            await globex.deploy_policy(policy("quick", 0.0), environment="production")
            await acme.evaluate("slow", "warm", "up", timeout=60)  # the sandboxes are ready
            await globex.evaluate("quick", "warm", "up", timeout=60)
            flood = [asyncio.ensure_future(acme.evaluate("slow", "p", f"r{i}", timeout=120)) for i in range(FLOOD)]
            await asyncio.sleep(0.5)  # the flood holds every slot and the rest of it waits
            mine = [await globex.evaluate("quick", "p", f"g{i}", timeout=120) for i in range(3)]
            flooded = await asyncio.gather(*flood)
        acme_starts = sorted(started(d) for d in flooded)
        globex_starts = [started(d) for d in mine]
        assert all(d.passed for d in [*flooded, *mine])  # nothing lost or refused
        # at most SLOTS of acme's evaluations ran at once: the (SLOTS+1)th started after one ended
        assert acme_starts[SLOTS] >= acme_starts[0] + SLEEP_S * 0.9
        # each of globex's calls took the next freed slot, not a place behind the flood: before
        # its k-th call started, at most SLOTS + k*SLOTS of acme's 24 had started (FIFO: 24)
        for k, g in enumerate(globex_starts):
            before = sum(1 for a in acme_starts if a < g)
            assert before <= SLOTS * (k + 2), (k, before, acme_starts, globex_starts)
        assert sum(1 for a in acme_starts if a < globex_starts[-1]) < FLOOD
        # the flood holds at most its fraction of the slots (3 of 4), so globex's first call was
        # admitted at once, not at the flood's next freed slot (before: after one of acme's ended).
        # An order of events, not a duration: how long a loaded machine takes to start it is its own.
        first_end = min(ended(d) for d in flooded)
        assert globex_starts[0] < first_end, (acme_starts, globex_starts, first_end)
        assert "Traceback" not in srv.log.read_text()


async def test_freed_slots_go_to_the_tenant_holding_least_for_its_share() -> None:
    slots = FairSlots(8, {"gold": 3.0})
    slots.record_order = True
    for _ in range(8):
        await slots.acquire("flood", 1.0)
    waiters = [asyncio.ensure_future(slots.acquire(t, 5.0)) for t in ["flood"] * 6 + ["gold"] * 6 + ["other"] * 2]
    await asyncio.sleep(0)
    for _ in range(6):  # six of the flood's running calls end, one by one
        slots.release("flood")
        await asyncio.sleep(0)
    # the flood (holding the most) gets none back while the others wait; gold (share 3) gets more
    assert "flood" not in slots.admitted and len(slots.admitted) == 6
    assert slots.admitted.count("gold") > slots.admitted.count("other") >= 1
    assert slots.used == 8 and slots.held["flood"] == 2
    for w in waiters:
        w.cancel()
    await asyncio.gather(*waiters, return_exceptions=True)
    assert not slots.waiting


async def test_a_wait_is_bounded_by_the_deadline_and_a_cancelled_waiter_takes_no_slot() -> None:
    slots = FairSlots(1)
    await slots.acquire("a", 1.0)
    with pytest.raises(DeadlineExceededError, match=r"limits\.max_concurrent_evaluations"):
        await slots.acquire("b", 0.05)
    gone = asyncio.ensure_future(slots.acquire("b", 5.0))
    await asyncio.sleep(0)
    gone.cancel()
    await asyncio.gather(gone, return_exceptions=True)
    assert not slots.waiting
    slots.release("a")
    assert slots.used == 0 and slots.held == {}
    await slots.acquire("c", 0.05)  # free again at once


async def test_a_tenant_holds_at_most_its_cap_even_with_slots_free() -> None:
    slots = FairSlots(4, per_tenant=3)
    for _ in range(3):
        await slots.acquire("flood", 1.0)
    with pytest.raises(DeadlineExceededError, match=r"max_concurrent_evaluations_tenant_fraction"):
        await slots.acquire("flood", 0.05)
    late = asyncio.ensure_future(slots.acquire("flood", 5.0))
    await asyncio.sleep(0)
    assert not late.done()
    await slots.acquire("other", 0.05)  # the slot the flood may not take: at once, though the flood waits
    slots.release("flood")  # one of the flood's ends: its waiting call takes the freed place
    await asyncio.wait_for(late, 1.0)
    assert slots.held == {"flood": 3, "other": 1} and not slots.waiting


def test_the_tenant_cap_follows_the_configured_fraction() -> None:
    from crossaudit.service.config import ServiceLimits

    limits = ServiceLimits()
    assert 0 < limits.max_concurrent_evaluations_tenant_fraction < 1  # some slots always stay open to others
    assert FairSlots(64, per_tenant=int(64 * 0.75)).per_tenant == 48
    assert FairSlots(1, per_tenant=0).per_tenant == 1  # a one-slot server still serves


@pytest.mark.parametrize("share", ["0", "-1", "1001", "true", "'x'"])
def test_a_bad_share_in_the_keys_file_is_a_configuration_error(tmp_path: Path, share: str) -> None:
    keys = tmp_path / "keys.yaml"
    keys.write_text(f"tenants:\n  acme:\n    keys: [{TENANT_KEYS['acme']}]\n    share: {share}\n")
    keys.chmod(0o600)
    with pytest.raises(ConfigurationError, match="share must be a number"):
        load_tenants_file(keys)


def test_shares_are_read_from_the_keys_file(tmp_path: Path) -> None:
    keys = tmp_path / "keys.yaml"
    keys.write_text(
        f"tenants:\n  acme:\n    keys: [{TENANT_KEYS['acme']}]\n    share: 2.5\n  globex: [{TENANT_KEYS['globex']}]\n"
    )
    keys.chmod(0o600)
    assert dict(load_tenants_file(keys).grants.shares) == {"acme": 2.5, "globex": 1.0}


async def test_process_sandbox_code_runs_below_the_orchestrator() -> None:
    """Tenant code in the process sandbox runs at sandbox_limits.nice, and reads so itself
    (``os.nice(0)`` in unrestricted code): whatever a tenant burns, the orchestrator, which
    answers every tenant, is scheduled first."""
    box = ProcessSandbox(SandboxLimits(nice=7), restricted=False)
    try:
        code = (
            "import os\n"
            "def evaluate(prompt, response, context):\n"
            "    return {'score': 1.0, 'details': {'nice': os.nice(0)}}\n"
        )
        verdict, _ = await box.run(CodeBundle(code), "p", "r", {}, timeout=10.0)
        assert verdict.details["nice"] == 7 + os.nice(0)
    finally:
        await box.aclose()


@pytest.mark.parametrize("value", ["0", "1.5", "nan", "-0.5"])
def test_a_tenant_fraction_outside_0_to_1_is_refused_naming_the_setting(value: str) -> None:
    from crossaudit.service.settings import load_settings, parse_set

    key = "limits.max_concurrent_evaluations_tenant_fraction"
    with pytest.raises(ConfigurationError, match=key.replace(".", r"\.")):
        load_settings(None, [parse_set(f"{key}={value}")])
