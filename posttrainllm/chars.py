"""A character-level vocabulary: the simplest tokenizer, used until BPE arrives in module 6."""

from __future__ import annotations

from collections.abc import Iterable


class CharVocab:
    """Each distinct character of the training text gets an id, in sorted order.

    >>> v = CharVocab("abca"); v.encode("cab"), v.decode([0, 1])
    ([2, 0, 1], 'ab')
    """

    def __init__(self, text: str) -> None:
        self.chars = sorted(set(text))
        if not self.chars:
            raise ValueError("cannot build a vocabulary from empty text")
        self.ids = {c: i for i, c in enumerate(self.chars)}

    def __len__(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> list[int]:
        try:
            return [self.ids[c] for c in text]
        except KeyError as err:
            raise ValueError(f"character {err.args[0]!r} is not in this vocabulary of {len(self)} characters") from None

    def decode(self, ids: Iterable[int]) -> str:
        return "".join(self.chars[i] for i in ids)
