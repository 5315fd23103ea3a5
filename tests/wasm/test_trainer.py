"""The WASM trainer computes the oracle's function: same initialisation, same batches, the same
gradients after one step, and a loss curve that stays within 1e-3 of the oracle's for 100 steps
in every build. Bad input answers with the trainer's own message."""

import base64
import json
import math
import platform
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrainllm import wasm
from posttrainllm.model import GPT, GPTConfig
from tests.wasm.conftest import STEPS

THREADS = {"scalar": 1, "simd": 1, "threads": 2, "relaxed": 1, "relaxed-threads": 2, "memory64": 1}


def test_committed_builds_are_what_the_source_builds(rebuilt):
    committed = sorted(p.name for p in wasm.DIST.iterdir())
    assert committed == sorted(p.name for p in rebuilt.iterdir())
    stale = [name for name in committed if (wasm.DIST / name).read_bytes() != (rebuilt / name).read_bytes()]
    assert not stale, f"{wasm.DIST} is out of date with the C++ beside it: run `make wasm` and commit {stale}"


def test_initialisation_and_batches_match_their_numpy_replicas(dist, oracle):
    config, ids = oracle["config"], oracle["ids"]
    answer = wasm.run("simd", wasm.trainer_config(config), tokens=ids, token_seed=3, steps=5, seed=7, lr=0.0,
                      dist=dist)
    np.testing.assert_array_equal(answer["params"], wasm.init_weights(config, seed=7))  # lr 0: still the init
    start = wasm.batch_starts(3, len(ids), config.block_size, wasm.BATCH, 5)[-1, 0]
    assert answer["last_batch"] == ids[start : start + config.block_size].tolist()


def relative(ours, theirs) -> float:
    return float(np.linalg.norm(ours - theirs) / np.linalg.norm(theirs))


@pytest.mark.parametrize("build", wasm.BUILDS)
def test_one_step_matches_the_oracle_from_its_exported_weights(build, dist, oracle):
    """The oracle's own (torch) initialisation, exported and loaded: logits and every
    parameter's gradient agree to 1e-4 relative."""
    config, ids = oracle["config"], oracle["ids"]
    model = GPT(config)
    starts = wasm.batch_starts(11, len(ids), config.block_size, wasm.BATCH, 1)[0]
    x = np.stack([ids[s : s + config.block_size] for s in starts])
    y = np.stack([ids[s + 1 : s + 1 + config.block_size] for s in starts])
    answer = wasm.run(build, wasm.trainer_config(config), threads=THREADS[build],
                      weights=wasm.weights_bytes(model), batch=(x, y), dist=dist)
    logits, loss = model(torch.from_numpy(x), torch.from_numpy(y))
    loss.backward()
    assert abs(answer["loss"] - loss.item()) < 1e-5
    assert relative(answer["logits"], logits.detach().numpy().ravel()) < 1e-4
    offset = 0
    for name, shape in wasm.shapes(config):
        size = int(np.prod(shape))
        theirs = dict(model.named_parameters())[name].grad.numpy().ravel()
        assert relative(answer["grads"][offset : offset + size], theirs) < 1e-4, name
        offset += size


@pytest.mark.parametrize("build", wasm.BUILDS)
def test_loss_drift_after_100_steps_is_below_1e_3(build, dist, oracle):
    answer = wasm.run(build, wasm.trainer_config(oracle["config"]), threads=THREADS[build],
                      tokens=oracle["ids"], steps=STEPS, dist=dist)
    assert answer["threads"] == THREADS[build]
    drift = np.abs(np.array(answer["losses"]) - oracle["losses"])
    assert drift.max() < 1e-3, f"{build}: loss drift {drift.max():.2e} (worst at step {drift.argmax() + 1})"
    assert answer["losses"][-1] < answer["losses"][0] - 3  # and it learns: ~6.2 to ~1.0 nats


def small() -> dict:
    return wasm.trainer_config(GPTConfig(vocab_size=64, block_size=16, n_layer=1, n_head=2, n_embd=16), batch=2)


def test_weights_of_the_wrong_shape_are_refused(dist):
    other = GPT(GPTConfig(vocab_size=64, block_size=16, n_layer=2, n_head=2, n_embd=16))
    with pytest.raises(RuntimeError, match="weights of the wrong shape: the file is for vocab 64, block 16, 2 layers"):
        wasm.run("simd", small(), weights=wasm.weights_bytes(other), dist=dist)


