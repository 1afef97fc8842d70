"""Signed checkpoints: the tree heads of a tenant's decision log, as C2SP signed notes.

A checkpoint (C2SP ``tlog-checkpoint``) is a text body of the log's origin, its tree size, the
root hash in base64 and extension lines, signed with Ed25519 as a C2SP ``signed-note``: a blank
line, then ``— <key name> <base64(key hash || signature)>`` where the key hash is the first four
bytes of SHA-256(name || "\\n" || 0x01 || public key). Any tool that reads Go's ``note`` or
Sigstore checkpoints reads these; the verifier key is printed in that ``name+hash+base64`` form
as well as PEM.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import hashlib
import re

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

SIG_PREFIX = "\u2014 "  # an em dash and a space start every signature line
ED25519_ALG = b"\x01"  # signed-note's algorithm byte for Ed25519
_KEY_NAME = re.compile(r"^[!-*,-~]+$")  # printable, no space, no '+'
TIME_EXTENSION = "timestamp "  # the extension line carrying when the checkpoint was signed
_TIMESTAMP = re.compile(r"^timestamp [0-9]{1,19}$")  # seconds, at most an int64's digits


class EvidenceKeyError(ValueError):
    """A key file that is missing, unreadable or not an Ed25519 key (the message says which)."""


class NoteError(ValueError):
    """A checkpoint that does not parse or whose signature does not verify under a trusted key."""


def key_hash(name: str, public: bytes) -> bytes:
    return hashlib.sha256(name.encode() + b"\n" + ED25519_ALG + public).digest()[:4]


@dataclasses.dataclass(frozen=True)
class PublicKey:
    """A verifier key: its note name and raw 32-byte Ed25519 public key."""

    name: str
    raw: bytes

    @property
    def key_id(self) -> str:
        """What names the key in a checkpoint and in the store: its 4-byte note hash, in hex."""
        return key_hash(self.name, self.raw).hex()

    def vkey(self) -> str:
        """The ``name+hash+base64`` verifier key string of Go's ``note`` package."""
        return f"{self.name}+{self.key_id}+{base64.b64encode(ED25519_ALG + self.raw).decode()}"

    def pem(self) -> str:
        key = Ed25519PublicKey.from_public_bytes(self.raw)
        return key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()

    def verify(self, message: bytes, signature: bytes) -> bool:
        try:
            Ed25519PublicKey.from_public_bytes(self.raw).verify(signature, message)
        except InvalidSignature:
            return False
        return True


@dataclasses.dataclass(frozen=True)
class SigningKey:
    name: str
    private: Ed25519PrivateKey

    @property
    def public(self) -> PublicKey:
        raw = self.private.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        return PublicKey(self.name, raw)

    def sign(self, body: str) -> str:
        """``body`` (ending in a newline) as a signed note."""
        sig = self.private.sign(body.encode())
        pub = self.public
        return f"{body}\n{SIG_PREFIX}{self.name} {base64.b64encode(key_hash(self.name, pub.raw) + sig).decode()}\n"


def check_key_name(name: str) -> str:
    if not _KEY_NAME.match(name):
        raise EvidenceKeyError(f"key name {name!r}: printable characters without spaces or '+'")
    return name


def generate_private_pem() -> bytes:
    return Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def load_signing_key(pem: bytes, name: str, where: str) -> SigningKey:
    try:
        key = serialization.load_pem_private_key(pem, password=None)
    except (ValueError, TypeError) as exc:
        raise EvidenceKeyError(f"{where}: not a PEM private key without a password ({exc})") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise EvidenceKeyError(f"{where}: a {type(key).__name__.lstrip('_')}, not an Ed25519 private key")
    return SigningKey(check_key_name(name), key)


