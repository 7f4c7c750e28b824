// What every clock shares: a round's bookkeeping, the outer state's life (first round,
// checkpoint, recovery) and the stall check. The clocks are in sync_clocks.cpp, the
// overlapped round in sync_overlap.cpp.
#include "train/sync_schedule.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "sync/optim.h"

namespace edit {

namespace {
torch::Tensor scalar(double v) { return torch::full({1}, v, torch::kFloat64); }
double number(const NamedTensors& t, const std::string& k) { return t.at(k).item<double>(); }
std::string unitKey(size_t u) { return "unit" + std::to_string(u) + "/"; }
}  // namespace

SyncSchedule::SyncSchedule(const Config& cfg, Groups& groups, std::vector<FlatUnit>& units, const Progress& progress,
                           const FaultInjector* faults, Log log)
    : cfg_(cfg),
      mode_(modeTraits(cfg.algorithm.mode)),
      groups_(groups),
      units_(units),
      progress_(progress),
      faults_(faults),
      log_(std::move(log)),
      sync_(syncSettingsFor(cfg.algorithm)) {
  detectors_.assign(units_.size(), EwmaDetector{});
  overlap_ = cfg.algorithm.overlapSteps > 0 && hasRounds();
}

double SyncSchedule::lr(int64_t t) const {
  return learningRate(cfg_.training, static_cast<double>(t), progress_.totalSteps);
}

bool SyncSchedule::periodicCheckpointDue(int64_t t, int64_t id, int64_t lastId) const {
  (void)id, (void)lastId;
  const int64_t every = cfg_.checkpoint.everySteps;
  return every > 0 && t > 0 && t % every == 0;
}

int64_t SyncSchedule::finalCheckpointId(int64_t step, int64_t controlId, int64_t lastId) const {
  (void)controlId, (void)lastId;
  return step;
}

int64_t SyncSchedule::expectedRounds(int64_t totalSteps) const {
  if (!hasRounds()) return 0;
  if (!stepClocked()) return -1;
  const auto& a = cfg_.algorithm;
  const int64_t local = totalSteps - a.warmupSteps;
  if (local <= 0) return 0;
  // A round at every tau-th local step, and a final one over the steps after the last.
  return (local - 1) / a.syncInterval + 1;
}

std::string SyncSchedule::describe(int64_t totalSteps) const {
  const auto& a = cfg_.algorithm;
  std::ostringstream m;
  m << nameOf(a.mode) << ": ";
  if (!hasRounds()) {
    m << "gradients averaged every step";
    return m.str();
  }
  if (stepClocked()) m << "a sync round every " << a.syncInterval << " local steps";
  else m << "a sync round every " << a.syncSeconds << " s";
  m << " after " << a.warmupSteps << " synchronous warm-up steps";
  if (const int64_t r = expectedRounds(totalSteps); r >= 0) m << " (" << r << " rounds)";
  m << "; outer step: ";
  if (!mode_.outerOptimizer) {
    m << "the replicas' average";
  } else {
    m << (sync_.nesterov ? "Nesterov" : "SGD") << " lr " << sync_.lr << " momentum " << sync_.momentum
      << (a.outer.momentum < 0 ? " (the mode's default)" : "");
  }
  const auto& p = sync_.penalty;
  if (!sync_.penaltyOn()) {
    m << "; no penalty";
    return m.str();
  }
  m << "; penalty:";
  if (p.anomaly) m << " anomalies z > " << p.zThreshold << " after " << p.anomalyWarmup << " rounds,";
  if (p.weighted) m << " softmax weights (" << nameOf(p.weighting) << ", T " << p.temperature << "),";
  if (sync_.stepShare) m << " step share " << p.stepShare << ",";
  if (p.clip) m << " clip at " << p.clipNorm;
  return m.str();
}

std::string SyncSchedule::anomalyWarmupWarning(int64_t totalSteps) const {
  const auto& p = sync_.penalty;
  const int64_t rounds = expectedRounds(totalSteps);
  if (!sync_.penaltyOn() || !p.anomaly || rounds < 0 || p.anomalyWarmup < rounds) return "";
  return "the anomaly test never arms in this run: algorithm.penalty.anomalyWarmup is " +
         std::to_string(p.anomalyWarmup) + " rounds and the run has " + std::to_string(rounds) +
         "; a loss spike on one replica then reaches the outer weights (lower anomalyWarmup, e.g. to " +
         std::to_string(std::max<int64_t>(1, rounds / 4)) + ")";
}

const char* SyncSchedule::phase(int64_t t, bool synced) const {
  return !hasRounds() ? "sync" : synchronousAt(t) ? "warmup" : synced ? "sync" : "local";
}

int64_t SyncSchedule::ownedPart(int64_t n) const {
  return ownedPartLength(n, sync_.block, comm().replicas(), comm().replica());
}

void SyncSchedule::initOuter() {
  torch::NoGradGuard ng;
  outer_.clear();
  for (auto& u : units_) {
    const bool offload = cfg_.algorithm.offloadOuterState && u.slice.is_cuda();
    auto outer = offload ? u.slice.to(torch::kCPU).pin_memory() : u.slice.clone();
    outer_.push_back({outer, torch::zeros_like(outer)});
    if (sync_.codec.on()) {
      outer_.back().residual = torch::zeros_like(outer);
      outer_.back().averageResidual = torch::zeros({ownedPart(outer.numel())}, outer.options());
    }
  }
  outerReady_ = true;
  lastSyncTime_ = nowSeconds();
  stepsSinceSync_ = 0;
  roundStep_ = progress_.step;
  inRound_ = false;
}

void SyncSchedule::beginRound(int64_t t) {
  inRound_ = true;
  roundUnitsSynced_ = 0;
  roundBeginStep_ = t;
}

void SyncSchedule::endRound(int64_t t) {
  inRound_ = false;
  roundStep_ = t;
}

UnitSyncResult SyncSchedule::syncOne(size_t u, bool overlapped) {
  if (faults_) faults_->killIfAsked(roundBeginStep_, static_cast<int>(u));
  auto res = overlapped ? overlapRound(u)
                        : syncUnit(comm(), units_[u], outer_[u], detectors_[u], sync_,
                                   static_cast<double>(stepsSinceSync_));
  ++roundUnitsSynced_;
  return res;
}

void SyncSchedule::syncWholeModel(RoundOutcome& out, bool overlapped) {
  std::vector<Pending> fs;
  std::vector<UnitSyncResult> res(units_.size());
  const double t0 = nowSeconds();
  for (size_t u = 0; u < units_.size(); ++u)
    fs.push_back(groups_.stream->enqueue([this, u, &res, overlapped] { res[u] = syncOne(u, overlapped); }));
  for (auto& f : fs) groups_.stream->wait(f, Group::Sync, CommOp::Sync);
  out.syncWork += nowSeconds() - t0;
  noteRound(res, out);
}

void SyncSchedule::startLayerwise() {
  layerwiseRes_.assign(units_.size(), {});
  layerwiseWork_.assign(units_.size(), 0.0);
}

void SyncSchedule::syncUnitBeforeGather(size_t u) {
  const double t0 = nowSeconds();
  layerwiseRes_[u] = syncOne(u, overlap_);
  layerwiseWork_[u] = nowSeconds() - t0;
}

void SyncSchedule::finishLayerwise(RoundOutcome& out) {
  for (double w : layerwiseWork_) out.syncWork += w;
  noteRound(layerwiseRes_, out);
}

void SyncSchedule::noteRound(const std::vector<UnitSyncResult>& res, RoundOutcome& out) {
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
    if (!res[u].done) continue;
    ++out.unitsDone;
    out.unitsClipped += res[u].clipFactor < 1;
    out.weightMin = std::min(out.weightMin, res[u].weight);
    out.weightMax = std::max(out.weightMax, res[u].weight);
    out.clipMin = std::min(out.clipMin, res[u].clipFactor);
  }
  if (!sync_.penaltyOn()) {
    // Without the penalty no unit norm was completed: one all-reduce per round for the
    // reported norm (a no-op with one shard), instead of one per unit.
    auto sq = scalar(sliceSq);
    comm().allreduce(Group::Shard, sq);
    out.pseudoGradNormSq = sq.item<double>();
  }
}

