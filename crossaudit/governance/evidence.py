"""The decision log's server side: the signing key, the checkpoint worker, reading the log for
verification and export, proofs and receipts (docs/evidence.md).

Sequence numbers and leaf hashes are assigned by the store in the transaction that writes each
decision (:func:`crossaudit.store.sql._take_seqs`); this module signs what is there. A crash
between a decision and its checkpoint loses nothing: the worker's first run at start signs every
log whose head is past its latest checkpoint.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import time
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from crossaudit.api.records import CheckpointRecord
from crossaudit.evidence import merkle
from crossaudit.evidence.leaf import leaf_document
from crossaudit.evidence.notes import (
    EvidenceKeyError,
    NoteError,
    PublicKey,
    SigningKey,
    check_key_name,
    generate_private_pem,
    load_public_key,
    load_signing_key,
    open_checkpoint,
    sign_checkpoint,
)
from crossaudit.evidence.proofs import ConsistencyProof, InclusionProof
from crossaudit.evidence.verify import Entry, LogChunk, Report, Verifier
from crossaudit.kernel.configfile import check_private_file
from crossaudit.kernel.errors import (
    ConfigurationError,
    InvalidInputError,
    LogForkError,
    NotFoundError,
    QuotaExceededError,
)
from crossaudit.kernel.files import read_capped
from crossaudit.service.config import EvidenceConfig
from crossaudit.service.shared import Witness
from crossaudit.store.base import LogRow, Store
from crossaudit.store.sql import SqlStore

log = logging.getLogger("crossaudit.evidence")

GENERATED_KEY_FILE = "evidence-signing.pem"  # in the data directory, when no key is configured (SQLite only)
MAX_KEY_FILE_BYTES = 16 << 10  # a PEM key file is a few hundred bytes
MAX_CHECKPOINTS_READ = 100_000  # checkpoints one read of a log carries (one per checkpoint_every decisions)


def _read_key_text(path: Path, what: str) -> bytes:
    return read_capped(path, MAX_KEY_FILE_BYTES, what, ConfigurationError)


def load_keys(
    config: EvidenceConfig, data_dir: Path | None, *, shared_store: bool, environ: Mapping[str, str] | None = None
) -> tuple[SigningKey | None, list[PublicKey]]:
    """The signing key and the public keys verification trusts (the current one first).

    From ``evidence.signing_key_file`` (owner-only) or ``evidence.signing_key_env``; with neither,
    a key generated once in ``data_dir`` for an embedded store, and none for a shared one
    (replicas sharing PostgreSQL must sign with one key, which no replica can make up alone:
    their logs are kept but not signed, and the server says so at start). Every problem with a
    configured key is a ConfigurationError."""
    what = "evidence signing key"
    try:
        name = check_key_name(config.key_name)
        if config.signing_key_file is not None and config.signing_key_env:
            raise ConfigurationError(f"{what}: set evidence.signing_key_file or evidence.signing_key_env, not both")
        if config.signing_key_file is not None:
            check_private_file(config.signing_key_file, what)
            key = load_signing_key(_read_key_text(config.signing_key_file, what), name, str(config.signing_key_file))
        elif config.signing_key_env:
            value = (os.environ if environ is None else environ).get(config.signing_key_env)
            if not value:
                raise ConfigurationError(f"{what}: environment variable {config.signing_key_env} is not set")
            key = load_signing_key(value.encode(), name, f"${config.signing_key_env}")
        elif shared_store or data_dir is None:
            return None, []
        else:
            path = data_dir / GENERATED_KEY_FILE
            data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            if not path.exists():
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with os.fdopen(fd, "wb") as f:
                    f.write(generate_private_pem())
                log.info("generated the evidence signing key %s (publish its public half: crossaudit audit key)", path)
            check_private_file(path, what)
            key = load_signing_key(_read_key_text(path, what), name, str(path))
        trusted = [key.public]
        for p in config.previous_public_keys:
            pub = load_public_key(
                _read_key_text(p, "evidence previous public key").decode("ascii", "replace"), str(p), name
            )
            if pub.key_id not in {k.key_id for k in trusted}:
                trusted.append(pub)
    except EvidenceKeyError as exc:
        raise ConfigurationError(f"{what}: {exc}") from None
    return key, trusted


_LEAF_HEX = re.compile(r"[0-9a-f]{64}")  # a leaf hash as the store keeps it


def _is_leaf(leaf: str | None) -> bool:
    """A stored leaf hash a tree can be built from (anything else stops the tree there, as a missing leaf)."""
    return isinstance(leaf, str) and _LEAF_HEX.fullmatch(leaf) is not None


def entry_of(row: LogRow, details: bool = True) -> tuple[Entry, str, str]:
    """A stored record as the verifier reads it, with its rules (as stored) and receipt texts
    (empty unless ``details``)."""
    values = row.values
    entry = Entry(row.decision_id, row.seq, row.leaf_hash, leaf_document(values, -1 if row.seq is None else row.seq))
    if not details:
        return entry, "", ""
    return entry, _text(values[9]), _text(values[19]) or "{}"


def _text(value: str | bytes | None) -> str:
    if isinstance(value, (bytes, memoryview)):
        return bytes(value).decode("utf-8", "surrogatepass")
    return value or ""


def _extend(tree: merkle.Frontier, leaves: Sequence[tuple[int, str | None]], at: int) -> int:
    """Append ``leaves`` (seq, stored hex) to ``tree`` while they follow on from ``at`` without a
    gap or a missing hash; the next sequence number expected."""
    for seq, leaf in leaves:
        if seq != at or not _is_leaf(leaf):
            break
        tree.append(bytes.fromhex(leaf))
        at += 1
    return at


class EvidenceLog:
    """Signs each tenant's log and serves it to verification, exports, proofs and receipts."""

    def __init__(
        self,
        store: Store,
        config: EvidenceConfig | None = None,
        *,
        key: SigningKey | None,
        trusted: Sequence[PublicKey] = (),
        witness: Witness | None = None,
    ) -> None:
        self.store = store
        # what this server signed, shared by its workers and kept over restarts (None: this process's memory)
        self.witness = witness
        self.config = config or EvidenceConfig()
        self.key = key  # None: nothing is signed (a shared store without a configured key)
        self.trusted = list(trusted) or ([key.public] if key is not None else [])
        self._locks: dict[str, asyncio.Lock] = {}
        self._nudge = asyncio.Event()
        self._stop = asyncio.Event()
        self._unsigned: dict[str, int] = {}
        self._worker: asyncio.Task[None] | None = None
        self._gaps_logged: set[tuple[str, int]] = set()
        self._refused: set[tuple[str, str]] = set()
        # the largest checkpoint of each log this process signed: stored ones may not go back
        self._seen: dict[str, tuple[int, bytes]] = {}
        self.signed = 0  # checkpoints this server signed since start

    def origin(self, tenant: str) -> str:
        return f"{self.config.origin}/{tenant}"

    def _log_refusal(self, tenant: str, why: str) -> None:
        """Say once per tenant and reason that its log is no longer signed, and how to check it."""
        if (tenant, why) not in self._refused:
            self._refused.add((tenant, why))
            log.error(
                "not signing the decision log of tenant %s: %s; run crossaudit audit verify --store ... --tenant %s",
                tenant,
                why,
                tenant,
            )

    # --- checkpoints ---------------------------------------------------------------------------

    def written(self, tenant: str) -> None:
        """One more decision in ``tenant``'s log: the worker runs early once enough are unsigned."""
        n = self._unsigned.get(tenant, 0) + 1
        self._unsigned[tenant] = n
        if n >= self.config.checkpoint_every:
            self._nudge.set()

    async def checkpoint(self, tenant: str, upto: int | None = None) -> CheckpointRecord | None:
        """Sign ``tenant``'s log up to its head (or ``upto``, or a missing sequence number, which
        is logged: verify names it), extending the largest checkpoint below that once it checks.
        None when that checkpoint already covers it all, or does not check; LogForkError when the
        store no longer extends the newest checkpoint this server signed (the witness)."""
        if self.key is None:
            return None
        lock = self._locks.setdefault(tenant, asyncio.Lock())
        async with lock:
            self._unsigned.pop(tenant, None)
            async with self._witnessed():
                latest = await self.store.latest_checkpoint(tenant, max_size=upto)
                tree = self._trusted_base(tenant, latest, upto)
                if tree is None:
                    return None
                await self._check_witness(tenant, latest, tree, upto)
            head = await self.store.log_size(tenant)
            if upto is not None:
                head = min(head, upto)
            while tree.size < head:
                end = min(head, tree.size + self.config.checkpoint_batch)
                leaves = await self.store.log_leaves(tenant, tree.size, end)
                await asyncio.to_thread(_extend, tree, leaves, tree.size)
                if tree.size < end:
                    if (tenant, tree.size) not in self._gaps_logged:
                        self._gaps_logged.add((tenant, tree.size))
                        log.error(
                            "the decision log of tenant %s has no leaf at seq %d (below its head %d): it is signed "
                            "up to there; run crossaudit audit verify",
                            tenant,
                            tree.size,
                            head,
                        )
                    break
            if latest is not None and tree.size <= latest.size:
                return None
            if tree.size == 0:
                return None
            now = time.time()
            cp = sign_checkpoint(self.key, self.origin(tenant), tree.size, tree.root(), int(now))
            rec = CheckpointRecord(tenant, cp.size, cp.root.hex(), cp.key_id, cp.note, tree.state(), now)
            async with self._witnessed():  # stored, then remembered: a sibling never sees the witness ahead
                if await self.store.add_checkpoint(rec):
                    self.signed += 1
                if self.witness is not None:
                    await asyncio.to_thread(self.witness.record, tenant, cp.size, cp.root)
            if cp.size > self._seen.get(tenant, (0, b""))[0]:
                self._seen[tenant] = (cp.size, cp.root)
            return rec

    def _witnessed(self) -> contextlib.AbstractAsyncContextManager[None]:
        """The witness's lock (every process of the data dir in turn); nothing without a witness."""
        return self.witness.locked() if self.witness is not None else contextlib.nullcontext()

    async def _check_witness(
        self, tenant: str, latest: CheckpointRecord | None, tree: merkle.Frontier, upto: int | None = None
    ) -> None:
        """That the store still holds the newest checkpoint this server signed (or checked) of
        ``tenant``'s log (the witness: every worker's and every earlier run's), and that ``latest``
        (``tree``, its checked edge) is it or extends it. Otherwise LogForkError, logged once:
        signing on would vouch for a history someone with write access to the database made after
        deleting that checkpoint. A larger ``latest`` that extends it is remembered in its place.
        Signing ``upto`` below the witnessed checkpoint (a read signs exactly the records it read,
        while a sibling or the checkpointer signed past them): ``latest`` and the stored records
        after it must extend to the witnessed checkpoint, which the store must still hold."""
        if self.witness is None:
            return
        known = await asyncio.to_thread(self.witness.get, tenant)
        why = ""
        if known is not None and upto is not None and known[0] > upto:
            why = await self._leads_to(tenant, tree, known[0], known[1], upto)
        elif known is None or (latest is not None and latest.size > known[0]):
            if known is not None:
                why = await self._extends(tenant, known[0], known[1], latest.size, tree.root())  # type: ignore[union-attr]
            if not why and latest is not None:
                # one it checked (a sibling that died before remembering it, another replica's, or the
                # newest when the witness began): remembered as its own, so it cannot go either
                await asyncio.to_thread(self.witness.record, tenant, latest.size, tree.root())
        else:
            size, root = known
            if latest is None or latest.size < size:
                newest = "none" if latest is None else str(latest.size)
                why = f"the store no longer holds checkpoint {size}, which this server signed (its newest is {newest})"
            elif tree.root() != root:
                why = f"checkpoint {size} in the store is not the one this server signed"
        if not why:
            return
        self._log_refusal(tenant, why)
        raise LogForkError(
            f"the server signs no more of this decision log: {why}; its operator runs crossaudit audit verify "
            "--store (docs/evidence.md)"
        )

    async def _extends(self, tenant: str, size: int, root: bytes, new_size: int, new_root: bytes) -> str:
        """Why the store's checkpoint of ``new_size`` (root ``new_root``) does not extend the one of
        ``size`` this server signed; "" when it does. The stored edge of that checkpoint, checked
        against the witness's root, extended by the stored leaves up to ``new_size``."""
        tree, why = await self._witnessed_edge(tenant, size, root, f"its newest is {new_size}")
        if tree is None:
            return why
        await self._grow(tenant, tree, new_size)
        if tree.size != new_size or tree.root() != new_root:
            return f"checkpoint {new_size} in the store does not extend checkpoint {size}, which this server signed"
        return ""

    async def _leads_to(self, tenant: str, base: merkle.Frontier, size: int, root: bytes, upto: int) -> str:
        """Why ``base`` (the checked edge of the largest checkpoint at or below what is to be signed)
        and the stored leaves after it do not lead to the checkpoint of ``size`` this server signed
        (root ``root``), which the store must still hold; "" when they do."""
        held, why = await self._witnessed_edge(tenant, size, root, f"asked to sign up to {upto}")
        if held is None:
            return why
        tree = merkle.Frontier.restore(base.size, base.state())  # a copy: the caller extends base itself
        await self._grow(tenant, tree, size)
        if tree.size != size or tree.root() != root:
            return (
                f"the records after checkpoint {base.size} in the store do not extend to checkpoint {size}, "
                "which this server signed"
            )
        return ""

    async def _witnessed_edge(
        self, tenant: str, size: int, root: bytes, newest: str
    ) -> tuple[merkle.Frontier | None, str]:
        """The stored edge of the checkpoint of ``size`` this server signed, once it folds to the
        witness's ``root``; else (None, why)."""
        stored = await self.store.list_checkpoints(tenant, min_size=size, max_size=size, limit=1)
        if not stored:
            return None, f"the store no longer holds checkpoint {size}, which this server signed ({newest})"
        try:
            tree = merkle.Frontier.restore(size, stored[0].frontier)
        except (merkle.ProofError, ValueError, TypeError):
            tree = None
        if tree is None or tree.root() != root:
            return None, f"checkpoint {size} in the store is not the one this server signed"
        return tree, ""

    async def _grow(self, tenant: str, tree: merkle.Frontier, size: int) -> None:
        """``tree`` extended by the stored leaves up to ``size`` (short of it at a missing leaf)."""
        while tree.size < size:
            end = min(size, tree.size + self.config.checkpoint_batch)
            leaves = await self.store.log_leaves(tenant, tree.size, end)
            await asyncio.to_thread(_extend, tree, leaves, tree.size)
            if tree.size < end:
                break

    def _trusted_base(
        self, tenant: str, latest: CheckpointRecord | None, upto: int | None = None
    ) -> merkle.Frontier | None:
        """The tree to extend: the latest stored checkpoint's, once its note verifies under a
        trusted key, names this tenant's log and its size, and its stored edge folds to its signed
        root; never smaller than a checkpoint this process signed or saw. None (logged once)
        when the stored checkpoints cannot be trusted: a new checkpoint would otherwise sign
        whatever someone with write access to the database put there."""
        seen = self._seen.get(tenant) if self.witness is None else None  # a witness checks it for every worker
        if seen is not None and upto is not None and seen[0] > upto:
            seen = None  # a checkpoint below the largest, asked for on purpose (the records a read covers)
        why = ""
        tree = merkle.Frontier()
        if latest is None:
            why = "its checkpoints are gone" if seen else ""
        else:
            try:
                cp = open_checkpoint(latest.note, {k.key_id: k for k in self.trusted})
                tree = merkle.Frontier.restore(latest.size, latest.frontier)
            except (NoteError, merkle.ProofError, ValueError, TypeError) as exc:
                why = f"its latest checkpoint ({latest.size}) does not verify: {exc}"
                if "not a trusted key" in why:
                    why += " (after a rotation, the retired key's public half goes in evidence.previous_public_keys)"
            else:
                if cp.origin != self.origin(tenant) or cp.size != latest.size or tree.root() != cp.root:
                    why = f"its latest checkpoint ({latest.size}) does not match its stored row"
                elif seen and (cp.size < seen[0] or (cp.size == seen[0] and cp.root != seen[1])):
                    why = f"its latest checkpoint ({cp.size}) is older than one this server signed ({seen[0]})"
        if not why:
            return tree
        self._log_refusal(tenant, why)
        return None

    async def checkpoint_all(self) -> int:
        """Sign every log with unsigned leaves; how many were signed."""
        n = 0
        for tenant, _size, _signed in await self.store.logs_behind(limit=10_000):
            try:
                if await self.checkpoint(tenant) is not None:
                    n += 1
            except (LogForkError, ConfigurationError) as exc:  # a fork (logged when found), an unreadable witness
                if not isinstance(exc, LogForkError) and (tenant, str(exc)) not in self._refused:
                    self._refused.add((tenant, str(exc)))
                    log.error("not signing the decision log of tenant %s: %s", tenant, exc)
            except (ValueError, TypeError):  # one log's stored rows do not parse: the others are still signed
                log.exception("signing the decision log of tenant %s failed; run crossaudit audit verify", tenant)
        return n

    def start(self) -> None:
        if self._worker is None and self.key is not None:
            self._worker = asyncio.create_task(self._run(), name="evidence-checkpoints")

    async def _run(self) -> None:
        while not self._stop.is_set():
            try:
                await self.checkpoint_all()
            except Exception:  # a store outage: the next run signs what is there
                log.exception(
                    "checkpointing the decision logs failed; retrying in %ss", self.config.checkpoint_interval_s
                )
            self._nudge.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                stop, nudge = asyncio.ensure_future(self._stop.wait()), asyncio.ensure_future(self._nudge.wait())
                try:
                    await asyncio.wait(
                        {stop, nudge}, timeout=self.config.checkpoint_interval_s, return_when=asyncio.FIRST_COMPLETED
                    )
                finally:
                    stop.cancel()
                    nudge.cancel()

    async def aclose(self) -> None:
        self._stop.set()
        if self._worker is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(self._worker, timeout=max(5.0, self.config.checkpoint_interval_s))
            self._worker = None
        if self.key is not None:
            with contextlib.suppress(Exception):  # what the last decisions added, signed before the store closes
                await self.checkpoint_all()

    # --- reading -------------------------------------------------------------------------------

    async def _frontier_at(self, tenant: str, start: int) -> merkle.Frontier:
        """The tree's edge before ``start``, from the latest checkpoint at or below it and the
        stored leaves after (untrusted: a wrong edge fails against the signed roots)."""
        below = await self.store.latest_checkpoint(tenant, max_size=start)
        tree = merkle.Frontier()
        if below is not None:
            with contextlib.suppress(merkle.ProofError, ValueError, TypeError):  # a bad stored edge: from the leaves
                tree = merkle.Frontier.restore(below.size, below.frontier)
        while tree.size < start:
            end = min(start, tree.size + self.config.checkpoint_batch)
            leaves = await self.store.log_leaves(tenant, tree.size, end)
            await asyncio.to_thread(_extend, tree, leaves, tree.size)
            if tree.size < end:
                break  # a missing leaf before the start: the edge stays short and the roots say so
        return tree

    def _chunks(self, rows: Sequence[LogRow], details: bool) -> list[LogChunk]:
        """``rows`` as entries, in chunks of at most ``read_chunk_bytes`` (one record at least)."""
        out: list[LogChunk] = []
        entries: list[tuple[Entry, str, str]] = []
        size = 0
        for r in rows:
            entry, rules, receipt = entry_of(r, details)
            n = len(entry.document) + len(rules) + len(receipt) + 128
            if entries and size + n > self.config.read_chunk_bytes:
                out.append(LogChunk(entries))
                entries, size = [], 0
            entries.append((entry, rules, receipt))
            size += n
        if entries:
            out.append(LogChunk(entries))
        return out

    async def _first(self, tenant: str, since: float | None, until: float | None) -> tuple[LogChunk, int, int]:
        """A read's first chunk: the log's name, the first sequence number (of the first decision
        at or after ``since``), the tree's edge before it, where the read ends (its ``head``: the
        first decision at or after ``until``, else the log's head, read again after listing the
        checkpoints) and the checkpoints past the start; the log is signed to its head first. Also
        the log's own head and the size of the last checkpoint listed (0: none)."""
        await self.checkpoint(tenant)
        head = await self.store.log_size(tenant)
        start = 0
        if since is not None:
            found = await self.store.first_seq_since(tenant, since)
            start = head if found is None else found
        end = head
        if until is not None:
            found = await self.store.first_seq_since(tenant, until)
            end = head if found is None else max(start, found)
        tree = await self._frontier_at(tenant, start)
        top = None if until is None else end
        notes = await self.store.list_checkpoints(tenant, min_size=start + 1, max_size=top, limit=MAX_CHECKPOINTS_READ)
        if until is None:
            # the head read again after the checkpoints: an honest head is at or past every checkpoint
            # listed, so one past it shows a log cut short (its last rows deleted, the head lowered)
            end = head = max(head, await self.store.log_size(tenant))
            if self.key is not None and end > start and not any(c.size == end for c in notes):
                # decisions written since the signing above: sign exactly the records read, so that
                # none is left unsigned (an export proves nothing of a record no checkpoint covers)
                await self.checkpoint(tenant, upto=end)
                notes = await self.store.list_checkpoints(tenant, min_size=start + 1, limit=MAX_CHECKPOINTS_READ)
        first = LogChunk(
            [],
            log=self.origin(tenant),
            start=start,
            frontier=tree.state() if tree.size == start else [],
            head=end,
            checkpoints=[c.note for c in notes],
        )
        return first, head, notes[-1].size if notes else 0

    async def read(
        self,
        tenant: str,
        *,
        since: float | None = None,
        until: float | None = None,
        outside: bool = True,
        details: bool = False,
    ) -> AsyncIterator[LogChunk]:
        """``tenant``'s log from the first decision at or after ``since`` (all: None) to the first
        at or after ``until`` (the head: None), signed up to its head first; with ``outside``,
        the records written outside the log follow (verification names them)."""
        first, head, last_signed = await self._first(tenant, since, until)
        start, end = first.start, first.head
        yield first
        chunk = self.config.read_chunk

        def page(a: int) -> asyncio.Task[list[LogRow]]:
            # pages by sequence range, each bounded (the unique index holds one record a number):
            # the next one is read while this one is turned into entries
            b = min(end, a + chunk)
            return asyncio.ensure_future(self.store.log_rows(tenant, start=a, end=b, limit=2 * chunk))

        seq = start
        pending = page(seq) if seq < end else None
        try:
            while pending is not None:
                rows = await pending
                seq = min(end, seq + chunk)
                if not rows and seq < end:
                    # a page of numbers no record holds (rows deleted, or a head moved far ahead):
                    # on to the next record that is there, not through every empty page up to the head
                    after = await self.store.log_rows(tenant, start=seq, end=end, limit=1)
                    seq = end if not after or after[0].seq is None else after[0].seq
                pending = page(seq) if seq < end else None
                for piece in self._chunks(rows, details):
                    yield piece
        finally:
            if pending is not None:
                pending.cancel()
        last = LogChunk([], last=True)
        if until is not None and end < head:
            # the first checkpoint past the records, proved over them: its subtrees outside [start, end)
            past = await self.store.list_checkpoints(tenant, min_size=end + 1, limit=1)
            if past and last_signed != end:
                cp = past[0]
                last.covering = cp.note
                subtree = await self._subtrees(tenant, merkle.range_path(cp.size, start, end))
                last.covering_proof = merkle.range_proof(subtree, cp.size, start, end)
        if outside:
            async for part in self._outside(tenant, since, details):
                yield part
        yield last

    async def _outside(self, tenant: str, since: float | None, details: bool) -> AsyncIterator[LogChunk]:
        """The records verify names as inserted: past the head as it is now (decisions written
        meanwhile are below it), and those with no number (or one no log has)."""
        chunk = self.config.read_chunk
        beyond = await self.store.log_rows(tenant, start=await self.store.log_size(tenant), limit=chunk)
        for piece in self._chunks(beyond, details):
            yield piece
        after = since
        while True:
            rows = await self.store.log_rows_outside(tenant, since=after, limit=chunk)
            if not rows:
                break
            for piece in self._chunks(rows, details):
                yield piece
            if len(rows) < chunk:
                break
            after = float(rows[-1].values[17]) + 1e-6  # created_at: bounded, each page strictly later

    async def _subtrees(self, tenant: str, ranges: Sequence[tuple[int, int]]) -> merkle.Subtree:
        """The roots of ``ranges`` (disjoint subtrees of the log) from the stored leaves, read in
        batches and hashed off the event loop: memory stays one batch whatever the log's size;
        ``evidence.max_proof_leaves`` bounds the leaves one proof reads."""
        total = sum(b - a for a, b in ranges)
        if total > self.config.max_proof_leaves:
            raise QuotaExceededError(
                f"evidence.max_proof_leaves={self.config.max_proof_leaves}: the proof would read {total} leaves"
            )
        roots: dict[tuple[int, int], bytes] = {}
        for a, b in sorted(set(ranges)):
            tree = merkle.Frontier()
            at = a
            while at < b:
                end = min(b, at + self.config.checkpoint_batch)
                at = await asyncio.to_thread(_extend, tree, await self.store.log_leaves(tenant, at, end), at)
                if at < end:
                    raise NotFoundError(f"the decision log has no leaf at seq {at}: run crossaudit audit verify")
            roots[(a, b)] = tree.root()
        return lambda a, b: roots[(a, b)]

    # --- proofs and receipts ----------------------------------------------------------------------

    async def inclusion(self, tenant: str, decision_id: str) -> InclusionProof:
        """That ``decision_id`` is in ``tenant``'s log: its leaf, and the path to the latest checkpoint."""
        rec = await self.store.get_decision(tenant, decision_id)
        if rec.log_seq is None or rec.log_seq < 0:  # negative: no log has it (written into the database)
            raise NotFoundError(f"decision {decision_id!r} is not in the decision log (written while it was off)")
        await self.checkpoint(tenant)
        cp = await self.store.latest_checkpoint(tenant)
        if cp is None or cp.size <= rec.log_seq:
            raise NotFoundError(f"no checkpoint covers decision {decision_id!r} yet (seq {rec.log_seq})")
        subtree = await self._subtrees(tenant, merkle.inclusion_path(rec.log_seq, cp.size))
        rows = await self.store.log_rows(tenant, start=rec.log_seq, limit=1)
        entry = entry_of(rows[0])[0]
        path = merkle.inclusion_proof(subtree, rec.log_seq, cp.size)
        return InclusionProof(decision_id, rec.log_seq, entry.document, rec.leaf_hash or "", cp.size, path, cp.note)

    async def consistency(self, tenant: str, old: int, new: int = 0) -> ConsistencyProof:
        """That the checkpoint of ``new`` leaves (0: the latest) extends the one of ``old``."""
        latest = await self.store.latest_checkpoint(tenant)
        if latest is None:
            raise NotFoundError("the decision log has no checkpoint yet")
        new = new or latest.size
        if not 0 < old <= new:
            raise InvalidInputError(
                f"a consistency proof goes from a smaller checkpoint to a larger one ({old} > {new})"
            )
        cps = {
            c.size: c
            for c in await self.store.list_checkpoints(tenant, min_size=old, max_size=new, limit=MAX_CHECKPOINTS_READ)
        }
        for size in (old, new):
            if size not in cps:
                raise NotFoundError(f"no checkpoint of size {size}")
        path = []
        if old != new:
            subtree = await self._subtrees(tenant, merkle.consistency_path(old, new))
            path = merkle.consistency_proof(subtree, old, new)
        return ConsistencyProof(cps[old].note, cps[new].note, path)


