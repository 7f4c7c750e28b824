// An independent reference of int8/int4 compression with error feedback, written from
// docs/algorithm.md ("Compressed synchronization") in plain loops. It calls no runtime
// code (no compression.h, no LibTorch): scales and quotients are computed in float, as
// the page specifies, so the quantized values match the runtime's bit for bit.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

namespace edit::ref {

struct Quantized {
  std::vector<int8_t> q;
  std::vector<float> scales;  // one per block
  bool finite = true;         // false: a NaN or Inf, nothing quantized
};

// levels: 127 for int8, 7 for int4.
inline Quantized quantize(const std::vector<float>& x, int64_t block, int levels = 127) {
  Quantized out;
  const int64_t n = static_cast<int64_t>(x.size());
  out.q.assign(n, 0);
  for (int64_t b = 0; b < n; b += block) {
    float amax = 0;
    for (int64_t i = b; i < std::min(n, b + block); ++i) {
      if (!std::isfinite(x[i])) out.finite = false;
      amax = std::max(amax, std::fabs(x[i]));
    }
    const float scale = amax / static_cast<float>(levels);
    out.scales.push_back(scale);
    if (scale == 0) continue;
    for (int64_t i = b; i < std::min(n, b + block); ++i) {
      const float v = std::nearbyint(x[i] / scale);  // round half to even
      out.q[i] = static_cast<int8_t>(std::clamp(v, -float(levels), float(levels)));
    }
  }
  if (!out.finite) {
    out.q.assign(n, 0);
    out.scales.assign(out.scales.size(), 0.0f);
  }
  return out;
}

inline std::vector<float> dequantize(const Quantized& z, int64_t block) {
  std::vector<float> x(z.q.size());
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(z.q[i]) * z.scales[i / block];
  return x;
}

// One replica's slice through one compressed round with error feedback: what it sends
// (dequantized) given its pseudo-gradient d; `residual` carries over to the next round.
inline std::vector<float> sendWithFeedback(const std::vector<float>& d, std::vector<float>& residual,
                                           int64_t block, int levels = 127) {
  std::vector<float> x(d.size());
  for (size_t i = 0; i < d.size(); ++i) x[i] = d[i] + residual[i];
  const auto sent = dequantize(quantize(x, block, levels), block);
  for (size_t i = 0; i < d.size(); ++i) residual[i] = x[i] - sent[i];
  return sent;
}

// The parts a slice of n elements is cut into for the sync group's reduce-scatter:
// part c = [begin, end) of whole blocks, ceil(ceil(n / block) / M) blocks each.
inline std::pair<int64_t, int64_t> partRange(int64_t n, int64_t block, int M, int c) {
  const int64_t blocks = (n + block - 1) / block, per = (blocks + M - 1) / M;
  return {std::min(n, c * per * block), std::min(n, (c + 1) * per * block)};
}

// The owner of one part: the average of what the replicas sent, in fp32 as the page
// specifies (each term w_m * D'_m rounded to fp32, summed in replica order, replicas of
// weight 0 left out), then sent on, requantized with the owner's own error feedback.
// sent[m]: replica m's dequantized part. Returns what every rank of the group receives.
inline std::vector<float> averageAndSend(const std::vector<std::vector<float>>& sent, const std::vector<double>& w,
                                         std::vector<float>& residual, int64_t block, int levels = 127) {
  std::vector<float> a(residual.size(), 0.0f);
  for (size_t m = 0; m < sent.size(); ++m) {
    if (w[m] == 0) continue;
    const float wf = static_cast<float>(w[m]);
    for (size_t i = 0; i < a.size(); ++i) {
      const float term = sent[m][i] * wf;
      a[i] = a[i] + term;
    }
  }
  return sendWithFeedback(a, residual, block, levels);
}

// int4 on the wire: two values per byte, element 2i in the low nibble and 2i+1 in the
// high one, each as a 4-bit two's complement number; an odd count leaves the last high
// nibble 0.
inline std::vector<uint8_t> packInt4(const std::vector<int8_t>& q) {
  std::vector<uint8_t> out((q.size() + 1) / 2, 0);
  for (size_t i = 0; i < q.size(); ++i) {
    const uint8_t nibble = static_cast<uint8_t>(q[i] < 0 ? q[i] + 16 : q[i]);
    out[i / 2] |= static_cast<uint8_t>(i % 2 ? nibble << 4 : nibble);
  }
  return out;
}

}  // namespace edit::ref
