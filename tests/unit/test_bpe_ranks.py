"""GPT-4's tokenizer (cl100k_base) loaded into the book's Tokenizer: the same ids as tiktoken.

The ranks come from the js-tiktoken npm package that `make vendor` installs (no network here);
the first test proves they are byte for byte the file tiktoken itself downloads.
"""

import base64
import functools
import hashlib
import inspect
import random
import re
from pathlib import Path

import pytest
import tiktoken
import tiktoken_ext.openai_public as openai_public
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrainllm import bpe_ranks, data
from posttrainllm.tokenizer import GPT2_SPLIT, Tokenizer

ROOT = Path(__file__).resolve().parents[2]
RANKS = ROOT / "node_modules" / "js-tiktoken" / "dist" / "ranks" / "cl100k_base.js"


@functools.cache
def rank_table() -> bpe_ranks.RankTable:
    assert RANKS.exists(), f"{RANKS} is missing: `make vendor` installs it (npm ci)"
    return bpe_ranks.read_ranks(RANKS)


@functools.cache
def official() -> tiktoken.Encoding:
    """tiktoken's own cl100k_base definition (its pattern and special tokens), with the ranks
    handed over instead of downloaded."""
    download = openai_public.load_tiktoken_bpe
    openai_public.load_tiktoken_bpe = lambda *args, **kwargs: rank_table().ranks
    try:
        spec = openai_public.cl100k_base()
    finally:
        openai_public.load_tiktoken_bpe = download
    return tiktoken.Encoding(**spec)


@functools.cache
def ours() -> Tokenizer:
    return Tokenizer.from_tiktoken(official())


def test_the_ranks_are_the_file_tiktoken_downloads():
    published = re.search(r'expected_hash="([0-9a-f]{64})"', inspect.getsource(openai_public.cl100k_base)).group(1)
    text = bpe_ranks.tiktoken_file_text(rank_table().ranks)
    assert hashlib.sha256(text.encode()).hexdigest() == published
    assert rank_table().special_tokens == official()._special_tokens


def test_bytes_are_permuted_and_specials_leave_gaps():
    tok = ours()
    # cl100k_base keeps GPT-2's byte order (module 6 says so): printable bytes first, then the rest
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    order = printable + [b for b in range(256) if b not in printable]
    assert tok.vocab[:256] == [bytes([b]) for b in order] and tok.encode("!") == [0]
    assert tok.vocab_size == official().n_vocab == 100277
    assert len(tok.merges) == 100256 - 256
    assert tok.encode("<|endofprompt|>", allowed_special="all") == [100276]
    with pytest.raises(ValueError, match="not in this vocabulary"):
        tok.decode([100270])  # an id between the special tokens that no token has


def edge_text(seed: int, n: int) -> list[str]:
    """Short texts built from what the split pattern and the merges treat specially."""
    pieces = ["'s", "'LL", "'Ve", " ", "  ", "\n", "\r\n", "\t", "\u00a0", "\u3000", "\u200b", "12345", "3.14",
              "hello", " world", "The", "über", "naïve", "中文", "日本語", "한국어", "Ωμέγα", "😀", "🚀👍🏽", "a̐",
              "<|endoftext|>", "<|fim_middle|>", "!!!", "...", "->", "::", "{}", "\x00", "\x7f", "Ա"]
    rng = random.Random(seed)
    return ["".join(rng.choice(pieces) for _ in range(rng.randint(0, 30))) for _ in range(n)]


def test_the_same_ids_as_tiktoken_on_a_fuzzed_corpus():
    enc, tok = official(), ours()
    texts = edge_text(0, 2000) + [data.corpus(20_000, seed=5), (ROOT / "posttrainllm" / "tokenizer.py").read_text()]
    for text in texts:
        ids = tok.encode(text, allowed_special="all")
        assert ids == enc.encode(text, allowed_special="all"), repr(text)
        assert tok.decode(ids) == text


