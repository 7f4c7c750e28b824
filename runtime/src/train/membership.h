// Who is in the job, and how the world re-forms when that changes: the rendezvous
// generations, in-place recovery from a lost peer (docs/replica-recovery.md), a
// replacement's or a new replica's join, and elastic scaling (docs/elastic.md). torchft's
// Manager in this runtime's shape: the step engine and the sync schedule know nothing of
// it; it asks them for their state through a few calls (the round's position, the outer
// state and moments to copy, the round to continue from).
//
// Every decision here is taken alike on every rank, from values the world exchanged: the
// control exchange (stop, checkpoint, scale, SIGTERM), and the offer table of a recovery
// whose plan is the pure recovery_plan.h.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <stdexcept>
#include <string>

#include "worker_config.h"

#include "dist/comm.h"
#include "dist/rendezvous.h"
#include "train/debug_faults.h"
#include "train/run_state.h"

namespace edit {

class StepEngine;
class SyncSchedule;
struct RecoveryPlan;

// The survivors' exchanged state rules an in-place recovery out (every rank decides alike):
// nothing to retry, edit-train exits 75.
struct RecoveryImpossible : PeerLost {
  using PeerLost::PeerLost;
};

// Thrown out of Trainer::run() on the ranks that leave alone (kExitLeft).
struct LeftAlone : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// What the world agreed at a control exchange.
struct Control {
  bool stop = false, checkpoint = false;
  int64_t replicaSteps = 0;  // steps summed over replicas
};

// What membership changes cost this process (the run's summary).
struct MembershipStats {
  int recoveries = 0;           // in-place recoveries this process took part in
  double recoverySeconds = 0;   // from noticing the lost peer to training again
  int64_t stepsRolledBack = 0;  // local steps of this rank undone by recoveries and scales
  int scales = 0;               // changes of the number of replicas this rank went through
  double scaleSeconds = 0;      // from the round before a scale to training again
  bool leftAtScale = false;     // this replica left the job at a scale-down
  int scalesAbandoned = 0;      // scale-ups whose new replica never arrived (the job kept M)
};

class Membership {
 public:
  using Log = std::function<void(const std::string&)>;
  // scaleTarget: the replicas the operator asks for now (0: nothing), read from another
  // thread while a scale-up waits for its new replicas; another value calls it off.
  Membership(const Config& cfg, MeshSpec& mesh, Groups& groups, ControlRequests& requests, Progress& progress,
             FaultInjector* faults, Log log, std::function<int()> scaleTarget);

  // The first generation's groups: a replacement meets the survivors in the next recovery
  // generation, everyone else forms generation 0.
  void formFirstGeneration();
  // The state a recovery or a scale restores, once it exists.
  void attach(StepEngine& engine, SyncSchedule& schedule) { engine_ = &engine, schedule_ = &schedule; }

  // One tiny world all-gather at points every rank reaches in the same order: each step
  // of a synchronous phase, or each sync round of a local phase. Throws LeftAlone on the
  // ranks that SIGTERM reached when the others can recover around their replacements.
  Control exchangeControl(int64_t t);
  // A replacement (EDIT_JOIN) copies its state from the running job.
  void joinRunningJob();
  // A peer died or hung. In a local phase the survivors wait for its replacement and
  // continue from the last sync round (true); otherwise false: edit-train exits 75.
  bool recoverInPlace(const PeerLost& e);
  // After a step with a sync round: a scale asked, else a --scale-at point due. True on
  // the ranks of a replica that leaves.
  bool scaleIfDue(int64_t t);

  const MembershipStats& stats() const { return stats_; }
  int64_t generation() const { return rendezvous_ ? rendezvous_->generation() : 0; }

 private:
  bool recoversInPlace() const;         // runtime.recovery inPlace, a local mode, Gloo
  const char* whyNotScalable() const;   // nullptr: this run can change its replicas
  void formGeneration();                // groups for the generation just joined
  void leaveGeneration();               // drops the groups of a broken generation
  void takeGenerationSize();            // a replacement: the replicas of the generation it joined
  bool scale(int64_t t, int replicas);

  // restoreFromPeers (membership_restore.cpp): every rank states how far it got
  // (offerTable), the pure planner picks the round, how far into it each shard gets and
  // the sources (recovery_plan.h), the sync groups copy the outer state and the replicas
  // their anomaly statistics, and everyone continues from the round's clock.
  void restoreFromPeers(bool joiner);
  torch::Tensor offerTable(bool joiner);
  void copyOuterState(const RecoveryPlan& plan, bool joiner);
  void copyAnomalyStats(const std::vector<bool>& survivor, const RecoveryPlan& plan);
  void continueFromRound(int64_t round, int64_t step, int64_t lastCkpt);

  const Config& cfg_;
  MeshSpec& mesh_;
  Groups& groups_;
  ControlRequests& requests_;
  Progress& progress_;
  FaultInjector* faults_;
  Log log_;
  std::function<int()> scaleTarget_;
  StepEngine* engine_ = nullptr;
  SyncSchedule* schedule_ = nullptr;
  const bool localPhases_, overlap_;
  std::unique_ptr<Rendezvous> rendezvous_;
  MembershipStats stats_;

  int partialTermExchanges_ = 0;  // consecutive control exchanges where some ranks, not all, had SIGTERM
  bool outerLost_ = false;        // a failed state copy left the outer state half written
  size_t nextScale_ = 0;          // the next point of mesh_.scaleAt (agreed in restoreFromPeers)
  int pendingReplicas_ = 0;       // a scale agreed at a control exchange, done after the round
  int ignoredReplicas_ = 0;       // the last scale an unscalable run ignored (logged once, not per resend)
  bool scaling_ = false;          // restoreFromPeers runs for a scale, not a lost peer
};

}  // namespace edit
