"""The leaf of a decision in its tenant's log: a canonical encoding of the audit record.

The leaf covers what was decided and about what, by content digests: the verdict, the policy
(name, revision, declared version, digest), the digests of the prompt, response, context and
modified response, the rules' results and the decision's receipt (each by the SHA-256 of its
canonical JSON), the errored rules, the time, and the record's sequence number in the log. Raw
text is never in a leaf: erasing retained inputs (docs/retention.md) removes the text and the
quoted violations, and the log still verifies.

The encoding is JSON with sorted keys, no spaces, ASCII only (``json.dumps(doc, sort_keys=True,
separators=(",", ":"))``); floats as Python writes them (the shortest text that reads back as
the same double). An export's ``records.jsonl`` holds these bytes, one leaf a line, so a verifier
needs only SHA-256 and :mod:`crossaudit.evidence.merkle`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from crossaudit.kernel.canonical import canonical_json, sha256_text

LEAF_FORMAT = "crossaudit.decision/v1"  # the leaf document's "log" field: its format and version

# The decisions' columns a leaf is built from, in this order (the store reads exactly these).
LEAF_COLUMNS: tuple[str, ...] = (
    "decision_id",
    "tenant",
    "policy",
    "policy_revision",
    "policy_version",
    "policy_digest",
    "environment",
    "passed",
    "action",
    "rules",
    "errored_rules",
    "latency_ms",
    "prompt_sha256",
    "response_sha256",
    "context_sha256",
    "modified_response_sha256",
    "request_id",
    "created_at",
    "truncated",
    "receipt",
)

_RAW_VIOLATIONS = '"violations": ['  # how json.dumps writes a list of violations (a string cannot hold it unescaped)


def _counted(rules: Any) -> Any:
    for rule in rules if isinstance(rules, list) else ():
        for ev in rule.get("evaluators") or () if isinstance(rule, dict) else ():
            if isinstance(ev, dict) and isinstance(ev.get("violations"), list):
                ev["violations"] = len(ev["violations"])
    return rules


_RAW_VIOLATIONS_BYTES = _RAW_VIOLATIONS.encode()


def rules_text(stored: str | bytes | memoryview) -> str:
    """The rules as a record without raw text stores them: each evaluator's violations by their
    count. A record kept with raw text, and the same record after an erasure, give one text."""
    if isinstance(stored, (bytes, memoryview)):
        stored = bytes(stored).decode("utf-8", "surrogatepass")
    if _RAW_VIOLATIONS not in stored:
        return stored
    return json.dumps(_counted(json.loads(stored)), default=str)


def rules_sha256(stored: str | bytes | memoryview) -> str:
    """SHA-256 (hex) of :func:`rules_text` of ``stored``, without decoding bytes that need no change."""
    if isinstance(stored, memoryview):  # a driver may hand bytes over as a view
        stored = bytes(stored)
    if isinstance(stored, bytes):
        if _RAW_VIOLATIONS_BYTES not in stored:
            return sha256_text(stored)
        stored = stored.decode("utf-8", "surrogatepass")
    return sha256_text(rules_text(stored))


def receipt_text(receipt: Any) -> str:
    """A receipt as stored: canonical JSON, so its digest is the digest of the stored text."""
    return canonical_json(receipt, stringify=True)


_str = json.encoder.encode_basestring_ascii  # type: ignore[attr-defined]  # json.dumps' own (C) string escaper
_float = float.__repr__


def _num(x: float) -> str:
    """A float as json.dumps writes it (NaN and the infinities as JavaScript names)."""
    if x != x:
        return "NaN"
    if x in (float("inf"), float("-inf")):
        return "Infinity" if x > 0 else "-Infinity"
    return _float(x)


def _errored(stored: str) -> str:
    """The errored rules (a JSON list of names, as stored) in the canonical encoding."""
    if stored == "[]":
        return stored
    return "[" + ",".join(_str(str(name)) for name in json.loads(stored)) + "]"


def _opt(value: str | None) -> str:
    return "null" if value is None else _str(value)


def leaf_document(row: Sequence[Any], seq: int) -> bytes:
    """The leaf bytes of the decision whose :data:`LEAF_COLUMNS` values (as stored: rules,
    errored rules and receipt as JSON text, passed as 0/1) are ``row``, at ``seq`` in its log.

    Written field by field in sorted key order: exactly ``json.dumps(doc, sort_keys=True,
    separators=(",", ":"))`` of the document (a test holds the two equal), several times faster,
    which is what lets ``verify`` read tens of thousands of records a second."""
    (
        decision_id,
        tenant,
        policy,
        policy_revision,
        policy_version,
        policy_digest,
        environment,
        passed,
        action,
        rules,
        errored_rules,
        latency_ms,
        prompt_sha256,
        response_sha256,
        context_sha256,
        modified_response_sha256,
        request_id,
        created_at,
        truncated,
        receipt,
    ) = row
    text = (
        f'{{"action":{_str(action)},"context_sha256":{_str(context_sha256)},"created_at":{_num(float(created_at))},'
        f'"decision_id":{_str(decision_id)},"environment":{_str(environment)},'
        f'"errored_rules":{_errored(errored_rules)},"latency_ms":{_num(float(latency_ms))},'
        f'"log":{_str(LEAF_FORMAT)},"modified_response_sha256":{_opt(modified_response_sha256)},'
        f'"passed":{"true" if passed else "false"},"policy":{_str(policy)},"policy_digest":{_str(policy_digest)},'
        f'"policy_revision":{int(policy_revision)},"policy_version":{_str(policy_version)},'
        f'"prompt_sha256":{_str(prompt_sha256)},"receipt_sha256":"{sha256_text(receipt or b"{}")}",'
        f'"request_id":{_str(request_id)},"response_sha256":{_str(response_sha256)},'
        f'"rules_sha256":"{rules_sha256(rules)}","seq":{int(seq)},"tenant":{_str(tenant)},'
        f'"truncated":{_str(truncated)}}}'
    )
    return text.encode()


def leaf_document_reference(row: Sequence[Any], seq: int) -> bytes:
    """:func:`leaf_document` written the plain way (json.dumps of the document): the definition
    the fast one is tested against."""
    (decision_id, tenant, policy, policy_revision, policy_version, policy_digest, environment, passed, action,
     rules, errored_rules, latency_ms, prompt_sha256, response_sha256, context_sha256, modified_response_sha256,
     request_id, created_at, truncated, receipt) = row  # fmt: skip
    doc = {
        "log": LEAF_FORMAT,
        "seq": int(seq),
        "decision_id": decision_id,
        "tenant": tenant,
        "policy": policy,
        "policy_revision": int(policy_revision),
        "policy_version": policy_version,
        "policy_digest": policy_digest,
        "environment": environment,
        "passed": bool(passed),
        "action": action,
        "rules_sha256": sha256_text(rules_text(rules)),
        "errored_rules": json.loads(errored_rules),
        "latency_ms": float(latency_ms),
        "prompt_sha256": prompt_sha256,
        "response_sha256": response_sha256,
        "context_sha256": context_sha256,
        "modified_response_sha256": modified_response_sha256,
        "request_id": request_id,
        "created_at": float(created_at),
        "truncated": truncated,
        "receipt_sha256": sha256_text(receipt or "{}"),
    }
    return canonical_json(doc).encode()
