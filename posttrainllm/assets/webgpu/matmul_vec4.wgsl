// Register-blocked matmul with vec4 access and unrolled registers: each invocation computes
// a 4 x 4 block of C held in four vec4 variables. Row-major f32, C = A @ B (M x K times K x N).
//
// Same plan as matmul_regblock.wgsl, written the way GPU compilers need it:
// - every load and store moves a vec4 (16 bytes), a quarter of the memory instructions;
// - the accumulators are four named vec4s, not an array indexed by a loop counter. A private
//   array indexed by a variable must be addressable, so the driver keeps it in (slow) local
//   memory — measured on an H200, the loop-indexed kernel is slower than the naive one, and
//   this one about 40x faster than it (book: the WebGPU chapter and the benchmarks page).
// - As holds four rows of A per vec4, so one workgroup-memory read feeds a whole column of the
//   4 x 4 outer product: 2 reads and 4 vec4 fma instructions (16 multiply-adds) per step k.
// Rows must be whole vec4s, so K and N must be multiples of 4 (ALIGN): the runtimes zero-pad
// A and B and drop the padding from C.

const BM: u32 = 64u;   // rows of C per workgroup
const BN: u32 = 64u;   // columns of C per workgroup
const BK: u32 = 16u;   // depth of each staged slice (a multiple of 4)
const ALIGN: u32 = 4u;  // K and N must be multiples of this
const THREADS: u32 = (BM / 4u) * (BN / 4u);
const BM4: u32 = BM / 4u;
const BN4: u32 = BN / 4u;
const BK4: u32 = BK / 4u;

struct Dims { M: u32, N: u32, K: u32, pad: u32 }

@group(0) @binding(0) var<storage, read> A: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> B: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> C: array<vec4<f32>>;
@group(0) @binding(3) var<uniform> dims: Dims;

var<workgroup> As: array<vec4<f32>, BK * BM4>;  // As[k * BM4 + q] = A[rows 4q .. 4q + 3 of the block, column k]
var<workgroup> Bs: array<vec4<f32>, BK * BN4>;

@compute @workgroup_size(BN4, BM4)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
        @builtin(local_invocation_index) tid: u32) {
    let row0 = wid.y * BM;
    let col0 = wid.x * BN;
    let K4 = dims.K / 4u;
    let N4 = dims.N / 4u;
    var acc0 = vec4<f32>(0.0);
    var acc1 = vec4<f32>(0.0);
    var acc2 = vec4<f32>(0.0);
    var acc3 = vec4<f32>(0.0);
    for (var t = 0u; t < dims.K; t += BK) {
        // Stage the BM x BK slice of A (read as vec4s along K, stored transposed: four rows per
        // vec4) and the BK x BN slice of B, zeros outside the matrices.
        for (var i = tid; i < BM * BK4; i += THREADS) {
            let r = i / BK4;
            let k4 = i % BK4;
            var v = vec4<f32>(0.0);
            if (row0 + r < dims.M && t + 4u * k4 < dims.K) { v = A[(row0 + r) * K4 + t / 4u + k4]; }
            let base = 4u * k4 * BM4 + r / 4u;
            let lane = r % 4u;
            As[base][lane] = v.x;
            As[base + BM4][lane] = v.y;
            As[base + 2u * BM4][lane] = v.z;
            As[base + 3u * BM4][lane] = v.w;
        }
        for (var i = tid; i < BK * BN4; i += THREADS) {
            let k = i / BN4;
            let c4 = i % BN4;
            var v = vec4<f32>(0.0);
            if (t + k < dims.K && col0 + 4u * c4 < dims.N) { v = B[(t + k) * N4 + col0 / 4u + c4]; }
            Bs[k * BN4 + c4] = v;
        }
        workgroupBarrier();
        for (var k = 0u; k < BK; k++) {  // C block += A column k (4 rows) x B row k (4 columns)
            let a = As[k * BM4 + lid.y];
            let b = Bs[k * BN4 + lid.x];
            acc0 = fma(vec4<f32>(a.x), b, acc0);
            acc1 = fma(vec4<f32>(a.y), b, acc1);
            acc2 = fma(vec4<f32>(a.z), b, acc2);
            acc3 = fma(vec4<f32>(a.w), b, acc3);
        }
        workgroupBarrier();
    }
    let row = row0 + lid.y * 4u;
    let col = col0 + lid.x * 4u;
    if (col < dims.N) {
        if (row < dims.M) { C[row * N4 + col / 4u] = acc0; }
        if (row + 1u < dims.M) { C[(row + 1u) * N4 + col / 4u] = acc1; }
        if (row + 2u < dims.M) { C[(row + 2u) * N4 + col / 4u] = acc2; }
        if (row + 3u < dims.M) { C[(row + 3u) * N4 + col / 4u] = acc3; }
    }
}
