"""Audit quotas: one ~100-byte call used to store a multi-MiB audit row (a custom evaluator's
violations, copied into every rule that uses it, with ``audit_all_evaluations``), and nothing
bounded a tenant's audit per day. Now a record over ``limits.max_audit_bytes_per_decision`` is
stored cut down, saying what was cut by which setting, and agreeing with the answer; a tenant
at ``limits.max_audit_bytes_per_tenant_per_day`` is refused (RESOURCE_EXHAUSTED naming it)
before anything is evaluated, every answered decision still audited, other tenants untouched.
The store's part runs on both backends; the rest through a real server, on both backends."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from crossaudit import Client
from crossaudit.api.records import AuditRecord
from crossaudit.kernel.errors import QuotaExceededError
from crossaudit.store.base import AUDIT_DAY_S, Store, audit_size
from tests.e2e.conftest import TENANT_KEYS, ServerProcess
from tests.e2e.policies import BULKY_VIOLATIONS, bulky, trivial
from tests.records import audit_record

pytestmark = pytest.mark.security

def record(tenant: str, now: float, rules: list[dict] | None = None) -> AuditRecord:
    return audit_record(
        tenant=tenant, passed=True, action="allow", rules=rules or [], created_at=now,
        truncated="limits.max_audit_bytes_per_decision=1: cut rules (was 9 bytes)",
    )


async def test_the_store_counts_each_tenants_audit_bytes_per_day(any_store: Store) -> None:
    now = time.time()
    day = int(now // AUDIT_DAY_S)
    big = record("acme", now, [{"rule": "r", "reason": "x" * 5000}])
    await any_store.record_decision(big, [])
    await any_store.record_decision(record("acme", now), [], audit_bytes=1234)
    await any_store.record_decision(record("acme", now - AUDIT_DAY_S), [], audit_bytes=99)  # yesterday
    await any_store.record_decision(record("globex", now), [], audit_bytes=7)
    assert await any_store.audit_bytes("acme", day) == audit_size(big) + 1234
    assert await any_store.audit_bytes("acme", day - 1) == 99
    assert await any_store.audit_bytes("globex", day) == 7
    assert await any_store.audit_bytes("initech", day) == 0
    back = await any_store.get_decision("acme", big.decision_id)
    assert back.truncated == big.truncated  # the marker is stored with the record


@pytest.mark.e2e
def test_a_tiny_call_cannot_store_a_huge_audit_row_and_the_record_agrees_with_the_answer(
    tmp_path: Path, server_store_env: dict[str, str]
) -> None:
    with ServerProcess(tmp_path, env=server_store_env) as srv:
        with Client(srv.address, api_key=TENANT_KEYS["acme"]) as acme:
            acme.deploy_policy(bulky(), environment="production")
            answer = acme.evaluate("bulky", "a ~100-byte prompt", "and its response", timeout=60)
            rec = acme.get_decision(answer.decision_id)
        assert audit_size(rec) <= 256 * 1024  # the default limits.max_audit_bytes_per_decision
        assert rec.truncated.startswith("limits.max_audit_bytes_per_decision=262144: cut violations")
        assert "was " in rec.truncated
        # the verdict is whole and agrees with the answer
        assert (rec.passed, rec.action) == (answer.passed, answer.action.value)
        assert [r["rule"] for r in rec.rules] == [r.rule for r in answer.rules]
        assert [r["passed"] for r in rec.rules] == [r.passed for r in answer.rules]
        assert all(e["violations"] == BULKY_VIOLATIONS for r in rec.rules for e in r["evaluators"])  # counted, not lost
        assert rec.prompt == "a ~100-byte prompt"  # what fits is kept
        assert "Traceback" not in srv.log.read_text()


@pytest.mark.e2e
def test_a_tenant_at_its_daily_audit_quota_is_refused_before_evaluating_and_others_are_not(
    tmp_path: Path, server_store_env: dict[str, str]
) -> None:
    quota = 20_000
    with ServerProcess(
        tmp_path, env=server_store_env, extra=("--set", f"limits.max_audit_bytes_per_tenant_per_day={quota}")
    ) as srv:
        with (
            Client(srv.address, api_key=TENANT_KEYS["acme"]) as acme,
            Client(srv.address, api_key=TENANT_KEYS["globex"]) as globex,
        ):
            acme.deploy_policy(trivial("small"), environment="production")
            globex.deploy_policy(trivial("small"), environment="production")
            answered, refused = [], None
            for _ in range(200):  # bounded: ~1 KB per record, so the quota is reached well before
                try:
                    answered.append(acme.evaluate("small", "p", "r", timeout=30).decision_id)
                except QuotaExceededError as e:
                    refused = e
                    break
            assert refused is not None, "the daily audit quota never refused"
            assert refused.setting == "limits.max_audit_bytes_per_tenant_per_day"
            assert refused.code.value == "resource_exhausted" and not refused.retryable
            with pytest.raises(QuotaExceededError):  # and it stays refused
                acme.evaluate("small", "p", "r", timeout=30)
            recorded = {r.decision_id for r in acme.list_decisions(policy="small")}
            assert recorded == set(answered)  # every answered decision audited, nothing refused decided
            assert sum(audit_size(r) for r in acme.list_decisions(policy="small")) < quota + 2_000
            assert globex.evaluate("small", "p", "r", timeout=30).passed  # another tenant is served
        log = srv.log.read_text()
        assert "Traceback" not in log
        assert log.count("tenant acme: evaluations refused") == 1  # once a minute, not per call
        assert f"limits.max_audit_bytes_per_tenant_per_day ({quota})" in log
