// When the replicas synchronize, and what a sync round does to the outer state
// (docs/algorithm.md). One class per clock of the mode table (common/src/modes.h):
//
//   EveryStepClock  ddp: gradients averaged every step, no rounds, no outer state
//   StepClock       edit, diloco, localsgd: a round every algorithm.syncInterval local steps
//   TimeClock       a-edit: a round every algorithm.syncSeconds of wall time; the replicas'
//                   step counts differ, so the learning rate and the checkpoint ids follow
//                   the job's progress, and the run ends on the round that spends its budget
//
// The base class owns what every round touches: the outer weights and momentum, the
// anomaly detectors, the round counters and stall streaks, and the overlapped round's
// state (algorithm.overlapSteps). The math of one unit's round is sync/outer_sync.h.
#pragma once

#include <torch/torch.h>

#include <atomic>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "modes.h"
#include "worker_config.h"

#include "dist/flat_units.h"
#include "sync/outer_sync.h"
#include "sync/penalty.h"
#include "train/checkpoint.h"
#include "train/debug_faults.h"
#include "train/run_state.h"

namespace edit {

// The outer step of a unit was skipped algorithm.penalty.maxSkippedRounds sync rounds in a
// row (every replica anomalous each time): the model no longer learns. Every rank sees the
// same verdicts, so all of them throw at the same round.
struct TrainingStalled : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// What one step's round (if any) saw.
struct RoundOutcome {
  bool synced = false;
  double syncWork = 0;  // seconds of sync work on the communication stream
  double pseudoGradNormSq = 0;
  uint64_t anomalies = 0;
  std::vector<bool> skipped;  // per unit: every replica anomalous, outer step skipped
  std::vector<double> norms;  // per unit: this replica's pseudo-gradient norm (penalty on)
  // The penalty over the units of the round: this replica's weight (uniform: 1/M) and the
  // averaged pseudo-gradient's clip factor (1: not clipped).
  int unitsDone = 0, unitsClipped = 0;
  double weightMin = 1, weightMax = 0, clipMin = 1;
};

// What the penalty did so far (docs/algorithm.md, "The penalty at scale"). Weights near 1
// for one replica and 0 for the others, or a clip that binds at every round, mean the
// penalty's scale does not fit the model's norms.
struct PenaltyStats {
  uint64_t unitRounds = 0;    // units x rounds with the penalty on
  uint64_t unitsClipped = 0;  // of which the averaged pseudo-gradient was clipped
  double weightMin = 1, weightMax = 0, clipMin = 1;  // over the run
  double lastWeightMin = 0, lastWeightMax = 0, lastClipMin = 1;  // the last round's
};

// How far the round in progress got, for an in-place recovery's offer (recovery_plan.h).
struct RoundPosition {
  int64_t cur = -1, curStep = -1;  // the outer state after round `cur`, set at step curStep
  int64_t next = -1, nextStep = -1, unitsDone = -1;  // a round stopped part way: units applied
};

class SyncSchedule {
 public:
  using Log = std::function<void(const std::string&)>;
  // The clock of cfg.algorithm.mode's row. `units` (the engine's) and `progress` (the
  // trainer's) outlive the schedule.
  static std::unique_ptr<SyncSchedule> make(const Config& cfg, Groups& groups, std::vector<FlatUnit>& units,
                                            const Progress& progress, const FaultInjector* faults, Log log);
  SyncSchedule(const Config& cfg, Groups& groups, std::vector<FlatUnit>& units, const Progress& progress,
               const FaultInjector* faults, Log log);
  virtual ~SyncSchedule() = default;

  // ---- the clock ------------------------------------------------------------------
  // A sync round at step t (it may exchange with the replica's shards or the job's store;
  // every rank of a replica decides alike).
  virtual bool due(int64_t t) = 0;
  // The inner learning rate of step t.
  virtual double lr(int64_t t) const;
  // Whether the loop ends once step t reaches training.steps (A-EDiT's local phase ends on
  // the round that spends its budget instead: budgetSpent).
  virtual bool endsAtStepCount(int64_t t) const { (void)t; return true; }
  // At a control exchange: the id a checkpoint of step t gets, whether a periodic one is
  // due, and whether the job's step budget is spent (`replicaSteps`: steps summed over the
  // replicas).
  virtual int64_t checkpointId(int64_t t, int64_t replicaSteps) const { (void)replicaSteps; return t; }
  virtual bool periodicCheckpointDue(int64_t t, int64_t id, int64_t lastId) const;
  virtual bool budgetSpent(bool sync, int64_t replicaSteps) const { (void)sync; (void)replicaSteps; return false; }
  // Whether a step without a control exchange may checkpoint (its id needs no agreement).
  virtual bool checkpointsBetweenControlPoints() const { return true; }
  // The final checkpoint's id after `step` steps.
  virtual int64_t finalCheckpointId(int64_t step, int64_t controlId, int64_t lastId) const;
  // The job's progress in steps per replica at step t, the same on every rank at a round
  // (--scale-at points are in these units).
  virtual int64_t scaleProgress(int64_t t) const { return t; }
  virtual bool validatesPeriodically() const { return true; }
  // A-EDiT: shard 0 of each replica posts its arrivals on the job's store; the
  // rendezvous keeps its connection open for them (needed before a schedule exists).
  static bool postsArrivals(const AlgorithmConfig& a, int shard) {
    return modeTraits(a.mode).clock == SyncClock::Seconds && shard == 0;
  }
  // After a local step (no round, not synchronous) of `seconds`.
  virtual void localStepTimed(double seconds) { (void)seconds; }
  int64_t stepsAwaitingRound() const { return stepsAwaitingRound_; }

