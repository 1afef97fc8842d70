"""Verify a tenant's decision log: records against their leaf hashes, leaves against signed
checkpoints, and say where it first went wrong.

The verifier reads what a *source* hands it (the store, a server's stream, an export bundle):
the log's records in sequence order from some start, each as its leaf document and the leaf
hash stored beside it, the checkpoints, and the right edge of the tree before the start. It
trusts only the public keys it is given. What it can tell, per sequence number:

- ``edited``: the record no longer hashes to the leaf stored with it;
- ``reordered``: it hashes to its stored leaf under another sequence number (moved or swapped);
- ``deleted``: no record holds a sequence number below the log's head;
- ``inserted``: a record with no sequence number, one past the log's head, or a second record
  at a sequence number;
- ``checkpoint``: a checkpoint that does not open under a trusted key, names another log, or
  whose root the records before it do not produce (a record altered together with its stored
  leaf hash shows only here: the first sequence number it can name is the previous checkpoint's);
- ``unsigned``: records, and no checkpoint by a trusted key over any of them.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Sequence
from typing import NamedTuple

from crossaudit.evidence.merkle import Frontier, Node, ProofError, leaf_hash, root_from_range
from crossaudit.evidence.notes import Checkpoint, NoteError, PublicKey, open_checkpoint
from crossaudit.kernel.canonical import canonical_json

MAX_FINDINGS = 100  # findings a report lists (the count of each kind is always whole)
MAX_REORDER_CANDIDATES = 1000  # mismatched records tried against each other's sequence numbers
MAX_REORDER_TRIES = 200_000  # of those tries in one verification (each a JSON parse and a hash); then "edited"
MAX_SIZE_DIGITS = 19  # the digits of a sequence number or size a note may name (an int64, as the store keeps)


class Entry(NamedTuple):
    """One record as a source hands it over: ``seq`` None when it is outside the log."""

    decision_id: str
    seq: int | None
    stored_leaf: str | None  # hex, as stored beside the record
    document: bytes


@dataclasses.dataclass
class LogChunk:
    """A piece of a log read: the first carries the log's name, start, the tree's edge before the
    start, its head and its checkpoints; every one carries entries; the last may carry the first
    checkpoint past the entries with its range proof."""

    entries: list[tuple[Entry, str, str]]  # (entry, rules text, receipt text)
    log: str = ""
    start: int = 0
    frontier: list[str] = dataclasses.field(default_factory=list)
    head: int = 0
    checkpoints: list[str] = dataclasses.field(default_factory=list)
    covering: str = ""
    covering_proof: list[Node] = dataclasses.field(default_factory=list)
    last: bool = False


@dataclasses.dataclass(frozen=True)
class Finding:
    seq: int | None
    kind: str  # edited | reordered | deleted | inserted | checkpoint
    detail: str
    decision_id: str = ""

    def line(self) -> str:
        where = "outside the log" if self.seq is None else f"seq {self.seq}"
        who = f" (decision {self.decision_id})" if self.decision_id else ""
        return f"{where}: {self.kind}{who}: {self.detail}"


@dataclasses.dataclass
class Report:
    origin: str
    start: int = 0
    records: int = 0
    checkpoints: int = 0  # checkpoints whose roots were checked and matched
    covered: int = 0  # the largest tree size a matching checkpoint signed
    uncovered: int = 0  # records after the last checkpoint (not yet signed: checked against their leaves only)
    findings: list[Finding] = dataclasses.field(default_factory=list)
    counts: dict[str, int] = dataclasses.field(default_factory=dict)
    keys: set[str] = dataclasses.field(default_factory=set)  # key ids that signed a matching checkpoint

    @property
    def ok(self) -> bool:
        return not self.counts

    @property
    def first_bad(self) -> Finding | None:
        """The finding to name first: the lowest sequence number a record's own problem has (a
        checkpoint's mismatch only bounds where the problem is), else the first of the rest."""
        for pool in (
            [f for f in self.findings if f.seq is not None and f.kind != "checkpoint"],
            [f for f in self.findings if f.seq is not None],
        ):
            if pool:
                return min(pool, key=lambda f: f.seq or 0)
        return self.findings[0] if self.findings else None

    def add(self, finding: Finding, n: int = 1) -> None:
        """``finding``, standing for ``n`` of its kind (a run of missing numbers is one line)."""
        self.counts[finding.kind] = self.counts.get(finding.kind, 0) + n
        if len(self.findings) < MAX_FINDINGS:
            self.findings.append(finding)

    def summary(self) -> dict[str, object]:
        first = self.first_bad
        return {
            "ok": self.ok,
            "log": self.origin,
            "start": self.start,
            "records": self.records,
            "checkpoints_verified": self.checkpoints,
            "signed_size": self.covered,
            "unsigned_records": self.uncovered,
            "keys": sorted(self.keys),
            "problems": dict(sorted(self.counts.items())),
            "first_bad": None if first is None else {"seq": first.seq, "kind": first.kind, "detail": first.detail},
            "findings": [dataclasses.asdict(f) for f in self.findings],
        }


