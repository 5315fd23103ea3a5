"""Exact and near-duplicate removal with MinHash and locality-sensitive hashing (the post-training
data chapter, ``book/post-training-data.md``).

Exact duplicates are found by hashing each document's normalised text. Near duplicates — the
same text with a few words changed — need a similarity: the Jaccard similarity of two documents'
sets of word n-grams (*shingles*). Comparing every pair costs ``n^2``; Broder's MinHash (1997)
summarises each set by ``num_perm`` minimum hash values, and two sets agree on any one of them
with probability equal to their Jaccard similarity. LSH then splits each signature into
``bands`` bands of ``rows`` values: two documents become a *candidate pair* if any band matches
exactly, which happens with probability ``1 - (1 - s**rows)**bands`` for similarity ``s`` — an S
curve that is steep near ``(1/bands)**(1/rows)``. Only candidates are compared exactly. Lee et
al. (*Deduplicating Training Data Makes Language Models Better*, 2022) did this at scale.
"""

from __future__ import annotations

import hashlib
import re

import numpy as np

_PRIME = 4_294_967_311  # the first prime above 2**32: (a * x + b) mod p fits in uint64 for a < 2**31


def normalise(text: str) -> str:
    """Case-folded, letters and digits only (of any script: Cyrillic, Greek and Han text keep their
    words), single spaces."""
    if not isinstance(text, str):
        raise TypeError(f"a document is text (str), not {type(text).__name__}")
    return " ".join(re.findall(r"[^\W_]+", text.casefold()))


def exact_duplicates(texts: list[str]) -> list[int]:
    """Indices of texts whose normalised form already appeared earlier in the list."""
    seen, repeats = set(), []
    for i, text in enumerate(texts):
        key = hashlib.blake2b(normalise(text).encode(), digest_size=16).digest()
        if key in seen:
            repeats.append(i)
        seen.add(key)
    return repeats


def shingles(text: str, n: int = 3) -> set[str]:
    words = normalise(text).split()
    return {" ".join(words[i : i + n]) for i in range(max(1, len(words) - n + 1))}


def jaccard(a: set, b: set) -> float:
    return len(a & b) / len(a | b) if a or b else 1.0


class MinHasher:
    """Signatures of ``num_perm`` values: for each of ``num_perm`` random hash functions
    ``(a * h + b) mod p`` of the shingles' 32-bit hashes, the minimum over the set."""

    def __init__(self, num_perm: int = 128, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.a = rng.integers(1, 2**31, num_perm, dtype=np.uint64)
        self.b = rng.integers(0, 2**31, num_perm, dtype=np.uint64)

    def signature(self, items: set[str]) -> np.ndarray:
        hashes = np.array([int.from_bytes(hashlib.blake2b(s.encode(), digest_size=4).digest(), "little")
                           for s in items], dtype=np.uint64)
        return ((hashes[:, None] * self.a + self.b) % np.uint64(_PRIME)).min(0)


def candidate_pairs(signatures: np.ndarray, bands: int) -> set[tuple[int, int]]:
    """Pairs ``(i, j)``, ``i < j``, whose signatures agree on every row of at least one band."""
    rows = signatures.shape[1] // bands
    if rows * bands != signatures.shape[1]:
        raise ValueError(f"{signatures.shape[1]} hash values do not split into {bands} bands")
    pairs: set[tuple[int, int]] = set()
    for band in range(bands):
        buckets: dict[bytes, list[int]] = {}
        for i, row in enumerate(signatures[:, band * rows : (band + 1) * rows]):
            buckets.setdefault(row.tobytes(), []).append(i)
        for members in buckets.values():
            pairs.update((a, b) for k, a in enumerate(members) for b in members[k + 1 :])
    return pairs


def candidate_probability(similarity: float, bands: int, rows: int) -> float:
    """The chance that two documents of Jaccard ``similarity`` share at least one band."""
    return 1 - (1 - similarity**rows) ** bands


def near_duplicates(texts: list[str], threshold: float = 0.7, num_perm: int = 128, bands: int = 32,
                    n: int = 3, seed: int = 0) -> list[tuple[int, int, float]]:
    """``(i, j, jaccard)`` for the candidate pairs whose exact shingle Jaccard is at least ``threshold``
    (none for fewer than two texts). ``num_perm`` hash values are cut into ``bands`` bands of equal size."""
    for name, value in (("num_perm", num_perm), ("bands", bands), ("n", n)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a whole number of at least 1, got {value!r}")
    if num_perm % bands:
        raise ValueError(f"num_perm={num_perm} hash values do not split into bands={bands} bands of equal size")
    if not 0 <= threshold <= 1:
        raise ValueError(f"threshold is a Jaccard similarity, from 0 to 1; got {threshold!r}")
    sets = [shingles(t, n) for t in texts]
    if len(sets) < 2:
        return []
    hasher = MinHasher(num_perm, seed)
    signatures = np.stack([hasher.signature(s) for s in sets])
    found = ((i, j, jaccard(sets[i], sets[j])) for i, j in candidate_pairs(signatures, bands))
    return sorted(p for p in found if p[2] >= threshold)


def keep_first(n_texts: int, pairs: list[tuple[int, int, float]], drop: list[int] = ()) -> list[int]:
    """Indices to keep: every text except ``drop`` and the later text of each pair."""
    removed = set(drop) | {j for _, j, _ in pairs}
    return [i for i in range(n_texts) if i not in removed]
