// Register-blocked 8 x 8 matmul, unrolled and double-buffered, with every workgroup-memory index
// in the inner loop one the compiler can fold: matmul_8x8_unrolled_buffered.wgsl with As and Bs
// as arrays of [buffer][depth][vec4] and the main loop written out for both buffers. Row-major
// f32, C = A @ B; K and N multiples of 4.
//
// WGSL never reads outside an array: for an index it cannot check when it compiles, the WebGPU
// implementation clamps the index to the array's last element at run time (wgpu's shader
// translator, naga, does so for every array outside a storage buffer). In the previous kernel
// each read of As or Bs is As[a_at + k * BM4 + y * 2u], one index that changes with the buffer
// in use, so every one of the sixteen steps pays an add and a clamp per read, and the address
// cannot ride in the load instruction's constant offset. Here the buffer and the step are
// constants once step() is inlined, each index is clamped on its own, and the one index that
// depends on the invocation (y * 2u, x) is the same in every iteration, so a compiler can clamp
// it once, before the loop, and read at a base register plus a constant. (The gain is measured;
// what the driver's compiler made of it is not visible through WebGPU.)

const BM: u32 = 128u;  // rows of C per workgroup: 16 invocations of 8 rows
const BN: u32 = 128u;  // columns of C per workgroup
const BK: u32 = 16u;  // depth of each staged slice
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

var<workgroup> As: array<array<array<vec4<f32>, BM4>, BK>, 2>;  // [buffer][k]: column k of A, four rows per vec4
var<workgroup> Bs: array<array<array<vec4<f32>, BN4>, BK>, 2>;  // [buffer][k]: row k of B

fn store(row: u32, col: u32, v: vec4<f32>) {  // one vec4 of C, if it is inside the matrix
    if (row < dims.M && col < dims.N) { C[row * (dims.N / 4u) + col / 4u] = v; }
}

fn read_a(row0: u32, t: u32, i: u32) -> vec4<f32> {  // vec4 i of the BM x BK slice of A at depth t
    let r = i / BK4;
    let k4 = i % BK4;
    if (row0 + r < dims.M && t + 4u * k4 < dims.K) { return A[(row0 + r) * (dims.K / 4u) + t / 4u + k4]; }
    return vec4<f32>(0.0);
}

fn read_b(col0: u32, t: u32, i: u32) -> vec4<f32> {  // vec4 i of the BK x BN slice of B at depth t
    let k = i / BN4;
    let c4 = i % BN4;
    if (t + k < dims.K && col0 + 4u * c4 < dims.N) { return B[(t + k) * (dims.N / 4u) + col0 / 4u + c4]; }
    return vec4<f32>(0.0);
}

fn write_a(stage: u32, i: u32, v: vec4<f32>) {  // transposed: As holds columns of A, four rows per vec4
    let k = 4u * (i % BK4);
    let r = i / BK4;
    As[stage][k][r / 4u][r % 4u] = v.x;
    As[stage][k + 1u][r / 4u][r % 4u] = v.y;
    As[stage][k + 2u][r / 4u][r % 4u] = v.z;
    As[stage][k + 3u][r / 4u][r % 4u] = v.w;
}

fn write_b(stage: u32, i: u32, v: vec4<f32>) {
    Bs[stage][i / BN4][i % BN4] = v;
}

