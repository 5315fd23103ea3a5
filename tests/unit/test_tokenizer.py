import functools
from collections import Counter
from itertools import pairwise

import pytest
import tiktoken
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrainllm import data
from posttrainllm.tokenizer import (
    FORMAT,
    FORMAT_V1,
    FORMAT_V2,
    GPT2_SPLIT,
    GPT4_SPLIT,
    Tokenizer,
    _checksum,
    apply_merges,
    context_width,
    count_words,
    merge_pair,
    merge_work,
    train_merges,
    train_naive,
)

TEXT = data.corpus(60_000, seed=3)


@functools.cache
def trained(vocab_size: int = 400, pattern: str | None = None) -> Tokenizer:
    kwargs = {"pattern": pattern} if pattern else {}
    return Tokenizer.train(TEXT, vocab_size, special_tokens=["<|endoftext|>", "<|user|>"], **kwargs)


def as_tiktoken(tok: Tokenizer) -> tiktoken.Encoding:
    return tiktoken.Encoding(
        "posttrainllm-test",
        pat_str=tok.pattern,
        mergeable_ranks=tok.tiktoken_ranks(),
        special_tokens=tok.special_tokens,
    )


any_text = st.text(st.characters(codec="utf-8"), max_size=200)  # every encodable code point
with_surrogates = st.text(st.characters(), max_size=200)  # lone surrogates too


@pytest.mark.parametrize("pattern", [None, GPT2_SPLIT])
def test_fast_trainer_makes_exactly_the_naive_trainers_merges(pattern):
    kwargs = {"pattern": pattern} if pattern else {}
    assert trained(400, pattern).merges == train_naive(TEXT, 400, **kwargs)


@settings(max_examples=80, deadline=None)
@given(text=any_text, vocab=st.integers(256, 300))
def test_fast_and_naive_trainers_agree_on_arbitrary_text(text, vocab):
    assert train_merges(count_words(text), vocab) == train_naive(text, vocab)


@settings(max_examples=150, deadline=None)
@given(text=st.text(alphabet="ab \n", max_size=300), vocab=st.integers(256, 320))
def test_trainers_agree_on_runs_of_repeated_pairs(text, vocab):
    # "aaaa" and "abab" are where a local update can double-count or miss a pair
    assert train_merges(count_words(text), vocab) == train_naive(text, vocab)


def test_parallel_pre_tokenisation_counts_the_same():
    big = data.corpus(300_000, seed=4)
    assert count_words(big, processes=2) == count_words(big)


def test_ties_are_broken_by_the_smallest_pair():
    # "ab" and "cd" both occur twice (line breaks keep them separate pre-tokens);
    # (97, 98) < (99, 100), so "ab" is merged first
    text = "ab\ncd\nab\ncd"
    assert train_naive(text, 257) == [(97, 98)] == train_merges(count_words(text), 257)


def test_merge_work_counts_what_each_trainer_touches():
    words = Counter({(97, 98, 97, 98): 5, (97, 98): 2, (99,): 1})
    # before merge 1: 3 + 1 + 0 pairs, both "ab" words rewritten; before merge 2 the words are
    # (256, 256), (256,), (99,): 1 pair, one word rewritten
    assert merge_work(words, [(97, 98)]) == (4, 2)
    assert merge_work(words, [(97, 98), (256, 256)]) == (5, 3)
    corpus = count_words(TEXT)
    counted, rewritten = merge_work(corpus, train_merges(corpus, 300))
    assert rewritten < counted / 100  # the point of the incremental trainer


@settings(max_examples=1000, deadline=None)
@given(text=with_surrogates)
def test_decode_encode_round_trips_every_string_including_lone_surrogates(text):
    tok = trained()
    assert tok.decode(tok.encode_ordinary(text)) == text


@settings(max_examples=300, deadline=None)
@given(text=any_text)
def test_ids_are_identical_to_tiktoken_built_from_our_ranks(text):
    tok = trained()
    assert tok.encode_ordinary(text) == as_tiktoken(tok).encode_ordinary(text)


def test_ids_match_tiktoken_on_the_corpus_and_with_the_gpt2_pattern():
    held_out = data.corpus(100_000, seed=9)
    for tok in (trained(), trained(400, GPT2_SPLIT)):
        assert tok.encode_ordinary(held_out) == as_tiktoken(tok).encode_ordinary(held_out)


