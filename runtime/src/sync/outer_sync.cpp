#include "sync/outer_sync.h"

#include "sync/compression.h"

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
  s.int8 = a.syncCompression == "int8";
  s.block = a.compressionBlock;
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

// 2. the norm of the replica's whole unit from this slice's square, 3. its verdict.
static void judge(Comm& comm, EwmaDetector& detector, const SyncSettings& s, double localSq,
                  UnitSyncResult& r) {
  r.norm = completeNorm(comm, localSq);
  // Anomaly elimination (non-finite is always an anomaly, even with the test off).
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
}

// A round with algorithm.syncCompression int8 (docs/algorithm.md, "Compressed
// synchronization"). D holds this rank's pseudo-gradient on entry and, on return, the
// weighted average of every replica's dequantized one; false when every replica was
// dropped (the round skips the unit). Gloo has no int8 sum: each rank all-gathers every
// replica's int8 slice with its scales and its (norm, steps), and all ranks of the sync
// group dequantize and sum the same bytes in the same order, so they agree bit for bit.
static bool averageInt8(Comm& comm, torch::Tensor& D, torch::Tensor& residual, EwmaDetector& detector,
                        const SyncSettings& s, double stepsSinceSync, UnitSyncResult& r) {
  const int M = comm.size(Group::Sync), me = comm.rankIn(Group::Sync);
  const double inf = std::numeric_limits<double>::infinity();
  D.add_(residual);  // error feedback: what earlier rounds' quantization did not send
  const Int8Record rec{D.numel(), s.block};
  const int64_t R = rec.bytes();
  auto all = torch::empty({M * R}, D.options().dtype(torch::kUInt8));
  auto row = [&](int m) { return all.narrow(0, m * R, R); };
  auto mine = row(me);
  // Checked before anything is scaled: the absmax of a NaN would poison its block.
  const bool finite = quantizeInt8(D, s.block, rec.values(mine), rec.scales(mine));
  auto Dq = torch::empty_like(D);
  dequantizeInt8(rec.values(mine), rec.scales(mine), s.block, Dq);
  // The penalty judges what the others receive: the dequantized values.
  if (s.penaltyOn()) {
    judge(comm, detector, s, finite ? Dq.dot(Dq).item<double>() : inf, r);
  } else {
    r.anomaly = !finite;  // baselines: dropped from this slice's average only
  }
  // A dropped contribution leaves the residual as it was (nothing of D was sent);
  // otherwise it keeps what this round's quantization lost.
  if (!r.anomaly) torch::sub_out(residual, D, Dq);
  rec.header(mine).copy_(torch::tensor({r.anomaly ? inf : r.norm, stepsSinceSync}, torch::kFloat64));
  comm.allgatherInto(Group::Sync, mine, all);

  std::vector<double> norms(M), steps(M);
  for (int m = 0; m < M; ++m) {
    auto h = rec.header(row(m)).cpu();
    norms[m] = h[0].item<double>();
    steps[m] = h[1].item<double>();
  }
  std::vector<double> w(M, 0.0);
  if (s.penaltyOn()) {
    w = replicaWeights(norms, steps, s.penalty, s.penalty.weighted, s.stepShare);
  } else {
    int kept = 0;
    for (double g : norms) kept += std::isfinite(g);
    for (int m = 0; m < M; ++m) w[m] = kept && std::isfinite(norms[m]) ? 1.0 / kept : 0.0;
  }
  r.weight = w[me];
  double wsum = 0;
  for (double x : w) wsum += x;
  if (wsum == 0) return false;
  D.zero_();
  for (int m = 0; m < M; ++m) {
    if (w[m] == 0) continue;
    dequantizeInt8(rec.values(row(m)), rec.scales(row(m)), s.block, Dq);
    D.add_(Dq, w[m]);
  }
  return true;
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

  if (s.int8) {
    auto residual = offloaded ? o.residual.to(unit.slice.device(), true) : o.residual;
    const bool averaged = averageInt8(comm, D, residual, detector, s, stepsSinceSync, r);
    if (offloaded) o.residual.copy_(residual);
    if (!averaged) {
      // Every replica dropped: skip the outer step and drop the local progress.
      r.skipped = true;
      unit.slice.copy_(outer);
      return r;
    }
  } else if (!s.penaltyOn()) {
    // Baselines: Dbar = mean_m D_m, one all-reduce and nothing else.
    comm.allreduce(Group::Sync, D);
    if (M > 1) D.div_(M);
    r.weight = 1.0 / M;
  } else {
    judge(comm, detector, s, D.dot(D).item<double>(), r);
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
  }

  r.sliceSq = D.dot(D).item<double>();
  if (s.penaltyOn()) {
    // 5. clipping of the averaged pseudo-gradient.
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
