"""Attacks on the verifiable decision log (docs/evidence.md), each written as the exploit it was:

- someone with write access to the database (not the signing key) who cuts the log short, feeds
  the checkpoint worker a forged tree edge or another tenant's checkpoint, plants text that makes
  verify crash, or a head so far ahead that reading or verifying it never ends;
- someone who hands an auditor a crafted bundle: stripped of the checkpoints that would show an
  edit, a manifest that claims a huge count, a record at a huge sequence number, notes that
  crash the parser, many records that each cost a search for where they moved;
- what held is asserted too (a mix of keys, duplicate and missing lines, another tenant's bundle).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from crossaudit.evidence import bundle as bundle_mod
from crossaudit.evidence import verify as verify_mod
from crossaudit.evidence.bundle import BundleError, verify_bundle
from crossaudit.evidence.export import export_chunks
from crossaudit.evidence.leaf import leaf_document
from crossaudit.evidence.merkle import Frontier, leaf_hash
from crossaudit.evidence.notes import NoteError, open_checkpoint
from crossaudit.evidence.verify import Entry, Verifier
from crossaudit.governance.evidence import EvidenceLog
from crossaudit.kernel.errors import NotFoundError
from crossaudit.service.config import EvidenceConfig
from tests.unit import test_evidence_log
from tests.unit.test_evidence_log import INSERT_COPY, KEY, OTHER_KEY, Db, chunks, signed, verify, write

db = test_evidence_log.db  # the fixture: the log on SQLite and on PostgreSQL, two stores each, and raw SQL

# The attacks below made a check run for hours (or ever). A fixed check answers at all: its
# counts come out by arithmetic, not one by one, and pytest's timeout fails one that does not.


# --- helpers: an attacker who edits a bundle and fixes up its manifest -------------------------


async def _export(db: Db, tmp_path: Path, n: int = 10, *, every: int | None = None) -> Path:
    """A bundle of ``n`` records (a checkpoint each ``every`` records, else one at the end)."""
    log = EvidenceLog(db.store, EvidenceConfig(), key=KEY)
    step = every or n
    for _ in range(0, n, step):
        await write(db.store, step)
        await log.checkpoint("acme")
    out = tmp_path / "bundle"
    report = export_chunks(await chunks(log, "acme", details=True), out, KEY.public, [KEY.public], False)
    assert report.ok, report.findings
    assert verify_bundle(out, [KEY.public]).ok
    return out


def _refresh_manifest(out: Path, **changes: Any) -> None:
    """Recompute every digest in the manifest (it is not signed: anyone can)."""
    manifest = json.loads((out / "manifest.json").read_bytes())
    manifest.update(changes)
    for name in manifest["files"]:
        manifest["files"][name] = hashlib.sha256((out / name).read_bytes()).hexdigest()
    text = json.dumps(manifest, sort_keys=True, separators=(",", ":")) + "\n"
    (out / "manifest.json").write_text(text)


def _forge_record(out: Path, index: int) -> None:
    """Change record ``index``'s verdict and recompute its stored leaf, as someone who knows the format."""
    records = (out / "records.jsonl").read_bytes().split(b"\n")[:-1]
    doc = json.loads(records[index])
    doc["passed"] = not doc["passed"]
    records[index] = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
    leaves = (out / "leaves.txt").read_text().split("\n")[:-1]
    leaves[index] = leaf_hash(records[index]).hex()
    (out / "records.jsonl").write_bytes(b"\n".join(records) + b"\n")
    (out / "leaves.txt").write_text("\n".join(leaves) + "\n")


def _checkpoints(out: Path, notes: list[str], covering: Any = None) -> None:
    doc = {"checkpoints": notes, "covering": covering}
    (out / "checkpoints.json").write_text(json.dumps(doc, sort_keys=True, separators=(",", ":")) + "\n")


# --- (c) a crafted bundle ------------------------------------------------------------------------


