"""Heuristic quality filters for text, after the Gopher rules (Rae et al., *Scaling Language
Models: Methods, Analysis & Insights from Training Gopher*, 2021, appendix A): cheap checks on
word lengths, symbols and repetition that remove boilerplate and machine noise without a model
(the post-training data chapter, ``book/post-training-data.md``). The thresholds are Gopher's
where they fit short texts, and say so where they differ. The "symbols" rule is the book's own:
Gopher's counts the ratio of ``#`` and ellipsis symbols to words (above 0.1 fails). Gopher's
stop-word rule (at least two of "the", "be", "to", "of", "and", "that", "have", "with") is left
out, since a one-word answer is a good answer here.
"""

from __future__ import annotations

import re

RULES = {
    "empty": "no words at all (Gopher asks for 50; an answer here can be one word)",
    "word length": "mean word length outside 2 to 10 characters (Gopher: 3 to 10)",
    "symbols": "more than 10% of the characters are neither letters, digits, spaces nor . , ' ? ! - (the book's "
               "rule; Gopher's counts # and ellipses per word)",
    "non-alphabetic words": "fewer than 80% of the words contain a letter (Gopher's rule)",
    "repetition": "a word three times in a row (Gopher measures repeated n-grams over whole documents)",
}


def problems(text: str) -> list[str]:
    """The names of the :data:`RULES` that ``text`` breaks (empty: it passes)."""
    if not isinstance(text, str):
        raise TypeError(f"a document is text (str), not {type(text).__name__}")
    words = text.split()
    found = []
    if not words:
        found.append("empty")
    if words and not 2 <= sum(map(len, words)) / len(words) <= 10:
        found.append("word length")
    if text and len(re.findall(r"[^A-Za-z0-9\s.,'?!-]", text)) > 0.1 * len(text):
        found.append("symbols")
    if words and sum(bool(re.search(r"[A-Za-z]", w)) for w in words) < 0.8 * len(words):
        found.append("non-alphabetic words")
    lowered = [w.lower() for w in words]
    if any(lowered[i] == lowered[i + 1] == lowered[i + 2] for i in range(len(lowered) - 2)):
        found.append("repetition")
    return found


def passes(text: str) -> bool:
    return not problems(text)
