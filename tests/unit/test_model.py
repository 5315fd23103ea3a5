import dataclasses

import numpy as np
import pytest
import torch

from posttrainllm import train as training
from posttrainllm.data import get_batch
from posttrainllm.model import GPT, GPTConfig, KVCache, RMSNorm, export_weights, group_kv_heads, kv_cache_bytes, rope
from posttrainllm.optim import AdamW

SMALL = GPTConfig(vocab_size=50, block_size=24, n_layer=2, n_head=2, n_embd=16)
VARIANTS = [
    SMALL,
    dataclasses.replace(SMALL, norm="rmsnorm", mlp="swiglu", positions="rope", tie_weights=False),
]


@pytest.mark.parametrize("config", VARIANTS, ids=["gpt2-like", "llama-like"])
def test_flash_and_naive_attention_give_the_same_logits_and_gradients(config):
    naive = GPT(config)
    flash = GPT(dataclasses.replace(config, attention="flash"))
    flash.load_state_dict(naive.state_dict())
    idx = torch.randint(0, config.vocab_size, (3, 21), generator=torch.Generator().manual_seed(0))
    (logits_a, loss_a), (logits_b, loss_b) = naive(idx, idx), flash(idx, idx)
    torch.testing.assert_close(logits_a, logits_b, atol=2e-5, rtol=1e-4)
    loss_a.backward()
    loss_b.backward()
    for (name, p), q in zip(naive.named_parameters(), flash.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, atol=2e-5, rtol=1e-3, msg=name)


def test_rope_scores_depend_only_on_relative_position():
    q, k = torch.randn(1, 1, 1, 8, dtype=torch.float64), torch.randn(1, 1, 1, 8, dtype=torch.float64)
    rq, rk = rope(q.expand(1, 1, 12, 8)), rope(k.expand(1, 1, 12, 8))
    scores = (rq @ rk.transpose(-1, -2))[0, 0]
    assert torch.allclose(scores[5, 2], scores[9, 6]) and torch.allclose(scores[3, 3], scores[11, 11])
    assert not torch.allclose(scores[5, 2], scores[5, 3])


CACHED = [
    SMALL,
    dataclasses.replace(SMALL, positions="rope", n_kv_head=1),
    dataclasses.replace(SMALL, n_head=4, n_kv_head=2, window=5),
]


@pytest.mark.parametrize("config", CACHED, ids=["mha-learned", "mqa-rope", "gqa-window"])
def test_decoding_with_a_kv_cache_gives_the_full_forward_logits(config):
    model = GPT(config).eval()
    idx = torch.randint(0, config.vocab_size, (2, 17), generator=torch.Generator().manual_seed(1))
    cache = KVCache(config.n_layer)
    with torch.no_grad():
        full = model(idx)
        pieces = [model(idx[:, :9], cache=cache)] + [model(idx[:, i : i + 1], cache=cache) for i in range(9, 17)]
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, atol=1e-5, rtol=1e-4)
    assert cache.length == 17


def test_kv_cache_memory_scales_with_kv_heads_and_is_capped_by_the_window():
    def cache_bytes(**changes) -> int:
        config = dataclasses.replace(SMALL, n_head=4, **changes)
        cache = KVCache(config.n_layer)
        with torch.no_grad():
            GPT(config)(torch.zeros(1, 20, dtype=torch.long), cache=cache)
        return cache.nbytes()

    mha = cache_bytes()
    assert mha == 2 * SMALL.n_layer * 20 * SMALL.n_embd * 4  # K and V, every layer, every position, fp32
    assert cache_bytes(n_kv_head=2) * 2 == mha and cache_bytes(n_kv_head=1) * 4 == mha
    assert cache_bytes(window=5) * 4 == mha


