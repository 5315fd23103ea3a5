// The matrix product every linear layer needs, forward and backward, in 128-bit WASM SIMD when
// the build has it (-msimd128) and in plain loops when it does not. Row-major float32.
//
//   C[i][j] (+)= sum_p A(i, p) * B[p][j]  (+ bias[j])
//
// B is read in rows (contiguous j); A through two strides, so one kernel serves all three uses
// without copying A:
//
//   forward   y  = x W^T + b     A = x  (stride K, 1)   B = W^T (transposed once per step)
//   backward  dx = dy W          A = dy (stride N, 1)   B = W
//   backward  dW += dy^T x       A = dy (stride 1, N)   B = x
//
// The SIMD path keeps a 4 x 8 block of C in eight registers: per step p it loads two vectors of
// B's row and broadcasts four values of A, for 32 multiply-adds per six loads (the simple
// dot-product loop does one per two). It takes a row range [begin, end) of C, so the thread
// pool can hand out rows with no two threads writing the same memory.
#pragma once

#ifdef __wasm_simd128__
#include <wasm_simd128.h>
#endif

namespace kernels {

struct Operand {
  const float* data;
  long row, col;  // strides: A(i, p) = data[i * row + p * col]
  float operator()(long i, long p) const { return data[i * row + p * col]; }
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

// x . y over n values
inline float vdot(const float* x, const float* y, int n) {
  int i = 0;
  float s = 0.0f;
#ifdef __wasm_simd128__
  v128_t acc = wasm_f32x4_splat(0.0f);
  for (; i + 4 <= n; i += 4) acc = wasm_f32x4_add(acc, wasm_f32x4_mul(wasm_v128_load(x + i), wasm_v128_load(y + i)));
  s = wasm_f32x4_extract_lane(acc, 0) + wasm_f32x4_extract_lane(acc, 1) + wasm_f32x4_extract_lane(acc, 2) +
      wasm_f32x4_extract_lane(acc, 3);
#endif
  for (; i < n; ++i) s += x[i] * y[i];
  return s;
}

// One element of C the plain way (columns past the last SIMD block).
inline float dot(const Operand& a, const float* b, long i, long j, int N, int P) {
  float s = 0.0f;
  for (int p = 0; p < P; ++p) s += a(i, p) * b[static_cast<long>(p) * N + j];
  return s;
}

// Rows [begin, end) of C (M x N) = A (M x P) . B (P x N), added to C when `accumulate`.
inline void gemm(float* c, const Operand& a, const float* b, const float* bias, int N, int P, bool accumulate,
                 int begin, int end) {
  auto put = [&](long i, long j, float v) {
    float& out = c[i * N + j];
    out = (accumulate ? out : 0.0f) + v + (bias ? bias[j] : 0.0f);
  };
  int i = begin;
#ifdef __wasm_simd128__
  for (; i + 4 <= end; i += 4) {
    int j = 0;
    for (; j + 8 <= N; j += 8) {
      v128_t acc[4][2];
      for (auto& row : acc) row[0] = row[1] = wasm_f32x4_splat(0.0f);
      for (int p = 0; p < P; ++p) {
        const float* br = b + static_cast<long>(p) * N + j;
        v128_t b0 = wasm_v128_load(br), b1 = wasm_v128_load(br + 4);
        for (int r = 0; r < 4; ++r) {
          v128_t ar = wasm_f32x4_splat(a(i + r, p));
          acc[r][0] = wasm_f32x4_add(acc[r][0], wasm_f32x4_mul(ar, b0));
          acc[r][1] = wasm_f32x4_add(acc[r][1], wasm_f32x4_mul(ar, b1));
        }
      }
      for (int r = 0; r < 4; ++r) {
        float lanes[8];
        wasm_v128_store(lanes, acc[r][0]);
        wasm_v128_store(lanes + 4, acc[r][1]);
        for (int q = 0; q < 8; ++q) put(i + r, j + q, lanes[q]);
      }
    }
    for (; j < N; ++j)
      for (int r = 0; r < 4; ++r) put(i + r, j, dot(a, b, i + r, j, N, P));
  }
#endif
  for (; i < end; ++i) {  // whole rows of B scaled and added: contiguous, so cache-friendly
    float* row = c + static_cast<long>(i) * N;
    if (!accumulate)
      for (int j = 0; j < N; ++j) row[j] = 0.0f;
    for (int p = 0; p < P; ++p) axpy(row, b + static_cast<long>(p) * N, a(i, p), N);
    if (bias)
      for (int j = 0; j < N; ++j) row[j] += bias[j];
  }
}

// out (cols x rows) = in^T: the forward pass's W^T
inline void transpose(float* out, const float* in, int rows, int cols) {
  for (int r = 0; r < rows; ++r)
    for (int k = 0; k < cols; ++k) out[static_cast<long>(k) * rows + r] = in[static_cast<long>(r) * cols + k];
}

}  // namespace kernels