async def test_a_bundle_stripped_of_its_checkpoints_does_not_verify(db: Db, tmp_path: Path) -> None:
    """Exploit: edit a record, recompute its leaf, drop checkpoints.json's notes, fix the manifest:
    every record matched its leaf and nothing was signed, and verify said ok."""
    out = await _export(db, tmp_path)
    _forge_record(out, 3)
    _checkpoints(out, [])
    _refresh_manifest(out)
    report = verify_bundle(out, [KEY.public])
    assert not report.ok
    assert report.counts == {"checkpoint": 1} and "signed by no" in report.findings[0].detail


async def test_a_bundle_whose_last_checkpoint_was_dropped_does_not_verify(db: Db, tmp_path: Path) -> None:
    """Exploit: keep the first checkpoint, edit a record after it and drop the one that covers it."""
    out = await _export(db, tmp_path, 10, every=5)
    notes = json.loads((out / "checkpoints.json").read_bytes())["checkpoints"]
    assert len(notes) == 2
    _forge_record(out, 7)
    _checkpoints(out, notes[:1])
    _refresh_manifest(out)
    report = verify_bundle(out, [KEY.public])
    assert not report.ok and report.first_bad is not None and report.first_bad.seq == 5


async def test_an_honest_export_is_signed_to_its_last_record_even_when_decisions_race_it(
    db: Db, tmp_path: Path
) -> None:
    """The other side of requiring every exported record to be signed: an export of a log whose
    head moved after the server signed it (decisions written meanwhile) still verifies."""
    log = EvidenceLog(db.store, EvidenceConfig(), key=KEY)
    await write(db.store, 6)
    await log.checkpoint("acme")
    parts = []
    async for chunk in log.read("acme", outside=False, details=True):
        parts.append(chunk)
        if len(parts) == 1:  # the head was read and the checkpoints listed: decisions race the read
            await write(db.stores[1], 3)
    out = tmp_path / "bundle"
    report = export_chunks(parts, out, KEY.public, [KEY.public], False)
    assert report.ok, report.findings
    offline = verify_bundle(out, [KEY.public])
    assert offline.ok, offline.findings
    assert offline.uncovered == 0 and offline.records == report.records


async def test_a_manifest_claiming_a_huge_count_fails_at_once(db: Db, tmp_path: Path) -> None:
    """Exploit: "records": 10**15 made finish() list every missing number, one by one: a hang."""
    out = await _export(db, tmp_path)
    _refresh_manifest(out, records=10**15)
    report = verify_bundle(out, [KEY.public])
    assert not report.ok and report.counts["deleted"] == 10**15 - 10
    assert len(report.findings) <= verify_mod.MAX_FINDINGS


async def test_a_record_at_a_huge_sequence_number_fails_at_once(db: Db, tmp_path: Path) -> None:
    out = await _export(db, tmp_path)
    records = (out / "records.jsonl").read_bytes().split(b"\n")[:-1]
    doc = json.loads(records[-1])
    doc["seq"] = 10**15
    records[-1] = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
    (out / "records.jsonl").write_bytes(b"\n".join(records) + b"\n")
    _refresh_manifest(out, records=10**15 + 1)
    report = verify_bundle(out, [KEY.public])
    assert not report.ok and report.first_bad is not None and report.first_bad.seq == 9


@pytest.mark.parametrize(
    "note",
    [
        "crossaudit/acme\n\u00b2\nAAAA\n\n\u2014 crossaudit AAAA\n",  # a size of a digit that int() refuses
        "crossaudit/acme\n1\n" + "A" * 43 + "=\ntimestamp \u00b9\n\n\u2014 crossaudit AAAA\n",  # a timestamp of one
        "crossaudit/acme\n" + "9" * 5000 + "\nAAAA\n\n\u2014 crossaudit AAAA\n",  # too many digits for int()
    ],
)
async def test_a_checkpoint_note_that_does_not_parse_is_a_finding_not_a_crash(
    db: Db, tmp_path: Path, note: str
) -> None:
    """Exploit: str.isdigit() says yes to '²' and to 5,000 digits, int() then raised ValueError."""
    with pytest.raises(NoteError):
        open_checkpoint(note, {KEY.public.key_id: KEY.public})
    out = await _export(db, tmp_path)
    notes = json.loads((out / "checkpoints.json").read_bytes())["checkpoints"]
    _checkpoints(out, [*notes, note])
    _refresh_manifest(out)
    report = verify_bundle(out, [KEY.public])
    assert not report.ok and report.counts == {"checkpoint": 1}


