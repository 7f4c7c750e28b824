#include "outer_sync.h"

#include <cmath>
#include <limits>

namespace edit {

SyncSettings syncSettingsFor(const AlgorithmConfig& a) {
  SyncSettings s;
  s.penalty = a.penalty;
  const ModeTraits& mode = modeTraits(a.mode);
  s.lr = a.outer.lr;
  // An explicit momentum wins; -1 takes the mode's published one (common/src/modes.h).
  s.momentum = a.outer.momentum >= 0 ? a.outer.momentum : mode.outerMomentum;
  s.nesterov = a.outer.nesterov;
  s.stepShare = mode.stepShareWeights && a.penalty.stepShare > 0;
  if (!mode.penalty) {
    // Baselines: plain averaging of pseudo-gradients, no penalty.
    s.penalty.anomaly = false;
    s.penalty.weighted = false;
    s.penalty.clip = false;
    s.stepShare = false;
  }
  if (!mode.outerOptimizer) {
    // Post-local SGD: theta := average(theta), i.e. an outer SGD step with lr 1.
    s.lr = 1.0;
    s.momentum = 0.0;
    s.nesterov = false;
  }
  return s;
}

void outerStep(torch::Tensor& outer, torch::Tensor& momentum, torch::Tensor& grad,
               double lr, double mu, bool nesterov) {
  if (mu == 0) {
    outer.sub_(grad, lr);
    return;
  }
  momentum.mul_(mu).add_(grad);
  if (nesterov) {
    outer.sub_(grad.add_(momentum, mu), lr);  // grad is scratch: no temporary
  } else {
    outer.sub_(momentum, lr);
  }
}

static double completeNorm(Comm& comm, double localSq) {
  // Squared norm of the local slice, summed over the shard group. A NaN/Inf anywhere
  // makes the sum non-finite on every rank of the group, so all agree it is an anomaly.
  auto sq = torch::full({1}, localSq, torch::kFloat64);
  comm.allreduce(Group::Shard, sq);
  return std::sqrt(sq.item<double>());
}

UnitSyncResult syncUnit(Comm& comm, FlatUnit& unit, OuterUnit& o, EwmaDetector& detector,
                        const SyncSettings& s, double stepsSinceSync) {
  UnitSyncResult r;
  const bool offloaded = o.outer.device() != unit.slice.device();
  auto outer = offloaded ? o.outer.to(unit.slice.device(), true) : o.outer;
  auto momentum = offloaded ? o.momentum.to(unit.slice.device(), true) : o.momentum;
  const int M = comm.size(Group::Sync);
  // 1. pseudo-gradient, written into the gradient slice: the gradient is dead between
  // the inner step and the next backward, and this saves a [chunk] buffer per unit.
  auto D = torch::sub_out(unit.gradSlice, outer, unit.slice);

  if (!s.penaltyOn()) {
    // Baselines: Dbar = mean_m D_m, one all-reduce and nothing else.
    comm.allreduce(Group::Sync, D);
    if (M > 1) D.div_(M);
    r.weight = 1.0 / M;
    r.sliceSq = D.dot(D).item<double>();
  } else {
    r.norm = completeNorm(comm, D.dot(D).item<double>());  // 2. norm of the replica's whole unit

    // 3. anomaly elimination (non-finite is always an anomaly, even with the test off).
    r.anomaly = !std::isfinite(r.norm);
    if (!r.anomaly && s.penalty.anomaly) r.anomaly = detector.observe(r.norm, s.penalty).anomaly;
    if (s.penalty.anomaly && comm.size(Group::Shard) > 1) {
      // One verdict per replica, by construction: its shards see the same norm and should
      // hold the same statistics, but if they ever differed, one unit would get different
      // weights on different slices, and sync groups that disagreed on "all anomalous"
      // would run different collectives.
      auto flag = torch::full({1}, r.anomaly ? 1.0 : 0.0, torch::kFloat64);
      comm.allreduce(Group::Shard, flag, c10d::ReduceOp::MAX);
      r.anomaly = flag.item<double>() > 0;
    }
    if (r.anomaly) D.zero_();

    // 4. weights over the sync group from everyone's (norm, steps).
    auto mine = torch::tensor({r.anomaly ? std::numeric_limits<double>::infinity() : r.norm,
                               stepsSinceSync},
                              torch::kFloat64);
    std::vector<double> norms{mine[0].item<double>()}, steps{stepsSinceSync};
    if (M > 1) {
      auto all = torch::empty({M, 2}, torch::kFloat64);
      std::vector<torch::Tensor> outs;
      for (int m = 0; m < M; ++m) outs.push_back(all[m]);
      comm.allgather(Group::Sync, mine, outs);
      auto acc = all.accessor<double, 2>();
      norms.assign(M, 0);
      steps.assign(M, 0);
      for (int m = 0; m < M; ++m) {
        norms[m] = acc[m][0];
        steps[m] = acc[m][1];
      }
    }
    auto w = replicaWeights(norms, steps, s.penalty, s.penalty.weighted, s.stepShare);
    r.weight = w[comm.rankIn(Group::Sync)];
    double wsum = 0;
    for (double x : w) wsum += x;
    if (wsum == 0) {
      // Every replica anomalous: skip the outer step and drop the local progress.
      r.skipped = true;
      unit.slice.copy_(outer);
      return r;
    }
    D.mul_(r.weight);
    comm.allreduce(Group::Sync, D);  // Dbar = sum_m w_m D_m (weights already sum to 1)

    // 5. clipping of the averaged pseudo-gradient.
    r.sliceSq = D.dot(D).item<double>();
    r.averagedNorm = completeNorm(comm, r.sliceSq);
    if (s.penalty.clip) {
      r.clipFactor = clipScale(r.averagedNorm, s.penalty.clipNorm);
      if (r.clipFactor < 1) D.mul_(r.clipFactor);
    }
  }

  // 6. outer Nesterov step, 7. theta := theta_outer.
  outerStep(outer, momentum, D, s.lr, s.momentum, s.nesterov);
  unit.slice.copy_(outer);
  if (offloaded) {
    o.outer.copy_(outer);
    o.momentum.copy_(momentum);
  }
  return r;
}

}  // namespace edit
