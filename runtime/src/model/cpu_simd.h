// What the plain-C++ CPU kernels (attention_cpu.cpp, pointwise_cpu.cpp) share: per-CPU
// clones of their row loops, the lane width those loops are written for, an exp without
// branches or library calls, and a dot product. Included by those .cpp files only
// (compiled with -O3 and without the LibTorch precompiled header).
#pragma once

#include <cstdint>
#include <cstring>

// The row loops are cloned per instruction set (the build targets plain x86-64) and
// written so the compiler vectorizes them: fixed-width partial sums and maxima, no calls.
// (GCC only, and not under ASan: plain loops there.)
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_ADDRESS__)
#define EDIT_ROW_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define EDIT_ROW_CLONES
#endif

namespace edit::cpu_simd {

constexpr int kLanes = 16;

// e^x for x <= 0: x = n ln2 + r with |r| <= ln2/2, e^r by a degree-7 polynomial (relative
// error about 1e-7), 2^n put in the exponent bits. Below -87 the result would be
// subnormal; it is clamped to e^-87 instead (about 1.6e-38), which no caller can tell from
// zero: a softmax sum holds a 1, and a sigmoid's 1 + e is 1.
inline float expNonPositive(float x) {
  x = x < -87.f ? -87.f : x;
  const float shifter = 12582912.f;  // 1.5 * 2^23: adding it rounds to an integer
  const float n = (x * 1.44269504088896341f + shifter) - shifter;
  const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;  // ln2 split in two parts
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

// sum(a[j] b[j]) in kLanes partial sums. Not cloned itself: inlined into the callers'
// clones, it is compiled for each of their instruction sets.
inline float dotProduct(const float* a, const float* b, int64_t n) {
  float acc[kLanes] = {};
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes)
    for (int l = 0; l < kLanes; ++l) acc[l] += a[j + l] * b[j + l];
  float sum = 0;
  for (; j < n; ++j) sum += a[j] * b[j];
  for (float x : acc) sum += x;
  return sum;
}

// The logistic sigmoid 1 / (1 + e^-a) from e = e^-|a| (never overflows): 1 / (1 + e) for
// a >= 0, e / (1 + e) below.
inline float sigmoid(float a) {
  const float e = expNonPositive(a < 0.f ? a : -a);
  const float inv = 1.f / (1.f + e);
  return a < 0.f ? e * inv : inv;
}

}  // namespace edit::cpu_simd
