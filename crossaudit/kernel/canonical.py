"""Canonical JSON and SHA-256 digests: the one definition of each, for everything that hashes.

Canonical JSON is ``json.dumps(doc, sort_keys=True, separators=(",", ":"))``: sorted keys, no
spaces, NaN and the infinities as ``NaN``/``Infinity``/``-Infinity`` (json's default). Its text
feeds stored digests and the evidence log's leaves, so it must never change; two details vary
between its uses, and each caller says which it wants:

- ``ascii`` (default True): non-ASCII characters escaped (``\\u00e9``); False writes them as they
  are (the sandbox protocol's sizes and violation texts, the LLM cassettes' request digests).
- ``stringify`` (default False): a value JSON has no type for is written as ``str(value)``
  (the store's digests, receipts); without it such a value is a TypeError.

Text is hashed as UTF-8 with lone surrogates passed through (``surrogatepass``), so any Python
string a caller sent has a digest.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

FILE_CHUNK_BYTES = 1 << 20  # a file is hashed a megabyte at a time

_ENCODERS: dict[tuple[bool, bool], Callable[[Any], str]] = {
    (ascii_only, stringify): json.JSONEncoder(
        sort_keys=True, separators=(",", ":"), ensure_ascii=ascii_only, default=str if stringify else None
    ).encode
    for ascii_only in (True, False)
    for stringify in (True, False)
}


def canonical_json(doc: Any, *, ascii: bool = True, stringify: bool = False) -> str:
    """``doc`` as canonical JSON (see the module docstring for ``ascii`` and ``stringify``)."""
    return _ENCODERS[ascii, stringify](doc)


def sha256_text(text: str | bytes | memoryview) -> str:
    """SHA-256 (hex) of ``text``: a string as UTF-8 (lone surrogates passed through), bytes as they are."""
    data = text if isinstance(text, (bytes, memoryview)) else text.encode("utf-8", "surrogatepass")
    return hashlib.sha256(data).hexdigest()


def sha256_json(doc: Any) -> str:
    """SHA-256 (hex) of ``doc``'s canonical JSON (ASCII, other values as ``str``): the store's digests."""
    return sha256_text(canonical_json(doc, stringify=True))


def file_sha256(path: str | Path) -> str:
    """SHA-256 (hex) of a file's bytes, read a chunk at a time."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(FILE_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()
