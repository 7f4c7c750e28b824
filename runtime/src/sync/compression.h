// int8 and int4 compression of the pseudo-gradient exchanged in the sync group
// (algorithm.syncCompression, docs/algorithm.md "Compressed synchronization").
//
// Per block of `block` consecutive elements of a slice, with L = 127 (int8) or 7 (int4):
// scale = absmax / L (float32), q = round(x / scale) in [-L, L] (round half to even),
// x' = q * scale, so |x - x'| <= scale / 2 = absmax / 2L. An all-zero block has scale 0
// and q 0. int4 packs two values per byte, the even element in the low nibble, two's
// complement. Plain elementwise ops: the same bytes dequantize to the same bits on every
// rank.
#pragma once

#include <torch/torch.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "worker_config.h"

namespace edit {

inline int64_t blockCount(int64_t n, int64_t block) { return (n + block - 1) / block; }

// The codec of algorithm.syncCompression: 8 or 4 bits per value (0: none).
struct Codec {
  int bits = 0;
  static Codec of(Compression c) { return {c == Compression::Int4 ? 4 : c == Compression::Int8 ? 8 : 0}; }
  bool on() const { return bits > 0; }
  int levels() const { return bits == 4 ? 7 : 127; }
  int64_t valueBytes(int64_t n) const { return bits == 4 ? (n + 1) / 2 : n; }
};

// x: float32 [n]. Writes q (int8 [n], values in [-levels, levels]) and scales (float32
// [blockCount]) and returns true; when x holds a NaN or Inf (absmax cannot scale it)
// writes zeros and returns false.
bool quantizeBlocks(const torch::Tensor& x, int64_t block, int levels, const torch::Tensor& q,
                    const torch::Tensor& scales);
// out (float32 [n]) := q * scale of its block.
void dequantizeBlocks(const torch::Tensor& q, const torch::Tensor& scales, int64_t block, const torch::Tensor& out);
// int4 packing: q (int8 [n], values in [-8, 7]) <-> bytes (uint8 [ceil(n / 2)]).
void packInt4(const torch::Tensor& q, const torch::Tensor& bytes);
void unpackInt4(const torch::Tensor& bytes, const torch::Tensor& q);

// The M parts a rank's slice is split into for the compressed reduce-scatter: part c (owned by
// sync rank c) is whole blocks [c*per, (c+1)*per) clipped to the slice, per =
// ceil(blocks / M). Parts start on block boundaries, so quantizing part by part gives the
// same bytes as quantizing the whole slice; trailing parts may be short or empty.
struct SlicePartition {
  int64_t n = 0, block = 256;
  int parts = 1;
  int64_t blocksPerPart() const { return (blockCount(n, block) + parts - 1) / parts; }
  int64_t maxLength() const { return std::min(n, blocksPerPart() * block); }
  int64_t begin(int c) const { return std::min(n, c * blocksPerPart() * block); }
  int64_t length(int c) const { return std::min(n, (c + 1) * blocksPerPart() * block) - begin(c); }
};

// One part's record in the sync group's exchange, as bytes: an optional header of two
// doubles (the sender's norm, +inf when it is dropped, and its local steps), the fp32
// scales, the values (codec.valueBytes), padded to 8 bytes so every record's header stays
// aligned. A record holds up to n values; a shorter part uses the prefix of scales and
// values.
struct QuantRecord {
  int64_t n = 0, block = 256;
  Codec codec;
  bool withHeader = true;
  int64_t headerBytes() const { return withHeader ? 16 : 0; }
  int64_t blocks() const { return blockCount(n, block); }
  int64_t bytes() const { return (headerBytes() + 4 * blocks() + codec.valueBytes(n) + 7) / 8 * 8; }
  // Views into a record (`rec`: uint8 [bytes()], contiguous).
  torch::Tensor header(const torch::Tensor& rec) const;               // float64 [2]
  torch::Tensor scales(const torch::Tensor& rec, int64_t len) const;  // float32 [blockCount(len)]
  // Quantizes x (float32 [len]) into the record's scales and values; false (zeros
  // written) when x is not finite.
  bool encode(const torch::Tensor& x, const torch::Tensor& rec) const;
  // out (float32 [len]) := the record's first len values, dequantized.
  void decode(const torch::Tensor& rec, const torch::Tensor& out) const;

 private:
  torch::Tensor values(const torch::Tensor& rec, int64_t len) const;  // uint8 [valueBytes(len)]
};

}  // namespace edit
