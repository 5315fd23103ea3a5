// FlashAttention-2 causal forward, one invocation per query row (Dao, 2023, section 3.1: each
// row's softmax is independent, so no two invocations need to talk). The same algorithm as
// attention_flash2.wgsl — K and V in tiles of BC rows staged in workgroup memory, an online
// softmax per query row, one division by l at the end — but the work is split differently:
//
// - attention_flash2.wgsl gives invocation (r, c) one score of a 16 x 16 tile; every
//   invocation then re-reads its whole row of scores from workgroup memory to find the maximum
//   and sums 16 exps, so each exp is computed 16 times, and there are 3 barriers per 16 keys.
// - Here invocation r owns query row r: q and the output o live in its registers (as four
//   mat4x4s each, 64 floats, indexed only by constants so the compiler can keep them there),
//   each score and each exp is computed once, and there are 2 barriers per BC keys. Every
//   invocation reads the same K or V row at the same time: one broadcast read, no bank conflict.
// - Keys go through in groups of 8 (two vec4s of scores): the running maximum and the rescale
//   of o happen once per group instead of once per key, and not at all when the maximum did not
//   move, which after the first keys is most of the time.
// - Causal masking makes later rows do more work; workgroups take blocks from the last one
//   backwards so the longest run first and the short ones fill in at the end.
//
// Written out for head size D = 64. Q, K, V and O are H x T x D row-major f32; L gets each
// row's logsumexp, which the backward pass (attention_flash2_backward_*.wgsl) reads.

const D: u32 = 64u;    // head size: this file is written out for 64 (four mat4x4 per row)
const BR: u32 = 64u;   // query rows per workgroup, one per invocation
const BC: u32 = 32u;   // keys per tile (a multiple of 8)
const D4: u32 = D / 4u;

struct Dims { H: u32, T: u32, pad0: u32, pad1: u32 }

@group(0) @binding(0) var<storage, read> Q: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> K: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> V: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> O: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read_write> L: array<f32>;
@group(0) @binding(5) var<uniform> dims: Dims;

var<workgroup> Ks: array<vec4<f32>, BC * D4>;
var<workgroup> Vs: array<vec4<f32>, BC * D4>;

// Part `part` (16 of the 64 numbers) of row `j` of the staged K or V tile.
fn k_part(j: u32, part: u32) -> mat4x4<f32> {
    let b = j * D4 + part * 4u;
    return mat4x4<f32>(Ks[b], Ks[b + 1u], Ks[b + 2u], Ks[b + 3u]);
}

fn v_part(j: u32, part: u32) -> mat4x4<f32> {
    let b = j * D4 + part * 4u;
    return mat4x4<f32>(Vs[b], Vs[b + 1u], Vs[b + 2u], Vs[b + 3u]);
}

// q . k for staged key j: 64 products summed into four lanes, then the lanes added once
fn score(q0: mat4x4<f32>, q1: mat4x4<f32>, q2: mat4x4<f32>, q3: mat4x4<f32>, j: u32) -> f32 {
    let k0 = k_part(j, 0u);
    let k1 = k_part(j, 1u);
    let k2 = k_part(j, 2u);
    let k3 = k_part(j, 3u);
    let s = q0[0] * k0[0] + q0[1] * k0[1] + q0[2] * k0[2] + q0[3] * k0[3] + q1[0] * k1[0] + q1[1] * k1[1]
        + q1[2] * k1[2] + q1[3] * k1[3] + q2[0] * k2[0] + q2[1] * k2[1] + q2[2] * k2[2] + q2[3] * k2[3]
        + q3[0] * k3[0] + q3[1] * k3[1] + q3[2] * k3[2] + q3[3] * k3[3];
    return s.x + s.y + s.z + s.w;
}

// o plus keys j .. j + 3's V rows (this part of them) weighted by p
fn add4(o: mat4x4<f32>, part: u32, j: u32, p: vec4<f32>) -> mat4x4<f32> {
    return o + v_part(j, part) * p.x + v_part(j + 1u, part) * p.y + v_part(j + 2u, part) * p.z
        + v_part(j + 3u, part) * p.w;
}

