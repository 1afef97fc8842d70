"""Exporting a log read from a server as an offline bundle, verified chunk by chunk on the way."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

from crossaudit.evidence.bundle import BundleWriter, Covering, Detail
from crossaudit.evidence.leaf import rules_text
from crossaudit.evidence.notes import PublicKey
from crossaudit.evidence.verify import ChunkVerifier, LogChunk, Report, require_signed
from crossaudit.kernel.errors import NotFoundError


class Exporter:
    """Writes a log read as a bundle (:mod:`crossaudit.evidence.bundle`) in ``out`` chunk by chunk,
    verifying it on the way (:meth:`finish` returns that check's report; the bundle is written
    whatever it finds)."""

    def __init__(self, out: Path, key: PublicKey, trusted: Sequence[PublicKey], keep_leaves: bool) -> None:
        self.out, self.key = out, key
        self.checker = ChunkVerifier(trusted, keep_leaves=keep_leaves)
        self.writer: BundleWriter | None = None
        self.notes: list[str] = []
        self.covering: Covering | None = None

    def feed(self, chunk: LogChunk) -> None:
        self.checker.feed(chunk)
        if self.writer is None:
            self.writer = BundleWriter(self.out, origin=chunk.log, start=chunk.start, frontier=chunk.frontier,
                                       key=self.key)  # fmt: skip
            self.notes = list(chunk.checkpoints)
        for entry, rules, receipt in chunk.entries:
            if entry.seq is None:
                continue  # outside the log: nothing in a bundle could vouch for it
            # the rules as a record without raw text holds them: no quoted violation leaves in an export
            self.writer.add(entry, Detail(entry.seq, entry.decision_id, rules_text(rules), receipt))
        if chunk.covering:
            self.covering = Covering(chunk.covering, list(chunk.covering_proof))

    def finish(self) -> Report:
        if self.writer is None:
            raise NotFoundError("the server sent no log")
        self.writer.finish(self.notes, self.covering)
        return require_signed(self.checker.finish())  # as the bundle will be checked offline


def export_chunks(
    chunks: Iterable[LogChunk], out: Path, key: PublicKey, trusted: Sequence[PublicKey], keep_leaves: bool
) -> Report:
    """Write a log read as a bundle in ``out``; the report of checking it on the way."""
    exporter = Exporter(out, key, trusted, keep_leaves)
    for chunk in chunks:
        exporter.feed(chunk)
    return exporter.finish()
