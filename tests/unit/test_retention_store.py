"""Retained inputs on both store backends (``any_store``): written with the audit record, loaded
only for their tenant and while unexpired, erased by decision or context field (with a record of
the erasure), purged in bounded batches, tenant keys rewrapped during an operator-key rotation."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import os
import time

import pytest

from crossaudit.api.records import AuditRecord, OutboxRecord
from crossaudit.governance.retention import RetainedInputs, Retention
from crossaudit.governance.vault import OperatorKey, OperatorKeys
from crossaudit.kernel.canonical import sha256_text
from crossaudit.kernel.errors import InvalidInputError, NotFoundError, RetainedInputsTamperedError, RetentionKeyError
from crossaudit.kernel.results import Action, Decision, EvaluatorResult, RuleResult, Status
from crossaudit.outbox import decisionlog
from crossaudit.service.config import RetentionConfig
from crossaudit.service.grants import TenantGrants
from crossaudit.store.base import AUDIT_DAY_S, Store, audit_size
from orchestrator.policy import load_policy
from tests.records import audit_record

MARKER = "zq-retained-marker-7f3a"
DAY = 86_400.0
POLICY = load_policy('name: p\ndescription: d\nversion: "1.0"\n')


@pytest.fixture
def store(any_store: Store) -> Store:  # both backends (tests/conftest.py)
    return any_store


def op_key() -> OperatorKey:
    return OperatorKey.parse(base64.b64encode(os.urandom(32)).decode(), "test")


def retention(store: Store, keys: OperatorKeys | None = None, **config: object) -> Retention:
    grants = TenantGrants(retention={"acme": 7 * DAY, "globex": 7 * DAY})
    return Retention(store, grants, RetentionConfig(**config), keys=keys or OperatorKeys(op_key()))  # type: ignore[arg-type]


def decision(decision_id: str) -> Decision:
    results = [
        EvaluatorResult(evaluator="e1", kind="custom", status=Status.FAIL, score=0.2, passed=False, identity="id-e1"),
        EvaluatorResult(evaluator="e2", kind="custom", status=Status.PASS, score=0.9, passed=True, identity="id-e2"),
        EvaluatorResult(evaluator="broken", status=Status.ERROR, identity=""),  # built from nothing: no identity
    ]
    rule = RuleResult(rule="r", status=Status.FAIL, passed=False, score=0.2, threshold=0.5, evaluators=results)
    return Decision(
        policy="p", policy_version="1.0", passed=False, action=Action.BLOCK, rules=[rule], decision_id=decision_id
    )


def audit(decision_id: str, tenant: str, now: float, **kw: object) -> AuditRecord:
    return audit_record(
        decision_id,
        tenant,
        action="block",
        rules=[{"rule": "r", "evaluators": [{"evaluator": "e1", "violations": [f"quoted {MARKER}"]}]}],
        prompt_sha256=sha256_text(MARKER),
        response_sha256=sha256_text("r"),
        context_sha256=sha256_text("{}"),
        created_at=now,
        prompt=MARKER,  # raw text audited too (audit_all_evaluations)
        response="r",
        **kw,
    )


async def record(
    store: Store, ret: Retention, tenant: str, decision_id: str, context: dict, *, now: float | None = None
) -> AuditRecord:
    now = time.time() if now is None else now
    sealed = await ret.seal(
        tenant,
        POLICY,
        decision(decision_id),
        "production",
        f"{MARKER} prompt",
        "an answer",
        context,
        stage="output",
        now=now,
    )
    assert sealed is not None
    rec = audit(decision_id, tenant, now, inputs_retained_until=sealed.expires_at)
    log_copy = OutboxRecord(  # the decision log's copy of the record, raw text included
        id=f"log-{decision_id}",
        tenant=tenant,
        kind="decision_log:file",
        decision_id=decision_id,
        rule="",
        payload={**decisionlog.entry(rec)},
        created_at=now,
    )
    await store.record_decision(rec, [], [log_copy], audit_bytes=audit_size(rec) + sealed.size, retained=sealed)
    return rec


async def test_retained_inputs_load_for_their_tenant_with_every_result_by_identity(store: Store) -> None:
    ret = retention(store)
    rec = await record(store, ret, "acme", "d1", {"user_id": "u-1", "n": 3, "nested": {"a": 1}})
    got = await ret.load("acme", ["d1", "unknown", "d1"])
    assert list(got) == ["d1"]
    d = got["d1"]
    assert isinstance(d, RetainedInputs)
    assert (d.prompt, d.response, d.stage) == (f"{MARKER} prompt", "an answer", "output")
    assert d.context == {"user_id": "u-1", "n": 3, "nested": {"a": 1}}
    assert set(d.results) == {"id-e1", "id-e2"}
    assert EvaluatorResult.model_validate(d.results["id-e1"]) == decision("d1").rules[0].evaluators[0]
    assert (await store.get_decision("acme", "d1")).inputs_retained_until == rec.inputs_retained_until
    # another tenant's load of the same id: nothing (not an error that would confirm it exists)
    assert await ret.load("globex", ["d1"]) == {}
    assert await ret.load("acme", []) == {}


async def test_retained_bytes_count_toward_the_tenant_audit_quota(store: Store) -> None:
    ret = retention(store)
    now = time.time()
    rec = await record(store, ret, "acme", "d1", {}, now=now)
    [row] = await store.load_retained("acme", ["d1"], now)
    assert await store.audit_bytes("acme", int(now // AUDIT_DAY_S)) == audit_size(rec) + row.size + 0
    assert row.size > len(row.ciphertext) > len(MARKER)


async def test_a_load_is_bounded_by_its_named_setting(store: Store) -> None:
    ret = retention(store, max_load_ids=3)
    with pytest.raises(InvalidInputError, match=r"retention\.max_load_ids"):
        await ret.load("acme", ["a", "b", "c", "d"])


async def test_expired_inputs_are_never_loaded_and_the_purge_removes_them_in_batches(store: Store) -> None:
    ret = retention(store, purge_batch=2, max_purge_batches=2)
    past = time.time() - 8 * DAY  # sealed eight days ago for seven: expired, not yet purged
    for i in range(5):
        await record(store, ret, "acme", f"old{i}", {"user_id": "u-1"}, now=past)
    await record(store, ret, "acme", "new", {"user_id": "u-1"})
    assert list(await ret.load("acme", [*(f"old{i}" for i in range(5)), "new"])) == ["new"]
    assert await ret.purge_once() == 4  # two batches of two, then the run stops
    assert await ret.purge_once() == 1
    assert await ret.purge_once() == 0
    assert len(await store.load_retained("acme", ["new"], time.time())) == 1
    # the purged rows' index went with them: an erasure by that field now finds only the live one
    erased = await ret.erase("acme", actor="admin key", context_field=("user_id", "u-1"))
    assert erased.decisions == 1


async def test_erase_by_decision_removes_inputs_and_raw_text_and_records_it(store: Store) -> None:
    ret = retention(store)
    await record(store, ret, "acme", "d1", {"user_id": "u-1"})
    await record(store, ret, "acme", "d2", {"user_id": "u-1"})
    erasure = await ret.erase("acme", actor="admin 'dpo'", decision_id="d1")
    assert (erasure.tenant, erasure.selector_kind, erasure.decisions, erasure.actor) == (
        "acme",
        "decision",
        1,
        "admin 'dpo'",
    )
    assert "d1" not in erasure.selector_digest
    assert list(await ret.load("acme", ["d1", "d2"])) == ["d2"]
    rec = await store.get_decision("acme", "d1")
    assert rec.prompt is None and rec.response is None and rec.prompt_sha256 == sha256_text(MARKER)  # hashes stay
    assert rec.rules == [{"rule": "r", "evaluators": [{"evaluator": "e1", "violations": 1}]}]  # quoted text: counted
    copies = {m.decision_id: m.payload for m in await store.list_outbox("acme")}
    assert "prompt" not in copies["d1"] and "response" not in copies["d1"] and MARKER not in json.dumps(copies["d1"])
    assert copies["d1"]["rules"] == rec.rules and copies["d1"]["inputs_erased_at"] == erasure.created_at
    assert copies["d2"]["prompt"] == MARKER  # another decision's copy: untouched
    assert rec.inputs_erased_at == erasure.created_at
    assert (await store.get_decision("acme", "d2")).prompt == MARKER
    assert [e.id for e in await ret.list_erasures("acme")] == [erasure.id]


async def test_another_tenants_decision_id_erases_nothing(store: Store) -> None:
    ret = retention(store)
    await record(store, ret, "acme", "d1", {"user_id": "u-1"})
    with pytest.raises(NotFoundError, match="'d1' not found"):
        await ret.erase("globex", actor="admin key", decision_id="d1")
    by_field = await ret.erase("globex", actor="admin key", context_field=("user_id", "u-1"))
    assert by_field.decisions == 0
    assert list(await ret.load("acme", ["d1"])) == ["d1"]
    assert (await store.get_decision("acme", "d1")).prompt == MARKER
    assert await ret.list_erasures("acme") == [] and len(await ret.list_erasures("globex")) == 1


async def test_erase_by_context_field_matches_text_and_numbers_and_never_stores_the_value(store: Store) -> None:
    ret = retention(store)
    await record(store, ret, "acme", "a", {"user_id": "u-1", "account": 42})
    await record(store, ret, "acme", "b", {"user_id": "u-2", "account": 42.0})
    await record(store, ret, "acme", "c", {"user_id": "u-1"})
    await record(store, ret, "acme", "d", {"profile": {"user_id": "u-1"}})  # nested: not a top-level field
    erasure = await ret.erase("acme", actor="admin key", context_field=("user_id", "u-1"))
    assert (erasure.selector_kind, erasure.decisions) == ("context_field", 2)
    assert "u-1" not in repr(erasure)
    assert sorted(await ret.load("acme", ["a", "b", "c", "d"])) == ["b", "d"]
    assert (await ret.erase("acme", actor="admin key", context_field=("account", "42"))).decisions == 1  # b
    assert sorted(await ret.load("acme", ["a", "b", "c", "d"])) == ["d"]
    assert (await ret.erase("acme", actor="admin key", context_field=("user_id", "u-1"))).decisions == 0
    for e in await ret.list_erasures("acme"):  # a keyed digest of the selector, never its value
        assert "u-1" not in repr(e) and len(e.selector_digest) == 64


async def test_many_context_fields_cannot_push_an_erasure_field_out_of_the_index(store: Store) -> None:
    """Exploit: the index holds max_index_fields fields by name; an end user who controls the
    context's field names sends 'a0'...'a9' to hide 'user_id' from a data-subject erasure. The
    fields of retention.erasure_fields are always indexed first."""
    ret = retention(store, max_index_fields=4)
    crowd = {f"a{i}": "x" for i in range(10)}
    await record(store, ret, "acme", "hidden", {**crowd, "user_id": "u-9"})
    erasure = await ret.erase("acme", actor="admin key", context_field=("user_id", "u-9"))
    assert erasure.decisions == 1
    assert await ret.load("acme", ["hidden"]) == {}


async def test_erase_needs_exactly_one_selector(store: Store) -> None:
    ret = retention(store)
    for kw in ({}, {"decision_id": "d", "context_field": ("a", "b")}):
        with pytest.raises(InvalidInputError, match="exactly one"):
            await ret.erase("acme", actor="a", **kw)  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="field name"):
        await ret.erase("acme", actor="a", context_field=("", "v"))


async def test_a_row_moved_to_another_decision_or_tenant_is_a_typed_error_never_garbage(store: Store) -> None:
    ret = retention(store)
    await record(store, ret, "acme", "d1", {})
    await record(store, ret, "globex", "g0", {})  # globex has a key of its own
    [row] = await store.load_retained("acme", ["d1"], time.time())
    await store.record_decision(
        audit("d3", "acme", time.time()), [], retained=dataclasses.replace(row, decision_id="d3")
    )
    moved = dataclasses.replace(row, tenant="globex", decision_id="g1")
    await store.record_decision(audit("g1", "globex", time.time()), [], retained=moved)
    with pytest.raises(RetainedInputsTamperedError, match="d3") as e:
        await ret.load("acme", ["d3"])
    assert MARKER not in e.value.message
    with pytest.raises(RetainedInputsTamperedError, match="g1") as e:
        await ret.load("globex", ["g1"])
    assert MARKER not in e.value.message
    assert list(await ret.load("acme", ["d1"])) == ["d1"]  # the original is untouched


async def test_without_an_operator_key_nothing_is_retained(store: Store) -> None:
    ret = Retention(store, TenantGrants(retention={"acme": 7 * DAY}), RetentionConfig())
    assert not ret.enabled and ret.period("acme", POLICY) == 0.0
    sealed = await ret.seal("acme", POLICY, decision("d1"), "production", MARKER, "r", {}, stage="", now=time.time())
    assert sealed is None
    with pytest.raises(RetentionKeyError, match="no operator key"):
        await ret.erase("acme", actor="a", context_field=("user_id", "u"))


async def test_a_policy_shortens_or_turns_off_its_tenants_retention(store: Store) -> None:
    ret = retention(store)
    short = load_policy('name: p\ndescription: d\nversion: "1.0"\nsettings: {retention: {inputs: 12h}}\n')
    off = load_policy('name: p\ndescription: d\nversion: "1.0"\nsettings: {retention: {inputs: "off"}}\n')
    longer = load_policy('name: p\ndescription: d\nversion: "1.0"\nsettings: {retention: {inputs: 90d}}\n')
    assert ret.period("acme", short) == 12 * 3600 and ret.period("acme", off) == 0.0
    assert ret.period("acme", longer) == 7 * DAY and ret.period("initech", longer) == 0.0
    now = time.time()
    sealed = await ret.seal("acme", short, decision("d"), "production", "p", "r", {}, stage="", now=now)
    assert sealed is not None and sealed.expires_at == now + 12 * 3600
    assert await ret.seal("acme", off, decision("d"), "production", "p", "r", {}, stage="", now=now) is None


async def test_inputs_over_the_named_size_are_not_retained(store: Store) -> None:
    ret = retention(store, max_inputs_bytes_per_decision=1024)
    assert (
        await ret.seal("acme", POLICY, decision("d"), "production", "x" * 2000, "", {}, stage="", now=time.time())
        is None
    )


async def test_rotation_rewraps_tenant_keys_and_a_wrong_key_is_named(store: Store) -> None:
    old, new = op_key(), op_key()
    before = retention(store, OperatorKeys(old))
    await record(store, before, "acme", "d1", {"user_id": "u-1"})
    await record(store, before, "globex", "g1", {})

    wrong = retention(store, OperatorKeys(new))
    with pytest.raises(RetentionKeyError, match=old.id):
        await wrong.load("acme", ["d1"])

    rotating = retention(store, OperatorKeys(new, previous=old))
    assert await rotating.rotate() == 2
    assert (await store.get_tenant_key("acme")).operator_key_id == new.id  # type: ignore[union-attr]
    after = retention(store, OperatorKeys(new))  # the old key is no longer needed
    assert (await after.load("acme", ["d1"]))["d1"].prompt == f"{MARKER} prompt"
    assert list(await after.load("globex", ["g1"])) == ["g1"]
    assert (await after.erase("acme", actor="a", context_field=("user_id", "u-1"))).decisions == 1  # same index key


async def test_two_writers_creating_a_tenant_key_agree_on_one(store: Store) -> None:
    keys = OperatorKeys(op_key())
    a, b = retention(store, keys), retention(store, keys)  # two replicas, each without the key cached
    await asyncio.gather(record(store, a, "acme", "d1", {}), record(store, b, "acme", "d2", {}))
    assert sorted(await a.load("acme", ["d1", "d2"])) == ["d1", "d2"]
    assert sorted(await b.load("acme", ["d1", "d2"])) == ["d1", "d2"]
