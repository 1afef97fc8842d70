"""crossaudit.kernel.canonical: each variant of canonical JSON is, byte for byte, the json.dumps
its callers wrote before (the digests and Merkle leaves it feeds must not move), and the
SHA-256 helpers hash what they did."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import math

import pytest

from crossaudit.evidence.leaf import receipt_text
from crossaudit.kernel.canonical import canonical_json, file_sha256, sha256_json, sha256_text

DOC = {
    "b": [1, 2.5, -0.0, 1e300, True, None],
    "a": {"z": "é ü ✓ 😀", "y": '\u2028 \x7f \x00 "q" \\'},
    "n": math.nan,
    "i": math.inf,
    "-i": -math.inf,
    "s": "\ud800",  # a lone surrogate
    "big": 10**30,
}
STRANGE = {"when": dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC), "tuple": (1, "x")}
COMPACT = {"sort_keys": True, "separators": (",", ":")}


@pytest.mark.parametrize(
    ("kwargs", "dumps"),
    [
        ({}, {}),
        ({"ascii": False}, {"ensure_ascii": False}),
        ({"stringify": True}, {"default": str}),
        ({"ascii": False, "stringify": True}, {"ensure_ascii": False, "default": str}),
    ],
)
def test_each_variant_is_json_dumps_sorted_and_compact(kwargs: dict, dumps: dict) -> None:
    assert canonical_json(DOC, **kwargs) == json.dumps(DOC, **COMPACT, **dumps)
    assert canonical_json("é", **kwargs) == json.dumps("é", **COMPACT, **dumps)


def test_the_details_that_differ_stay_as_they_were() -> None:
    assert canonical_json({"b": 1, "a": "é"}) == '{"a":"\\u00e9","b":1}'  # ASCII, sorted, no spaces
    assert canonical_json({"b": 1, "a": "é"}, ascii=False) == '{"a":"é","b":1}'
    assert canonical_json([math.nan, math.inf, -math.inf]) == "[NaN,Infinity,-Infinity]"  # NaN allowed
    with pytest.raises(TypeError):
        canonical_json(STRANGE)  # strict unless asked to stringify
    assert canonical_json(STRANGE, stringify=True) == '{"tuple":[1,"x"],"when":"2026-01-02 03:04:05+00:00"}'


def test_digests() -> None:
    assert sha256_text("abc") == hashlib.sha256(b"abc").hexdigest()
    assert sha256_text(b"abc") == sha256_text(memoryview(b"abc")) == sha256_text("abc")
    assert sha256_text("\ud800") == hashlib.sha256("\ud800".encode("utf-8", "surrogatepass")).hexdigest()
    expected = hashlib.sha256(json.dumps(STRANGE, **COMPACT, default=str).encode()).hexdigest()
    assert sha256_json(STRANGE) == expected
    assert receipt_text(STRANGE) == json.dumps(STRANGE, **COMPACT, default=str)


def test_file_sha256(tmp_path) -> None:
    data = bytes(range(256)) * 9000  # more than one chunk
    path = tmp_path / "f"
    path.write_bytes(data)
    assert file_sha256(path) == file_sha256(str(path)) == hashlib.sha256(data).hexdigest()
    (tmp_path / "empty").write_bytes(b"")
    assert file_sha256(tmp_path / "empty") == hashlib.sha256(b"").hexdigest()
