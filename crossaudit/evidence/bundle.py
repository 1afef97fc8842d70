"""An export of a tenant's decision log that verifies with no server and no database.

A bundle is a directory:

- ``manifest.json``: the format, the log's origin, the first sequence number and the count of
  records, the tree's right edge before the first record, and the SHA-256 of every other file;
- ``records.jsonl``: the records' leaf documents (:mod:`crossaudit.evidence.leaf`), one a line,
  exactly the bytes that were hashed;
- ``leaves.txt``: the leaf hash stored beside each record (names an edited record);
- ``details.jsonl``: each record's rules and receipt, whose digests the leaf documents carry;
- ``checkpoints.json``: the signed checkpoints over the records, and the first one past them
  with a range proof (the subtrees of its tree outside the records);
- ``key.pem``: the public key the server signs with (an auditor verifies with a key they got
  from the operator, not with this copy: ``--key``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from crossaudit.evidence.leaf import rules_text
from crossaudit.evidence.merkle import Node
from crossaudit.evidence.notes import PublicKey
from crossaudit.evidence.verify import Entry, Finding, Report, Verifier, require_signed
from crossaudit.kernel.canonical import canonical_json, file_sha256, sha256_text

BUNDLE_FORMAT = "crossaudit.bundle/v1"
FILES = ("records.jsonl", "leaves.txt", "details.jsonl", "checkpoints.json", "key.pem")
MAX_LINE_BYTES = 4 << 20  # a line of a bundle's files read at most (a record's details are capped far below)
MAX_MANIFEST_BYTES = 1 << 20  # manifest.json (a frontier is at most 64 hashes)
MAX_CHECKPOINTS_BYTES = 64 << 20  # checkpoints.json: an export's 100,000 checkpoints at most are ~25 MB


class BundleError(ValueError):
    """A bundle that cannot be read at all (missing files, not JSON): no report can be made."""


@dataclasses.dataclass
class Detail:
    seq: int
    decision_id: str
    rules: str  # the rules' JSON text (violations by count)
    receipt: str  # the receipt's canonical JSON text


@dataclasses.dataclass
class Covering:
    """The first checkpoint past the records and the subtrees that prove them in it."""

    note: str
    nodes: list[Node]


class BundleWriter:
    """Writes a bundle as records stream in: the files are written line by line, their digests
    taken as they go, the manifest last (a bundle without one is an unfinished export)."""

    def __init__(self, out: Path, *, origin: str, start: int, frontier: Sequence[str], key: PublicKey) -> None:
        if out.exists() and any(out.iterdir()):
            raise BundleError(f"{out}: exists and is not empty")
        out.mkdir(parents=True, exist_ok=True)
        self.out, self.origin, self.start, self.frontier, self.key = out, origin, start, list(frontier), key
        self._files = {name: (out / name).open("wb") for name in ("records.jsonl", "leaves.txt", "details.jsonl")}
        self._hashes = {name: hashlib.sha256() for name in self._files}
        self.count = 0

    def _write(self, name: str, data: bytes) -> None:
        self._files[name].write(data)
        self._hashes[name].update(data)

    def add(self, entry: Entry, detail: Detail) -> None:
        self._write("records.jsonl", entry.document + b"\n")
        self._write("leaves.txt", f"{entry.stored_leaf or ''}\n".encode())
        line = {"seq": detail.seq, "decision_id": detail.decision_id, "rules": detail.rules, "receipt": detail.receipt}
        self._write("details.jsonl", canonical_json(line).encode() + b"\n")
        self.count += 1

    def finish(self, checkpoints: Sequence[str], covering: Covering | None) -> Path:
        for f in self._files.values():
            f.close()
        cps = {
            "checkpoints": list(checkpoints),
            "covering": None
            if covering is None
            else {"note": covering.note, "nodes": [[lo, hi, h.hex()] for lo, hi, h in covering.nodes]},
        }
        extra = {"checkpoints.json": canonical_json(cps).encode() + b"\n", "key.pem": self.key.pem().encode()}
        for name, data in extra.items():
            (self.out / name).write_bytes(data)
        digests = {name: h.hexdigest() for name, h in self._hashes.items()}
        digests.update({name: sha256_text(data) for name, data in extra.items()})
        manifest = {
            "format": BUNDLE_FORMAT,
            "log": self.origin,
            "key": self.key.vkey(),
            "start": self.start,
            "records": self.count,
            "frontier": self.frontier,
            "files": digests,
        }
        (self.out / "manifest.json").write_bytes(canonical_json(manifest).encode() + b"\n")
        return self.out


def _lines(path: Path) -> Iterator[bytes]:
    with path.open("rb") as f:
        while True:
            line = f.readline(MAX_LINE_BYTES + 1)
            if not line:
                return
            if len(line) > MAX_LINE_BYTES:
                raise BundleError(f"{path.name}: a line longer than {MAX_LINE_BYTES} bytes")
            yield line.rstrip(b"\n")


def _read_capped(path: Path, cap: int) -> bytes:
    """A whole file of at most ``cap`` bytes (a crafted bundle does not get to fill the memory)."""
    with path.open("rb") as f:
        raw = f.read(cap + 1)
    if len(raw) > cap:
        raise BundleError(f"{path.name}: larger than {cap} bytes")
    return raw


def read_manifest(bundle: Path) -> dict[str, Any]:
    path = bundle / "manifest.json"
    try:
        raw = _read_capped(path, MAX_MANIFEST_BYTES)
        manifest = json.loads(raw)
    except FileNotFoundError:
        raise BundleError(f"{bundle}: no manifest.json (not a bundle, or an unfinished export)") from None
    except (OSError, ValueError) as exc:
        raise BundleError(f"{path}: {exc}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != BUNDLE_FORMAT:
        raise BundleError(f"{path}: not a {BUNDLE_FORMAT} manifest")
    if canonical_json(manifest).encode() + b"\n" != raw:
        raise BundleError(f"{path}: not in its canonical form (it was edited)")
    return manifest


def verify_bundle(bundle: Path, keys: Sequence[PublicKey], log: str | None = None) -> Report:
    """Verify ``bundle`` with ``keys`` alone (and that it is of ``log``, e.g. ``crossaudit/acme``,
    when given); BundleError when it cannot be read at all."""
    manifest = read_manifest(bundle)
    try:
        origin, start, count = str(manifest["log"]), int(manifest["start"]), int(manifest["records"])
        frontier, digests = [str(h) for h in manifest["frontier"]], dict(manifest["files"])
        cps = json.loads(_read_capped(bundle / "checkpoints.json", MAX_CHECKPOINTS_BYTES))
        notes = [str(n) for n in cps["checkpoints"]]
        covering = cps.get("covering")
    except (KeyError, TypeError, ValueError, OSError) as exc:
        raise BundleError(f"{bundle}: {exc}") from None
    if start < 0 or count < 0:
        raise BundleError(f"{bundle}: manifest.json: a negative start or count of records")
    v = Verifier(origin, keys, notes, start=start, frontier=frontier, head=start + count)
    if log is not None and origin != log:  # its checkpoints may well verify: they are another log's
        v.report.add(Finding(None, "bundle", f"the bundle is of log {origin!r}, not {log!r}"))
    for name in FILES:
        path = bundle / name
        if name not in digests or not path.is_file() or file_sha256(path) != digests[name]:
            v.report.add(Finding(None, "bundle", f"{name} does not match the manifest's digest of it"))
    if covering is not None:
        v.keep_leaves()
    try:
        records, leaves, details = (_lines(bundle / n) for n in ("records.jsonl", "leaves.txt", "details.jsonl"))
        for i, (doc, leaf, detail) in enumerate(zip(records, leaves, details, strict=True)):
            try:
                d = json.loads(doc)
                seq, decision_id = int(d["seq"]), str(d.get("decision_id", ""))
            except (ValueError, KeyError, TypeError):  # a record changed out of JSON: its leaf will not match
                d, seq, decision_id = None, start + i, ""
            if d is not None:
                _check_detail(v.report, d, detail)
            v.add(Entry(decision_id, seq, leaf.decode("ascii", "replace"), doc))
    except ValueError as exc:  # zip(strict=True): the files hold different numbers of lines
        raise BundleError(f"{bundle}: records.jsonl, leaves.txt and details.jsonl differ in length ({exc})") from None
    except OSError as exc:
        raise BundleError(f"{bundle}: {exc}") from None
    if covering is not None:
        try:
            nodes = [(int(lo), int(hi), bytes.fromhex(h)) for lo, hi, h in covering["nodes"]]
            v.check_range(str(covering["note"]), start, nodes)
        except (KeyError, TypeError, ValueError) as exc:
            raise BundleError(f"{bundle}: checkpoints.json: {exc}") from None
    # nothing in a bundle but the checkpoints is signed: a record no checkpoint covers proves nothing
    return require_signed(v.finish())


def _check_detail(report: Report, d: dict[str, Any], detail: bytes) -> None:
    seq, decision_id = d.get("seq"), str(d.get("decision_id", ""))
    try:
        x = json.loads(detail)
        rules, receipt = str(x["rules"]), str(x["receipt"])
        lined_up = x.get("seq") == seq and x.get("decision_id") == decision_id
    except (ValueError, KeyError, TypeError):
        report.add(Finding(seq, "bundle", "its line of details.jsonl does not read", decision_id))
        return
    if not lined_up:
        report.add(Finding(seq, "bundle", "details.jsonl does not line up with records.jsonl", decision_id))
        return
    if sha256_text(rules_text(rules)) != d.get("rules_sha256"):
        report.add(Finding(seq, "edited", "its rules do not match the digest in its leaf", decision_id))
    if sha256_text(receipt) != d.get("receipt_sha256"):
        report.add(Finding(seq, "edited", "its receipt does not match the digest in its leaf", decision_id))


def bundle_size(bundle: Path) -> int:
    return sum(os.path.getsize(bundle / n) for n in (*FILES, "manifest.json") if (bundle / n).exists())
