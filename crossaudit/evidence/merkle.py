"""Merkle tree hashing of RFC 6962 / RFC 9162 (section 2.1), with SHA-256.

A leaf's hash is ``SHA-256(0x00 || data)``, an interior node's ``SHA-256(0x01 || left || right)``;
the tree over ``n`` leaves splits at the largest power of two below ``n``. Inclusion and
consistency proofs are generated from the leaf hashes (``PROOF`` and ``SUBPROOF`` of RFC 6962
2.1.1 and 2.1.2) and verified by the algorithms of RFC 9162 2.1.3.2 and 2.1.4.2, which need only
the proof, the sizes and the roots.

A *range proof* is what an export carries so that records ``[lo, hi)`` can be checked against a
signed root of a larger tree without the other records: the hashes of the maximal subtrees of
the RFC's recursion that lie wholly outside ``[lo, hi)`` (at most two per level).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence

HASH_SIZE = 32
EMPTY_ROOT = hashlib.sha256(b"").digest()  # MTH({}) = SHA-256()

_sha256 = hashlib.sha256


class ProofError(ValueError):
    """A proof that does not fit its sizes, or does not lead to the expected root."""


def leaf_hash(data: bytes) -> bytes:
    return _sha256(b"\x00" + data).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    return _sha256(b"\x01" + left + right).digest()


def _split(n: int) -> int:
    """The largest power of two strictly below ``n`` (n >= 2)."""
    return 1 << ((n - 1).bit_length() - 1)


class Frontier:
    """The right edge of a growing tree: the roots of its perfect subtrees, largest first.

    Appending a leaf costs one hash plus one per subtree it completes (amortised two); the
    root of the tree so far folds the edge from the right, exactly RFC 6962's MTH."""

    __slots__ = ("_hashes", "_heights", "size")

    def __init__(self) -> None:
        self._hashes: list[bytes] = []
        self._heights: list[int] = []
        self.size = 0

    def append(self, leaf: bytes) -> None:
        """Add a leaf by its hash (:func:`leaf_hash`)."""
        hashes, heights = self._hashes, self._heights
        h, height = leaf, 0
        while heights and heights[-1] == height:
            h = _sha256(b"\x01" + hashes.pop() + h).digest()
            heights.pop()
            height += 1
        hashes.append(h)
        heights.append(height)
        self.size += 1

    def root(self) -> bytes:
        if not self._hashes:
            return EMPTY_ROOT
        r = self._hashes[-1]
        for h in reversed(self._hashes[:-1]):
            r = node_hash(h, r)
        return r

    def state(self) -> list[str]:
        """The edge as hex strings (stored with a checkpoint, so the next one need not re-read
        the leaves before it)."""
        return [h.hex() for h in self._hashes]

    @classmethod
    def restore(cls, size: int, state: Sequence[str]) -> Frontier:
        """The edge of a tree of ``size`` leaves from :meth:`state`; its shape follows from the size."""
        heights = [bit for bit in range(size.bit_length() - 1, -1, -1) if size >> bit & 1]
        if len(heights) != len(state):
            raise ProofError(f"a frontier of a tree of {size} leaves has {len(heights)} hashes, not {len(state)}")
        f = cls()
        f._hashes = [bytes.fromhex(h) for h in state]
        f._heights = heights
        f.size = size
        return f


def root(leaves: Sequence[bytes]) -> bytes:
    """MTH of the leaf hashes ``leaves``."""
    f = Frontier()
    for h in leaves:
        f.append(h)
    return f.root()


def _mth(leaves: Sequence[bytes], lo: int, hi: int) -> bytes:
    if hi - lo == 1:
        return leaves[lo]
    f = Frontier()
    for i in range(lo, hi):
        f.append(leaves[i])
    return f.root()


Subtree = Callable[[int, int], bytes]  # MTH(D[a:b]) of the log, however it is computed


def of_leaves(leaves: Sequence[bytes]) -> Subtree:
    """MTH of ranges of a list of leaf hashes held in memory."""
    return lambda a, b: _mth(leaves, a, b)


def inclusion_path(index: int, size: int) -> list[tuple[int, int]]:
    """The subtrees whose roots make PATH(index, D[0:size]) of RFC 6962 2.1.1, leaf upwards."""
    if not 0 <= index < size:
        raise ProofError(f"no leaf {index} in a tree of {size} leaves")
    path: list[tuple[int, int]] = []
    lo, hi = 0, size
    while hi - lo > 1:
        k = _split(hi - lo)
        if index - lo < k:
            path.append((lo + k, hi))
            hi = lo + k
        else:
            path.append((lo, lo + k))
            lo += k
    path.reverse()
    return path


def inclusion_proof(leaves: Sequence[bytes] | Subtree, index: int, size: int) -> list[bytes]:
    """PATH(index, D[0:size]) of RFC 6962 2.1.1, from the leaf hashes (or a subtree function)."""
    if not callable(leaves) and size > len(leaves):
        raise ProofError(f"no tree of {size} leaves in {len(leaves)}")
    subtree = leaves if callable(leaves) else of_leaves(leaves)
    return [subtree(a, b) for a, b in inclusion_path(index, size)]


def root_from_inclusion(leaf: bytes, index: int, size: int, proof: Sequence[bytes]) -> bytes:
    """The root that ``proof`` leads to from leaf hash ``leaf`` at ``index`` (RFC 9162 2.1.3.2)."""
    if not 0 <= index < size:
        raise ProofError(f"no leaf {index} in a tree of {size} leaves")
    fn, sn, r = index, size - 1, leaf
    for p in proof:
        if sn == 0:
            raise ProofError("the inclusion proof is longer than the tree is deep")
        if fn & 1 or fn == sn:
            r = node_hash(p, r)
            if not fn & 1:
                while fn & 1 == 0 and fn != 0:
                    fn >>= 1
                    sn >>= 1
        else:
            r = node_hash(r, p)
        fn >>= 1
        sn >>= 1
    if sn != 0:
        raise ProofError("the inclusion proof is shorter than the tree is deep")
    return r


