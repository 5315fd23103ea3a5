"""Module 6: a byte-level BPE tokenizer — train, encode, decode, stream, save and load.

Text becomes UTF-8 bytes, so every string is representable with the 256 byte tokens; training
then adds one token per *merge* of the most frequent adjacent pair. As in GPT-2/GPT-4, a regex
first splits text into pre-tokens (words, numbers, punctuation runs, whitespace) and merges
never cross a pre-token boundary.

Conventions, all tested:

- **Ids.** 0-255 are the bytes; merge ``i`` (0-based) creates id ``256 + i``; special tokens
  come after the merges. These ids are a tiktoken ``mergeable_ranks`` table as they are, so
  ``tiktoken.Encoding(...)`` built from :meth:`Tokenizer.tiktoken_ranks` encodes identically.
  An encoding loaded from tiktoken (:meth:`Tokenizer.from_tiktoken`) may give the bytes their
  ids 0-255 in another order (``byte_ids``) and leave gaps among its special tokens' ids.
- **Tie-breaking.** When several pairs have the same count, the pair with the smallest
  ``(left id, right id)`` is merged first — deterministic, independent of dict order.
- **Special tokens.** Text containing a special token's string raises ``ValueError`` unless
  that token is in ``allowed_special`` (as in tiktoken), so user text can never smuggle one in.
- **Lone surrogates.** A Python ``str`` may hold unpaired surrogates (``"\\ud800"``), which
  have no UTF-8 form. They are encoded with the ``surrogatepass`` error handler (3 bytes each)
  and decoded the same way, so ``decode(encode(s)) == s`` holds for every ``str``. Ids that do
  not form valid UTF-8 (a sequence cut in the middle of a character) decode with U+FFFD.
"""

from __future__ import annotations

import functools
import hashlib
import heapq
import json
import os
import re
import unicodedata
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator
from itertools import chain, pairwise
from pathlib import Path

from posttrainllm import atomic
from posttrainllm.bpe_ranks import Pair, merges_from_ranks

try:
    import regex
except ImportError:  # in the browser (Pyodide) regex is a download away: the standard library's re stands in
    regex = None