def test_many_moved_records_cost_a_bounded_search() -> None:
    """Exploit: every record with a wrong stored leaf was tried at the sequence number of each of
    up to 1,000 earlier ones (a JSON parse and a hash each): 20,000 records, 20 million tries."""
    tries = 0
    real = verify_mod.reseq

    def counted(document: bytes, seq: int) -> bytes:
        nonlocal tries
        tries += 1
        return real(document, seq)

    verify_mod.reseq = counted
    try:
        v = Verifier("crossaudit/acme", [KEY.public], [])
        for seq in range(5_000):
            doc = json.dumps({"log": "x", "seq": seq, "n": seq}, separators=(",", ":")).encode()
            v.add(Entry(f"d{seq}", seq, f"{seq:064x}", doc))
        report = v.finish()
    finally:
        verify_mod.reseq = real
    assert report.counts == {"edited": 5_000}
    assert tries <= verify_mod.MAX_REORDER_TRIES + 2 * 5_000


async def test_what_held_against_crafted_bundles(db: Db, tmp_path: Path) -> None:
    """Held: a duplicated line, a missing line, a checkpoint by another key mixed in, a lying start."""
    out = await _export(db, tmp_path)
    pristine = {n: (out / n).read_bytes() for n in ("records.jsonl", "leaves.txt", "details.jsonl", "manifest.json")}

    def lines(name: str) -> list[bytes]:
        return pristine[name].split(b"\n")[:-1]

    def reset() -> None:
        for name, data in pristine.items():
            (out / name).write_bytes(data)

    for edit, count in ((lambda x: [*x[:4], x[3], *x[4:]], 11), (lambda x: [*x[:4], *x[5:]], 9)):
        for name in ("records.jsonl", "leaves.txt", "details.jsonl"):
            (out / name).write_bytes(b"\n".join(edit(lines(name))) + b"\n")
        _refresh_manifest(out, records=count)
        assert not verify_bundle(out, [KEY.public]).ok
        reset()
    notes = json.loads((out / "checkpoints.json").read_bytes())["checkpoints"]
    impostor = EvidenceLog(db.store, EvidenceConfig(), key=OTHER_KEY, trusted=[OTHER_KEY.public, KEY.public])
    await write(db.store, 1)
    other = await impostor.checkpoint("acme")
    assert other is not None
    _checkpoints(out, [*notes, other.note])
    _refresh_manifest(out)
    assert not verify_bundle(out, [KEY.public]).ok
    for start in (-1, 3, 2**70):
        _refresh_manifest(out, start=start)
        with contextlib.suppress(BundleError):  # refused as unreadable: a failure too
            assert not verify_bundle(out, [KEY.public]).ok


# --- (a) someone who can write the database ------------------------------------------------------


async def test_a_log_cut_short_with_its_head_lowered_does_not_verify(db: Db) -> None:
    """Exploit: delete the last signed decisions and lower the log's head to match: the read listed
    only the checkpoints up to the head, so the signed checkpoint of the whole log was never seen."""
    await signed(db, 10)
    db.execute("DELETE FROM decisions WHERE tenant='acme' AND log_seq>=7")
    db.execute("UPDATE log_heads SET size=7 WHERE tenant='acme'")
    report = await verify(db.store)
    assert not report.ok
    assert report.first_bad is not None and (report.first_bad.seq, report.first_bad.kind) == (7, "deleted")


async def _forge_frontier(db: Db, tenant: str = "acme") -> None:
    """Rewrite seq 3 and its leaf, and store the edge of the forged tree with checkpoint 10."""
    db.execute("UPDATE decisions SET action='allow' WHERE tenant=? AND log_seq=3", (tenant,))
    rows = await db.store.log_rows(tenant, start=3, limit=1)
    db.execute(
        "UPDATE decisions SET leaf_hash=? WHERE tenant=? AND log_seq=3",
        (leaf_hash(leaf_document(rows[0].values, 3)).hex(), tenant),
    )
    tree = Frontier()
    for _seq, leaf in await db.store.log_leaves(tenant, 0, 10):
        tree.append(bytes.fromhex(leaf or ""))
    db.execute("UPDATE log_checkpoints SET frontier=? WHERE tenant=? AND size=10", (json.dumps(tree.state()), tenant))


