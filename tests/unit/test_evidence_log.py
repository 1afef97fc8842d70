"""The decision log on both stores: a clean log verifies; a row edited, deleted, inserted or
reordered straight in the database is named by its sequence number; a checkpoint signed by
another key is refused; erasure keeps the log verifiable; a crash before a checkpoint loses
nothing; replicas writing at once make one log; an export verifies offline and fails after a
one-byte change."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sqlite3
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from crossaudit.api.records import ErasureRecord
from crossaudit.evidence.bundle import BundleError, verify_bundle
from crossaudit.evidence.export import export_chunks
from crossaudit.evidence.leaf import leaf_document
from crossaudit.evidence.merkle import leaf_hash
from crossaudit.evidence.notes import generate_private_pem, load_signing_key
from crossaudit.evidence.verify import ChunkVerifier, LogChunk, Report
from crossaudit.governance.evidence import EvidenceLog
from crossaudit.kernel.errors import ConfigurationError, LogForkError
from crossaudit.service.config import EvidenceConfig
from crossaudit.service.shared import WITNESS_DIR, Witness
from crossaudit.store import SQLiteStore
from crossaudit.store.base import Store
from tests.records import audit_record

KEY = load_signing_key(generate_private_pem(), "crossaudit", "test key")
OTHER_KEY = load_signing_key(generate_private_pem(), "crossaudit", "another key")
Execute = Callable[[str, tuple[Any, ...]], None]


@dataclasses.dataclass
class Db:
    stores: list[Store]
    execute: Execute  # SQL straight on the database, as an operator (or an attacker) with access would
    url: str  # what `crossaudit audit verify --store` takes

    @property
    def store(self) -> Store:
        return self.stores[0]


@pytest.fixture(params=["sqlite", "postgresql"])
async def db(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Db]:
    if request.param == "sqlite":
        path = tmp_path / "db.sqlite"
        url = ""
        stores: list[Store] = [SQLiteStore(path), SQLiteStore(path)]

        def execute(sql: str, args: tuple[Any, ...] = ()) -> None:
            with sqlite3.connect(path) as c:
                c.execute(sql, args)

    else:
        import psycopg

        from crossaudit.store.postgres import PostgresStore

        url = request.getfixturevalue("postgres_url")
        stores = [PostgresStore(url), PostgresStore(url)]

        def execute(sql: str, args: tuple[Any, ...] = ()) -> None:
            with psycopg.connect(url) as c:
                c.execute(sql.replace("?", "%s"), args)

    yield Db(stores, execute, str(path) if request.param == "sqlite" else url)
    for s in stores:
        await s.aclose()


async def write(store: Store, n: int, tenant: str = "acme", **fields: Any) -> list[str]:
    ids = []
    for i in range(n):
        rec = audit_record(tenant=tenant, created_at=1_000.0 + i, **fields)
        await store.record_decision(rec, [])
        ids.append(rec.decision_id)
    return ids


async def chunks(log: EvidenceLog, tenant: str, **options: Any) -> list[LogChunk]:
    return [c async for c in log.read(tenant, **options)]


async def verify(store: Store, tenant: str = "acme", key: Any = KEY) -> Report:
    log = EvidenceLog(store, key=None, trusted=[key.public])  # a verifier holds the public key only
    checker = ChunkVerifier(log.trusted)
    for chunk in await chunks(log, tenant, outside=True):
        checker.feed(chunk)
    return checker.finish()


async def signed(db: Db, n: int = 10, tenant: str = "acme") -> tuple[EvidenceLog, list[str]]:
    ids = await write(db.store, n, tenant)
    log = EvidenceLog(db.store, EvidenceConfig(), key=KEY)
    assert (await log.checkpoint(tenant)).size == n  # type: ignore[union-attr]
    return log, ids


async def test_a_clean_log_verifies_with_every_record_signed(db: Db) -> None:
    await signed(db, 10)
    await write(db.store, 3, "globex")
    report = await verify(db.store)
    assert report.ok, report.findings
    assert (report.records, report.covered, report.uncovered) == (10, 10, 0)
    assert report.keys == {KEY.public.key_id}


async def test_an_edited_record_is_named_by_its_sequence_number(db: Db) -> None:
    await signed(db)
    db.execute("UPDATE decisions SET passed=1 WHERE tenant=? AND log_seq=?", ("acme", 4))
    report = await verify(db.store)
    assert not report.ok and report.first_bad is not None
    assert (report.first_bad.seq, report.first_bad.kind) == (4, "edited")


async def test_a_deleted_record_is_named(db: Db) -> None:
    await signed(db)
    db.execute("DELETE FROM decisions WHERE tenant=? AND log_seq=?", ("acme", 6))
    report = await verify(db.store)
    assert (report.first_bad.seq, report.first_bad.kind) == (6, "deleted")  # type: ignore[union-attr]


async def test_the_last_record_deleted_is_named_too(db: Db) -> None:
    await signed(db)
    db.execute("DELETE FROM decisions WHERE tenant=? AND log_seq=?", ("acme", 9))
    report = await verify(db.store)
    assert (report.first_bad.seq, report.first_bad.kind) == (9, "deleted")  # type: ignore[union-attr]


INSERT_COPY = (
    "INSERT INTO decisions (decision_id, tenant, policy, policy_revision, policy_version, policy_digest, "
    "environment, passed, action, rules, errored_rules, latency_ms, prompt_sha256, response_sha256, "
    "context_sha256, request_id, created_at, truncated, receipt, log_seq, leaf_hash) "
    "SELECT ?, tenant, policy, policy_revision, policy_version, policy_digest, environment, 1, 'allow', rules, "
    "errored_rules, latency_ms, prompt_sha256, response_sha256, context_sha256, request_id, created_at, truncated, "
    "receipt, {seq}, leaf_hash FROM decisions WHERE tenant='acme' AND log_seq=1"
)


async def test_an_inserted_record_is_named(db: Db) -> None:
    await signed(db)
    db.execute(INSERT_COPY.format(seq="NULL"), ("forged-outside",))
    report = await verify(db.store)
    assert report.counts == {"inserted": 1}
    assert report.findings[0].decision_id == "forged-outside" and report.findings[0].seq is None
    db.execute("DELETE FROM decisions WHERE decision_id='forged-outside'")
    db.execute(INSERT_COPY.format(seq="10"), ("forged-past-head",))  # the next number, the head untouched
    report = await verify(db.store)
    assert (report.first_bad.seq, report.first_bad.kind) == (10, "inserted")  # type: ignore[union-attr]


async def test_a_record_slipped_in_by_renumbering_those_after_it_is_named(db: Db) -> None:
    await signed(db)
    db.execute("UPDATE decisions SET log_seq=-log_seq-1 WHERE tenant='acme' AND log_seq>=5")
    db.execute("UPDATE decisions SET log_seq=-log_seq WHERE tenant='acme' AND log_seq<0")
    db.execute(INSERT_COPY.format(seq="5"), ("forged-middle",))
    db.execute("UPDATE log_heads SET size=size+1 WHERE tenant='acme'")
    report = await verify(db.store)
    assert report.first_bad.seq == 5  # type: ignore[union-attr]
    assert report.counts.get("reordered", 0) >= 5  # each record after it hashes under its old number


async def test_two_records_swapped_are_named_as_reordered(db: Db) -> None:
    await signed(db)
    db.execute("UPDATE decisions SET log_seq=-1 WHERE tenant='acme' AND log_seq=2")
    db.execute("UPDATE decisions SET log_seq=2 WHERE tenant='acme' AND log_seq=7")
    db.execute("UPDATE decisions SET log_seq=7 WHERE tenant='acme' AND log_seq=-1")
    report = await verify(db.store)
    assert report.counts == {"reordered": 2, "checkpoint": 1}
    assert (report.first_bad.seq, report.first_bad.kind) == (2, "reordered")  # type: ignore[union-attr]


async def test_a_record_rewritten_with_its_leaf_fails_against_the_signed_root(db: Db) -> None:
    """An attacker who knows the leaf format recomputes the stored leaf too: only the signed
    root shows it, and verify names the range the checkpoint covers."""
    await signed(db)
    row = next(c for c in await chunks(EvidenceLog(db.store, key=None), "acme") if c.entries)
    entry = row.entries[3][0]
    doc = json.loads(entry.document)
    db.execute("UPDATE decisions SET action='allow' WHERE tenant='acme' AND log_seq=3")
    rows = await db.store.log_rows("acme", start=3, limit=1)
    forged = leaf_hash(leaf_document(rows[0].values, 3)).hex()
    db.execute("UPDATE decisions SET leaf_hash=? WHERE tenant='acme' AND log_seq=3", (forged,))
    assert doc["action"] != "allow"
    report = await verify(db.store)
    assert report.counts == {"checkpoint": 1}
    assert report.first_bad.seq == 0 and "checkpoint 10" in report.first_bad.detail  # type: ignore[union-attr]


async def test_a_checkpoint_signed_by_another_key_is_refused(db: Db) -> None:
    await signed(db, 5)
    await write(db.store, 3)
    # a server given another key (it extends only checkpoints it can check: the first key is trusted too)
    impostor = EvidenceLog(db.store, EvidenceConfig(), key=OTHER_KEY, trusted=[OTHER_KEY.public, KEY.public])
    assert await impostor.checkpoint("acme") is not None
    report = await verify(db.store)
    assert report.counts == {"checkpoint": 1}
    assert "not a trusted key" in report.findings[0].detail and report.findings[0].seq == 8


async def test_another_tenants_checkpoint_does_not_vouch_for_this_log(db: Db) -> None:
    await signed(db, 4, "acme")
    await signed(db, 4, "globex")
    db.execute("DELETE FROM log_checkpoints WHERE tenant='acme'")
    db.execute("UPDATE log_checkpoints SET tenant='acme' WHERE tenant='globex'")
    report = await verify(db.store)
    assert "another log" in report.findings[0].detail


async def test_a_crash_before_the_checkpoint_loses_nothing(db: Db) -> None:
    """Decisions written by a server that died before signing them are signed by the next start."""
    await signed(db, 5)
    await write(db.stores[1], 7)  # another process: committed, never checkpointed
    restarted = EvidenceLog(db.store, EvidenceConfig(), key=KEY)
    assert await restarted.checkpoint_all() == 1
    report = await verify(db.store)
    assert report.ok and report.covered == 12


async def test_replicas_writing_at_once_make_one_log(db: Db) -> None:
    async def one(store: Store, i: int) -> None:
        await store.record_decision(audit_record(tenant="acme", created_at=2_000.0 + i), [])

    await asyncio.gather(*(one(db.stores[i % 2], i) for i in range(60)))
    await EvidenceLog(db.store, EvidenceConfig(), key=KEY).checkpoint("acme")
    report = await verify(db.store)
    assert report.ok and report.records == 60 and report.covered == 60


async def test_erasing_retained_text_keeps_the_log_verifiable(db: Db) -> None:
    rules = [{"rule": "r", "evaluators": [{"evaluator": "e", "violations": ["a quoted secret"]}]}]
    rec = audit_record(tenant="acme", rules=rules, prompt="my secret", response="its answer")
    await db.store.record_decision(rec, [])
    await EvidenceLog(db.store, EvidenceConfig(), key=KEY).checkpoint("acme")
    erasure = ErasureRecord("er1", "acme", "decision", "x", 0, time.time(), "admin")
    await db.store.erase_inputs(erasure, decision_id=rec.decision_id)
    erased = await db.store.get_decision("acme", rec.decision_id)
    assert erased.prompt is None and erased.rules[0]["evaluators"][0]["violations"] == 1
    assert (await verify(db.store)).ok


async def test_an_export_verifies_offline_and_fails_after_a_one_byte_change(db: Db, tmp_path: Path) -> None:
    log, _ = await signed(db, 12)
    out = tmp_path / "bundle"
    report = export_chunks(await chunks(log, "acme", details=True), out, KEY.public, [KEY.public], False)
    assert report.ok
    assert verify_bundle(out, [KEY.public]).ok
    assert not verify_bundle(out, [OTHER_KEY.public]).ok  # the bundle's own key.pem is not trusted
    for name in ("records.jsonl", "leaves.txt", "details.jsonl", "checkpoints.json"):
        path = out / name
        original = path.read_bytes()
        i = len(original) // 2
        flipped = original[:i] + bytes([original[i] ^ 0x01]) + original[i + 1 :]
        path.write_bytes(flipped)
        try:
            result = verify_bundle(out, [KEY.public])
            assert not result.ok, name
        except BundleError:
            pass  # a change that breaks the file's structure is refused as unreadable: a failure too
        path.write_bytes(original)
    assert verify_bundle(out, [KEY.public]).ok


async def test_an_export_of_a_range_is_proved_in_a_later_checkpoint(db: Db, tmp_path: Path) -> None:
    log, _ = await signed(db, 20)
    out = tmp_path / "bundle"
    # records created at 1005..1011 are seq 5..11; the only checkpoint is of 20
    parts = await chunks(log, "acme", since=1_005.0, until=1_012.0, details=True)
    report = export_chunks(parts, out, KEY.public, [KEY.public], True)
    assert report.ok and report.records == 7 and report.covered == 20
    offline = verify_bundle(out, [KEY.public])
    assert offline.ok and offline.records == 7 and offline.checkpoints == 1


async def test_the_checkpointer_never_signs_on_top_of_a_forged_checkpoint_row(db: Db) -> None:
    """Someone with write access to the database rewrites the latest checkpoint's stored edge (or
    deletes the checkpoints) so that the next signature would cover a history of their making:
    the server refuses to sign rather than extend it."""
    log, _ = await signed(db, 8)
    await write(db.store, 3)
    forged = json.dumps([leaf_hash(b"forged").hex()])  # a tree of 8 leaves has one perfect subtree
    db.execute("UPDATE log_checkpoints SET frontier=? WHERE tenant='acme' AND size=8", (forged,))
    fresh = EvidenceLog(db.store, EvidenceConfig(), key=KEY)
    assert await fresh.checkpoint("acme") is None
    db.execute("DELETE FROM log_checkpoints WHERE tenant='acme'")
    assert await log.checkpoint("acme") is None  # this process signed 8: the log cannot start over
    assert (await db.store.latest_checkpoint("acme")) is None


async def _forge(db: Db, seq: int) -> None:
    db.execute("UPDATE decisions SET action='allow', passed=0 WHERE tenant='acme' AND log_seq=?", (seq,))
    rows = await db.store.log_rows("acme", start=seq, limit=1)
    forged = leaf_hash(leaf_document(rows[0].values, seq)).hex()
    db.execute("UPDATE decisions SET leaf_hash=? WHERE tenant='acme' AND log_seq=?", (forged, seq))


async def test_every_worker_and_every_restart_refuses_to_sign_over_a_deleted_newest_checkpoint(
    db: Db, tmp_path: Path
) -> None:
    """The witness in the data dir: worker X signs 10 and 20; 20 is deleted and record 15 rewritten
    with its leaf; worker O (which signed nothing), X itself and a restarted server all refuse,
    typed, naming the checkpoint, and nothing is stored."""
    data = tmp_path / "data"
    x = EvidenceLog(db.stores[0], EvidenceConfig(), key=KEY, witness=Witness(data))
    o = EvidenceLog(db.stores[1], EvidenceConfig(), key=KEY, witness=Witness(data))
    await write(db.store, 10)
    assert (await x.checkpoint("acme")).size == 10  # type: ignore[union-attr]
    await write(db.store, 10)
    assert (await x.checkpoint("acme")).size == 20  # type: ignore[union-attr]
    assert await o.checkpoint("acme") is None  # nothing new: O agrees
    witness = data / WITNESS_DIR
    assert witness.stat().st_mode & 0o777 == 0o700
    assert {p.stat().st_mode & 0o777 for p in witness.iterdir()} == {0o600}
    db.execute("DELETE FROM log_checkpoints WHERE tenant='acme' AND size=20")
    await _forge(db, 15)
    restarted = EvidenceLog(db.store, EvidenceConfig(), key=KEY, witness=Witness(data))
    for signer in (o, x, restarted):
        with pytest.raises(LogForkError, match="no longer holds checkpoint 20"):
            await signer.checkpoint("acme")
        with pytest.raises(LogForkError):
            await chunks(signer, "acme")  # a read (verify, export) says it too, never signs
    assert (await db.store.latest_checkpoint("acme")).size == 10  # type: ignore[union-attr]
    assert await restarted.checkpoint_all() == 0  # the worker's loop logs it and signs the others


async def test_a_checkpoint_that_forks_below_the_witnessed_one_is_refused(db: Db, tmp_path: Path) -> None:
    """A sibling that stored a checkpoint and died before remembering it is taken up; a larger
    checkpoint another signer (a replica without this data dir) made over a rewritten history,
    the witnessed checkpoint put back beside it, is refused."""
    data = tmp_path / "data"
    mine = EvidenceLog(db.store, EvidenceConfig(), key=KEY, witness=Witness(data))
    await write(db.store, 10)
    assert (await mine.checkpoint("acme")).size == 10  # type: ignore[union-attr]
    await write(db.store, 5)
    assert (await EvidenceLog(db.store, EvidenceConfig(), key=KEY).checkpoint("acme")).size == 15  # type: ignore[union-attr]
    await write(db.store, 5)
    assert (await mine.checkpoint("acme")).size == 20  # type: ignore[union-attr]  # 15 extends 10: taken up
    assert Witness(data).get("acme")[0] == 20  # type: ignore[index]
    saved = await db.store.list_checkpoints("acme", limit=10)
    db.execute("DELETE FROM log_checkpoints WHERE tenant='acme'")
    await _forge(db, 5)
    await write(db.store, 5)
    assert (await EvidenceLog(db.store, EvidenceConfig(), key=KEY).checkpoint("acme")).size == 25  # type: ignore[union-attr]
    for rec in saved:
        await db.store.add_checkpoint(rec)  # the genuine ones back, beside the forged 25
    with pytest.raises(LogForkError, match="checkpoint 25 in the store does not extend checkpoint 20"):
        await mine.checkpoint("acme")


async def test_a_witness_that_does_not_parse_stops_that_logs_signing_typed(db: Db, tmp_path: Path) -> None:
    data = tmp_path / "data"
    signer = EvidenceLog(db.store, EvidenceConfig(), key=KEY, witness=Witness(data))
    await write(db.store, 4)
    await write(db.store, 4, "globex")
    assert await signer.checkpoint_all() == 2
    for p in (data / WITNESS_DIR).iterdir():
        if not p.name.startswith(".") and json.loads(p.read_text())["tenant"] == "acme":
            p.write_text("{not json")
    await write(db.store, 2)
    await write(db.store, 2, "globex")
    with pytest.raises(ConfigurationError, match="does not parse"):
        await signer.checkpoint("acme")
    assert await signer.checkpoint_all() == 1  # globex is still signed; acme waits for its operator


async def test_a_witness_nested_past_the_recursion_limit_is_a_typed_refusal(db: Db, tmp_path: Path) -> None:
    data = tmp_path / "data"
    signer = EvidenceLog(db.store, EvidenceConfig(), key=KEY, witness=Witness(data))
    await write(db.store, 4)
    assert (await signer.checkpoint("acme")).size == 4  # type: ignore[union-attr]
    [path] = [p for p in (data / WITNESS_DIR).iterdir() if not p.name.startswith(".")]
    path.write_text("[" * 4000)  # under the file's size limit, past the parser's recursion limit
    await write(db.store, 2)
    with pytest.raises(ConfigurationError, match="does not parse"):
        await signer.checkpoint("acme")


async def test_a_checkpoint_up_to_below_the_witnessed_one_is_not_a_fork(db: Db, tmp_path: Path) -> None:
    """A read (export, audit verify) signs exactly the records it read (``upto``): a checkpoint
    the witness holds above that is no fork, and the witness is not moved back."""
    data = tmp_path / "data"
    signer = EvidenceLog(db.store, EvidenceConfig(), key=KEY, witness=Witness(data))
    await write(db.store, 10)
    assert (await signer.checkpoint("acme")).size == 10  # type: ignore[union-attr]
    await write(db.store, 5)
    assert (await signer.checkpoint("acme")).size == 15  # type: ignore[union-attr]
    assert (await signer.checkpoint("acme", upto=12)).size == 12  # type: ignore[union-attr]
    assert Witness(data).get("acme")[0] == 15  # type: ignore[index]
    assert (await verify(db.store)).ok


async def test_a_read_racing_a_sibling_signer_is_not_a_fork(db: Db, tmp_path: Path) -> None:
    """Worker A reads (export, verify) while worker B (same data dir) signs newer decisions."""
    data = tmp_path / "data"
    a = EvidenceLog(db.stores[0], EvidenceConfig(), key=KEY, witness=Witness(data))
    b = EvidenceLog(db.stores[1], EvidenceConfig(), key=KEY, witness=Witness(data))
    await write(db.store, 10)
    assert (await b.checkpoint("acme")).size == 10  # type: ignore[union-attr]
    await write(db.store, 3)  # unsigned: A's read signs them
    real = db.stores[0].log_size
    calls = {"n": 0}

    async def log_size(tenant: str) -> Any:
        calls["n"] += 1
        if calls["n"] == 2:  # after A's first signing (13): two more decisions arrive
            await write(db.stores[1], 2)
        n = await real(tenant)
        if calls["n"] == 3:  # A has read its head (15) again; B writes and signs before A signs "upto=15"
            await write(db.stores[1], 2)
            assert (await b.checkpoint("acme")).size == 17  # type: ignore[union-attr]
        return n

    db.stores[0].log_size = log_size  # type: ignore[method-assign]
    got = await chunks(a, "acme")
    assert got[0].head == 15 and sum(len(c.entries) for c in got) == 15
    assert Witness(data).get("acme")[0] == 17  # type: ignore[index]


async def test_below_the_witness_a_deleted_witnessed_checkpoint_or_a_forged_history_is_still_refused(
    db: Db, tmp_path: Path
) -> None:
    """Asked for a checkpoint below the witnessed one: the store must still hold the witnessed
    checkpoint, and the records below it must be the ones it signed."""
    data = tmp_path / "data"
    signer = EvidenceLog(db.store, EvidenceConfig(), key=KEY, witness=Witness(data))
    await write(db.store, 10)
    assert (await signer.checkpoint("acme")).size == 10  # type: ignore[union-attr]
    await write(db.store, 10)
    assert (await signer.checkpoint("acme")).size == 20  # type: ignore[union-attr]
    await _forge(db, 12)
    with pytest.raises(LogForkError, match="do not extend to checkpoint 20"):
        await signer.checkpoint("acme", upto=15)
    db.execute("DELETE FROM log_checkpoints WHERE tenant='acme' AND size=20")
    with pytest.raises(LogForkError, match="no longer holds checkpoint 20"):
        await signer.checkpoint("acme", upto=15)
    assert (await db.store.latest_checkpoint("acme")).size == 10  # type: ignore[union-attr]


async def test_records_no_checkpoint_signs_are_not_evidence(db: Db) -> None:
    """A server without a signing key (PostgreSQL, none configured) keeps the log unsigned:
    verify says so rather than passing."""
    await write(db.store, 4)
    report = await verify(db.store)
    assert report.counts == {"unsigned": 1} and report.first_bad.seq == 0  # type: ignore[union-attr]


async def test_an_operator_verifies_the_store_on_every_core(db: Db, monkeypatch: pytest.MonkeyPatch) -> None:
    """`crossaudit audit verify --store`: forked workers hash ranges of the log; the findings are
    the same as one process finds, in sequence order."""
    import crossaudit.governance.evidence as ev

    monkeypatch.setattr(ev, "PARALLEL_MIN_RECORDS", 10)
    monkeypatch.setattr(ev, "PARALLEL_RANGE", 7)  # several ranges per worker
    await signed(db, 40)
    await write(db.store, 2, "globex")
    clean = await asyncio.to_thread(ev.verify_store, db.url, "acme", [KEY.public], "crossaudit", None, workers=2)
    assert clean.ok and clean.records == 40 and clean.covered == 40
    db.execute("UPDATE decisions SET passed=1 WHERE tenant='acme' AND log_seq=23")
    db.execute("DELETE FROM decisions WHERE tenant='acme' AND log_seq=31")
    db.execute(INSERT_COPY.format(seq="NULL"), ("forged",))
    bad = await asyncio.to_thread(ev.verify_store, db.url, "acme", [KEY.public], "crossaudit", None, workers=2)
    assert [(f.seq, f.kind) for f in bad.findings if f.kind != "checkpoint"] == [
        (23, "edited"),
        (31, "deleted"),
        (None, "inserted"),
    ]
