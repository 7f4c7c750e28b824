#include "dist/flat_units.h"

#include <algorithm>

namespace edit {

void FlatUnit::bindGrads(const torch::Tensor& flat) {
  auto views = parameterViews(layout, flat);
  for (size_t k = 0; k < params.size(); ++k) params[k].mutable_grad() = views[k];
}

void FlatUnit::unbindGrads() {
  for (auto& p : params) p.mutable_grad() = torch::Tensor();
}

torch::Tensor BufferCache::take(int64_t numel) {
  torch::Tensor t;
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = free_.find(numel);
    if (it != free_.end() && !it->second.empty()) {
      t = std::move(it->second.back());
      it->second.pop_back();
    }
    live_ += numel * static_cast<int64_t>(opts_.dtype().itemsize());
    peak_ = std::max(peak_, live_);
  }
  if (!t.defined()) t = torch::empty({numel}, opts_);
  return t;
}

void BufferCache::give(torch::Tensor t) {
  if (!t.defined()) return;
  std::lock_guard<std::mutex> lk(mu_);
  live_ -= static_cast<int64_t>(t.nbytes());
  auto& list = free_[t.numel()];
  if (static_cast<int>(list.size()) < keep_) list.push_back(std::move(t));
}

int64_t BufferCache::cachedBytes() const {
  std::lock_guard<std::mutex> lk(mu_);
  int64_t n = 0;
  for (const auto& [numel, list] : free_)
    for (const auto& t : list) n += static_cast<int64_t>(t.nbytes());
  return n;
}

int64_t BufferCache::liveBytes() const {
  std::lock_guard<std::mutex> lk(mu_);
  return live_;
}

int64_t BufferCache::peakLiveBytes() const {
  std::lock_guard<std::mutex> lk(mu_);
  return peak_;
}

MemoryPlan planMemory(const ModelShape& s, int shards, bool localMode, bool reshardAfterForward,
                      int prefetchDepth, bool overlap) {
  MemoryPlan m;
  int64_t slices = 0, sumPadded = 0, maxPadded = 0;
  for (const auto& u : modelLayout(s)) {
    const int64_t chunk = (u.numel + shards - 1) / shards;
    slices += chunk;
    sumPadded += chunk * shards;
    maxPadded = std::max(maxPadded, chunk * shards);
  }
  const int64_t f = 4;  // fp32
  m.parameters = f * slices;
  m.gradients = f * slices;
  m.optimizer = 2 * f * slices;
  m.outer = localMode ? 2 * f * slices : 0;
  m.overlap = localMode && overlap ? 2 * f * slices : 0;
  const int64_t inFlight = static_cast<int64_t>(prefetchDepth) + 1;
  if (shards > 1)
    m.buffers = reshardAfterForward ? 2 * inFlight * f * maxPadded : f * sumPadded + inFlight * f * maxPadded;
  return m;
}

void attachFull(FlatUnit& u, torch::Tensor buffer) {
  TORCH_CHECK(u.sharded() && !u.fullBuffer.defined() && buffer.numel() == u.padded,
              "attachFull: unit ", u.layout.name, " is already gathered or the buffer has the wrong size");
  // Non-owning: `fullBuffer` owns the memory; the views of `full` only borrow it.
  auto* impl = u.full.storage().unsafeGetStorageImpl();
  impl->set_data_ptr_noswap(at::DataPtr(buffer.data_ptr(), buffer.device()));
  impl->set_nbytes(static_cast<size_t>(buffer.nbytes()));
  u.fullBuffer = std::move(buffer);
}

torch::Tensor detachFull(FlatUnit& u) {
  if (!u.sharded() || !u.fullBuffer.defined()) return {};
  auto* impl = u.full.storage().unsafeGetStorageImpl();
  impl->set_data_ptr_noswap(at::DataPtr(nullptr, u.fullBuffer.device()));
  impl->set_nbytes(0);
  return std::move(u.fullBuffer);
}

std::vector<FlatUnit> buildUnits(const ModelShape& s, int shards, int shard, uint64_t seed,
                                 torch::Device device) {
  const auto opts = torch::TensorOptions().dtype(torch::kFloat32).device(device);
  torch::NoGradGuard ng;
  std::vector<FlatUnit> units;
  auto layouts = modelLayout(s);
  int64_t arenaSize = 0;
  for (const auto& l : layouts) arenaSize += (l.numel + shards - 1) / shards;
  auto arena = torch::zeros({arenaSize}, opts);
  int64_t arenaOffset = 0;
  for (size_t i = 0; i < layouts.size(); ++i) {
    FlatUnit u;
    u.layout = layouts[i];
    u.index = static_cast<int>(i);
    u.shards = shards;
    u.shard = shard;
    u.chunk = (u.layout.numel + shards - 1) / shards;
    u.padded = u.chunk * shards;
    // Made at full size once so the parameter views can be created (views check bounds
    // against the storage). With N > 1 it is never written, so its pages are never
    // resident, and the memory is dropped right after.
    const int64_t lo = shard * u.chunk;
    if (u.sharded()) {
      u.full = torch::empty({u.padded}, opts);
      // Initial values are drawn for the whole unit (the same stream on every rank), on
      // the host, one unit at a time.
      const auto init = initialUnitValues(u.layout, u.index, seed);
      u.slice = torch::zeros({u.chunk}, opts);
      const int64_t n = std::max<int64_t>(0, std::min(u.chunk, u.layout.numel - lo));
      if (n > 0) u.slice.narrow(0, 0, n).copy_(init.narrow(0, lo, n));
    } else {
      u.full = torch::zeros({u.padded}, torch::kFloat32);
      fillInitialUnitValues(u.layout, u.index, seed, u.full);
      u.full = u.full.to(device);
      u.slice = u.full;
    }
    u.gradArena = arena;
    u.gradOffset = arenaOffset;
    u.gradSlice = arena.narrow(0, arenaOffset, u.chunk);
    arenaOffset += u.chunk;
    for (const auto& p : u.layout.params) {
      if (!p.decay) continue;
      const int64_t a = std::max(p.offset, lo), b = std::min(p.offset + p.numel, lo + u.chunk);
      if (a < b) u.decayRanges.emplace_back(a - lo, b - a);
    }
    for (auto& v : parameterViews(u.layout, u.full)) {
      v.requires_grad_(true);
      u.params.push_back(v);
    }
    if (u.sharded()) {
      auto* impl = u.full.storage().unsafeGetStorageImpl();
      impl->set_data_ptr_noswap(at::DataPtr(nullptr, device));
      impl->set_nbytes(0);
    } else {
      u.bindGrads(u.gradSlice);  // autograd accumulates in place into the flat gradient
    }
    units.push_back(std::move(u));
  }
  return units;
}

}  // namespace edit