@pytest.mark.parametrize("build", ["simd", "memory64"])
def test_a_truncated_or_foreign_weights_file_is_refused(build, dist):
    good = wasm.weights_bytes(GPT(GPTConfig(vocab_size=64, block_size=16, n_layer=1, n_head=2, n_embd=16)))
    with pytest.raises(RuntimeError, match=f"truncated or padded: {len(good) - 10} bytes, expected {len(good)}"):
        wasm.run(build, small(), weights=good[:-10], dist=dist)
    with pytest.raises(RuntimeError, match="not a posttrainllm weights file"):
        wasm.run(build, small(), weights=b"PK\x03\x04" + good[4:], dist=dist)


def test_tokens_outside_the_vocabulary_are_refused(dist):
    tokens = [1, 2, 3, 4, 5, 64] + [0] * 40
    with pytest.raises(ValueError, match=r"tokens\[5\] is id 64, outside the vocabulary of 64"):
        wasm.run("simd", small(), tokens=tokens, steps=1, dist=dist)
    with pytest.raises(RuntimeError, match="token 5 is id 64, outside the vocabulary of 64"):  # and the trainer too
        wasm.run("simd", small(), tokens=tokens, steps=1, dist=dist, validate=False)


@pytest.mark.parametrize("build", ["simd", "memory64"])
def test_a_batch_id_outside_the_vocabulary_is_refused_on_both_sides_and_changes_nothing(build, dist):
    config, shape = small(), (2, 16)
    inputs, targets = np.ones(shape, int), np.ones(shape, int)
    for bad, name in ((-1, "inputs"), (64, "targets")):
        x, y = inputs.copy(), targets.copy()
        (x if name == "inputs" else y)[1, 3] = bad
        with pytest.raises(ValueError, match=rf"{name}\[19\] is id {bad}, outside the vocabulary of 64"):
            wasm.run(build, config, batch=(x, y), dist=dist)
        kind = name[:-1]
        with pytest.raises(RuntimeError, match=rf"{kind} 19 is id {bad}, outside the vocabulary of 64"):
            wasm.run(build, config, batch=(x, y), dist=dist, validate=False)
    answer = wasm.run(build, config, batch=(inputs, targets), seed=3, dist=dist)
    np.testing.assert_array_equal(answer["params"], wasm.init_weights(GPTConfig(vocab_size=64, block_size=16,
                                  n_layer=1, n_head=2, n_embd=16), seed=3))  # no call wrote into the weights


@pytest.mark.parametrize(("changes", "message"), [
    ({"tokens": [1.5] * 40}, "tokens must be whole token ids; 1.5 is not"),
    ({"tokens": [70_000] * 40}, r"tokens\[0\] is id 70000, outside the vocabulary of 64"),
    ({"lr": float("nan")}, "the learning rate must be a finite number of 0 or more, got nan"),
    ({"lr": -1e-3}, "the learning rate must be a finite number of 0 or more"),
    ({"steps": -1}, "steps must be a whole number of at least 0, got -1"),
    ({"threads": 0}, "threads must be a whole number of at least 1, got 0"),
    ({"seed": 1 << 40}, "seed must be below 2"),
    ({"batch": (np.zeros((2, 15), int), np.zeros((2, 16), int))}, r"inputs must have shape \(2, 16\)"),
])
def test_ids_and_hyperparameters_are_checked_before_the_trainer_runs(changes, message):
    with pytest.raises(ValueError, match=message):
        wasm.run("simd", small(), **changes)


def test_the_trainer_itself_refuses_a_nan_learning_rate(dist):
    with pytest.raises(RuntimeError, match="AdamW: the learning rate must be a finite number"):
        wasm.run("memory64", small(), lr=float("nan"), dist=dist, validate=False)


# Emscripten's: a fixed 64 MB; zig's relaxed builds: 1 GB at most; Memory64: capped at 1 GB here
@pytest.mark.parametrize("build", ["simd", "threads", "relaxed", "relaxed-threads", "memory64"])
def test_a_model_too_big_for_memory_reports_itself(build, dist):
    huge = wasm.trainer_config(GPTConfig(vocab_size=512, block_size=512, n_layer=8, n_head=8, n_embd=256), batch=16)
    with pytest.raises(RuntimeError, match=r"out of memory: this model and batch need \d+ MB"):
        wasm.run(build, huge, threads=THREADS[build], dist=dist)


