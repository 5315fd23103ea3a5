"""The torchrun trainer: real ``torchrun`` launches of 2 gloo processes on 127.0.0.1, DDP and FSDP2,
checkpoints that resume exactly, and checkpoints that are refused."""

import contextlib
import json
import os
import pickle
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrainllm import pretrain

MODEL = ["model.vocab_size=64", "model.block_size=16", "model.n_layer=2", "model.n_head=2", "model.n_embd=32"]
RUN = ["steps=20", "save_every=10", "precision=fp64", "micro_batch=4", "grad_accum=1", "lr=1e-2", "warmup=3",
       "device=cpu"]  # gloo on the CPU, even where a GPU is present


@pytest.fixture(scope="module")
def tokens(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "tokens.npy"
    # a noisy cycle, so the loss has something to fall towards
    rng = np.random.default_rng(0)
    ids = (np.arange(8000) * 7 + rng.integers(0, 3, 8000)) % 64
    np.save(path, ids.astype(np.uint16))
    return path


def launch(out, tokens, *settings, processes: int = 2) -> list[float]:
    """Run the trainer (under torchrun when ``processes`` > 1); return every step's loss in its log."""
    return pretrain.launch(out, [*MODEL, *RUN, f"data={tokens}", *settings], processes=processes, timeout=300)


@pytest.fixture(scope="module")
def uninterrupted(tokens, tmp_path_factory):
    return {mode: launch(tmp_path_factory.mktemp(f"whole-{mode}"), tokens, f"parallel={mode}")
            for mode in ("ddp", "fsdp")}


@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
@pytest.mark.slow
def test_a_run_cut_at_step_13_resumes_from_step_10_and_repeats_steps_11_to_20_exactly(
        mode, tokens, uninterrupted, tmp_path):
    cut = launch(tmp_path, tokens, f"parallel={mode}", "stop_after=13")
    assert len(cut) == 13
    resumed = launch(tmp_path, tokens, f"parallel={mode}")
    assert len(resumed) == 20  # the log's steps 11-13 from the cut run were replaced
    assert resumed == uninterrupted[mode]  # bit for bit
    assert resumed[-1] < resumed[0] - 0.5


@pytest.mark.slow
def test_two_processes_match_one_process_on_the_global_batch(tokens, uninterrupted, tmp_path):
    single = launch(tmp_path, tokens, "grad_accum=2", processes=1)
    for mode in ("ddp", "fsdp"):  # the same rows, summed in another order
        np.testing.assert_allclose(uninterrupted[mode], single, rtol=1e-10, err_msg=mode)
    # FSDP2 accumulating 2 micro-batches of 2 rows: it keeps the gathered weights between them,
    # and must reshard them after the last, before the optimizer updates the shards
    for keep in ("true", "false"):
        accumulated = launch(tmp_path / keep, tokens, "parallel=fsdp", "micro_batch=2", "grad_accum=2",
                             f"reshard_after_forward={keep}")
        np.testing.assert_allclose(accumulated, single, rtol=1e-10, err_msg=f"reshard_after_forward={keep}")


@pytest.mark.slow
def test_a_checkpoint_saved_by_two_fsdp_processes_resumes_in_one(tokens, uninterrupted, tmp_path):
    launch(tmp_path, tokens, "parallel=fsdp", "stop_after=13")
    resumed = launch(tmp_path, tokens, "grad_accum=2", processes=1)  # same global batch, one process
    np.testing.assert_allclose(resumed, uninterrupted["fsdp"], rtol=1e-10)


@pytest.fixture(scope="module")
def checkpoint(tokens, tmp_path_factory):
    out = tmp_path_factory.mktemp("one")
    launch(out, tokens, "steps=2", "save_every=0", processes=1)
    return pretrain.latest(out)


def test_a_truncated_shard_is_refused_before_it_is_read(checkpoint, tmp_path):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(checkpoint, copy)
    shard = next((copy / "dcp").glob("*.distcp"))
    shard.write_bytes(shard.read_bytes()[:1000])
    with pytest.raises(ValueError, match="differs from what was saved"):
        pretrain.read_state(copy)
    shard.unlink()
    with pytest.raises(ValueError, match="missing"):
        pretrain.read_state(copy)


def test_a_foreign_state_file_is_refused(checkpoint, tmp_path):
    import shutil

    import torch

    copy = tmp_path / "copy"
    shutil.copytree(checkpoint, copy)
    torch.save({"step": 3}, copy / "state.pt")
    with pytest.raises(ValueError, match="not a posttrainllm pretraining checkpoint"):
        pretrain.read_state(copy)
    (copy / "state.pt").write_bytes(b"not a checkpoint at all")
    with pytest.raises(ValueError, match="truncated or corrupt"):
        pretrain.read_state(copy)


class _Payload:
    def __reduce__(self):
        return (os.system, ("echo ran > /dev/null",))


def test_the_index_unpickler_refuses_code_and_reads_dcps_own():
    import io

    with pytest.raises(pickle.UnpicklingError, match="system"):
        pretrain._MetadataUnpickler(io.BytesIO(pickle.dumps(_Payload()))).load()
    from torch.distributed.checkpoint.metadata import Metadata

    index = Metadata(state_dict_metadata={})
    assert pretrain._MetadataUnpickler(io.BytesIO(pickle.dumps(index))).load() == index


def test_configs_name_what_is_wrong(tmp_path):
    assert pretrain.load_config("tiny", ["steps=7", "model.n_layer=3", "parallel=fsdp"]).model.n_layer == 3
    assert pretrain.load_config("gpt2-small").model.attention == "sdpa"
    with pytest.raises(ValueError, match="no config 'huge'.*gpt2-small.*tiny"):
        pretrain.load_config("huge")
    with pytest.raises(ValueError, match=r"unknown PretrainConfig keys \['stpes'\]"):
        pretrain.load_config("tiny", ["stpes=7"])
    with pytest.raises(ValueError, match="parallel must be"):
        pretrain.load_config("tiny", ["parallel=zero9"])
    with pytest.raises(ValueError, match="not key=value"):
        pretrain.load_config("tiny", ["steps"])
    with pytest.raises(ValueError, match="nor an existing .npy"):
        pretrain.token_ids(str(tmp_path / "none.npy"))
    with pytest.raises(ValueError, match="eval_every needs val_data"):
        pretrain.load_config("tiny", ["eval_every=10"])
    with pytest.raises(ValueError, match="nonfinite must be 'stop' or 'skip'"):
        pretrain.load_config("tiny", ["nonfinite=ignore"])


def test_the_stream_is_the_same_rows_whatever_the_world_size():
    windows = pretrain.Windows(np.arange(1000), block_size=9, seed=0)
    x, y = windows.rows(95, 10)  # crosses from epoch 0 into epoch 1 (100 windows each)
    again = np.concatenate([windows.rows(95 + i, 1)[0] for i in range(10)])
    np.testing.assert_array_equal(x.numpy(), again)
    np.testing.assert_array_equal(y.numpy()[:, :-1], x.numpy()[:, 1:])
    assert (x[:, 0] % 10 == 0).all()  # whole windows, never straddling two
    assert len({int(v) for v in windows.rows(0, 100)[0][:, 0]}) == 100  # an epoch visits each once


@pytest.mark.slow
def test_bf16_under_fsdp2_and_a_compiled_model_follow_the_fp32_run(tokens, tmp_path):
    settings = ["steps=6", "save_every=0", "precision=fp32"]
    fp32 = launch(tmp_path / "fp32", tokens, *settings, "parallel=fsdp")
    bf16 = launch(tmp_path / "bf16", tokens, *settings, "parallel=fsdp", "precision=bf16")
    assert bf16 != fp32  # the policy and autocast did engage
    np.testing.assert_allclose(bf16, fp32, atol=2e-2)  # bf16 keeps 8 bits of mantissa: ~0.4% a product
    single = launch(tmp_path / "eager", tokens, *settings, "grad_accum=2", processes=1)
    compiled = launch(tmp_path / "compiled", tokens, *settings, "grad_accum=2", "compile=true", processes=1)
    np.testing.assert_allclose(compiled, single, rtol=1e-5)  # fused kernels reorder fp32 sums


def test_a_failed_launch_says_why(tmp_path):
    with pytest.raises(RuntimeError, match=r"exit 2(.|\n)*unknown PretrainConfig keys \['stpes'\]"):
        pretrain.launch(tmp_path, ["stpes=1"])


@pytest.mark.slow
def test_a_checkpoint_saved_by_four_fsdp_processes_resumes_in_two(tokens, uninterrupted, tmp_path):
    launch(tmp_path, tokens, "parallel=fsdp", "micro_batch=2", "stop_after=13", processes=4)  # global batch 8
    resumed = launch(tmp_path, tokens, "parallel=fsdp")  # 2 processes x 4 rows: the same global batch
    np.testing.assert_allclose(resumed, uninterrupted["fsdp"], rtol=1e-10)


def test_a_run_refuses_a_checkpoint_of_another_shape_and_ids_outside_its_vocabulary(checkpoint, tokens, tmp_path):
    with pytest.raises(RuntimeError, match="holds a model of another shape"):
        launch(checkpoint.parent, tokens, "steps=3", "model.n_layer=1", processes=1)
    with pytest.raises(RuntimeError, match="token id 6. is outside the model's vocabulary of 60"):
        launch(tmp_path, tokens, "model.vocab_size=60", processes=1)


def test_latest_compares_step_numbers_and_ignores_other_folders(tmp_path):
    from posttrainllm.pretrain import latest

    for name in ("step-999999", "step-1000000", "step-zzz", "step-12a", "step-000050"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "state.pt").write_bytes(b"")
    (tmp_path / "step-2000000").mkdir()  # no state.pt: an interrupted save
    assert latest(tmp_path) == tmp_path / "step-1000000"
    assert latest(tmp_path / "nothing-here") is None


def test_a_torn_last_log_line_is_dropped_with_a_warning_on_resume(tmp_path):
    from posttrainllm.pretrain import _log

    log = tmp_path / "log.jsonl"
    log.write_text('{"step": 1, "loss": 5.0}\n{"step": 2, "loss": 4.0}\n\n{"step": 3, "loss": 3.0}\n{"step": 4, "lo')
    with pytest.warns(UserWarning, match="line 5 is not a whole log record"):
        _log(tmp_path, 3)
    assert log.read_text() == '{"step": 1, "loss": 5.0}\n{"step": 2, "loss": 4.0}\n{"step": 3, "loss": 3.0}\n'


@pytest.mark.parametrize("override, message", [
    ("max_grad_norm=-1", "max_grad_norm must be a finite number, at least 0"),
    ("lr=nan", "lr must be a finite number above 0"),
    ("lr=inf", "lr must be a finite number above 0"),
    ("lr=0", "lr must be a finite number above 0"),
    ("lr=1e300", "lr=1e+300 is above 10.0"),
    ("min_lr=1", "min_lr=1 is above lr"),
    ('compile="false"', "compile must be true or false, got 'false'"),
    ("progress=no", "progress must be true or false, got 'no'"),
    ("save_every=-1", "save_every must be at least 0"),
    ("stop_after=-1", "stop_after must be at least 0"),
    ("warmup=-3", "warmup must be at least 0"),
    ("steps=1.5", "steps must be a whole number, got 1.5"),
    ("micro_batch=true", "micro_batch must be a whole number, got True"),
    ("model.n_embd=0", "model.n_embd must be at least 1"),
    ("model.n_head=0", "model.n_head must be at least 1"),
    ("model.block_size=-1", "model.block_size must be at least 1"),
    ('model.n_head="4"', "model.n_head must be a whole number"),
])
def test_every_setting_is_checked_when_the_config_is_read(override, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        pretrain.load_config("tiny", [override])


def test_a_damaged_newest_checkpoint_names_the_whole_one_before_it(checkpoint, tokens, tmp_path):
    import shutil

    out = tmp_path / "run"
    shutil.copytree(checkpoint, out / "step-000001")
    shutil.copytree(checkpoint, out / "step-000002")
    shard = next((out / "step-000002" / "dcp").glob("*.distcp"))
    shard.write_bytes(shard.read_bytes()[:1000])  # a save cut short
    with pytest.raises(RuntimeError, match="step-000001 is whole: move step-000002 out of .* to resume from step 1"):
        launch(out, tokens, "steps=3", processes=1)


def test_a_resume_with_another_seed_is_the_same_shape(checkpoint, tokens, tmp_path):
    import shutil

    shutil.copytree(checkpoint, tmp_path / checkpoint.name)
    shutil.copy(checkpoint.parent / "log.jsonl", tmp_path)
    assert len(launch(tmp_path, tokens, "steps=3", "model.seed=5", processes=1)) == 3  # steps 1-2 kept, 3 run


def test_a_state_file_missing_a_key_is_named(checkpoint, tmp_path):
    import shutil

    from posttrainllm.train import save_file

    copy = tmp_path / "copy"
    shutil.copytree(checkpoint, copy)
    save_file({"format": pretrain.STATE_FORMAT, "step": 2, "files": {}}, copy / "state.pt")
    with pytest.raises(ValueError, match="state.pt lacks config, rng, samples, world_size"):
        pretrain.read_state(copy)


def test_a_second_run_into_a_folder_in_use_is_refused(tokens, tmp_path):
    from posttrainllm import atomic

    with atomic.locked(tmp_path / "log.jsonl"):  # what a run in progress holds
        with pytest.raises(RuntimeError, match="is in use by another run"):
            launch(tmp_path, tokens, "steps=2", processes=1)
    assert not (tmp_path / "log.jsonl").exists()  # the refused run wrote nothing
    assert len(launch(tmp_path, tokens, "steps=2", processes=1)) == 2  # and once it is free, a run goes ahead


def cli(*arguments, processes: int = 1):
    import subprocess
    import sys

    command = [sys.executable, "-m", "posttrainllm.pretrain", *arguments, "progress=false"]
    if processes > 1:
        command[3:3] = ["--processes", str(processes)]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("setting, message", [
    ("data=neg.npy", "token id -1 is outside the model's vocabulary of 64 (0 to 63)"),
    ("data=floats.npy", "holds float64 of shape (30,), not a 1-D array of token ids"),
    ("data=missing.npy", "data: 'missing.npy' is neither 'builtin' nor an existing .npy file"),
    ("model.block_size=40", "30 tokens do not fill one window of model.block_size + 1 = 41"),
    ("device=tpu", "unknown device 'tpu'"),
    ("out=a-file", "out='a-file' is a file"),
    ("out=a-file/run", "the run's folder cannot be made"),
])
def test_what_is_wrong_before_a_run_is_one_line_from_one_process(setting, message, tmp_path):
    np.save(tmp_path / "neg.npy", np.array([-1, *range(29)], dtype=np.int64))
    np.save(tmp_path / "floats.npy", np.ones(30))
    np.save(tmp_path / "ids.npy", np.arange(30) % 64)
    (tmp_path / "a-file").write_text("")
    with contextlib.chdir(tmp_path):
        done = cli(*MODEL, "model.block_size=8", "data=ids.npy", "steps=1", "device=cpu", setting, processes=2)
    assert done.returncode == 2
    [line] = done.stderr.splitlines()  # one line, from one process
    assert line.startswith("python -m posttrainllm.pretrain: error: ") and message in line
    assert "torch.distributed.run" not in done.stderr  # refused before torchrun started a process


@pytest.mark.slow
def test_a_full_disk_names_the_last_good_checkpoint(tokens, tmp_path):
    """A real full disk: a 1 MiB tmpfs in a mount namespace of the test's own (unshare), which holds
    the first checkpoint and not the second."""
    import shutil
    import subprocess
    import sys

    if shutil.which("unshare") is None or subprocess.run(
            ["unshare", "-rm", "true"], capture_output=True).returncode:
        pytest.skip("unshare cannot make a mount namespace here, so no small disk can be mounted")
    disk = tmp_path / "disk"
    disk.mkdir()
    run = [sys.executable, "-m", "posttrainllm.pretrain", *MODEL, *RUN, f"data={tokens}", f"out={disk}/run",
           "progress=false", "save_every=5"]
    script = f"mount -t tmpfs -o size=1m none {disk} && {' '.join(run)}; echo $?; ls {disk}/run"
    done = subprocess.run(["unshare", "-rm", "sh", "-c", script], capture_output=True, text=True, timeout=120)
    code, *left = done.stdout.split()
    assert code == "2" and "Traceback" not in done.stderr, done.stderr
    assert re.fullmatch(r"python -m posttrainllm.pretrain: error: could not save step-0000(10|15): the disk holding "
                        r".*/run is full \([0-9,]+ bytes free, a checkpoint needs about [0-9,]+\)\. The last good "
                        r"checkpoint is step-0000(05|10); free some space and run again to resume from it\.\n",
                        done.stderr), done.stderr
    saved = re.search(r"step-0000(05|10);", done.stderr)[0][:-1]
    assert left[-1] == saved  # the failed save's partial folder is gone; the last good one is kept


# every setting the trainer reads, with values a person might type by mistake
FUZZ_VALUES = {
    "steps": [0, 1, 2, -1, 1.5, "two", True], "micro_batch": [0, 1, 3, -2, "4", 2.0],
    "grad_accum": [0, 1, 2, False], "lr": [1e-3, 0, -1, "nan", "inf", "1e-2", 1e300],
    "min_lr": [0, 1e-4, 1, -1], "warmup": [0, 1, 50, -1], "weight_decay": [0, 0.1, -0.1, "nan"],
    "max_grad_norm": [0, 1, -1, "inf"], "parallel": ["ddp", "fsdp", "zero", 1],
    "precision": ["fp32", "fp64", "fp8", ""],
    "compile": ['"false"', "yes", 1], "device": ["cpu", "", "cuda", "tpu", "cpu:0", "mps"],
    "save_every": [0, 1, -1], "stop_after": [0, 1, -1], "seed": [0, 3, -1, "x"],
    "reshard_after_forward": [True, "no"], "model.vocab_size": [64, 63, 0, 100],
    "model.block_size": [8, 1, 0, 40, 100000], "model.n_layer": [1, 0, -1], "model.n_head": [1, 2, 3, 0],
    "model.n_embd": [16, 6, 0, 18], "model.n_kv_head": [1, 2, 0, 3], "model.window": [1, 4, 0],
    "model.norm": ["rmsnorm", "batchnorm"], "model.mlp": ["swiglu", "relu"], "model.positions": ["rope", "alibi"],
    "model.attention": ["naive", "flash", "sdpa", "fast"], "model.tie_weights": [False, "false"],
    "model.seed": [0, -1], "data": ["builtin", "nope.npy", "ids.npy"], "out": ["", "a-file"], "stpes": [1],
    "keep": [0, 1, -1], "eval_every": [0, 1, 2, -1], "val_data": ["", "builtin", "ids.npy", "nope.npy"],
    "nonfinite": ["stop", "skip", "ignore"],
}


@settings(max_examples=40, deadline=None)
@given(st.dictionaries(st.sampled_from(sorted(FUZZ_VALUES)), st.integers(0, 99), min_size=1, max_size=4))
def test_any_settings_give_a_clean_run_or_one_line_of_error(tmp_path_factory, chosen):
    """The trainer's contract on the command line: whatever key=value settings it is given, it trains
    or it says what is wrong in one line, exit 2; never a traceback."""
    import io

    folder = tmp_path_factory.mktemp("fuzz")
    np.save(folder / "ids.npy", np.arange(400) % 64)
    (folder / "a-file").write_text("")
    values = {key: FUZZ_VALUES[key][i % len(FUZZ_VALUES[key])] for key, i in chosen.items()}
    settings_ = [*MODEL, "model.block_size=8", "model.n_embd=16", "steps=2", "micro_batch=2", "data=ids.npy",
                 "out=run", *(f"{key}={value}" for key, value in values.items())]
    stderr = io.StringIO()
    with contextlib.chdir(folder), contextlib.redirect_stderr(stderr):
        code = pretrain.main(["--config", "tiny", "progress=false", *settings_])
    assert code in (0, 2), values
    if code == 2:
        assert stderr.getvalue().count("\n") == 1 and stderr.getvalue().startswith(
            "python -m posttrainllm.pretrain: error: "), stderr.getvalue()
    else:
        assert len(pretrain._log_lines(folder / "run" / "log.jsonl")) >= 1


def in_process(tokens, out, *settings) -> list[dict]:
    """Train in this process (so a test can reach into it); return the run's log records."""
    pretrain.run(pretrain.load_config("tiny", [*MODEL, *RUN, f"data={tokens}", f"out={out}", "progress=false",
                                               *settings]))
    return [json.loads(line) for line in pretrain._log_lines(out / "log.jsonl")]


@pytest.fixture
def nan_at_step_3(monkeypatch):
    """The model's loss is NaN on the third forward: step 3 of a run with one micro-batch a step."""
    real, calls = pretrain.GPT.forward, []

    def forward(self, idx, targets=None, cache=None):
        logits, loss = real(self, idx, targets, cache)
        calls.append(1)
        return logits, loss * float("nan") if len(calls) == 3 else loss

    monkeypatch.setattr(pretrain.GPT, "forward", forward)


def test_a_non_finite_loss_stops_the_run_before_its_optimizer_step(tokens, tmp_path, nan_at_step_3):
    with pytest.raises(pretrain.RunError, match="step 3: the loss is nan .* Stopped before the optimizer step"):
        in_process(tokens, tmp_path, "steps=5", "save_every=2")
    assert len(pretrain._log_lines(tmp_path / "log.jsonl")) == 2
    assert [p.name for p in pretrain.checkpoints(tmp_path)] == ["step-000002"]
    assert pretrain.read_state(tmp_path / "step-000002")["step"] == 2  # the last checkpoint is whole


def test_a_non_finite_loss_can_skip_its_batch(tokens, tmp_path, nan_at_step_3):
    records = in_process(tokens, tmp_path, "steps=5", "save_every=0", "nonfinite=skip")
    assert [r.get("skipped", False) for r in records] == [False, False, True, False, False]
    assert all(np.isfinite(r["loss"]) for r in records if not r.get("skipped"))


def test_a_validation_loss_every_n_steps_and_the_last_k_checkpoints(tokens, tmp_path):
    records = in_process(tokens, tmp_path, "steps=6", "save_every=1", "keep=2", "eval_every=3", f"val_data={tokens}")
    assert [("val_loss" in r) for r in records] == [False, False, True, False, False, True]
    assert records[5]["val_loss"] < records[2]["val_loss"] < np.log(64)  # below a uniform guess, and falling
    assert sorted(p.name for p in tmp_path.glob("step-*")) == ["step-000005", "step-000006"]


@pytest.mark.slow
def test_the_validation_loss_is_the_same_on_two_fsdp_processes(tokens, tmp_path):
    settings = ["steps=6", "eval_every=3", f"val_data={tokens}", "save_every=0"]
    logs = {}
    for processes in (1, 2):
        launch(tmp_path / str(processes), tokens, *settings, "parallel=fsdp", f"grad_accum={3 - processes}",
               processes=processes)
        records = map(json.loads, pretrain._log_lines(tmp_path / str(processes) / "log.jsonl"))
        logs[processes] = [r["val_loss"] for r in records if "val_loss" in r]
    np.testing.assert_allclose(logs[2], logs[1], rtol=1e-10)
