#include "sync/optim.h"

#include <algorithm>
#include <cmath>

#include "model/model.h"
#include "sync/adamw_cpu.h"

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
    if (fusedCpuKernels(p) && p.is_contiguous() && g.is_contiguous() && m_[i].is_contiguous() &&
        v_[i].is_contiguous()) {
      fusedStep(units[i], m_[i], v_[i], lr, bc1, bc2);
      continue;
    }
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

void ShardedAdamW::fusedStep(FlatUnit& u, torch::Tensor& m, torch::Tensor& v, double lr, double bc1, double bc2) {
  cpu_optim::AdamWCoefficients c{static_cast<float>(beta1_), static_cast<float>(beta2_), static_cast<float>(eps_),
                                 static_cast<float>(lr / bc1), static_cast<float>(1 / std::sqrt(bc2)), 1.f};
  float* p = u.slice.data_ptr<float>();
  const float* g = u.gradSlice.data_ptr<float>();
  float* mp = m.data_ptr<float>();
  float* vp = v.data_ptr<float>();
  auto update = [&](int64_t lo, int64_t hi, float decay) {
    c.decay = decay;
    at::parallel_for(lo, hi, kBlock, [&](int64_t first, int64_t last) {
      cpu_optim::adamWUpdate(p, g, mp, vp, c, first, last);
    });
  };
  // The slice in runs: decayed ranges (matrices; in layout order) and the gaps between.
  const float decay = static_cast<float>(1 - lr * wd_);
  int64_t at = 0;
  for (const auto& [start, len] : u.decayRanges) {
    if (start > at) update(at, start, 1.f);
    update(start, start + len, decay);
    at = start + len;
  }
  if (at < u.slice.numel()) update(at, u.slice.numel(), 1.f);
}

double learningRate(const TrainingConfig& cfg, double t, int64_t totalSteps) {
  if (cfg.lrWarmupSteps > 0 && t < cfg.lrWarmupSteps)
    return cfg.lr * std::min(1.0, (t + 1) / static_cast<double>(cfg.lrWarmupSteps));
  const double span = static_cast<double>(std::max<int64_t>(1, totalSteps - cfg.lrWarmupSteps));
  const double progress = std::min(1.0, (t - static_cast<double>(cfg.lrWarmupSteps)) / span);
  return cfg.minLr + 0.5 * (cfg.lr - cfg.minLr) * (1 + std::cos(M_PI * progress));
}

}  // namespace edit