  // ---- the mode --------------------------------------------------------------------
  bool hasRounds() const { return mode_.clock != SyncClock::EveryStep; }
  bool layerwise() const { return mode_.layerwise; }
  bool stepClocked() const { return mode_.clock == SyncClock::Steps; }
  bool synchronousAt(int64_t t) const { return !hasRounds() || t < cfg_.algorithm.warmupSteps; }
  bool overlapped() const { return overlap_; }
  const SyncSettings& settings() const { return sync_; }
  // The gradient average of a synchronous step: compressed in a local mode's warm-up
  // under algorithm.syncCompression.
  bool compressesWarmup() const { return hasRounds() && sync_.codec.on(); }
  const char* phase(int64_t t, bool synced) const;
  // The resolved schedule, outer step and penalty in one line for the log, and a warning
  // when the anomaly test can never arm in a run of `totalSteps` (empty: none).
  std::string describe(int64_t totalSteps) const;
  std::string anomalyWarmupWarning(int64_t totalSteps) const;
  // Sync rounds a step-clocked run of `totalSteps` makes, its final round included (-1:
  // not known in advance: the wall-time clock).
  int64_t expectedRounds(int64_t totalSteps) const;

  // ---- rounds ----------------------------------------------------------------------
  // The outer state from the current local weights, at the first local step.
  void initOuter();
  bool outerReady() const { return outerReady_; }
  void beginRound(int64_t t);
  // A layer-wise round: unit u's work, on the communication thread before its all-gather
  // (StepEngine::forward); then finishLayerwise() once the step's reductions are done.
  void startLayerwise();
  void syncUnitBeforeGather(size_t u);
  void finishLayerwise(RoundOutcome& out);
  // After step t (step_ already advanced): a round's bookkeeping and the interval.
  void afterStep(int64_t t, const RoundOutcome& out);
  // A-EDiT's last round, when the budget is spent at step t: a sync with no local step after.
  void lastRound(int64_t t);
  // Local modes end on synchronized weights: a last whole-model round if local steps were
  // made since the previous one (A-EDiT's loop already ended on one).
  virtual void finalRound();
  // The step's whole-model round (modes that do not sync layer by layer).
  void wholeModelRound(RoundOutcome& out) { syncWholeModel(out, overlap_); }
  // Applies every overlapped round in flight now (checkpoints, the last round).
  void drainOverlap();
  void failIfStalled() const;  // throws TrainingStalled
  // Where unit u's current round started: the reference of its pseudo-gradient.
  torch::Tensor roundStartPoint(size_t u) const;
  // The job's replica-steps, agreed at a control exchange at step t; agreeJobSteps()
  // counts them over the world from every rank's `step` (after a resume at another size
  // or a recovery).
  void setJobSteps(int64_t replicaSteps, int64_t t) { jobSteps_ = replicaSteps, jobStepsAt_ = t; }
  void agreeJobSteps(int64_t step);
  // Every rank left the round's world exchange: the next A-EDiT window is timed from here.
  void markRoundStart() { roundStartTime_ = nowSeconds(); }
  int64_t roundBeginStep() const { return roundBeginStep_; }
  int64_t stepsSinceSync() const { return stepsSinceSync_; }
  bool skipsRoundAt(int64_t t) const { return t == skipSyncAt_; }

  // ---- counters (reports, the summary) ----------------------------------------------
  uint64_t syncRounds() const { return syncRounds_; }
  uint64_t anomalies() const { return anomalies_; }
  uint64_t outerSkips() const { return outerSkips_; }
  int64_t maxSkipStreak() const;
  double lastPseudoGradNorm() const { return lastPseudoGradNorm_; }
  const PenaltyStats& penaltyStats() const { return penaltyStats_; }

