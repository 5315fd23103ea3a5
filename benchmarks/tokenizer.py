"""BPE training and encoding: our trainer vs Hugging Face ``tokenizers`` vs the naive algorithm.

Side by side in one run, on a slice of the package corpus:

- end-to-end training (pre-tokenisation + counting + merges) to vocab 1024 and 4096;
- the merge phase alone (ours: ``train_merges`` on pre-counted words; ``tokenizers``: its time
  to the target vocab minus its time to vocab 257, i.e. with almost no merges);
- ``tokenizers`` with 1 and with 2 threads (``RAYON_NUM_THREADS``, set per subprocess);
- encoding throughput from a cold and a warm cache, and ids compared with ``tiktoken``;
- peak memory while training on a large streamed input (``--stream-mb``, default 100).

    python benchmarks/tokenizer.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, write_result  # noqa: E402

from posttrainllm import data  # noqa: E402
from posttrainllm.measure import best_of  # noqa: E402
from posttrainllm.tokenizer import Tokenizer, count_words, train_merges, train_naive  # noqa: E402

HF_SCRIPT = """
import json, sys, time
from tokenizers import Tokenizer, models, pre_tokenizers, trainers
text, vocab = open(sys.argv[1], encoding="utf-8").read(), int(sys.argv[2])
lines = text.splitlines()
start = time.perf_counter()
tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
trainer = trainers.BpeTrainer(vocab_size=vocab, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                              show_progress=False)
tok.train_from_iterator(lines, trainer)
print(json.dumps({"seconds": time.perf_counter() - start, "vocab": tok.get_vocab_size()}))
"""

STREAM_SCRIPT = """
import json, resource, sys, time
from posttrainllm import data
from posttrainllm.tokenizer import count_words, train_merges
target = int(sys.argv[1]) * 2**20

def pieces():
    size, batch = 0, []
    for story in data.stories(seed=5):
        batch.append(story)
        size += len(story) + 1
        if len(batch) == 1000:
            yield "\\n".join(batch) + "\\n"
            batch = []
        if size >= target:
            break
    if batch:
        yield "\\n".join(batch) + "\\n"

