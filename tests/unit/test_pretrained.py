import torch

from posttrainllm.pretrained import Recipe, base_model, held_out_ids
from posttrainllm.train import evaluate


def same_weights(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True))


TINY = Recipe(corpus_chars=30_000, vocab_size=300, n_layer=1, n_embd=16, n_head=2, steps=15, block_size=16)


def test_base_model_is_built_once_then_read_from_the_cache(tmp_path):
    first, tok = base_model(TINY, cache_dir=tmp_path)
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == [f"base-{TINY.key}.bpe", f"base-{TINY.key}.pt"]
    stamp = (tmp_path / files[1]).stat().st_mtime_ns
    second, tok2 = base_model(TINY, cache_dir=tmp_path)
    assert (tmp_path / files[1]).stat().st_mtime_ns == stamp  # not rebuilt
    assert tok2.merges == tok.merges
    assert same_weights(first, second)
    assert evaluate(second, held_out_ids(tok2, TINY), batch_size=4, batches=2) < 7.0


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
