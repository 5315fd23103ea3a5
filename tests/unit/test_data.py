import numpy as np
import pytest
import torch

from posttrainllm import data
from posttrainllm.device import available_devices, resolve_device


def test_corpus_is_at_least_two_megabytes_and_reproducible():
    text = data.corpus()
    assert len(text.encode("utf-8")) >= 2_000_000
    assert text == data.corpus() and text != data.corpus(seed=1)
    lines = text.splitlines()
    assert len(lines) > 4000 and len(set(lines)) == len(lines)  # thousands of stories, none repeated


def test_both_registers_tell_the_same_story_in_different_words():
    for index in range(20):
        plain, fancy = data.story(index), data.story(index, register="storybook")
        assert plain != fancy
        names = {w.strip('.,"') for w in plain.split()} & set(data.NAMES)
        objects = {o for o in data.OBJECTS if o in plain}
        assert len(names) == 2 and names == {w.strip('.,"') for w in fancy.split()} & set(data.NAMES)
        assert objects and all(o in fancy for o in objects)


def test_unknown_register_is_refused():
    with pytest.raises(ValueError, match="register must be one of"):
        data.story(0, register="pirate")


def test_load_text_downloads_once_and_reads_the_cache(tmp_path):
    source = tmp_path / "source" / "shakespeare.txt"
    source.parent.mkdir()
    source.write_text("To be, or not to be", encoding="utf-8")
    cache = tmp_path / "cache"
    assert data.load_text(source.as_uri(), cache_dir=cache) == "To be, or not to be"
    source.unlink()  # now only the cache can answer
    assert data.load_text(source.as_uri(), cache_dir=cache) == "To be, or not to be"
    assert [p.name for p in cache.iterdir()] == ["shakespeare.txt"]


def test_load_text_without_a_network_says_what_to_do(tmp_path):
    with pytest.raises(ConnectionError, match="use the built-in corpus"):
        data.load_text((tmp_path / "missing.txt").as_uri(), cache_dir=tmp_path / "cache")


def test_split_and_batches():
    ids = np.arange(100)
    train, val = data.train_val_split(ids, 0.2)
    assert len(train) == 80 and val[0] == 80
    gen = torch.Generator().manual_seed(0)
    x, y = data.get_batch(train, batch_size=4, block_size=8, generator=gen)
    assert x.shape == y.shape == (4, 8) and torch.equal(x[:, 1:], y[:, :-1])
    x2, _ = data.get_batch(train, 4, 8, generator=torch.Generator().manual_seed(0))
    assert torch.equal(x, x2)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: data.train_val_split([1, 2], 1.5), "val_fraction"),
        (lambda: data.get_batch(np.arange(5), 2, 8), "longer than block_size"),
        (lambda: data.get_batch(np.arange(50), 2, 8, device="tpu"), "unknown device"),
    ],
)
def test_bad_arguments_are_explained(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_a_device_this_machine_lacks_raises():
    missing = next((d for d in ("cuda", "mps") if d not in available_devices()), None)
    if missing is None:
        pytest.skip("this machine has both CUDA and MPS")
    with pytest.raises(ValueError, match="not available on this machine"):
        data.get_batch(np.arange(50), 2, 8, device=missing)
    assert resolve_device("auto") in ("cpu", "cuda", "mps")
