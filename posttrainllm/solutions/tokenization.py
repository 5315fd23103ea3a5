"""Module 6's exercises, answered: the textbook BPE trainer, encoding one pre-token, and the
compression a tokenizer reaches."""

from __future__ import annotations

from posttrainllm import tokenizer as bpe

__all__ = ["compression", "encode_chunk", "train_bpe"]


def train_bpe(word_counts: dict[bytes, int], vocab_size: int) -> tuple[list[tuple[int, int]], dict[int, bytes]]:
    """Merges and vocabulary, one merge at a time: recount every pair, merge the most frequent."""
    words = {tuple(word): n for word, n in word_counts.items()}
    merges, vocab = [], {i: bytes([i]) for i in range(256)}
    for new_id in range(256, vocab_size):
        counts = bpe.pair_counts(words)
        if not counts:
            break
        pair = min(counts, key=lambda p: (-counts[p], p))  # most frequent; on a tie, the smallest pair
        merges.append(pair)
        vocab[new_id] = vocab[pair[0]] + vocab[pair[1]]
        words = {tuple(bpe.merge_pair(list(word), pair, new_id)): n for word, n in words.items()}
    return merges, vocab


def encode_chunk(ids: list[int], merges: dict[tuple[int, int], int]) -> list[int]:
    """One pre-token's ids after every merge that applies, the earliest learned first."""
    while True:
        known = [pair for pair in zip(ids, ids[1:]) if pair in merges]  # noqa: B905 - consecutive ids
        if not known:
            return ids
        first_learned = min(known, key=merges.get)
        ids = bpe.merge_pair(ids, first_learned, merges[first_learned])


def compression(text: str, held_out: str, vocab_size: int) -> float:
    """Bytes per token on ``held_out`` of a tokenizer trained on ``text`` to ``vocab_size``."""
    trained = bpe.Tokenizer.train(text, vocab_size=vocab_size)
    return len(held_out.encode()) / len(trained.encode_ordinary(held_out))