start = time.perf_counter()
merges = train_merges(count_words(pieces()), 1024)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"seconds": time.perf_counter() - start, "peak_mib": peak, "merges": len(merges)}))
"""


def train_recount_all(text: str, vocab_size: int) -> list[tuple[int, int]]:
    """The fully naive trainer (as in minbpe's ``RegexTokenizer``): keep every pre-token
    *occurrence* and recount all of their pairs after each merge. Same tie-breaking as ours."""
    from collections import Counter

    from posttrainllm.tokenizer import GPT4_SPLIT, merge_pair, regex, to_bytes

    chunks = [list(to_bytes(c)) for c in regex.findall(GPT4_SPLIT, text)]
    merges = []
    for step in range(vocab_size - 256):
        counts = Counter()
        for ids in chunks:
            counts.update(zip(ids, ids[1:]))  # noqa: B905
        if not counts:
            break
        best = min(counts, key=lambda p: (-counts[p], p))
        merges.append(best)
        chunks = [merge_pair(ids, best, 256 + step) for ids in chunks]
    return merges


def hf_seconds(path: Path, vocab: int, threads: int, repeats: int) -> float:
    env = {**os.environ, "RAYON_NUM_THREADS": str(threads), "TOKENIZERS_PARALLELISM": "true"}
    times = []
    for _ in range(repeats):
        out = subprocess.run([sys.executable, "-c", HF_SCRIPT, str(path), str(vocab)], env=env,
                             capture_output=True, text=True, check=True)
        times.append(json.loads(out.stdout)["seconds"])
    return min(times)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small input, one repeat (a smoke test)")
    parser.add_argument("--stream-mb", type=int, default=None, help="size of the streamed training input")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--skip-recount-all", action="store_true", help="skip the minutes-long fully naive run")
    args = parser.parse_args(argv)
    n_chars, vocabs, repeats = (200_000, [300], 1) if args.quick else (2 * 2**20, [1024, 4096], 3)
    stream_mb = args.stream_mb or (2 if args.quick else 100)
    text = data.corpus(n_chars, seed=0)
    args.out.mkdir(parents=True, exist_ok=True)
    slice_path = args.out / "tokenizer-input.txt"
    slice_path.write_text(text, encoding="utf-8")
    mb = len(text.encode()) / 2**20

    rows = []
    word_counts = count_words(text)
    for vocab in vocabs:
        ours_total, tok = best_of(lambda v=vocab: Tokenizer.train(text, v), repeats)
        ours_two, _ = best_of(lambda v=vocab: Tokenizer.train(text, v, processes=2), repeats)
        ours_merge, merges = best_of(lambda v=vocab: train_merges(word_counts, v), repeats)
        hf1 = hf_seconds(slice_path, vocab, 1, repeats)
        hf2 = hf_seconds(slice_path, vocab, 2, repeats)
        hf_base = hf_seconds(slice_path, 257, 1, repeats)
        hf_merge = max(hf1 - hf_base, 1e-6)
        naive_merge = None
        if vocab <= 1024:  # the naive trainer takes minutes beyond this
            naive_total, naive = best_of(lambda v=vocab: train_naive(text, v), 1)
            naive_merge = naive_total - (ours_total - ours_merge)
            assert naive == tok.merges, "the fast and naive trainers disagree"
        rows.append([vocab, "ours, 1 process", f"{ours_total:.3f}", f"{ours_merge:.3f}", ""])
        rows.append([vocab, "ours, 2 processes", f"{ours_two:.3f}", "", ""])
        rows.append([vocab, "HF tokenizers, 1 thread", f"{hf1:.3f}", f"{hf_merge:.3f}",
                     f"{ours_total / hf1:.2f}x (1 vs 1); merges {ours_merge / hf_merge:.1f}x"])
        rows.append([vocab, "HF tokenizers, 2 threads", f"{hf2:.3f}", "", f"{ours_two / hf2:.2f}x (2 vs 2)"])
        if naive_merge is not None:
            ratios = f"{ours_total / naive_total:.3f}x; merges {ours_merge / naive_merge:.3f}x"
            rows.append([vocab, "naive over distinct words (our reference)", f"{naive_total:.3f}",
                         f"{naive_merge:.3f}", ratios])
            if not args.skip_recount_all:
                recount_total, recount = best_of(lambda v=vocab: train_recount_all(text, v), 1)
                assert recount == tok.merges, "the fully naive trainer disagrees"
                rows.append([vocab, "naive over every occurrence (minbpe-style)", f"{recount_total:.1f}", "",
                             f"{ours_total / recount_total:.5f}x"])
    write_result(
        "tokenizer_training",
        f"BPE training on {mb:.1f} MiB of the corpus (seconds, best of {repeats})",
        ["vocab", "trainer", "end to end", "merge phase", "ours / theirs (time ratio)"],
        rows,
        "Ours and the naive trainer produce identical merges (checked in this run). HF's merge phase is its "
        "time to the target vocab minus its time to vocab 257. In the last column, below 1.0x means ours is faster.",
        args.out,
    )

    tok = Tokenizer.train(text, vocabs[-1])
    held_out = data.corpus(n_chars, seed=1)
    held_mb = len(held_out.encode()) / 2**20
    cold_tok = Tokenizer(tok.merges, tok.pattern)
    cold, ids = best_of(lambda: cold_tok.encode_ordinary(held_out), 1)
    warm, _ = best_of(lambda: cold_tok.encode_ordinary(held_out), repeats)
    import tiktoken

    enc = tiktoken.Encoding("bench", pat_str=tok.pattern, mergeable_ranks=tok.tiktoken_ranks(), special_tokens={})
    tik, tik_ids = best_of(lambda: enc.encode_ordinary(held_out), repeats)
    same = ids == tik_ids
    stream = json.loads(subprocess.run([sys.executable, "-c", STREAM_SCRIPT, str(stream_mb)], capture_output=True,
                                       text=True, check=True).stdout)
    write_result(
        "tokenizer_encoding",
        f"Encoding {held_mb:.1f} MiB of held-out corpus text (vocab {vocabs[-1]}), and streamed training",
        ["measurement", "value"],
        [
            ["ours, cold cache", f"{held_mb / cold:.1f} MB/s"],
            ["ours, warm cache", f"{held_mb / warm:.1f} MB/s"],
            ["tiktoken (same ranks)", f"{held_mb / tik:.1f} MB/s"],
            ["ids identical to tiktoken", str(same)],
            [f"train on {stream_mb} MiB streamed: time", f"{stream['seconds']:.1f} s"],
            [f"train on {stream_mb} MiB streamed: peak memory (RSS)", f"{stream['peak_mib']:.0f} MiB"],
        ],
        "Cold: a fresh tokenizer whose pre-token cache is empty; warm: the same text again. "
        "Streaming counts pre-tokens chunk by chunk, so memory follows the number of distinct pre-tokens.",
        args.out,
    )
    slice_path.unlink()
    if not same:
        raise SystemExit("ids differ from tiktoken")


if __name__ == "__main__":
    main()
