// Safe softmax of each row: y = exp(x - max) / sum(exp(x - max)). One workgroup per row.
//
// Subtracting the row's maximum keeps exp() from overflowing (exp(89) is already inf in f32)
// without changing the result. It costs a pass: the row is read once for the maximum, again
// for the sum, and a third time to write y. Compare softmax_online.wgsl.

const WG: u32 = 256u;  // invocations per row, one workgroup per row (a power of two, for the reductions)

struct Dims { rows: u32, cols: u32, pad0: u32, pad1: u32 }

@group(0) @binding(0) var<storage, read> X: array<f32>;
@group(0) @binding(1) var<storage, read_write> Y: array<f32>;
@group(0) @binding(2) var<uniform> dims: Dims;

var<workgroup> partial: array<f32, WG>;

// Combine WG partial results in log2(WG) halving steps; every invocation returns the total.
fn reduce_max(v: f32, lid: u32) -> f32 {
    partial[lid] = v;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s /= 2u) {
        if (lid < s) { partial[lid] = max(partial[lid], partial[lid + s]); }
        workgroupBarrier();
    }
    let total = partial[0];
    workgroupBarrier();  // all have read it before partial is reused
    return total;
}

fn reduce_sum(v: f32, lid: u32) -> f32 {
    partial[lid] = v;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s /= 2u) {
        if (lid < s) { partial[lid] += partial[lid + s]; }
        workgroupBarrier();
    }
    let total = partial[0];
    workgroupBarrier();
    return total;
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid3: vec3<u32>) {
    let lid = lid3.x;
    let base = wid.x * dims.cols;
    var m = -3.0e38;  // pass 1: the maximum
    for (var j = lid; j < dims.cols; j += WG) { m = max(m, X[base + j]); }
    m = reduce_max(m, lid);
    var d = 0.0;  // pass 2: the sum of exponentials, now that the maximum is known
    for (var j = lid; j < dims.cols; j += WG) { d += exp(X[base + j] - m); }
    d = reduce_sum(d, lid);
    for (var j = lid; j < dims.cols; j += WG) { Y[base + j] = exp(X[base + j] - m) / d; }
}
