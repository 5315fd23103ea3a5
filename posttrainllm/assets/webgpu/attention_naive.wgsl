// Naive causal attention: one invocation per query row, with the whole row of scores kept in
// a private array. Q, K, V and O are H x T x D (heads, positions, head size), row-major f32.
// Also writes L = logsumexp of each score row, which backward passes reuse.
//
// The seed's gotcha: `s` below is MAX_T floats *per invocation* — 4 KB at MAX_T = 1024. GPUs
// keep private variables in registers; one this large cannot fit, and the compiler spills it
// to slow memory (Apple's WebGPU does, on every access). The kernel also reads every K and V
// row from storage once per query: T times in all. attention_flash2.wgsl fixes both.

const D: u32 = 64u;        // head size (a multiple of 4)
const MAX_T: u32 = 1024u;  // longest context the private score row can hold
const BR: u32 = 64u;       // query rows (invocations) per workgroup
const D4: u32 = D / 4u;

struct Dims { H: u32, T: u32, pad0: u32, pad1: u32 }

@group(0) @binding(0) var<storage, read> Q: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> K: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> V: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> O: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read_write> L: array<f32>;
@group(0) @binding(5) var<uniform> dims: Dims;

@compute @workgroup_size(BR)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let h = wid.y;
    let i = wid.x * BR + lid.x;  // this invocation's query position
    if (i >= dims.T) {
        return;
    }
    let head = h * dims.T * D4;  // offset of this head, in vec4s
    let scale = 1.0 / sqrt(f32(D));
    var s: array<f32, MAX_T>;
    var m = -3.0e38;
    for (var j = 0u; j <= i; j++) {  // causal: keys 0..i only
        var score = 0.0;
        for (var d = 0u; d < D4; d++) { score += dot(Q[head + i * D4 + d], K[head + j * D4 + d]); }
        s[j] = score * scale;
        m = max(m, s[j]);
    }
    var l = 0.0;
    var o: array<vec4<f32>, D4>;
    for (var j = 0u; j <= i; j++) {
        let p = exp(s[j] - m);
        l += p;
        for (var d = 0u; d < D4; d++) { o[d] += p * V[head + j * D4 + d]; }
    }
    for (var d = 0u; d < D4; d++) { O[head + i * D4 + d] = o[d] / l; }
    L[h * dims.T + i] = m + log(l);
}
