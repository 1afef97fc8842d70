"""The receipt's fast encoder writes the canonical encoder's bytes (the decision log hashes them)."""

from __future__ import annotations

from typing import Any

import pytest

from crossaudit.evidence.leaf import receipt_text
from crossaudit.governance.records import receipt_json


def _receipt(name: str = "p", provenance: dict[str, str] | None = None, revision: int = 3) -> dict[str, Any]:
    return {
        "format": "crossaudit.receipt/v1",
        "engine": {"name": "crossaudit", "version": "0.1.0"},
        "policy": {"name": name, "version": "1.0", "revision": revision, "digest": "ab" * 32, "environment": ""},
        "evaluators": [
            {
                "rule": f"rule_{i}",
                "evaluator": "kw",
                "kind": "custom",
                "status": "pass",
                "cached": i % 2 == 0,
                "identity": "cd" * 32,
                "provenance": dict(provenance or {"kind": "custom", "image": "sha256:" + "e" * 64}),
            }
            for i in range(10)
        ],
    }


@pytest.mark.parametrize(
    "receipt",
    [
        _receipt(),
        _receipt(name='quote " backslash \\ slash / tab \t nl \n cr \r bs \b ff \f nul \0 us \x1f del \x7f'),
        _receipt(provenance={"z": "1", "a": "2", "B": "3", "_": "", "a.b": "x"}),
        _receipt(name="café ✓ 𝄞"),  # non-ASCII: json.dumps escapes it, so the canonical encoder writes it
        _receipt(revision=2**70),  # beyond 64 bits: orjson refuses, the canonical encoder writes it
        {"evaluators": [], "engine": None, "policy": {"revision": -1, "flag": False}},
    ],
)
def test_fast_receipt_is_the_canonical_text(receipt: dict[str, Any]) -> None:
    assert receipt_json(receipt) == receipt_text(receipt)