@settings(max_examples=200, deadline=None)
@given(text=any_text, cuts=st.lists(st.integers(0, 200), max_size=8))
def test_streaming_encode_equals_encoding_the_whole_text(text, cuts):
    tok = trained()
    bounds = sorted({min(c, len(text)) for c in cuts} | {0, len(text)})
    pieces = [text[a:b] for a, b in pairwise(bounds)]
    assert list(tok.encode_iterable(pieces)) == tok.encode_ordinary(text)


def test_special_tokens_are_refused_unless_allowed():
    tok = trained()
    text = "Once there was a fox.<|endoftext|>The end."
    with pytest.raises(ValueError, match=r"special token '<\|endoftext\|>'.*allowed_special"):
        tok.encode(text)
    ids = tok.encode(text, allowed_special={"<|endoftext|>"})
    assert tok.special_tokens["<|endoftext|>"] in ids and tok.decode(ids) == text
    assert tok.encode(text, allowed_special="all") == ids
    assert tok.special_tokens["<|endoftext|>"] not in tok.encode_ordinary(text)
    assert ids == as_tiktoken(tok).encode(text, allowed_special={"<|endoftext|>"})
    with pytest.raises(ValueError, match="does not have"):
        tok.encode("hi", allowed_special={"<|nope|>"})


def test_special_ids_follow_the_merges():
    tok = trained()
    assert sorted(tok.special_tokens.values()) == [256 + len(tok.merges), 257 + len(tok.merges)]
    assert tok.vocab_size == 402


def test_save_and_load_round_trip(tmp_path):
    tok = trained()
    path = tmp_path / "tok.bpe"
    tok.save(path)
    again = Tokenizer.load(path)
    assert again.merges == tok.merges and again.special_tokens == tok.special_tokens and again.pattern == tok.pattern
    assert again.encode(TEXT[:2000]) == tok.encode(TEXT[:2000])


def _as_version(text: str, version: str) -> str:
    """A v3 file as an older version wrote it: v2 had no byte_ids or n_vocab lines, v1 no checksum."""
    lines = text.splitlines(keepends=True)
    v2 = [FORMAT_V2 + "\n", *lines[1:3], *lines[5:-1]]
    if version == FORMAT_V2:
        return "".join(v2) + _checksum([line.rstrip("\n") for line in v2]) + "\n"
    return "".join([FORMAT_V1 + "\n", *v2[1:]])


@functools.cache
def _bare(specials: tuple[str, ...] = ()) -> Tokenizer:
    return Tokenizer.train(TEXT[:5000], 280, special_tokens=list(specials))


def _gapped() -> Tokenizer:
    first = 256 + len(_bare().merges)
    return Tokenizer(_bare().merges, special_tokens={"<|x|>": first + 3, "<|y|>": first}, n_vocab=first + 10)


ROUND_TRIPS = {"no special tokens": _bare, "two special tokens": lambda: _bare(("<|a|>", "<|b|>")),
               "special ids with gaps": _gapped}


# v1 and v2 had no n_vocab line, so they never held special ids with gaps
VERSIONS = [(k, v) for k in sorted(ROUND_TRIPS) for v in (FORMAT, FORMAT_V2, FORMAT_V1)
            if v == FORMAT or k != "special ids with gaps"]


@pytest.mark.parametrize(("kind", "version"), VERSIONS)
def test_every_tokenizer_reloads_as_it_was_saved_in_each_format_version(kind, version, tmp_path):
    tok = ROUND_TRIPS[kind]()
    path = tmp_path / "tok.bpe"
    tok.save(path)
    if version != FORMAT:
        path.write_text(_as_version(path.read_text(), version))
    again = Tokenizer.load(path)
    assert (again.merges, again.special_tokens, again.vocab_size) == (tok.merges, tok.special_tokens, tok.vocab_size)
    sample = TEXT[:500] + "".join(tok.special_tokens)
    assert again.encode(sample, allowed_special="all") == tok.encode(sample, allowed_special="all")


def with_line(text: str, index: int, line: str) -> str:
    lines = text.splitlines()
    return "\n".join([*lines[:index], line, *lines[index + 1 :]]) + "\n"


