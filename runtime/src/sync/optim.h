// Sharded AdamW: each rank updates only its slice of every unit, so the optimizer state
// (m, v) is sharded like the parameters. Decoupled weight decay on matrices only.
#pragma once

#include <torch/torch.h>

#include <vector>

#include "worker_config.h"
#include "dist/flat_units.h"

namespace edit {

class ShardedAdamW {
 public:
  ShardedAdamW(const TrainingConfig& cfg, const std::vector<FlatUnit>& units);
  void step(std::vector<FlatUnit>& units, double lr);
  int64_t stepCount() const { return t_; }
  void setStepCount(int64_t t) { t_ = t; }
  std::vector<torch::Tensor>& m() { return m_; }
  std::vector<torch::Tensor>& v() { return v_; }

 private:
  double beta1_, beta2_, eps_, wd_;
  int64_t t_ = 0;
  std::vector<torch::Tensor> m_, v_;
};

// Learning rate at step t: linear warm-up to cfg.lr, then cosine decay to cfg.minLr.
// t may be fractional (A-EDiT: the job's progress in steps per replica).
double learningRate(const TrainingConfig& cfg, double t, int64_t totalSteps);

}  // namespace edit
