// The training loop of one worker: sharded forward/backward, the inner AdamW step, and
// the synchronization schedule of each mode (ddp, localsgd, diloco, edit, a-edit).
// The model (model/), parallelism (dist/) and the algorithm (sync/) live elsewhere; the
// trainer only decides what runs when.
#pragma once

#include <torch/torch.h>

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "exit_codes.h"
#include "modes.h"
#include "worker_config.h"

#include "data/data.h"
#include "dist/comm.h"
#include "dist/flat_units.h"
#include "dist/rendezvous.h"
#include "sync/optim.h"
#include "sync/outer_sync.h"
#include "sync/penalty.h"
#include "telemetry/report.h"

namespace edit {

struct RecoveryPlan;  // train/recovery_plan.h

// The outer step of a unit was skipped algorithm.penalty.maxSkippedRounds sync rounds in a
// row (every replica anomalous each time): the model no longer learns. Every rank sees the
// same verdicts, so all of them throw at the same round.
struct TrainingStalled : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The survivors' exchanged state rules an in-place recovery out (every rank decides alike):
// nothing to retry, edit-train exits 75.
struct RecoveryImpossible : PeerLost {
  using PeerLost::PeerLost;
};

// Thrown out of Trainer::run() on the ranks that leave alone (kExitLeft).
struct LeftAlone : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct TrainResult {
  int64_t steps = 0;         // steps done by this rank
  bool stopped = false;      // stopped early on request (checkpoint saved)
  double finalLoss = 0;      // training loss of the last step
  double valLoss = -1;       // world-mean validation loss at the end (-1: no val data)
  uint64_t tokens = 0;       // tokens of this rank (including those before a resume)
  uint64_t tokensThisRun = 0;  // tokens this process trained
  double seconds = 0;         // the whole run: start-up, training, final evaluation and checkpoint
  double trainSeconds = 0;    // the training loop and its final sync only (steady tokens/s)
  double startupSeconds = 0;  // from run() to the first step (groups, weights, data, resume)
  uint64_t syncRounds = 0, anomalies = 0;
  uint64_t outerSkips = 0;   // units whose outer step a round skipped (every replica anomalous)
  // A-EDiT: local steps this rank made after its replica arrived at a round, while a
  // slower replica had not yet (time it would otherwise have waited).
  int64_t stepsAwaitingRound = 0;
  int64_t resumedFrom = -1;  // checkpoint step resumed from (-1: fresh start)
  bool joined = false;       // started as a replacement (EDIT_JOIN=1)
  int recoveries = 0;        // in-place recoveries this process took part in
  double recoverySeconds = 0;     // time from noticing the lost peer to training again
  int64_t stepsRolledBack = 0;    // local steps of this rank undone by recoveries
  int scales = 0;                 // changes of the number of replicas this rank went through
  double scaleSeconds = 0;        // time from the round before a scale to training again
  bool leftAtScale = false;       // this replica left the job at a scale-down
  int scalesAbandoned = 0;        // scale-ups whose new replica never arrived (the job kept M)
  CommCounts comm;
  MemoryPlan memory;         // what the state and buffers of this rank should take
};

struct TrainerHooks {
  std::function<void(const StepReport&)> onStep;  // after every step (training thread)
  std::function<void(const std::string&)> log;    // human-readable log lines
  // The replicas the operator asks for now (0: nothing asked), read from another thread
  // while a scale-up waits for its new replicas: another value calls the scale off.
  std::function<int()> scaleTarget;
};

class Trainer {
 public:
  Trainer(Config cfg, MeshSpec mesh, TrainerHooks hooks = {});
  ~Trainer();
  TrainResult run();

  // Safe from other threads and signal handlers' helpers: acted on at the next point
  // where every rank can agree (every step in synchronous phases, else the next sync).
  void requestStop() { stopRequested_ = true; }
  void requestCheckpoint() { checkpointRequested_ = true; }

  // Inspection for tests.
  const std::vector<FlatUnit>& units() const { return units_; }
  const BufferCache& buffers() const { return *buffers_; }
  const std::vector<OuterUnit>& outer() const { return outer_; }
  const std::vector<EwmaDetector>& detectors() const { return detectors_; }
  const Comm& comm() const { return *comm_; }
  int64_t totalSteps() const { return totalSteps_; }

 private:
  struct Control {
    bool stop = false, checkpoint = false;
    int64_t replicaSteps = 0;  // steps summed over replicas
    int replicas = 0;          // a scale asked of rank 0 (gScaleTarget, gScaleRequest): to this many replicas
  };
  struct StepOutcome {  // what one step saw
    double loss = 0;
    bool synced = false;
    double syncWork = 0;  // seconds of sync work on the communication stream
    double pseudoGradNormSq = 0;
    uint64_t anomalies = 0;
    std::vector<bool> skipped;  // per unit: every replica anomalous, outer step skipped
    std::vector<double> norms;  // per unit: this replica's pseudo-gradient norm (penalty on)
  };

