"""Every kernel in posttrainllm/assets/webgpu/kernels.json against float64 numpy, at sizes that are not multiples of
any tile, on the driver this session runs (see conftest.py)."""

import numpy as np
import pytest

from posttrainllm import webgpu

MATMULS = webgpu.variants("matmul")
# the last: K a multiple of 16 (three slices, an odd number) and tiles wholly inside C beside edge
# tiles, so matmul_8x8_interior.wgsl takes both its unchecked and its checked reads
SHAPES = [(1, 1, 1), (37, 53, 29), (64, 64, 64), (65, 17, 130), (200, 131, 257), (150, 48, 260)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("variant", MATMULS, ids=lambda v: v["name"])
def test_matmul_matches_numpy(gpu, variant, shape):
    m, k, n = shape
    rng = np.random.default_rng(m * 7 + n)
    a, b = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
    if variant.get("feature") and variant["feature"] not in gpu.features:
        with pytest.raises(RuntimeError, match=variant["feature"]):  # said plainly, not a wrong answer
            gpu.matmul(a, b, variant["file"], variant["params"])
        return
    if "f16" in variant["file"]:
        b_used = b.astype(np.float16).astype(np.float64)  # the weights as stored: rounded to f16
        assert np.abs(b_used - b).max() > 0  # so the rounding is real, and compared like for like
    else:
        b_used = b.astype(np.float64)
    c, _ = gpu.matmul(a, b, variant["file"], variant["params"])
    assert c.shape == (m, n) and c.dtype == np.float32
    np.testing.assert_allclose(c, a.astype(np.float64) @ b_used, rtol=1e-5, atol=1e-5 * np.sqrt(k))


def test_parameters_are_rewritten_and_unknown_ones_named():
    default, rewritten = (webgpu.constants(webgpu.source("matmul_tiled.wgsl", p)) for p in ({}, {"TILE": 8}))
    assert (default["TILE"], default["BM"]) == (16, 16)
    assert (rewritten["TILE"], rewritten["BM"], rewritten["BN"]) == (8, 8, 8)
    with pytest.raises(ValueError, match=r"no parameter \['TIEL'\].*'TILE'"):
        webgpu.source("matmul_tiled.wgsl", {"TIEL": 8})


def test_tile_size_parameters_keep_the_result(gpu):
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((70, 45)).astype(np.float32), rng.standard_normal((45, 33)).astype(np.float32)
    for file, params in [("matmul_tiled.wgsl", {"TILE": 8}), ("matmul_vec4.wgsl", {"BK": 8}),
                         ("matmul_regblock.wgsl", {"TM": 2, "TN": 2, "BM": 32, "BN": 32}),
                         ("matmul_vec4_8x8.wgsl", {"BK": 8})]:
        c, _ = gpu.matmul(a, b, file, params)
        np.testing.assert_allclose(c, a @ b, rtol=1e-5, atol=1e-4)


def test_layouts_come_from_the_shader_and_a_mismatch_fails_loudly(gpu):
    wgsl = webgpu.source("matmul_naive.wgsl")
    assert webgpu.bindings(wgsl) == [(0, "read-only-storage"), (1, "read-only-storage"), (2, "storage"),
                                     (3, "uniform")]
    wrong = [{"binding": b, "visibility": gpu.wgpu.ShaderStage.COMPUTE,
              "buffer": {"type": "storage" if t == "read-only-storage" else t}} for b, t in webgpu.bindings(wgsl)]
    layout = gpu.device.create_bind_group_layout(entries=wrong)  # the seed's bug: "storage" for var<storage, read>
    module = gpu.device.create_shader_module(code=wgsl)
    with pytest.raises(Exception, match="pipeline layout"):
        gpu.device.create_compute_pipeline(layout=gpu.device.create_pipeline_layout(bind_group_layouts=[layout]),
                                           compute={"module": module, "entry_point": "main"})


def test_a_wgsl_error_reports_the_compiler_message_and_line(gpu):
    broken = webgpu.source("matmul_naive.wgsl").replace("acc += A[", "acc += AA[")
    with pytest.raises(Exception, match=r"(?s)no definition in scope for identifier: `AA`.*wgsl:\d+"):
        gpu.compile(broken, label="broken")


@pytest.mark.parametrize("variant", webgpu.variants("softmax"), ids=lambda v: v["name"])
@pytest.mark.parametrize("cols", [1, 7, 256, 1000, 3001])
def test_softmax_matches_numpy_even_where_exp_overflows(gpu, variant, cols):
    x = (np.random.default_rng(cols).standard_normal((5, cols)) * 60).astype(np.float32)  # exp(180) = inf in f32
    y, _ = gpu.softmax(x, variant["file"], variant["params"])
    e = np.exp(x.astype(np.float64) - x.max(1, keepdims=True))
    np.testing.assert_allclose(y, e / e.sum(1, keepdims=True), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(y.sum(1), 1, rtol=1e-5)


ATTENTION = webgpu.variants("attention")


@pytest.mark.parametrize("t", [1, 15, 16, 17, 100, 257, 600])  # 600: past lavapipe's miscompile at T >= 481
@pytest.mark.parametrize("variant", ATTENTION, ids=lambda v: v["name"])
def test_causal_attention_matches_numpy(gpu, variant, t):
    q, k, v = (np.random.default_rng(t + i).standard_normal((2, t, 64)).astype(np.float32) for i in range(3))
    if variant.get("feature") and variant["feature"] not in gpu.features:
        with pytest.raises(RuntimeError, match=variant["feature"]):
            gpu.attention(q, k, v, variant["file"], variant["params"])
        return
    o, lse, _ = gpu.attention(q, k, v, variant["file"], variant["params"])
    o_ref, lse_ref = webgpu.attention_reference(q, k, v)
    np.testing.assert_allclose(o, o_ref, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(lse, lse_ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("params,d", [({"BR": 8, "BC": 8}, 64), ({"D": 32, "BC": 8}, 32), ({"BR": 4, "BC": 16}, 64)])
def test_flash_attention_tile_shapes_keep_the_result(gpu, params, d):
    q, k, v = (np.random.default_rng(i).standard_normal((3, 45, d)).astype(np.float32) for i in range(3))
    o, lse, _ = gpu.attention(q, k, v, "attention_flash2.wgsl", params)
    o_ref, lse_ref = webgpu.attention_reference(q, k, v)
    np.testing.assert_allclose(o, o_ref, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(lse, lse_ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("params,heads,t", [({}, 2, 1), ({}, 2, 17), ({}, 3, 100), ({}, 1, 257),
                                            ({"BR": 16, "BC": 8}, 2, 45), ({"BR": 8, "BC": 16}, 2, 45)])
def test_flash_attention_backward_matches_numpy(gpu, params, heads, t):
    q, k, v, do = (np.random.default_rng(t + i).standard_normal((heads, t, 64)).astype(np.float32) for i in range(4))
    o, lse, _ = gpu.attention(q, k, v, "attention_flash2_rows.wgsl")
    dq, dk, dv, _ = gpu.attention_backward(q, k, v, o, lse, do, params)
    for got, exact in zip((dq, dk, dv), webgpu.attention_backward_reference(q, k, v, do), strict=True):
        assert got.shape == exact.shape and got.dtype == np.float32
        np.testing.assert_allclose(got, exact, rtol=1e-4, atol=2e-5)


def test_the_backward_reference_is_autograds_gradient():
    torch = pytest.importorskip("torch")
    q, k, v, do = (torch.randn(2, 9, 16, dtype=torch.float64, requires_grad=i < 3) for i in range(4))
    torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True).backward(do)
    ours = webgpu.attention_backward_reference(*(x.detach().numpy() for x in (q, k, v, do)))
    for got, x in zip(ours, (q, k, v), strict=True):
        np.testing.assert_allclose(got, x.grad.numpy(), rtol=1e-12, atol=1e-12)


def test_attention_backward_checks_its_inputs(gpu):
    q = np.zeros((2, 8, 64), np.float32)
    lse = np.zeros((2, 8), np.float32)
    with pytest.raises(ValueError, match="one \\(heads, length, head size\\) shape"):
        gpu.attention_backward(q, q, q, q, lse, q[:, :4])
    with pytest.raises(ValueError, match=r"lse must have shape \(2, 8\)"):
        gpu.attention_backward(q, q, q, q, lse[:, :4], q)
    with pytest.raises(ValueError, match="written for head size D=64, got 32"):
        small = np.zeros((2, 8, 32), np.float32)
        gpu.attention_backward(small, small, small, small, lse, small)


def test_a_kernel_needing_subgroups_is_refused_by_name_where_they_are_missing(gpu, monkeypatch):
    wgsl = webgpu.source("attention_flash2_quads.wgsl")
    assert "\nenable subgroups;\n" in wgsl  # standard WGSL, as the browser needs it
    monkeypatch.setattr(gpu, "features", gpu.features - {"subgroups"})
    with pytest.raises(RuntimeError, match="needs the WebGPU feature subgroups"):
        gpu.compile(wgsl, "attention_flash2_quads.wgsl")


def test_attention_refuses_what_its_compiled_shape_cannot_hold(gpu):
    q = np.zeros((1, 40, 32), np.float32)
    with pytest.raises(ValueError, match="head size D=64, got 32"):
        gpu.attention(q, q, q, "attention_naive.wgsl")
    q = np.zeros((1, 40, 64), np.float32)
    with pytest.raises(ValueError, match="MAX_T=32 floats; T=40"):
        gpu.attention(q, q, q, "attention_naive.wgsl", {"MAX_T": 32})
    with pytest.raises(ValueError, match="16,640 bytes of private arrays"):  # before dispatch: no lost device
        gpu.attention(q, q, q, "attention_naive.wgsl", {"MAX_T": 4096})


def test_a_kernel_needing_more_workgroup_memory_than_offered_says_so(gpu):
    offered = gpu.limits["max-compute-workgroup-storage-size"]
    assert webgpu.resources(webgpu.source("matmul_8x8_unrolled_buffered.wgsl"))["workgroup_bytes"] <= offered
    wide = {"BR": 128, "BC": 128}  # 3 * 128 * 64 * 4 + 128 * 128 * 4 bytes: past any adapter's limit
    with pytest.raises(RuntimeError, match=rf"needs 163,840 bytes of workgroup memory; .* offers {offered:,}"):
        gpu.pipeline("attention_flash2.wgsl", wide)


def test_timing_reports_its_method(gpu):
    a = np.ones((64, 64), np.float32)
    c, timing = gpu.matmul(a, a, "matmul_tiled.wgsl", repeat=3)
    assert np.all(c == 64) and timing.runs == 3 and timing.median_ms > 0
    assert timing.method == ("timestamp-query" if "timestamp-query" in gpu.features else "wall-clock")


def test_shapes_are_checked_before_dispatch_in_the_readers_words(gpu):
    rng = np.random.default_rng(0)
    q = rng.standard_normal((4, 16, 64), dtype=np.float32)
    short = q[:, :8]  # keys and values half as long as the queries: no causal self-attention
    with pytest.raises(ValueError, match=r"same \(heads, length, head size\) shape"):
        gpu.attention(q, short, short)
    with pytest.raises(ValueError, match="q must have 3 dimensions"):
        gpu.attention(q[0], q[0], q[0])
    with pytest.raises(ValueError, match="a is empty"):
        gpu.matmul(np.zeros((0, 4), np.float32), np.zeros((4, 3), np.float32))
    with pytest.raises(ValueError, match="x must have 2 dimensions"):
        gpu.softmax(np.zeros(5, np.float32))