def test_grouped_query_attention_with_shared_heads_equals_multi_head_with_repeated_weights():
    gqa = GPT(dataclasses.replace(SMALL, n_head=4, n_kv_head=2))
    mha = GPT(dataclasses.replace(SMALL, n_head=4))
    state = gqa.state_dict()
    for i in range(SMALL.n_layer):  # copy each shared K/V head into both query heads of its group
        for name in ("weight", "bias"):
            q, k, v = state[f"blocks.{i}.attn.qkv.{name}"].split([16, 8, 8])
            k, v = (z.view(2, 4, *z.shape[1:]).repeat_interleave(2, 0).reshape(16, *z.shape[1:]) for z in (k, v))
            state[f"blocks.{i}.attn.qkv.{name}"] = torch.cat([q, k, v])
    mha.load_state_dict(state)
    idx = torch.randint(0, 50, (2, 12), generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(gqa(idx), mha(idx))
    assert gqa.n_params() < mha.n_params()


def test_sliding_window_hides_keys_older_than_the_window():
    model = GPT(dataclasses.replace(SMALL, n_layer=1, window=4)).eval()
    a = torch.randint(0, 50, (1, 12), generator=torch.Generator().manual_seed(3))
    b = a.clone()
    b[0, 0] = (a[0, 0] + 1) % 50  # change the first token only
    with torch.no_grad():
        la, lb = model(a), model(b)
    assert not torch.allclose(la[0, 3], lb[0, 3])  # position 3 still sees position 0
    torch.testing.assert_close(la[0, 4:], lb[0, 4:])  # one layer, window 4: positions >= 4 cannot


@pytest.mark.parametrize(
    ("changes", "message"),
    [({"n_kv_head": 3}, "group evenly"), ({"window": 0}, "size >= 1"), ({"window": 4, "attention": "flash"}, "naive")],
)
def test_bad_attention_configs_are_refused_with_the_reason(changes, message):
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(SMALL, n_head=4, **changes)


def test_rmsnorm_matches_torch():
    x = torch.randn(4, 16)
    ours = RMSNorm(16)
    theirs = torch.nn.RMSNorm(16, eps=1e-5)
    torch.testing.assert_close(ours(x), theirs(x))


def test_initialisation_is_deterministic_from_the_seed_and_documented_scale():
    a, b, c = GPT(SMALL), GPT(SMALL), GPT(dataclasses.replace(SMALL, seed=1))
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))
    assert not torch.equal(a.tok_emb.weight, c.tok_emb.weight)
    assert a.head.weight is a.tok_emb.weight  # tied
    assert a.tok_emb.weight.std().item() == pytest.approx(0.02, rel=0.1)
    assert a.blocks[0].attn.proj.weight.std().item() == pytest.approx(0.02 / 2, rel=0.15)