def load_public_key(text: str, where: str, name: str = "") -> PublicKey:
    """A verifier key from PEM (named ``name``, or the key's name in a vkey line) or a vkey string."""
    text = text.strip()
    if text.startswith("-----BEGIN"):
        try:
            key = serialization.load_pem_public_key(text.encode())
        except (ValueError, TypeError) as exc:
            raise EvidenceKeyError(f"{where}: not a PEM public key ({exc})") from None
        if not isinstance(key, Ed25519PublicKey):
            raise EvidenceKeyError(f"{where}: not an Ed25519 public key")
        raw = key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        return PublicKey(check_key_name(name or "crossaudit"), raw)
    parts = text.split("+", 2)  # the base64 key may hold '+' itself
    if len(parts) != 3:
        raise EvidenceKeyError(f"{where}: neither a PEM public key nor a 'name+hash+base64' verifier key")
    kname, khash, kdata = parts
    try:
        blob = base64.b64decode(kdata, validate=True)
    except binascii.Error:
        raise EvidenceKeyError(f"{where}: the verifier key's key is not base64") from None
    if len(blob) != 33 or blob[:1] != ED25519_ALG:
        raise EvidenceKeyError(f"{where}: not an Ed25519 verifier key")
    pub = PublicKey(check_key_name(kname), blob[1:])
    if pub.key_id != khash.lower():
        raise EvidenceKeyError(f"{where}: the verifier key's hash does not match its key")
    return pub


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """A signed tree head: ``size`` leaves of log ``origin`` hash to ``root``; ``note`` is the
    signed text as stored, ``key_id`` the key that signed it."""

    origin: str
    size: int
    root: bytes
    timestamp: int
    note: str
    key_id: str


def checkpoint_body(origin: str, size: int, root: bytes, timestamp: int) -> str:
    return f"{origin}\n{size}\n{base64.b64encode(root).decode()}\n{TIME_EXTENSION}{timestamp}\n"


def sign_checkpoint(key: SigningKey, origin: str, size: int, root: bytes, timestamp: int) -> Checkpoint:
    note = key.sign(checkpoint_body(origin, size, root, timestamp))
    return Checkpoint(origin, size, root, timestamp, note, key.public.key_id)


def open_checkpoint(note: str, trusted: dict[str, PublicKey]) -> Checkpoint:
    """The checkpoint ``note`` carries, once a signature by one of ``trusted`` (by key id)
    verifies; NoteError names what is wrong (malformed, unknown key, bad signature)."""
    body, sep, sigs = note.partition("\n\n")
    if not sep or not body:
        raise NoteError("not a signed note (no blank line before the signatures)")
    body += "\n"
    lines = body.split("\n")
    if len(lines) < 4:
        raise NoteError("a checkpoint names its origin, size and root")
    origin, size_s, root_s = lines[0], lines[1], lines[2]
    try:
        size = int(size_s)
        root = base64.b64decode(root_s, validate=True)
    except (ValueError, binascii.Error):
        raise NoteError("a checkpoint's size or root does not parse") from None
    if size < 0 or len(root) != 32 or str(size) != size_s:
        raise NoteError("a checkpoint's size or root does not parse")
    timestamp = 0
    for line in lines[3:]:
        if _TIMESTAMP.match(line):  # ASCII digits only: str.isdigit() also says yes to '²', which int() refuses
            timestamp = int(line[len(TIME_EXTENSION) :])
    seen: list[str] = []
    for line in sigs.splitlines():
        if not line.startswith(SIG_PREFIX):
            raise NoteError("a signature line does not start with an em dash")
        name, _, b64 = line[len(SIG_PREFIX) :].partition(" ")
        try:
            blob = base64.b64decode(b64, validate=True)
        except binascii.Error:
            raise NoteError("a signature is not base64") from None
        if len(blob) != 68:
            raise NoteError("a signature is not an Ed25519 signature")
        kid = blob[:4].hex()
        seen.append(f"{name}+{kid}")
        pub = trusted.get(kid)
        if pub is None or pub.name != name:
            continue
        if not pub.verify(body.encode(), blob[4:]):
            raise NoteError(f"the signature by key {name}+{kid} does not verify: the checkpoint was altered")
        return Checkpoint(origin, size, root, timestamp, note, kid)
    if not seen:
        raise NoteError("the checkpoint carries no signature")
    raise NoteError(f"signed by {', '.join(seen)}, which is not a trusted key")
