// Tiled matmul with f16 weights: matmul_tiled.wgsl with B stored as 16-bit floats and
// widened to f32 as it enters workgroup memory. Needs "shader-f16".
//
// The seed's gotcha, measurable here: f16 weights speed up the naive kernel, which reads B
// from storage K times per column, but gain little or nothing once tiling has already cut
// storage reads by TILE — the saving is on traffic that tiling removed anyway.
enable f16;

const TILE: u32 = 16u;
const BM: u32 = TILE;
const BN: u32 = TILE;

struct Dims { M: u32, N: u32, K: u32, pad: u32 }

@group(0) @binding(0) var<storage, read> A: array<f32>;
@group(0) @binding(1) var<storage, read> B: array<f16>;
@group(0) @binding(2) var<storage, read_write> C: array<f32>;
@group(0) @binding(3) var<uniform> dims: Dims;

var<workgroup> As: array<f32, TILE * TILE>;
var<workgroup> Bs: array<f32, TILE * TILE>;

@compute @workgroup_size(TILE, TILE)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let row = gid.y;
    let col = gid.x;
    var acc = 0.0;
    for (var t = 0u; t < dims.K; t += TILE) {
        let ak = t + lid.x;
        let bk = t + lid.y;
        var a = 0.0;
        var b = 0.0;
        if (row < dims.M && ak < dims.K) { a = A[row * dims.K + ak]; }
        if (bk < dims.K && col < dims.N) { b = f32(B[bk * dims.N + col]); }
        As[lid.y * TILE + lid.x] = a;
        Bs[lid.y * TILE + lid.x] = b;
        workgroupBarrier();
        for (var k = 0u; k < TILE; k++) {
            acc += As[lid.y * TILE + k] * Bs[k * TILE + lid.x];
        }
        workgroupBarrier();
    }
    if (row < dims.M && col < dims.N) {
        C[row * dims.N + col] = acc;
    }
}
