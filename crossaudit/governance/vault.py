"""The cryptography of retained inputs (docs/retention.md): one operator key wraps a random data
key per tenant; each retained row is sealed under its tenant's data key.

- Operator key: 32 bytes, base64, from a file or an environment variable. Its id is a short
  hash of it, stored beside every key it wrapped, so a wrong key is named as such (by id)
  instead of failing as "tampered". A previous operator key may be configured for rotation:
  keys it wrapped are unwrapped with it and rewrapped under the current one.
- Tenant data key: 32 random bytes, stored only wrapped (AES-GCM, the tenant's name as AAD: a
  wrapped key copied to another tenant does not unwrap).
- Row: AES-GCM under the data key, a fresh 96-bit nonce, AAD binding tenant and decision id: a
  row copied to another tenant or decision does not decrypt.
- Blind index: HMAC-SHA256 of a context field's name and value under a key derived (HKDF) from
  the data key, so erasure by ``user_id=VALUE`` finds rows without the value being stored.

Every failure is typed (:class:`RetentionKeyError`, :class:`RetainedInputsTamperedError`) and
names ids only, never key material or retained text.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import os
import secrets
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from crossaudit.kernel.configfile import check_private_file
from crossaudit.kernel.errors import ConfigurationError, RetainedInputsTamperedError, RetentionKeyError
from crossaudit.kernel.files import read_capped_text
from crossaudit.kernel.shell import command

KEY_BYTES = 32  # AES-256
NONCE_BYTES = 12  # AES-GCM's 96-bit nonce
KEY_ID_HEX = 16  # an operator key's id: the first 64 bits of a domain-separated SHA-256, in hex
MAX_KEY_FILE_BYTES = 4096  # an operator key file holds one base64 line
_WRAP_AAD = b"crossaudit/tenant-key/v1"
_ROW_AAD = b"crossaudit/retained-inputs/v1"
_INDEX_INFO = b"crossaudit/blind-index/v1"


def _aad(label: bytes, *parts: str) -> bytes:
    """``label`` and ``parts`` unambiguously (each part length-prefixed): no two part lists share an AAD."""
    out = [label]
    for part in parts:
        raw = part.encode("utf-8", "surrogatepass")
        out += [len(raw).to_bytes(4, "big"), raw]
    return b"".join(out)


def key_id(key: bytes) -> str:
    return hashlib.sha256(b"crossaudit/operator-key-id/v1\0" + key).hexdigest()[:KEY_ID_HEX]


@dataclass(frozen=True)
class OperatorKey:
    key: bytes = field(repr=False)
    id: str

    @classmethod
    def parse(cls, text: str, where: str) -> OperatorKey:
        """The key in ``text`` (base64 of 32 bytes); errors name ``where``, never the text."""
        try:
            raw = base64.b64decode(text.strip(), validate=True)
        except (binascii.Error, ValueError):
            raise ConfigurationError(f"{where}: not base64 (expected 32 random bytes, base64)") from None
        if len(raw) != KEY_BYTES:
            raise ConfigurationError(f"{where}: {len(raw)} bytes, an operator key is {KEY_BYTES} bytes (base64)")
        return cls(raw, key_id(raw))

    @classmethod
    def load(
        cls, file: Path | None, env: str | None, what: str, environ: Mapping[str, str] | None = None
    ) -> OperatorKey | None:
        """From ``file`` (owner-only) or the variable named ``env``; None when neither is set."""
        if file is not None and env:
            raise ConfigurationError(f"{what}: set its file or its environment variable, not both")
        if file is not None:
            check_private_file(file, what)
            text = read_capped_text(file, MAX_KEY_FILE_BYTES, what, ConfigurationError, encoding="ascii")
            return cls.parse(text, f"{what} {file}")
        if env:
            value = (os.environ if environ is None else environ).get(env)
            if not value:
                raise ConfigurationError(f"{what}: environment variable {env} is not set")
            return cls.parse(value, f"{what} (${env})")
        return None


@dataclass(frozen=True)
class OperatorKeys:
    """The current operator key, and the previous one during a rotation."""

    current: OperatorKey
    previous: OperatorKey | None = None

    def wrap(self, tenant: str, data_key: bytes) -> tuple[str, bytes]:
        """(operator key id, nonce + AES-GCM of ``data_key`` bound to ``tenant``)."""
        nonce = os.urandom(NONCE_BYTES)
        return self.current.id, nonce + AESGCM(self.current.key).encrypt(nonce, data_key, _aad(_WRAP_AAD, tenant))

    def unwrap(self, tenant: str, operator_key_id: str, wrapped: bytes) -> bytes:
        key = next((k for k in (self.current, self.previous) if k is not None and k.id == operator_key_id), None)
        if key is None:
            known = ", ".join(k.id for k in (self.current, self.previous) if k is not None)
            raise RetentionKeyError(
                f"tenant {tenant!r}'s data key is wrapped by operator key {operator_key_id}, not by the configured "
                f"key(s) {known}: configure that key (as retention.previous_operator_key_* during a rotation)"
            )
        try:
            data_key = AESGCM(key.key).decrypt(wrapped[:NONCE_BYTES], wrapped[NONCE_BYTES:], _aad(_WRAP_AAD, tenant))
        except (InvalidTag, ValueError):
            raise RetainedInputsTamperedError(
                f"tenant {tenant!r}'s wrapped data key fails authentication under operator key {key.id}: altered or "
                "copied from another tenant"
            ) from None
        if len(data_key) != KEY_BYTES:
            raise RetainedInputsTamperedError(f"tenant {tenant!r}'s data key has the wrong length")
        return data_key


def new_data_key() -> tuple[str, bytes]:
    """(data key id, a fresh random data key): the id is random, never derived from the key."""
    return secrets.token_hex(8), os.urandom(KEY_BYTES)


@dataclass(frozen=True)
class TenantKey:
    """A tenant's unwrapped data key, and the blind-index key derived from it."""

    tenant: str
    id: str
    key: bytes = field(repr=False)
    index_key: bytes = field(repr=False, default=b"")
    _aead: AESGCM = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_aead", AESGCM(self.key))  # built once: rows are sealed on the hot path

    @classmethod
    def of(cls, tenant: str, key_id_: str, key: bytes) -> TenantKey:
        index = HKDF(algorithm=hashes.SHA256(), length=KEY_BYTES, salt=None, info=_INDEX_INFO).derive(key)
        return cls(tenant, key_id_, key, index)

    def seal(self, decision_id: str, plaintext: bytes) -> tuple[bytes, bytes]:
        """(nonce, ciphertext) of ``plaintext`` bound to this tenant and ``decision_id``."""
        nonce = os.urandom(NONCE_BYTES)
        return nonce, self._aead.encrypt(nonce, plaintext, _aad(_ROW_AAD, self.tenant, decision_id))

    def open(self, decision_id: str, nonce: bytes, ciphertext: bytes) -> bytes:
        try:
            return self._aead.decrypt(nonce, ciphertext, _aad(_ROW_AAD, self.tenant, decision_id))
        except (InvalidTag, ValueError):
            erase = command("crossaudit", "audit", "erase", "--decision", decision_id)
            raise RetainedInputsTamperedError(
                f"the retained inputs of decision {decision_id} fail authentication (altered, or copied from another "
                f"decision or tenant); erase them with `{erase}`"
            ) from None

    def blind(self, name: str, value: Any) -> str:
        """The blind index of context field ``name`` = ``value`` (hex): HMAC of the name's length,
        the name and the value, so no two (name, value) pairs share a message. Both are taken in
        NFC, so an erasure request finds the value whichever Unicode spelling either side used."""
        raw = unicodedata.normalize("NFC", name).encode("utf-8", "surrogatepass")
        msg = len(raw).to_bytes(4, "big") + raw + index_value(value).encode("utf-8", "surrogatepass")
        return hmac.new(self.index_key, msg, hashlib.sha256).hexdigest()


def index_value(value: Any) -> str:
    """A scalar as the text erasure matches: strings as they are, numbers and booleans as JSON,
    so ``user_id=42`` on the command line finds a context holding 42 or "42"."""
    if isinstance(value, str):
        return unicodedata.normalize("NFC", value)
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # a protobuf Struct carries every number as a double
    return json.dumps(value)


def is_indexable(value: Any) -> bool:
    """Top-level scalars only (a nested value is not a field an erasure request can name)."""
    return isinstance(value, str | bool | int | float) and not (isinstance(value, float) and value != value)
