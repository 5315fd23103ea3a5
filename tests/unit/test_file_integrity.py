"""Fault injection: every kind of file the package writes with weights or merges in it (checkpoints,
LoRA adapters, the fine-tuned model cache, tokenizer files) is, after damage anywhere in it, either
refused with ``ValueError`` or read back exactly as written — never silently different. The
base-model cache rebuilds instead. (The study queue's own damage tests are in test_study.py.)"""

import dataclasses

import numpy as np
import pytest
import torch

from posttrainllm import lora
from posttrainllm import train as training
from posttrainllm.data import corpus
from posttrainllm.model import GPT, GPTConfig
from posttrainllm.pretrained import Recipe, base_model
from posttrainllm.tokenizer import Tokenizer

SMALL = GPTConfig(vocab_size=50, block_size=24, n_layer=2, n_head=2, n_embd=16)
TARGETS = ("attn.qkv", "mlp.up")


def states_equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def damaged_copies(path, tmp_path, n=40, seed=0):
    """``n`` copies of ``path``, each with 16 bytes flipped at a random place (spread over the whole file)."""
    data = path.read_bytes()
    rng = np.random.default_rng(seed)
    for i, start in enumerate(rng.integers(0, len(data) - 16, n)):
        bad = bytearray(data)
        bad[start : start + 16] = bytes(b ^ 0xFF for b in bad[start : start + 16])
        copy = tmp_path / f"damaged-{i}{path.suffix}"
        copy.write_bytes(bytes(bad))
        yield copy


def test_a_damaged_checkpoint_is_refused_or_read_exactly(tmp_path):
    model = GPT(SMALL)
    path = tmp_path / "model.pt"
    training.save_checkpoint(model, path)
    refused = 0
    for copy in damaged_copies(path, tmp_path):
        try:
            again = training.load_checkpoint(copy)
        except ValueError:
            refused += 1
            continue
        assert again.config == model.config and states_equal(again.state_dict(), model.state_dict())
    assert refused > 30  # most of the file is tensor data, which torch.load alone would accept


def test_flipped_tensor_bytes_fail_the_checksum(tmp_path):
    path = tmp_path / "model.pt"
    training.save_checkpoint(GPT(SMALL), path)
    data = bytearray(path.read_bytes())
    at = data.index(b"data/0") + 200  # inside the first tensor's stored bytes
    data[at : at + 8] = bytes(8)
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="fails its checksum"):
        training.load_checkpoint(path)


def test_a_damaged_adapter_is_refused_or_read_exactly(tmp_path):
    model = lora.inject(GPT(SMALL).eval(), TARGETS, rank=2, name="a")
    path = tmp_path / "adapter.pt"
    lora.save_adapter(model, path)
    for copy in damaged_copies(path, tmp_path):
        fresh = lora.inject(GPT(SMALL).eval(), TARGETS, rank=2, name="unused")
        try:
            lora.load_adapter(fresh, copy)
        except ValueError:
            continue
        adapter = lambda m: {k: v for k, v in m.state_dict().items() if k.endswith((".A.a", ".B.a"))}  # noqa: E731
        assert len(adapter(model)) == 8 and states_equal(adapter(fresh), adapter(model))


def test_well_formed_files_with_the_wrong_contents_name_the_problem(tmp_path):
    model = GPT(SMALL)
    config = dataclasses.asdict(SMALL)
    cases = {
        "unknown config keys": {"config": {**config, "n_experts": 4}, "state_dict": model.state_dict()},
        "no model config or no state dict": {"config": config},
        "do not fit the model": {"config": {**config, "n_embd": 32}, "state_dict": model.state_dict()},
    }
    for message, payload in cases.items():
        training.save_file({"format": training.CHECKPOINT_FORMAT, **payload}, tmp_path / "bad.pt")
        with pytest.raises(ValueError, match=message):
            training.load_checkpoint(tmp_path / "bad.pt")
    old = tmp_path / "old.pt"  # written before checksums: refused, so a cache rebuilds it
    torch.save({"format": training.CHECKPOINT_FORMAT, "config": config, "state_dict": model.state_dict()}, old)
    with pytest.raises(ValueError, match="has no checksum"):
        training.load_checkpoint(old)


def test_an_adapter_whose_a_and_b_ranks_disagree_is_refused(tmp_path):
    model = lora.inject(GPT(SMALL).eval(), ("mlp.up",), rank=2, name="a")
    tensors = {"blocks.0.mlp.up.A": torch.zeros(2, 16), "blocks.0.mlp.up.B": torch.zeros(64, 3)}
    training.save_file({"format": lora.ADAPTER_FORMAT, "name": "a", "scale": 1.0, "tensors": tensors},
                       tmp_path / "bad.pt")
    with pytest.raises(ValueError, match="do not share a rank"):
        lora.load_adapter(model, tmp_path / "bad.pt")


def test_a_bit_flipped_cached_base_model_is_rebuilt(tmp_path):
    tiny = Recipe(corpus_chars=30_000, vocab_size=300, n_layer=1, n_embd=16, n_head=2, steps=15, block_size=16)
    model, _ = base_model(tiny, cache_dir=tmp_path)
    weights = tmp_path / f"base-{tiny.key}.pt"
    data = bytearray(weights.read_bytes())
    at = data.index(b"data/0") + 200
    data[at] ^= 0x40  # one bit in one weight: torch.load reads it without complaint
    weights.write_bytes(bytes(data))
    rebuilt, _ = base_model(tiny, cache_dir=tmp_path)
    assert states_equal(model.state_dict(), rebuilt.state_dict())


def test_a_damaged_tokenizer_file_is_refused_or_read_exactly(tmp_path):
    tok = Tokenizer.train(corpus(5_000), 300, special_tokens=("<|endoftext|>",))
    path = tmp_path / "tok.bpe"
    tok.save(path)
    text = path.read_text()
    digits = [i for i, c in enumerate(text) if c.isdigit()]
    for i in np.random.default_rng(0).choice(digits, 40, replace=False):  # still well-formed: another tokenizer
        edited = tmp_path / "edited.bpe"
        edited.write_text(text[:i] + str((int(text[i]) + 1) % 10) + text[i + 1 :])
        with pytest.raises(ValueError, match="not a valid tokenizer file"):
            Tokenizer.load(edited)
    for copy in damaged_copies(path, tmp_path):
        try:
            again = Tokenizer.load(copy)
        except ValueError:
            continue
        assert (again.merges, again.special_tokens, again.pattern) == (tok.merges, tok.special_tokens, tok.pattern)
