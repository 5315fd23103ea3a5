"""The kernel sources and the two runtimes' reading of them, without a GPU: parameters,
constants, layouts and resource needs agree between posttrainllm/webgpu.py and
posttrainllm/assets/webgpu/runtime.js (run under node), and the browser cell carries everything it needs."""

import json
import shutil
import subprocess

import numpy as np
import pytest

from posttrainllm import webgpu
from tests.conftest import require

ALL = [v for kind in ("matmul", "softmax", "attention", "attention_backward") for v in webgpu.variants(kind)]


def test_every_kernel_file_is_raced_and_every_raced_file_exists():
    files = {p.name for p in webgpu.KERNELS.glob("*.wgsl")}
    assert files == {v["file"] for v in ALL}


def test_resources_are_read_from_the_source():
    assert webgpu.resources(webgpu.source("attention_flash2.wgsl")) == {
        "invocations": 256, "workgroup_bytes": 3 * 16 * 64 * 4 + 16 * 16 * 4, "private_array_bytes": 16}
    wide = webgpu.resources(webgpu.source("attention_flash2.wgsl", {"BR": 64, "BC": 64}))
    assert wide["workgroup_bytes"] == 65536 and wide["invocations"] == 4096  # over every WebGPU minimum limit
    naive = webgpu.resources(webgpu.source("attention_naive.wgsl", {"MAX_T": 4096}))
    assert naive["private_array_bytes"] == 4096 * 4 + 64 * 4  # the score row and the output row
    rows = webgpu.resources(webgpu.source("attention_flash2_rows.wgsl"))
    assert rows == {"invocations": 64, "workgroup_bytes": 2 * 32 * 64 * 4, "private_array_bytes": 0}


def test_a_private_row_past_the_limit_is_refused_in_the_readers_words():
    def private(max_t):
        return webgpu.resources(webgpu.source("attention_naive.wgsl", {"MAX_T": max_t}))["private_array_bytes"]

    webgpu.check_private_bytes("attention_naive.wgsl", private(2048))  # the largest that ran on the H200
    assert private(2048) == webgpu.PRIVATE_BYTES_LIMIT
    with pytest.raises(ValueError, match=r"16,640 bytes of private arrays.*stops at 8,448.*FlashAttention-2"):
        webgpu.check_private_bytes("attention_naive.wgsl", private(4096))


def test_excerpt_names_what_it_cannot_find():
    assert webgpu.excerpt("runtime.js", "export function bindings").endswith("\n}")
    with pytest.raises(ValueError, match="no line of runtime.js starts with 'nothing'"):
        webgpu.excerpt("runtime.js", "nothing")


def test_the_browser_cell_is_self_contained():
    html = webgpu.browser_cell("attention").data
    assert html.count("<script") == 1 and html.count("</script>") == 1  # sources inside cannot close it early
    for name in ("runtime.js", "cells.js", "attention_naive.wgsl", "attention_flash2.wgsl"):
        assert json.dumps(name) in html
    assert html == webgpu.browser_cell("attention").data  # deterministic: nbval compares it
    with pytest.raises(ValueError, match="choose 'matmul' or 'attention'"):
        webgpu.browser_cell("softmax")


def test_the_javascript_runtime_reads_kernels_as_python_does(tmp_path):
    node = shutil.which("node")
    require(node is not None, "node (apt-get install nodejs)")
    cases = [(v["file"], v["params"]) for v in ALL] + [("matmul_tiled.wgsl", {"TILE": 8})]
    script = tmp_path / "read.mjs"
    script.write_text(f"""
import {{readFileSync}} from "node:fs";
import * as rt from {json.dumps((webgpu.KERNELS / "runtime.js").as_uri())};
const cases = {json.dumps(cases)};
const out = cases.map(([file, params]) => {{
  const src = rt.withParams(readFileSync({json.dumps(str(webgpu.KERNELS))} + "/" + file, "utf8"), params);
  return [src, rt.constants(src), rt.bindings(src)];
}});
let refused = "";
try {{ rt.withParams("const TILE: u32 = 16u;", {{TIEL: 8}}); }} catch (err) {{ refused = err.message; }}
console.log(JSON.stringify({{out, refused, half: Array.from(rt.toHalfBits([1, -2, 65504, 1e-8, 0.1, 70000]))}}));
""")
    result = json.loads(subprocess.run([node, str(script)], check=True, capture_output=True, text=True).stdout)
    for (file, params), (src, consts, binds) in zip(cases, result["out"], strict=True):
        assert src == webgpu.source(file, params)
        assert consts == webgpu.constants(src)
        assert [tuple(b) for b in binds] == webgpu.bindings(src)
    assert "no parameter TIEL" in result["refused"] and "TILE" in result["refused"]
    with np.errstate(over="ignore"):  # 70000 is past fp16's largest value: it rounds to infinity
        expected = np.array([1, -2, 65504, 1e-8, 0.1, 70000], np.float32).astype(np.float16)
    assert result["half"] == expected.view(np.uint16).tolist()


def test_the_javascript_runtime_checks_shapes_before_dispatch(tmp_path):
    node = shutil.which("node")
    require(node is not None, "node (apt-get install nodejs)")
    script = tmp_path / "shapes.mjs"
    script.write_text(f"""
import {{readFileSync}} from "node:fs";
import * as rt from {json.dumps((webgpu.KERNELS / "runtime.js").as_uri())};
const kernel = {{consts: {{D: 64, BR: 16, BM: 16, BN: 16}}}};
const refuse = async (f) => {{ try {{ await f(); return "accepted"; }} catch (err) {{ return err.message; }} }};
const q = new Float32Array(4 * 16 * 64), short = new Float32Array(4 * 8 * 64);
const naive = readFileSync({json.dumps(str(webgpu.KERNELS / "attention_naive.wgsl"))}, "utf8");
console.log(JSON.stringify([
  await refuse(() => rt.attention(null, kernel, q, short, short, 4, 16, 64)),
  await refuse(() => rt.matmul(null, kernel, new Float32Array(0), new Float32Array(0), 0, 3, 4)),
  await refuse(() => rt.matmul(null, kernel, new Float32Array(6), new Float32Array(5), 2, 2, 3)),
  await refuse(() => rt.compile(null, rt.withParams(naive, {{MAX_T: 4096}}), "naive")),
  rt.PRIVATE_BYTES_LIMIT,
]));
""")
    shorter, empty, wrong, private, limit = json.loads(subprocess.run([node, str(script)], check=True,
                                                                      capture_output=True, text=True).stdout)
    assert shorter == "attention: k (H x T x D) holds 2048 numbers where its shape needs 4096"
    assert empty == "matmul: m must be a whole number of at least 1, got 0"
    assert wrong == "matmul: B (k x n) holds 5 numbers where its shape needs 6"
    # refused before any GPU is touched (there is none here), with the Python runtime's limit and words
    assert limit == webgpu.PRIVATE_BYTES_LIMIT
    with pytest.raises(ValueError) as python_error:
        webgpu.check_private_bytes("attention_naive.wgsl", 4 * (4096 + 64))
    assert private == str(python_error.value).replace("attention_naive.wgsl", "the naive kernel")
