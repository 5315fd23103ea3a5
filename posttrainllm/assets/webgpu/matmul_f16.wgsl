// Naive matmul with f16 weights: matmul_naive.wgsl with B stored as 16-bit floats.
// Needs the optional WebGPU feature "shader-f16"; the runtimes check for it and say so.
//
// B (the weights, in a model) takes half the bytes, and the naive kernel is bound by memory
// traffic, so halving B's bytes is a real gain here. Products are summed in f32: only the
// storage is 16-bit, as in mixed-precision inference.
enable f16;

const BN: u32 = 16u;
const BM: u32 = 16u;

struct Dims { M: u32, N: u32, K: u32, pad: u32 }

@group(0) @binding(0) var<storage, read> A: array<f32>;
@group(0) @binding(1) var<storage, read> B: array<f16>;
@group(0) @binding(2) var<storage, read_write> C: array<f32>;
@group(0) @binding(3) var<uniform> dims: Dims;

@compute @workgroup_size(BN, BM)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let row = gid.y;
    let col = gid.x;
    if (row >= dims.M || col >= dims.N) {
        return;
    }
    var acc = 0.0;
    for (var k = 0u; k < dims.K; k++) {
        acc += A[row * dims.K + k] * f32(B[k * dims.N + col]);
    }
    C[row * dims.N + col] = acc;
}
