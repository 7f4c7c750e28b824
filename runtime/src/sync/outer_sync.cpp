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
  s.codec = Codec::of(a.syncCompression);
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

void previewOuterStep(torch::Tensor& out, const torch::Tensor& outer, const torch::Tensor& momentum,
                      const torch::Tensor& D, double lr, double mu, bool nesterov) {
  if (mu == 0) {
    out.copy_(D);
  } else {
    out.copy_(momentum).mul_(mu).add_(D);  // b' = mu b + D
    if (nesterov) out.mul_(mu).add_(D);    // D + mu b'
  }
  out.mul_(-lr).add_(outer);
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

// The length of the part of a slice of n elements that sync rank `rank` of M owns in the
// compressed reduce-scatter (the size of its OuterUnit::averageResidual).
int64_t ownedPartLength(int64_t n, int64_t block, int M, int rank) {
  return SlicePartition{n, block, M}.length(rank);
}

// The owner's half of a compressed exchange (the sync round's and the warm-up gradient
// mean's): the part this rank owns, A = sum_m w_m x'_m over the records `received` in fp32,
// replica order, each term rounded to fp32 before it is added (docs/algorithm.md: the
// order the reference repeats), plus `residual` when given (the owner's error feedback);
// requantized and all-gathered into `scratch` (at least M records without header); x :=
// every owner's part, dequantized: the same bytes, so the same bits, on every rank. A
// non-finite A (fp32 overflow, or a NaN that was sent) goes out as zeros, the residual
// kept, or with nanIfNotFinite as NaN scales, so every rank sees NaN there as an fp32
// all-reduce would show it.
static void averageOwnedAndGather(Comm& comm, const SlicePartition& parts, const QuantRecord& rec,
                                  const torch::Tensor& received, const std::vector<double>& w,
                                  torch::Tensor* residual, const torch::Tensor& scratch, torch::Tensor& x,
                                  bool nanIfNotFinite) {
  const int M = parts.parts, me = comm.rankIn(Group::Sync);
  const int64_t own = parts.length(me), R = rec.bytes();
  const QuantRecord out{rec.n, rec.block, rec.codec, /*withHeader=*/false};
  const int64_t O = out.bytes();
  auto gathered = scratch.narrow(0, 0, M * O);
  auto mine = gathered.narrow(0, me * O, O);
  if (own > 0) {
    auto A = torch::zeros({own}, x.options()), term = torch::empty_like(A);
    for (int m = 0; m < M; ++m) {
      if (w[m] == 0) continue;
      rec.decode(received.narrow(0, m * R, R), term);
      A.add_(term.mul_(w[m]));
    }
    if (residual) A.add_(*residual);
    auto Aq = torch::empty_like(A);
    if (out.encode(A, mine)) {
      if (residual) {
        out.decode(mine, Aq);
        torch::sub_out(*residual, A, Aq);
      }
    } else if (nanIfNotFinite) {
      out.scales(mine, own).fill_(std::numeric_limits<float>::quiet_NaN());
    }
  }
  comm.allgatherInto(Group::Sync, mine, gathered);
  for (int c = 0; c < M; ++c) {
    if (parts.length(c) > 0) out.decode(gathered.narrow(0, c * O, O), x.narrow(0, parts.begin(c), parts.length(c)));
  }
}

// A round with algorithm.syncCompression int8 or int4 (docs/algorithm.md, "Compressed
// synchronization"). D holds this rank's pseudo-gradient on entry and, on return, the
// weighted average of every replica's dequantized one; false when every replica was
// dropped (the round skips the unit). Gloo has no int8 sum, so the all-reduce becomes a
// quantized reduce-scatter and all-gather: the slice is cut into M parts; each rank sends
// part c, quantized, with its (norm, steps), to sync rank c (all-to-all); rank c averages
// its part over the replicas in fp32 in replica order, requantizes the average (with its
// own error feedback) and all-gathers it. Every rank dequantizes the same gathered bytes, so
// the replicas' outer slices agree bit for bit.
static bool averageCompressed(Comm& comm, torch::Tensor& D, torch::Tensor& residual,
                              torch::Tensor& averageResidual, EwmaDetector& detector, const SyncSettings& s,
                              double stepsSinceSync, UnitSyncResult& r) {
  const int M = comm.size(Group::Sync), me = comm.rankIn(Group::Sync);
  const double inf = std::numeric_limits<double>::infinity();
  D.add_(residual);  // error feedback: what earlier rounds' quantization did not send
  const SlicePartition parts{D.numel(), s.block, M};
  const QuantRecord rec{parts.maxLength(), s.block, s.codec};
  const int64_t R = rec.bytes();
  auto sent = torch::zeros({M * R}, D.options().dtype(torch::kUInt8));
  auto received = torch::empty_like(sent);
  auto record = [&](const torch::Tensor& buf, int c) { return buf.narrow(0, c * R, R); };
  auto part = [&](const torch::Tensor& x, int c) { return x.narrow(0, parts.begin(c), parts.length(c)); };

  // Quantize part by part straight into the outgoing records (parts start on block
  // boundaries: the same bytes as quantizing the whole slice). A NaN or Inf anywhere is
  // found before anything is scaled; the whole slice then goes out as zeros.
  bool finite = true;
  for (int c = 0; c < M; ++c) {
    if (parts.length(c) > 0) finite &= rec.encode(part(D, c), record(sent, c));
  }
  if (!finite) sent.zero_();
  auto Dq = torch::empty_like(D);
  for (int c = 0; c < M; ++c) {
    if (parts.length(c) > 0) rec.decode(record(sent, c), part(Dq, c));
  }
  // The penalty judges what the others receive: the dequantized values.
  if (s.penaltyOn()) {
    judge(comm, detector, s, finite ? Dq.dot(Dq).item<double>() : inf, r);
  } else {
    r.anomaly = !finite;  // baselines: dropped from this slice's average only
  }
  // A dropped contribution leaves the residual as it was (nothing of D was sent);
  // otherwise it keeps what this round's quantization lost.
  if (!r.anomaly) torch::sub_out(residual, D, Dq);
  const auto header = torch::tensor({r.anomaly ? inf : r.norm, stepsSinceSync}, torch::kFloat64);
  for (int c = 0; c < M; ++c) rec.header(record(sent, c)).copy_(header);
  comm.alltoall(Group::Sync, sent, received);

  // Every rank received every replica's header: all compute the same weights.
  std::vector<double> norms(M), steps(M);
  for (int m = 0; m < M; ++m) {
    auto h = rec.header(record(received, m));
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

  averageOwnedAndGather(comm, parts, rec, received, w, &averageResidual, sent, D, /*nanIfNotFinite=*/false);
  return true;
}

void compressedMean(Comm& comm, torch::Tensor& x, const Codec& codec, int64_t block) {
  const int M = comm.size(Group::Sync);
  if (M == 1) return;
  const SlicePartition parts{x.numel(), block, M};
  const QuantRecord rec{parts.maxLength(), block, codec, /*withHeader=*/false};
  const int64_t R = rec.bytes();
  auto sent = torch::zeros({M * R}, x.options().dtype(torch::kUInt8));
  auto received = torch::empty_like(sent);
  for (int c = 0; c < M; ++c) {
    if (parts.length(c) == 0) continue;
    auto record = sent.narrow(0, c * R, R);
    // A NaN or Inf goes out as NaN scales: the mean is NaN there on every rank.
    if (!rec.encode(x.narrow(0, parts.begin(c), parts.length(c)), record))
      rec.scales(record, parts.length(c)).fill_(std::numeric_limits<float>::quiet_NaN());
  }
  comm.alltoall(Group::Sync, sent, received);
  const std::vector<double> w(M, 1.0 / M);
  averageOwnedAndGather(comm, parts, rec, received, w, nullptr, sent, x, /*nanIfNotFinite=*/true);
}

UnitSyncResult syncUnit(Comm& comm, FlatUnit& unit, OuterUnit& o, EwmaDetector& detector,
                        const SyncSettings& s, double stepsSinceSync) {
  // 1. pseudo-gradient, written into the gradient slice: the gradient is dead between
  // the inner step and the next backward, and this saves a [chunk] buffer per unit.
  auto D = torch::sub_out(unit.gradSlice, o.outer.to(unit.slice.device(), true), unit.slice);
  const UnitSyncResult r = syncPseudoGradient(comm, D, o, detector, s, stepsSinceSync);
  // 7. theta := theta_outer (unchanged when the round skipped the unit: the local progress
  // is dropped).
  unit.slice.copy_(o.outer);
  return r;
}

UnitSyncResult syncPseudoGradient(Comm& comm, torch::Tensor& D, OuterUnit& o, EwmaDetector& detector,
                                  const SyncSettings& s, double stepsSinceSync) {
  UnitSyncResult r;
  r.done = true;
  const bool offloaded = o.outer.device() != D.device();
  auto outer = offloaded ? o.outer.to(D.device(), true) : o.outer;
  auto momentum = offloaded ? o.momentum.to(D.device(), true) : o.momentum;
  const int M = comm.size(Group::Sync);

  if (s.codec.on()) {
    auto residual = offloaded ? o.residual.to(D.device(), true) : o.residual;
    auto averageResidual = offloaded ? o.averageResidual.to(D.device(), true) : o.averageResidual;
    const bool averaged = averageCompressed(comm, D, residual, averageResidual, detector, s, stepsSinceSync, r);
    if (offloaded) {
      o.residual.copy_(residual);
      o.averageResidual.copy_(averageResidual);
    }
    if (!averaged) {
      r.skipped = true;  // every replica dropped: no outer step
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
      r.skipped = true;  // every replica anomalous: no outer step
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

  // 6. outer Nesterov step.
  outerStep(outer, momentum, D, s.lr, s.momentum, s.nesterov);
  if (offloaded) {
    o.outer.copy_(outer);
    o.momentum.copy_(momentum);
  }
  return r;
}

}  // namespace edit
