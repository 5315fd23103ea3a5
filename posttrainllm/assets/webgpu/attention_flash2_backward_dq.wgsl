// FlashAttention-2 causal backward, part 1 of 2: dQ (Dao, 2023, algorithm 2). One invocation per
// query row, as in attention_flash2_rows.wgsl, walking the K and V tiles the forward pass walked.
// Nothing of the forward pass is stored but its output O and each row's logsumexp L: the scores
// are recomputed, and the probabilities come back as exp(s - L) with no running maximum and no
// second pass, because L is already the row's final normaliser.
//
// For query row i and key j <= i (s = q.k / sqrt(D), p = softmax of s along the row):
//   dp_ij = dO_i . v_j
//   ds_ij = p_ij (dp_ij - delta_i),  delta_i = dO_i . O_i  (= sum_j p_ij dp_ij)
//   dQ_i  = sum_j ds_ij k_j / sqrt(D)
// This kernel also writes delta, which part 2 (attention_flash2_backward_dkdv.wgsl) reads.
// dQ gets its own pass because the other order — each workgroup owning keys, adding into dQ
// rows that other workgroups also add into — needs atomic float adds, which WGSL lacks.
// Written out for head size D = 64. All arrays are H x T x D (L, delta: H x T), row-major f32.

const D: u32 = 64u;    // head size: this file is written out for 64 (four mat4x4 per row)
const BR: u32 = 64u;   // query rows per workgroup, one per invocation
const BC: u32 = 32u;   // keys per tile (a multiple of 4)
const D4: u32 = D / 4u;

struct Dims { H: u32, T: u32, pad0: u32, pad1: u32 }

@group(0) @binding(0) var<storage, read> Q: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> K: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> V: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> O: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read> dO: array<vec4<f32>>;
@group(0) @binding(5) var<storage, read> L: array<f32>;
@group(0) @binding(6) var<storage, read_write> dQ: array<vec4<f32>>;
@group(0) @binding(7) var<storage, read_write> delta: array<f32>;
@group(0) @binding(8) var<uniform> dims: Dims;

var<workgroup> Ks: array<vec4<f32>, BC * D4>;
var<workgroup> Vs: array<vec4<f32>, BC * D4>;

fn k_part(j: u32, part: u32) -> mat4x4<f32> {  // numbers 16 part .. 16 part + 15 of staged key j
    let b = j * D4 + part * 4u;
    return mat4x4<f32>(Ks[b], Ks[b + 1u], Ks[b + 2u], Ks[b + 3u]);
}

fn v_part(j: u32, part: u32) -> mat4x4<f32> {
    let b = j * D4 + part * 4u;
    return mat4x4<f32>(Vs[b], Vs[b + 1u], Vs[b + 2u], Vs[b + 3u]);
}

fn dot16(a: mat4x4<f32>, b: mat4x4<f32>) -> f32 {
    let s = a[0] * b[0] + a[1] * b[1] + a[2] * b[2] + a[3] * b[3];
    return s.x + s.y + s.z + s.w;
}

fn dot64(a0: mat4x4<f32>, a1: mat4x4<f32>, a2: mat4x4<f32>, a3: mat4x4<f32>, b0: mat4x4<f32>, b1: mat4x4<f32>,
         b2: mat4x4<f32>, b3: mat4x4<f32>) -> f32 {
    return dot16(a0, b0) + dot16(a1, b1) + dot16(a2, b2) + dot16(a3, b3);
}

fn row_part(buffer: u32, row: u32, part: u32, valid: bool) -> mat4x4<f32> {  // buffer 0: Q, 1: dO, 2: O
    if (!valid) { return mat4x4<f32>(); }
    let b = row + part * 4u;
    if (buffer == 0u) { return mat4x4<f32>(Q[b], Q[b + 1u], Q[b + 2u], Q[b + 3u]); }
    if (buffer == 1u) { return mat4x4<f32>(dO[b], dO[b + 1u], dO[b + 2u], dO[b + 3u]); }
    return mat4x4<f32>(O[b], O[b + 1u], O[b + 2u], O[b + 3u]);
}

