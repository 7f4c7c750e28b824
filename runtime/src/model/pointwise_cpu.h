// RMSNorm and SwiGLU on the CPU, forward and backward, one pass over each row.
//
// Why: through LibTorch ops each is a chain of elementwise ops (the RMSNorm backward alone
// is 8), and each op is a pass over the activations plus a temporary as large as them. On
// the tiny model those passes were the step's largest cost after the matrix products.
// Here a row is read once and written once (docs/design-decisions.md, "Pointwise ops on
// the CPU").
//
// Plain C++ over raw float pointers, rows [first, last) so callers split them over
// threads; every array is row-major and contiguous.
#pragma once

#include <cstdint>

namespace edit::cpu_pointwise {

// y = x * r * g, r = 1 / sqrt(mean(x^2) + eps), per row of `dim`; writes r per row.
void rmsNormForward(const float* x, const float* g, float eps, int64_t dim, float* y, float* r, int64_t first,
                    int64_t last);

// dx = r * (dy g - xh * mean(dy g xh)), xh = x r; adds sum over the rows of dy * xh to dg.
void rmsNormBackward(const float* x, const float* g, const float* r, const float* dy, int64_t dim, float* dx,
                     float* dg, int64_t first, int64_t last);

// h = [a | b] per row (2f wide): y = silu(a) * b (f wide).
void swigluForward(const float* h, int64_t f, float* y, int64_t first, int64_t last);

// dh = [dy * b * s * (1 + a (1 - s)) | dy * silu(a)], s = sigmoid(a).
void swigluBackward(const float* h, const float* dy, int64_t f, float* dh, int64_t first, int64_t last);

}  // namespace edit::cpu_pointwise