# tiktoken replaces lone surrogates with U+FFFD before encoding; the book's Tokenizer keeps them
# (surrogatepass, see its docstring), so the two are compared on text without them
@settings(max_examples=300, deadline=None)
@given(text=st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=60))
def test_the_same_ids_as_tiktoken_on_any_text(text):
    assert ours().encode_ordinary(text) == official().encode_ordinary(text)


def test_streaming_and_saving_keep_the_ids(tmp_path):
    tok, text = ours(), edge_text(1, 50)
    whole = "".join(text)
    assert list(tok.encode_iterable(text, allowed_special="all")) == official().encode(whole, allowed_special="all")
    path = tmp_path / "cl100k.bpe"
    tok.save(path)
    again = Tokenizer.load(path)
    assert again.vocab == tok.vocab and again.vocab_size == tok.vocab_size
    assert again.encode(whole, allowed_special="all") == tok.encode(whole, allowed_special="all")
    vocab = (tmp_path / "cl100k.bpe.vocab").read_text(encoding="utf-8").splitlines()
    rows = [line for line in vocab if not line.startswith("#")]
    assert len(rows) == 100256 + 5
    assert rows[0] == '0\t"!"' and rows[15339].startswith('15339\t"hello"\t= ')  # rows are in id order


def test_the_vocab_file_a_person_reads(tmp_path):
    tok = Tokenizer.train("hello hello help", 259, special_tokens=["<|end|>"])
    tok.save(tmp_path / "tok.bpe")
    lines = (tmp_path / "tok.bpe.vocab").read_text(encoding="utf-8").splitlines()
    assert lines[0].startswith("#") and "tie" in " ".join(lines[:2])
    rows = [line.split("\t") for line in lines if not line.startswith("#")]
    assert rows[104] == ["104", '"h"'] and rows[0xE2] == ["226", "b'\\xe2'"]  # not UTF-8 alone: a bytes literal
    assert rows[256] == ["256", '"el"', "= 101 + 108"]  # ('h', 'e') and ('e', 'l') tie at 3: the smaller pair
    assert rows[-1] == ["259", '"<|end|>"', "special"]
    assert [tok.vocab[int(r[0])] for r in rows[:-1]] == tok.vocab


def test_another_encoding_loads_too(tmp_path):
    """GPT-2's r50k_base, its ranks passed through a .tiktoken file: a second layout of byte ids."""
    table = bpe_ranks.read_ranks(RANKS.with_name("r50k_base.js"))
    path = write(tmp_path, bpe_ranks.tiktoken_file_text(table.ranks))
    ranks = bpe_ranks.read_ranks(path).ranks
    assert ranks == table.ranks
    enc = tiktoken.Encoding("r50k_base", pat_str=GPT2_SPLIT, mergeable_ranks=ranks, special_tokens=table.special_tokens)
    tok = Tokenizer.from_tiktoken(enc)
    for text in edge_text(2, 300):
        assert tok.encode(text, allowed_special="all") == enc.encode(text, allowed_special="all")


def write(tmp_path, text: str) -> Path:
    path = tmp_path / "ranks.tiktoken"
    path.write_text(text)
    return path


def test_a_tiktoken_file_reads_back(tmp_path):
    ranks = {bytes([b]): b for b in range(256)} | {b"ab": 256, b"abc": 257}
    table = bpe_ranks.read_ranks(write(tmp_path, bpe_ranks.tiktoken_file_text(ranks)))
    assert table == (ranks, None, {})
    assert bpe_ranks.merges_from_ranks(ranks) == ([(97, 98), (256, 99)], list(range(256)))


@pytest.mark.parametrize(
    "ranks, message",
    [
        ({bytes([b]): b for b in range(255)}, "single bytes must have the ranks 0-255"),
        ({bytes([b]): b for b in range(256)} | {b"ab": 300}, "256, 257"),
        ({bytes([b]): b for b in range(256)} | {b"ab": 256, b"cd": 256}, "256, 257"),
        ({bytes([b]): b for b in range(256)} | {b"abc": 256}, "not the join of two tokens"),
    ],
)
def test_a_rank_table_that_is_not_bpe_is_refused(ranks, message):
    with pytest.raises(ValueError, match=message):
        Tokenizer.from_ranks(ranks, GPT2_SPLIT)


