"""MinHash over token shingles, with LSH banding, for near-duplicate detection.

A text becomes the set of its token k-grams (a token is a word, or one punctuation or operator
character; each gram hashed to 32 bits); its MinHash signature is the minimum of `num_perm`
universal hashes `(a·x + b) mod p` over that set, so two signatures agree in each position
with probability equal to the sets' Jaccard similarity. Signatures are cut into `bands` of
`rows`; texts sharing any band become candidates, and candidates are confirmed by their exact
Jaccard similarity, so the result has no false positives.
"""

from __future__ import annotations

import hashlib
import re
from collections import defaultdict
from typing import Hashable, Iterable

import numpy as np

__all__ = ["MinHasher", "bands_for", "jaccard", "near_duplicate_pairs", "shingles"]

_PRIME = (1 << 31) - 1  # a·x stays below 2**63 for a < p and 32-bit x: no uint64 overflow
_TOKEN = re.compile(r"\w+|[^\w\s]")  # words, and each other non-space character (* - + = ...)


def shingles(text: str, k: int = 3) -> frozenset[int]:
    """32-bit hashes of the lowercase token k-grams of `text` (one gram if it is shorter). A
    token is a word or one punctuation or operator character, so "9 * 10" and "9 - 10" differ."""
    words = _TOKEN.findall(text.lower())
    if not words:
        return frozenset()
    k = min(k, len(words))
    grams = (" ".join(words[i:i + k]) for i in range(len(words) - k + 1))
    return frozenset(int.from_bytes(hashlib.blake2b(g.encode(), digest_size=4).digest(), "little")
                     for g in grams)


def jaccard(a: frozenset[int], b: frozenset[int]) -> float:
    if not a and not b:
        return 1.0
    return len(a & b) / len(a | b)


def bands_for(num_perm: int, threshold: float) -> tuple[int, int]:
    """(bands, rows) with bands·rows = num_perm whose S-curve midpoint (1/b)^(1/r) is closest
    to `threshold`, leaning lower so fewer true pairs are missed."""
    options = [(num_perm // r, r) for r in range(1, num_perm + 1) if num_perm % r == 0]
    return min(options, key=lambda br: abs((1 / br[0]) ** (1 / br[1]) - (threshold - 0.1)))


class MinHasher:
    """Signatures of shingle sets under `num_perm` seeded hash functions."""

    def __init__(self, num_perm: int = 128, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.num_perm = num_perm
        self.a = rng.integers(1, _PRIME, size=num_perm, dtype=np.uint64)
        self.b = rng.integers(0, _PRIME, size=num_perm, dtype=np.uint64)

    def signature(self, shingle_set: frozenset[int]) -> np.ndarray:
        if not shingle_set:
            return np.full(self.num_perm, _PRIME, dtype=np.uint64)
        x = np.fromiter(shingle_set, dtype=np.uint64, count=len(shingle_set))[:, None]
        return ((self.a * x + self.b) % _PRIME).min(axis=0)


def near_duplicate_pairs(items: Iterable[tuple[Hashable, str]], *, threshold: float = 0.8,
                         k: int = 3, num_perm: int = 128,
                         seed: int = 0) -> list[tuple[Hashable, Hashable, float]]:
    """Pairs of keys whose texts have token-shingle Jaccard similarity ≥ `threshold`, each pair
    once, as (key_a, key_b, similarity) in input order."""
    hasher = MinHasher(num_perm, seed)
    bands, rows = bands_for(num_perm, threshold)
    keys: list[Hashable] = []
    sets: list[frozenset[int]] = []
    buckets: dict[tuple[int, bytes], list[int]] = defaultdict(list)
    for key, text in items:
        index = len(keys)
        keys.append(key)
        shingle_set = shingles(text, k)
        sets.append(shingle_set)
        sig = hasher.signature(shingle_set)
        for band in range(bands):
            buckets[(band, sig[band * rows:(band + 1) * rows].tobytes())].append(index)
    seen: set[tuple[int, int]] = set()
    pairs: list[tuple[int, int, float]] = []
    for members in buckets.values():
        if len(members) < 2:
            continue
        for pos, i in enumerate(members):
            # Each member against the bucket's later members: exact buckets are small in
            # practice; a huge bucket means many copies, reported against its first members.
            for j in members[pos + 1:pos + 1 + 64]:
                if (i, j) in seen:
                    continue
                seen.add((i, j))
                similarity = jaccard(sets[i], sets[j])
                if similarity >= threshold:
                    pairs.append((i, j, similarity))
    return [(keys[i], keys[j], s) for i, j, s in sorted(pairs)]
