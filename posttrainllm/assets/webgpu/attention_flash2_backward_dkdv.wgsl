// FlashAttention-2 causal backward, part 2 of 2: dK and dV (Dao, 2023, algorithm 2). Here the
// roles turn around: one invocation per *key* row j, holding k_j and its sums in registers, while
// the workgroup walks the query rows i >= j in tiles of BR, staged in workgroup memory with their
// dO rows, logsumexps L and deltas (from part 1, attention_flash2_backward_dq.wgsl).
//
// For key j and query i >= j (s = q.k / sqrt(D), p_ij = exp(s_ij - L_i)):
//   dV_j = sum_i p_ij dO_i
//   ds_ij = p_ij (dO_i . v_j - delta_i)
//   dK_j = sum_i ds_ij q_i / sqrt(D)
// Each invocation only ever adds into its own rows, so no two invocations write the same
// number: no atomics. Causal masking makes the *first* key blocks the longest (they see every
// query), so the natural order already starts with them.
//
// Two passes over the queries, not one: a single pass holds k, v, dK and dV, 256 floats, more
// than the 255 registers an NVIDIA thread can have, and the compiler spills. Pass 1 sums dV
// (k and dV: 128 floats), pass 2 sums dK (k, v and dK: 192), computing p a second time. On the
// H200 the two passes measured faster than the one at long contexts, and no slower at short ones.
// Written out for head size D = 64. All arrays are H x T x D (L, delta: H x T), row-major f32.

const D: u32 = 64u;    // head size: this file is written out for 64 (four mat4x4 per row)
const BR: u32 = 32u;   // query rows per tile (a multiple of 4)
const BC: u32 = 64u;   // key rows per workgroup, one per invocation
const D4: u32 = D / 4u;

struct Dims { H: u32, T: u32, pad0: u32, pad1: u32 }

@group(0) @binding(0) var<storage, read> Q: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> K: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> V: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> dO: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read> L: array<f32>;
@group(0) @binding(5) var<storage, read> delta: array<f32>;
@group(0) @binding(6) var<storage, read_write> dK: array<vec4<f32>>;
@group(0) @binding(7) var<storage, read_write> dV: array<vec4<f32>>;
@group(0) @binding(8) var<uniform> dims: Dims;

var<workgroup> Qs: array<vec4<f32>, BR * D4>;
var<workgroup> dOs: array<vec4<f32>, BR * D4>;
var<workgroup> Ls: array<f32, BR>;
var<workgroup> deltas: array<f32, BR>;

fn q_part(i: u32, part: u32) -> mat4x4<f32> {  // numbers 16 part .. 16 part + 15 of staged query i
    let b = i * D4 + part * 4u;
    return mat4x4<f32>(Qs[b], Qs[b + 1u], Qs[b + 2u], Qs[b + 3u]);
}

fn do_part(i: u32, part: u32) -> mat4x4<f32> {
    let b = i * D4 + part * 4u;
    return mat4x4<f32>(dOs[b], dOs[b + 1u], dOs[b + 2u], dOs[b + 3u]);
}

fn dot16(a: mat4x4<f32>, b: mat4x4<f32>) -> f32 {
    let s = a[0] * b[0] + a[1] * b[1] + a[2] * b[2] + a[3] * b[3];
    return s.x + s.y + s.z + s.w;
}

fn qk(i: u32, k0: mat4x4<f32>, k1: mat4x4<f32>, k2: mat4x4<f32>, k3: mat4x4<f32>) -> f32 {  // s_ij
    return dot16(q_part(i, 0u), k0) + dot16(q_part(i, 1u), k1) + dot16(q_part(i, 2u), k2) + dot16(q_part(i, 3u), k3);
}

fn gv(i: u32, v0: mat4x4<f32>, v1: mat4x4<f32>, v2: mat4x4<f32>, v3: mat4x4<f32>) -> f32 {  // dO_i . v_j
    return dot16(do_part(i, 0u), v0) + dot16(do_part(i, 1u), v1) + dot16(do_part(i, 2u), v2)
        + dot16(do_part(i, 3u), v3);
}

// acc plus staged rows i .. i + 3 (this part of them) of Q (which = 0) or dO (which = 1), weighted by w
fn add4(acc: mat4x4<f32>, which: u32, part: u32, i: u32, w: vec4<f32>) -> mat4x4<f32> {
    if (which == 0u) {
        return acc + q_part(i, part) * w.x + q_part(i + 1u, part) * w.y + q_part(i + 2u, part) * w.z
            + q_part(i + 3u, part) * w.w;
    }
    return acc + do_part(i, part) * w.x + do_part(i + 1u, part) * w.y + do_part(i + 2u, part) * w.z
        + do_part(i + 3u, part) * w.w;
}

fn row_part(buffer: u32, row: u32, part: u32, valid: bool) -> mat4x4<f32> {  // buffer 0: K, 1: V
    if (!valid) { return mat4x4<f32>(); }
    let b = row + part * 4u;
    if (buffer == 0u) { return mat4x4<f32>(K[b], K[b + 1u], K[b + 2u], K[b + 3u]); }
    return mat4x4<f32>(V[b], V[b + 1u], V[b + 2u], V[b + 3u]);
}