def verify_inclusion(leaf: bytes, index: int, size: int, proof: Sequence[bytes], expected_root: bytes) -> None:
    if root_from_inclusion(leaf, index, size, proof) != expected_root:
        raise ProofError(f"leaf {index} is not in the tree of {size} leaves with that root")


def consistency_path(old: int, new: int) -> list[tuple[int, int]]:
    """The subtrees whose roots make PROOF(old, D[0:new]) of RFC 6962 2.1.2, in order."""
    if not 0 < old <= new:
        raise ProofError(f"no consistency proof from {old} to {new} leaves")

    def sub(m: int, lo: int, hi: int, whole: bool) -> list[tuple[int, int]]:
        n = hi - lo
        if m == n:
            return [] if whole else [(lo, hi)]
        k = _split(n)
        if m <= k:
            return [*sub(m, lo, lo + k, whole), (lo + k, hi)]
        return [*sub(m - k, lo + k, hi, False), (lo, lo + k)]

    return sub(old, 0, new, True)


def consistency_proof(leaves: Sequence[bytes] | Subtree, old: int, new: int) -> list[bytes]:
    """PROOF(old, D[0:new]) of RFC 6962 2.1.2, from the leaf hashes (or a subtree function)."""
    if not callable(leaves) and new > len(leaves):
        raise ProofError(f"no tree of {new} leaves in {len(leaves)}")
    subtree = leaves if callable(leaves) else of_leaves(leaves)
    return [subtree(a, b) for a, b in consistency_path(old, new)]


def verify_consistency(old: int, new: int, old_root: bytes, new_root: bytes, proof: Sequence[bytes]) -> None:
    """RFC 9162 2.1.4.2: ``proof`` shows the tree of ``new`` leaves extends the one of ``old``."""
    if not 0 < old <= new:
        raise ProofError(f"no consistency between trees of {old} and {new} leaves")
    if old == new:
        if proof:
            raise ProofError("a proof between equal sizes is empty")
        if old_root != new_root:
            raise ProofError("two roots of the same size differ")
        return
    path = list(proof)
    if not path:
        raise ProofError("the consistency proof is empty")
    if old & (old - 1) == 0:  # a power of two: the old root is the first node
        path.insert(0, old_root)
    fn, sn = old - 1, new - 1
    while fn & 1:
        fn >>= 1
        sn >>= 1
    fr = sr = path[0]
    for c in path[1:]:
        if sn == 0:
            raise ProofError("the consistency proof is longer than the tree is deep")
        if fn & 1 or fn == sn:
            fr = node_hash(c, fr)
            sr = node_hash(c, sr)
            if not fn & 1:
                while fn & 1 == 0 and fn != 0:
                    fn >>= 1
                    sn >>= 1
        else:
            sr = node_hash(sr, c)
        fn >>= 1
        sn >>= 1
    if sn != 0:
        raise ProofError("the consistency proof is shorter than the tree is deep")
    if fr != old_root:
        raise ProofError(f"the proof does not lead to the old root of {old} leaves")
    if sr != new_root:
        raise ProofError(f"the proof does not lead to the new root of {new} leaves")


# --- range proofs: a slice of the leaves checked against the root of the whole tree ---------

Node = tuple[int, int, bytes]  # [lo, hi) and its subtree's hash


def range_path(size: int, lo: int, hi: int) -> list[tuple[int, int]]:
    """The subtrees of :func:`range_proof`, in order."""
    return [(a, b) for a, b, _ in range_proof(lambda a, b: b"", size, lo, hi)]


def range_proof(subtree: Subtree, size: int, lo: int, hi: int) -> list[Node]:
    """The subtrees of the tree of ``size`` leaves that lie wholly outside ``[lo, hi)`` and are
    maximal in RFC 6962's recursion, in order; ``subtree(a, b)`` gives MTH(D[a:b])."""
    if not 0 <= lo <= hi <= size:
        raise ProofError(f"no range [{lo}, {hi}) in a tree of {size} leaves")
    out: list[Node] = []

    def walk(a: int, b: int) -> None:
        if b <= lo or a >= hi:
            out.append((a, b, subtree(a, b)))
        elif not (lo <= a and b <= hi):
            k = _split(b - a)
            walk(a, a + k)
            walk(a + k, b)

    if size:
        walk(0, size)
    return out


def root_from_range(size: int, lo: int, leaves: Sequence[bytes], proof: Sequence[Node]) -> bytes:
    """The root of the tree of ``size`` leaves from the hashes of leaves ``[lo, lo+len(leaves))``
    and their :func:`range_proof`; raises ProofError when the proof does not fit the range."""
    hi = lo + len(leaves)
    if not 0 <= lo <= hi <= size:
        raise ProofError(f"no range [{lo}, {hi}) in a tree of {size} leaves")
    given = iter(proof)

    def walk(a: int, b: int) -> bytes:
        if b <= lo or a >= hi:
            node = next(given, None)
            if node is None or node[0] != a or node[1] != b:
                raise ProofError(f"the range proof lacks the subtree [{a}, {b})")
            return node[2]
        if lo <= a and b <= hi:
            return _mth(leaves, a - lo, b - lo)
        k = _split(b - a)
        left = walk(a, a + k)
        return node_hash(left, walk(a + k, b))

    if size == 0:
        return EMPTY_ROOT
    r = walk(0, size)
    if next(given, None) is not None:
        raise ProofError("the range proof has subtrees it does not need")
    return r
