#include "flat_units.h"

namespace edit {

std::vector<torch::Tensor> FlatUnit::fullChunks() const {
  std::vector<torch::Tensor> out;
  for (int i = 0; i < shards; ++i) out.push_back(full.narrow(0, i * chunk, chunk));
  return out;
}

std::vector<FlatUnit> buildUnits(const ModelShape& s, int shards, int shard, uint64_t seed,
                                 torch::Device device) {
  const auto opts = torch::TensorOptions().dtype(torch::kFloat32).device(device);
  torch::NoGradGuard ng;
  std::vector<FlatUnit> units;
  auto layouts = modelLayout(s);
  for (size_t i = 0; i < layouts.size(); ++i) {
    FlatUnit u;
    u.layout = layouts[i];
    u.index = static_cast<int>(i);
    u.shards = shards;
    u.shard = shard;
    u.chunk = (u.layout.numel + shards - 1) / shards;
    u.padded = u.chunk * shards;
    u.full = torch::zeros({u.padded}, opts);
    u.full.narrow(0, 0, u.layout.numel).copy_(initialUnitValues(u.layout, u.index, seed));
    u.grad = torch::zeros({u.padded}, opts);
    u.shardView = u.full.narrow(0, shard * u.chunk, u.chunk);
    u.gradShard = u.grad.narrow(0, shard * u.chunk, u.chunk);
    auto mask = torch::zeros({u.padded});
    for (const auto& p : u.layout.params)
      if (p.decay) mask.narrow(0, p.offset, p.numel).fill_(1.0);
    u.decayMask = mask.narrow(0, shard * u.chunk, u.chunk).to(device);
    auto views = parameterViews(u.layout, u.full);
    auto gviews = parameterViews(u.layout, u.grad);
    for (size_t k = 0; k < views.size(); ++k) {
      auto p = views[k];
      p.requires_grad_(true);
      p.mutable_grad() = gviews[k];  // autograd accumulates in place into the flat buffer
      u.params.push_back(p);
    }
    units.push_back(std::move(u));
  }
  return units;
}

}  // namespace edit
