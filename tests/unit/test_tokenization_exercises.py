"""Module 6's exercises as a reader meets them: the skeletons in the notebook are told they are
not written yet, a reader's own trainer and encoder pass, each slip the trainer's gate names is
named, a wrong trainer it has no name for still fails, and the notebook trains and encodes with
the reader's code once it passes."""

from collections import Counter
from itertools import pairwise

import nbformat
import pytest

from posttrainllm import tokenizer as bpe
from posttrainllm.solutions import tokenization as solutions
from posttrainllm.tools import mastery, record
from tests.conftest import ROOT
from tests.exercises import exercise_cells, run_cells, run_with_answers

NOTEBOOK = ROOT / "notebooks" / "06-tokenization.ipynb"
CALLS = {"train_bpe": "check_train_bpe(train_bpe)", "encode": "check_encode(encode_chunk)",
         "compression": "check_compression(bytes_per_token"}

# A reader's answers, written apart from the book's: the cells they type.
READER = {
    "train_bpe": '''
from collections import Counter


def train_bpe(word_counts, vocab_size):
    words = [[list(word), n] for word, n in word_counts.items()]
    merges, vocab = [], {i: bytes([i]) for i in range(256)}
    while 256 + len(merges) < vocab_size:
        counts = Counter()
        for ids, n in words:
            for pair in pairwise(ids):
                counts[pair] += n
        if not counts:
            break
        top = max(counts.values())
        pair = min(p for p, c in counts.items() if c == top)
        new = 256 + len(merges)
        merges.append(pair)
        vocab[new] = vocab[pair[0]] + vocab[pair[1]]
        for entry in words:
            ids, out, i = entry[0], [], 0
            while i < len(ids):
                if tuple(ids[i:i + 2]) == pair:
                    out.append(new)
                    i += 2
                else:
                    out.append(ids[i])
                    i += 1
            entry[0] = out
    return merges, vocab


mastery.check_train_bpe(train_bpe)
''',
    "encode": '''
def encode_chunk(ids, merges):
    ids = list(ids)
    while len(ids) > 1:
        rank, at = min((merges.get((a, b), float("inf")), i) for i, (a, b) in enumerate(pairwise(ids)))
        if rank == float("inf"):
            break
        pair = (ids[at], ids[at + 1])
        out, i = [], 0
        while i < len(ids):
            if i + 1 < len(ids) and (ids[i], ids[i + 1]) == pair:
                out.append(merges[pair])
                i += 2
            else:
                out.append(ids[i])
                i += 1
        ids = out
    return ids


mastery.check_encode(encode_chunk)
''',
    "compression": '''
trained = bpe.Tokenizer(train_bpe(bpe.count_words(text), 800)[0])
bytes_per_token = len(held_out.encode()) / len(trained.encode_ordinary(held_out))

mastery.check_compression(bytes_per_token, text, held_out, vocab_size=800)
''',
}


def _run(sources: list[str]) -> dict:
    return run_cells(sources, Counter=Counter, pairwise=pairwise, bpe=bpe)


def test_each_exercise_in_the_notebook_is_a_skeleton_its_gate_calls_not_written_yet():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    cells = exercise_cells(nb, CALLS)
    assert set(cells) == set(CALLS)
    namespace = _run([nb.cells[cells["train_bpe"]].source, nb.cells[cells["encode"]].source])
    for gate, function in (("train_bpe", "train_bpe"), ("encode", "encode_chunk")):
        result = getattr(mastery, f"check_{gate}")(namespace[function])
        assert not result and result.first == mastery.FIRST[gate]
        stored = "".join(o.get("data", {}).get("text/plain", "") for o in nb.cells[cells[gate]].outputs)
        assert stored == repr(result)


def test_a_readers_own_trainer_and_encoder_pass_and_are_recorded():
    namespace = _run([READER["train_bpe"], READER["encode"]])
    assert mastery.check_train_bpe(namespace["train_bpe"]) and mastery.check_encode(namespace["encode_chunk"])
    assert record.load() == {"train_bpe", "encode"}
    assert mastery.progress(6) == "Module 6: 2 of 3 gates passed (train_bpe, encode); not yet: compression"
    assert mastery.check_train_bpe(solutions.train_bpe) and mastery.check_encode(solutions.encode_chunk)


SLIPS = [
    ("counts[pair] += n", "counts[pair] += 1", "add the pre-token's count"),
    ("pair = min(p for p, c in counts.items() if c == top)", "pair = max(p for p, c in counts.items() if c == top)",
     "on a tie, merge the smallest pair"),
    ("ids, out, i = entry[0], [], 0", "ids, out, i = entry[0][::-1], [], 0", None),  # see the test
    ("vocab[new] = vocab[pair[0]] + vocab[pair[1]]", "vocab[new] = vocab[pair[1]] + vocab[pair[0]]",
     "each merge's two tokens' bytes joined"),
    ("        if not counts:\n            break\n", "", "stop when no pair is left"),
]


@pytest.mark.parametrize(("old", "new", "named"), [s for s in SLIPS if s[2]], ids=[s[2] for s in SLIPS if s[2]])
def test_each_slip_in_the_trainer_is_named(old, new, named):
    assert old in READER["train_bpe"]
    result = mastery.check_train_bpe(_run([READER["train_bpe"].replace(old, new)])["train_bpe"])
    assert not result and named in repr(result), repr(result)


def test_merging_from_the_right_is_named():
    right_to_left = READER["train_bpe"].replace(
        "            entry[0] = out", "            entry[0] = out\n").replace(
        "        for entry in words:\n            ids, out, i = entry[0], [], 0",
        "        for entry in words:\n            ids, out, i = entry[0][::-1], [], 0\n            pair = pair[::-1]")
    right_to_left = right_to_left.replace("            entry[0] = out\n", "            entry[0] = out[::-1]\n"
                                          "            pair = pair[::-1]\n")
    result = mastery.check_train_bpe(_run([right_to_left])["train_bpe"])
    assert not result and "merge left to right" in repr(result), repr(result)


def test_a_trainer_one_merge_short_fails_with_no_name():
    short = READER["train_bpe"].replace("256 + len(merges) < vocab_size", "257 + len(merges) < vocab_size")
    result = mastery.check_train_bpe(_run([short])["train_bpe"])
    assert not result and not result.first and " -- " not in repr(result), repr(result)


def test_the_gates_reference_is_the_packages_fast_trainer_and_not_the_readers_loop():
    words = bpe.count_words("abab abab cdcd " * 5)
    merges, vocab = solutions.train_bpe(words, 270)
    assert merges == bpe.train_merges(Counter(words), 270) == bpe.train_naive("abab abab cdcd " * 5, 270)
    assert vocab[256 + len(merges) - 1] == bpe.Tokenizer(merges).decode_bytes([256 + len(merges) - 1])


@pytest.mark.slow
@pytest.mark.serial
def test_the_notebook_trains_and_encodes_with_the_readers_code_once_it_passes():
    everything = run_with_answers(NOTEBOOK, READER, CALLS)
    for name in ("train_bpe", "encode_chunk"):
        assert f"Your {name} passed its gate: the cells below run yours." in everything
    assert "Module 6: 3 of 3 gates passed (train_bpe, encode, compression); all done" in everything
