// Naive matmul: C = A @ B, one invocation per element of C.
// Row-major f32: A is M x K, B is K x N, C is M x N. Read book/webgpu-execution-model.md first.
//
// Every invocation reads a whole row of A and a whole column of B straight from storage
// (global) memory: 2K loads for 2K flops, so the kernel is bound by memory, not arithmetic.
// Neighbouring invocations (consecutive gid.x) read neighbouring elements of B's row, which
// the hardware coalesces; the row of A is the same for the whole row of threads.

// Parameters: `const` lines the runtimes rewrite (webgpu/runtime.js, posttrainllm.webgpu).
const BN: u32 = 16u;  // columns of C per workgroup (workgroup width)
const BM: u32 = 16u;  // rows of C per workgroup (workgroup height)

struct Dims { M: u32, N: u32, K: u32, pad: u32 }

@group(0) @binding(0) var<storage, read> A: array<f32>;
@group(0) @binding(1) var<storage, read> B: array<f32>;
@group(0) @binding(2) var<storage, read_write> C: array<f32>;
@group(0) @binding(3) var<uniform> dims: Dims;

@compute @workgroup_size(BN, BM)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let row = gid.y;
    let col = gid.x;
    // The grid is rounded up to whole workgroups: invocations past the edge do nothing.
    if (row >= dims.M || col >= dims.N) {
        return;
    }
    var acc = 0.0;
    for (var k = 0u; k < dims.K; k++) {
        acc += A[row * dims.K + k] * B[k * dims.N + col];
    }
    C[row * dims.N + col] = acc;
}
