// The clocks of the mode table (common/src/modes.h): when a sync round is due, and what
// follows from a clock for the learning rate, checkpoints and the end of the run.
#include <algorithm>

#include "sync/optim.h"
#include "train/sync_schedule.h"

namespace edit {
namespace {

// ddp: gradients averaged every step; no round ever.
class EveryStepClock final : public SyncSchedule {
 public:
  using SyncSchedule::SyncSchedule;
  bool due(int64_t) override { return false; }
};

// edit, diloco, localsgd: a round every algorithm.syncInterval local steps after the
// warm-up.
class StepClock final : public SyncSchedule {
 public:
  using SyncSchedule::SyncSchedule;
  bool due(int64_t t) override {
    const auto& a = cfg_.algorithm;
    if (t <= a.warmupSteps || t == skipSyncAt_) return false;
    // No local step since the last round (a run resumed from its final checkpoint, which
    // ended on a round): nothing to synchronize. A round of zero pseudo-gradients would
    // still feed its zero norms to the anomaly statistics and reset the stall count.
    return stepsSinceSync_ > 0 && (t - a.warmupSteps) % a.syncInterval == 0;
  }
};

// a-edit: a round every algorithm.syncSeconds of wall time (docs/algorithm.md, "A-EDiT's
// rounds"). The replicas make different numbers of steps, so the job's progress (the
// replica-steps agreed at each control exchange) drives the learning rate, the
// checkpoint ids and the end of the run.
class TimeClock final : public SyncSchedule {
 public:
  using SyncSchedule::SyncSchedule;

  bool due(int64_t t) override;

  double lr(int64_t t) const override {
    // Fast and slow replicas decay together: the job's steps per replica at the last
    // exchange plus this replica's steps since.
    if (synchronousAt(t)) return SyncSchedule::lr(t);
    const double jobStep =
        static_cast<double>(jobSteps_) / comm().replicas() + static_cast<double>(t - jobStepsAt_);
    return learningRate(cfg_.training, jobStep, progress_.totalSteps);
  }
  // The local phase ends on the round that spends the budget (lastRound), not at a step.
  bool endsAtStepCount(int64_t t) const override { return synchronousAt(t); }
  int64_t checkpointId(int64_t t, int64_t replicaSteps) const override {
    return synchronousAt(t) ? t : replicaSteps / comm().replicas();
  }
  bool periodicCheckpointDue(int64_t t, int64_t id, int64_t lastId) const override {
    const int64_t every = cfg_.checkpoint.everySteps;
    return every > 0 && t > 0 && id / every > lastId / every;
  }
  bool budgetSpent(bool sync, int64_t replicaSteps) const override {
    return sync && replicaSteps >= progress_.totalSteps * comm().replicas();
  }
  // Between exchanges there is no agreed progress to number a checkpoint by.
  bool checkpointsBetweenControlPoints() const override { return false; }
  int64_t finalCheckpointId(int64_t, int64_t controlId, int64_t lastId) const override {
    return std::max(controlId, lastId + 1);
  }
  int64_t scaleProgress(int64_t) const override { return jobSteps_ / comm().replicas(); }
  bool validatesPeriodically() const override { return false; }
  void localStepTimed(double seconds) override {
    localStepSeconds_ = localStepSeconds_ > 0 ? 0.7 * localStepSeconds_ + 0.3 * seconds : seconds;
  }
  // The loop already ended on a round (lastRound).
  void finalRound() override {}

 private:
  // The store key of the round this replica has posted its arrival for; it names the
  // rendezvous generation, so a recovery starts every arrival afresh.
  std::string arrivedKey_;
  double localStepSeconds_ = 0;  // moving average of this rank's local step time
};

bool TimeClock::due(int64_t t) {
  const auto& a = cfg_.algorithm;
  if (t <= a.warmupSteps || t == skipSyncAt_) return false;
  // Arrival: the window is over at the step boundary nearest the deadline: now, unless the
  // next one (a step away, by this replica's recent local steps) is nearer. The replica
  // then posts its arrival on the job's store.
  // Start: the round starts once every replica has arrived. Until then an arrived replica
  // keeps making local steps instead of waiting in the round's first collective for a
  // slower one, so a straggler costs the others at most part of one of their own steps.
  // Every rank of a replica must decide alike: the shard group agrees on the largest
  // elapsed time, step time and arrival count (its ranks step in lockstep anyway).
  Comm& c = comm();
  const std::string counter = "arrive/" + std::to_string(syncRounds_ + 1);
  const std::string key = c.prefix() + counter;
  const bool arrived = arrivedKey_ == key;
  const double mine = arrived && c.shard() == 0 ? static_cast<double>(c.addCounter(counter, 0)) : 0.0;
  auto v = torch::tensor({nowSeconds() - lastSyncTime_, localStepSeconds_, mine}, torch::kFloat64);
  c.allreduce(Group::Shard, v, c10d::ReduceOp::MAX);
  const double elapsed = v[0].item<double>(), step = v[1].item<double>();
  int64_t here = static_cast<int64_t>(v[2].item<double>());
  const bool capped = a.maxStepsPerSync > 0 && stepsSinceSync_ >= a.maxStepsPerSync;
  if (!arrived) {
    if (!capped && (elapsed + 0.5 * step < a.syncSeconds || stepsSinceSync_ < a.minStepsPerSync)) return false;
    arrivedKey_ = key;
    auto n = torch::full({1}, c.shard() == 0 ? static_cast<double>(c.addCounter(counter, 1)) : 0.0, torch::kFloat64);
    c.allreduce(Group::Shard, n, c10d::ReduceOp::MAX);
    here = static_cast<int64_t>(n.item<double>());
  }
  // Wait in the round's collectives instead once the step cap is reached, or after one
  // more window: a replica that never arrives (dead, or hung) is then found by the
  // collectives' timeout, as in every other mode.
  if (here >= c.replicas() || capped || elapsed >= 2 * a.syncSeconds) return true;
  ++stepsAwaitingRound_;
  return false;
}

}  // namespace

std::unique_ptr<SyncSchedule> SyncSchedule::make(const Config& cfg, Groups& groups, std::vector<FlatUnit>& units,
                                                 const Progress& progress, const FaultInjector* faults, Log log) {
  switch (modeTraits(cfg.algorithm.mode).clock) {
    case SyncClock::EveryStep:
      return std::make_unique<EveryStepClock>(cfg, groups, units, progress, faults, std::move(log));
    case SyncClock::Steps:
      return std::make_unique<StepClock>(cfg, groups, units, progress, faults, std::move(log));
    case SyncClock::Seconds:
      return std::make_unique<TimeClock>(cfg, groups, units, progress, faults, std::move(log));
  }
  throw std::logic_error("SyncSchedule::make: a clock without a class");
}

}  // namespace edit