def n_ids(text: str) -> int:  # the first id after the merges: where special tokens start
    return 256 + int(next(line for line in text.splitlines() if line.startswith("merges ")).split()[1])


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda t: "\n".join(t.splitlines()[:-5]) + "\n", "truncated"),
        (lambda t: "hello\n", "first line"),
        (lambda t: t.replace("merges ", "merges x", 1), "header is damaged"),
        (lambda t: t + "9999 1\n", "holds"),
        (lambda t: "\n".join([*t.splitlines()[:6], "300 1", *t.splitlines()[7:]]) + "\n", "does not exist yet"),
        (lambda t: with_line(t, 3, "byte_ids [0, 0]"), "permutation"),
        (lambda t: with_line(t, 3, 'byte_ids ["a"]'), "permutation"),
        (lambda t: with_line(t, 4, "n_vocab 300"), "below n_vocab=300"),
        (lambda t: with_line(t, 4, "n_vocab many"), "header is damaged"),
        (lambda t: with_line(t, 1, 'pattern "(unclosed"'), "not a valid regex"),
        (lambda t: with_line(t, 1, "pattern 42"), "non-empty regex string"),
        (lambda t: with_line(t, 2, 'special {"<a>": "x", "<b>": 1}'), "not an integer"),
        (lambda t: with_line(t, 2, 'special ["<a>"]'), "JSON object"),
        (lambda t: with_line(t, 2, f'special {{"<a>": {n_ids(t)}, "<b>": {n_ids(t)}}}'), "one each"),
        (lambda t: with_line(t, 2, f'special {{"<a>": {n_ids(t)}, "<b>": 99999999}}'), "one each"),
        (lambda t: with_line(t, 2, f'special {{"": {n_ids(t)}}}'), "non-empty string"),
    ],
)
def test_a_damaged_file_gives_a_clear_error(tmp_path, damage, message):
    """Each damage is made well-formed again — a fresh checksum, as a hand-written file would carry —
    so that the structural check behind the checksum is what answers."""
    path = tmp_path / "tok.bpe"
    trained().save(path)
    body = damage("".join(path.read_text().splitlines(keepends=True)[:-1]))
    path.write_text(body if body.startswith("hello") else body + _checksum(body.splitlines()) + "\n")
    with pytest.raises(ValueError, match=message):
        Tokenizer.load(path)


def test_the_checksum_catches_a_well_formed_change_and_truncation(tmp_path):
    tok, path = trained(), tmp_path / "tok.bpe"
    tok.save(path)
    text = path.read_text()
    assert text.splitlines()[-1].startswith("sha256 ")
    merge = next(line for line in text.splitlines()[6:-1] if len(set(line.split())) == 2)
    edited = text.replace(f"\n{merge}\n", f"\n{merge.split()[1]} {merge.split()[0]}\n", 1)  # another valid merge
    path.write_text(edited)
    with pytest.raises(ValueError, match="do not match its checksum"):
        Tokenizer.load(path)
    path.write_text("".join(text.splitlines(keepends=True)[:-3]))
    with pytest.raises(ValueError, match="truncated"):
        Tokenizer.load(path)
    path.write_bytes(text.encode()[:20] + b"\xff\xfe" + text.encode()[20:])
    with pytest.raises(ValueError, match="not UTF-8"):
        Tokenizer.load(path)


def test_bad_arguments():
    with pytest.raises(ValueError, match="at least 256"):
        Tokenizer.train("abc", 100)
    with pytest.raises(ValueError, match="not in this vocabulary"):
        trained().decode([10**6])
    with pytest.raises(ValueError, match="already uses"):
        Tokenizer([(97, 98)], special_tokens={"<s>": 256})


@settings(max_examples=200, deadline=None)
@given(text=any_text, pattern=st.sampled_from([r"\w+", r"[a-z]+", r"\d", r"(\w)\w*", r"x*", r" ?\p{L}+"]))
def test_a_pattern_that_misses_characters_loses_no_text(text, pattern):
    tok = Tokenizer([(97, 98)], pattern=pattern)  # one merge, so "ab" inside a gap is merged too
    assert tok.decode(tok.encode_ordinary(text)) == text
    assert list(tok.encode_iterable(text[i : i + 7] for i in range(0, len(text), 7))) == tok.encode_ordinary(text)


