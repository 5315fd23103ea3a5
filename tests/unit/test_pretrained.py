import multiprocessing
from pathlib import Path

import pytest
import torch

from posttrainllm import lora, preference, sft
from posttrainllm.pretrained import Recipe, base_model, held_out_ids
from posttrainllm.train import evaluate
from posttrainllm.tuned import dpo_model, grpo_model, sft_model


def same_weights(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True))


TINY = Recipe(corpus_chars=30_000, vocab_size=300, n_layer=1, n_embd=16, n_head=2, steps=15, block_size=16)


def test_base_model_is_built_once_then_read_from_the_cache(tmp_path):
    first, tok = base_model(TINY, cache_dir=tmp_path)
    files = sorted(p.name for p in tmp_path.iterdir())
    weights = f"base-{TINY.key}.pt"
    # .vocab: for people to read; the hidden lock is what a second process waits on while this one trains
    assert files == [f".{weights}.lock", f"base-{TINY.key}.bpe", f"base-{TINY.key}.bpe.vocab", weights]
    stamp = (tmp_path / weights).stat().st_mtime_ns
    second, tok2 = base_model(TINY, cache_dir=tmp_path)
    assert (tmp_path / weights).stat().st_mtime_ns == stamp  # not rebuilt
    assert tok2.merges == tok.merges
    assert same_weights(first, second)
    assert evaluate(second, held_out_ids(tok2, TINY), batch_size=4, batches=2) < 7.0


def _build_counting(cache: str, log: str) -> None:
    """In a fresh process: base_model(TINY), logging each time it trains rather than reads the cache."""
    from posttrainllm import pretrained

    build = pretrained._build

    def counted(recipe):
        with open(log, "a") as f:
            f.write("trained\n")
        return build(recipe)

    pretrained._build = counted
    base_model(TINY, cache_dir=Path(cache))


def test_two_processes_that_want_the_same_model_train_it_once(tmp_path):
    log = tmp_path / "log"
    spawn = multiprocessing.get_context("spawn")
    workers = [spawn.Process(target=_build_counting, args=(str(tmp_path / "cache"), str(log))) for _ in range(2)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(120)
    assert [w.exitcode for w in workers] == [0, 0]
    assert log.read_text() == "trained\n"  # the second waited for the first and read what it saved
    assert same_weights(base_model(TINY, cache_dir=tmp_path / "cache")[0], base_model(TINY, cache_dir=tmp_path)[0])


def test_building_again_from_scratch_gives_the_same_weights(tmp_path):
    a, _ = base_model(TINY, cache_dir=tmp_path / "one")
    b, _ = base_model(TINY, cache_dir=tmp_path / "two")
    assert same_weights(a, b)


def test_a_damaged_cache_file_is_rebuilt_not_trusted(tmp_path):
    model, _ = base_model(TINY, cache_dir=tmp_path)
    weights = tmp_path / f"base-{TINY.key}.pt"
    weights.write_bytes(weights.read_bytes()[:500])
    rebuilt, _ = base_model(TINY, cache_dir=tmp_path)
    assert same_weights(model, rebuilt)


def test_the_cache_key_changes_with_the_recipe():
    assert Recipe().key != Recipe(steps=601).key and Recipe().key == Recipe().key


CHAT = Recipe(corpus_chars=30_000, vocab_size=300, n_layer=1, n_embd=16, n_head=2, steps=15, block_size=160)


def test_fine_tuned_models_are_trained_once_and_match_a_fresh_build(tmp_path):
    lora_model, history = sft_model(rank=2, steps=3, recipe=CHAT, cache_dir=tmp_path)
    [cached] = [p for p in tmp_path.iterdir() if p.name.startswith("tuned-sft-r2")]
    stamp = cached.stat().st_mtime_ns
    again, history_again = sft_model(rank=2, steps=3, recipe=CHAT, cache_dir=tmp_path)
    assert cached.stat().st_mtime_ns == stamp and history_again == history and len(history["loss"]) == 3
    assert same_weights(lora_model, again)
    elsewhere, _ = sft_model(rank=2, steps=3, recipe=CHAT, cache_dir=tmp_path / "fresh")
    assert same_weights(lora_model, elsewhere)  # the cache holds exactly what training produces
    base, _ = base_model(CHAT, cache_dir=tmp_path)
    frozen = {k: v for k, v in lora_model.state_dict().items() if ".A." not in k and ".B." not in k}
    assert all(torch.equal(v, base.state_dict()[k.replace(".base.", ".")]) for k, v in frozen.items())
    assert lora.trainable_parameters(lora_model) == CHAT.n_layer * sum(
        lora.lora_parameters(i, o, 2) for i, o in [(16, 48), (16, 16), (16, 64), (64, 16)])


def test_a_damaged_fine_tuned_file_is_rebuilt_and_full_sft_trains_every_weight(tmp_path):
    full, _ = sft_model(rank=None, steps=2, recipe=CHAT, cache_dir=tmp_path)
    base, _ = base_model(CHAT, cache_dir=tmp_path)
    assert not same_weights(full, base) and lora.trainable_parameters(full) == full.n_params()
    [cached] = [p for p in tmp_path.iterdir() if p.name.startswith("tuned-sft-full")]
    cached.write_bytes(cached.read_bytes()[:300])
    rebuilt, _ = sft_model(rank=None, steps=2, recipe=CHAT, cache_dir=tmp_path)
    assert same_weights(full, rebuilt)


@pytest.mark.slow
def test_dpo_model_starts_from_the_lora_sft_model_and_records_its_run(tmp_path):
    policy, history = dpo_model(nll_weight=1.0, steps=2, sft_steps=2, recipe=CHAT, cache_dir=tmp_path, questions=40)
    [cached] = tmp_path.glob("tuned-dpo-*")
    assert cached.name.startswith(f"tuned-dpo-nll1-2-sft2-q40-{CHAT.key}")  # the book's 600 questions add no -q
    reference, _ = sft_model(rank=4, steps=2, recipe=CHAT, cache_dir=tmp_path)
    assert set(history) == {"loss", "margin", "chosen_logp"} and len(history["loss"]) == 2
    assert history["margin"][0] == 0.0  # step one: policy == reference, so no margin yet
    assert not same_weights(policy, reference)


def test_grpo_model_is_cached_with_its_history_and_names_an_unknown_reward(tmp_path):
    name = "proxy: the answer is a phrase of the prompt"
    policy, history = grpo_model(name, steps=2, sft_steps=2, recipe=CHAT, cache_dir=tmp_path)
    assert set(history) == {"reward", "kl", "tracked", "entropy", "length"} and len(history["reward"]) == 2
    assert all(len(values) == 2 for values in history.values()) and min(history["entropy"]) > 0
    [cached] = [p for p in tmp_path.iterdir() if p.name.startswith("tuned-grpo-phrase_of_prompt")]
    stamp = cached.stat().st_mtime_ns
    again, history_again = grpo_model(name, steps=2, sft_steps=2, recipe=CHAT, cache_dir=tmp_path)
    assert cached.stat().st_mtime_ns == stamp and history_again == history and same_weights(policy, again)
    with pytest.raises(ValueError, match="unknown reward 'length'"):
        grpo_model("length", cache_dir=tmp_path)


def test_mistake_pairs_are_exactly_the_wrong_answers(tmp_path):
    model, _ = sft_model(rank=None, steps=2, recipe=CHAT, cache_dir=tmp_path)
    tok = base_model(CHAT, cache_dir=tmp_path)[1]
    questions = sft.examples("questions", 6)
    pairs = preference.mistake_pairs(model, tok, questions)
    wrong = [e for e in questions if sft.reply(model, tok, e.prompt).strip() != e.response]
    assert [p.prompt for p in pairs] == [e.prompt for e in wrong]
    assert all(p.chosen != p.rejected for p in pairs)


def test_models_are_float64_whatever_the_callers_default_and_the_default_is_restored(tmp_path):
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float32)
    try:
        built, _ = base_model(TINY, cache_dir=tmp_path)  # trained here
        loaded, _ = base_model(TINY, cache_dir=tmp_path)  # read from the cache
        tuned, _ = sft_model(rank=2, steps=2, recipe=CHAT, cache_dir=tmp_path)
        assert torch.get_default_dtype() == torch.float32
    finally:
        torch.set_default_dtype(before)
    for model in (built, loaded, tuned):
        assert {p.dtype for p in model.parameters()} == {torch.float64}


