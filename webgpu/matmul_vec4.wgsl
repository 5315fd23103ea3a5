// Register-blocked matmul with vec4 memory access: the register-blocked kernel
// (matmul_regblock.wgsl) reading and writing four floats per instruction.
// Row-major f32, C = A @ B (M x K times K x N).
//
// A GPU moves 16 bytes per load about as fast as 4, so vec4 loads cut the number of memory
// instructions by four, and vec4 accumulators let one instruction do four multiply-adds.
// The catch is alignment: rows must be whole vec4s, so K and N must be multiples of 4. The
// runtimes zero-pad A and B to that (ALIGN below tells them) and drop the padding from C.

const BM: u32 = 64u;
const BN: u32 = 64u;
const BK: u32 = 16u;
const TM: u32 = 4u;
const TN: u32 = 4u;      // a multiple of 4: TN / 4 vec4 columns per invocation
const ALIGN: u32 = 4u;   // K and N must be multiples of this
const THREADS: u32 = (BM / TM) * (BN / TN);
const TN4: u32 = TN / 4u;
const BN4: u32 = BN / 4u;
const BK4: u32 = BK / 4u;

struct Dims { M: u32, N: u32, K: u32, pad: u32 }

@group(0) @binding(0) var<storage, read> A: array<vec4<f32>>;  // M rows of K / 4 vec4s
@group(0) @binding(1) var<storage, read> B: array<vec4<f32>>;  // K rows of N / 4 vec4s
@group(0) @binding(2) var<storage, read_write> C: array<vec4<f32>>;
@group(0) @binding(3) var<uniform> dims: Dims;

var<workgroup> As: array<f32, BK * BM>;         // transposed, as in matmul_regblock.wgsl
var<workgroup> Bs: array<vec4<f32>, BK * BN4>;

@compute @workgroup_size(BN / TN, BM / TM)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
        @builtin(local_invocation_index) tid: u32) {
    let row0 = wid.y * BM;
    let col0 = wid.x * BN;
    let K4 = dims.K / 4u;
    let N4 = dims.N / 4u;
    var acc: array<vec4<f32>, TM * TN4>;
    var a_reg: array<f32, TM>;
    var b_reg: array<vec4<f32>, TN4>;
    for (var t = 0u; t < dims.K; t += BK) {
        for (var i = tid; i < BM * BK4; i += THREADS) {
            let r = i / BK4;
            let k4 = i % BK4;
            var v = vec4<f32>(0.0);
            if (row0 + r < dims.M && t + 4u * k4 < dims.K) { v = A[(row0 + r) * K4 + t / 4u + k4]; }
            for (var q = 0u; q < 4u; q++) { As[(4u * k4 + q) * BM + r] = v[q]; }
        }
        for (var i = tid; i < BK * BN4; i += THREADS) {
            let k = i / BN4;
            let c4 = i % BN4;
            var v = vec4<f32>(0.0);
            if (t + k < dims.K && col0 + 4u * c4 < dims.N) { v = B[(t + k) * N4 + col0 / 4u + c4]; }
            Bs[k * BN4 + c4] = v;
        }
        workgroupBarrier();
        for (var k = 0u; k < BK; k++) {
            for (var i = 0u; i < TM; i++) { a_reg[i] = As[k * BM + lid.y * TM + i]; }
            for (var j = 0u; j < TN4; j++) { b_reg[j] = Bs[k * BN4 + lid.x * TN4 + j]; }
            for (var i = 0u; i < TM; i++) {
                for (var j = 0u; j < TN4; j++) {
                    acc[i * TN4 + j] = fma(vec4<f32>(a_reg[i]), b_reg[j], acc[i * TN4 + j]);
                }
            }
        }
        workgroupBarrier();
    }
    for (var i = 0u; i < TM; i++) {
        let row = row0 + lid.y * TM + i;
        for (var j = 0u; j < TN4; j++) {
            let col = col0 + (lid.x * TN4 + j) * 4u;
            if (row < dims.M && col < dims.N) { C[row * N4 + col / 4u] = acc[i * TN4 + j]; }
        }
    }
}
