// The three matrix products a linear layer needs, in 128-bit WASM SIMD when the build has it
// (-msimd128) and in plain loops when it does not. All matrices are row-major float32.
//
//   forward   y = x W^T + b       matmul_nt   (M x K) . (N x K)^T    dot products of rows
//   backward  dx = dy W           matmul_nn   (M x N) . (N x K)      rows of W scaled and added
//   backward  dW += dy^T x        matmul_tn   (M x N)^T . (M x K)    rows of x scaled and added
//
// Each takes a row range [begin, end) of its output, so the thread pool can hand out rows with
// no two threads writing the same memory.
#pragma once

#ifdef __wasm_simd128__
#include <wasm_simd128.h>
#endif

namespace kernels {

#ifdef __wasm_simd128__
inline float hsum(v128_t v) {
  return wasm_f32x4_extract_lane(v, 0) + wasm_f32x4_extract_lane(v, 1) + wasm_f32x4_extract_lane(v, 2) +
         wasm_f32x4_extract_lane(v, 3);
}

// y[i] += s * x[i] for i < n
inline void axpy(float* y, const float* x, float s, int n) {
  int i = 0;
  v128_t vs = wasm_f32x4_splat(s);
  for (; i + 4 <= n; i += 4) wasm_v128_store(y + i, wasm_f32x4_add(wasm_v128_load(y + i), wasm_f32x4_mul(vs, wasm_v128_load(x + i))));
  for (; i < n; ++i) y[i] += s * x[i];
}
#else
inline void axpy(float* y, const float* x, float s, int n) {
  for (int i = 0; i < n; ++i) y[i] += s * x[i];
}
#endif

// out[m][n] = a[m] . b[n] (+ bias[n]) for rows m in [begin, end).
inline void matmul_nt(float* out, const float* a, const float* b, const float* bias, int N, int K, int begin,
                      int end) {
  for (int m = begin; m < end; ++m) {
    const float* ar = a + static_cast<long>(m) * K;
    float* o = out + static_cast<long>(m) * N;
    int n = 0;
#ifdef __wasm_simd128__
    // four rows of b at a time: each load of a feeds four products
    for (; n + 4 <= N; n += 4) {
      const float* b0 = b + static_cast<long>(n) * K;
      const float *b1 = b0 + K, *b2 = b1 + K, *b3 = b2 + K;
      v128_t s0 = wasm_f32x4_splat(0), s1 = s0, s2 = s0, s3 = s0;
      int k = 0;
      for (; k + 4 <= K; k += 4) {
        v128_t va = wasm_v128_load(ar + k);
        s0 = wasm_f32x4_add(s0, wasm_f32x4_mul(va, wasm_v128_load(b0 + k)));
        s1 = wasm_f32x4_add(s1, wasm_f32x4_mul(va, wasm_v128_load(b1 + k)));
        s2 = wasm_f32x4_add(s2, wasm_f32x4_mul(va, wasm_v128_load(b2 + k)));
        s3 = wasm_f32x4_add(s3, wasm_f32x4_mul(va, wasm_v128_load(b3 + k)));
      }
      float r0 = hsum(s0), r1 = hsum(s1), r2 = hsum(s2), r3 = hsum(s3);
      for (; k < K; ++k) {
        r0 += ar[k] * b0[k];
        r1 += ar[k] * b1[k];
        r2 += ar[k] * b2[k];
        r3 += ar[k] * b3[k];
      }
      o[n] = r0 + (bias ? bias[n] : 0.0f);
      o[n + 1] = r1 + (bias ? bias[n + 1] : 0.0f);
      o[n + 2] = r2 + (bias ? bias[n + 2] : 0.0f);
      o[n + 3] = r3 + (bias ? bias[n + 3] : 0.0f);
    }
#endif
    for (; n < N; ++n) {
      const float* br = b + static_cast<long>(n) * K;
      float s = 0.0f;
      for (int k = 0; k < K; ++k) s += ar[k] * br[k];
      o[n] = s + (bias ? bias[n] : 0.0f);
    }
  }
}

// out[m] = sum_n a[m][n] * b[n] (rows of b, length K) for rows m in [begin, end).
inline void matmul_nn(float* out, const float* a, const float* b, int N, int K, int begin, int end) {
  for (int m = begin; m < end; ++m) {
    float* o = out + static_cast<long>(m) * K;
    for (int k = 0; k < K; ++k) o[k] = 0.0f;
    const float* ar = a + static_cast<long>(m) * N;
    for (int n = 0; n < N; ++n) axpy(o, b + static_cast<long>(n) * K, ar[n], K);
  }
}

// dw[n] += sum_m dy[m][n] * x[m] and db[n] += sum_m dy[m][n], for output rows n in [begin, end).
inline void matmul_tn(float* dw, float* db, const float* dy, const float* x, int M, int N, int K, int begin,
                      int end) {
  for (int n = begin; n < end; ++n) {
    float* w = dw + static_cast<long>(n) * K;
    float bias = 0.0f;
    for (int m = 0; m < M; ++m) {
      float g = dy[static_cast<long>(m) * N + n];
      bias += g;
      axpy(w, x + static_cast<long>(m) * K, g, K);
    }
    if (db) db[n] += bias;
  }
}

}  // namespace kernels
