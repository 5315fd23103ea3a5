import numpy as np
import pytest
import torch

from posttrainllm.distributed import train_parallel, train_parallel_modes, train_single
from posttrainllm.model import GPTConfig

CONFIG = GPTConfig(vocab_size=64, block_size=16, n_layer=2, n_head=2, n_embd=32)
IDS = np.random.default_rng(0).integers(0, 64, 5000)


@pytest.fixture(scope="module")
def reference():
    return train_single(CONFIG, IDS, steps=5, batch_size=8, lr=3e-3)


@pytest.fixture(scope="module")
def parallel():
    return train_parallel_modes(CONFIG, IDS, steps=5, batch_size=8, lr=3e-3, world_size=2, modes=("ddp", "fsdp"))


@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_two_processes_end_where_one_process_on_the_whole_batch_ends(reference, parallel, mode):
    state, losses = reference
    result = parallel[mode]
    np.testing.assert_allclose(result["losses"], losses, rtol=1e-5)
    for name, tensor in state.items():
        torch.testing.assert_close(result["state_dict"][name], tensor, atol=1e-4, rtol=0, msg=name)
    full = sum(t.numel() for name, t in state.items() if name != "head.weight")  # tied to tok_emb
    expected = [full, full] if mode == "ddp" else [full // 2, full // 2]
    assert result["params_per_process"] == expected


def test_one_mode_alone_matches_the_same_mode_run_beside_another(parallel):
    alone = train_parallel(CONFIG, IDS, steps=5, batch_size=8, lr=3e-3, world_size=2, mode="fsdp")
    assert alone["losses"] == parallel["fsdp"]["losses"]


def test_uneven_batches_and_unknown_modes_are_refused():
    with pytest.raises(ValueError, match="split evenly"):
        train_parallel(CONFIG, IDS, steps=1, batch_size=7, lr=1e-3)
    with pytest.raises(ValueError, match="mode"):
        train_parallel(CONFIG, IDS, steps=1, batch_size=8, lr=1e-3, mode="zero9")
    with pytest.raises(ValueError, match="mode"):
        train_parallel_modes(CONFIG, IDS, steps=1, batch_size=8, lr=1e-3, modes=())