async def test_the_worker_does_not_sign_over_a_forged_tree_edge(db: Db) -> None:
    """Exploit: the worker extended the edge stored beside the latest checkpoint without checking it
    against the signed root, so the server itself signed a forked history."""
    log, _ = await signed(db, 10)
    await _forge_frontier(db)
    await write(db.store, 5)
    assert await log.checkpoint("acme") is None
    assert [c.size for c in await db.store.list_checkpoints("acme")] == [10]
    report = await verify(db.store)
    assert not report.ok and report.counts.get("checkpoint") == 1


async def test_a_server_whose_key_changed_does_not_extend_checkpoints_it_cannot_check(db: Db) -> None:
    """A key rotated without the retired key's public half in evidence.previous_public_keys: the
    new key does not vouch for a history it cannot check (the log says what to configure)."""
    await signed(db, 4)
    await write(db.store, 3)
    assert await EvidenceLog(db.store, EvidenceConfig(), key=OTHER_KEY).checkpoint("acme") is None
    rotated = EvidenceLog(db.store, EvidenceConfig(), key=OTHER_KEY, trusted=[OTHER_KEY.public, KEY.public])
    assert (await rotated.checkpoint("acme")).size == 7  # type: ignore[union-attr]
    report = await verify(db.store, key=OTHER_KEY)  # an auditor who trusts only the new key: 4 is not checked
    assert report.counts == {"checkpoint": 1} and report.covered == 7


async def test_the_worker_does_not_extend_another_tenants_checkpoint_or_a_forged_one(db: Db) -> None:
    await signed(db, 4, "acme")
    await signed(db, 9, "globex")
    db.execute("UPDATE log_checkpoints SET tenant='acme' WHERE tenant='globex'")  # globex's 9 as acme's latest
    await write(db.store, 8, "acme")
    log = EvidenceLog(db.store, EvidenceConfig(), key=KEY)
    assert await log.checkpoint("acme") is None
    db.execute("DELETE FROM log_checkpoints WHERE tenant='acme' AND size=9")
    db.execute("UPDATE log_checkpoints SET note=? WHERE tenant='acme' AND size=4", ("crossaudit/acme\n4\nforged\n",))
    assert await log.checkpoint("acme") is None
    assert [c.size for c in await db.store.list_checkpoints("acme")] == [4]


async def test_a_leaf_hash_that_is_not_hex_is_a_finding_not_a_crash(db: Db) -> None:
    """Exploit: bytes.fromhex raised in the worker (which then signed no tenant at all) and in every read."""
    log, _ = await signed(db, 5)
    await write(db.store, 5)
    await write(db.store, 2, "globex")
    db.execute("UPDATE decisions SET leaf_hash='not hex' WHERE tenant='acme' AND log_seq=7")
    assert await log.checkpoint_all() == 2  # globex is signed; acme up to its bad leaf
    assert [c.size for c in await db.store.list_checkpoints("acme")] == [5, 7]
    report = await verify(db.store)
    assert report.first_bad is not None and (report.first_bad.seq, report.first_bad.kind) == (7, "edited")


async def test_a_head_far_past_the_records_is_read_and_verified_at_once(db: Db) -> None:
    """Exploit: a head of 10**12 made the read page through every empty range of numbers below it."""
    await signed(db, 10)
    db.execute("UPDATE log_heads SET size=? WHERE tenant='acme'", (10**12,))
    report = await verify(db.store)
    assert report.first_bad is not None and (report.first_bad.seq, report.first_bad.kind) == (10, "deleted")
    assert report.counts["deleted"] == 10**12 - 10


async def test_a_huge_gap_in_the_middle_is_read_at_once(db: Db) -> None:
    await signed(db, 10)
    await write(db.store, 2)
    db.execute("UPDATE decisions SET log_seq=log_seq+? WHERE tenant='acme' AND log_seq>=10", (10**12,))
    db.execute("UPDATE log_heads SET size=size+? WHERE tenant='acme'", (10**12,))
    report = await verify(db.store)
    assert report.records == 12 and report.first_bad is not None and report.first_bad.seq == 10