def receipt_of(record: Any) -> dict[str, Any]:
    """The receipt an audit record carries, with its place in the log."""
    return {
        "decision_id": record.decision_id,
        "receipt": record.receipt,
        "log_seq": record.log_seq,
        "leaf_hash": record.leaf_hash,
    }


def check_keys(config: EvidenceConfig) -> None:
    """A configured signing key (or previous public key) that is missing or wrong fails the
    start before anything opens; the generated key is made later, in the data directory."""
    if config.signing_key_file is not None or config.signing_key_env or config.previous_public_keys:
        load_keys(config, None, shared_store=True)


def unsigned_log(config: EvidenceConfig, *, shared_store: bool) -> str | None:
    """What the start line says when this server's decision logs get no signed checkpoint (None:
    they do). An unsigned log is kept, so nothing fails until an auditor runs ``audit verify``:
    the operator must hear it at start, not then. No comma: the start line is comma-separated."""
    if not config.log:
        return "decision log OFF (evidence.log is false: decisions are outside the verifiable log)"
    if config.signing_key_file is None and not config.signing_key_env and shared_store:
        return (
            "decision log UNSIGNED (no evidence.signing_key_file: audit verify fails; "
            "make a key with crossaudit audit key --generate FILE)"
        )
    return None


def build_evidence(config: EvidenceConfig, store: Store, data_dir: Path, *, shared_store: bool) -> EvidenceLog:
    key, trusted = load_keys(config, data_dir, shared_store=shared_store)
    if isinstance(store, SqlStore):
        store.log_decisions = config.log
    if not config.log:
        log.warning("evidence.log is off: decisions are written outside their tenants' verifiable logs")
    elif key is None:
        log.warning(
            "no evidence.signing_key_file: the decision logs are kept but no checkpoint is signed (replicas sharing "
            "a PostgreSQL store need one key; make one with crossaudit audit key --generate FILE)"
        )
    witness = Witness(data_dir) if key is not None else None
    return EvidenceLog(store, config, key=key, trusted=trusted, witness=witness)


