#include "model/attention_cpu.h"

#include "model/cpu_simd.h"

#include <dlfcn.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace edit::cpu_attention {
namespace {

using cpu_simd::expNonPositive;
using cpu_simd::kLanes;

// Fortran BLAS, column-major. Looked up at run time: LibTorch already loaded the BLAS it
// was built with, and linking one here could pick another.
using Sgemm = void (*)(const char*, const char*, const int*, const int*, const int*, const float*,
                       const float*, const int*, const float*, const int*, const float*, float*, const int*);
Sgemm sgemm() {
  static const Sgemm f = reinterpret_cast<Sgemm>(dlsym(RTLD_DEFAULT, "sgemm_"));
  return f;
}

// Row-major products written as the column-major transposes BLAS computes:
// C = A B^T  is  C^T = B A^T, and so on.
void gemm(char ta, char tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
          int64_t ldb, float beta, float* c, int64_t ldc) {
  const int M = static_cast<int>(m), N = static_cast<int>(n), K = static_cast<int>(k);
  const int la = static_cast<int>(lda), lb = static_cast<int>(ldb), lc = static_cast<int>(ldc);
  const float one = 1.f;
  sgemm()(&ta, &tb, &M, &N, &K, &one, a, &la, b, &lb, &beta, c, &lc);
}
// C[m x n] = A[m x k] B[n x k]^T + beta C
void mulABt(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb, float beta,
            float* c, int64_t ldc) {
  gemm('T', 'N', n, m, k, b, ldb, a, lda, beta, c, ldc);
}
// C[m x n] = A[m x k] B[k x n] + beta C
void mulAB(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb, float beta,
           float* c, int64_t ldc) {
  gemm('N', 'N', n, m, k, b, ldb, a, lda, beta, c, ldc);
}
// C[m x n] = A[k x m]^T B[k x n] + beta C
void mulAtB(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb, float beta,
            float* c, int64_t ldc) {
  gemm('N', 'T', n, m, k, b, ldb, a, lda, beta, c, ldc);
}

// Causal softmax of one row of scores: the first `valid` entries in place, zeros after
// them up to `width`. Returns log(sum(exp(s))).
EDIT_ROW_CLONES float softmaxRow(float* s, int64_t valid, int64_t width) {
  float part[kLanes];
  for (float& p : part) p = -INFINITY;
  int64_t j = 0;
  for (; j + kLanes <= valid; j += kLanes)
    for (int l = 0; l < kLanes; ++l) part[l] = s[j + l] > part[l] ? s[j + l] : part[l];
  float mx = -INFINITY;
  for (float p : part) mx = p > mx ? p : mx;
  for (; j < valid; ++j) mx = s[j] > mx ? s[j] : mx;
  float acc[kLanes] = {};
  for (j = 0; j + kLanes <= valid; j += kLanes)
    for (int l = 0; l < kLanes; ++l) {
      s[j + l] = expNonPositive(s[j + l] - mx);
      acc[l] += s[j + l];
    }
  float sum = 0;
  for (; j < valid; ++j) {
    s[j] = expNonPositive(s[j] - mx);
    sum += s[j];
  }
  for (float a : acc) sum += a;
  const float inv = 1.f / sum;
  for (j = 0; j < valid; ++j) s[j] *= inv;
  for (; j < width; ++j) s[j] = 0.f;
  return mx + std::log(sum);
}

// The probabilities again from the saved log-sum-exp: p = exp(s - lse), zeros after `valid`.
EDIT_ROW_CLONES void probabilityRow(float* s, int64_t valid, int64_t width, float lse) {
  int64_t j = 0;
  for (; j < valid; ++j) s[j] = expNonPositive(s[j] - lse);
  for (; j < width; ++j) s[j] = 0.f;
}

EDIT_ROW_CLONES float dot(const float* a, const float* b, int64_t n) { return cpu_simd::dotProduct(a, b, n); }

// Softmax backward of one row, in place over the probabilities: ds = p * (dp - rowdot(dO, O)).
EDIT_ROW_CLONES void softmaxGradRow(float* p, const float* dp, float rowDot, int64_t n) {
  for (int64_t j = 0; j < n; ++j) p[j] *= dp[j] - rowDot;
}

// One row of RoPE on the pairs (i, i + half): y1 = x1 c - x2 s, y2 = x2 c + x1 s, or the
// inverse rotation (sign -1): x1 = y1 c + y2 s, x2 = y2 c - y1 s.
EDIT_ROW_CLONES void rotateRow(const float* x, const float* c, const float* s, float sign, int64_t half, float* y) {
  for (int64_t i = 0; i < half; ++i) {
    const float a = x[i], b = x[i + half];
    y[i] = a * c[i] - sign * b * s[i];
    y[i + half] = b * c[i] + sign * a * s[i];
  }
}

// Rows per tile. A tile of queries needs keys 0 .. its last row only; 64 measured fastest at
// T = 128-512 (smaller tiles skip more of the square but make more, smaller BLAS calls).
constexpr int64_t kTile = 64;

}  // namespace

bool available() { return sgemm() != nullptr; }

