#include "sync/optim.h"

#include <algorithm>
#include <cmath>

namespace edit {

ShardedAdamW::ShardedAdamW(const TrainingConfig& cfg, const std::vector<FlatUnit>& units)
    : beta1_(cfg.beta1), beta2_(cfg.beta2), eps_(cfg.eps), wd_(cfg.weightDecay) {
  for (const auto& u : units) {
    m_.push_back(torch::zeros_like(u.slice));
    v_.push_back(torch::zeros_like(u.slice));
  }
}

static constexpr int64_t kBlock = 1 << 16;

void ShardedAdamW::step(std::vector<FlatUnit>& units, double lr) {
  torch::NoGradGuard ng;
  ++t_;
  const double bc1 = 1 - std::pow(beta1_, static_cast<double>(t_));
  const double bc2 = 1 - std::pow(beta2_, static_cast<double>(t_));
  for (size_t i = 0; i < units.size(); ++i) {
    auto& p = units[i].slice;
    const auto& g = units[i].gradSlice;
    if (wd_ != 0)
      for (const auto& [start, len] : units[i].decayRanges) p.narrow(0, start, len).mul_(1 - lr * wd_);
    // In blocks: the temporary stays small (and in cache) however large the unit.
    const int64_t n = p.numel();
    for (int64_t lo = 0; lo < n; lo += kBlock) {
      const int64_t len = std::min(kBlock, n - lo);
      auto pb = p.narrow(0, lo, len), gb = g.narrow(0, lo, len);
      auto mb = m_[i].narrow(0, lo, len), vb = v_[i].narrow(0, lo, len);
      mb.mul_(beta1_).add_(gb, 1 - beta1_);
      vb.mul_(beta2_).addcmul_(gb, gb, 1 - beta2_);
      auto denom = vb.sqrt().div_(std::sqrt(bc2)).add_(eps_);
      pb.addcdiv_(mb, denom, -lr / bc1);
    }
  }
}

double learningRate(const TrainingConfig& cfg, double t, int64_t totalSteps) {
  if (cfg.lrWarmupSteps > 0 && t < cfg.lrWarmupSteps)
    return cfg.lr * std::min(1.0, (t + 1) / static_cast<double>(cfg.lrWarmupSteps));
  const double span = static_cast<double>(std::max<int64_t>(1, totalSteps - cfg.lrWarmupSteps));
  const double progress = std::min(1.0, (t - static_cast<double>(cfg.lrWarmupSteps)) / span);
  return cfg.minLr + 0.5 * (cfg.lr - cfg.minLr) * (1 + std::cos(M_PI * progress));
}

}  // namespace edit
