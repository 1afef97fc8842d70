"""Quotas per tenant. Uploads: nothing bounded how many evaluators a tenant stores or how much code
they hold (every upload of changed code is a new stored version). Now a new version beyond
``limits.max_evaluators_per_tenant``, or taking the tenant's stored code past
``limits.max_evaluator_code_bytes_per_tenant``, is RESOURCE_EXHAUSTED naming the setting;
re-uploading identical code stays free, and other tenants are untouched. Open reviews: a
decision whose reviews would pass ``limits.max_open_reviews_per_tenant`` is answered and
audited, its reviews not opened and its audit saying so. The store's part runs
on both backends; the rest through a real server, on both backends."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest

from crossaudit import Client
from crossaudit.api.records import AuditRecord, ReviewRecord
from crossaudit.kernel.canonical import sha256_text
from crossaudit.kernel.errors import QuotaExceededError
from crossaudit.store.base import (
    EVALUATOR_CODE_QUOTA,
    EVALUATORS_QUOTA,
    OPEN_REVIEWS_QUOTA,
    Store,
)
from tests.e2e.conftest import TENANT_KEYS, ServerProcess
from tests.e2e.policies import custom_policy, returns
from tests.records import audit_record, review_record

pytestmark = pytest.mark.security


def code(i: int, pad: int = 0) -> str:
    return f"def evaluate(prompt, response, context):\n    return {{'score': 1.0}}  # {i} {'é' * pad}\n"


async def put(store: Store, tenant: str, name: str, src: str, **quota: int) -> bool:
    _, created = await store.put_evaluator(
        tenant, name=name, code=src, language="python", dependencies=(), digest=sha256_text(src), **quota
    )
    return created


async def test_the_store_caps_each_tenants_evaluator_versions_and_code_bytes(any_store: Store) -> None:
    for i in range(3):
        assert await put(any_store, "acme", f"e{i}", code(i), max_versions=3)
    with pytest.raises(QuotaExceededError) as err:
        await put(any_store, "acme", "e0", code(99), max_versions=3)  # a new version counts too
    assert err.value.setting == EVALUATORS_QUOTA and EVALUATORS_QUOTA in str(err.value)
    assert not await put(any_store, "acme", "e0", code(0), max_versions=3)  # identical code: no new row
    assert await put(any_store, "globex", "e0", code(0), max_versions=3)  # per tenant
    # bytes, not characters: 'é' is two bytes in UTF-8
    stored = sum(len(code(i).encode()) for i in range(3))
    big = code(7, pad=500)
    limit = stored + len(big.encode()) - 1
    with pytest.raises(QuotaExceededError) as err:
        await put(any_store, "acme", "big", big, max_code_bytes=limit)
    assert err.value.setting == EVALUATOR_CODE_QUOTA and EVALUATOR_CODE_QUOTA in str(err.value)
    assert await put(any_store, "acme", "big", big, max_code_bytes=limit + 1)
    assert len(await any_store.list_evaluators("acme")) == 4


@pytest.mark.e2e
def test_uploads_beyond_a_tenants_quotas_are_refused_through_a_real_server(
    tmp_path: Path, server_store_env: dict[str, str]
) -> None:
    with ServerProcess(
        tmp_path,
        env=server_store_env,
        extra=(
            "--set",
            "limits.max_evaluators_per_tenant=5",
            "--set",
            "limits.max_evaluator_code_bytes_per_tenant=20000",
        ),
    ) as srv:
        with (
            Client(srv.address, api_key=TENANT_KEYS["acme"]) as acme,
            Client(srv.address, api_key=TENANT_KEYS["globex"]) as globex,
        ):
            stored, refused = 0, None
            for i in range(20):  # bounded: the quota is 5
                try:
                    acme.upload_evaluator(f"e{i}", code(i), timeout=60)
                    stored += 1
                except QuotaExceededError as e:
                    refused = e
                    break
            assert stored == 5 and refused is not None
            assert refused.setting == "limits.max_evaluators_per_tenant"
            assert refused.code.value == "resource_exhausted" and not refused.retryable
            acme.upload_evaluator("e0", code(0), timeout=60)  # identical code: still answered
            with pytest.raises(QuotaExceededError) as err:
                globex.upload_evaluator("huge", code(1, pad=10_000), timeout=60)  # ~20 KB of code
            assert err.value.setting == "limits.max_evaluator_code_bytes_per_tenant"
            globex.upload_evaluator("small", code(1), timeout=60)  # another tenant is served
        assert "Traceback" not in srv.log.read_text()


# --- open reviews -------------------------------------------------------------------------

# every answer goes to a reviewer
REVIEW_POLICY = custom_policy(
    "reviewed", returns('{"score": 0.0}'), evaluator="doubt", rules=["check"], action="require_review"
)


def decision(tenant: str) -> tuple[AuditRecord, list[ReviewRecord]]:
    now = time.time()
    did = str(uuid.uuid4())
    audit = audit_record(
        did, tenant, action="require_review", created_at=now,
        rules=[{"rule": "check", "passed": False, "action": "require_review"}, {"rule": "other", "passed": True}],
    )
    review = review_record(did, tenant, rule="check", created_at=now)
    return audit, [review]


async def test_the_store_opens_no_review_past_a_tenants_quota_and_keeps_the_decision(any_store: Store) -> None:
    written = []
    for _ in range(5):
        audit, reviews = decision("acme")
        await any_store.record_decision(audit, reviews, max_open_reviews=3)
        written.append(audit.decision_id)
    other, reviews = decision("globex")
    await any_store.record_decision(other, reviews, max_open_reviews=3)
    assert len(await any_store.list_reviews("acme")) == 3
    assert len(await any_store.list_reviews("globex")) == 1  # per tenant
    for i, did in enumerate(written):  # every decision is audited
        rec = await any_store.get_decision("acme", did)
        note = rec.rules[0].get("review_not_opened")
        if i < 3:
            assert note is None
        else:
            assert note == f"{OPEN_REVIEWS_QUOTA}=3: the tenant had 3 open reviews"
        assert "review_not_opened" not in rec.rules[1]  # only the rule that asked for one


@pytest.mark.e2e
def test_decisions_past_the_open_review_quota_are_answered_and_audited_through_a_real_server(
    tmp_path: Path, server_store_env: dict[str, str]
) -> None:
    with ServerProcess(tmp_path, env=server_store_env, extra=("--set", "limits.max_open_reviews_per_tenant=3")) as srv:
        with (
            Client(srv.address, api_key=TENANT_KEYS["acme"]) as acme,
            Client(srv.address, api_key=TENANT_KEYS["globex"]) as globex,
        ):
            acme.deploy_policy(REVIEW_POLICY, environment="production")
            globex.deploy_policy(REVIEW_POLICY, environment="production")
            answers = [acme.evaluate("reviewed", "p", "r", timeout=60) for _ in range(6)]  # bounded: 6 calls
            assert [a.action.value for a in answers] == ["require_review"] * 6  # every one answered
            assert len(acme.list_reviews()) == 3
            audited = [acme.get_decision(a.decision_id) for a in answers]  # and audited
            notes = [r.rules[0].get("review_not_opened") for r in audited]
            assert notes[:3] == [None] * 3
            assert all(n and n.startswith("limits.max_open_reviews_per_tenant=3") for n in notes[3:])
            # the answer agrees with the store: it names the reviews that opened, and only those
            assert [len(a.review_ids) for a in answers] == [1, 1, 1, 0, 0, 0]
            assert {i for a in answers for i in a.review_ids} == {r.id for r in acme.list_reviews()}
            globex.evaluate("reviewed", "p", "r", timeout=60)
            assert len(globex.list_reviews()) == 1  # another tenant's reviews still open
        assert "Traceback" not in srv.log.read_text()
