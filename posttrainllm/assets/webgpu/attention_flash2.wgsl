// FlashAttention-2 style causal attention forward (Dao, 2023): tiles of BR queries against
// tiles of BC keys, softmax computed online, the T x T score matrix never stored.
// Q, K, V and O are H x T x D, row-major f32; L (H x T) gets each row's logsumexp.
//
// A workgroup owns BR query rows of one head and walks the key/value rows in tiles of BC,
// staged in workgroup memory, so each K and V row is read from storage once per *tile* of
// queries instead of once per query. Per query row it keeps the running maximum m, the running
// denominator l and the unnormalised output o (online softmax, as in softmax_online.wgsl);
// each new tile rescales them by exp(m_old - m_new). The division by l happens once, at the end
// (FA2's change from FA1). Invocation (r, c) computes score (r, c) of a tile and owns D / BC
// columns of row r's output, as vec4s in registers.
//
// The seed's gotcha: BR = BC = 16 was hard-coded, and wider tiles ran out of registers on
// Apple GPUs. Here they are parameters; BR * BC invocations, D a multiple of 4 * BC.

const D: u32 = 64u;
const BR: u32 = 16u;  // query rows per workgroup
const BC: u32 = 16u;  // key rows per tile
const D4: u32 = D / 4u;
const DV: u32 = D4 / BC;  // vec4 output columns per invocation
const THREADS: u32 = BR * BC;

struct Dims { H: u32, T: u32, pad0: u32, pad1: u32 }

@group(0) @binding(0) var<storage, read> Q: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> K: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> V: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> O: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read_write> L: array<f32>;
@group(0) @binding(5) var<uniform> dims: Dims;

var<workgroup> Qs: array<vec4<f32>, BR * D4>;
var<workgroup> Ks: array<vec4<f32>, BC * D4>;
var<workgroup> Vs: array<vec4<f32>, BC * D4>;
var<workgroup> S: array<f32, BR * BC>;

@compute @workgroup_size(BC, BR)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
        @builtin(local_invocation_index) tid: u32) {
    let h = wid.y;
    let r = lid.y;
    let c = lid.x;
    let row0 = wid.x * BR;
    let query = row0 + r;
    let head = h * dims.T * D4;
    let scale = 1.0 / sqrt(f32(D));
    for (var i = tid; i < BR * D4; i += THREADS) {
        var v = vec4<f32>(0.0);
        if (row0 + i / D4 < dims.T) { v = Q[head + row0 * D4 + i]; }
        Qs[i] = v;
    }
    var m = -3.0e38;
    var l = 0.0;
    var o: array<vec4<f32>, DV>;
    // causal: tiles past the last query of this workgroup are all masked, so stop before them
    let last = min(dims.T - 1u, row0 + BR - 1u) / BC;
    for (var kb = 0u; kb <= last; kb++) {
        let key0 = kb * BC;
        for (var i = tid; i < BC * D4; i += THREADS) {
            var kv = vec4<f32>(0.0);
            var vv = vec4<f32>(0.0);
            if (key0 + i / D4 < dims.T) {
                kv = K[head + key0 * D4 + i];
                vv = V[head + key0 * D4 + i];
            }
            Ks[i] = kv;
            Vs[i] = vv;
        }
        workgroupBarrier();
        var score = 0.0;
        for (var d = 0u; d < D4; d++) { score += dot(Qs[r * D4 + d], Ks[c * D4 + d]); }
        let key = key0 + c;
        S[r * BC + c] = select(score * scale, -3.0e38, key > query || key >= dims.T);
        workgroupBarrier();
        var m_new = m;
        for (var j = 0u; j < BC; j++) { m_new = max(m_new, S[r * BC + j]); }
        let correction = exp(m - m_new);  // rescale what was summed against the old maximum
        l *= correction;
        for (var v = 0u; v < DV; v++) { o[v] *= correction; }
        for (var j = 0u; j < BC; j++) {
            let p = exp(S[r * BC + j] - m_new);
            l += p;
            for (var v = 0u; v < DV; v++) { o[v] += p * Vs[j * D4 + c * DV + v]; }
        }
        m = m_new;
        workgroupBarrier();  // all reads of Ks, Vs and S are done before the next tile
    }
    if (query < dims.T) {
        for (var v = 0u; v < DV; v++) { O[head + query * D4 + c * DV + v] = o[v] / l; }
        if (c == 0u) { L[h * dims.T + query] = m + log(l); }
    }
}