def reseq(document: bytes, seq: int) -> bytes:
    """``document`` with another sequence number (its other fields as they are); b"" when it
    is not a JSON object (it then matches no leaf)."""
    try:
        doc = json.loads(document)
        doc["seq"] = seq
    except (ValueError, TypeError):
        return b""
    return canonical_json(doc).encode()


class Verifier:
    """Feed it entries in sequence order (:meth:`add`), then :meth:`finish`; ``checkpoints`` are
    signed notes in any order, ``frontier`` the tree's right edge at ``start`` (hex hashes)."""

    def __init__(
        self,
        origin: str,
        keys: Iterable[PublicKey],
        checkpoints: Iterable[str],
        *,
        start: int = 0,
        frontier: Sequence[str] = (),
        head: int | None = None,
    ) -> None:
        self.report = Report(origin, start=start)
        self.trusted = {k.key_id: k for k in keys}
        self.head = head
        self._pending: list[Checkpoint] = []
        for note in checkpoints:
            self._open(note)
        self._pending.sort(key=lambda c: c.size)
        self._pending = [c for c in self._pending if c.size > start]
        self._next = start
        self._broken_at: int | None = None  # a deleted leaf: roots after it cannot be rebuilt
        try:
            self._tree = Frontier.restore(start, frontier)
        except (ProofError, ValueError) as exc:
            self._tree = Frontier()
            self._broken_at = start
            self.report.add(Finding(start, "checkpoint", f"the tree's edge before seq {start} is wrong: {exc}"))
        self._mismatched: dict[str, tuple[int, Entry]] = {}  # stored leaf -> (seq, entry) not yet explained
        self._leaves: list[bytes] | None = None  # kept only when a range proof will need them
        self._tries = 0  # records tried under other sequence numbers (bounded: MAX_REORDER_TRIES)

    def _open(self, note: str) -> None:
        try:
            cp = open_checkpoint(note, self.trusted)
        except NoteError as exc:
            size = _claimed_size(note)
            self.report.add(Finding(size, "checkpoint", f"checkpoint of size {size}: {exc}"))
            return
        if cp.origin != self.report.origin:
            self.report.add(Finding(cp.size, "checkpoint", f"checkpoint of another log ({cp.origin!r})"))
            return
        self._pending.append(cp)

    def keep_leaves(self) -> None:
        """Keep leaf hashes from the start, for :meth:`check_range`."""
        self._leaves = []

    def add(self, e: Entry, leaf: bytes | None = None) -> None:
        """The next record in sequence order; ``leaf``: its leaf hash when the source computed it
        (then ``e.document`` is needed only when it differs from the stored leaf)."""
        r = self.report
        r.records += 1
        if e.seq is None:
            r.add(
                Finding(
                    None, "inserted", "the record has no sequence number: it was written outside the log", e.decision_id
                )
            )
            return
        if e.seq < 0:
            r.add(Finding(None, "inserted", f"the record is at seq {e.seq}, a number no log has", e.decision_id))
            return
        if self.head is not None and e.seq >= self.head:
            r.add(Finding(e.seq, "inserted", f"past the log's head ({self.head})", e.decision_id))
            return
        if e.seq < self._next:
            r.add(Finding(e.seq, "inserted", "a second record at this sequence number", e.decision_id))
            return
        self._missing(e.seq)
        if leaf is None:
            leaf = leaf_hash(e.document)
        if e.stored_leaf != leaf.hex():
            self._explain(e)
        self._next = e.seq + 1
        if self._broken_at is None:
            self._tree.append(leaf)
            if self._leaves is not None:
                self._leaves.append(leaf)
            while self._pending and self._pending[0].size <= self._tree.size:
                self._check(self._pending.pop(0), self._tree.root())

    def _missing(self, upto: int) -> None:
        """Sequence numbers from the next expected one up to ``upto`` hold no record: one finding
        for the run, counted whole (a run of any length costs the same)."""
        if self._next >= upto:
            return
        first, last = self._next, upto - 1
        what = "no record holds this sequence number" if first == last else f"no record holds seq {first}..{last}"
        self.report.add(Finding(first, "deleted", what), upto - first)
        if self._broken_at is None:
            self._broken_at = first
        self._next = upto

    def _explain(self, e: Entry) -> None:
        assert e.seq is not None
        stored = e.stored_leaf or ""
        candidates = list(self._mismatched.values())
        if self._tries + 2 + len(candidates) > MAX_REORDER_TRIES:  # the search's budget is spent: say what is sure
            candidates = []
            if self._tries + 2 > MAX_REORDER_TRIES:
                self.report.add(Finding(e.seq, "edited", "the record does not hash to its stored leaf", e.decision_id))
                return
        self._tries += 2 + len(candidates)
        for other in (e.seq - 1, e.seq + 1):
            if other >= 0 and leaf_hash(reseq(e.document, other)).hex() == stored:
                how = "an insertion or deletion shifted it" if abs(other - e.seq) == 1 else "moved"
                self.report.add(Finding(e.seq, "reordered", f"it was written as seq {other} ({how})", e.decision_id))
                return
        for seq, prev in candidates:
            assert prev.seq is not None
            if leaf_hash(reseq(e.document, seq)).hex() == stored:
                self._mismatched.pop(prev.stored_leaf or "", None)
                self.report.add(
                    Finding(seq, "reordered", f"it holds the record written as seq {e.seq} (swapped)", prev.decision_id)
                )
                self.report.add(Finding(e.seq, "reordered", f"it was written as seq {seq} (swapped)", e.decision_id))
                return
        if len(self._mismatched) < MAX_REORDER_CANDIDATES:
            self._mismatched[stored] = (e.seq, e)
        else:
            self.report.add(Finding(e.seq, "edited", "the record does not hash to its stored leaf", e.decision_id))

    def _check(self, cp: Checkpoint, root: bytes) -> None:
        if root == cp.root:
            self.report.checkpoints += 1
            self.report.covered = max(self.report.covered, cp.size)
            self.report.keys.add(cp.key_id)
            return
        since = self.report.covered if self.report.covered >= self.report.start else self.report.start
        self.report.add(
            Finding(
                since,
                "checkpoint",
                f"the records before seq {cp.size} do not produce the root signed by checkpoint {cp.size}: "
                f"one in seq {since}..{cp.size - 1} was altered, added or removed",
            )
        )

    def check_range(self, cp_note: str, lo: int, proof: Sequence[Node]) -> None:
        """Check a checkpoint past the last record with a range proof over the records read."""
        try:
            cp = open_checkpoint(cp_note, self.trusted)
        except NoteError as exc:
            self.report.add(Finding(_claimed_size(cp_note), "checkpoint", str(exc)))
            return
        if cp.origin != self.report.origin:
            self.report.add(Finding(cp.size, "checkpoint", f"checkpoint of another log ({cp.origin!r})"))
            return
        if self._leaves is None or self._broken_at is not None:
            return
        try:
            root = root_from_range(cp.size, lo, self._leaves, proof)
        except ProofError as exc:
            self.report.add(Finding(cp.size, "checkpoint", f"the range proof to checkpoint {cp.size}: {exc}"))
            return
        self._check(cp, root)

    def finish(self) -> Report:
        r = self.report
        for seq, e in sorted(self._mismatched.values(), key=lambda v: v[0]):
            r.add(Finding(seq, "edited", "the record does not hash to its stored leaf", e.decision_id))
        if self.head is not None:
            self._missing(self.head)
        for cp in self._pending:
            if self._broken_at is not None and cp.size > self._broken_at:
                r.add(
                    Finding(
                        self._broken_at,
                        "checkpoint",
                        f"checkpoint {cp.size} cannot be checked: seq {self._broken_at} is missing",
                    )
                )
            elif cp.size > self._next:
                r.add(
                    Finding(
                        self._next,
                        "deleted",
                        f"checkpoint {cp.size} signs records up to seq {cp.size - 1}; they end at {self._next - 1}",
                    )
                )
        r.uncovered = max(0, self._next - max(r.covered, r.start))
        if self._next > r.start and r.checkpoints == 0 and not r.counts:
            # records, and no signature over any of them: nothing here is evidence
            r.add(Finding(r.start, "unsigned", "no checkpoint by a trusted key signs these records"))
        r.findings.sort(key=lambda f: (f.seq is None, f.seq or 0))
        return r


