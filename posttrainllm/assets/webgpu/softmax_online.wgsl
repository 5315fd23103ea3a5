// Online softmax of each row (Milakov & Gimelshein, 2018): one pass computes the maximum
// and the sum of exponentials together. One workgroup per row.
//
// Keep a running maximum m and a running sum d = sum(exp(x - m)). When a larger value
// arrives, the sum so far was taken against the old maximum: rescale it by exp(m_old - m_new)
// and go on. Two partial results (m1, d1) and (m2, d2) combine the same way, so the
// invocations can each scan part of the row and then merge. The row is read twice instead of
// three times; FlashAttention (attention_flash2.wgsl) is this idea applied to attention.

const WG: u32 = 256u;

struct Dims { rows: u32, cols: u32, pad0: u32, pad1: u32 }

@group(0) @binding(0) var<storage, read> X: array<f32>;
@group(0) @binding(1) var<storage, read_write> Y: array<f32>;
@group(0) @binding(2) var<uniform> dims: Dims;

var<workgroup> part_m: array<f32, WG>;
var<workgroup> part_d: array<f32, WG>;

fn combine(m1: f32, d1: f32, m2: f32, d2: f32) -> vec2<f32> {
    let m = max(m1, m2);
    return vec2<f32>(m, d1 * exp(m1 - m) + d2 * exp(m2 - m));
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid3: vec3<u32>) {
    let lid = lid3.x;
    let base = wid.x * dims.cols;
    var m = -3.0e38;
    var d = 0.0;
    for (var j = lid; j < dims.cols; j += WG) {  // the one pass: maximum and sum together
        let x = X[base + j];
        let md = combine(m, d, x, 1.0);  // a single value x is the pair (x, exp(x - x) = 1)
        m = md.x;
        d = md.y;
    }
    part_m[lid] = m;
    part_d[lid] = d;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s /= 2u) {
        if (lid < s) {
            let md = combine(part_m[lid], part_d[lid], part_m[lid + s], part_d[lid + s]);
            part_m[lid] = md.x;
            part_d[lid] = md.y;
        }
        workgroupBarrier();
    }
    m = part_m[0];
    d = part_d[0];
    for (var j = lid; j < dims.cols; j += WG) { Y[base + j] = exp(X[base + j] - m) / d; }
}
