"""RFC 6962 / RFC 9162 tree hashing against the published test vectors (the certificate-
transparency reference implementation's), and proofs that verify and fail as the RFC says."""

from __future__ import annotations

import random

import pytest

from crossaudit.evidence import merkle

# The reference leaves and the roots of the trees of their first 1..8 (RFC 6962 test data).
LEAVES = [
    b"",
    b"\x00",
    b"\x10",
    b"\x20\x21",
    b"\x30\x31",
    b"\x40\x41\x42\x43",
    bytes(range(0x50, 0x58)),
    bytes(range(0x60, 0x70)),
]
ROOTS = [
    "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
    "fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125",
    "aeb6bcfe274b70a14fb067a5e5578264db0fa9b51af5e0ba159158f329e06e77",
    "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
    "4e3bbb1f7b478dcfe71fb631631519a3bca12c9aefca1612bfce4c13a86264d4",
    "76e67dadbcdf1e10e1b74ddc608abd2f98dfb16fbce75277b5232a127f2087ef",
    "ddb89be403809e325750d3d263cd78929c2942b7942a34b77e122c9594a74c8c",
    "5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328",
]
INCLUSION = {  # (leaf index, tree size) -> audit path
    (0, 8): [
        "96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7",
        "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
        "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4",
    ],
    (5, 8): [
        "bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b",
        "ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0",
        "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
    ],
}
CONSISTENCY = {  # (old size, new size) -> proof
    (1, 8): [
        "96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7",
        "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
        "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4",
    ],
    (6, 8): [
        "0ebc5d3437fbe2db158b9f126a1d118e308181031d0a949f8dededebc558ef6a",
        "ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0",
        "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
    ],
    (2, 5): [
        "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
        "bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b",
    ],
}
HASHES = [merkle.leaf_hash(x) for x in LEAVES]


def test_empty_tree_root_is_sha256_of_nothing() -> None:
    assert merkle.root([]).hex() == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"


@pytest.mark.parametrize("size", range(1, 9))
def test_roots_reproduce_the_rfc_6962_test_vectors(size: int) -> None:
    assert merkle.root(HASHES[:size]).hex() == ROOTS[size - 1]


@pytest.mark.parametrize(("index", "size"), sorted(INCLUSION))
def test_inclusion_proofs_reproduce_the_vectors_and_verify(index: int, size: int) -> None:
    proof = merkle.inclusion_proof(HASHES, index, size)
    assert [p.hex() for p in proof] == INCLUSION[(index, size)]
    merkle.verify_inclusion(HASHES[index], index, size, proof, bytes.fromhex(ROOTS[size - 1]))
    with pytest.raises(merkle.ProofError):
        merkle.verify_inclusion(HASHES[index ^ 1], index, size, proof, bytes.fromhex(ROOTS[size - 1]))
    with pytest.raises(merkle.ProofError):  # a path one hash short of the tree's depth
        merkle.verify_inclusion(HASHES[index], index, size, proof[:-1], bytes.fromhex(ROOTS[size - 1]))


@pytest.mark.parametrize(("old", "new"), sorted(CONSISTENCY))
def test_consistency_proofs_reproduce_the_vectors_and_verify(old: int, new: int) -> None:
    proof = merkle.consistency_proof(HASHES, old, new)
    assert [p.hex() for p in proof] == CONSISTENCY[(old, new)]
    old_root, new_root = bytes.fromhex(ROOTS[old - 1]), bytes.fromhex(ROOTS[new - 1])
    merkle.verify_consistency(old, new, old_root, new_root, proof)
    with pytest.raises(merkle.ProofError):  # a rewritten history: another old root
        merkle.verify_consistency(old, new, bytes.fromhex(ROOTS[new - 1]), new_root, proof)


def test_proofs_of_random_trees_verify_and_fail_when_altered() -> None:
    rng = random.Random(6962)
    for _ in range(200):
        n = rng.randint(1, 90)
        leaves = [merkle.leaf_hash(rng.randbytes(8)) for _ in range(n)]
        root = merkle.root(leaves)
        i = rng.randrange(n)
        merkle.verify_inclusion(leaves[i], i, n, merkle.inclusion_proof(leaves, i, n), root)
        old = rng.randint(1, n)
        proof = merkle.consistency_proof(leaves, old, n)
        merkle.verify_consistency(old, n, merkle.root(leaves[:old]), root, proof)
        if proof:
            bad = [*proof[:-1], merkle.leaf_hash(b"forged")]
            with pytest.raises(merkle.ProofError):
                merkle.verify_consistency(old, n, merkle.root(leaves[:old]), root, bad)
        lo = rng.randint(0, n)
        hi = rng.randint(lo, n)
        nodes = merkle.range_proof(lambda a, b, leaves=leaves: merkle.root(leaves[a:b]), n, lo, hi)
        assert merkle.root_from_range(n, lo, leaves[lo:hi], nodes) == root
        if hi > lo:
            altered = [*leaves[lo:hi]]
            altered[0] = merkle.leaf_hash(b"edited")
            assert merkle.root_from_range(n, lo, altered, nodes) != root


def test_a_frontier_restored_from_its_state_grows_the_same_tree() -> None:
    f = merkle.Frontier()
    for h in HASHES[:5]:
        f.append(h)
    g = merkle.Frontier.restore(5, f.state())
    for h in HASHES[5:]:
        g.append(h)
    assert g.root().hex() == ROOTS[7]
    with pytest.raises(merkle.ProofError):
        merkle.Frontier.restore(7, f.state())  # seven leaves have three perfect subtrees; five have two
