#include "model/pointwise_cpu.h"

#include <cmath>

#include "model/cpu_simd.h"

namespace edit::cpu_pointwise {
namespace {

using cpu_simd::kLanes;

EDIT_ROW_CLONES float sumOfSquares(const float* x, int64_t n) { return cpu_simd::dotProduct(x, x, n); }

EDIT_ROW_CLONES void scaleRow(const float* x, const float* g, float r, int64_t n, float* y) {
  for (int64_t j = 0; j < n; ++j) y[j] = x[j] * r * g[j];
}

// Returns sum(dy g x) over the row and adds dy x r to dg.
EDIT_ROW_CLONES float normGradDot(const float* x, const float* g, const float* dy, float r, int64_t n, float* dg) {
  float acc[kLanes] = {};
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes)
    for (int l = 0; l < kLanes; ++l) {
      const float dx = dy[j + l] * x[j + l];
      acc[l] += dx * g[j + l];
      dg[j + l] += dx * r;
    }
  float sum = 0;
  for (; j < n; ++j) {
    const float dx = dy[j] * x[j];
    sum += dx * g[j];
    dg[j] += dx * r;
  }
  for (float a : acc) sum += a;
  return sum;
}

// dx = r (dy g - x r c), with c = mean(dy g x) r.
EDIT_ROW_CLONES void normGradRow(const float* x, const float* g, const float* dy, float r, float c, int64_t n,
                                 float* dx) {
  const float rc = r * c;
  for (int64_t j = 0; j < n; ++j) dx[j] = r * (dy[j] * g[j] - x[j] * rc);
}

EDIT_ROW_CLONES void swigluRow(const float* a, const float* b, int64_t n, float* y) {
  for (int64_t j = 0; j < n; ++j) y[j] = a[j] * cpu_simd::sigmoid(a[j]) * b[j];
}

EDIT_ROW_CLONES void swigluGradRow(const float* a, const float* b, const float* dy, int64_t n, float* da,
                                   float* db) {
  for (int64_t j = 0; j < n; ++j) {
    const float s = cpu_simd::sigmoid(a[j]), d = dy[j];
    db[j] = d * a[j] * s;
    da[j] = d * b[j] * s * (1.f + a[j] * (1.f - s));
  }
}

}  // namespace

void rmsNormForward(const float* x, const float* g, float eps, int64_t dim, float* y, float* r, int64_t first,
                    int64_t last) {
  for (int64_t i = first; i < last; ++i) {
    const float* xi = x + i * dim;
    r[i] = 1.f / std::sqrt(sumOfSquares(xi, dim) / static_cast<float>(dim) + eps);
    scaleRow(xi, g, r[i], dim, y + i * dim);
  }
}

void rmsNormBackward(const float* x, const float* g, const float* r, const float* dy, int64_t dim, float* dx,
                     float* dg, int64_t first, int64_t last) {
  for (int64_t i = first; i < last; ++i) {
    const float *xi = x + i * dim, *dyi = dy + i * dim;
    // mean(dy g xh) with xh = x r
    const float c = normGradDot(xi, g, dyi, r[i], dim, dg) * r[i] / static_cast<float>(dim);
    normGradRow(xi, g, dyi, r[i], c, dim, dx + i * dim);
  }
}

void swigluForward(const float* h, int64_t f, float* y, int64_t first, int64_t last) {
  for (int64_t i = first; i < last; ++i) swigluRow(h + i * 2 * f, h + i * 2 * f + f, f, y + i * f);
}

void swigluBackward(const float* h, const float* dy, int64_t f, float* dh, int64_t first, int64_t last) {
  for (int64_t i = first; i < last; ++i)
    swigluGradRow(h + i * 2 * f, h + i * 2 * f + f, dy + i * f, f, dh + i * 2 * f, dh + i * 2 * f + f);
}

}  // namespace edit::cpu_pointwise