  // The phases of run().
  enum class Boundary { Train, Stop, BudgetSpent };  // what a step's control point decided
  void startOrResume(TrainResult& result);
  double stepLoop(TrainResult& result);  // returns the last step's training loss
  Boundary controlPoint(int64_t t, bool sync);  // control exchange: stop, checkpoints, budget
  Boundary checkpointIfDue(int64_t t);          // a step without a control point
  void endOnBudget(int64_t t);                  // A-EDiT's last round
  void finishStep(int64_t t, double t0, bool sync, const StepOutcome& out);
  void recordRound(const StepOutcome& out);     // a round's counters, skip streaks
  // Also adds the step to local_ (so: once per step).
  StepReport stepReport(int64_t t, double t0, double wait0, double loss, const StepOutcome& out);
  double commWaitSeconds() const;
  void finalSync();
  void evaluateAndSaveFinal(TrainResult& result);

  void setup();
  void selectDevice();
  bool isLocalMode() const;
  bool synchronousAt(int64_t t) const;  // gradients averaged across replicas at step t
  bool syncDue(int64_t t);
  // A-EDiT: this rank posts and reads its replica's arrivals on the job's store (syncDue).
  bool postsArrivals() const { return mode_.clock == SyncClock::Seconds && mesh_.rank % mesh_.shards == 0; }
  Control exchangeControl(int64_t t);
  void initOuter();
  // The length of the part of a unit's slice (n elements) this rank owns in the compressed
  // sync: the size of its OuterUnit::averageResidual.
  int64_t ownedPart(int64_t n) const {
    return ownedPartLength(n, sync_.block, mesh_.replicas, mesh_.rank / mesh_.shards);
  }
  double trainStep(int64_t t, bool sync, StepOutcome& out);
  // overlapped: this round's exchange is left in flight (overlapRound), otherwise done now.
  void syncWholeModel(StepOutcome& out, bool overlapped = false);
  // ZeRO-3 (flat_units.h): enqueue unit u's all-gather (after its layer-wise sync when
  // syncFirst) on the communication stream; release its gathered parameters.
  Pending prepareUnit(size_t u, bool syncFirst, std::vector<UnitSyncResult>* res,
                      std::vector<double>* syncWork);
  void releaseUnit(size_t u);
  void releaseAll();  // after a failed step: no gathered unit, no gradient buffer bound
  double evaluate(int64_t batches, Group reduceOver);
  void injectDelay(int64_t t);
  void corruptIfAsked();
  void saveCheckpoint(int64_t id);
  bool tryResume();
  void log(const std::string& s);
  void killIfAsked(int64_t t, int unit = -1);  // debug.killAtStep (unit >= 0: before its sync)

  // algorithm.overlapSteps (trainer_overlap.cpp, docs/algorithm.md "Overlapped
  // synchronization"): unit u's round at a sync step applies the round in flight, rebases
  // the local weights on the new outer ones and starts this round's exchange; returns the
  // applied round's result (default: nothing was in flight). drainOverlap applies every
  // round in flight now (checkpoints, the last sync).
  UnitSyncResult overlapRound(size_t u);
  void drainOverlap();
  CommCounts commCounters() const;  // both communicators' counters, and earlier generations'
  CommCounts commCarried_;          // counters of comm_'s process groups already torn down

  // Sync-round bookkeeping (trainer_rounds.cpp).
  void noteRound(const std::vector<UnitSyncResult>& res, StepOutcome& out);
  void afterRound(const StepOutcome& out);  // skip streaks and counters
  void failIfStalled() const;               // throws TrainingStalled
  double lrAt(int64_t t) const;             // inner learning rate of step t
  void agreeJobSteps();                     // jobSteps_ from every rank's step_ (world)

  // In-place recovery (trainer_recovery.cpp, docs/replica-recovery.md). The survivors
  // roll forward: a unit's outer update that any rank of a sync group holds is copied to
  // the others, so no rank keeps a copy of the outer state from before the round.
  void beginRound(int64_t t);
  void endRound(int64_t t);
  bool recoverInPlace(const PeerLost& e, TrainResult& result);
  void restoreFromPeers(bool joiner, TrainResult* result);
  // Its phases (trainer_recovery.cpp).
  torch::Tensor offerTable(bool joiner);  // world x columns: what each rank can offer
  void copyOuterState(const RecoveryPlan& plan, bool joiner);  // over the sync group
  void copyAnomalyStats(const std::vector<bool>& survivor, const RecoveryPlan& plan);
  void agreeSkipStreaks();  // the stall check's streaks, alike on every rank (world)
  void takeGenerationSize();  // a replacement: the replicas of the generation it joined
  void continueFromRound(int64_t round, int64_t step, int64_t lastCkpt);
  void checkSyncGroupAgrees();
  // Elastic replicas (docs/elastic.md): after a sync round at or past the next point of
  // mesh_.scaleAt, the world re-forms with the new number of replicas like an in-place
  // recovery. Returns true on the ranks of a replica that leaves.
  bool scaleDue(int64_t t) const;
  bool scale(int64_t t, int replicas, TrainResult& result);
  // Why this run cannot change its number of replicas (nullptr: it can).
  const char* whyNotScalable() const;
  void joinRunningJob();   // a replacement's restoreFromPeers, retried like a survivor's
  void leaveGeneration();  // drops the process groups of a broken generation

