#include "sync/compression.h"

namespace edit {

bool quantizeInt8(const torch::Tensor& x, int64_t block, const torch::Tensor& q, const torch::Tensor& scales) {
  const int64_t n = x.numel(), nb = blockCount(n, block), pad = nb * block - n;
  auto xb = (pad ? torch::constant_pad_nd(x, {0, pad}) : x).view({nb, block});
  scales.copy_(xb.abs().amax(1).div_(127.0));  // amax propagates NaN
  if (!scales.isfinite().all().item<bool>()) {
    // Never cast NaN/Inf to int8 (undefined): the caller drops this contribution.
    q.zero_();
    scales.zero_();
    return false;
  }
  // An all-zero block: divide by 1 instead of 0, its values round to 0 anyway.
  auto safe = torch::where(scales > 0, scales, torch::ones_like(scales)).unsqueeze(1);
  auto r = xb.div(safe).round_().clamp_(-127, 127).view({-1});
  q.copy_(pad ? r.narrow(0, 0, n) : r);
  return true;
}

void dequantizeInt8(const torch::Tensor& q, const torch::Tensor& scales, int64_t block, const torch::Tensor& out) {
  const int64_t n = q.numel();
  auto s = scales.repeat_interleave(block);
  auto o = out;  // a handle: the result lands in out's memory
  torch::mul_out(o, q.to(torch::kFloat32), s.numel() == n ? s : s.narrow(0, 0, n));
}

static torch::Tensor viewAs(const torch::Tensor& rec, int64_t offset, int64_t count, torch::Dtype t) {
  return torch::from_blob(static_cast<uint8_t*>(rec.data_ptr()) + offset, {count}, rec.options().dtype(t));
}

torch::Tensor Int8Record::header(const torch::Tensor& rec) const {
  TORCH_CHECK(withHeader, "Int8Record: this record has no header");
  return viewAs(rec, 0, 2, torch::kFloat64);
}
torch::Tensor Int8Record::scales(const torch::Tensor& rec, int64_t len) const {
  return viewAs(rec, headerBytes(), blockCount(len, block), torch::kFloat32);
}
torch::Tensor Int8Record::values(const torch::Tensor& rec, int64_t len) const {
  return viewAs(rec, headerBytes() + 4 * blocks(), len, torch::kInt8);
}

}  // namespace edit