# The pre-tokenisation patterns published with GPT-2 and with GPT-4's cl100k_base encoding.
GPT2_SPLIT = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
GPT4_SPLIT = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+"""
)
FORMAT = "posttrainllm-bpe v3"
FORMAT_V2 = "posttrainllm-bpe v2"  # without the byte_ids and n_vocab lines (bytes in order, no gaps); still read
FORMAT_V1 = "posttrainllm-bpe v1"  # v2 without the closing checksum line; still read

# What the regex module's \s matches (Unicode's White_Space property). The standard library's \s
# also matches U+001C-U+001F, so it is spelled out rather than borrowed.
_WHITE_SPACE = "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"


def to_bytes(text: str) -> bytes:
    """UTF-8, with lone surrogates kept (see the module docstring)."""
    return text.encode("utf-8", errors="surrogatepass")


def apply_merges(ids: list[int], ranks: dict[Pair, int]) -> list[int]:
    """Merge ``ids`` as training did: always the adjacent pair learned earliest (lowest rank; a
    pair's rank is the id of the token it makes), every occurrence left to right. The textbook loop
    (find the lowest pair, :func:`merge_pair` it, repeat) is quadratic in the length of a pre-token,
    hours for a megabyte of letters; here a heap of candidate pairs over a linked list makes it
    O(n log n). A pair made by a merge always ranks after the pair merged, so the heap's order is
    the loop's order (tests/unit/test_tokenizer.py checks the two agree)."""
    n = len(ids)
    if n < 2:
        return ids
    token, after, before = list(ids), [*range(1, n), -1], list(range(-1, n - 1))
    heap = [(r, i) for i in range(n - 1) if (r := ranks.get((token[i], token[i + 1]))) is not None]
    heapq.heapify(heap)
    while heap:
        rank, i = heapq.heappop(heap)
        j = after[i]
        if token[i] < 0 or j < 0 or ranks.get((token[i], token[j])) != rank:
            continue  # a stale candidate: one of its two tokens was merged into another pair first
        token[i], token[j] = rank, -1
        after[i] = after[j]
        if after[j] >= 0:
            before[after[j]] = i
        for left, right in ((before[i], i), (i, after[i])):
            if left >= 0 and right >= 0 and (r := ranks.get((token[left], token[right]))) is not None:
                heapq.heappush(heap, (r, left))
    out, i = [], 0
    while i >= 0:
        out.append(token[i])
        i = after[i]
    return out


def merge_pair(ids: list[int], pair: Pair, new_id: int) -> list[int]:
    """Replace every non-overlapping occurrence of ``pair``, left to right.

    >>> merge_pair([1, 2, 3, 1, 2], (1, 2), 9)
    [9, 3, 9]
    """
    out, i, n = [], 0, len(ids)
    a, b = pair
    while i < n:
        if i < n - 1 and ids[i] == a and ids[i + 1] == b:
            out.append(new_id)
            i += 2
        else:
            out.append(ids[i])
            i += 1
    return out


def pair_counts(words: dict[tuple[int, ...], int]) -> Counter:
    """Adjacent-pair counts over words weighted by frequency: ``{(1, 2): 3, ...}``."""
    counts: Counter = Counter()
    for word, freq in words.items():
        for pair in pairwise(word):
            counts[pair] += freq
    return counts


@functools.cache
def _category_ranges(major: str) -> str:
    """Every code point whose Unicode category starts with ``major`` ("L", "N"), as the inside
    of a character class: ``a-zA-Z...``. Built once from this Python's Unicode database."""
    ranges, start = [], None
    for cp in range(0x110001):
        inside = cp < 0x110000 and unicodedata.category(chr(cp))[0] == major
        if inside and start is None:
            start = cp
        elif not inside and start is not None:
            ranges.append(f"\\U{start:08x}" if start == cp - 1 else f"\\U{start:08x}-\\U{cp - 1:08x}")
            start = None
    return "".join(ranges)


def to_stdlib_pattern(pattern: str) -> str:
    """Rewrite a split pattern for the standard library's ``re``, which has no ``\\p{...}``.

    ``\\p{L}`` (letters) and ``\\p{N}`` (numbers) become explicit code-point ranges and ``\\s``
    Unicode's White_Space set, inside or outside a character class; possessive quantifiers and
    ``(?i:...)`` need no change (Python 3.11+). Other ``\\p`` properties raise ``ValueError``.
    """
    out, i, in_class = [], 0, False
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\":
            esc = pattern[i : i + 2]
            if esc in ("\\p", "\\P"):
                end = pattern.find("}", i)
                name = pattern[i + 3 : end] if pattern[i + 2 : i + 3] == "{" and end > 0 else ""
                if esc == "\\P" or name not in ("L", "N"):
                    raise ValueError(
                        f"cannot translate {pattern[i : end + 1] or esc!r} for the standard library's re: "
                        "only \\p{L} and \\p{N} are supported (install the regex package for the others)"
                    )
                body = _category_ranges(name)
                out.append(body if in_class else f"[{body}]")
                i = end + 1
                continue
            if esc == "\\s":
                out.append(_WHITE_SPACE if in_class else f"[{_WHITE_SPACE}]")
            elif esc == "\\S":
                if in_class:
                    raise ValueError("cannot translate \\S inside a character class for the standard library's re")
                out.append(f"[^{_WHITE_SPACE}]")
            else:
                out.append(esc)
            i += 2
            continue
        if ch == "[" and not in_class:
            in_class = True
            # a "]" straight after "[" or "[^" is a literal, not the end of the class
            j = i + 2 if pattern[i + 1 : i + 2] == "^" else i + 1
            if pattern[j : j + 1] == "]":
                j += 1
            out.append(pattern[i:j])
            i = j
            continue
        if ch == "]" and in_class:
            in_class = False
        out.append(ch)
        i += 1
    return "".join(out)


@functools.cache
def compile_pattern(pattern: str, engine: str = "auto"):
    """The compiled split pattern: with the regex package when it is installed (``engine="auto"``
    or ``"regex"``), else with the standard library's re after :func:`to_stdlib_pattern`
    (``engine="re"``). Both split every text the same way (tests/unit/test_tokenizer_split.py)."""
    if engine not in ("auto", "regex", "re"):
        raise ValueError(f"unknown regex engine {engine!r}: use 'auto', 'regex' or 're'")
    if engine == "regex" or (engine == "auto" and regex is not None):
        if regex is None:
            raise ImportError("the regex package is not installed: pip install regex, or use engine='re'")
        return regex.compile(pattern)
    return re.compile(to_stdlib_pattern(pattern))


def pretokens(compiled, text: str, start: int = 0) -> list[str]:
    """The pre-tokens of ``text[start:]`` under a compiled split pattern: its matches and, as
    pre-tokens of their own, any text between them, so a pattern that does not cover every character
    (``\\w+``) cannot drop the rest. GPT-2's and GPT-4's patterns cover everything: then this is
    ``findall``. ``text[:start]`` is context only: what a ``\\b`` or a look-behind at ``start`` sees."""
    if compiled.groups == 0:
        found = compiled.findall(text, start)
        if sum(map(len, found)) == len(text) - start:
            return [piece for piece in found if piece]
    pieces, end = [], start
    for match in compiled.finditer(text, start):
        if match.start() > end:
            pieces.append(text[end : match.start()])
        if match.end() > match.start():
            pieces.append(match.group())
        end = max(end, match.end())
    if end < len(text):
        pieces.append(text[end:])
    return pieces


@functools.cache
def context_width(pattern: str) -> int:
    """How many characters before a pre-token's start the split ``pattern`` can look at: the width
    of its longest look-behind, and 1 for ``\\b``, ``\\B`` and ``^``, which ask what comes before (or
    whether anything does). GPT-2's and GPT-4's patterns look only ahead: 0. A look-behind of no
    fixed width (the regex package allows them) raises ``ValueError``: a stream cannot bound it."""
    import re._constants as codes
    import re._parser as parser

    try:
        stdlib = to_stdlib_pattern(pattern)
        re.compile(stdlib)  # refuses a look-behind of no fixed width, which parsing lets through
        tree = parser.parse(stdlib)
    except (re.error, ValueError) as err:
        raise ValueError(f"the split pattern {pattern!r} cannot be checked for look-behind, so it cannot be "
                         f"streamed (encode the whole text instead): {err}") from None

    def reach(node) -> int:
        if isinstance(node, parser.SubPattern):
            return max((reach(item) for item in node.data), default=0)
        if isinstance(node, tuple) and len(node) == 2 and node[0] in (codes.ASSERT, codes.ASSERT_NOT):
            direction, inner = node[1]
            return max(inner.getwidth()[1] if direction < 0 else 0, reach(inner))
        if isinstance(node, tuple) and len(node) == 2 and node[0] is codes.AT:
            return 0 if node[1] in (codes.AT_END, codes.AT_END_LINE, codes.AT_END_STRING) else 1
        if isinstance(node, tuple | list):
            return max((reach(item) for item in node), default=0)
        return 0

    return reach(tree)


def pretokenize(text: str, pattern: str = GPT4_SPLIT) -> list[str]:
    """The pre-tokens of ``text``: the pieces BPE merges within, never across."""
    return pretokens(compile_pattern(pattern), text)


def _count_chunk(args: tuple[str, str]) -> Counter:
    pattern, chunk = args
    return Counter(pretokenize(chunk, pattern))


def _split_lines(text: str, parts: int) -> list[str]:
    """``text`` in ``parts`` pieces cut at line breaks, so no pre-token is cut in two."""
    cuts, step = [0], max(1, len(text) // parts)
    for _ in range(parts - 1):
        nl = text.find("\n", cuts[-1] + step)
        if nl == -1:
            break
        cuts.append(nl + 1)
    return [text[a:b] for a, b in pairwise([*cuts, len(text)])]


def count_words(texts: Iterable[str] | str, pattern: str = GPT4_SPLIT, processes: int = 1) -> Counter:
    """Pre-token byte strings and their counts, read chunk by chunk (memory grows with the
    number of *distinct* pre-tokens, not with the input). A chunk should end at a line break
    or another natural boundary, or a word cut in two is counted as two pre-tokens.

    ``processes > 1`` splits each chunk at line breaks across worker processes; the counts
    are the same, only faster on a multi-core machine.
    """
    compiled = compile_pattern(pattern)
    counts: Counter = Counter()
    pool = None
    if processes > 1:
        import multiprocessing

        pool = multiprocessing.get_context("fork" if os.name == "posix" else "spawn").Pool(processes)
    try:
        for chunk in [texts] if isinstance(texts, str) else texts:
            if pool is not None and len(chunk) > 100_000:
                for part in pool.map(_count_chunk, [(pattern, p) for p in _split_lines(chunk, processes)]):
                    counts.update(part)
            else:
                counts.update(pretokens(compiled, chunk))
    finally:
        if pool is not None:
            pool.close()
            pool.join()
    return Counter({to_bytes(word): n for word, n in counts.items()})


def _check_vocab_size(vocab_size: int) -> int:
    if vocab_size < 256:
        raise ValueError(f"vocab_size must be at least 256 (the byte tokens), got {vocab_size}")
    return vocab_size - 256


def train_naive(texts: Iterable[str] | str, vocab_size: int, pattern: str = GPT4_SPLIT) -> list[Pair]:
    """The textbook trainer: recount every pair after every merge. Slow, obviously right —
    the reference the fast trainer is tested against."""
    words = {tuple(w): n for w, n in count_words(texts, pattern).items()}
    merges: list[Pair] = []
    for step in range(_check_vocab_size(vocab_size)):
        counts = pair_counts(words)
        if not counts:
            break
        best = min(counts, key=lambda p: (-counts[p], p))
        merges.append(best)
        new_id = 256 + step
        words = {tuple(merge_pair(list(w), best, new_id)): n for w, n in words.items()}
    return merges


def train_merges(word_counts: Counter, vocab_size: int) -> list[Pair]:
    """The incremental trainer: the same merges as :func:`train_naive`, far faster.

    It keeps pair counts, an index from each pair to the words containing it, and a max-heap of
    ``(-count, pair)`` with *lazy deletion* (stale entries are skipped when popped). A merge only
    revisits the words that contain the merged pair, updating counts by difference.

    One speed trick: a word is held as a ``str`` whose characters are the token ids
    (``chr(id)``), so merging a pair is ``str.replace`` — left to right, without overlaps,
    exactly :func:`merge_pair` — and runs in C. Comparing characters compares ids, so the
    heap's tie-breaking (smallest pair first) is unchanged.
    """
    n_merges = _check_vocab_size(vocab_size)
    if 256 + n_merges > 0xD800:
        raise ValueError(f"vocab_size {vocab_size} is too large for this trainer (at most {0xD800})")
    words = ["".join(map(chr, w)) for w in word_counts]
    freqs = list(word_counts.values())
    counts: defaultdict[tuple[str, str], int] = defaultdict(int)
    where: defaultdict[tuple[str, str], set[int]] = defaultdict(set)
    for i, word in enumerate(words):
        for pair in zip(word, word[1:]):  # noqa: B905 - consecutive characters
            counts[pair] += freqs[i]
            where[pair].add(i)
    heap = [(-c, p) for p, c in counts.items()]
    heapq.heapify(heap)
    merges: list[Pair] = []
    while len(merges) < n_merges and heap:
        neg, pair = heapq.heappop(heap)
        if counts.get(pair, 0) != -neg or -neg <= 0:
            continue  # stale: this pair's count changed after the entry was pushed
        new = chr(256 + len(merges))
        merges.append((ord(pair[0]), ord(pair[1])))
        joined = pair[0] + pair[1]
        changed: set[tuple[str, str]] = set()
        for i in where.pop(pair, ()):  # the order does not matter: counts change by sums
            word, freq = words[i], freqs[i]
            if joined not in word:
                continue  # a stale index entry
            # Only pairs touching a merged occurrence change: update those, not the whole word.
            size, start, last_end = len(word), word.find(joined), -1
            while start != -1:
                removed = [pair]
                if start > 0 and start != last_end:  # the left neighbour was not merged itself
                    removed.append((word[start - 1], pair[0]))
                if start + 2 < size:
                    removed.append((pair[1], word[start + 2]))
                for old in removed:
                    counts[old] -= freq
                changed.update(removed)
                last_end = start + 2
                start = word.find(joined, last_end)
            word = words[i] = word.replace(joined, new)
            start = word.find(new)
            while start != -1:
                added = []
                if start > 0:
                    added.append((word[start - 1], new))
                if start + 1 < len(word) and word[start + 1] != new:
                    added.append((new, word[start + 1]))
                for p in added:
                    counts[p] += freq
                    where[p].add(i)
                changed.update(added)
                start = word.find(new, start + 1)
        counts.pop(pair, None)
        for p in changed:
            if counts.get(p, 0) > 0:
                heapq.heappush(heap, (-counts[p], p))
            else:
                counts.pop(p, None)
    return merges


# what compiling a bad split pattern raises, in whichever regex engine compile_pattern picked
PATTERN_ERRORS: tuple[type[Exception], ...] = (re.error, ValueError) + ((regex.error,) if regex is not None else ())


def merge_work(word_counts: Counter, merges: list[Pair]) -> tuple[int, int]:
    """The work each trainer does to learn ``merges``, counted rather than timed: the pairs
    :func:`train_naive` counts (every adjacent pair of every distinct word, before every merge)
    and the words :func:`train_merges` rewrites (only those that hold the pair being merged)."""
    words = [tuple(w) for w in word_counts]
    counted = rewritten = 0
    for step, pair in enumerate(merges):
        counted += sum(len(w) - 1 for w in words)
        for i, word in enumerate(words):
            if pair in pairwise(word):
                words[i] = tuple(merge_pair(list(word), pair, 256 + step))
                rewritten += 1
    return counted, rewritten


def _checked_pattern(pattern: object):
    if not isinstance(pattern, str) or not pattern:
        raise ValueError(f"the split pattern must be a non-empty regex string, not {pattern!r}")
    try:
        compiled = compile_pattern(pattern)
    except PATTERN_ERRORS as err:
        raise ValueError(f"the split pattern {pattern!r} is not a valid regex: {err}") from None
    return compiled


def _checked_specials(special: dict, first: int, n_vocab: int | None) -> dict[str, int]:
    """Special tokens take the ids after the merges, one each. Without ``n_vocab`` they follow the
    merges without gaps, so ``vocab_size`` counts them; with it (an imported encoding such as
    cl100k_base, whose specials skip ids) each lies in ``[first, n_vocab)``."""
    for name, token_id in special.items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"a special token must be a non-empty string, not {name!r}")
        if not isinstance(token_id, int) or isinstance(token_id, bool):
            raise ValueError(f"special token {name!r} has id {token_id!r}, which is not an integer")
        if token_id < first:
            raise ValueError(f"special token {name!r} has id {token_id}, which a merge already uses")
    ids = sorted(special.values())
    if n_vocab is None and ids != list(range(first, first + len(ids))):
        raise ValueError(f"special token ids must be {first} to {first + len(ids) - 1}, one each "
                         f"(the ids after the merges), not {ids}")
    if n_vocab is not None and (len(set(ids)) != len(ids) or max(ids, default=-1) >= n_vocab or n_vocab < first):
        raise ValueError(f"special token ids must be distinct, one each, from {first} and below n_vocab={n_vocab}, "
                         f"not {ids}")
    return special


def _checked_byte_ids(byte_ids: Iterable[int] | None) -> bytes:
    """The id of each byte value as a ``bytes.translate`` table: a permutation of 0-255."""
    table = list(range(256)) if byte_ids is None else list(byte_ids)
    if not all(type(i) is int for i in table) or sorted(table) != list(range(256)):
        raise ValueError("byte_ids must give each of the 256 byte values its own id in 0-255 (a permutation)")
    return bytes(table)


def _checksum(lines: list[str]) -> str:
    """The closing line of a saved tokenizer file: a SHA-256 of the lines before it."""
    return "sha256 " + hashlib.sha256("".join(f"{line}\n" for line in lines).encode("utf-8")).hexdigest()


class Tokenizer:
    """A trained byte-level BPE: merges, a pre-tokenisation pattern and special tokens."""

    def __init__(
        self,
        merges: list[Pair],
        pattern: str = GPT4_SPLIT,
        special_tokens: dict[str, int] | None = None,
        byte_ids: Iterable[int] | None = None,
        n_vocab: int | None = None,
    ):
        """``byte_ids[b]`` is the id of byte ``b`` (default: ``b``; cl100k_base permutes them);
        ``n_vocab`` is the size of the id space when the special tokens leave gaps in it."""
        self.merges = [tuple(pair) for pair in merges]
        self.pattern = pattern
        self._split = _checked_pattern(pattern)
        self._byte_table = _checked_byte_ids(byte_ids)
        self.ranks = {pair: 256 + i for i, pair in enumerate(self.merges)}
        self.vocab = [b""] * 256
        for byte, token_id in enumerate(self._byte_table):
            self.vocab[token_id] = bytes([byte])
        for a, b in self.merges:
            self.vocab.append(self.vocab[a] + self.vocab[b])
        self.special_tokens = _checked_specials(dict(special_tokens or {}), len(self.vocab), n_vocab)
        self._n_vocab = n_vocab
        self._special_ids = {i: s.encode("utf-8") for s, i in self.special_tokens.items()}
        self._special_split = (
            re.compile("(" + "|".join(map(re.escape, sorted(self.special_tokens, key=len, reverse=True))) + ")")
            if self.special_tokens
            else None
        )
        self._cache: dict[str, list[int]] = {}

    @classmethod
    def from_ranks(
        cls, ranks: dict[bytes, int], pattern: str, special_tokens: dict[str, int] | None = None,
        n_vocab: int | None = None,
    ) -> Tokenizer:
        """The tokenizer of a tiktoken rank table (``{token bytes: id}``): merges rebuilt from the
        ranks (:func:`posttrainllm.bpe_ranks.merges_from_ranks`), the bytes' ids kept as they are."""
        merges, byte_ids = merges_from_ranks(ranks)
        return cls(merges, pattern, special_tokens, byte_ids, n_vocab)

    @classmethod
    def from_tiktoken(cls, encoding) -> Tokenizer:
        """The same encoding as a ``tiktoken.Encoding`` (e.g. ``tiktoken.get_encoding("cl100k_base")``,
        or one built offline from :func:`posttrainllm.bpe_ranks.read_ranks`): identical ids."""
        # tiktoken exposes the ranks, pattern and specials it was built from only as these attributes
        return cls.from_ranks(
            encoding._mergeable_ranks, encoding._pat_str, encoding._special_tokens, encoding.n_vocab
        )

    @classmethod
    def train(
        cls,
        texts: Iterable[str] | str,
        vocab_size: int,
        pattern: str = GPT4_SPLIT,
        special_tokens: Iterable[str] = (),
        processes: int = 1,
    ) -> Tokenizer:
        """Train to ``vocab_size`` tokens (bytes + merges); special tokens get the ids after them.

        ``processes`` > 1 pre-tokenises in parallel (see :func:`count_words`); merges are the same.
        """
        merges = train_merges(count_words(texts, pattern, processes), vocab_size)
        specials = {s: 256 + len(merges) + i for i, s in enumerate(special_tokens)}
        return cls(merges, pattern, specials)

    @property
    def vocab_size(self) -> int:
        """The size of the id space: what a model's embedding needs."""
        return self._n_vocab or len(self.vocab) + len(self.special_tokens)

    # --- encoding -------------------------------------------------------------------------

    def _encode_chunk(self, chunk: str) -> list[int]:
        cached = self._cache.get(chunk)
        if cached is not None:
            return cached
        ids = apply_merges(list(to_bytes(chunk).translate(self._byte_table)), self.ranks)
        if len(self._cache) < 200_000:  # bounded: streaming a huge input cannot grow it forever
            self._cache[chunk] = ids
        return ids

    def encode_ordinary(self, text: str) -> list[int]:
        """Encode treating special-token strings as plain text."""
        out: list[int] = []
        for chunk in pretokens(self._split, text):
            out.extend(self._encode_chunk(chunk))
        return out

    def _check_special(self, text: str, allowed: set[str]) -> None:
        if self._special_split is None:
            return
        for found in self._special_split.findall(text):
            if found not in allowed:
                raise ValueError(
                    f"the text contains the special token {found!r}, which is not allowed here. "
                    f"Pass allowed_special={{{found!r}}} (or 'all') to encode it as a special token, "
                    "or use encode_ordinary() to encode it as plain text."
                )

    def encode(self, text: str, allowed_special: set[str] | str = frozenset()) -> list[int]:
        """Token ids of ``text``. Special-token strings raise unless listed in ``allowed_special``."""
        allowed = self._allowed(allowed_special)
        self._check_special(text, allowed)
        if not allowed:
            return self.encode_ordinary(text)
        out: list[int] = []
        for part in self._special_split.split(text):
            if part in allowed:
                out.append(self.special_tokens[part])
            elif part:
                out.extend(self.encode_ordinary(part))
        return out

    def encode_iterable(self, texts: Iterable[str], allowed_special: set[str] | str = frozenset()) -> Iterator[int]:
        """Encode a stream of text pieces lazily: the ids of ``encode("".join(texts), allowed_special)``,
        with memory bounded by the longest pre-token. A special token that is not allowed raises
        ``ValueError`` when the stream reaches it, after the ids before it were yielded.

        A pre-token, or a special token, can straddle two pieces, so the end of the text that
        could still grow into one is held back until more arrives.
        """
        allowed = self._allowed(allowed_special)
        hold = max(map(len, self.special_tokens), default=1) - 1  # how much of a special token can be unfinished
        width = context_width(self.pattern)  # what a pre-token's split may read before it: kept as `before`
        # text already encoded that the next split may look back at; text whose last pre-token may still
        # grow; text not yet scanned for special tokens
        before = ordinary = pending = ""
        for piece in chain(texts, [None]):
            last = piece is None
            pending += piece or ""
            limit = len(pending) if last else len(pending) - hold
            start = 0
            for found in self._special_split.finditer(pending) if self._special_split else ():
                if found.end() > limit:
                    limit = min(limit, found.start())
                    break
                self._check_special(found.group(), allowed)
                for chunk in pretokens(self._split, before + ordinary + pending[start : found.start()], len(before)):
                    yield from self._encode_chunk(chunk)
                yield self.special_tokens[found.group()]
                before, ordinary, start = "", "", found.end()  # encode splits the text at specials: no context
            limit = max(start, limit)
            text = ordinary + pending[start:limit]
            chunks = pretokens(self._split, before + text, len(before))
            pending = pending[limit:]
            ordinary = "" if last or not chunks else chunks.pop()
            done = before + text[: len(text) - len(ordinary)]
            before = done[max(0, len(done) - width) :]
            for chunk in chunks:
                yield from self._encode_chunk(chunk)

    def _allowed(self, allowed_special: set[str] | str) -> set[str]:
        allowed = set(self.special_tokens) if allowed_special == "all" else set(allowed_special)
        unknown = allowed - set(self.special_tokens)
        if unknown:
            raise ValueError(f"allowed_special names tokens this tokenizer does not have: {sorted(unknown)}")
        return allowed

    # --- decoding -------------------------------------------------------------------------

    def decode_bytes(self, ids: Iterable[int]) -> bytes:
        parts = []
        for i in ids:
            if 0 <= i < len(self.vocab):
                parts.append(self.vocab[i])
            elif i in self._special_ids:
                parts.append(self._special_ids[i])
            else:
                raise ValueError(f"token id {i} is not in this vocabulary of {self.vocab_size} tokens")
        return b"".join(parts)

    def decode(self, ids: Iterable[int], errors: str = "replace") -> str:
        """Text of ``ids``; exact for anything :meth:`encode` produced (see the module docstring)."""
        data = self.decode_bytes(ids)
        try:
            return data.decode("utf-8", errors="surrogatepass")
        except UnicodeDecodeError:
            return data.decode("utf-8", errors=errors)

    # --- interop and persistence ----------------------------------------------------------

    def tiktoken_ranks(self) -> dict[bytes, int]:
        """``{token bytes: id}``, the ``mergeable_ranks`` of an equivalent ``tiktoken.Encoding``."""
        return {token: i for i, token in enumerate(self.vocab)}

    def save(self, path: str | Path) -> None:
        """Write the documented text format, atomically::

            posttrainllm-bpe v3
            pattern <the split regex, as a JSON string>
            special <JSON object: token string -> id>
            byte_ids <"identity", or a JSON list: the id of each byte value 0-255>
            n_vocab <the size of the id space>
            merges <N>
            <left id> <right id>        (N lines; line i creates id 256 + i)
            sha256 <hex digest of every line above, each ending in a newline>

        The checksum catches what the structure cannot: a changed digit in a merge line is still a
        well-formed file, of another tokenizer. Beside it goes ``<path>.vocab``, every token for a
        person to read (:meth:`vocab_lines`); only the model file is read back.
        """
        table = list(self._byte_table)
        lines = [FORMAT, f"pattern {json.dumps(self.pattern)}", f"special {json.dumps(self.special_tokens)}"]
        lines += [f"byte_ids {'identity' if table == list(range(256)) else json.dumps(table)}"]
        lines += [f"n_vocab {self.vocab_size}", f"merges {len(self.merges)}", *(f"{a} {b}" for a, b in self.merges)]
        atomic.write_text(path, "\n".join([*lines, _checksum(lines)]) + "\n")
        atomic.write_text(f"{path}.vocab", "\n".join(self.vocab_lines()) + "\n")

    def vocab_lines(self) -> list[str]:
        """The vocabulary for a person to read: one line per id, the token (see :func:`_shown`) and,
        for a merge, the two ids it joins."""
        head = [
            "# id, token, and the merge that made it. Training merges the most frequent pair; a tie goes to",
            "# the smallest (left id, right id). Encoding applies merges lowest id first.",
        ]
        rows = [f"{i}\t{_shown(self.vocab[i])}" for i in range(256)]
        rows += [f"{256 + k}\t{_shown(self.vocab[256 + k])}\t= {a} + {b}" for k, (a, b) in enumerate(self.merges)]
        specials = sorted(self.special_tokens.items(), key=lambda item: item[1])
        rows += [f"{i}\t{json.dumps(name)}\tspecial" for name, i in specials]
        return head + rows

    @classmethod
    def load(cls, path: str | Path) -> Tokenizer:
        """Read :meth:`save`'s format (or v2 and v1, which had bytes in order, and v1 no checksum); a
        foreign, truncated or corrupt file gives a clear error."""

        def fail(why: str) -> ValueError:
            return ValueError(f"{path} is not a valid tokenizer file: {why}")

        try:
            lines = Path(path).read_text(encoding="utf-8").splitlines()
        except UnicodeDecodeError as err:
            raise fail(f"it is not UTF-8 text (byte {err.start})") from None
        if not lines or lines[0] not in (FORMAT, FORMAT_V2, FORMAT_V1):
            raise fail(f"the first line should be {FORMAT!r}")
        if lines[0] != FORMAT_V1:
            if not lines[-1].startswith("sha256 "):
                raise fail("it does not end with its checksum line (truncated?)")
            if lines[-1] != _checksum(lines[:-1]):
                raise fail("its contents do not match its checksum (damaged, or edited by hand)")
            lines = lines[:-1]
        if lines[0] != FORMAT:  # v1 and v2: no byte_ids or n_vocab lines
            lines[3:3] = ["byte_ids identity", "n_vocab none"]
        try:
            pattern = json.loads(lines[1].removeprefix("pattern "))
            special = json.loads(lines[2].removeprefix("special "))
            shown = lines[3].removeprefix("byte_ids ")
            byte_ids = None if shown == "identity" else json.loads(shown)
            shown = lines[4].removeprefix("n_vocab ")
            n_vocab = None if shown == "none" else int(shown)
            n = int(lines[5].removeprefix("merges "))
            merges = [tuple(map(int, line.split())) for line in lines[6:]]
        except (IndexError, ValueError) as err:
            raise fail(f"the header is damaged ({err})") from None
        if len(merges) != n or any(len(m) != 2 for m in merges):
            raise fail(f"it declares {n} merges but holds {len(merges)} well-formed lines (truncated?)")
        for i, (a, b) in enumerate(merges):
            if not (0 <= a < 256 + i and 0 <= b < 256 + i):
                raise fail(f"merge {i} uses an id that does not exist yet: ({a}, {b})")
        if not isinstance(special, dict):
            raise fail(f"the special tokens should be a JSON object, not {special!r}")
        try:
            return cls(merges, pattern, special, byte_ids, n_vocab)
        except (ValueError, TypeError) as err:
            raise fail(str(err)) from None


def _shown(token: bytes) -> str:
    """A token as a person reads it: valid UTF-8 as a JSON string, anything else as Python's bytes
    literal (``b'\\xe2\\x80'``), so the two never look alike."""
    try:
        return json.dumps(token.decode("utf-8"), ensure_ascii=False)
    except UnicodeDecodeError:
        return repr(token)