def test_the_trainer_refuses_an_architecture_it_does_not_implement():
    with pytest.raises(ValueError, match="differs in {'norm': 'rmsnorm'}"):
        wasm.trainer_config(GPTConfig(norm="rmsnorm"))


def test_an_unknown_build_is_named():
    with pytest.raises(ValueError, match="no build 'sse'"):
        wasm.run("sse", small())


@pytest.mark.parametrize(("threaded", "single"), [("threads", "simd"), ("relaxed-threads", "relaxed")])
def test_the_threaded_build_also_runs_on_one_thread(threaded, single, dist, oracle):
    """A one-core reader gets threads == 1; the threaded build must start and agree with its
    single-thread twin."""
    config = wasm.trainer_config(oracle["config"])
    one = wasm.run(threaded, config, threads=1, tokens=oracle["ids"], steps=3, dist=dist)
    alone = wasm.run(single, config, threads=1, tokens=oracle["ids"], steps=3, dist=dist)
    assert one["threads"] == 1 and one["losses"] == alone["losses"]


def test_threads_do_not_change_the_relaxed_builds_numbers(dist, oracle):
    """The pool hands out whole rows, so 3 threads compute what 1 does, bit for bit."""
    config = wasm.trainer_config(oracle["config"])
    runs = [wasm.run("relaxed-threads", config, threads=n, tokens=oracle["ids"], steps=5, dist=dist) for n in (1, 3)]
    assert [r["threads"] for r in runs] == [1, 3] and runs[0]["losses"] == runs[1]["losses"]
    assert np.array_equal(runs[0]["params"], runs[1]["params"])


def test_relaxed_simd_uses_fused_multiply_adds(dist, oracle):
    """Same weights and batch: the relaxed build's logits differ from the SIMD build's in the last
    bits (one rounding per multiply-add instead of two), by no more than rounding could."""
    config = wasm.trainer_config(oracle["config"])
    weights = wasm.weights_bytes(wasm.oracle_at_init(oracle["config"]))
    x = oracle["ids"][: config["batch"] * config["block"]].reshape(config["batch"], config["block"])
    y = oracle["ids"][1 : config["batch"] * config["block"] + 1].reshape(x.shape)
    plain, fused = (wasm.run(build, config, weights=weights, batch=(x, y), dist=dist)["logits"]
                    for build in ("simd", "relaxed"))
    assert np.array_equal(plain, fused) != cpu_has_fma()  # without FMA, V8 multiplies and adds
    assert np.abs(plain - fused).max() < 1e-5 * np.abs(plain).max()


def cpu_has_fma() -> bool:
    """Whether V8 has a fused multiply-add to lower relaxed_madd to: every 64-bit ARM; on x86, FMA3."""
    if platform.machine().lower() not in ("x86_64", "amd64", "i386", "i686"):
        return True
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    return " fma " in flags.replace("\t", " ").replace("\n", " ")


def skip_unless_relaxed_simd_is_flagged() -> None:
    """An engine without relaxed SIMD can be played only by a node that needs a flag to run it."""
    if "--experimental-wasm-relaxed-simd" not in wasm.node_command():
        pytest.skip("this node runs relaxed SIMD without a flag, so it cannot play an engine without it")


def test_an_engine_without_relaxed_simd_is_told_what_it_lacks(dist, oracle, monkeypatch):
    skip_unless_relaxed_simd_is_flagged()
    monkeypatch.setattr(wasm, "node_command", lambda: (wasm.node(), "--no-experimental-fetch"))
    with pytest.raises(RuntimeError, match="cannot run tinygpt-relaxed.wasm: it needs SIMD and relaxed SIMD"):
        wasm.run("relaxed", wasm.trainer_config(oracle["config"]), tokens=oracle["ids"], steps=1, dist=dist)


@pytest.mark.parametrize(("relaxed", "isolated", "picked"), [
    (True, True, "relaxed-threads"), (True, False, "relaxed"), (False, True, "threads"), (False, False, "simd")])