// dq plus keys j .. j + 3 (this part of them) weighted by ds
fn add4(dq: mat4x4<f32>, part: u32, j: u32, ds: vec4<f32>) -> mat4x4<f32> {
    return dq + k_part(j, part) * ds.x + k_part(j + 1u, part) * ds.y + k_part(j + 2u, part) * ds.z
        + k_part(j + 3u, part) * ds.w;
}

@compute @workgroup_size(BR)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
        @builtin(local_invocation_index) r: u32) {
    let h = wid.y;
    let row0 = (groups.x - 1u - wid.x) * BR;  // the longest blocks first
    let query = row0 + r;
    let valid = query < dims.T;
    let head = h * dims.T * D4;
    let at = head + query * D4;
    let scale = 1.0 / sqrt(f32(D));
    let q0 = row_part(0u, at, 0u, valid) * scale;
    let q1 = row_part(0u, at, 1u, valid) * scale;
    let q2 = row_part(0u, at, 2u, valid) * scale;
    let q3 = row_part(0u, at, 3u, valid) * scale;
    let g0 = row_part(1u, at, 0u, valid);
    let g1 = row_part(1u, at, 1u, valid);
    let g2 = row_part(1u, at, 2u, valid);
    let g3 = row_part(1u, at, 3u, valid);
    let row_delta = dot64(g0, g1, g2, g3, row_part(2u, at, 0u, valid), row_part(2u, at, 1u, valid),
                          row_part(2u, at, 2u, valid), row_part(2u, at, 3u, valid));
    var lse = 0.0;
    if (valid) { lse = L[h * dims.T + query]; }
    var dq0 = mat4x4<f32>();
    var dq1 = mat4x4<f32>();
    var dq2 = mat4x4<f32>();
    var dq3 = mat4x4<f32>();
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
        for (var j = 0u; j < BC; j += 4u) {
            var s = vec4<f32>(dot64(q0, q1, q2, q3, k_part(j, 0u), k_part(j, 1u), k_part(j, 2u), k_part(j, 3u)),
                              dot64(q0, q1, q2, q3, k_part(j + 1u, 0u), k_part(j + 1u, 1u), k_part(j + 1u, 2u),
                                    k_part(j + 1u, 3u)),
                              dot64(q0, q1, q2, q3, k_part(j + 2u, 0u), k_part(j + 2u, 1u), k_part(j + 2u, 2u),
                                    k_part(j + 2u, 3u)),
                              dot64(q0, q1, q2, q3, k_part(j + 3u, 0u), k_part(j + 3u, 1u), k_part(j + 3u, 2u),
                                    k_part(j + 3u, 3u)));
            let dp = vec4<f32>(dot64(g0, g1, g2, g3, v_part(j, 0u), v_part(j, 1u), v_part(j, 2u), v_part(j, 3u)),
                               dot64(g0, g1, g2, g3, v_part(j + 1u, 0u), v_part(j + 1u, 1u), v_part(j + 1u, 2u),
                                     v_part(j + 1u, 3u)),
                               dot64(g0, g1, g2, g3, v_part(j + 2u, 0u), v_part(j + 2u, 1u), v_part(j + 2u, 2u),
                                     v_part(j + 2u, 3u)),
                               dot64(g0, g1, g2, g3, v_part(j + 3u, 0u), v_part(j + 3u, 1u), v_part(j + 3u, 2u),
                                     v_part(j + 3u, 3u)));
            let masked = vec4<u32>(key0 + j) + vec4<u32>(0u, 1u, 2u, 3u) > vec4<u32>(query);  // keys after the query
            let p = select(exp(s - vec4<f32>(lse)), vec4<f32>(0.0), masked);
            let ds = p * (dp - vec4<f32>(row_delta));
            dq0 = add4(dq0, 0u, j, ds);
            dq1 = add4(dq1, 1u, j, ds);
            dq2 = add4(dq2, 2u, j, ds);
            dq3 = add4(dq3, 3u, j, ds);
        }
        workgroupBarrier();  // every read of Ks and Vs is done before the next tile overwrites them
    }
    if (valid) {
        for (var c = 0u; c < 4u; c++) {
            dQ[at + c] = dq0[c] * scale;
            dQ[at + 4u + c] = dq1[c] * scale;
            dQ[at + 8u + c] = dq2[c] * scale;
            dQ[at + 12u + c] = dq3[c] * scale;
        }
        delta[h * dims.T + query] = row_delta;
    }
}
