"""n-gram contamination between evaluation items and training data (the post-training data
chapter, ``book/post-training-data.md``).

GPT-3's paper (Brown et al., 2020, appendix C) called an evaluation item *dirty* when it shares
any 13-gram of normalised words with the training data, and reported scores on the clean subset
beside the full one. Training-side decontamination removes the training documents that share an
n-gram with any evaluation item instead, so that the whole benchmark stays usable.
"""

from __future__ import annotations

from posttrainllm.dedup import normalise


def ngrams(text: str, n: int) -> set[tuple[str, ...]]:
    """Every run of ``n`` normalised words (none if the text is shorter)."""
    words = normalise(text).split()
    return {tuple(words[i : i + n]) for i in range(len(words) - n + 1)}


def dirty(items: list[str], corpus: list[str], n: int = 13) -> list[bool]:
    """For each of ``items``, whether it shares an ``n``-gram with any text of ``corpus``."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n is the length of the shared word runs that count, a positive integer; got {n!r}")
    seen = set().union(*(ngrams(text, n) for text in corpus)) if corpus else set()
    return [bool(ngrams(item, n) & seen) for item in items]
