// Tiled matmul: each workgroup computes one TILE x TILE block of C, staging TILE x TILE
// blocks of A and B in workgroup (shared) memory. Row-major f32, C = A @ B (M x K times K x N).
//
// The naive kernel loads every element of A and B from storage memory N or M times. Here each
// element is loaded from storage once per workgroup that needs it and then read TILE times from
// fast workgroup memory: storage traffic falls by a factor of TILE.

const TILE: u32 = 16u;  // TILE * TILE invocations per workgroup (at most 256 on SwiftShader)
const BM: u32 = TILE;   // rows of C per workgroup
const BN: u32 = TILE;   // columns of C per workgroup

struct Dims { M: u32, N: u32, K: u32, pad: u32 }

@group(0) @binding(0) var<storage, read> A: array<f32>;
@group(0) @binding(1) var<storage, read> B: array<f32>;
@group(0) @binding(2) var<storage, read_write> C: array<f32>;
@group(0) @binding(3) var<uniform> dims: Dims;

var<workgroup> As: array<f32, TILE * TILE>;  // As[r * TILE + k] = A[block row + r, tile k]
var<workgroup> Bs: array<f32, TILE * TILE>;  // Bs[k * TILE + c] = B[tile k, block col + c]

@compute @workgroup_size(TILE, TILE)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let row = gid.y;
    let col = gid.x;
    var acc = 0.0;
    for (var t = 0u; t < dims.K; t += TILE) {
        // Every invocation loads one element of each tile; outside the matrix it loads 0,
        // so the edges need no special case in the inner loop (sizes need not divide TILE).
        let ak = t + lid.x;
        let bk = t + lid.y;
        var a = 0.0;
        var b = 0.0;
        if (row < dims.M && ak < dims.K) { a = A[row * dims.K + ak]; }
        if (bk < dims.K && col < dims.N) { b = B[bk * dims.N + col]; }
        As[lid.y * TILE + lid.x] = a;
        Bs[lid.y * TILE + lid.x] = b;
        workgroupBarrier();  // the whole tile is loaded before anyone reads it
        for (var k = 0u; k < TILE; k++) {
            acc += As[lid.y * TILE + k] * Bs[k * TILE + lid.x];
        }
        workgroupBarrier();  // everyone is done reading before the next tile overwrites it
    }
    if (row < dims.M && col < dims.N) {
        C[row * dims.N + col] = acc;
    }
}
