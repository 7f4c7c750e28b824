// algorithm.overlapSteps: each sync round's exchange runs during the next round's local
// steps, and its outer step lands one round late (docs/algorithm.md, "Overlapped
// synchronization"). At the sync step of round k, for each unit (in forward order, on the
// communication stream, before its all-gather):
//   1. wait for round k-1's exchange (started a whole round ago) and take its outer step;
//   2. D_k = base - theta: the local progress of round k;
//   3. theta := the outer step of round k as if every replica's pseudo-gradient were D_k
//      (from the newest outer weights and momentum), base := theta: the replica starts
//      round k+1 where round k would take it on its own progress alone;
//   4. start round k's exchange of D_k on the round thread (its own process groups).
// Without a round in flight base is the outer weights (the first round, after a drain).
#include "train/sync_schedule.h"

namespace edit {

UnitSyncResult SyncSchedule::overlapRound(size_t u) {
  auto& unit = units_[u];
  if (base_.size() != units_.size()) {
    base_.resize(units_.size());
    pending_.resize(units_.size());
    inflight_.resize(units_.size());
    inflightResult_.resize(units_.size());
  }
  if (!base_[u].defined()) {
    base_[u] = torch::empty_like(unit.slice);
    pending_[u] = torch::empty_like(unit.slice);
  }
  UnitSyncResult applied;
  torch::Tensor from;
  if (inflight_[u].valid()) {
    // On the communication thread: the training thread's wait for this unit counts it.
    inflight_[u].done.get();
    inflight_[u] = {};
    applied = inflightResult_[u];
    from = base_[u];
  } else {
    from = outer_[u].outer.to(unit.slice.device(), true);
  }
  torch::sub_out(pending_[u], from, unit.slice);
  const auto& o = outer_[u];
  const auto dev = unit.slice.device();
  previewOuterStep(unit.slice, o.outer.to(dev, true), o.momentum.to(dev, true), pending_[u], sync_.lr,
                   sync_.momentum, sync_.nesterov);
  base_[u].copy_(unit.slice);
  const double steps = static_cast<double>(stepsSinceSync_);
  inflight_[u] = groups_.roundStream->enqueue([this, u, steps] {
    inflightResult_[u] = syncPseudoGradient(*groups_.roundComm, pending_[u], outer_[u], detectors_[u], sync_, steps);
  });
  return applied;
}

void SyncSchedule::drainOverlap() {
  if (!overlap_ || inflight_.empty()) return;
  torch::NoGradGuard ng;
  std::vector<UnitSyncResult> res(units_.size());
  bool any = false;
  for (size_t u = 0; u < units_.size(); ++u) {
    if (!inflight_[u].valid()) continue;
    groups_.roundStream->wait(inflight_[u], Group::Sync, CommOp::Sync);
    inflight_[u] = {};
    res[u] = inflightResult_[u];
    any = true;
    // theta := outer - (base - theta): the new outer weights plus the progress since the
    // round began; the outer weights are then the current round's start point.
    auto& slice = units_[u].slice;
    torch::sub_out(pending_[u], base_[u], slice);
    slice.copy_(outer_[u].outer).sub_(pending_[u]);
  }
  if (!any) return;
  RoundOutcome out;
  noteRound(res, out);
  anomalies_ += out.anomalies;
  afterRound(out);
  failIfStalled();
}

}  // namespace edit
