"""The leaf document: the fast encoder writes exactly json.dumps(sort_keys) of the document, for
hostile text and awkward numbers alike; erasure leaves a record's leaf unchanged."""

from __future__ import annotations

import json
import random

import pytest

from crossaudit.evidence.leaf import LEAF_COLUMNS, leaf_document, leaf_document_reference, rules_text

AWKWARD_FLOATS = [0.0, -0.0, 1.5, 1e21, 1e-7, 5e-324, 1.7976931348623157e308, 123456789.123456, float("nan"),
                  float("inf"), float("-inf"), 1_764_250_000.123456]  # fmt: skip
AWKWARD_TEXT = ["", "plain", 'quote " and \\ backslash', "tab\tnewline\n", "\u2028\u2029", "é", "😀 emoji",
                "\x00\x1f control", "\ud800 lone surrogate", "</script>", "a" * 300]  # fmt: skip


def _row(rng: random.Random) -> list:
    text = lambda: rng.choice(AWKWARD_TEXT)  # noqa: E731
    errored = json.dumps(rng.sample(AWKWARD_TEXT, rng.randint(0, 3)))
    values = {
        "decision_id": text(),
        "tenant": text(),
        "policy": text(),
        "policy_revision": rng.randint(0, 2**40),
        "policy_version": text(),
        "policy_digest": text(),
        "environment": text(),
        "passed": rng.choice([0, 1]),
        "action": text(),
        "rules": json.dumps([{"rule": text(), "evaluators": [{"violations": [text()]}]}]),
        "errored_rules": rng.choice([errored, "[]"]),
        "latency_ms": rng.choice(AWKWARD_FLOATS),
        "prompt_sha256": text(),
        "response_sha256": text(),
        "context_sha256": text(),
        "modified_response_sha256": rng.choice([None, text()]),
        "request_id": text(),
        "created_at": rng.choice(AWKWARD_FLOATS),
        "truncated": text(),
        "receipt": rng.choice(["{}", json.dumps({"policy": {"name": text()}}), None]),
    }
    if rng.random() < 0.5:  # as verification reads them: UTF-8 bytes
        values["rules"] = values["rules"].encode()
        values["receipt"] = values["receipt"].encode() if values["receipt"] is not None else None
    return [values[c] for c in LEAF_COLUMNS]


def test_the_fast_leaf_encoder_writes_exactly_the_reference_encoding() -> None:
    rng = random.Random(23)
    for _ in range(2_000):
        row = _row(rng)
        seq = rng.randint(0, 2**40)
        assert leaf_document(row, seq) == leaf_document_reference(row, seq)


def test_a_leaf_is_canonical_json_with_digests_not_raw_text() -> None:
    row = _row(random.Random(1))
    doc = json.loads(leaf_document(row, 7))
    assert doc["seq"] == 7 and doc["log"] == "crossaudit.decision/v1"
    assert "rules" not in doc and "receipt" not in doc and len(doc["rules_sha256"]) == 64


@pytest.mark.parametrize("violations", [["a quoted span"], [], ["x", 'y\n"z']])
def test_rules_kept_raw_and_the_same_rules_after_erasure_have_one_text(violations: list[str]) -> None:
    raw = [{"rule": "r", "evaluators": [{"evaluator": "e", "violations": violations, "score": 0.5}]}]
    counted = [{"rule": "r", "evaluators": [{"evaluator": "e", "violations": len(violations), "score": 0.5}]}]
    assert rules_text(json.dumps(raw)) == rules_text(json.dumps(counted)) == json.dumps(counted)