// Stage query rows query0 .. query0 + BR - 1 of head h: q, dO, L and delta (zeros past T).
fn stage(query0: u32, c: u32, h: u32) {
    let head = h * dims.T * D4;
    for (var i = c; i < BR * D4; i += BC) {
        var qv = vec4<f32>(0.0);
        var gradv = vec4<f32>(0.0);
        if (query0 + i / D4 < dims.T) {
            qv = Q[head + query0 * D4 + i];
            gradv = dO[head + query0 * D4 + i];
        }
        Qs[i] = qv;
        dOs[i] = gradv;
    }
    for (var i = c; i < BR; i += BC) {
        var lse = 0.0;
        var dl = 0.0;
        if (query0 + i < dims.T) {
            lse = L[h * dims.T + query0 + i];
            dl = delta[h * dims.T + query0 + i];
        }
        Ls[i] = lse;
        deltas[i] = dl;
    }
}

// p for staged queries i .. i + 3 against this invocation's key: zero before the key and past T
fn probs(i: u32, query0: u32, key: u32, k0: mat4x4<f32>, k1: mat4x4<f32>, k2: mat4x4<f32>,
         k3: mat4x4<f32>) -> vec4<f32> {
    let s = vec4<f32>(qk(i, k0, k1, k2, k3), qk(i + 1u, k0, k1, k2, k3), qk(i + 2u, k0, k1, k2, k3),
                      qk(i + 3u, k0, k1, k2, k3));
    let lse = vec4<f32>(Ls[i], Ls[i + 1u], Ls[i + 2u], Ls[i + 3u]);
    let queries = vec4<u32>(query0 + i) + vec4<u32>(0u, 1u, 2u, 3u);
    let masked = (queries < vec4<u32>(key)) | (queries >= vec4<u32>(dims.T));
    return select(exp(s - lse), vec4<f32>(0.0), masked);
}

@compute @workgroup_size(BC)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) c: u32) {
    let h = wid.y;
    let key0 = wid.x * BC;
    let key = key0 + c;
    let valid = key < dims.T;
    let at = h * dims.T * D4 + key * D4;
    let scale = 1.0 / sqrt(f32(D));
    let k0 = row_part(0u, at, 0u, valid) * scale;  // k scaled once: s = q . (k / sqrt(D))
    let k1 = row_part(0u, at, 1u, valid) * scale;
    let k2 = row_part(0u, at, 2u, valid) * scale;
    let k3 = row_part(0u, at, 3u, valid) * scale;
    let first = key0 - key0 % BR;  // causal: queries before this block's first key see none of its keys
    // Pass 1, dV: needs k (for p) and the sum dV, 128 floats of registers.
    var dv0 = mat4x4<f32>();
    var dv1 = mat4x4<f32>();
    var dv2 = mat4x4<f32>();
    var dv3 = mat4x4<f32>();
    for (var query0 = first; query0 < dims.T; query0 += BR) {
        stage(query0, c, h);
        workgroupBarrier();
        for (var i = 0u; i < BR; i += 4u) {
            let p = probs(i, query0, key, k0, k1, k2, k3);
            dv0 = add4(dv0, 1u, 0u, i, p);
            dv1 = add4(dv1, 1u, 1u, i, p);
            dv2 = add4(dv2, 1u, 2u, i, p);
            dv3 = add4(dv3, 1u, 3u, i, p);
        }
        workgroupBarrier();  // every read of the staged rows is done before the next tile
    }
    if (valid) {
        for (var x = 0u; x < 4u; x++) {
            dV[at + x] = dv0[x];
            dV[at + 4u + x] = dv1[x];
            dV[at + 8u + x] = dv2[x];
            dV[at + 12u + x] = dv3[x];
        }
    }
    // Pass 2, dK: needs k, v (for dp) and the sum dK, 192 floats; p is computed again.
    let v0 = row_part(1u, at, 0u, valid);
    let v1 = row_part(1u, at, 1u, valid);
    let v2 = row_part(1u, at, 2u, valid);
    let v3 = row_part(1u, at, 3u, valid);
    var dk0 = mat4x4<f32>();
    var dk1 = mat4x4<f32>();
    var dk2 = mat4x4<f32>();
    var dk3 = mat4x4<f32>();
    for (var query0 = first; query0 < dims.T; query0 += BR) {
        stage(query0, c, h);
        workgroupBarrier();
        for (var i = 0u; i < BR; i += 4u) {
            let p = probs(i, query0, key, k0, k1, k2, k3);
            let dp = vec4<f32>(gv(i, v0, v1, v2, v3), gv(i + 1u, v0, v1, v2, v3), gv(i + 2u, v0, v1, v2, v3),
                               gv(i + 3u, v0, v1, v2, v3));
            let ds = p * (dp - vec4<f32>(deltas[i], deltas[i + 1u], deltas[i + 2u], deltas[i + 3u]));
            dk0 = add4(dk0, 0u, 0u, i, ds);
            dk1 = add4(dk1, 0u, 1u, i, ds);
            dk2 = add4(dk2, 0u, 2u, i, ds);
            dk3 = add4(dk3, 0u, 3u, i, ds);
        }
        workgroupBarrier();
    }
    if (valid) {
        for (var x = 0u; x < 4u; x++) {
            dK[at + x] = dk0[x] * scale;
            dK[at + 4u + x] = dk1[x] * scale;
            dK[at + 8u + x] = dk2[x] * scale;
            dK[at + 12u + x] = dk3[x] * scale;
        }
    }
}