@pytest.mark.parametrize("text", ["", "hello\n", "aGk= x\n", "!!! 1\n", '{"bpe_ranks": "x"}'])
def test_a_file_that_is_not_a_rank_table_is_named(tmp_path, text):
    with pytest.raises(ValueError, match="ranks.tiktoken is not a rank table"):
        bpe_ranks.read_ranks(write(tmp_path, text))


def test_a_published_encoding_must_have_its_published_hash(tmp_path):
    """A file cut short at a line's end, or with two ranks swapped, parses: only the hash that tiktoken
    publishes tells it from the real cl100k_base (named by the file, or by the caller)."""
    whole = bpe_ranks.tiktoken_file_text(rank_table().ranks)
    lines = whole.splitlines(keepends=True)
    cut = tmp_path / "cl100k_base.tiktoken"
    cut.write_text("".join(lines[:-1000]))
    with pytest.raises(ValueError, match="does not hold cl100k_base's ranks: their SHA-256 is [0-9a-f]{64}, tiktoken"):
        bpe_ranks.read_ranks(cut)
    swapped = tmp_path / "ranks.tiktoken"
    a, b = lines[5000].split()[0], lines[5001].split()[0]
    swapped.write_text("".join(lines[:5000]) + f"{b} 5000\n{a} 5001\n" + "".join(lines[5002:]))
    assert len(bpe_ranks.read_ranks(swapped).ranks) == 100256  # well formed: another tokenizer
    with pytest.raises(ValueError, match="does not hold cl100k_base's ranks"):
        bpe_ranks.read_ranks(swapped, encoding="cl100k_base")
    (tmp_path / "whole.tiktoken").write_text(whole)
    assert bpe_ranks.read_ranks(tmp_path / "whole.tiktoken", encoding="cl100k_base").ranks == rank_table().ranks
    with pytest.raises(ValueError, match="no published hash for 'cl200k'"):
        bpe_ranks.read_ranks(tmp_path / "whole.tiktoken", encoding="cl200k")


def test_every_js_tiktoken_module_has_its_published_hash():
    for name in ("r50k_base", "gpt2", "p50k_base", "p50k_edit", "o200k_base"):
        bpe_ranks.read_ranks(RANKS.with_name(f"{name}.js"))  # checked against PUBLISHED_SHA256 by its name


BYTES = "".join(f"{base64.b64encode(bytes([b])).decode()} {b}\n" for b in range(256))


@pytest.mark.parametrize("text, message", [
    (BYTES + "YWI= 256\nYWI= 257\n", "the token b'ab' is listed twice"),
    (BYTES + "YWI= 256\nY2Q= 256\n", "the id 256 is given to two tokens"),
    (BYTES + "YWI= 257\n", "no token has the rank 256, though the ranks go up to 257"),
    (BYTES.replace("AA== 0\n", ""), "no token has the rank 0"),
    ('{"bpe_ranks": 5, "pat_str": "x", "special_tokens": {}}', "bpe_ranks is int, not the packed text"),
    ('{"bpe_ranks": "", "pat_str": "x", "special_tokens": {"<|a|>": "1"}}', "special_tokens must map text to whole"),
])
def test_a_rank_file_of_no_published_encoding_numbers_each_token_once(tmp_path, text, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        bpe_ranks.read_ranks(write(tmp_path, text))


def test_a_rank_file_that_is_not_text_is_named(tmp_path):
    path = tmp_path / "ranks.tiktoken"
    path.write_bytes(BYTES.encode() + b"\xff\xfe 256\n")
    with pytest.raises(ValueError, match=r"ranks.tiktoken is not a rank table: it is not UTF-8 text \(invalid start "
                                         r"byte at byte \d+\)"):
        bpe_ranks.read_ranks(path)