def test_build_all_builds_each_model_with_a_bar_and_says_what_is_left(monkeypatch, capsys):
    import io

    from posttrainllm import progress
    from posttrainllm.tools import models

    built, out = [], io.StringIO()

    def trains(name):
        def build():
            built.append((name, list(progress.steps(3))))  # a bar inside build_all, a range outside
        return build

    monkeypatch.setattr(models, "MODELS", {"a": trains("a"), "b": trains("b")})
    monkeypatch.setattr(models, "measured", lambda: {"machine": "m", "seconds": {"a": 30.0, "b": 600.0}})
    taken = models.build_all(out=out)
    assert built == [("a", [0, 1, 2]), ("b", [0, 1, 2])] and list(taken) == ["a", "b"]
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("[1/2] a: 30 s to train on m (up to 10 min for this and the rest")
    assert lines[2].startswith("[2/2] b: 10 min to train on m (up to 10 min")
    bars = capsys.readouterr().err
    assert "\ra:" in bars and "\rb:" in bars and "0/3 [" in bars  # a bar for each, named after its model
    assert isinstance(progress.steps(3), range)


def test_every_shared_model_has_a_measured_time():
    from posttrainllm.tools import models

    times = models.measured()
    assert set(times["seconds"]) == set(models.MODELS) and all(s > 0 for s in times["seconds"].values())


def test_an_unwritable_cache_is_named_before_anything_trains(tmp_path, monkeypatch):
    from posttrainllm import data, pretrained

    monkeypatch.setattr(pretrained, "_build", lambda recipe: pytest.fail("trained into a cache it cannot keep"))
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    with pytest.raises(data.CacheNotWritable, match=r"a-file/cache cannot be written .*POSTTRAINLLM_CACHE"):
        base_model(TINY, cache_dir=blocked / "cache")
    with pytest.raises(data.CacheNotWritable):
        sft_model(rank=2, steps=2, recipe=CHAT, cache_dir=blocked / "cache")


def test_a_cache_that_holds_the_models_is_only_read(tmp_path, monkeypatch):
    from posttrainllm import data

    built, _ = base_model(TINY, cache_dir=tmp_path)
    monkeypatch.setattr(data, "model_cache", lambda cache: pytest.fail("a read needed write access"))
    loaded, _ = base_model(TINY, cache_dir=tmp_path)  # a shared, read-only cache works
    assert all(torch.equal(a, b) for a, b in zip(built.state_dict().values(), loaded.state_dict().values(),
                                                  strict=True))