# --- an operator's verification straight from the store, on every core ----------------------------

PARALLEL_MIN_RECORDS = 20_000  # below this, one process verifies (starting workers costs more)
PARALLEL_RANGE = 25_000  # records one worker hashes per task (tasks are handed out in order)


def verify_store(
    url: str, tenant: str, keys: Sequence[PublicKey], origin: str, since: float | None, *, workers: int = 0
) -> Report:
    """Verify ``tenant``'s log in the store at ``url`` (no server): the checkpoints, the tree's edge
    and the records outside the log are read here; the records' leaves are rebuilt and hashed by
    ``workers`` processes (0: one per core), each reading its own range of sequence numbers from
    the store, and checked here in order."""
    plan = asyncio.run(_plan(url, tenant, origin, since))
    start, head, frontier, notes, extra = plan
    v = Verifier(f"{origin}/{tenant}", keys, notes, start=start, frontier=frontier, head=head)
    n = head - start
    workers = workers or os.cpu_count() or 1
    ranges = [(url, tenant, a, min(head, a + PARALLEL_RANGE)) for a in range(start, head, PARALLEL_RANGE)]
    parallel = n >= PARALLEL_MIN_RECORDS and workers >= 2
    for items in _in_workers(ranges, workers) if parallel else map(_hash_range, ranges):
        for item in items:
            v.add(Entry(*item[:4]), item[4])
    for entry in extra:
        v.add(entry)
    return v.finish()


