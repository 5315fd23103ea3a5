"""Every file the package reads, damaged at random: the reader gets back what was written, or a
``ValueError`` that names the file's problem (the study queue's, the answers', the record's and the
trainer's errors are ValueErrors too) — never another exception, never a hang.

One property over all of them: a valid file of each kind, then a random edit such as a reader's
editor, a crash or a bad copy makes (cut short, bytes flipped, a line dropped, doubled or swapped,
bytes inserted), or bytes of any kind in place of the file. Files with a checksum (checkpoints,
adapters, tokenizers) must, when they load, load as written.
"""

import dataclasses
import functools
import json
import tempfile
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from posttrainllm import bpe_ranks, lora, pretrain
from posttrainllm import train as training
from posttrainllm.model import GPT, GPTConfig
from posttrainllm.tokenizer import Tokenizer
from posttrainllm.tools import answers, record, study

SMALL = GPTConfig(vocab_size=40, block_size=8, n_layer=1, n_head=2, n_embd=8)


@functools.cache
def model() -> GPT:
    return GPT(SMALL)


@functools.cache
def tokenizer() -> Tokenizer:
    return Tokenizer.train("the cat sat on the mat; the cat ate " * 8, 270, special_tokens=("<|end|>",))


def write_tokenizer(folder: Path) -> Path:
    tokenizer().save(folder / "tok.bpe")
    return folder / "tok.bpe"


def read_tokenizer(path: Path):
    again = Tokenizer.load(path)
    return again.merges, again.special_tokens, again.pattern, again.vocab


def write_checkpoint(folder: Path) -> Path:
    training.save_checkpoint(model(), folder / "model.pt", step=3)
    return folder / "model.pt"


def read_checkpoint(path: Path):
    again = training.load_checkpoint(path)
    return dataclasses.asdict(again.config), {k: v.tolist() for k, v in again.state_dict().items()}


def adapted() -> torch.nn.Module:
    torch.manual_seed(0)
    return lora.inject(GPT(SMALL).eval(), ("mlp.up",), rank=2, name="a")


def write_adapter(folder: Path) -> Path:
    lora.save_adapter(adapted(), folder / "adapter.pt", "a")
    return folder / "adapter.pt"


def read_adapter(path: Path):
    into = adapted()
    lora.load_adapter(into, path)
    return {k: v.tolist() for k, v in into.state_dict().items()}


RANKS = {bytes([b]): b for b in range(256)} | {b"th": 256, b"the": 257, b" c": 258}


def write_tiktoken(folder: Path) -> Path:
    (folder / "ranks.tiktoken").write_text(bpe_ranks.tiktoken_file_text(RANKS))
    return folder / "ranks.tiktoken"


def write_js_ranks(folder: Path) -> Path:
    packed = "\n".join(f"! {rank} {bpe_ranks.base64.b64encode(token).decode()}" for token, rank in RANKS.items())
    module = {"pat_str": r"\w+|\s+|.", "special_tokens": {"<|end|>": 259}, "bpe_ranks": packed}
    (folder / "ranks.js").write_text(f"export default {json.dumps(module)};\n")
    return folder / "ranks.js"


def write_state(folder: Path) -> Path:
    """A trainer's checkpoint folder (DCP shards and state.pt), written by one process."""
    net = GPT(SMALL)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    config = pretrain.PretrainConfig(model=SMALL, steps=1)
    pretrain.save(folder / "step-000001", net, optimizer, 1, 8, config, pretrain.Launch(0, 1, "cpu", False))
    return folder / "step-000001" / "state.pt"


def write_config(folder: Path) -> Path:
    (folder / "run.toml").write_text('steps = 20\nlr = 1e-3\nparallel = "fsdp"\n\n[model]\nn_layer = 2\nn_head = 2\n'
                                     "n_embd = 32\n")
    return folder / "run.toml"


def write_queue(folder: Path) -> Path:
    (folder / "queue.md").write_text("# Queue\n\n## Attention\n- What: softmax over keys\n  and values\n"
                                     "- Why here: TBD\n\n## LoRA\n- What: low-rank update\n- Why here: cheap\n")
    return folder / "queue.md"


def write_answers(folder: Path) -> Path:
    (folder / "answers.json").write_text(json.dumps({"version": 1, "answers": {"LoRA": "cheap", "Attention": "x"}}))
    return folder / "answers.json"


def write_record(folder: Path) -> Path:
    (folder / "progress.json").write_text(json.dumps({"version": 1, "passed": ["check_mse_grad", "check_adamw"]}))
    return folder / "progress.json"


# kind: (write a valid file, read it back, whether a read that succeeds must give what was written)
PARSERS = {
    "tokenizer": (write_tokenizer, read_tokenizer, True),
    "checkpoint": (write_checkpoint, read_checkpoint, True),
    "adapter": (write_adapter, read_adapter, True),
    "trainer state": (write_state, lambda path: pretrain.read_state(path.parent)["step"], True),
    "tiktoken ranks": (write_tiktoken, lambda path: bpe_ranks.read_ranks(path), False),
    "js-tiktoken ranks": (write_js_ranks, lambda path: bpe_ranks.read_ranks(path), False),
    "trainer TOML": (write_config, lambda path: pretrain.load_config(str(path)), False),
    "study queue": (write_queue, lambda path: study.load(path), False),
    "study answers": (write_answers, answers.load, False),
    "record of passed gates": (write_record, record.load, False),
}


def damage(data: bytes, how: str, at: float, payload: bytes) -> bytes:
    """One edit of ``data`` at the fraction ``at`` of its length (or of its lines)."""
    i, n = int(at * len(data)), len(payload) or 1
    lines = data.splitlines(keepends=True) or [b""]
    k = min(int(at * len(lines)), len(lines) - 1)
    return {
        "cut": lambda: data[:i],
        "flip": lambda: data[:i] + bytes(b ^ 0xFF for b in data[i : i + n]) + data[i + n :],
        "insert": lambda: data[:i] + payload + data[i:],
        "drop line": lambda: b"".join(lines[:k] + lines[k + 1 :]),
        "double line": lambda: b"".join(lines[: k + 1] + lines[k:]),
        "swap lines": lambda: b"".join(lines[:k] + lines[k + 1 : k + 2] + lines[k : k + 1] + lines[k + 2 :]),
        "replace": lambda: payload,
    }[how]()


@pytest.mark.parametrize("kind", sorted(PARSERS))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(how=st.sampled_from(["cut", "flip", "insert", "drop line", "double line", "swap lines", "replace"]),
       at=st.floats(0, 1), payload=st.binary(max_size=40))
def test_a_damaged_file_is_read_as_written_or_refused_with_a_value_error(kind, how, at, payload, tmp_path):
    check_read(kind, Path(tempfile.mkdtemp(dir=tmp_path)), lambda data: damage(data, how, at, payload))


@pytest.mark.parametrize("kind", sorted(PARSERS))
@pytest.mark.parametrize("content", [b"", b"[]", b"null", b"5", b'"text"', b"{}", b"\xff\xfe", b"\n\n"])
def test_a_file_of_another_kind_is_refused_with_a_value_error(kind, content, tmp_path):
    check_read(kind, tmp_path, lambda _: content)


def check_read(kind: str, folder: Path, change) -> None:
    """Write a valid file of ``kind`` into ``folder``, change its bytes, read it: as written, or ValueError."""
    write, read, exact = PARSERS[kind]
    path = write(folder)
    written = read(path)
    path.write_bytes(change(path.read_bytes()))
    try:
        again = read(path)
    except ValueError:
        return
    if exact:
        assert again == written
