// Register-blocked 8 x 8 matmul with conflict-free reads: matmul_vec4_8x8.wgsl with each
// invocation's eight columns of C split into two groups of four, half a tile apart.
// Row-major f32, C = A @ B; K and N multiples of 4 (ALIGN; the runtimes pad).
//
// Workgroup memory serves a warp's 16-byte reads eight invocations at a time, 128 bytes, from
// 32 banks of 4 bytes. In matmul_vec4_8x8.wgsl invocation x reads vec4s 2x and 2x + 1 of a row
// of Bs: eight neighbours read vec4s 0, 2, 4, ..., 14, which span 256 bytes, so every bank is
// asked twice and each read takes two passes. Here invocation x owns columns 4x .. 4x + 3 and
// BN/2 + 4x .. BN/2 + 4x + 3: eight neighbours read eight neighbouring vec4s, one pass. The reads
// of Bs happen at every step of the inner loop, 32 times as often as the writes
// matmul_8x8_conflict_free.wgsl fixed.

const BM: u32 = 128u;  // rows of C per workgroup: 16 invocations of 8 rows
const BN: u32 = 128u;  // columns of C per workgroup
const BK: u32 = 16u;  // depth of each staged slice (a multiple of 4)
const ALIGN: u32 = 4u;  // K and N must be multiples of this
const THREADS: u32 = (BM / 8u) * (BN / 8u);
const BM4: u32 = BM / 4u;
const BN4: u32 = BN / 4u;
const BK4: u32 = BK / 4u;

struct Dims { M: u32, N: u32, K: u32, pad: u32 }

@group(0) @binding(0) var<storage, read> A: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> B: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> C: array<vec4<f32>>;
@group(0) @binding(3) var<uniform> dims: Dims;

var<workgroup> As: array<vec4<f32>, BK * BM4>;  // four rows of A per vec4, as in matmul_vec4.wgsl
var<workgroup> Bs: array<vec4<f32>, BK * BN4>;

fn store(row: u32, col: u32, v: vec4<f32>) {  // one vec4 of C, if it is inside the matrix
    if (row < dims.M && col < dims.N) { C[row * (dims.N / 4u) + col / 4u] = v; }
}

@compute @workgroup_size(BN / 8u, BM / 8u)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
        @builtin(local_invocation_index) tid: u32) {
    let row0 = wid.y * BM;
    let col0 = wid.x * BN;
    let K4 = dims.K / 4u;
    let N4 = dims.N / 4u;
    var acc: array<vec4<f32>, 16>;  // acc[2 i + j]: row i of the block, columns 4j .. 4j + 3
    for (var t = 0u; t < dims.K; t += BK) {
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
        for (var k = 0u; k < BK; k++) {  // a0, a1: 8 rows of A's column k; b0, b1: 8 columns of B's row k
            let a0 = As[k * BM4 + lid.y * 2u];
            let a1 = As[k * BM4 + lid.y * 2u + 1u];
            let b0 = Bs[k * BN4 + lid.x];
            let b1 = Bs[k * BN4 + lid.x + BN4 / 2u];
            acc[0] = fma(vec4<f32>(a0.x), b0, acc[0]);
            acc[1] = fma(vec4<f32>(a0.x), b1, acc[1]);
            acc[2] = fma(vec4<f32>(a0.y), b0, acc[2]);
            acc[3] = fma(vec4<f32>(a0.y), b1, acc[3]);
            acc[4] = fma(vec4<f32>(a0.z), b0, acc[4]);
            acc[5] = fma(vec4<f32>(a0.z), b1, acc[5]);
            acc[6] = fma(vec4<f32>(a0.w), b0, acc[6]);
            acc[7] = fma(vec4<f32>(a0.w), b1, acc[7]);
            acc[8] = fma(vec4<f32>(a1.x), b0, acc[8]);
            acc[9] = fma(vec4<f32>(a1.x), b1, acc[9]);
            acc[10] = fma(vec4<f32>(a1.y), b0, acc[10]);
            acc[11] = fma(vec4<f32>(a1.y), b1, acc[11]);
            acc[12] = fma(vec4<f32>(a1.z), b0, acc[12]);
            acc[13] = fma(vec4<f32>(a1.z), b1, acc[13]);
            acc[14] = fma(vec4<f32>(a1.w), b0, acc[14]);
            acc[15] = fma(vec4<f32>(a1.w), b1, acc[15]);
        }
        workgroupBarrier();
    }
    store(row0 + lid.y * 8u + 0u, col0 + lid.x * 4u, acc[0]);
    store(row0 + lid.y * 8u + 0u, col0 + BN / 2u + lid.x * 4u, acc[1]);
    store(row0 + lid.y * 8u + 1u, col0 + lid.x * 4u, acc[2]);
    store(row0 + lid.y * 8u + 1u, col0 + BN / 2u + lid.x * 4u, acc[3]);
    store(row0 + lid.y * 8u + 2u, col0 + lid.x * 4u, acc[4]);
    store(row0 + lid.y * 8u + 2u, col0 + BN / 2u + lid.x * 4u, acc[5]);
    store(row0 + lid.y * 8u + 3u, col0 + lid.x * 4u, acc[6]);
    store(row0 + lid.y * 8u + 3u, col0 + BN / 2u + lid.x * 4u, acc[7]);
    store(row0 + lid.y * 8u + 4u, col0 + lid.x * 4u, acc[8]);
    store(row0 + lid.y * 8u + 4u, col0 + BN / 2u + lid.x * 4u, acc[9]);
    store(row0 + lid.y * 8u + 5u, col0 + lid.x * 4u, acc[10]);
    store(row0 + lid.y * 8u + 5u, col0 + BN / 2u + lid.x * 4u, acc[11]);
    store(row0 + lid.y * 8u + 6u, col0 + lid.x * 4u, acc[12]);
    store(row0 + lid.y * 8u + 6u, col0 + BN / 2u + lid.x * 4u, acc[13]);
    store(row0 + lid.y * 8u + 7u, col0 + lid.x * 4u, acc[14]);
    store(row0 + lid.y * 8u + 7u, col0 + BN / 2u + lid.x * 4u, acc[15]);
}