def _in_workers(
    ranges: list[tuple[str, str, int, int]], workers: int
) -> Iterable[list[tuple[str, int | None, str | None, bytes, bytes]]]:
    """:func:`_hash_range` of each range, in order, by ``workers`` processes; where worker
    processes cannot run (a sandboxed host, an embedding without a main module), here."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    # forkserver: the workers start from a clean process (forking one that has threads, a test
    # runner's or an embedding application's, may copy a lock another thread held)
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload([__name__])
    done = 0
    try:
        with ProcessPoolExecutor(workers, mp_context=ctx) as pool:
            for items in pool.map(_hash_range, ranges):
                yield items
                done += 1
    except (BrokenProcessPool, OSError) as exc:
        log.warning("verifying in one process: worker processes failed (%s)", exc)
        yield from map(_hash_range, ranges[done:])


async def _plan(
    url: str, tenant: str, origin: str, since: float | None
) -> tuple[int, int, list[str], list[str], list[Entry]]:
    from crossaudit.store import open_store

    store = open_store(url)
    try:
        log = EvidenceLog(store, EvidenceConfig(origin=origin), key=None)
        head = await store.log_size(tenant)
        start = 0
        if since is not None:
            found = await store.first_seq_since(tenant, since)
            start = head if found is None else found
        tree = await log._frontier_at(tenant, start)
        # every checkpoint past the start, also past the head: one there shows a log cut short
        cps = await store.list_checkpoints(tenant, min_size=start + 1, limit=MAX_CHECKPOINTS_READ)
        head = max(head, await store.log_size(tenant))
        extra = [entry_of(r, False)[0] for r in await store.log_rows(tenant, start=head, limit=log.config.read_chunk)]
        after = since
        while True:
            rows = await store.log_rows_outside(tenant, since=after, limit=log.config.read_chunk)
            extra += [entry_of(r, False)[0] for r in rows]
            if len(rows) < log.config.read_chunk:
                break
            after = float(rows[-1].values[17]) + 1e-6
        return start, head, tree.state() if tree.size == start else [], [c.note for c in cps], extra
    finally:
        await store.aclose()


def _hash_range(task: tuple[str, str, int, int]) -> list[tuple[str, int | None, str | None, bytes, bytes]]:
    """(decision id, seq, stored leaf, document or b"", leaf hash) of the records in [a, b): the
    document only where it does not hash to the stored leaf (the verifier explains those)."""
    from crossaudit.evidence.merkle import leaf_hash
    from crossaudit.store import open_store

    url, tenant, a, b = task

    async def run() -> list[tuple[str, int | None, str | None, bytes, bytes]]:
        store = open_store(url)
        out: list[tuple[str, int | None, str | None, bytes, bytes]] = []
        try:
            at = a
            while at < b:
                end = min(b, at + EvidenceConfig.read_chunk)
                for r in await store.log_rows(tenant, start=at, end=end, limit=2 * EvidenceConfig.read_chunk):
                    doc = leaf_document(r.values, r.seq)
                    leaf = leaf_hash(doc)
                    out.append((r.decision_id, r.seq, r.leaf_hash, doc if r.leaf_hash != leaf.hex() else b"", leaf))
                at = end
        finally:
            await store.aclose()
        return out

    return asyncio.run(run())
