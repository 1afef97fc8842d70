"""Proofs a tenant's evidence log answers with (inclusion of a decision, consistency of two
checkpoints) and what a server says of the log's keys: plain values, built by the server's log
(:mod:`crossaudit.governance.evidence`) and read by clients."""

from __future__ import annotations

import dataclasses

from crossaudit.evidence.notes import PublicKey


@dataclasses.dataclass(frozen=True)
class InclusionProof:
    decision_id: str
    seq: int
    document: bytes
    leaf_hash: str
    tree_size: int
    path: list[bytes]
    checkpoint: str


@dataclasses.dataclass(frozen=True)
class ConsistencyProof:
    old_checkpoint: str
    new_checkpoint: str
    path: list[bytes]


@dataclasses.dataclass(frozen=True)
class LogKeyInfo:
    """What a server says of a tenant's log: its name, the signing key (None: nothing is
    signed) and every key verification trusts (the current one first)."""

    log: str
    key: PublicKey | None
    trusted: list[PublicKey]
    signing: bool
