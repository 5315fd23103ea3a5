// Register-blocked 8 x 8 matmul, unrolled and double-buffered: matmul_8x8_unrolled.wgsl with
// the slices of A and B staged as in matmul_8x8_buffered.wgsl. Row-major f32, C = A @ B; K and N
// multiples of 4.
//
// Double-buffering alone changed nothing measurable: while the inner loop spent its time on the
// loop counter and index arithmetic, waiting for memory was not what held it back. Once the
// loop is written out, it is: reading the next slice into registers before multiplying this
// one, and writing it to the other half of As and Bs (one barrier per slice instead of two),
// made this the fastest kernel of the race on the H200 (the WebGPU chapter's table).
// Written out for 128 x 128 x 16 with 256 invocations: each reads exactly two vec4s of A and two
// of B per slice, and step() is called sixteen times.

const BM: u32 = 128u;  // rows of C per workgroup: 16 invocations of 8 rows
const BN: u32 = 128u;  // columns of C per workgroup
const BK: u32 = 16u;  // depth of each staged slice
const ALIGN: u32 = 4u;  // K and N must be multiples of this
const THREADS: u32 = (BM / 8u) * (BN / 8u);
const BM4: u32 = BM / 4u;
const BN4: u32 = BN / 4u;
const BK4: u32 = BK / 4u;
const STAGE_A: u32 = BK * BM4;  // vec4s in one buffer of As
const STAGE_B: u32 = BK * BN4;

struct Dims { M: u32, N: u32, K: u32, pad: u32 }

@group(0) @binding(0) var<storage, read> A: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> B: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> C: array<vec4<f32>>;
@group(0) @binding(3) var<uniform> dims: Dims;

var<workgroup> As: array<vec4<f32>, 2u * STAGE_A>;  // two buffers, four rows of A per vec4
var<workgroup> Bs: array<vec4<f32>, 2u * STAGE_B>;

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
    let r = i / BK4;
    let base = stage * STAGE_A + 4u * (i % BK4) * BM4 + r / 4u;
    let lane = r % 4u;
    As[base][lane] = v.x;
    As[base + BM4][lane] = v.y;
    As[base + 2u * BM4][lane] = v.z;
    As[base + 3u * BM4][lane] = v.w;
}

// One step k of the inner loop: 8 rows of A's column k times 8 columns of B's row k.
fn step(acc: ptr<function, array<vec4<f32>, 16>>, k: u32, x: u32, y: u32, a_at: u32, b_at: u32) {
    let a0 = As[a_at + k * BM4 + y * 2u];
    let a1 = As[a_at + k * BM4 + y * 2u + 1u];
    let b0 = Bs[b_at + k * BN4 + x];
    let b1 = Bs[b_at + k * BN4 + x + BN4 / 2u];
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

@compute @workgroup_size(BN / 8u, BM / 8u)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
        @builtin(local_invocation_index) tid: u32) {
    let row0 = wid.y * BM;
    let col0 = wid.x * BN;
    var acc: array<vec4<f32>, 16>;  // acc[2 i + j]: row i of the block, columns 4j .. 4j + 3
    // slice 0 into buffer 0
    write_a(0u, tid, read_a(row0, 0u, tid));
    write_a(0u, tid + THREADS, read_a(row0, 0u, tid + THREADS));
    Bs[tid] = read_b(col0, 0u, tid);
    Bs[tid + THREADS] = read_b(col0, 0u, tid + THREADS);
    workgroupBarrier();
    var stage = 0u;
    for (var t = 0u; t < dims.K; t += BK) {
        // start reading the next slice; its values are not needed until after the multiply-adds
        let next = t + BK;
        let next_a0 = read_a(row0, next, tid);
        let next_a1 = read_a(row0, next, tid + THREADS);
        let next_b0 = read_b(col0, next, tid);
        let next_b1 = read_b(col0, next, tid + THREADS);
        let a_at = stage * STAGE_A;
        let b_at = stage * STAGE_B;
        step(&acc, 0u, lid.x, lid.y, a_at, b_at);
        step(&acc, 1u, lid.x, lid.y, a_at, b_at);
        step(&acc, 2u, lid.x, lid.y, a_at, b_at);
        step(&acc, 3u, lid.x, lid.y, a_at, b_at);
        step(&acc, 4u, lid.x, lid.y, a_at, b_at);
        step(&acc, 5u, lid.x, lid.y, a_at, b_at);
        step(&acc, 6u, lid.x, lid.y, a_at, b_at);
        step(&acc, 7u, lid.x, lid.y, a_at, b_at);
        step(&acc, 8u, lid.x, lid.y, a_at, b_at);
        step(&acc, 9u, lid.x, lid.y, a_at, b_at);
        step(&acc, 10u, lid.x, lid.y, a_at, b_at);
        step(&acc, 11u, lid.x, lid.y, a_at, b_at);
        step(&acc, 12u, lid.x, lid.y, a_at, b_at);
        step(&acc, 13u, lid.x, lid.y, a_at, b_at);
        step(&acc, 14u, lid.x, lid.y, a_at, b_at);
        step(&acc, 15u, lid.x, lid.y, a_at, b_at);
        // the next slice into the other buffer, which nobody reads in this iteration
        stage = 1u - stage;
        write_a(stage, tid, next_a0);
        write_a(stage, tid + THREADS, next_a1);
        Bs[stage * STAGE_B + tid] = next_b0;
        Bs[stage * STAGE_B + tid + THREADS] = next_b1;
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
