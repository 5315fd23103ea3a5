// The trainer's hot loops: the matrix product every linear layer and attention need, and the
// elementwise functions (exp, GELU), in 128-bit WASM SIMD when the build has it (-msimd128)
// and in plain loops when it does not. Row-major float32.
//
//   C[i][j] (+)= sum_p A(i, p) * B[p][j]  (+ bias[j])
//
// B and C are read in rows (contiguous j, rows ldb and ldc apart); A through two strides, so one
// kernel serves every use without transposing A first:
//
//   forward   y  = x W^T + b     A = x  (stride K, 1)   B = W^T (transposed once per step)
//   backward  dx = dy W          A = dy (stride N, 1)   B = W
//   backward  dW += dy^T x       A = dy (stride 1, N)   B = x
//   attention S = Q K^T, Y = P V, dQ = dS K, dK = dS^T Q, dV = P^T dY, on one head's columns
//
// gemm() takes a row range [begin, end) of C, so the thread pool can hand out rows with no two
// threads writing the same memory.
#pragma once

#include <cmath>
#include <cstdint>

#ifdef __wasm_simd128__
#include <wasm_simd128.h>
#endif

namespace kernels {

struct Operand {
  const float* data;
  long row, col;  // strides: A(i, p) = data[i * row + p * col]
  float operator()(long i, long p) const { return data[i * row + p * col]; }
};

// C (N columns, rows ldc apart) = A (P columns) . B (P x N, rows ldb apart), added to C when
// `accumulate`, plus bias[j] when there is one.
struct Product {
  float* c;
  long ldc;
  Operand a;
  const float* b;
  long ldb;
  int N, P;
  const float* bias = nullptr;
  bool accumulate = false;
};

// y[i] += s * x[i] for i < n
inline void axpy(float* y, const float* x, float s, int n) {
  int i = 0;
#ifdef __wasm_simd128__
  v128_t vs = wasm_f32x4_splat(s);
  for (; i + 4 <= n; i += 4) wasm_v128_store(y + i, wasm_f32x4_add(wasm_v128_load(y + i), wasm_f32x4_mul(vs, wasm_v128_load(x + i))));
#endif
  for (; i < n; ++i) y[i] += s * x[i];
}

#ifdef __wasm_simd128__
// acc + a * b: one fused multiply-add where the build has relaxed SIMD (-mrelaxed-simd), which
// the engine lowers to the CPU's FMA when it has one (and to a multiply and an add when not)
inline v128_t madd(v128_t a, v128_t b, v128_t acc) {
#ifdef __wasm_relaxed_simd__
  return wasm_f32x4_relaxed_madd(a, b, acc);
#else
  return wasm_f32x4_add(acc, wasm_f32x4_mul(a, b));
#endif
}

inline float lane_sum(v128_t v) {
  return wasm_f32x4_extract_lane(v, 0) + wasm_f32x4_extract_lane(v, 1) + wasm_f32x4_extract_lane(v, 2) +
         wasm_f32x4_extract_lane(v, 3);
}
#endif

// x . y over n values
inline float vdot(const float* x, const float* y, int n) {
  int i = 0;
  float s = 0.0f;
#ifdef __wasm_simd128__
  v128_t acc = wasm_f32x4_splat(0.0f);
  for (; i + 4 <= n; i += 4) acc = wasm_f32x4_add(acc, wasm_f32x4_mul(wasm_v128_load(x + i), wasm_v128_load(y + i)));
  s = lane_sum(acc);
#endif
  for (; i < n; ++i) s += x[i] * y[i];
  return s;
}

#ifdef __wasm_simd128__
// The SIMD path works on four rows of C at a time and on at most DEPTH steps of p at a time:
// those four rows of A, DEPTH long, are first copied into a panel, p-major, so the kernel reads
// them at fixed offsets from one pointer whatever A's strides (no address arithmetic in its
// loop), and B's DEPTH rows stay in cache while every column block uses them.
constexpr int DEPTH = 256;

// What a pass over steps [p0, p0 + depth) adds to: C itself after the first pass, and the
// bias only in the first.
struct Pass {
  const float* panel;  // A(i + r, p0 + p) at panel[4 p + r]
  const float* b;      // B's row p0
  int depth;
  bool add_c, add_bias;
};

// C[i..i+4][j..j+8] from the panel: eight accumulators, per step two loads of B's row and four
// broadcasts of A, 32 multiply-adds per six loads (a plain dot-product loop does one per two).
inline void block4x8(const Product& g, const Pass& pass, long i, long j) {
  v128_t acc[4][2];
  for (auto& row : acc) row[0] = row[1] = wasm_f32x4_splat(0.0f);
  const float *a = pass.panel, *br = pass.b + j;
  for (int p = 0; p < pass.depth; ++p, a += 4, br += g.ldb) {
    v128_t b0 = wasm_v128_load(br), b1 = wasm_v128_load(br + 4);
    for (int r = 0; r < 4; ++r) {
      v128_t ar = wasm_v128_load32_splat(a + r);
      acc[r][0] = madd(ar, b0, acc[r][0]);
      acc[r][1] = madd(ar, b1, acc[r][1]);
    }
  }
  for (int r = 0; r < 4; ++r) {
    float* out = g.c + (i + r) * g.ldc + j;
    for (int half = 0; half < 2; ++half) {
      v128_t v = acc[r][half];
      if (pass.add_c) v = wasm_f32x4_add(wasm_v128_load(out + 4 * half), v);
      if (pass.add_bias) v = wasm_f32x4_add(v, wasm_v128_load(g.bias + j + 4 * half));
      wasm_v128_store(out + 4 * half, v);
    }
  }
}

// C[i..i+4][j], one column past the last block of 8, from the panel
inline void column4(const Product& g, const Pass& pass, long i, long j) {
  for (int r = 0; r < 4; ++r) {
    float s = 0.0f;
    for (int p = 0; p < pass.depth; ++p) s += pass.panel[4 * p + r] * pass.b[p * g.ldb + j];
    float& out = g.c[(i + r) * g.ldc + j];
    out = (pass.add_c ? out : 0.0f) + s + (pass.add_bias ? g.bias[j] : 0.0f);
  }
}

// panel[4 p + r] = A(i + r, p0 + p) for p < depth, r < 4. The two layouts the trainer uses move
// whole vectors: A stored by columns (the backward products' dy^T) gives a step's four values
// side by side, one load; A stored by rows (x, dy) gives four rows, which are read four steps at a
// time and transposed in registers. Any other layout goes value by value.
inline void pack4(const Operand& a, long i, int p0, int depth, float* panel) {
  int p = 0;
  if (a.row == 1) {
    for (const float* src = a.data + i + p0 * a.col; p < depth; ++p, src += a.col)
      wasm_v128_store(panel + 4 * p, wasm_v128_load(src));
  } else if (a.col == 1) {
    const float* r0 = a.data + i * a.row + p0;
    const float *r1 = r0 + a.row, *r2 = r1 + a.row, *r3 = r2 + a.row;
    for (; p + 4 <= depth; p += 4) {
      v128_t x0 = wasm_v128_load(r0 + p), x1 = wasm_v128_load(r1 + p);
      v128_t x2 = wasm_v128_load(r2 + p), x3 = wasm_v128_load(r3 + p);
      v128_t lo01 = wasm_i32x4_shuffle(x0, x1, 0, 4, 1, 5), hi01 = wasm_i32x4_shuffle(x0, x1, 2, 6, 3, 7);
      v128_t lo23 = wasm_i32x4_shuffle(x2, x3, 0, 4, 1, 5), hi23 = wasm_i32x4_shuffle(x2, x3, 2, 6, 3, 7);
      wasm_v128_store(panel + 4 * p, wasm_i32x4_shuffle(lo01, lo23, 0, 1, 4, 5));
      wasm_v128_store(panel + 4 * p + 4, wasm_i32x4_shuffle(lo01, lo23, 2, 3, 6, 7));
      wasm_v128_store(panel + 4 * p + 8, wasm_i32x4_shuffle(hi01, hi23, 0, 1, 4, 5));
      wasm_v128_store(panel + 4 * p + 12, wasm_i32x4_shuffle(hi01, hi23, 2, 3, 6, 7));
    }
  }
  for (; p < depth; ++p)
    for (int r = 0; r < 4; ++r) panel[4 * p + r] = a(i + r, p0 + p);
}

// Rows [i, i + 4) of C, pass by pass
inline void rows4(const Product& g, long i) {
  alignas(16) float panel[4 * DEPTH];
  for (int p0 = 0; p0 < g.P; p0 += DEPTH) {
    const int depth = g.P - p0 < DEPTH ? g.P - p0 : DEPTH;
    pack4(g.a, i, p0, depth, panel);
    const Pass pass{panel, g.b + p0 * g.ldb, depth, p0 > 0 || g.accumulate, p0 == 0 && g.bias};
    int j = 0;
    for (; j + 8 <= g.N; j += 8) block4x8(g, pass, i, j);
    for (; j < g.N; ++j) column4(g, pass, i, j);
  }
}
#endif

// Rows [begin, end) of the product g (P >= 1).
inline void gemm(const Product& g, int begin, int end) {
  int i = begin;
#ifdef __wasm_simd128__
  for (; i + 4 <= end; i += 4) rows4(g, i);
#endif
  for (; i < end; ++i) {  // whole rows of B scaled and added: contiguous, so cache-friendly
    float* row = g.c + static_cast<long>(i) * g.ldc;
    if (!g.accumulate)
      for (int j = 0; j < g.N; ++j) row[j] = 0.0f;
    for (int p = 0; p < g.P; ++p) axpy(row, g.b + p * g.ldb, g.a(i, p), g.N);
    if (g.bias)
      for (int j = 0; j < g.N; ++j) row[j] += g.bias[j];
  }
}

// out (cols x rows) = in^T, where in's rows are `stride` apart
inline void transpose(float* out, const float* in, int rows, int cols, long stride) {
  for (int r = 0; r < rows; ++r)
    for (int k = 0; k < cols; ++k) out[static_cast<long>(k) * rows + r] = in[r * stride + k];
}

// ---- elementwise ------------------------------------------------------------------------------
//
// The SIMD build computes exp and erf four lanes at a time from polynomials; the scalar build
// calls the C library. Both differ from PyTorch by rounding-sized amounts: the loss drift's job.

#ifdef __wasm_simd128__
inline v128_t splat(float x) { return wasm_f32x4_splat(x); }

// e^x for x <= 0 (the trainer's only inputs: values minus their maximum, and -x^2 / 2). x is
// split as k ln 2 + r with |r| <= ln 2 / 2 (ln 2 in two parts, so k ln2_hi is exact); e^r is its
// Taylor series to r^7, whose truncation error is below 1e-8 there; 2^k is written straight into
// the exponent bits. k is rounded by adding 1.5 * 2^23, which leaves k in the sum's low mantissa
// bits (cheaper in V8 than f32x4.nearest and a float-to-int conversion). Below -87.33, where e^x
// leaves fp32's normal range, the answer is 0.
inline v128_t exp4(v128_t x) {
  const v128_t low = splat(-87.33654f), magic = splat(12582912.0f);
  v128_t underflow = wasm_f32x4_lt(x, low);
  x = wasm_f32x4_max(x, low);
  v128_t shifted = wasm_f32x4_add(wasm_f32x4_mul(x, splat(1.44269504f)), magic);
  v128_t k = wasm_f32x4_sub(shifted, magic);
  v128_t r = wasm_f32x4_sub(wasm_f32x4_sub(x, wasm_f32x4_mul(k, splat(0.693145751953125f))),
                            wasm_f32x4_mul(k, splat(1.42860682e-6f)));
  constexpr float taylor[] = {1.0f / 720, 1.0f / 120, 1.0f / 24, 1.0f / 6, 0.5f, 1.0f, 1.0f};
  v128_t e = splat(1.0f / 5040);
  for (float c : taylor) e = wasm_f32x4_add(wasm_f32x4_mul(e, r), splat(c));
  // (bits of 1.5 * 2^23 + k) + 127, shifted up 23: the magic's bits shift out, leaving 2^k's
  v128_t two_k = wasm_i32x4_shl(wasm_i32x4_add(shifted, wasm_i32x4_splat(127)), 23);
  return wasm_v128_andnot(wasm_f32x4_mul(e, two_k), underflow);
}

// Phi(x) = (1 + erf(x / sqrt 2)) / 2, the standard normal's CDF, and e^(-x^2 / 2) on the side.
// erf by Abramowitz & Stegun 7.1.26 (|error| < 1.5e-7), the approximation PyTorch's own
// vectorised CPU kernel uses: erf(a) = 1 - t (a1 + t (a2 + ... + t a5)) e^(-a^2), t = 1 / (1 + p a).
inline v128_t normal_cdf4(v128_t x, v128_t& gauss) {
  v128_t a = wasm_f32x4_abs(wasm_f32x4_mul(x, splat(0.70710678f)));
  v128_t t = wasm_f32x4_div(splat(1.0f), wasm_f32x4_add(splat(1.0f), wasm_f32x4_mul(a, splat(0.3275911f))));
  constexpr float as[] = {-1.453152027f, 1.421413741f, -0.284496736f, 0.254829592f};
  v128_t poly = splat(1.061405429f);
  for (float c : as) poly = wasm_f32x4_add(wasm_f32x4_mul(poly, t), splat(c));
  gauss = exp4(wasm_f32x4_neg(wasm_f32x4_mul(a, a)));
  v128_t erf_a = wasm_f32x4_abs(wasm_f32x4_sub(splat(1.0f), wasm_f32x4_mul(wasm_f32x4_mul(poly, t), gauss)));
  v128_t erf = wasm_v128_bitselect(x, erf_a, wasm_i32x4_splat(INT32_MIN));  // with x's sign
  return wasm_f32x4_mul(splat(0.5f), wasm_f32x4_add(splat(1.0f), erf));
}
#endif

// out[i] = gelu(x[i]) = x[i] Phi(x[i]) over n values (torch's exact GELU), and x[i] replaced by
// gelu'(x[i]) = Phi(x) + x phi(x), the slope the backward pass multiplies by. Both need Phi and
// e^(-x^2 / 2), so computing the slope here, once, spares the backward pass an erf and an exp per
// value; it gives the same bits as computing it there, and x is needed for nothing else.
inline void gelu(float* out, float* x, long n) {
  long i = 0;
#ifdef __wasm_simd128__
  for (v128_t gauss; i + 4 <= n; i += 4) {
    v128_t v = wasm_v128_load(x + i), cdf = normal_cdf4(v, gauss);
    v128_t pdf = wasm_f32x4_mul(gauss, splat(0.39894228f));
    wasm_v128_store(out + i, wasm_f32x4_mul(v, cdf));
    wasm_v128_store(x + i, wasm_f32x4_add(cdf, wasm_f32x4_mul(v, pdf)));
  }
#endif
  for (; i < n; ++i) {
    float v = x[i], twice_cdf = 1.0f + std::erf(v * 0.70710678f);
    out[i] = 0.5f * v * twice_cdf;
    x[i] = 0.5f * twice_cdf + v * std::exp(-0.5f * v * v) * 0.39894228f;
  }
}

// d[i] *= s[i] over n values: a gradient through an elementwise function, given its slopes
inline void scale(float* d, const float* s, long n) {
  long i = 0;
#ifdef __wasm_simd128__
  for (; i + 4 <= n; i += 4) wasm_v128_store(d + i, wasm_f32x4_mul(wasm_v128_load(d + i), wasm_v128_load(s + i)));
#endif
  for (; i < n; ++i) d[i] *= s[i];
}

// The largest of x[0..n), n >= 1
inline float vmax(const float* x, int n) {
  int i = 0;
  float peak = x[0];
#ifdef __wasm_simd128__
  if (n >= 4) {
    v128_t m = wasm_v128_load(x);
    for (i = 4; i + 4 <= n; i += 4) m = wasm_f32x4_pmax(m, wasm_v128_load(x + i));
    float lanes[4];
    wasm_v128_store(lanes, m);
    for (float v : lanes) peak = v > peak ? v : peak;
  }
#endif
  for (; i < n; ++i) peak = x[i] > peak ? x[i] : peak;
  return peak;
}

// p[i] = e^(z[i] - shift) over n values (p may be z); returns their sum. Softmax's middle step.
inline float exp_shifted(float* p, const float* z, float shift, int n) {
  int i = 0;
  float total = 0.0f;
#ifdef __wasm_simd128__
  v128_t sum = splat(0.0f), s = splat(shift);
  for (; i + 4 <= n; i += 4) {
    v128_t e = exp4(wasm_f32x4_sub(wasm_v128_load(z + i), s));
    wasm_v128_store(p + i, e);
    sum = wasm_f32x4_add(sum, e);
  }
  total = lane_sum(sum);
#endif
  for (; i < n; ++i) total += (p[i] = std::exp(z[i] - shift));
  return total;
}

}  // namespace kernels
