// The oracle GPT (posttrainllm/model.py, default config: LayerNorm, GELU, learned positions,
// tied head, causal multi-head attention) trained with AdamW, in C++ for WebAssembly.
//
// It computes the same function as the PyTorch oracle, step for step: same parameters in the
// same order (the oracle's state_dict without the tied head), same batches (a seeded sampler
// that posttrainllm.wasm reproduces), same AdamW arithmetic as torch.optim.AdamW. Everything
// that differs — SIMD, threads, the order of float additions — is engineering, and the loss
// drift against the oracle is the number that checks it (book/math-vs-engineering.md).
//
// The C API (tg_*) is what JavaScript calls; errors return nonzero and leave a message in
// tg_error() instead of aborting, so a page can show it.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "kernels.h"
#include "pool.h"

// The order in which a loop adds up a row's sum is engineering (the loss drift measures it):
// this lets the compiler vectorise the sums in the loops that follow it.
#define REORDERED_SUMS _Pragma("clang fp reassociate(on)")

namespace {

struct Config {
  int vocab, block, layers, heads, embd, batch;
};

// splitmix64: counter-based, so Python reproduces the k-th draw as mix(seed + k * GOLDEN).
constexpr uint64_t GOLDEN = 0x9E3779B97F4A7C15ull;
struct Rng {
  uint64_t state;
  uint64_t next() {
    uint64_t z = (state += GOLDEN);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }  // [0, 1)
};

// One parameter tensor, as a slice of the flat parameter array.
struct Tensor {
  long offset, size;
  int rows;  // > 0 for a weight matrix, 0 for a bias or norm vector
  bool projection, gain;
};

struct Layer {
  Tensor ln1_w, ln1_b, qkv_w, qkv_b, proj_w, proj_b, ln2_w, ln2_b, up_w, up_b, down_w, down_b;
};

// Activations of one layer, kept for the backward pass.
struct Acts {
  float *x, *ln1, *ln1_mean, *ln1_rstd, *qkv, *att, *y, *x2, *ln2, *ln2_mean, *ln2_rstd;
  float *h, *g;  // the MLP's up projection and its GELU; after the forward pass, h holds GELU's slope at h
};

struct Model {
  Config cfg{};
  Pool* pool = nullptr;
  std::vector<Tensor> tensors;
  Tensor tok, pos, lnf_w, lnf_b;
  std::vector<Layer> layers;
  long n_params = 0;
  float *params = nullptr, *grads = nullptr, *m = nullptr, *v = nullptr;
  std::vector<Acts> acts;
  float *x_out, *lnf, *lnf_mean, *lnf_rstd, *logits, *probs, *row_loss;
  float *d_resid, *d_ln, *d_qkv, *d_y, *d_h, *d_x2;  // backward scratch
  float* wt;  // a weight matrix transposed, for the forward pass
  std::vector<int> x, y;
  std::vector<uint16_t> tokens;
  Rng batches{0};
  int step = 0;
  float lr = 3e-3f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0.0f;
  std::vector<void*> blocks;  // every allocation, freed together
};

Model* model = nullptr;
char error_message[512] = "";

int fail(const char* fmt, long a = 0, long b = 0, long c = 0) {
  std::snprintf(error_message, sizeof error_message, fmt, a, b, c);
  return 1;
}

float* at(Model& md, const Tensor& t) { return md.params + t.offset; }
float* grad(Model& md, const Tensor& t) { return md.grads + t.offset; }

Tensor add(Model& md, int rows, long cols, bool projection = false, bool gain = false) {
  Tensor t{md.n_params, rows ? rows * cols : cols, rows, projection, gain};
  md.n_params += t.size;
  md.tensors.push_back(t);
  return t;
}

// The oracle's state_dict order (head.weight is tok_emb.weight, so it is not repeated).
void lay_out(Model& md) {
  const Config& c = md.cfg;
  md.tok = add(md, c.vocab, c.embd);
  md.pos = add(md, c.block, c.embd);
  for (int l = 0; l < c.layers; ++l) {
    Layer L;
    L.ln1_w = add(md, 0, c.embd, false, true);
    L.ln1_b = add(md, 0, c.embd);
    L.qkv_w = add(md, 3 * c.embd, c.embd);
    L.qkv_b = add(md, 0, 3 * c.embd);
    L.proj_w = add(md, c.embd, c.embd, true);
    L.proj_b = add(md, 0, c.embd);
    L.ln2_w = add(md, 0, c.embd, false, true);
    L.ln2_b = add(md, 0, c.embd);
    L.up_w = add(md, 4 * c.embd, c.embd);
    L.up_b = add(md, 0, 4 * c.embd);
    L.down_w = add(md, c.embd, 4 * c.embd, true);
    L.down_b = add(md, 0, c.embd);
    md.layers.push_back(L);
  }
  md.lnf_w = add(md, 0, c.embd, false, true);
  md.lnf_b = add(md, 0, c.embd);
}

float* alloc(Model& md, long count, bool& ok) {
  void* p = ok ? std::calloc(static_cast<size_t>(count), sizeof(float)) : nullptr;
  if (!p) ok = false;
  else md.blocks.push_back(p);
  return static_cast<float*>(p);
}

void destroy(Model* md) {
  if (!md) return;
  for (void* p : md->blocks) std::free(p);
  delete md->pool;
  delete md;
}

// ---- forward pieces ---------------------------------------------------------------------------

void layernorm(Model& md, float* out, float* mean, float* rstd, const float* x, const float* w, const float* b,
               int rows) {
  const int C = md.cfg.embd;
  md.pool->parallel_for(rows, [&](int s, int e) {
    REORDERED_SUMS;
    for (int r = s; r < e; ++r) {
      const float* xr = x + static_cast<long>(r) * C;
      float mu = 0.0f, var = 0.0f;
      for (int i = 0; i < C; ++i) mu += xr[i];
      mu /= C;
      for (int i = 0; i < C; ++i) var += (xr[i] - mu) * (xr[i] - mu);
      float rs = 1.0f / std::sqrt(var / C + 1e-5f);  // biased variance, eps 1e-5: torch's LayerNorm
      float* o = out + static_cast<long>(r) * C;
      for (int i = 0; i < C; ++i) o[i] = (xr[i] - mu) * rs * w[i] + b[i];
      mean[r] = mu;
      rstd[r] = rs;
    }
  });
}

// out[i] += in[i] over rows x cols, the residual connection
void add_into(Model& md, float* out, const float* in, int rows, int cols) {
  md.pool->parallel_for(rows, [&](int s, int e) {
    for (long i = static_cast<long>(s) * cols; i < static_cast<long>(e) * cols; ++i) out[i] += in[i];
  });
}

// fn(begin, end) over row ranges of [0, rows) cut at multiples of 4, the SIMD kernel's block
template <class Fn>
void rows_parallel(Model& md, int rows, const Fn& fn) {
  md.pool->parallel_for((rows + 3) / 4, [&](int s, int e) { fn(4 * s, 4 * e < rows ? 4 * e : rows); });
}

void linear(Model& md, float* out, const float* in, const Tensor& w, const Tensor* b, int rows) {
  const int N = w.rows, K = static_cast<int>(w.size / w.rows);
  const float* B = b ? at(md, *b) : nullptr;
  md.pool->parallel_for(K, [&](int s, int e) {  // W^T's rows [s, e): W's columns [s, e)
    kernels::transpose(md.wt + static_cast<long>(s) * N, at(md, w) + s, N, e - s, K);
  });
  const kernels::Product g{.c = out, .ldc = N, .a = {in, K, 1}, .b = md.wt, .ldb = N, .N = N, .P = K, .bias = B};
  rows_parallel(md, rows, [&](int s, int e) { kernels::gemm(g, s, e); });
}

// The rows [i, i + 4) of a causal T x T score matrix need its first i + 4 columns, rounded up to
// the SIMD kernel's 8 (the extra ones are masked).
int causal_columns(int i, int T) { return (i + 11) / 8 * 8 < T ? (i + 11) / 8 * 8 : T; }
int causal_end(int i, int T) { return i + 4 < T ? i + 4 : T; }

// Causal attention for every (sequence, head): softmax(q k^T / sqrt(d)) v, probabilities kept.
// Each (sequence, head) is two small products on the SIMD kernel, row block by row block so that
// the masked half is mostly skipped: S = Q K^T, a softmax of each row of S in place, Y = P V.
void attention(Model& md, float* y, float* att, const float* qkv, int B, int T) {
  const int C = md.cfg.embd, H = md.cfg.heads, hs = C / H;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  md.pool->parallel_for(B * H, [&](int s, int e) {
    std::vector<float> kt(static_cast<size_t>(hs) * T);
    for (int u = s; u < e; ++u) {
      int b = u / H, h = u % H;
      const float* q = qkv + static_cast<long>(b) * T * 3 * C + h * hs;  // row t of this head's Q at q + t 3C
      const float *k = q + C, *v = q + 2 * C;
      float* p = att + static_cast<long>(u) * T * T;
      kernels::transpose(kt.data(), k, T, hs, 3 * C);
      for (int i = 0; i < T; i += 4)
        kernels::gemm({.c = p, .ldc = T, .a = {q, 3 * C, 1}, .b = kt.data(), .ldb = T, .N = causal_columns(i, T),
                       .P = hs},
                      i, causal_end(i, T));
      for (int i = 0; i < T; ++i) {
        float* row = p + static_cast<long>(i) * T;
        for (int j = 0; j <= i; ++j) row[j] *= scale;
        float total = kernels::exp_shifted(row, row, kernels::vmax(row, i + 1), i + 1);
        for (int j = 0; j <= i; ++j) row[j] /= total;
        for (int j = i + 1; j < T; ++j) row[j] = 0.0f;
      }
      for (int i = 0; i < T; i += 4)
        kernels::gemm({.c = y + static_cast<long>(b) * T * C + h * hs, .ldc = C, .a = {p, T, 1}, .b = v, .ldb = 3 * C,
                       .N = hs, .P = causal_end(i, T)},
                      i, causal_end(i, T));
    }
  });
}

// Logits (rows x vocab) for the tokens in md.x; with targets, the mean cross-entropy.
float forward(Model& md, int B, int T, bool targets) {
  const Config& c = md.cfg;
  const int C = c.embd, rows = B * T;
  float* x = md.acts[0].x;
  const float *tok = at(md, md.tok), *pos = at(md, md.pos);
  for (int r = 0; r < rows; ++r)
    for (int i = 0; i < C; ++i) x[static_cast<long>(r) * C + i] = tok[md.x[r] * C + i] + pos[(r % T) * C + i];
  for (int l = 0; l < c.layers; ++l) {
    Acts& a = md.acts[l];
    const Layer& L = md.layers[l];
    float* next = l + 1 < c.layers ? md.acts[l + 1].x : md.x_out;
    layernorm(md, a.ln1, a.ln1_mean, a.ln1_rstd, a.x, at(md, L.ln1_w), at(md, L.ln1_b), rows);
    linear(md, a.qkv, a.ln1, L.qkv_w, &L.qkv_b, rows);
    attention(md, a.y, a.att, a.qkv, B, T);
    linear(md, a.x2, a.y, L.proj_w, &L.proj_b, rows);
    add_into(md, a.x2, a.x, rows, C);
    layernorm(md, a.ln2, a.ln2_mean, a.ln2_rstd, a.x2, at(md, L.ln2_w), at(md, L.ln2_b), rows);
    linear(md, a.h, a.ln2, L.up_w, &L.up_b, rows);
    md.pool->parallel_for(rows, [&](int s, int e) {
      long at = static_cast<long>(s) * 4 * C;
      kernels::gelu(a.g + at, a.h + at, static_cast<long>(e - s) * 4 * C);
    });
    linear(md, next, a.g, L.down_w, &L.down_b, rows);
    add_into(md, next, a.x2, rows, C);
  }
  layernorm(md, md.lnf, md.lnf_mean, md.lnf_rstd, md.x_out, at(md, md.lnf_w), at(md, md.lnf_b), rows);
  linear(md, md.logits, md.lnf, md.tok, nullptr, rows);  // the head is the token embedding (tied)
  if (!targets) return 0.0f;
  const int V = c.vocab;
  md.pool->parallel_for(rows, [&](int s, int e) {
    for (int r = s; r < e; ++r) {
      const float* z = md.logits + static_cast<long>(r) * V;
      float* p = md.probs + static_cast<long>(r) * V;
      float total = kernels::exp_shifted(p, z, kernels::vmax(z, V), V);
      for (int i = 0; i < V; ++i) p[i] /= total;
      md.row_loss[r] = -std::log(p[md.y[r]]);
    }
  });
  double loss = 0.0;  // summed in row order, whatever the thread count
  for (int r = 0; r < rows; ++r) loss += md.row_loss[r];
  return static_cast<float>(loss / rows);
}

// ---- backward pieces --------------------------------------------------------------------------

// dx += d(layernorm)/dx . dout, in parallel over rows; then dw, db += their gradients.
void layernorm_backward(Model& md, float* dx, float* dw, float* db, const float* dout, const float* x,
                        const float* mean, const float* rstd, const float* w, int rows) {
  const int C = md.cfg.embd;
  md.pool->parallel_for(rows, [&](int s, int e) {
    REORDERED_SUMS;
    for (int r = s; r < e; ++r) {
      const float *d = dout + static_cast<long>(r) * C, *xr = x + static_cast<long>(r) * C;
      float mean_dxhat = 0.0f, mean_dxhat_xhat = 0.0f;
      for (int i = 0; i < C; ++i) {
        float dxhat = d[i] * w[i];
        mean_dxhat += dxhat;
        mean_dxhat_xhat += dxhat * (xr[i] - mean[r]) * rstd[r];
      }
      mean_dxhat /= C;
      mean_dxhat_xhat /= C;
      float* o = dx + static_cast<long>(r) * C;
      for (int i = 0; i < C; ++i) {
        float xhat = (xr[i] - mean[r]) * rstd[r];
        o[i] += rstd[r] * (d[i] * w[i] - mean_dxhat - xhat * mean_dxhat_xhat);
      }
    }
  });
  // dw, db: on this thread, row after row, which reads whole rows (a split by columns would read
  // each row in pieces) and keeps the order of the sums whatever the thread count
  float *__restrict gain = dw, *__restrict bias = db;  // apart from everything read: vectorisable
  for (int r = 0; r < rows; ++r) {
    const float *d = dout + static_cast<long>(r) * C, *xr = x + static_cast<long>(r) * C;
    for (int i = 0; i < C; ++i) {
      gain[i] += d[i] * (xr[i] - mean[r]) * rstd[r];
      bias[i] += d[i];
    }
  }
}

// Given d(out) for out = in W^T + b: accumulate dW and db, and write d(in).
void linear_backward(Model& md, float* d_in, const float* d_out, const float* in, const Tensor& w, const Tensor* b,
                     int rows) {
  const int N = w.rows, K = static_cast<int>(w.size / w.rows);
  float *dW = grad(md, w), *dB = b ? grad(md, *b) : nullptr;
  const kernels::Product weights{.c = dW, .ldc = K, .a = {d_out, 1, N}, .b = in, .ldb = K, .N = K, .P = rows,
                                 .accumulate = true};  // dW += dy^T x
  rows_parallel(md, N, [&](int s, int e) {
    kernels::gemm(weights, s, e);
    if (dB)
      for (int m = 0; m < rows; ++m)  // along rows of dy, so the reads are contiguous
        for (int n = s; n < e; ++n) dB[n] += d_out[static_cast<long>(m) * N + n];
  });
  const kernels::Product inputs{.c = d_in, .ldc = K, .a = {d_out, N, 1}, .b = at(md, w), .ldb = K, .N = K, .P = N};
  rows_parallel(md, rows, [&](int s, int e) { kernels::gemm(inputs, s, e); });
}

// attention()'s backward for every (sequence, head), from its kept probabilities P:
// dP = dY V^T, dS = P (dP - rowsum(P dP)) / sqrt(d), dQ = dS K, dK = dS^T Q, dV = P^T dY.
void attention_backward(Model& md, float* d_qkv, const float* d_y, const float* qkv, const float* att, int B,
                        int T) {
  const int C = md.cfg.embd, H = md.cfg.heads, hs = C / H;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  md.pool->parallel_for(B * H, [&](int s, int e) {
    std::vector<float> vt(static_cast<size_t>(hs) * T), ds(static_cast<size_t>(T) * T);
    for (int u = s; u < e; ++u) {
      int b = u / H, h = u % H;
      const long at_b = static_cast<long>(b) * T * 3 * C + h * hs;
      const float *q = qkv + at_b, *k = q + C, *v = q + 2 * C, *dy = d_y + static_cast<long>(b) * T * C + h * hs;
      float *dq = d_qkv + at_b, *dk = dq + C, *dv = dq + 2 * C;
      const float* p = att + static_cast<long>(u) * T * T;
      kernels::transpose(vt.data(), v, T, hs, 3 * C);
      for (int i = 0; i < T; i += 4)
        kernels::gemm({.c = ds.data(), .ldc = T, .a = {dy, C, 1}, .b = vt.data(), .ldb = T,
                       .N = causal_columns(i, T), .P = hs},
                      i, causal_end(i, T));
      for (int i = 0; i < T; ++i) {
        const float* pr = p + static_cast<long>(i) * T;
        float* row = ds.data() + static_cast<long>(i) * T;
        float weighted = kernels::vdot(pr, row, i + 1);  // sum_j p_ij dp_ij, the softmax's backward term
        for (int j = 0; j <= i; ++j) row[j] = pr[j] * (row[j] - weighted) * scale;
        for (int j = i + 1; j < T; ++j) row[j] = 0.0f;
      }
      for (int i = 0; i < T; i += 4)
        kernels::gemm({.c = dq, .ldc = 3 * C, .a = {ds.data(), T, 1}, .b = k, .ldb = 3 * C, .N = hs,
                       .P = causal_end(i, T)},
                      i, causal_end(i, T));
      kernels::gemm({.c = dk, .ldc = 3 * C, .a = {ds.data(), 1, T}, .b = q, .ldb = 3 * C, .N = hs, .P = T}, 0, T);
      kernels::gemm({.c = dv, .ldc = 3 * C, .a = {p, 1, T}, .b = dy, .ldb = C, .N = hs, .P = T}, 0, T);
    }
  });
}

void backward(Model& md, int B, int T) {
  const Config& c = md.cfg;
  const int C = c.embd, V = c.vocab, rows = B * T;
  std::memset(md.grads, 0, sizeof(float) * md.n_params);
  // d loss / d logits = (p - onehot) / rows, written over the probabilities
  md.pool->parallel_for(rows, [&](int s, int e) {
    for (int r = s; r < e; ++r) {
      float* p = md.probs + static_cast<long>(r) * V;
      p[md.y[r]] -= 1.0f;
      for (int i = 0; i < V; ++i) p[i] /= rows;
    }
  });
  linear_backward(md, md.d_ln, md.probs, md.lnf, md.tok, nullptr, rows);
  std::memset(md.d_resid, 0, sizeof(float) * rows * C);
  layernorm_backward(md, md.d_resid, grad(md, md.lnf_w), grad(md, md.lnf_b), md.d_ln, md.x_out, md.lnf_mean,
                     md.lnf_rstd, at(md, md.lnf_w), rows);
  for (int l = c.layers - 1; l >= 0; --l) {
    Acts& a = md.acts[l];
    const Layer& L = md.layers[l];
    // MLP: next = x2 + down(gelu(up(ln2(x2))))
    linear_backward(md, md.d_h, md.d_resid, a.g, L.down_w, &L.down_b, rows);
    md.pool->parallel_for(rows, [&](int s, int e) {
      long at = static_cast<long>(s) * 4 * C;
      kernels::scale(md.d_h + at, a.h + at, static_cast<long>(e - s) * 4 * C);
    });
    linear_backward(md, md.d_ln, md.d_h, a.ln2, L.up_w, &L.up_b, rows);
    std::memcpy(md.d_x2, md.d_resid, sizeof(float) * rows * C);
    layernorm_backward(md, md.d_x2, grad(md, L.ln2_w), grad(md, L.ln2_b), md.d_ln, a.x2, a.ln2_mean,
                       a.ln2_rstd, at(md, L.ln2_w), rows);
    // attention: x2 = x + proj(attend(qkv(ln1(x))))
    linear_backward(md, md.d_y, md.d_x2, a.y, L.proj_w, &L.proj_b, rows);
    attention_backward(md, md.d_qkv, md.d_y, a.qkv, a.att, B, T);
    linear_backward(md, md.d_ln, md.d_qkv, a.ln1, L.qkv_w, &L.qkv_b, rows);
    std::memcpy(md.d_resid, md.d_x2, sizeof(float) * rows * C);
    layernorm_backward(md, md.d_resid, grad(md, L.ln1_w), grad(md, L.ln1_b), md.d_ln, a.x, a.ln1_mean,
                       a.ln1_rstd, at(md, L.ln1_w), rows);
  }
  float *dtok = grad(md, md.tok), *dpos = grad(md, md.pos);
  for (int r = 0; r < rows; ++r) {
    kernels::axpy(dtok + static_cast<long>(md.x[r]) * C, md.d_resid + static_cast<long>(r) * C, 1.0f, C);
    kernels::axpy(dpos + static_cast<long>(r % T) * C, md.d_resid + static_cast<long>(r) * C, 1.0f, C);
  }
}

// torch.optim.AdamW's update, in its order of operations (bias corrections in double, as
// Python computes them).
void adamw(Model& md) {
  ++md.step;
  const double bc1 = 1.0 - std::pow(static_cast<double>(md.beta1), md.step);
  const double bc2_sqrt = std::sqrt(1.0 - std::pow(static_cast<double>(md.beta2), md.step));
  const float step_size = static_cast<float>(md.lr / bc1), decay = 1.0f - md.lr * md.weight_decay;
  const float b1 = 1.0f - md.beta1, b2 = 1.0f - md.beta2;
  const float beta2 = md.beta2, eps = md.eps, bc2 = static_cast<float>(bc2_sqrt);
  // four arrays that never overlap: saying so lets the compiler vectorise the loop
  float *__restrict params = md.params, *__restrict m = md.m, *__restrict v = md.v;
  const float* __restrict grads = md.grads;
  md.pool->parallel_for(static_cast<int>(md.n_params), [&](int s, int e) {
    for (long i = s; i < e; ++i) {
      float g = grads[i];
      params[i] *= decay;
      m[i] += b1 * (g - m[i]);
      v[i] = v[i] * beta2 + b2 * g * g;
      float denom = std::sqrt(v[i]) / bc2 + eps;
      params[i] -= step_size * (m[i] / denom);
    }
  });
}

void next_batch(Model& md) {
  const int B = md.cfg.batch, T = md.cfg.block;
  const uint64_t span = md.tokens.size() - T;
  for (int b = 0; b < B; ++b) {
    uint64_t start = md.batches.next() % span;
    for (int t = 0; t < T; ++t) {
      md.x[b * T + t] = md.tokens[start + t];
      md.y[b * T + t] = md.tokens[start + t + 1];
    }
  }
}

bool ready() {
  if (model) return true;
  fail("no model: call tg_create first");
  return false;
}

}  // namespace