// One step k of the inner loop on buffer s: 8 rows of A's column k times 8 columns of B's row k.
fn step(acc: ptr<function, array<vec4<f32>, 16>>, s: u32, k: u32, x: u32, y: u32) {
    let a0 = As[s][k][y * 2u];
    let a1 = As[s][k][y * 2u + 1u];
    let b0 = Bs[s][k][x];
    let b1 = Bs[s][k][x + BN4 / 2u];
    (*acc)[0] = fma(vec4<f32>(a0.x), b0, (*acc)[0]);
    (*acc)[1] = fma(vec4<f32>(a0.x), b1, (*acc)[1]);
    (*acc)[2] = fma(vec4<f32>(a0.y), b0, (*acc)[2]);
    (*acc)[3] = fma(vec4<f32>(a0.y), b1, (*acc)[3]);
    (*acc)[4] = fma(vec4<f32>(a0.z), b0, (*acc)[4]);
    (*acc)[5] = fma(vec4<f32>(a0.z), b1, (*acc)[5]);
    (*acc)[6] = fma(vec4<f32>(a0.w), b0, (*acc)[6]);
    (*acc)[7] = fma(vec4<f32>(a0.w), b1, (*acc)[7]);
    (*acc)[8] = fma(vec4<f32>(a1.x), b0, (*acc)[8]);
    (*acc)[9] = fma(vec4<f32>(a1.x), b1, (*acc)[9]);
    (*acc)[10] = fma(vec4<f32>(a1.y), b0, (*acc)[10]);
    (*acc)[11] = fma(vec4<f32>(a1.y), b1, (*acc)[11]);
    (*acc)[12] = fma(vec4<f32>(a1.z), b0, (*acc)[12]);
    (*acc)[13] = fma(vec4<f32>(a1.z), b1, (*acc)[13]);
    (*acc)[14] = fma(vec4<f32>(a1.w), b0, (*acc)[14]);
    (*acc)[15] = fma(vec4<f32>(a1.w), b1, (*acc)[15]);
}

// Multiply-add the slice in buffer s: sixteen steps, each with constant buffer and depth.
fn slice(acc: ptr<function, array<vec4<f32>, 16>>, s: u32, x: u32, y: u32) {
    step(acc, s, 0u, x, y);
    step(acc, s, 1u, x, y);
    step(acc, s, 2u, x, y);
    step(acc, s, 3u, x, y);
    step(acc, s, 4u, x, y);
    step(acc, s, 5u, x, y);
    step(acc, s, 6u, x, y);
    step(acc, s, 7u, x, y);
    step(acc, s, 8u, x, y);
    step(acc, s, 9u, x, y);
    step(acc, s, 10u, x, y);
    step(acc, s, 11u, x, y);
    step(acc, s, 12u, x, y);
    step(acc, s, 13u, x, y);
    step(acc, s, 14u, x, y);
    step(acc, s, 15u, x, y);
}

// Read slice t of A and B into buffer s (the reads are issued before the caller's multiply-adds
// of the other buffer, and written after them, as in the previous kernel).
struct Staged { a0: vec4<f32>, a1: vec4<f32>, b0: vec4<f32>, b1: vec4<f32> }

fn fetch(row0: u32, col0: u32, t: u32, tid: u32) -> Staged {
    return Staged(read_a(row0, t, tid), read_a(row0, t, tid + THREADS), read_b(col0, t, tid), read_b(col0, t, tid + THREADS));
}

fn stash(s: u32, tid: u32, v: Staged) {
    write_a(s, tid, v.a0);
    write_a(s, tid + THREADS, v.a1);
    write_b(s, tid, v.b0);
    write_b(s, tid + THREADS, v.b1);
}

@compute @workgroup_size(BN / 8u, BM / 8u)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
        @builtin(local_invocation_index) tid: u32) {
    let row0 = wid.y * BM;
    let col0 = wid.x * BN;
    var acc: array<vec4<f32>, 16>;  // acc[2 i + j]: row i of the block, columns 4j .. 4j + 3
    stash(0u, tid, fetch(row0, col0, 0u, tid));
    workgroupBarrier();
    // two slices per iteration, one from each buffer, so that the buffer is a constant
    for (var t = 0u; t < dims.K; t += 2u * BK) {
        let odd = fetch(row0, col0, t + BK, tid);
        slice(&acc, 0u, lid.x, lid.y);
        stash(1u, tid, odd);
        workgroupBarrier();
        if (t + BK >= dims.K) { break; }
        let even = fetch(row0, col0, t + 2u * BK, tid);
        slice(&acc, 1u, lid.x, lid.y);
        stash(0u, tid, even);
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
