"""Upload quotas per tenant: nothing bounded how many evaluators a tenant stores or how much code
they hold (every upload of changed code is a new stored version). Now a new version beyond
``limits.max_evaluators_per_tenant``, or taking the tenant's stored code past
``limits.max_evaluator_code_bytes_per_tenant``, is RESOURCE_EXHAUSTED naming the setting;
re-uploading identical code stays free, and other tenants are untouched. The store's part runs
on both backends; the rest through a real server, on both backends."""

from __future__ import annotations

from pathlib import Path

import pytest

from crossaudit import Client
from crossaudit.kernel.errors import QuotaExceededError
from crossaudit.store.base import EVALUATOR_CODE_QUOTA, EVALUATORS_QUOTA, Store, sha256_text
from tests.e2e.conftest import TENANT_KEYS, ServerProcess

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


@pytest.fixture(params=["sqlite", "postgresql"])
def store_env(request: pytest.FixtureRequest) -> dict[str, str]:
    if request.param == "sqlite":
        return {}
    return {"CROSSAUDIT_STORE_URL": request.getfixturevalue("postgres_url")}


@pytest.mark.e2e
def test_uploads_beyond_a_tenants_quotas_are_refused_through_a_real_server(
    tmp_path: Path, store_env: dict[str, str]
) -> None:
    srv = ServerProcess(
        tmp_path,
        env=store_env,
        extra=(
            "--set",
            "limits.max_evaluators_per_tenant=5",
            "--set",
            "limits.max_evaluator_code_bytes_per_tenant=20000",
        ),
    )
    srv.start()
    try:
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
    finally:
        srv.stop()