void SyncSchedule::afterStep(int64_t t, const RoundOutcome& out) {
  if (out.synced) {
    endRound(t);
    lastSyncTime_ = roundStartTime_;
    recordRound(out);
    stepsSinceSync_ = 0;
  }
  if (!synchronousAt(t)) ++stepsSinceSync_;
}

void SyncSchedule::lastRound(int64_t t) {
  drainOverlap();
  RoundOutcome out;
  syncWholeModel(out, false);
  endRound(t);
  recordRound(out);
  stepsSinceSync_ = 0;
  failIfStalled();
}

void SyncSchedule::finalRound() {
  if (!hasRounds() || !outerReady_) return;
  drainOverlap();
  if (stepsSinceSync_ == 0) return;
  RoundOutcome out;
  syncWholeModel(out, false);
  recordRound(out);
  stepsSinceSync_ = 0;  // the final checkpoint ends on this round: a resume starts a new interval
  failIfStalled();
}

void SyncSchedule::recordRound(const RoundOutcome& out) {
  ++syncRounds_;
  anomalies_ += out.anomalies;
  lastPseudoGradNorm_ = std::sqrt(out.pseudoGradNormSq);
  afterRound(out);
}

void SyncSchedule::afterRound(const RoundOutcome& out) {
  if (sync_.penaltyOn() && out.unitsDone > 0) {
    auto& p = penaltyStats_;
    p.unitRounds += static_cast<uint64_t>(out.unitsDone);
    p.unitsClipped += static_cast<uint64_t>(out.unitsClipped);
    p.weightMin = std::min(p.weightMin, out.weightMin);
    p.weightMax = std::max(p.weightMax, out.weightMax);
    p.clipMin = std::min(p.clipMin, out.clipMin);
    p.lastWeightMin = out.weightMin, p.lastWeightMax = out.weightMax, p.lastClipMin = out.clipMin;
  }
  skipStreak_.resize(units_.size(), 0);
  for (size_t u = 0; u < units_.size() && u < out.skipped.size(); ++u) {
    if (!out.skipped[u]) {
      skipStreak_[u] = 0;
      continue;
    }
    ++skipStreak_[u];
    ++outerSkips_;
    if (u < out.norms.size())
      log_("sync round " + std::to_string(syncRounds_) + ": every replica's pseudo-gradient of unit " +
           units_[u].layout.name + " was anomalous (this replica's norm " + std::to_string(out.norms[u]) +
           "); its outer step was skipped (" + std::to_string(skipStreak_[u]) + " round(s) in a row)");
  }
}

