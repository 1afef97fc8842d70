"""The per-decision audit cap measures a record's raw violations without encoding them whole
(megabytes encoded at once hold the interpreter lock, and every tenant's calls wait): the
measure must be exact, and the record kept must be the one a full encoding would have kept."""

from __future__ import annotations

import dataclasses
import random

from crossaudit.governance import records
from crossaudit.kernel.results import Action, Decision
from crossaudit.store.base import audit_size
from tests.records import audit_record


class _Version:
    """What an audit record reads of the policy version it was decided under."""

    version = 1
    digest = "0" * 64


ALPHABET = 'ab"\\\n\t\u00e9\u4e2d\U0001f600 x\x00'


def _random_record(rng: random.Random):
    evaluators = [
        {
            "evaluator": f"e{k}",
            "violations": [
                "".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, 40))) for _ in range(rng.randint(0, 12))
            ],
        }
        for k in range(rng.randint(1, 3))
    ]
    rules = [
        {
            "rule": "r",
            "status": "failed",
            "passed": False,
            "action": "block",
            "reason": "y" * rng.randint(0, 600),
            "evaluators": evaluators,
        }
    ]
    return audit_record(rules=rules, prompt="p" * rng.randint(0, 500), response="q" * rng.randint(0, 500))


def _fit_by_encoding_everything(rec, cap):
    """The reference: encode the whole record, then cut in order until it fits."""
    size = audit_size(rec)
    if size <= cap:
        return rec, size, records.audit_rules_json(rec)
    before, cut = size, []
    for name, step in records._CUTS:
        rec = step(rec)
        cut.append(name)
        note = f"{records.AUDIT_DECISION_KEY}={cap}: cut {', '.join(cut)} (was {before} bytes)"
        rec = dataclasses.replace(rec, truncated=note)  # the note is measured with the record
        if audit_size(rec) <= cap:
            break
    rules_json = records.audit_rules_json(rec)
    return rec, audit_size(rec, rules_json), rules_json


def test_violations_are_measured_exactly() -> None:
    rng = random.Random(7)
    for _ in range(300):
        rec = _random_record(rng)
        extra = records._violations_json_bytes(rec)
        assert extra is not None
        assert audit_size(rec) == audit_size(records._CUTS[0][1](rec)) + extra


def test_the_record_kept_is_the_one_full_encoding_keeps() -> None:
    rng = random.Random(11)
    for _ in range(200):
        rec = _random_record(rng)
        for cap in (600, 1_500, 3_000, 8_000, 1_000_000):
            assert records.fit_audit(rec, cap) == _fit_by_encoding_everything(rec, cap)


def test_records_without_raw_violations_are_measured_as_before() -> None:
    rec = audit_record(rules=[{"rule": "r", "evaluators": [{"evaluator": "e", "violations": 3}]}])
    assert records._violations_json_bytes(rec) is None
    assert records.fit_audit(rec, 100_000) == _fit_by_encoding_everything(rec, 100_000)


def test_a_cut_record_is_within_the_cap_its_note_included() -> None:
    """The note saying what was cut is part of the record: measured without it, a record cut
    just under the cap was stored over it (found by an attack on the cap). Over the cap only
    when nothing more can go."""
    rng = random.Random(5)
    last_cut = records._CUTS[-1][0]
    for _ in range(300):
        rec = _random_record(rng)
        floor = audit_size(records.fit_audit(rec, 0)[0])  # everything cut: about the least it can be
        for cap in (floor, floor + 1, floor + 37, 1_000, 3_000):
            kept, size, _ = records.fit_audit(rec, cap)
            assert size == audit_size(kept)
            everything_went = kept.truncated.endswith(f"{last_cut} (was {audit_size(rec)} bytes)")
            assert size <= cap or everything_went, (cap, size, kept.truncated)


def test_nul_in_raw_texts_is_measured_as_stored() -> None:
    """PostgreSQL stores NUL as U+FFFD (3 bytes): the raw texts carry it already, on every
    backend, so a prompt of NULs is not stored at three times its measured size."""
    from crossaudit.governance.records import audit_record as build
    from crossaudit.store.base import NUL_REPLACEMENT

    decision = Decision(policy="p", policy_version="1", passed=True, action=Action.ALLOW, rules=[])
    rec = build("t", decision, _Version(), "production", "\0" * 10, "a\0b", {}, raw=True, request_id="", now=0.0)
    assert rec.prompt == NUL_REPLACEMENT * 10 and rec.response == f"a{NUL_REPLACEMENT}b"
    assert audit_size(rec) - audit_size(dataclasses.replace(rec, prompt="", response="")) == 3 * 10 + 5