def _claimed_size(note: str) -> int | None:
    lines = note.split("\n", 2)
    size = lines[1] if len(lines) > 1 else ""
    return int(size) if size.isascii() and size.isdigit() and len(size) <= MAX_SIZE_DIGITS else None


def require_signed(report: Report) -> Report:
    """``report`` with a finding when records it read are signed by no checkpoint it verified: an
    export (whose server signs its log first) must be signed to its last record, or whoever
    handed it over could have dropped the checkpoints that show an edit."""
    if report.uncovered:
        if report.counts.pop("unsigned", None):  # said more precisely below
            report.findings = [f for f in report.findings if f.kind != "unsigned"]
        first = max(report.covered, report.start)
        report.add(
            Finding(
                first,
                "checkpoint",
                f"seq {first}..{first + report.uncovered - 1} signed by no checkpoint that verifies "
                f"(the checkpoints that cover them are missing)",
            )
        )
        report.findings.sort(key=lambda f: (f.seq is None, f.seq or 0))
    return report


class ChunkVerifier:
    """Verify a log as it is read, chunk by chunk (:class:`LogChunk`: from a server's stream or
    the store); ``keep_leaves`` when the last chunk may carry a range proof (an export to --until)."""

    def __init__(self, keys: Iterable[PublicKey], *, keep_leaves: bool = False) -> None:
        self.keys = list(keys)
        self.keep = keep_leaves
        self.verifier: Verifier | None = None

    def feed(self, chunk: LogChunk) -> None:
        v = self.verifier
        if v is None:
            v = self.verifier = Verifier(
                chunk.log, self.keys, chunk.checkpoints, start=chunk.start, frontier=chunk.frontier, head=chunk.head
            )
            if self.keep:
                v.keep_leaves()
        for entry, _rules, _receipt in chunk.entries:
            v.add(entry)
        if chunk.covering:
            v.check_range(chunk.covering, v.report.start, chunk.covering_proof)

    def finish(self) -> Report:
        if self.verifier is None:
            raise ProofError("the log was not read (no first chunk)")
        return self.verifier.finish()