fn load_row(base: u32, part: u32, valid: bool) -> mat4x4<f32> {
    if (!valid) { return mat4x4<f32>(); }
    let b = base + part * 4u;
    return mat4x4<f32>(Q[b], Q[b + 1u], Q[b + 2u], Q[b + 3u]);
}

@compute @workgroup_size(BR)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
        @builtin(local_invocation_index) r: u32) {
    let h = wid.y;
    let row0 = (groups.x - 1u - wid.x) * BR;  // the longest blocks first
    let query = row0 + r;
    let valid = query < dims.T;
    let head = h * dims.T * D4;
    // q scaled by 1/sqrt(D) once, here, instead of every score
    let scale = 1.0 / sqrt(f32(D));
    let q0 = load_row(head + query * D4, 0u, valid) * scale;
    let q1 = load_row(head + query * D4, 1u, valid) * scale;
    let q2 = load_row(head + query * D4, 2u, valid) * scale;
    let q3 = load_row(head + query * D4, 3u, valid) * scale;
    var o0 = mat4x4<f32>();
    var o1 = mat4x4<f32>();
    var o2 = mat4x4<f32>();
    var o3 = mat4x4<f32>();
    var m = -3.0e38;
    var l = 0.0;
    let keys = min(dims.T, row0 + BR);  // causal: no row of this block sees a key past its last row
    for (var key0 = 0u; key0 < keys; key0 += BC) {
        for (var i = r; i < BC * D4; i += BR) {
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
        for (var j = 0u; j < BC; j += 8u) {
            let key = key0 + j;
            var s0 = vec4<f32>(score(q0, q1, q2, q3, j), score(q0, q1, q2, q3, j + 1u),
                               score(q0, q1, q2, q3, j + 2u), score(q0, q1, q2, q3, j + 3u));
            var s1 = vec4<f32>(score(q0, q1, q2, q3, j + 4u), score(q0, q1, q2, q3, j + 5u),
                               score(q0, q1, q2, q3, j + 6u), score(q0, q1, q2, q3, j + 7u));
            // causal mask: keys after this query (which covers keys past T, as query < T)
            s0 = select(s0, vec4<f32>(-3.0e38), vec4<u32>(key) + vec4<u32>(0u, 1u, 2u, 3u) > vec4<u32>(query));
            s1 = select(s1, vec4<f32>(-3.0e38), vec4<u32>(key) + vec4<u32>(4u, 5u, 6u, 7u) > vec4<u32>(query));
            let m_new = max(m, max(max(max(s0.x, s0.y), max(s0.z, s0.w)), max(max(s1.x, s1.y), max(s1.z, s1.w))));
            if (m_new > m) {  // rescale what was summed against the old maximum
                let c = exp(m - m_new);
                l *= c;
                o0 *= c;
                o1 *= c;
                o2 *= c;
                o3 *= c;
                m = m_new;
            }
            let p0 = exp(s0 - vec4<f32>(m));
            let p1 = exp(s1 - vec4<f32>(m));
            l += dot(p0, vec4<f32>(1.0)) + dot(p1, vec4<f32>(1.0));
            o0 = add4(add4(o0, 0u, j, p0), 0u, j + 4u, p1);
            o1 = add4(add4(o1, 1u, j, p0), 1u, j + 4u, p1);
            o2 = add4(add4(o2, 2u, j, p0), 2u, j + 4u, p1);
            o3 = add4(add4(o3, 3u, j, p0), 3u, j + 4u, p1);
        }
        workgroupBarrier();  // every read of Ks and Vs is done before the next tile overwrites them
    }
    if (valid) {
        let out = head + query * D4;
        let inv = 1.0 / l;
        for (var c = 0u; c < 4u; c++) {
            O[out + c] = o0[c] * inv;
            O[out + 4u + c] = o1[c] * inv;
            O[out + 8u + c] = o2[c] * inv;
            O[out + 12u + c] = o3[c] * inv;
        }
        L[h * dims.T + query] = m + log(l);
    }
}