extern "C" {

const char* tg_error() { return error_message; }

// A model with this shape, its parameters at the oracle's initialisation from `seed` (normal,
// std 0.02, residual projections scaled by 1/sqrt(2 layers), biases 0, gains 1).
int tg_create(int vocab, int block, int layers, int heads, int embd, int batch, int threads, uint32_t seed) {
  destroy(model);
  model = nullptr;
  if (vocab < 2 || block < 1 || layers < 1 || heads < 1 || embd < 1 || batch < 1 || vocab > 65536)
    return fail("bad config: every size must be positive (and vocab between 2 and 65536)");
  if (embd % heads) return fail("n_embd=%ld does not split into n_head=%ld heads", embd, heads);
  auto* md = new Model;
  md->cfg = {vocab, block, layers, heads, embd, batch};
  lay_out(*md);
  const long rows = static_cast<long>(batch) * block, C = embd;
  bool ok = true;
  md->params = alloc(*md, md->n_params, ok);
  md->grads = alloc(*md, md->n_params, ok);
  md->m = alloc(*md, md->n_params, ok);
  md->v = alloc(*md, md->n_params, ok);
  for (int l = 0; l < layers; ++l) {
    Acts a;
    a.x = alloc(*md, rows * C, ok);
    a.ln1 = alloc(*md, rows * C, ok);
    a.ln1_mean = alloc(*md, rows, ok);
    a.ln1_rstd = alloc(*md, rows, ok);
    a.qkv = alloc(*md, rows * 3 * C, ok);
    a.att = alloc(*md, static_cast<long>(batch) * heads * block * block, ok);
    a.y = alloc(*md, rows * C, ok);
    a.x2 = alloc(*md, rows * C, ok);
    a.ln2 = alloc(*md, rows * C, ok);
    a.ln2_mean = alloc(*md, rows, ok);
    a.ln2_rstd = alloc(*md, rows, ok);
    a.h = alloc(*md, rows * 4 * C, ok);
    a.g = alloc(*md, rows * 4 * C, ok);
    md->acts.push_back(a);
  }
  md->x_out = alloc(*md, rows * C, ok);
  md->lnf = alloc(*md, rows * C, ok);
  md->lnf_mean = alloc(*md, rows, ok);
  md->lnf_rstd = alloc(*md, rows, ok);
  md->logits = alloc(*md, rows * vocab, ok);
  md->probs = alloc(*md, rows * vocab, ok);
  md->row_loss = alloc(*md, rows, ok);
  md->d_resid = alloc(*md, rows * C, ok);
  md->d_ln = alloc(*md, rows * C, ok);
  md->d_qkv = alloc(*md, rows * 3 * C, ok);
  md->d_y = alloc(*md, rows * C, ok);
  md->d_h = alloc(*md, rows * 4 * C, ok);
  md->d_x2 = alloc(*md, rows * C, ok);
  md->wt = alloc(*md, (vocab > 4 * C ? vocab : 4 * C) * C, ok);
  if (!ok) {
    long floats = 4 * md->n_params + layers * (rows * (13 * C + 4) + static_cast<long>(batch) * heads * block * block) +
                  rows * (10 * C + 2 * vocab + 3) + (vocab > 4 * C ? vocab : 4 * C) * C;
    destroy(md);
    return fail("out of memory: this model and batch need %ld MB of activations and optimizer state, more than "
                "this module's memory can hold (a smaller batch, block or model fits)",
                floats * 4 / (1 << 20));
  }
  md->x.resize(rows);
  md->y.resize(rows);
  Rng init{seed};
  for (const Tensor& t : md->tensors) {
    float* p = md->params + t.offset;
    double std = t.projection ? 0.02 / std::sqrt(2.0 * layers) : 0.02;
    for (long i = 0; i < t.size; ++i) {
      if (!t.rows) {
        p[i] = t.gain ? 1.0f : 0.0f;
        continue;
      }
      double u1 = 1.0 - init.uniform(), u2 = init.uniform();  // Box-Muller, one normal per two draws
      p[i] = static_cast<float>(std * std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
    }
  }
  md->pool = new Pool(threads);
  model = md;
  return 0;
}

int tg_threads() { return model ? model->pool->threads() : 0; }
long tg_n_params() { return model ? model->n_params : 0; }
float* tg_params() { return model ? model->params : nullptr; }
float* tg_grads() { return model ? model->grads : nullptr; }
float* tg_logits() { return model ? model->logits : nullptr; }
int* tg_batch_inputs() { return model ? model->x.data() : nullptr; }

// Replace the parameters with a weights file's contents (posttrainllm.wasm.weights_bytes):
// "PTLGPT1\0", six int32 (vocab, block, layers, heads, embd, n_params), then the float32s.
int tg_load(const uint8_t* bytes, long n) {
  if (!ready()) return 1;
  const Config& c = model->cfg;
  if (n < 32 || std::memcmp(bytes, "PTLGPT1", 8) != 0)
    return fail("not a posttrainllm weights file (no PTLGPT1 header; %ld bytes)", n);
  int32_t h[6];
  std::memcpy(h, bytes + 8, sizeof h);
  if (h[0] != c.vocab || h[1] != c.block || h[2] != c.layers || h[3] != c.heads || h[4] != c.embd) {
    std::snprintf(error_message, sizeof error_message,
                  "weights of the wrong shape: the file is for vocab %d, block %d, %d layers, %d heads, width %d; "
                  "this trainer has vocab %d, block %d, %d layers, %d heads, width %d",
                  h[0], h[1], h[2], h[3], h[4], c.vocab, c.block, c.layers, c.heads, c.embd);
    return 1;
  }
  if (h[5] != model->n_params) return fail("weights file has %ld parameters, the model %ld", h[5], model->n_params);
  long need = 32 + 4 * model->n_params;
  if (n != need) return fail("weights file truncated or padded: %ld bytes, expected %ld", n, need);
  std::memcpy(model->params, bytes + 32, 4 * model->n_params);
  std::memset(model->m, 0, sizeof(float) * model->n_params);
  std::memset(model->v, 0, sizeof(float) * model->n_params);
  model->step = 0;
  return 0;
}

// The training text as token ids; batches are drawn from it with the sampler seeded by `seed`.
int tg_set_tokens(const uint16_t* ids, long n, uint32_t seed) {
  if (!ready()) return 1;
  if (n <= model->cfg.block + 1) return fail("need more than block_size + 1 = %ld tokens, got %ld", model->cfg.block + 1, n);
  for (long i = 0; i < n; ++i)
    if (ids[i] >= model->cfg.vocab) return fail("token %ld is id %ld, outside the vocabulary of %ld", i, ids[i], model->cfg.vocab);
  model->tokens.assign(ids, ids + n);
  model->batches.state = seed;
  return 0;
}

// AdamW's hyperparameters; a NaN, an infinity or a value out of range is refused, since it would
// turn every weight into NaN on the next step.
int tg_set_adamw(float lr, float beta1, float beta2, float eps, float weight_decay) {
  if (!ready()) return 1;
  if (!(lr >= 0 && lr < INFINITY)) return fail("AdamW: the learning rate must be a finite number of 0 or more");
  if (!(beta1 >= 0 && beta1 < 1 && beta2 >= 0 && beta2 < 1)) return fail("AdamW: beta1 and beta2 must lie in [0, 1)");
  if (!(eps > 0 && eps < INFINITY)) return fail("AdamW: eps must be a finite number above 0");
  if (!(weight_decay >= 0 && weight_decay < INFINITY)) return fail("AdamW: weight decay must be finite and 0 or more");
  model->lr = lr;
  model->beta1 = beta1;
  model->beta2 = beta2;
  model->eps = eps;
  model->weight_decay = weight_decay;
  return 0;
}

// Loss and gradients for the batch (inputs, targets), each batch x block ids; no update.
float tg_loss_and_grads(const int32_t* inputs, const int32_t* targets) {
  if (!ready()) return NAN;
  long rows = static_cast<long>(model->cfg.batch) * model->cfg.block;
  for (long i = 0; i < rows; ++i) {  // an id outside the vocabulary would index past the embedding
    if (inputs[i] < 0 || inputs[i] >= model->cfg.vocab) {
      fail("input %ld is id %ld, outside the vocabulary of %ld", i, inputs[i], model->cfg.vocab);
      return NAN;
    }
    if (targets[i] < 0 || targets[i] >= model->cfg.vocab) {
      fail("target %ld is id %ld, outside the vocabulary of %ld", i, targets[i], model->cfg.vocab);
      return NAN;
    }
  }
  std::memcpy(model->x.data(), inputs, 4 * rows);
  std::memcpy(model->y.data(), targets, 4 * rows);
  float loss = forward(*model, model->cfg.batch, model->cfg.block, true);
  backward(*model, model->cfg.batch, model->cfg.block);
  return loss;
}

// One training step on the next batch: forward, backward, AdamW. Returns the batch's loss.
float tg_step() {
  if (!ready()) return NAN;
  if (model->tokens.empty()) {
    fail("no training tokens: call tg_set_tokens first");
    return NAN;
  }
  next_batch(*model);
  float loss = forward(*model, model->cfg.batch, model->cfg.block, true);
  backward(*model, model->cfg.batch, model->cfg.block);
  adamw(*model);
  return loss;
}

// Extend `ids` (n given, room for n + count) by `count` sampled tokens at `temperature`.
int tg_generate(int32_t* ids, int n, int count, float temperature, uint32_t seed) {
  if (!ready()) return 1;
  if (n < 1) return fail("generation needs a prompt of at least one token");
  Rng rng{seed};
  const int V = model->cfg.vocab, T = model->cfg.block;
  for (int s = 0; s < count; ++s, ++n) {
    int t = n < T ? n : T;
    for (int i = 0; i < t; ++i) model->x[i] = ids[n - t + i];
    forward(*model, 1, t, false);
    const float* z = model->logits + static_cast<long>(t - 1) * V;
    float peak = -INFINITY;
    for (int i = 0; i < V; ++i) peak = z[i] > peak ? z[i] : peak;
    std::vector<double> w(V);
    double total = 0.0;
    for (int i = 0; i < V; ++i) total += (w[i] = std::exp((z[i] - peak) / temperature));
    double pick = rng.uniform() * total;
    int token = V - 1;
    for (int i = 0; i < V; ++i) {
      if ((pick -= w[i]) < 0) {
        token = i;
        break;
      }
    }
    ids[n] = token;
  }
  return 0;
}

// The benchmark's kernel alone: `reps` products C (m x n) = A (m x k) . B (k x n) on the model's
// threads, the way the forward pass calls it. Inputs are small integers / 8, exact in fp32, so
// the answer is checked against a double-precision dot product on a sample of entries; returns
// the largest error found there (the caller times the call), or -1 with tg_error() set.
double tg_bench_gemm(int m, int n, int k, int reps) {
  if (!ready()) return -1;
  if (m < 1 || n < 1 || k < 1 || reps < 1) {
    fail("bench_gemm: sizes and reps must be positive");
    return -1;
  }
  std::vector<float> a(static_cast<size_t>(m) * k), b(static_cast<size_t>(k) * n), c(static_cast<size_t>(m) * n);
  auto A = [&](long i, long p) { return static_cast<float>((i * 7 + p * 3) % 13 - 6) / 8.0f; };
  auto B = [&](long p, long j) { return static_cast<float>((p * 5 + j * 11) % 17 - 8) / 8.0f; };
  for (long i = 0; i < m; ++i)
    for (long p = 0; p < k; ++p) a[i * k + p] = A(i, p);
  for (long p = 0; p < k; ++p)
    for (long j = 0; j < n; ++j) b[p * n + j] = B(p, j);
  const kernels::Product g{.c = c.data(), .ldc = n, .a = {a.data(), k, 1}, .b = b.data(), .ldb = n, .N = n, .P = k};
  for (int r = 0; r < reps; ++r) rows_parallel(*model, m, [&](int s, int e) { kernels::gemm(g, s, e); });
  double worst = 0.0;
  for (long t = 0; t < 64; ++t) {
    long i = (t * 37) % m, j = (t * 53) % n;
    double exact = 0.0;
    for (long p = 0; p < k; ++p) exact += static_cast<double>(A(i, p)) * B(p, j);
    worst = std::fmax(worst, std::fabs(exact - c[i * n + j]));
  }
  return worst;
}

}  // extern "C"
