#include "sync/compression.h"

namespace edit {

bool quantizeBlocks(const torch::Tensor& x, int64_t block, int levels, const torch::Tensor& q,
                    const torch::Tensor& scales) {
  const int64_t n = x.numel(), nb = blockCount(n, block), pad = nb * block - n;
  auto xb = (pad ? torch::constant_pad_nd(x, {0, pad}) : x).view({nb, block});
  scales.copy_(xb.abs().amax(1).div_(static_cast<double>(levels)));  // amax propagates NaN
  if (!scales.isfinite().all().item<bool>()) {
    // Never cast NaN/Inf to int8 (undefined): the caller drops this contribution.
    q.zero_();
    scales.zero_();
    return false;
  }
  // An all-zero block: divide by 1 instead of 0, its values round to 0 anyway.
  auto safe = torch::where(scales > 0, scales, torch::ones_like(scales)).unsqueeze(1);
  auto r = xb.div(safe).round_().clamp_(-levels, levels).view({-1});
  q.copy_(pad ? r.narrow(0, 0, n) : r);
  return true;
}

void dequantizeBlocks(const torch::Tensor& q, const torch::Tensor& scales, int64_t block, const torch::Tensor& out) {
  const int64_t n = q.numel();
  auto s = scales.repeat_interleave(block);
  auto o = out;  // a handle: the result lands in out's memory
  torch::mul_out(o, q.to(torch::kFloat32), s.numel() == n ? s : s.narrow(0, 0, n));
}

static torch::Tensor viewAs(const torch::Tensor& rec, int64_t offset, int64_t count, torch::Dtype t) {
  return torch::from_blob(static_cast<uint8_t*>(rec.data_ptr()) + offset, {count}, rec.options().dtype(t));
}

void packInt4(const torch::Tensor& q, const torch::Tensor& bytes) {
  const int64_t n = q.numel();
  auto v = q.to(torch::kInt32).bitwise_and(15);  // two's complement nibble
  if (n % 2) v = torch::constant_pad_nd(v, {0, 1});
  auto pairs = v.view({-1, 2});
  auto packed = pairs.select(1, 0).bitwise_or(pairs.select(1, 1).__lshift__(4));
  bytes.copy_(packed);
}

void unpackInt4(const torch::Tensor& bytes, const torch::Tensor& q) {
  const int64_t n = q.numel();
  auto b = bytes.to(torch::kInt32);
  auto both = torch::stack({b.bitwise_and(15), b.__rshift__(4).bitwise_and(15)}, 1).view({-1});
  auto v = torch::where(both >= 8, both - 16, both);  // sign-extend the nibble
  q.copy_(v.narrow(0, 0, n));
}

torch::Tensor QuantRecord::header(const torch::Tensor& rec) const {
  TORCH_CHECK(withHeader, "QuantRecord: this record has no header");
  return viewAs(rec, 0, 2, torch::kFloat64);
}
torch::Tensor QuantRecord::scales(const torch::Tensor& rec, int64_t len) const {
  return viewAs(rec, headerBytes(), blockCount(len, block), torch::kFloat32);
}
torch::Tensor QuantRecord::values(const torch::Tensor& rec, int64_t len) const {
  return viewAs(rec, headerBytes() + 4 * blocks(), codec.valueBytes(len), torch::kUInt8);
}

bool QuantRecord::encode(const torch::Tensor& x, const torch::Tensor& rec) const {
  const int64_t len = x.numel();
  auto v = values(rec, len);
  if (codec.bits == 8) {  // quantize straight into the record
    return quantizeBlocks(x, block, codec.levels(), v.view(torch::kInt8), scales(rec, len));
  }
  auto q = torch::empty({len}, x.options().dtype(torch::kInt8));
  const bool finite = quantizeBlocks(x, block, codec.levels(), q, scales(rec, len));
  packInt4(q, v);
  return finite;
}

void QuantRecord::decode(const torch::Tensor& rec, const torch::Tensor& out) const {
  const int64_t len = out.numel();
  auto v = values(rec, len);
  if (codec.bits == 8) {
    dequantizeBlocks(v.view(torch::kInt8), scales(rec, len), block, out);
    return;
  }
  auto q = torch::empty({len}, out.options().dtype(torch::kInt8));
  unpackInt4(v, q);
  dequantizeBlocks(q, scales(rec, len), block, out);
}

}  // namespace edit
