"""Module 6: tiktoken's rank tables, read offline and turned back into BPE merges.

tiktoken stores an encoding as *ranks*, ``{token bytes: id}``, not as merges: to encode, it
repeatedly joins the adjacent pair whose joined bytes have the lowest rank. The book's
:class:`~posttrainllm.tokenizer.Tokenizer` keeps merges, ``(left id, right id) -> new id``. The two
agree once each multi-byte token is assigned the one pair that tiktoken's own procedure would join
last when building it from its bytes (:func:`merges_from_ranks`) — the reconstruction Karpathy's
minbpe uses for GPT-4's tokenizer, tested here on a fuzzed corpus against tiktoken itself.

cl100k_base (GPT-4) gives the 256 single bytes the ids 0-255 in a shuffled order (``!`` is 0), so
the byte ids are kept as a permutation rather than assumed to equal the byte values.

Rank tables come as files: tiktoken's ``.tiktoken`` (``<base64 token> <rank>`` per line, what
``tiktoken.get_encoding`` downloads and caches) or the rank modules of the js-tiktoken npm
package (``dist/ranks/cl100k_base.js``: pattern, special tokens and ranks in one JSON object),
which the book installs with its other JavaScript, so the tests need no network.
"""

from __future__ import annotations

import base64
import binascii
import json
from pathlib import Path
from typing import NamedTuple

Pair = tuple[int, int]  # a merge: (left id, right id)


class RankTable(NamedTuple):
    """A rank file's contents. ``pattern`` is None where the file format has none (``.tiktoken``)."""

    ranks: dict[bytes, int]
    pattern: str | None
    special_tokens: dict[str, int]


def read_ranks(path: str | Path) -> RankTable:
    """Read a ``.tiktoken`` file or a js-tiktoken rank module; a file of neither kind, or a damaged
    one, raises ``ValueError`` naming the file and what is wrong."""
    text = Path(path).read_text(encoding="utf-8")
    try:
        if "{" in text and '"bpe_ranks"' in text:
            found = json.loads(text[text.index("{") : text.rindex("}") + 1])
            return RankTable(_js_ranks(found["bpe_ranks"]), found["pat_str"], dict(found["special_tokens"]))
        return RankTable(_tiktoken_ranks(text), None, {})
    except (ValueError, KeyError, TypeError, binascii.Error) as err:
        raise ValueError(
            f"{path} is not a rank table (a .tiktoken file or a js-tiktoken ranks module): {err}"
        ) from None


def _tiktoken_ranks(text: str) -> dict[bytes, int]:
    ranks = {}
    for line in text.splitlines():
        if line:
            token, rank = line.split()  # ValueError unless exactly two fields
            ranks[base64.b64decode(token, validate=True)] = int(rank)
    if not ranks:
        raise ValueError("it holds no ranks")
    return ranks


def _js_ranks(packed: str) -> dict[bytes, int]:
    """js-tiktoken packs ranks as lines ``<anything> <first rank> <token> <token> ...``: the tokens
    (base64) take consecutive ranks from the first."""
    ranks = {}
    for line in packed.split("\n"):
        if line:
            _, first, *tokens = line.split(" ")
            for offset, token in enumerate(tokens):
                ranks[base64.b64decode(token, validate=True)] = int(first) + offset
    return ranks


def tiktoken_file_text(ranks: dict[bytes, int]) -> str:
    """The ``.tiktoken`` file of ``ranks``, byte for byte as tiktoken's own files are written, so its
    SHA-256 can be compared with the hash tiktoken publishes for an encoding."""
    by_rank = sorted(ranks.items(), key=lambda item: item[1])
    return "".join(f"{base64.b64encode(token).decode()} {rank}\n" for token, rank in by_rank)


def merges_from_ranks(ranks: dict[bytes, int]) -> tuple[list[Pair], list[int]]:
    """``(merges, byte_ids)`` for :class:`~posttrainllm.tokenizer.Tokenizer`: merge ``i`` builds the
    token of rank ``256 + i``; ``byte_ids[b]`` is the rank of the single byte ``b``."""
    byte_ids = [ranks.get(bytes([b]), -1) for b in range(256)]
    if sorted(byte_ids) != list(range(256)):
        raise ValueError("the 256 single bytes must have the ranks 0-255, one each, as in tiktoken's byte-level "
                         "encodings")
    longer = sorted((rank, token) for token, rank in ranks.items() if len(token) > 1)
    if [rank for rank, _ in longer] != list(range(256, 256 + len(longer))):
        raise ValueError("the multi-byte tokens must have the ranks 256, 257, ... with no gap or repeat")
    merges = []
    for rank, token in longer:
        parts = _parts_below(ranks, token, rank)
        if len(parts) != 2:
            raise ValueError(f"the token {token!r} (rank {rank}) is not the join of two tokens of lower rank")
        merges.append((ranks[parts[0]], ranks[parts[1]]))
    return merges, byte_ids


def _parts_below(ranks: dict[bytes, int], token: bytes, limit: int) -> list[bytes]:
    """tiktoken's procedure on ``token``'s bytes, using only ranks below ``limit``: join the adjacent
    pair of lowest rank until none is left. For a real token two parts remain — its last merge."""
    parts = [bytes([b]) for b in token]
    while len(parts) > 1:
        joined = [ranks.get(a + b, limit) for a, b in zip(parts, parts[1:])]  # noqa: B905 - neighbours
        best = min(range(len(joined)), key=joined.__getitem__)
        if joined[best] >= limit:
            break
        parts[best : best + 2] = [parts[best] + parts[best + 1]]
    return parts
