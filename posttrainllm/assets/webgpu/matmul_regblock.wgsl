// Register-blocked matmul, written with loops: each invocation computes a TM x TN block of C.
// Row-major f32, C = A @ B (M x K times K x N). Defaults: 4 x 4 per invocation, 64 x 64 per
// workgroup; the "8 x 8" variant sets TM = TN = 8, BM = BN = 128, BK = 8.
//
// The tiled kernel does one multiply-add per two workgroup-memory reads. Here, per step k, an
// invocation reads TM values of A and TN values of B into registers and does TM * TN
// multiply-adds with them: 16 per 8 reads at 4 x 4, 64 per 16 at 8 x 8. The price is registers:
// TM * TN accumulators per invocation, and a GPU that runs out of registers spills them to
// memory and loses the gain (the seed's 8 x 8 gotcha).
//
// This is the plain way to write it, and it teaches the second lesson: `acc`, `a_reg` and
// `b_reg` are indexed by loop counters, so unless the compiler unrolls every loop they must
// live in addressable local memory, not registers. On an H200's Vulkan driver this kernel is
// slower than the naive one. matmul_vec4.wgsl and matmul_vec4_8x8.wgsl do the same
// arithmetic with constant indices and run 40-70x faster than this one there.

const BM: u32 = 64u;  // rows of C per workgroup
const BN: u32 = 64u;  // columns of C per workgroup
const BK: u32 = 16u;  // depth of each staged slice of A and B
const TM: u32 = 4u;   // rows of C per invocation
const TN: u32 = 4u;   // columns of C per invocation
const THREADS: u32 = (BM / TM) * (BN / TN);

struct Dims { M: u32, N: u32, K: u32, pad: u32 }

@group(0) @binding(0) var<storage, read> A: array<f32>;
@group(0) @binding(1) var<storage, read> B: array<f32>;
@group(0) @binding(2) var<storage, read_write> C: array<f32>;
@group(0) @binding(3) var<uniform> dims: Dims;

var<workgroup> As: array<f32, BK * BM>;  // transposed: As[k * BM + r], so a column of A is contiguous
var<workgroup> Bs: array<f32, BK * BN>;  // Bs[k * BN + c]

@compute @workgroup_size(BN / TN, BM / TM)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
        @builtin(local_invocation_index) tid: u32) {
    let row0 = wid.y * BM;  // this workgroup's block of C
    let col0 = wid.x * BN;
    var acc: array<f32, TM * TN>;  // zero-initialised, lives in registers
    var a_reg: array<f32, TM>;
    var b_reg: array<f32, TN>;
    for (var t = 0u; t < dims.K; t += BK) {
        // All THREADS invocations load the BM x BK slice of A and the BK x BN slice of B
        // together, one element per invocation per round; zeros outside the matrices.
        for (var i = tid; i < BM * BK; i += THREADS) {
            let r = i / BK;
            let k = i % BK;
            var v = 0.0;
            if (row0 + r < dims.M && t + k < dims.K) { v = A[(row0 + r) * dims.K + t + k]; }
            As[k * BM + r] = v;
        }
        for (var i = tid; i < BK * BN; i += THREADS) {
            let k = i / BN;
            let c = i % BN;
            var v = 0.0;
            if (t + k < dims.K && col0 + c < dims.N) { v = B[(t + k) * dims.N + col0 + c]; }
            Bs[k * BN + c] = v;
        }
        workgroupBarrier();
        for (var k = 0u; k < BK; k++) {
            for (var i = 0u; i < TM; i++) { a_reg[i] = As[k * BM + lid.y * TM + i]; }
            for (var j = 0u; j < TN; j++) { b_reg[j] = Bs[k * BN + lid.x * TN + j]; }
            for (var i = 0u; i < TM; i++) {  // the outer product of a column and a row
                for (var j = 0u; j < TN; j++) {
                    acc[i * TN + j] += a_reg[i] * b_reg[j];
                }
            }
        }
        workgroupBarrier();
    }
    for (var i = 0u; i < TM; i++) {
        let row = row0 + lid.y * TM + i;
        for (var j = 0u; j < TN; j++) {
            let col = col0 + lid.x * TN + j;
            if (row < dims.M && col < dims.N) { C[row * dims.N + col] = acc[i * TN + j]; }
        }
    }
}
