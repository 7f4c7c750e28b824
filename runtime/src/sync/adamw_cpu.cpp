#include "sync/adamw_cpu.h"

#include <cmath>

#include "model/cpu_simd.h"

namespace edit::cpu_optim {

// Vectorized per clone: this file is built with -fno-math-errno, so std::sqrt is the
// instruction (v is never negative).
EDIT_ROW_CLONES void adamWUpdate(float* __restrict p, const float* __restrict g, float* __restrict m,
                                 float* __restrict v, const AdamWCoefficients& c, int64_t first, int64_t last) {
  const float b1 = c.beta1, b2 = c.beta2, a1 = 1.f - c.beta1, a2 = 1.f - c.beta2;
  const float eps = c.eps, step = c.stepSize, s2 = c.invSqrtBc2, decay = c.decay;
  for (int64_t i = first; i < last; ++i) {
    const float gi = g[i];
    const float mi = b1 * m[i] + a1 * gi;
    const float vi = b2 * v[i] + a2 * gi * gi;
    m[i] = mi;
    v[i] = vi;
    p[i] = decay * p[i] - step * mi / (std::sqrt(vi) * s2 + eps);
  }
}

}  // namespace edit::cpu_optim