def test_the_browser_cell_picks_the_fastest_build_the_engine_runs(relaxed, isolated, picked, dist, tmp_path):
    """cell.js's pickBuild in a real V8 (node), with relaxed SIMD switched on or not."""
    if not relaxed:
        skip_unless_relaxed_simd_is_flagged()
    (tmp_path / "cell.mjs").write_text((wasm.WASM / "cell.js").read_text())
    files = {f"tinygpt-{b}.wasm": base64.b64encode((dist / f"tinygpt-{b}.wasm").read_bytes()).decode()
             for b in wasm.BROWSER_BUILDS}
    (tmp_path / "files.json").write_text(json.dumps(files))
    script = (f"import {{pickBuild}} from {json.dumps((tmp_path / 'cell.mjs').as_uri())};"
              f"import {{readFileSync}} from 'node:fs';"
              f"const files = JSON.parse(readFileSync({json.dumps(str(tmp_path / 'files.json'))}, 'utf8'));"
              f"process.stdout.write(pickBuild(files, {json.dumps(isolated)}));")
    flags = wasm.node_command()[1:] if relaxed else ("--no-experimental-fetch",)
    done = subprocess.run([wasm.node(), *flags, "--input-type=module", "-e", script], capture_output=True, text=True,
                          check=True)
    assert done.stdout == picked


@pytest.mark.parametrize("build", wasm.BUILDS)
def test_the_benchmarked_gemm_is_exact_on_exactly_representable_inputs(build, dist, oracle):
    """Sizes off the 4 x 8 SIMD block, so the scalar edges run too, and one past the kernel's
    256-step passes, so a pass adds to the last one's output; inputs are multiples of 1/8 whose
    sums fp32 holds exactly, so any wrong product shows as a nonzero error."""
    answer = wasm.run(build, wasm.trainer_config(oracle["config"]), threads=THREADS[build],
                      bench_gemm=([1, 37, 130, 300], 1), dist=dist)
    assert [g["n"] for g in answer["gemm"]] == [1, 37, 130, 300]
    assert all(g["maxError"] == 0 and g["seconds"] > 0 for g in answer["gemm"])


def test_memory64_has_64_bit_memory_and_grows_past_the_32_bit_builds_ceiling(dist):
    import wasmtime

    config = wasmtime.Config()
    config.wasm_memory64 = True
    module = wasmtime.Module.from_file(wasmtime.Engine(config), str(dist / "tinygpt64.wasm"))
    memory = next(e.type for e in module.exports if e.name == "memory")
    assert memory.is_64
    big = wasm.trainer_config(GPTConfig(vocab_size=512, block_size=512, n_layer=4, n_head=8, n_embd=128), batch=8)
    with pytest.raises(RuntimeError, match="out of memory"):
        wasm.run("simd", big, dist=dist)  # needs ~300 MB: past the fixed 64 MB
    assert wasm.run("memory64", big, dist=dist)["n_params"] > 0


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.integers(-3, 70), st.floats(allow_nan=True, allow_infinity=True)), min_size=1,
                max_size=40))
def test_any_token_list_is_accepted_only_when_every_id_is_in_the_vocabulary(ids):
    config = small()
    valid = all(math.isfinite(i) and float(i).is_integer() and 0 <= i < 64 for i in ids)
    try:
        wasm.check_job(config, threads=1, seed=0, tokens=ids, steps=1, lr=1e-3, batch=None)
    except ValueError as err:
        assert not valid and ("outside the vocabulary" in str(err) or "whole token ids" in str(err))
    else:
        assert valid


@pytest.mark.parametrize("build", ["simd", "memory64"])
def test_an_id_too_wide_for_the_trainer_is_refused_even_unvalidated(build, dist):
    tokens = np.array([1, 2, 2**32 + 5] + [0] * 40, dtype=np.int64)  # cast to 16 bits it would be id 5
    with pytest.raises(ValueError, match=r"tokens holds id 4294967301, which the trainer's 16-bit ids cannot hold"):
        wasm.run(build, small(), tokens=tokens, steps=1, dist=dist, validate=False)
    x = np.ones((2, 16), np.int64)
    x[0, 0] = 2**32 + 5
    with pytest.raises(ValueError, match="inputs holds id 4294967301, which the trainer's 32-bit ids"):
        wasm.run(build, small(), batch=(x, np.ones((2, 16), np.int64)), dist=dist, validate=False)