# patterns that look behind a pre-token's start: a stream must carry that much of the text before it
LOOKING_BACK = [r"\b\w|\w+|\s+|[^\w\s]+", r"(?<=th)e|\w+|\s+|.", r"(?<!\d)\d{1,2}|\w+|\s+|.", r"^\w|\w+|\s+|.",
                r"(?m)^\w|\w+|\s+|.", r"\B\w|\s+|."]


@settings(max_examples=300, deadline=None)
@given(parts=st.lists(st.sampled_from(["the", " cat", "<|endoftext|>", "12", "345", "\n", "é", " ", ".", "th", "e"]),
                      max_size=14),
       cuts=st.lists(st.integers(1, 6), min_size=1, max_size=5), pattern=st.sampled_from(LOOKING_BACK))
def test_a_stream_gives_the_ids_of_the_whole_text_under_patterns_that_look_back(parts, cuts, pattern):
    tok, text = trained_on(pattern), "".join(parts)
    pieces = cut(text, cuts)
    assert list(tok.encode_iterable(pieces, allowed_special="all")) == tok.encode(text, allowed_special="all")


@functools.cache
def trained_on(pattern: str) -> Tokenizer:
    return Tokenizer.train("the cat 12345 then\n" * 5, 270, pattern=pattern, special_tokens=["<|endoftext|>"])


def cut(text: str, cuts: list[int]) -> list[str]:
    """``text`` in pieces of the lengths ``cuts``, repeated as often as needed."""
    pieces, i = [], 0
    while i < len(text):
        step = cuts[len(pieces) % len(cuts)]
        pieces.append(text[i : i + step])
        i += step
    return pieces


def test_how_far_a_pattern_looks_back():
    assert [context_width(p) for p in (GPT2_SPLIT, GPT4_SPLIT, *LOOKING_BACK)] == [0, 0, 1, 2, 1, 1, 1, 1]
    tok = Tokenizer([], pattern=r"(?<=a+)b|.")  # the regex package's look-behind of any length
    assert tok.encode("aab") == [97, 97, 98]
    with pytest.raises(ValueError, match="cannot be checked for look-behind, so it cannot be streamed"):
        list(tok.encode_iterable(["aab"]))


def test_cut_utf8_decodes_with_replacement_characters():
    tok = trained()
    ids = list("é".encode())  # two byte tokens; drop the second
    assert tok.decode(ids[:1]) == "\ufffd"


@settings(max_examples=200, deadline=None)
@given(parts=st.lists(st.sampled_from(["<|endoftext|>", "<|user|>", "<|end", "oftext|>", "a b", "é", " ", "<|"]),
                      max_size=12),
       cuts=st.lists(st.integers(1, 9), min_size=1, max_size=5))
def test_streaming_handles_special_tokens_split_across_pieces(parts, cuts):
    tok, text = trained(), "".join(parts)
    pieces = cut(text, cuts)
    assert list(tok.encode_iterable(pieces, allowed_special="all")) == tok.encode(text, allowed_special="all")
    allowed = {"<|user|>"}
    if "<|endoftext|>" in text:
        with pytest.raises(ValueError, match="not allowed"):
            list(tok.encode_iterable(pieces, allowed_special=allowed))
    else:
        assert list(tok.encode_iterable(pieces, allowed_special=allowed)) == tok.encode(text, allowed_special=allowed)


def _textbook_merges(ids, ranks):
    while len(ids) > 1:
        best = min(zip(ids, ids[1:], strict=False), key=lambda p: ranks.get(p, 1 << 62))
        if best not in ranks:
            break
        ids = merge_pair(ids, best, ranks[best])
    return ids


@settings(max_examples=200, deadline=None)
@given(text=st.text(alphabet="ab c", max_size=80), n_merges=st.integers(0, 40))
def test_the_heap_merges_as_the_textbook_loop_does(text, n_merges):
    trained = Tokenizer(train_merges(count_words("aab abba cab baa ab ab c aaa bbb " * 3), 256 + n_merges))
    ids = list(text.encode())
    assert apply_merges(ids, trained.ranks) == _textbook_merges(ids, trained.ranks)


def test_one_long_pretoken_encodes_in_one_pass():
    model = Tokenizer(train_merges(count_words(TEXT), 300))
    word = "ab" * 50_000  # a 100,000-letter pre-token: the textbook loop needs ~10^10 steps here
    assert model.decode(model.encode_ordinary(word)) == word