  Config cfg_;
  const ModeTraits& mode_;  // cfg_.algorithm.mode's row of the mode table
  MeshSpec mesh_;
  TrainerHooks hooks_;
  ModelShape shape_{};
  torch::Device device_{torch::kCPU};
  std::unique_ptr<Comm> comm_;
  std::unique_ptr<CommStream> stream_;
  std::vector<FlatUnit> units_;
  std::unique_ptr<BufferCache> buffers_;  // full-size buffers of gathered units and gradients
  int prefetchDepth_ = 1;                 // units prepared ahead of the one computing
  MemoryPlan memoryPlan_;
  bool reshardAfterForward_ = true;
  std::vector<OuterUnit> outer_;
  std::vector<EwmaDetector> detectors_;
  std::unique_ptr<ShardedAdamW> adam_;
  SyncSettings sync_;
  Rope rope_;
  std::optional<data::TokenFile> train_, val_;
  std::unique_ptr<data::BatchSampler> trainSampler_, valSampler_;
  std::vector<int64_t> inputs_, targets_;

  std::atomic<bool> stopRequested_{false}, checkpointRequested_{false};
  int64_t totalSteps_ = 0;
  int64_t step_ = 0;             // steps completed by this rank
  int64_t stepsSinceSync_ = 0;
  // A-EDiT's window is timed from lastSyncTime_: when every rank left the last round's
  // world exchange (roundStartTime_, noted at each round), the same on every replica.
  double lastSyncTime_ = 0, roundStartTime_ = 0;
  // The store key of the A-EDiT round this replica has posted its arrival for (syncDue);
  // it names the rendezvous generation, so a recovery starts every arrival afresh.
  std::string arrivedKey_;
  int64_t stepsAwaitingRound_ = 0;
  double localStepSeconds_ = 0;  // moving average of this rank's local step time (A-EDiT)
  uint64_t syncRounds_ = 0, anomalies_ = 0, tokens_ = 0;
  double lastPseudoGradNorm_ = 0;
  LinkMeasurement local_;  // the local phase's totals (StepReport::local)
  double crossReplicaWaitSeen_ = 0;  // sync and world groups' wait at the last report
  std::vector<int64_t> skipStreak_;  // per unit: rounds in a row its outer step was skipped
  uint64_t outerSkips_ = 0;
  // Replica-steps of the whole job agreed at the last control exchange, and this rank's
  // step then: A-EDiT's learning rate follows the job's progress (lrAt).
  int64_t jobSteps_ = 0, jobStepsAt_ = 0;
  int64_t lastCheckpointId_ = -1;
  int64_t controlId_ = 0;        // checkpoint id agreed at the last control exchange
  bool outerReady_ = false;

  std::unique_ptr<Rendezvous> rendezvous_;
  bool inRound_ = false;         // a sync round is mutating outer_ right now
  std::atomic<size_t> roundUnitsSynced_{0};  // units whose outer update of this round is done
  int64_t roundBeginStep_ = 0;   // step of the round in progress
  int64_t roundStep_ = 0;        // step at which outer_ (after syncRounds_ rounds) was set
  int64_t skipSyncAt_ = -1;      // the round at this step was already done before a rollback
  int partialTermExchanges_ = 0;  // consecutive control exchanges where some ranks, not all, had SIGTERM
  bool outerLost_ = false;        // a failed state copy left outer_ half written
  size_t nextScale_ = 0;          // the next point of mesh_.scaleAt (agreed in restoreFromPeers)
  int pendingReplicas_ = 0;       // a scale agreed at a control exchange, done after the round
  int ignoredReplicas_ = 0;       // the last scale an unscalable run ignored (logged once, not per resend)
  bool scaling_ = false;          // restoreFromPeers runs for a scale, not a lost peer

  // algorithm.overlapSteps. Per unit, while its round is in flight: base_ is the local
  // slice the current round started from (the local progress since is base_ - slice) and
  // pending_ the pseudo-gradient being exchanged (its average on return). The rounds run
  // on roundStream_ over roundComm_'s own process groups. Declared last: destroyed first.
  bool overlap_ = false;
  std::vector<torch::Tensor> base_, pending_;
  std::vector<Pending> inflight_;
  std::vector<UnitSyncResult> inflightResult_;
  std::unique_ptr<Comm> roundComm_;
  std::unique_ptr<CommStream> roundStream_;
};

// Set by edit-train's SIGTERM handler; every Trainer polls it.
extern std::atomic<bool> gTerminateRequested;
// Replicas to add (or remove, negative) at the next sync round: edit-train's SIGUSR1 (+1)
// and SIGUSR2 (-1), which edit-run forwards to rank 0. Read by rank 0 only (docs/elastic.md).
extern std::atomic<int> gScaleRequest;
// The number of replicas the operator asks for (telemetry Command SCALE); 0: none. An
// absolute target, so resending it is harmless: rank 0 takes it at its next control
// exchange and puts it to the world only if its world has another size. Wins over a
// gScaleRequest taken at the same exchange. Read by rank 0 only.
extern std::atomic<int> gScaleTarget;

}  // namespace edit
