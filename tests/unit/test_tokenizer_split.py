"""The standard-library split (used where the regex package is missing, as in Pyodide) splits
every text exactly as the regex package does."""

import re
import sys
import unicodedata

import pytest
import regex
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrainllm import data
from posttrainllm import tokenizer as bpe

# every code point a str can hold, surrogates included
EVERY_CHAR = "".join(map(chr, range(0x110000)))


@pytest.mark.parametrize("cls", [r"\p{L}", r"\p{N}", r"\s", r"[^\s\p{L}\p{N}]", r"[^\r\n\p{L}\p{N}]", r"\S"])
def test_each_class_matches_the_same_code_points(cls):
    ours = set(re.findall(bpe.to_stdlib_pattern(cls), EVERY_CHAR))
    theirs = set(regex.findall(cls, EVERY_CHAR))
    differ = ours ^ theirs
    # regex carries a newer Unicode than this Python's unicodedata: only characters this Python
    # does not know yet (category Cn, "unassigned") may be classed differently
    known = [hex(ord(c)) for c in differ if unicodedata.category(c) != "Cn"]
    assert not known, known[:5]
    assert theirs, "the class matched nothing"


# text drawn from the characters the split patterns treat specially, plus any assigned character
TRICKY = list(" \t\n\r\x0b\x0c\x1c\x1d\x85\xa0\u2028\u3000'sStTdDmMlLvVrReE0123456789²½Ⅷ٣.,!?-_~🦊日本é\u0301")
assigned = st.characters(codec="utf-8").filter(lambda c: unicodedata.category(c) != "Cn")
texts = st.lists(st.one_of(st.sampled_from(TRICKY), assigned), max_size=60).map("".join)


@settings(max_examples=400, deadline=None)
@given(texts)
def test_both_engines_split_alike(text):
    for pattern in (bpe.GPT2_SPLIT, bpe.GPT4_SPLIT):
        assert bpe.compile_pattern(pattern, "re").findall(text) == regex.findall(pattern, text)


def test_the_corpus_splits_alike():
    text = data.corpus(200_000)
    for pattern in (bpe.GPT2_SPLIT, bpe.GPT4_SPLIT):
        assert bpe.compile_pattern(pattern, "re").findall(text) == regex.findall(pattern, text)


def test_a_tokenizer_without_the_regex_package_is_the_same_tokenizer(monkeypatch):
    text = data.corpus(60_000)
    with_regex = bpe.Tokenizer.train(text, vocab_size=400)
    monkeypatch.setattr(bpe, "regex", None)
    bpe.compile_pattern.cache_clear()
    try:
        without = bpe.Tokenizer.train(text, vocab_size=400)
        assert isinstance(without._split, re.Pattern)
        assert without.merges == with_regex.merges
        assert without.encode(text[:5000]) == with_regex.encode(text[:5000])
        with pytest.raises(ImportError, match="regex package is not installed"):
            bpe.compile_pattern(bpe.GPT4_SPLIT, "regex")
    finally:
        bpe.compile_pattern.cache_clear()


@pytest.mark.parametrize(
    ("pattern", "named"),
    [(r"\p{Greek}+", r"\p{Greek}"), (r"\P{L}", r"\P{L}"), (r"[^\S]", r"\S inside a character class")],
)
def test_untranslatable_patterns_say_what_is_missing(pattern, named):
    with pytest.raises(ValueError, match=re.escape(named)):
        bpe.to_stdlib_pattern(pattern)


def test_an_unknown_engine_is_refused():
    with pytest.raises(ValueError, match="unknown regex engine 'pcre'"):
        bpe.compile_pattern(bpe.GPT4_SPLIT, "pcre")


def test_the_package_imports_without_the_regex_package(tmp_path):
    import subprocess

    code = "import sys; sys.modules['regex'] = None\nfrom posttrainllm import tokenizer\nprint(tokenizer.regex)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "None"
