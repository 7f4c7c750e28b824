// int8 compression of the pseudo-gradient exchanged in the sync group
// (algorithm.syncCompression, docs/algorithm.md "Compressed synchronization").
//
// Per block of `block` consecutive elements of a slice: scale = absmax / 127 (float32),
// q = round(x / scale) in [-127, 127] (round half to even), x' = q * scale, so
// |x - x'| <= scale / 2 = absmax / 254. An all-zero block has scale 0 and q 0.
// Plain elementwise ops: the same bytes dequantize to the same bits on every rank.
#pragma once

#include <torch/torch.h>

#include <cstdint>

namespace edit {

inline int64_t blockCount(int64_t n, int64_t block) { return (n + block - 1) / block; }

// x: float32 [n]. Writes q (int8 [n]) and scales (float32 [blockCount]) and returns true;
// when x holds a NaN or Inf (absmax cannot scale it) writes zeros and returns false.
bool quantizeInt8(const torch::Tensor& x, int64_t block, const torch::Tensor& q, const torch::Tensor& scales);
// out (float32 [n]) := q * scale of its block.
void dequantizeInt8(const torch::Tensor& q, const torch::Tensor& scales, int64_t block, const torch::Tensor& out);

// One rank's record in the sync group's all-gather, as bytes: a header of two doubles
// (the replica's norm, +inf when it is dropped, and its local steps), the scales, the
// int8 values, padded to 8 bytes so every record's header stays aligned.
struct Int8Record {
  static constexpr int64_t kHeader = 16;
  int64_t n = 0, block = 256;
  int64_t blocks() const { return blockCount(n, block); }
  int64_t bytes() const { return (kHeader + 4 * blocks() + n + 7) / 8 * 8; }
  // Views into a record (`rec`: uint8 [bytes()], contiguous).
  torch::Tensor header(const torch::Tensor& rec) const;  // float64 [2]
  torch::Tensor scales(const torch::Tensor& rec) const;  // float32 [blocks]
  torch::Tensor values(const torch::Tensor& rec) const;  // int8 [n]
};

}  // namespace edit
