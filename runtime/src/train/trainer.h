// One worker's training run: a loop that composes three parts.
//
//   StepEngine    (train/step_engine.h)    the ZeRO-3 step: forward, backward, inner AdamW
//   SyncSchedule  (train/sync_schedule.h)  when the replicas synchronize (one class per
//                                          clock) and what a round does to the outer state
//   Membership    (train/membership.h)     the rendezvous generations: recovery in place,
//                                          a replacement's join, elastic scaling
//
// plus checkpoints (trainer_checkpoint.cpp) and the faults a test asks for
// (train/debug_faults.h). The model (model/), the collectives (dist/) and the math of a
// round (sync/) live elsewhere; the trainer only decides what runs when.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "exit_codes.h"
#include "worker_config.h"

#include "dist/comm.h"
#include "dist/flat_units.h"
#include "telemetry/report.h"
#include "train/debug_faults.h"
#include "train/membership.h"
#include "train/run_state.h"
#include "train/step_engine.h"
#include "train/sync_schedule.h"

namespace edit {

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
  SyncSettings sync;         // the outer step and penalty as resolved for the mode
  PenaltyStats penalty;      // what the penalty did
};

struct TrainerHooks {
  std::function<void(const StepReport&)> onStep;  // after every step (training thread)
  std::function<void(const std::string&)> log;    // human-readable log lines
  // The replicas the operator asks for now (0: nothing asked), read from another thread
  // while a scale-up waits for its new replicas: another value calls the scale off.
  std::function<int()> scaleTarget;
  // Where signals and the operator's commands arrive (edit-train's, which its signal
  // handlers set); nullptr: the trainer's own (requests()).
  ControlRequests* requests = nullptr;
};

class Trainer {
 public:
  Trainer(Config cfg, MeshSpec mesh, TrainerHooks hooks = {});
  TrainResult run();

  // Safe from other threads: acted on at the next point where every rank can agree.
  ControlRequests& requests() { return *requests_; }
  void requestStop() { requests_->stop = true; }
  void requestCheckpoint() { requests_->checkpoint = true; }

  // Inspection for tests.
  const std::vector<FlatUnit>& units() const { return engine_->units(); }
  const BufferCache& buffers() const { return engine_->buffers(); }
  const std::vector<OuterUnit>& outer() const { return schedule_->outer(); }
  const std::vector<EwmaDetector>& detectors() const { return schedule_->detectors(); }
  const Comm& comm() const { return *groups_.comm; }
  int64_t totalSteps() const { return progress_.totalSteps; }

 private:
  enum class Boundary { Train, Stop, BudgetSpent };  // what a step's control point decided

  // run() is four phases: start (or resume, or join), the step loop, the end of training
  // (a last sync, evaluation, the final checkpoint), and the result.
  void setup();
  void startOrResume(TrainResult& result);
  double stepLoop(TrainResult& result);  // returns the last step's training loss
  double step(int64_t t, bool sync, RoundOutcome& out);  // one step, with its round if `sync`
  Boundary controlPoint(int64_t t, bool sync);  // control exchange: stop, checkpoints, budget
  Boundary checkpointIfDue(int64_t t);          // a step without a control point
  void finishStep(int64_t t, double t0, bool sync, const RoundOutcome& out);
  // Also adds the step to local_ (so: once per step).
  StepReport stepReport(int64_t t, double t0, double wait0, double loss, const RoundOutcome& out);
  double commWaitSeconds() const;
  void evaluateAndSaveFinal(TrainResult& result);
  void saveCheckpoint(int64_t id);
  bool tryResume();
  void resumeFrom(const NamedTensors& t, const std::string& dir, int oldReplicas, int source);
  void log(const std::string& s);
  std::function<void(const std::string&)> logger() {
    return [this](const std::string& s) { log(s); };
  }

  Config cfg_;
  MeshSpec mesh_;
  TrainerHooks hooks_;
  ControlRequests ownRequests_;
  ControlRequests* requests_;
  Progress progress_;
  LinkMeasurement local_;            // the local phase's totals (StepReport::local)
  double crossReplicaWaitSeen_ = 0;  // sync and world groups' wait at the last report
  std::unique_ptr<FaultInjector> faults_;
  std::unique_ptr<Membership> membership_;
  std::unique_ptr<StepEngine> engine_;
  std::unique_ptr<SyncSchedule> schedule_;
  Groups groups_;  // last: its threads stop before the state their tasks touch goes away
};

}  // namespace edit