  // ---- state for checkpoints and membership -----------------------------------------
  // meta/* and unit<u>/{outer,momentum,residual,averageResidual,ewma,skipStreak}.
  void save(NamedTensors& t) const;
  // `newReplica`: a replica the checkpoint did not have (it counts its own anomalies and
  // starts its error feedback at zero); `sameReplicas`: the checkpoint's M is this run's.
  void load(const NamedTensors& t, bool newReplica, bool sameReplicas, const std::string& dir);
  RoundPosition position() const;
  std::vector<OuterUnit>& outer() { return outer_; }
  const std::vector<OuterUnit>& outer() const { return outer_; }
  std::vector<EwmaDetector>& detectors() { return detectors_; }
  const std::vector<EwmaDetector>& detectors() const { return detectors_; }
  // The stall check's streaks, the largest over the world (a replacement has none; only
  // the ranks whose sync step finished counted a round lost part way).
  void agreeSkipStreaks();
  // Continue from round `round`, set at `step`: inner := outer (the engine's slices), the
  // error feedback from zero, the interval's clock restarted.
  void continueFromRound(int64_t round, int64_t step);
  // After a scale: the compressed sync's owned part depends on M.
  void resizeOwnedParts();
  // Every rank of the sync group holds bit-identical outer weights (after a state copy).
  void checkSyncGroupAgrees() const;

 protected:
  Comm& comm() const { return *groups_.comm; }
  // The length of the part of a unit's slice (n elements) this rank owns in the
  // compressed sync: the size of its OuterUnit::averageResidual.
  int64_t ownedPart(int64_t n) const;
  void noteRound(const std::vector<UnitSyncResult>& res, RoundOutcome& out);
  void recordRound(const RoundOutcome& out);  // a round's counters and skip streaks
  void afterRound(const RoundOutcome& out);   // skip streaks and their log lines
  // algorithm.overlapSteps (train/overlap.cpp): unit u's round applies the round in flight,
  // rebases the local weights on the new outer ones and starts this round's exchange.
  UnitSyncResult overlapRound(size_t u);
  // Unit u's round: overlapped (its exchange left in flight) or done now.
  UnitSyncResult syncOne(size_t u, bool overlapped);
  // DiLoCo / post-local SGD / the end of training: every unit at the step boundary.
  void syncWholeModel(RoundOutcome& out, bool overlapped);
  void endRound(int64_t t);

  const Config& cfg_;
  const ModeTraits& mode_;
  Groups& groups_;
  std::vector<FlatUnit>& units_;
  const Progress& progress_;
  const FaultInjector* faults_;
  Log log_;
  SyncSettings sync_;

  std::vector<OuterUnit> outer_;
  std::vector<EwmaDetector> detectors_;
  bool outerReady_ = false;
  uint64_t syncRounds_ = 0, anomalies_ = 0, outerSkips_ = 0;
  double lastPseudoGradNorm_ = 0;
  std::vector<int64_t> skipStreak_;  // per unit: rounds in a row its outer step was skipped
  PenaltyStats penaltyStats_;

  int64_t stepsSinceSync_ = 0;
  // A-EDiT's window is timed from lastSyncTime_: when every rank left the last round's
  // world exchange (roundStartTime_, noted at each round), the same on every replica.
  double lastSyncTime_ = 0, roundStartTime_ = 0;
  int64_t skipSyncAt_ = -1;  // the round at this step was already done before a rollback
  bool inRound_ = false;     // a sync round is mutating outer_ right now
  std::atomic<size_t> roundUnitsSynced_{0};  // units whose outer update of this round is done
  int64_t roundBeginStep_ = 0;  // step of the round in progress
  int64_t roundStep_ = 0;       // step at which outer_ (after syncRounds_ rounds) was set
  // Replica-steps of the whole job agreed at the last control exchange, and this rank's
  // step then: A-EDiT's learning rate follows the job's progress.
  int64_t jobSteps_ = 0, jobStepsAt_ = 0;
  int64_t stepsAwaitingRound_ = 0;

  // A layer-wise round in progress: each unit's result and sync time.
  std::vector<UnitSyncResult> layerwiseRes_;
  std::vector<double> layerwiseWork_;

  // algorithm.overlapSteps. Per unit, while its round is in flight: base_ is the local
  // slice the current round started from (the local progress since is base_ - slice) and
  // pending_ the pseudo-gradient being exchanged (its average on return). The rounds run
  // on the groups' roundStream over roundComm.
  bool overlap_ = false;
  std::vector<torch::Tensor> base_, pending_;
  std::vector<Pending> inflight_;
  std::vector<UnitSyncResult> inflightResult_;
};

}  // namespace edit
