"""``crossaudit audit key|verify|proof|export|receipt``: the verifiable decision log
(docs/evidence.md).

``verify`` checks a log against signed checkpoints with a public key it is given: read from a
server (``--server``, the caller's tenant), from an exported bundle (``--bundle``, no server and
no database), or, for an operator, straight from the store (``--store URL --tenant T``). Exit
codes: 0 the log verifies, 1 it does not (the first bad sequence number and what is wrong are
printed) or it could not be read, 2 bad arguments.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from crossaudit.cli import connect
from crossaudit.cli.common import EXIT_FAIL, EXIT_OK, parse_when
from crossaudit.evidence.bundle import BundleError, verify_bundle
from crossaudit.evidence.merkle import ProofError, leaf_hash, verify_consistency, verify_inclusion
from crossaudit.evidence.notes import (
    EvidenceKeyError,
    NoteError,
    PublicKey,
    generate_private_pem,
    load_public_key,
    load_signing_key,
    open_checkpoint,
)
from crossaudit.evidence.verify import ChunkVerifier, Report
from crossaudit.kernel.errors import ConfigurationError, InvalidInputError
from crossaudit.kernel.files import read_capped
from crossaudit.kernel.shell import command

MAX_KEY_BYTES = 16 << 10  # a public key file (PEM or verifier key) is far smaller


def register(asub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    k = asub.add_parser(
        "key",
        parents=[common],
        help="the public key that signs this tenant's decision log (or make a signing key)",
        description=(
            "Print the public key the server signs checkpoints with (PEM, and the name+hash+base64 verifier key). "
            "--private FILE prints the public half of a signing key file instead; --generate FILE writes a new "
            "Ed25519 signing key (owner-only) for evidence.signing_key_file."
        ),
    )
    which = k.add_mutually_exclusive_group()
    which.add_argument("--private", metavar="FILE", help="the public half of this signing key file (no server)")
    which.add_argument("--generate", metavar="FILE", help="write a new signing key to FILE (no server)")
    k.add_argument("--name", default="crossaudit", help="the key name in checkpoints (evidence.key_name)")
    k.set_defaults(func=cmd_audit_key)

    v = asub.add_parser(
        "verify",
        parents=[common],
        help="check the decision log against its signed checkpoints",
        description=(
            "Check every record of the log against its leaf and every leaf against the signed checkpoints, and name "
            "the first bad sequence number: an edited, deleted, inserted or reordered record, a checkpoint signed by "
            "another key. Source: the server (your tenant), --bundle DIR (offline), or --store URL --tenant T."
        ),
    )
    v.add_argument("--key", action="append", default=[], metavar="PUB", help="a trusted public key file (repeat)")
    v.add_argument("--since", default=None, metavar="WHEN", help="from this time (a duration back, or ISO time)")
    v.add_argument("--bundle", default=None, metavar="DIR", help="verify an exported bundle, offline")
    v.add_argument("--store", default=None, metavar="URL", help="read the store itself (postgresql://... or a file)")
    v.add_argument(
        "--tenant", default=None, help="with --store: the tenant whose log to verify; with --bundle: whose it must be"
    )
    v.add_argument("--origin", default="crossaudit", help="with --store or --tenant: evidence.origin of the server")
    v.set_defaults(func=cmd_audit_verify)

    p = asub.add_parser(
        "proof",
        parents=[common],
        help="an inclusion proof of a decision, or a consistency proof between two checkpoints",
    )
    p.add_argument("decision_id", nargs="?", default="")
    p.add_argument("--consistency", nargs=2, type=int, metavar=("OLD", "NEW"), help="checkpoint sizes (NEW 0: latest)")
    p.add_argument("--key", action="append", default=[], metavar="PUB", help="check it against this key too")
    p.set_defaults(func=cmd_audit_proof)

    e = asub.add_parser(
        "export",
        parents=[common],
        help="write the log (records, checkpoints, proofs, key) as a bundle that verifies offline",
    )
    e.add_argument("--out", required=True, metavar="DIR", help="a new or empty directory")
    e.add_argument("--since", default=None, metavar="WHEN")
    e.add_argument("--until", default=None, metavar="WHEN")
    e.add_argument("--key", action="append", default=[], metavar="PUB", help="verify the export with this key")
    e.set_defaults(func=cmd_audit_export)

    r = asub.add_parser("receipt", parents=[common], help="what decided a decision, and its place in the log")
    r.add_argument("decision_id")
    r.set_defaults(func=cmd_audit_receipt)


def read_keys(paths: list[str]) -> list[PublicKey]:
    keys = []
    for path in paths:
        data = read_capped(path, MAX_KEY_BYTES, "--key")
        try:
            keys.append(load_public_key(data.decode("ascii", "replace"), path))
        except EvidenceKeyError as exc:
            raise InvalidInputError(f"--key {exc}") from None
    return keys


def cmd_audit_key(args: argparse.Namespace) -> int:
    if args.generate:
        path = Path(args.generate)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            raise InvalidInputError(f"{path} exists: a signing key is never overwritten") from None
        except OSError as exc:
            raise InvalidInputError(f"{path}: {exc.strerror}") from None
        with os.fdopen(fd, "wb") as f:
            f.write(generate_private_pem())
        return _print_key(args, load_signing_key(path.read_bytes(), args.name, str(path)).public, f"wrote {path}")
    if args.private:
        try:
            key = load_signing_key(read_capped(args.private, MAX_KEY_BYTES, "--private"), args.name, args.private)
        except EvidenceKeyError as exc:
            raise InvalidInputError(str(exc)) from None
        return _print_key(args, key.public, "")
    with connect.client(args) as c:
        info = c.log_key()
    if info.key is None:
        raise ConfigurationError("this server signs no checkpoints (no evidence.signing_key_file is configured)")
    return _print_key(args, info.key, f"log: {info.log}", info.trusted)


def _print_key(args: argparse.Namespace, key: PublicKey, note: str, trusted: list[PublicKey] | None = None) -> int:
    if args.json:
        doc = {"key_id": key.key_id, "vkey": key.vkey(), "pem": key.pem()}
        if trusted is not None:
            doc["trusted"] = [k.vkey() for k in trusted]
        print(json.dumps(doc, indent=2))
        return EXIT_OK
    if note:
        print(note, file=sys.stderr)
    print(f"# key id {key.key_id}; verifier key: {key.vkey()}", file=sys.stderr)
    sys.stdout.write(key.pem())
    return EXIT_OK


def _report(args: argparse.Namespace, report: Report, what: str) -> int:
    if args.json:
        print(json.dumps(report.summary(), indent=2, default=str))
        return EXIT_OK if report.ok else EXIT_FAIL
    signed = f"{report.checkpoints} checkpoint(s) up to size {report.covered}"
    if report.ok:
        print(f"ok: {what}: {report.records} record(s) from seq {report.start} verify; {signed}")
        if report.uncovered:
            print(f"note: {report.uncovered} record(s) after the last checkpoint are not signed yet", file=sys.stderr)
        return EXIT_OK
    first = report.first_bad
    assert first is not None
    print(f"FAILED: {what}: {first.line()}")
    problems = ", ".join(f"{n} {k}" for k, n in sorted(report.counts.items()))
    print(f"{report.records} record(s) read; problems: {problems}; {signed}")
    for f in report.findings[1:20]:
        print(f"  {f.line()}")
    if len(report.findings) > 20:
        print(f"  ... {sum(report.counts.values()) - 20} more (--json lists {len(report.findings)})")
    return EXIT_FAIL


def cmd_audit_verify(args: argparse.Namespace) -> int:
    keys = read_keys(args.key)
    since = parse_when(args.since, time.time(), "since")
    if args.bundle:
        if not keys:
            raise InvalidInputError("--bundle needs --key PUB: a bundle's own key.pem proves nothing")
        if args.since:
            raise InvalidInputError("--since does not apply to a bundle (it holds what was exported)")
        expected = f"{args.origin}/{args.tenant}" if args.tenant else None
        try:
            report = verify_bundle(Path(args.bundle), keys, expected)
        except BundleError as exc:
            print(f"FAILED: {exc}")
            return EXIT_FAIL
        # the log is named: a bundle of another tenant's log, signed by the same key, verifies as that log
        return _report(args, report, f"bundle {args.bundle} of log {report.origin}")
    if args.store:
        if not args.tenant or not keys:
            raise InvalidInputError("--store needs --tenant T and --key PUB")
        from crossaudit.governance.evidence import verify_store

        report = verify_store(args.store, args.tenant, keys, args.origin, since)
        return _report(args, report, f"log {args.origin}/{args.tenant}")
    with connect.client(args) as c:
        if not keys:
            info = c.log_key()
            keys = info.trusted
            print("note: trusting the key the server names; pin it with --key (crossaudit audit key)", file=sys.stderr)
        checker = ChunkVerifier(keys)
        log = ""
        for chunk in c.read_log(since, outside=True):
            log = log or chunk.log
            checker.feed(chunk)
    return _report(args, checker.finish(), f"log {log}")


def cmd_audit_proof(args: argparse.Namespace) -> int:
    keys = read_keys(args.key)
    with connect.client(args) as c:
        trusted = keys or c.log_key().trusted
        by_id = {k.key_id: k for k in trusted}
        if args.consistency:
            old, new = args.consistency
            proof = c.consistency_proof(old, new)
            try:
                a, b = open_checkpoint(proof.old_checkpoint, by_id), open_checkpoint(proof.new_checkpoint, by_id)
                verify_consistency(a.size, b.size, a.root, b.root, proof.path)
            except (NoteError, ProofError) as exc:
                print(f"FAILED: {exc}")
                return EXIT_FAIL
            doc: dict[str, Any] = {
                "old": proof.old_checkpoint,
                "new": proof.new_checkpoint,
                "path": [h.hex() for h in proof.path],
                "verified": True,
            }
            summary = f"ok: the checkpoint of {b.size} leaves extends the one of {a.size} ({len(proof.path)} hashes)"
        else:
            if not args.decision_id:
                raise InvalidInputError("give a DECISION_ID, or --consistency OLD NEW")
            ip = c.inclusion_proof(args.decision_id)
            try:
                cp = open_checkpoint(ip.checkpoint, by_id)
                if leaf_hash(ip.document).hex() != ip.leaf_hash:
                    raise ProofError("the record does not hash to its leaf")
                verify_inclusion(bytes.fromhex(ip.leaf_hash), ip.seq, cp.size, ip.path, cp.root)
            except (NoteError, ProofError, ValueError) as exc:
                print(f"FAILED: {exc}")
                return EXIT_FAIL
            doc = {
                "decision_id": ip.decision_id,
                "seq": ip.seq,
                "leaf_hash": ip.leaf_hash,
                "document": ip.document.decode(),
                "tree_size": ip.tree_size,
                "path": [h.hex() for h in ip.path],
                "checkpoint": ip.checkpoint,
                "verified": True,
            }
            summary = f"ok: decision {ip.decision_id} is leaf {ip.seq} of the signed tree of {ip.tree_size}"
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        print(summary)
        for h in doc["path"]:
            print(f"  {h}")
    return EXIT_OK


def cmd_audit_export(args: argparse.Namespace) -> int:
    now = time.time()
    since, until = parse_when(args.since, now, "since"), parse_when(args.until, now, "until")
    keys = read_keys(args.key)
    with connect.client(args) as c:
        try:
            report = c.export_log(args.out, keys or None, since=since, until=until)
        except BundleError as exc:
            raise InvalidInputError(str(exc)) from None
    if args.json:
        print(json.dumps({"out": args.out, **report.summary()}, indent=2, default=str))
        return EXIT_OK if report.ok else EXIT_FAIL
    if report.ok:
        print(
            f"wrote {args.out}: {report.records} record(s) from seq {report.start}, verified against "
            f"{report.checkpoints} checkpoint(s); check it with: "
            + command("crossaudit", "audit", "verify", "--bundle", args.out, "--key", "PUB")
        )
        return EXIT_OK
    return _report(args, report, f"export {args.out}")


def cmd_audit_receipt(args: argparse.Namespace) -> int:
    with connect.client(args) as c:
        doc = c.receipt(args.decision_id)
    if args.json:
        print(json.dumps(doc, indent=2, default=str))
        return EXIT_OK
    receipt = doc["receipt"]
    pol = receipt.get("policy", {})
    engine = receipt.get("engine", {})
    print(f"decision {doc['decision_id']}")
    print(
        f"  policy   {pol.get('name')} v{pol.get('version')} (revision {pol.get('revision')}, "
        f"{pol.get('environment')}) sha256 {pol.get('digest')}"
    )
    print(f"  engine   {engine.get('name')} {engine.get('version')}")
    where = "outside the log" if doc.get("log_seq") is None else f"seq {doc['log_seq']} of {doc['log']}"
    print(f"  log      {where}, leaf {doc.get('leaf_hash') or '-'}")
    for ev in receipt.get("evaluators", []):
        facts = ", ".join(f"{k}={v}" for k, v in sorted((ev.get("provenance") or {}).items()))
        cached = " (cached)" if ev.get("cached") else ""
        print(f"  {ev.get('rule')}/{ev.get('evaluator')} [{ev.get('kind')}] {ev.get('status')}{cached}: {facts or '-'}")
    return EXIT_OK