void SyncSchedule::failIfStalled() const {
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

int64_t SyncSchedule::maxSkipStreak() const {
  int64_t m = 0;
  for (auto k : skipStreak_) m = std::max(m, k);
  return m;
}

torch::Tensor SyncSchedule::roundStartPoint(size_t u) const {
  // Overlapped, the round started from base_ (outer_ may be changing on its thread).
  if (overlap_ && u < inflight_.size() && inflight_[u].valid()) return base_[u];
  return outer_[u].outer.to(units_[u].slice.device());
}

void SyncSchedule::agreeJobSteps(int64_t step) {
  const int W = comm().world();
  auto mine = scalar(static_cast<double>(step));
  auto all = torch::empty({W, 1}, torch::kFloat64);
  std::vector<torch::Tensor> outs;
  for (int r = 0; r < W; ++r) outs.push_back(all[r]);
  comm().allgather(Group::World, mine, outs);
  jobSteps_ = 0;
  for (int r = 0; r < W; r += comm().shards()) jobSteps_ += static_cast<int64_t>(all[r][0].item<double>());
  jobStepsAt_ = step;
}

void SyncSchedule::save(NamedTensors& t) const {
  t["meta/stepsSinceSync"] = scalar(static_cast<double>(stepsSinceSync_));
  t["meta/syncRounds"] = scalar(static_cast<double>(syncRounds_));
  t["meta/anomalies"] = scalar(static_cast<double>(anomalies_));
  t["meta/outerReady"] = scalar(outerReady_ ? 1 : 0);
  t["meta/jobSteps"] = scalar(static_cast<double>(jobSteps_));
  t["meta/jobStepsAt"] = scalar(static_cast<double>(jobStepsAt_));
  for (size_t u = 0; u < units_.size(); ++u) {
    const std::string k = unitKey(u);
    t[k + "ewma"] = torch::tensor({detectors_[u].mean, detectors_[u].var, static_cast<double>(detectors_[u].count)},
                                  torch::kFloat64);
    // The stall check's streak (the same on every rank): a resume goes on counting it.
    t[k + "skipStreak"] = scalar(static_cast<double>(u < skipStreak_.size() ? skipStreak_[u] : 0));
    if (!outerReady_) continue;
    t[k + "outer"] = outer_[u].outer;
    t[k + "momentum"] = outer_[u].momentum;
    if (outer_[u].residual.defined()) t[k + "residual"] = outer_[u].residual;
    if (outer_[u].averageResidual.defined()) t[k + "averageResidual"] = outer_[u].averageResidual;
  }
}

void SyncSchedule::load(const NamedTensors& t, bool newReplica, bool sameReplicas, const std::string& dir) {
  torch::NoGradGuard ng;
  const int64_t step = progress_.step;
  stepsSinceSync_ = static_cast<int64_t>(number(t, "meta/stepsSinceSync"));
  syncRounds_ = static_cast<uint64_t>(number(t, "meta/syncRounds"));  // the job's round count
  // A new replica counts only what it trains itself, as after an in-place scale-up.
  anomalies_ = newReplica ? 0 : static_cast<uint64_t>(number(t, "meta/anomalies"));
  outerReady_ = number(t, "meta/outerReady") > 0;
  // Older checkpoints lack the job's progress: as if every replica were at this step.
  jobSteps_ = t.count("meta/jobSteps") ? static_cast<int64_t>(number(t, "meta/jobSteps")) : step * comm().replicas();
  jobStepsAt_ = t.count("meta/jobStepsAt") ? static_cast<int64_t>(number(t, "meta/jobStepsAt")) : step;
  outer_.clear();
  // Older checkpoints have no streaks: counted from zero, as before they were saved.
  skipStreak_.assign(units_.size(), 0);
  size_t residualsFound = 0;
  for (size_t u = 0; u < units_.size(); ++u) {
    const std::string k = unitKey(u);
    auto e = t.at(k + "ewma");
    detectors_[u] = {e[0].item<double>(), e[1].item<double>(), static_cast<int64_t>(e[2].item<double>())};
    if (t.count(k + "skipStreak")) skipStreak_[u] = static_cast<int64_t>(number(t, k + "skipStreak"));
    if (!outerReady_) continue;
    outer_.push_back({t.at(k + "outer").clone(), t.at(k + "momentum").clone()});
    // The error feedback of int8/int4 compression. Without one in the file (compression
    // switched on at this resume) it starts at zero, as at the first compressed round;
    // one in the file that this run does not compress with is dropped. It is what this
    // rank has not sent yet: a new replica has sent nothing and starts at zero.
    if (!sync_.codec.on()) continue;
    auto& o = outer_.back();
    const bool has = t.count(k + "residual") > 0 && !newReplica;
    residualsFound += has;
    o.residual = has ? t.at(k + "residual").clone() : torch::zeros_like(o.outer);
    // The owned part's residual, when the file has one of this run's part (the parts
    // follow the number of replicas and the block); otherwise from zero.
    const int64_t own = ownedPart(o.outer.numel());
    const bool hasAvg = sameReplicas && t.count(k + "averageResidual") && t.at(k + "averageResidual").numel() == own;
    o.averageResidual = hasAvg ? t.at(k + "averageResidual").clone() : torch::zeros({own}, o.outer.options());
  }
  if (outerReady_ && sync_.codec.on() && residualsFound == 0 && !newReplica)
    log_("checkpoint " + dir + " has no compression residual (written with algorithm.syncCompression none): starting from zero");
  if (outerReady_ && !sync_.codec.on() && t.count("unit0/residual"))
    log_("checkpoint " + dir + " holds a compression residual; algorithm.syncCompression is none: dropped");
  lastSyncTime_ = nowSeconds();
  roundStep_ = step - stepsSinceSync_;
}

RoundPosition SyncSchedule::position() const {
  // The outer state after round `cur`, and how many units of the round in progress this
  // rank has applied on top (units sync in order). A round whose every unit was
  // synchronized is complete here even if the step failed afterwards (in an all-gather or
  // the backward): its outer state is final.
  RoundPosition p;
  const size_t done = roundUnitsSynced_;
  const bool roundDone = inRound_ && done == units_.size();
  if (outerReady_) p.cur = static_cast<int64_t>(syncRounds_ + (roundDone ? 1 : 0));
  p.curStep = roundDone ? roundBeginStep_ : roundStep_;
  if (inRound_ && !roundDone) {
    p.next = static_cast<int64_t>(syncRounds_ + 1);
    p.nextStep = roundBeginStep_;
    p.unitsDone = static_cast<int64_t>(done);
  }
  return p;
}

void SyncSchedule::agreeSkipStreaks() {
  skipStreak_.resize(units_.size(), 0);
  auto streaks = torch::empty({static_cast<int64_t>(units_.size())}, torch::kFloat64);
  for (size_t u = 0; u < units_.size(); ++u) streaks[u] = static_cast<double>(skipStreak_[u]);
  comm().allreduce(Group::World, streaks, c10d::ReduceOp::MAX);
  for (size_t u = 0; u < units_.size(); ++u) skipStreak_[u] = static_cast<int64_t>(streaks[u].item<double>());
}

void SyncSchedule::continueFromRound(int64_t round, int64_t step) {
  for (size_t u = 0; u < units_.size(); ++u) units_[u].slice.copy_(outer_[u].outer);
  // The compression's error feedback (both residuals) restarts at zero on every rank: a
  // survivor's residuals belong to the round it got to, not necessarily `round`, and a
  // replacement has none. What they held (at most half a quantization step per element)
  // is dropped (docs/algorithm.md).
  for (auto& o : outer_) {
    if (o.residual.defined()) o.residual.zero_();
    if (o.averageResidual.defined()) o.averageResidual.zero_();
  }
  roundStep_ = step;
  skipSyncAt_ = step;  // the round at this step is the one restored
  stepsSinceSync_ = 0;
  syncRounds_ = static_cast<uint64_t>(round);
  inRound_ = false;
  lastSyncTime_ = nowSeconds();
}

void SyncSchedule::resizeOwnedParts() {
  for (auto& o : outer_)
    if (o.averageResidual.defined()) o.averageResidual = torch::zeros({ownedPart(o.outer.numel())}, o.outer.options());
}

void SyncSchedule::checkSyncGroupAgrees() const {
  double fp = 0;
  for (auto& o : outer_) fp += o.outer.sum(torch::kFloat64).item<double>();
  auto hi = scalar(fp), lo = scalar(-fp);
  comm().allreduce(Group::Sync, hi, c10d::ReduceOp::MAX);
  comm().allreduce(Group::Sync, lo, c10d::ReduceOp::MAX);
  if (hi.item<double>() != -lo.item<double>() || !std::isfinite(fp))
    throw std::runtime_error("in-place recovery: outer weights differ across the sync group after the copy");
}

}  // namespace edit