void forward(const float* q, const float* k, const float* v, float* out, float* lse, const Dims& d,
             int64_t first, int64_t last) {
  const int64_t T = d.seq, hd = d.headDim, width = d.heads * hd;
  std::vector<float> scores(static_cast<size_t>(std::min(kTile, T) * T));
  for (int64_t bh = first; bh < last; ++bh) {
    const int64_t b = bh / d.heads, h = bh % d.heads;
    const float *Q = q + bh * T * hd, *K = k + bh * T * hd, *V = v + bh * T * hd;
    float* O = out + b * T * width + h * hd;  // row t at O + t * width
    float* L = lse + bh * T;
    for (int64_t r0 = 0; r0 < T; r0 += kTile) {
      const int64_t m = std::min(kTile, T - r0), n = r0 + m;  // rows r0.. see keys 0..n-1
      float* S = scores.data();
      mulABt(m, n, hd, Q + r0 * hd, hd, K, hd, 0.f, S, n);
      for (int64_t i = 0; i < m; ++i) L[r0 + i] = softmaxRow(S + i * n, r0 + i + 1, n);
      mulAB(m, hd, n, S, n, V, hd, 0.f, O + r0 * width, width);
    }
  }
}

void backward(const float* q, const float* k, const float* v, const float* out, const float* lse,
              const float* dOut, float* dq, float* dk, float* dv, const Dims& d, int64_t first, int64_t last) {
  const int64_t T = d.seq, hd = d.headDim, width = d.heads * hd, tile = std::min(kTile, T);
  std::vector<float> probs(static_cast<size_t>(tile * T)), dprobs(static_cast<size_t>(tile * T));
  std::vector<float> rowDot(static_cast<size_t>(T));
  for (int64_t bh = first; bh < last; ++bh) {
    const int64_t b = bh / d.heads, h = bh % d.heads;
    const float *Q = q + bh * T * hd, *K = k + bh * T * hd, *V = v + bh * T * hd, *L = lse + bh * T;
    const float *O = out + b * T * width + h * hd, *G = dOut + b * T * width + h * hd;
    float *dQ = dq + bh * T * hd, *dK = dk + bh * T * hd, *dV = dv + bh * T * hd;
    for (int64_t t = 0; t < T; ++t) rowDot[t] = dot(G + t * width, O + t * width, hd);
    std::fill(dK, dK + T * hd, 0.f);
    std::fill(dV, dV + T * hd, 0.f);
    for (int64_t r0 = 0; r0 < T; r0 += kTile) {
      const int64_t m = std::min(kTile, T - r0), n = r0 + m;
      float *P = probs.data(), *dP = dprobs.data();
      const float* Gt = G + r0 * width;
      mulABt(m, n, hd, Q + r0 * hd, hd, K, hd, 0.f, P, n);
      for (int64_t i = 0; i < m; ++i) probabilityRow(P + i * n, r0 + i + 1, n, L[r0 + i]);
      mulAtB(n, hd, m, P, n, Gt, width, 1.f, dV, hd);  // dV += P^T dO
      mulABt(m, n, hd, Gt, width, V, hd, 0.f, dP, n);  // dP = dO V^T
      for (int64_t i = 0; i < m; ++i) softmaxGradRow(P + i * n, dP + i * n, rowDot[r0 + i], n);
      mulAB(m, hd, n, P, n, K, hd, 0.f, dQ + r0 * hd, hd);  // dQ = dS K
      mulAtB(n, hd, m, P, n, Q + r0 * hd, hd, 1.f, dK, hd);  // dK += dS^T Q
    }
  }
}

void splitHeads(const float* qkv, const Rotary& r, float* q, float* k, float* v, const Dims& d, int64_t first,
                int64_t last) {
  const int64_t T = d.seq, hd = d.headDim, half = hd / 2, width = d.heads * hd;
  for (int64_t bh = first; bh < last; ++bh) {
    const int64_t b = bh / d.heads, h = bh % d.heads;
    for (int64_t t = 0; t < T; ++t) {
      const float* row = qkv + (b * T + t) * 3 * width + h * hd;  // q, then k and v `width` further
      const int64_t o = (bh * T + t) * hd;
      rotateRow(row, r.qcos + t * half, r.qsin + t * half, 1.f, half, q + o);
      rotateRow(row + width, r.kcos + t * half, r.ksin + t * half, 1.f, half, k + o);
      std::memcpy(v + o, row + 2 * width, static_cast<size_t>(hd) * sizeof(float));
    }
  }
}

void mergeHeadGrads(const float* dq, const float* dk, const float* dv, const Rotary& r, float* dqkv, const Dims& d,
                    int64_t first, int64_t last) {
  const int64_t T = d.seq, hd = d.headDim, half = hd / 2, width = d.heads * hd;
  for (int64_t bh = first; bh < last; ++bh) {
    const int64_t b = bh / d.heads, h = bh % d.heads;
    for (int64_t t = 0; t < T; ++t) {
      float* row = dqkv + (b * T + t) * 3 * width + h * hd;
      const int64_t o = (bh * T + t) * hd;
      rotateRow(dq + o, r.qcos + t * half, r.qsin + t * half, -1.f, half, row);
      rotateRow(dk + o, r.kcos + t * half, r.ksin + t * half, -1.f, half, row + width);
      std::memcpy(row + 2 * width, dv + o, static_cast<size_t>(hd) * sizeof(float));
    }
  }
}

}  // namespace edit::cpu_attention