def test_weight_export_is_plain_data_without_the_tied_copy():
    exported = export_weights(GPT(SMALL))
    assert exported["format"] == "posttrainllm-gpt-weights v1" and exported["config"]["n_embd"] == 16
    assert "head.weight" not in exported["tensors"]
    emb = exported["tensors"]["tok_emb.weight"]
    assert emb["shape"] == [50, 16] and len(emb["data"]) == 800 and isinstance(emb["data"][0], float)


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: GPTConfig(norm="batchnorm"), "norm must be one of"),
        (lambda: GPTConfig(n_embd=30, n_head=4), "does not split"),
        (lambda: GPT(SMALL)(torch.zeros(1, 25, dtype=torch.long)), "longer than block_size"),
    ],
)
def test_bad_configs_and_inputs_are_explained(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_training_is_reproducible_and_lowers_the_loss():
    ids = np.tile(np.arange(10), 60)
    runs = []
    for _ in range(2):
        model = GPT(dataclasses.replace(SMALL, vocab_size=10, block_size=12))
        runs.append(training.train(model, ids, steps=40, batch_size=8, lr=1e-2, seed=3)["train"])
    assert runs[0] == runs[1]
    assert np.mean(runs[0][-5:]) < 0.3 * runs[0][0]
    out = training.generate(model, [0, 1, 2], 8, np.random.default_rng(0), temperature=0.0)
    assert out == [*range(10), 0]  # it learned to count mod 10


def test_checkpoint_round_trip_and_clear_errors_for_bad_files(tmp_path):
    model = GPT(SMALL)
    path = tmp_path / "model.pt"
    training.save_checkpoint(model, path)
    again = training.load_checkpoint(path)
    assert again.config == model.config
    assert all(torch.equal(p, q) for p, q in zip(model.state_dict().values(), again.state_dict().values(), strict=True))
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(ValueError, match="truncated or corrupt"):
        training.load_checkpoint(truncated)
    foreign = tmp_path / "foreign.pt"
    torch.save({"weights": torch.zeros(3)}, foreign)
    with pytest.raises(ValueError, match="not a posttrainllm GPT checkpoint"):
        training.load_checkpoint(foreign)
    text = tmp_path / "notes.txt"
    text.write_text("hello")
    with pytest.raises(ValueError, match="not a readable checkpoint"):
        training.load_checkpoint(text)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["foreign.pt", "model.pt", "notes.txt", "truncated.pt"]


def test_kv_cache_formula_matches_a_measured_cache():
    config = dataclasses.replace(SMALL, n_head=4, n_kv_head=2)
    cache = KVCache(config.n_layer)
    with torch.no_grad():
        GPT(config)(torch.zeros(3, 11, dtype=torch.long), cache=cache)
    assert cache.nbytes() == 3 * kv_cache_bytes(config.n_layer, 2, config.head_dim, 11, bytes_per_value=4)


def test_grouping_kv_heads_averages_each_group_and_is_exact_when_heads_already_agree():
    base = GPT(dataclasses.replace(SMALL, n_head=4))
    one_group = group_kv_heads(base, 4)  # groups of one head: nothing to average
    idx = torch.randint(0, 50, (2, 10), generator=torch.Generator().manual_seed(4))
    torch.testing.assert_close(one_group(idx), base(idx))
    mqa = group_kv_heads(base, 1)
    k_rows = base.blocks[0].attn.qkv.weight[16:32].view(4, 4, 16)
    torch.testing.assert_close(mqa.blocks[0].attn.qkv.weight[16:20], k_rows.mean(0))
    with pytest.raises(ValueError, match="multi-head"):
        group_kv_heads(mqa, 1)


def test_sdpa_attention_matches_the_reference():
    naive = GPT(SMALL).double()  # in float64 the two differ only by rounding, far below 1e-10
    fused = GPT(dataclasses.replace(SMALL, attention="sdpa")).double()
    fused.load_state_dict(naive.state_dict())
    idx = torch.randint(0, SMALL.vocab_size, (3, SMALL.block_size), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(fused(idx), naive(idx), atol=1e-10, rtol=0)
    with pytest.raises(ValueError, match="window"):
        dataclasses.replace(SMALL, attention="sdpa", window=4)


def test_a_checkpoint_with_its_optimizer_resumes_the_same_steps(tmp_path):
    ids = np.tile(np.arange(10), 60)
    generator = torch.Generator().manual_seed(0)
    batches = [get_batch(ids, 8, SMALL.block_size, generator=generator) for _ in range(10)]

    def steps(model, optimizer, chunk):
        losses = []
        for x, y in chunk:
            _, loss = model(x, y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        return losses

    model = GPT(dataclasses.replace(SMALL, vocab_size=10))
    optimizer = AdamW(model.parameters(), lr=1e-2)
    steps(model, optimizer, batches[:5])
    training.save_checkpoint(model, tmp_path / "at5.pt", optimizer=optimizer, step=5)
    whole = steps(model, optimizer, batches[5:])
    again = GPT(dataclasses.replace(SMALL, vocab_size=10, seed=9))  # other weights: all must be loaded
    restarted = AdamW(again.parameters(), lr=1e-2)
    assert training.resume(tmp_path / "at5.pt", again, restarted) == 5
    assert steps(again, restarted, batches[5:]) == whole
    assert training.load_checkpoint(tmp_path / "at5.pt").config == model.config  # still a plain checkpoint
    training.save_checkpoint(model, tmp_path / "weights.pt")
    with pytest.raises(ValueError, match="weights only"):
        training.resume(tmp_path / "weights.pt", again, restarted)
    with pytest.raises(ValueError, match="another config"):
        training.resume(tmp_path / "at5.pt", GPT(SMALL), AdamW(GPT(SMALL).parameters()))


def test_device_is_chosen_by_argument_then_environment_then_the_model(monkeypatch):
    from posttrainllm.device import place

    model = GPT(SMALL)
    assert place(model, None) == "cpu"
    monkeypatch.setenv("POSTTRAINLLM_DEVICE", "cpu")
    assert place(model, None) == "cpu"
    ids = np.tile(np.arange(10), 60)
    assert np.isfinite(training.evaluate(model, ids, batch_size=2, batches=1, device="cpu"))
    assert len(training.greedy(model, [1, 2], 3, device="cpu")) == 3
    monkeypatch.setenv("POSTTRAINLLM_DEVICE", "tpu")
    with pytest.raises(ValueError, match="unknown device 'tpu'"):
        training.generate(model, [1], 2, np.random.default_rng(0))
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="not available on this machine"):
            training.train(model, ids, steps=1, device="cuda")
