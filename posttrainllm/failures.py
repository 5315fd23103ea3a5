"""An error taxonomy for the question-answering task: every wrong answer gets one category
(the evals and failure-analysis chapter, ``book/evals-and-failures.md``).

A score says how often a model is wrong; a taxonomy says how, which is what tells you what to fix
(Ribeiro et al., *Beyond Accuracy: Behavioral Testing of NLP Models with CheckList*, 2020, make
the same argument with tests per capability). The categories are checked in order, so each
answer lands in the first that fits:

1. ``no answer``: the reply ran out of room without the end token, or is empty;
2. ``right answer, extra words``: the right answer and something more;
3. ``misspelt``: one or two characters from the right answer;
4. ``wrong kind of answer``: a valid answer to another kind of question (a place for "what");
5. ``wrong detail of the right kind``: a valid answer of the right kind that is not the story's;
6. ``not an answer``: anything else.
"""

from __future__ import annotations

from collections import Counter

from posttrainllm import data

CATEGORIES = ("no answer", "right answer, extra words", "misspelt", "wrong kind of answer",
              "wrong detail of the right kind", "not an answer")
ANSWERS = {"what": set(data.OBJECTS), "where": {p[0] for p in data.PLACES}, "who": set(data.NAMES)}


def question_kind(prompt: str) -> str:
    """``what``, ``where`` or ``who``, from the question that ends the prompt."""
    word = prompt.rsplit(". ", 1)[-1].split()[0].lower()
    if word not in ANSWERS:
        raise ValueError(f"not one of the task's questions (what / where / who): {prompt!r}")
    return word


def _edit_distance(a: str, b: str) -> int:
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        current = [i]
        for j, cb in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ca != cb)))
        previous = current
    return previous[-1]


def categorise(prompt: str, answer: str | None, right: str) -> str | None:
    """The category of a wrong ``answer`` (``None`` when there is no end token); ``None`` if it is right."""
    if answer is not None and answer.strip() == right:
        return None
    if not answer or not answer.strip():
        return "no answer"
    answer = answer.strip()
    if right in answer:
        return "right answer, extra words"
    if _edit_distance(answer, right) <= 2:
        return "misspelt"
    kind = question_kind(prompt)
    if any(answer in valid for other, valid in ANSWERS.items() if other != kind):
        return "wrong kind of answer"
    if answer in ANSWERS[kind]:
        return "wrong detail of the right kind"
    return "not an answer"


def taxonomy(prompts: list[str], answers: list[str | None], rights: list[str]) -> Counter:
    """How many answers fall in each category (right answers are not counted)."""
    found = (categorise(p, a, r) for p, a, r in zip(prompts, answers, rights, strict=True))
    return Counter(c for c in found if c is not None)
