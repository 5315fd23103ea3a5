// FlashAttention-2 causal forward, four invocations per query row, which add their parts of
// each score through subgroup shuffles. The algorithm of attention_flash2_rows.wgsl (K and V in
// tiles of BC keys in workgroup memory, an online softmax per row, keys in groups of 8), with
// the row's 64 numbers split four ways:
//
// - In attention_flash2_rows.wgsl one invocation keeps q and o (128 floats) in registers, and
//   there is one invocation per query row: 16,384 with 8 heads at T = 2048, where an H200 can
//   hold 270,336 (132 cores x 2,048) in flight to hide each one's waits.
// - Here invocation 4r + p owns part p (16 numbers) of row r's q and o: 32 floats of registers,
//   and four times as many invocations. Each computes 16 of the 64 products of a score; two
//   subgroupShuffleXor steps (lanes p ^ 1, then p ^ 2) give all four the whole score, the same
//   bits in each, so each keeps the same running maximum and sum without talking again.
// - The four lanes of a row must sit in one subgroup, in order: WebGPU promises subgroups of at
//   least 4 invocations, and every driver the book runs on numbers a workgroup's lanes in
//   local_invocation_index order (the tests check the result on lavapipe and SwiftShader).
// - The tile in workgroup memory is stored so the four lanes read four adjacent vec4s (part
//   p's c-th vec4 of key j sits at j * D4 + 4c + p): 64 contiguous bytes, no bank conflict.
//
// Needs the WebGPU feature "subgroups" (wgpu calls it "subgroup"); without it both runtimes
// refuse this file by name and attention_flash2_rows.wgsl stands in. Written out for head size
// D = 64. Q, K, V and O are H x T x D row-major f32; L gets each row's logsumexp, which the
// backward pass reads.

enable subgroups;

const D: u32 = 64u;    // head size: this file is written out for 64 (four parts of 16)
const BR: u32 = 64u;   // query rows per workgroup, four invocations each
const BC: u32 = 32u;   // keys per tile (a multiple of 8)
const D4: u32 = D / 4u;
const THREADS: u32 = BR * 4u;

struct Dims { H: u32, T: u32, pad0: u32, pad1: u32 }

@group(0) @binding(0) var<storage, read> Q: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> K: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> V: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> O: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read_write> L: array<f32>;
@group(0) @binding(5) var<uniform> dims: Dims;

var<workgroup> Ks: array<vec4<f32>, BC * D4>;
var<workgroup> Vs: array<vec4<f32>, BC * D4>;

// Part p of staged row j: its four vec4s, interleaved with the other parts' (see above)
fn k_part(j: u32, p: u32) -> mat4x4<f32> {
    let b = j * D4 + p;
    return mat4x4<f32>(Ks[b], Ks[b + 4u], Ks[b + 8u], Ks[b + 12u]);
}

fn v_part(j: u32, p: u32) -> mat4x4<f32> {
    let b = j * D4 + p;
    return mat4x4<f32>(Vs[b], Vs[b + 4u], Vs[b + 8u], Vs[b + 12u]);
}

// this lane's 16 products of q . k for staged keys j .. j + 3, one sum per key
fn partial4(q: mat4x4<f32>, p: u32, j: u32) -> vec4<f32> {
    var s = vec4<f32>();
    for (var i = 0u; i < 4u; i++) {
        let k = k_part(j + i, p);
        let v = q[0] * k[0] + q[1] * k[1] + q[2] * k[2] + q[3] * k[3];
        s[i] = v.x + v.y + v.z + v.w;
    }
    return s;
}

// the four lanes' partial sums added: (p ^ 1) then (p ^ 2), the same bits in every lane
fn quad_sum(s: vec4<f32>) -> vec4<f32> {
    let t = s + subgroupShuffleXor(s, 1u);
    return t + subgroupShuffleXor(t, 2u);
}

fn add4(o: mat4x4<f32>, p: u32, j: u32, w: vec4<f32>) -> mat4x4<f32> {
    return o + v_part(j, p) * w.x + v_part(j + 1u, p) * w.y + v_part(j + 2u, p) * w.z + v_part(j + 3u, p) * w.w;
}

@compute @workgroup_size(THREADS)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
        @builtin(local_invocation_index) tid: u32) {
    let h = wid.y;
    let row0 = (groups.x - 1u - wid.x) * BR;  // the longest blocks first
    let query = row0 + tid / 4u;
    let p = tid % 4u;
    let valid = query < dims.T;
    let head = h * dims.T * D4;
    let scale = 1.0 / sqrt(f32(D));
    var q = mat4x4<f32>();
    if (valid) {  // part p of the row is vec4s 4p .. 4p + 3 in memory
        let b = head + query * D4 + 4u * p;
        q = mat4x4<f32>(Q[b], Q[b + 1u], Q[b + 2u], Q[b + 3u]) * scale;
    }
    var o = mat4x4<f32>();
    var m = -3.0e38;
    var l = 0.0;
    let keys = min(dims.T, row0 + BR);
    for (var key0 = 0u; key0 < keys; key0 += BC) {
        for (var i = tid; i < BC * D4; i += THREADS) {
            let j = i / D4;
            let slot = j * D4 + (i % 4u) * 4u + (i % D4) / 4u;  // vec4 c of part p goes to 4c + p
            var kv = vec4<f32>(0.0);
            var vv = vec4<f32>(0.0);
            if (key0 + j < dims.T) {
                kv = K[head + key0 * D4 + i];
                vv = V[head + key0 * D4 + i];
            }
            Ks[slot] = kv;
            Vs[slot] = vv;
        }
        workgroupBarrier();
        for (var j = 0u; j < BC; j += 8u) {
            let key = key0 + j;
            var s0 = quad_sum(partial4(q, p, j));
            var s1 = quad_sum(partial4(q, p, j + 4u));
            s0 = select(s0, vec4<f32>(-3.0e38), vec4<u32>(key) + vec4<u32>(0u, 1u, 2u, 3u) > vec4<u32>(query));
            s1 = select(s1, vec4<f32>(-3.0e38), vec4<u32>(key) + vec4<u32>(4u, 5u, 6u, 7u) > vec4<u32>(query));
            let m_new = max(m, max(max(max(s0.x, s0.y), max(s0.z, s0.w)), max(max(s1.x, s1.y), max(s1.z, s1.w))));
            if (m_new > m) {
                let c = exp(m - m_new);
                l *= c;
                o *= c;
                m = m_new;
            }
            let w0 = exp(s0 - vec4<f32>(m));
            let w1 = exp(s1 - vec4<f32>(m));
            l += dot(w0, vec4<f32>(1.0)) + dot(w1, vec4<f32>(1.0));
            o = add4(add4(o, p, j, w0), p, j + 4u, w1);
        }
        workgroupBarrier();
    }
    if (valid) {
        let out = head + query * D4 + 4u * p;
        let inv = 1.0 / l;
        for (var c = 0u; c < 4u; c++) {
            O[out + c] = o[c] * inv;
        }
        if (p == 0u) { L[h * dims.T + query] = m + log(l); }
    }
}