async def test_a_bundle_of_another_tenants_log_is_refused_when_the_auditor_names_theirs(
    db: Db, tmp_path: Path
) -> None:
    """Exploit: one key signs every tenant's log, so globex's bundle verified for an auditor of
    acme, and the ok line did not say whose log it was."""
    log, _ = await signed(db, 4, "globex")
    out = tmp_path / "globex-bundle"
    assert export_chunks(await chunks(log, "globex", details=True), out, KEY.public, [KEY.public], False).ok
    assert verify_bundle(out, [KEY.public]).ok
    assert verify_bundle(out, [KEY.public], "crossaudit/globex").ok
    report = verify_bundle(out, [KEY.public], "crossaudit/acme")
    assert report.counts == {"bundle": 1} and "not 'crossaudit/acme'" in report.findings[0].detail
    _refresh_manifest(out, log="crossaudit/acme")  # renamed: its checkpoints name globex's log
    assert not verify_bundle(out, [KEY.public], "crossaudit/acme").ok


async def test_a_bundle_with_a_huge_checkpoints_file_is_refused_unread(db: Db, tmp_path: Path) -> None:
    out = await _export(db, tmp_path)
    with (out / "checkpoints.json").open("ab") as f:
        f.truncate(bundle_mod.MAX_CHECKPOINTS_BYTES + 1)  # sparse: no disk spent
    with pytest.raises(BundleError, match="larger than"):
        verify_bundle(out, [KEY.public])


async def test_a_record_forged_at_a_negative_sequence_number_is_named(db: Db) -> None:
    """Exploit: the log was read from seq 0 and the records outside it were those with no number,
    so a decision inserted at seq -1 was read by neither (and is listed with the tenant's decisions)."""
    await signed(db)
    db.execute(INSERT_COPY.format(seq="-1"), ("forged-negative",))
    assert (await db.store.get_decision("acme", "forged-negative")).log_seq == -1
    report = await verify(db.store)
    assert report.counts == {"inserted": 1}
    assert report.findings[0].decision_id == "forged-negative" and "-1" in report.findings[0].detail
    log = EvidenceLog(db.store, EvidenceConfig(), key=KEY)
    with pytest.raises(NotFoundError):  # not a ProofError from deep inside (an internal error on the wire)
        await log.inclusion("acme", "forged-negative")
    since = [c async for c in log.read("acme", since=0.0)]
    assert since[0].start == 0  # the forged number is not where a read --since starts


async def test_a_record_whose_number_is_not_a_number_is_named(db: Db) -> None:
    """SQLite keeps the text it is given in an INTEGER column: such a record was in no read by number."""
    await signed(db)
    if db.store.__class__.__name__ != "SQLiteStore":  # PostgreSQL refuses text in a BIGINT column outright
        with pytest.raises(Exception, match="bigint"):
            db.execute(INSERT_COPY.format(seq="'x'"), ("forged-text",))
        assert (await verify(db.store)).ok
        return
    db.execute(INSERT_COPY.format(seq="'x'"), ("forged-text",))
    report = await verify(db.store)
    assert report.counts == {"inserted": 1} and report.findings[0].decision_id == "forged-text"


async def test_a_stored_edge_that_does_not_parse_is_a_finding_not_a_crash(db: Db) -> None:
    """Exploit: a checkpoint row's edge set to text that is not hex made every read --since past it raise."""
    await signed(db, 10)
    await write(db.store, 5)
    log = EvidenceLog(db.store, EvidenceConfig(), key=None, trusted=[KEY.public])
    db.execute("UPDATE log_checkpoints SET frontier=? WHERE tenant='acme' AND size=10", (json.dumps(["zz"]),))
    db.execute("UPDATE decisions SET created_at=created_at+100 WHERE tenant='acme' AND log_seq>=10")
    parts = [c async for c in log.read("acme", since=1_102.0)]  # from seq 12: the edge below is rebuilt
    assert parts[0].start == 12 and len(parts[0].frontier) == 2
    assert await EvidenceLog(db.store, EvidenceConfig(), key=KEY).checkpoint("acme") is None  # not extended
