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
import hashlib
import json
from pathlib import Path
from typing import NamedTuple

Pair = tuple[int, int]  # a merge: (left id, right id)


class RankTable(NamedTuple):
    """A rank file's contents. ``pattern`` is None where the file format has none (``.tiktoken``)."""

    ranks: dict[bytes, int]
    pattern: str | None
    special_tokens: dict[str, int]


# The SHA-256 that tiktoken publishes for each encoding's .tiktoken file (tiktoken_ext/openai_public.py);
# js-tiktoken's modules hold the same ranks. gpt2's ranks are r50k_base's, p50k_edit's p50k_base's.
PUBLISHED_SHA256 = {
    "r50k_base": "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930",
    "gpt2": "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930",
    "p50k_base": "94b5ca7dff4d00767bc256fdd1b27e5b17361d7b8a5f968547f9f23eb70d2069",
    "p50k_edit": "94b5ca7dff4d00767bc256fdd1b27e5b17361d7b8a5f968547f9f23eb70d2069",
    "cl100k_base": "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
    "o200k_base": "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
}


def read_ranks(path: str | Path, encoding: str | None = None) -> RankTable:
    """Read a ``.tiktoken`` file or a js-tiktoken rank module; a file of neither kind, or a damaged
    one, raises ``ValueError`` naming the file and what is wrong.

    A file of a published encoding (``encoding``, or the file's name: ``cl100k_base.tiktoken``,
    ``cl100k_base.js``) must have the ranks whose SHA-256 tiktoken publishes: a file cut short at a
    line's end, or with two ranks swapped, parses and would load as another tokenizer. Any other
    file must give each token one rank and each rank one token, and number them ``0 ... n-1`` with
    no gap but the ids of its special tokens."""
    path = Path(path)
    if encoding is None and path.stem in PUBLISHED_SHA256:
        encoding = path.stem
    if encoding is not None and encoding not in PUBLISHED_SHA256:
        raise ValueError(f"no published hash for {encoding!r}: the encodings known are {sorted(PUBLISHED_SHA256)}")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"{path} is not a rank table: it is not UTF-8 text ({err.reason} at byte {err.start})") \
            from None
    try:
        if "{" in text and '"bpe_ranks"' in text:
            found = json.loads(text[text.index("{") : text.rindex("}") + 1])
            table = RankTable(_js_ranks(found["bpe_ranks"]), found["pat_str"], _specials(found["special_tokens"]))
        else:
            table = RankTable(_tiktoken_ranks(text), None, {})
        if encoding is None:
            _check_numbering(table)
    except (ValueError, KeyError, TypeError, binascii.Error) as err:
        raise ValueError(
            f"{path} is not a rank table (a .tiktoken file or a js-tiktoken ranks module): {err}"
        ) from None
    if encoding is not None:
        digest = hashlib.sha256(tiktoken_file_text(table.ranks).encode()).hexdigest()
        if digest != PUBLISHED_SHA256[encoding]:
            raise ValueError(f"{path} does not hold {encoding}'s ranks: their SHA-256 is {digest}, tiktoken publishes "
                             f"{PUBLISHED_SHA256[encoding]} (a file cut short, or edited)")
    return table


def _tiktoken_ranks(text: str) -> dict[bytes, int]:
    pairs = []
    for line in text.splitlines():
        if line:
            token, rank = line.split()  # ValueError unless exactly two fields
            pairs.append((base64.b64decode(token, validate=True), int(rank)))
    if not pairs:
        raise ValueError("it holds no ranks")
    return _unique(pairs)


def _js_ranks(packed: str) -> dict[bytes, int]:
    """js-tiktoken packs ranks as lines ``<anything> <first rank> <token> <token> ...``: the tokens
    (base64) take consecutive ranks from the first."""
    if not isinstance(packed, str):
        raise TypeError(f"bpe_ranks is {type(packed).__name__}, not the packed text of ranks")
    pairs = []
    for line in packed.split("\n"):
        if line:
            _, first, *tokens = line.split(" ")
            pairs += [(base64.b64decode(token, validate=True), int(first) + i) for i, token in enumerate(tokens)]
    return _unique(pairs)


def _unique(pairs: list[tuple[bytes, int]]) -> dict[bytes, int]:
    """``dict(pairs)``, refusing a token listed twice (a dict would keep the last silently)."""
    ranks = dict(pairs)
    if len(ranks) != len(pairs):
        seen: set[bytes] = set()
        twice = next(token for token, _ in pairs if token in seen or seen.add(token))
        raise ValueError(f"the token {twice!r} is listed twice")
    return ranks


def _specials(found: dict) -> dict[str, int]:
    if not isinstance(found, dict) or not all(isinstance(k, str) and type(v) is int for k, v in found.items()):
        raise TypeError("special_tokens must map text to whole numbers")
    return dict(found)


def _check_numbering(table: RankTable) -> None:
    """Ranks ``0 ... n-1``, each given once, with no gap but the ids special tokens take (specials
    may also lie above, with gaps between them, as cl100k_base's do)."""
    taken = sorted([*table.ranks.values(), *table.special_tokens.values()])
    repeat = next((a for a, b in zip(taken, taken[1:]) if a == b), None)  # noqa: B905 - neighbours
    if repeat is not None:
        raise ValueError(f"the id {repeat} is given to two tokens")
    top = max(table.ranks.values())
    gap = next((i for i, rank in enumerate(t for t in taken if t <= top) if rank != i), None)
    if gap is not None:
        raise ValueError(f"no token has the rank {gap}, though the ranks go up to {top}")


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
