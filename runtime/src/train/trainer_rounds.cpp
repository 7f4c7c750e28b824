// Bookkeeping of sync rounds: what a round reports, the stall check, and the learning rate
// that A-EDiT drives by the job's progress (docs/algorithm.md).
#include <cmath>
#include <sstream>

#include "train/trainer.h"

namespace edit {

void Trainer::noteRound(const std::vector<UnitSyncResult>& res, StepOutcome& out) {
  out.synced = true;
  out.skipped.assign(res.size(), false);
  out.norms.assign(res.size(), 0.0);
  double sliceSq = 0;
  for (size_t u = 0; u < res.size(); ++u) {
    out.pseudoGradNormSq += res[u].averagedNorm * res[u].averagedNorm;
    sliceSq += res[u].sliceSq;
    out.anomalies += res[u].anomaly;
    out.skipped[u] = res[u].skipped;
    out.norms[u] = res[u].norm;
  }
  if (!sync_.penaltyOn()) {
    // Without the penalty no unit norm was completed: one all-reduce per round for the
    // reported norm (a no-op with one shard), instead of one per unit.
    auto sq = torch::full({1}, sliceSq, torch::kFloat64);
    comm_->allreduce(Group::Shard, sq);
    out.pseudoGradNormSq = sq.item<double>();
  }
}

void Trainer::afterRound(const StepOutcome& out) {
  skipStreak_.resize(units_.size(), 0);
  for (size_t u = 0; u < units_.size() && u < out.skipped.size(); ++u) {
    if (out.skipped[u]) {
      ++skipStreak_[u];
      ++outerSkips_;
      if (u < out.norms.size())
        log("sync round " + std::to_string(syncRounds_) + ": every replica's pseudo-gradient of unit " +
            units_[u].layout.name + " was anomalous (this replica's norm " + std::to_string(out.norms[u]) +
            "); its outer step was skipped (" + std::to_string(skipStreak_[u]) + " round(s) in a row)");
    } else {
      skipStreak_[u] = 0;
    }
  }
}

void Trainer::failIfStalled() const {
  const int64_t K = cfg_.algorithm.penalty.maxSkippedRounds;
  if (K <= 0) return;
  for (size_t u = 0; u < skipStreak_.size(); ++u) {
    if (skipStreak_[u] < K) continue;
    std::ostringstream m;
    m << "training stalled: the outer step of unit " << units_[u].layout.name << " was skipped in the last "
      << skipStreak_[u] << " sync rounds in a row (up to round " << syncRounds_
      << ") because every replica's pseudo-gradient was anomalous, so no local progress was kept; "
      << "non-finite norms mean the run diverged (lower training.lr), finite ones that the norms jumped "
      << "far above the anomaly statistics. algorithm.penalty.maxSkippedRounds=" << K
      << " (0 never fails); docs/algorithm.md";
    throw TrainingStalled(m.str());
  }
}

double Trainer::lrAt(int64_t t) const {
  // A-EDiT's replicas make different numbers of steps: the schedule follows the job's
  // progress (replica-steps of all replicas at the last exchange, per replica) plus this
  // replica's steps since, so that fast and slow replicas decay together.
  if (mode_.clock == SyncClock::Seconds && !synchronousAt(t)) {
    const double jobStep = static_cast<double>(jobSteps_) / comm_->replicas() + static_cast<double>(t - jobStepsAt_);
    return learningRate(cfg_.training, jobStep, totalSteps_);
  }
  return learningRate(cfg_.training, static_cast<double>(t), totalSteps_);
}

void Trainer::agreeJobSteps() {
  const int W = comm_->world();
  auto mine = torch::full({1}, static_cast<double>(step_), torch::kFloat64);
  auto all = torch::empty({W, 1}, torch::kFloat64);
  std::vector<torch::Tensor> outs;
  for (int r = 0; r < W; ++r) outs.push_back(all[r]);
  comm_->allgather(Group::World, mine, outs);
  jobSteps_ = 0;
  for (int r = 0; r < W; r += comm_->shards()) jobSteps_ += static_cast<int64_t>(all[r][0].item<double>());
  jobStepsAt_ = step_;
}

}  // namespace edit
