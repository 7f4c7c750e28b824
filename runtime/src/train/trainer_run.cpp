// The run's phases (Trainer::run): start or resume, the step loop with its control point,
// checkpoints and the budget, the end of a step and of a round, the final sync,
// evaluation and the final save. The step itself is in trainer.cpp.
#include "train/trainer.h"

namespace edit {

// run() is four phases: start (or resume, or join), the step loop, the end of training
// (a last sync, evaluation, the final checkpoint), and the result.

TrainResult Trainer::run() {
  const double start = nowSeconds();
  TrainResult result;
  startOrResume(result);
  const uint64_t tokensAtStart = tokens_;
  const double loopStart = nowSeconds();
  result.startupSeconds = loopStart - start;

  const double lastLoss = stepLoop(result);
  // A replica that left at a scale-down has no process groups any more: the others end.
  const bool ends = !result.stopped && !result.leftAtScale;
  if (ends) finalSync();
  result.trainSeconds = nowSeconds() - loopStart;
  if (ends) evaluateAndSaveFinal(result);

  result.steps = step_;
  result.finalLoss = lastLoss;
  result.tokens = tokens_;
  result.tokensThisRun = tokens_ - tokensAtStart;
  result.seconds = nowSeconds() - start;
  result.syncRounds = syncRounds_;
  result.anomalies = anomalies_;
  result.outerSkips = outerSkips_;
  result.stepsAwaitingRound = stepsAwaitingRound_;
  result.comm = commCounters();
  result.memory = memoryPlan_;
  return result;
}

void Trainer::startOrResume(TrainResult& result) {
  setup();
  if (mesh_.join) {
    result.joined = true;
    joinRunningJob();
  } else if (!cfg_.checkpoint.dir.empty() && cfg_.checkpoint.resume && tryResume()) {
    result.resumedFrom = step_;
    roundStep_ = step_ - stepsSinceSync_;
  }
  if (isLocalMode() && step_ >= cfg_.algorithm.warmupSteps && !outerReady_) initOuter();
}

double Trainer::stepLoop(TrainResult& result) {
  const bool aedit = mode_.clock == SyncClock::Seconds;
  double lastLoss = 0;
  for (;;) {
    try {
      const int64_t t = step_;
      // Step-clocked modes end at training.steps; A-EDiT ends on the round that spends its
      // replica-step budget (endOnBudget), or at the step count while still synchronous.
      if (t >= totalSteps_ && (!aedit || synchronousAt(t))) break;
      const double t0 = nowSeconds();
      const double wait0 = commWaitSeconds();
      if (isLocalMode() && t == cfg_.algorithm.warmupSteps && !outerReady_) initOuter();
      const bool sync = syncDue(t);
      const Boundary b = (sync || synchronousAt(t)) ? controlPoint(t, sync) : checkpointIfDue(t);
      // Every rank leaves the round's world exchange together: the next A-EDiT window is
      // timed from here on every replica. Timed from each replica's own end of the sync
      // step instead, a straggler's window starts its extra step time late, it arrives
      // that late at every round, and the others wait for it.
      if (sync) roundStartTime_ = nowSeconds();
      if (b == Boundary::Stop) {
        result.stopped = true;
        break;
      }
      // The round in flight lands overlapSteps after its sync step (or at the next round).
      if (overlap_ && !sync && t - roundBeginStep_ >= cfg_.algorithm.overlapSteps) drainOverlap();
      if (sync) beginRound(t);
      if (b == Boundary::BudgetSpent) {
        endOnBudget(t);
        break;
      }
      killIfAsked(t);
      if (sync) corruptIfAsked();

      StepOutcome out;
      lastLoss = trainStep(t, sync, out);
      // A straggler's extra time comes after its compute, like a slow backward or optimizer,
      // so it delays the step but not a synchronization its replica already entered.
      injectDelay(t);
      finishStep(t, t0, sync, out);
      if (cfg_.data.valEvery > 0 && step_ % cfg_.data.valEvery == 0 && !aedit)
        log("step " + std::to_string(step_) + " replica " + std::to_string(comm_->replica()) +
            " val_loss " + std::to_string(evaluate(cfg_.data.valBatches, Group::Shard)));
      if (hooks_.onStep) hooks_.onStep(stepReport(t, t0, wait0, lastLoss, out));
      failIfStalled();  // after the report, so that the metrics show the streak
      if (out.synced && (pendingReplicas_ > 0 || scaleDue(t))) {
        // An asked scale first; a --scale-at point due at the same round waits for the next.
        const int to = pendingReplicas_ > 0 ? pendingReplicas_ : mesh_.scaleAt[nextScale_++].replicas;
        pendingReplicas_ = 0;
        if (scale(t, to, result)) break;  // this replica left
      }
    } catch (const PeerLost& e) {
      // A peer died or hung: in a local phase the survivors wait for its replacement and
      // continue from the last sync round; otherwise edit-train exits 75 (gang restart).
      if (!recoverInPlace(e, result)) throw;
    }
  }
  return lastLoss;
}

Trainer::Boundary Trainer::controlPoint(int64_t t, bool sync) {
  const bool aedit = mode_.clock == SyncClock::Seconds;
  const Control c = exchangeControl(t);
  jobSteps_ = c.replicaSteps;
  jobStepsAt_ = t;
  // A-EDiT's checkpoints are numbered by the job's progress, since its replicas' step
  // counts differ.
  const int64_t id = aedit && !synchronousAt(t) ? c.replicaSteps / comm_->replicas() : t;
  controlId_ = id;
  if (c.stop) {
    log("stop requested: saving a checkpoint at step " + std::to_string(t));
    if (!cfg_.checkpoint.dir.empty()) saveCheckpoint(id);
    return Boundary::Stop;
  }
  const int64_t every = cfg_.checkpoint.everySteps;
  const bool periodic = every > 0 && t > 0 &&
                        (aedit ? id / every > lastCheckpointId_ / every : t % every == 0);
  if (!cfg_.checkpoint.dir.empty() && (c.checkpoint || periodic) && id != lastCheckpointId_)
    saveCheckpoint(id);
  const int64_t budget = totalSteps_ * comm_->replicas();  // A-EDiT: replica-steps of the job
  return aedit && sync && c.replicaSteps >= budget ? Boundary::BudgetSpent : Boundary::Train;
}

Trainer::Boundary Trainer::checkpointIfDue(int64_t t) {
  // Between control points only step-clocked modes checkpoint (A-EDiT's ids need the
  // agreed progress).
  const int64_t every = cfg_.checkpoint.everySteps;
  if (!cfg_.checkpoint.dir.empty() && mode_.clock != SyncClock::Seconds && every > 0 && t > 0 &&
      t % every == 0 && t != lastCheckpointId_)
    saveCheckpoint(t);
  return Boundary::Train;
}

void Trainer::endOnBudget(int64_t t) {
  // A-EDiT's budget is spent: end on this synchronization, with no local step after it.
  drainOverlap();
  StepOutcome out;
  syncWholeModel(out);
  endRound(t);
  recordRound(out);
  stepsSinceSync_ = 0;
  failIfStalled();
}

void Trainer::finishStep(int64_t t, double t0, bool sync, const StepOutcome& out) {
  if (!sync && !synchronousAt(t)) {
    const double d = nowSeconds() - t0;
    localStepSeconds_ = localStepSeconds_ > 0 ? 0.7 * localStepSeconds_ + 0.3 * d : d;
  }
  step_ = t + 1;
  tokens_ += static_cast<uint64_t>(cfg_.data.batchSize * cfg_.data.seqLen);
  if (out.synced) {
    endRound(t);
    lastSyncTime_ = roundStartTime_;
    recordRound(out);
    stepsSinceSync_ = 0;
  }
  if (isLocalMode() && !synchronousAt(t)) ++stepsSinceSync_;
}

void Trainer::recordRound(const StepOutcome& out) {
  ++syncRounds_;
  anomalies_ += out.anomalies;
  lastPseudoGradNorm_ = std::sqrt(out.pseudoGradNormSq);
  afterRound(out);
}

double Trainer::commWaitSeconds() const {
  double w = 0;
  for (auto& [k, c] : commCounters()) w += c.waitSeconds;
  return w;
}

StepReport Trainer::stepReport(int64_t t, double t0, double wait0, double loss, const StepOutcome& out) {
  StepReport r;
  r.rank = mesh_.rank;
  r.replica = comm_->replica();
  r.shard = comm_->shard();
  r.worldSize = mesh_.world;
  r.replicas = comm_->replicas();
  r.step = step_;
  r.totalSteps = totalSteps_;
  r.loss = loss;
  r.tokens = tokens_;
  r.stepSeconds = nowSeconds() - t0;
  r.comm = commCounters();
  for (auto& [k, c] : r.comm) r.commWaitSeconds += c.waitSeconds;
  r.computeSeconds = std::max(0.0, r.stepSeconds - (r.commWaitSeconds - wait0));
  r.synced = out.synced;
  r.lastSyncDurationSeconds = out.syncWork;
  r.syncRounds = syncRounds_;
  r.anomalies = anomalies_;
  r.outerSkips = outerSkips_;
  for (auto k : skipStreak_) r.skipStreak = std::max(r.skipStreak, k);
  r.pseudoGradNorm = lastPseudoGradNorm_;
  r.lr = lrAt(t);
  r.phase = !isLocalMode() ? "sync" : synchronousAt(t) ? "warmup" : (out.synced ? "sync" : "local");
  // The link advice's R is what the rounds cost across replicas (the sync and world
  // groups); a replica's own ZeRO-3 gathers and reductions (the shard group) come every
  // step whatever tau is, so they count as the step's cost c, not as R.
  double crossReplicaWait = 0;
  for (const auto& [k, c] : r.comm)
    if (k.second != groupName(Group::Shard)) crossReplicaWait += c.waitSeconds;
  const double stepCrossWait = std::max(0.0, crossReplicaWait - crossReplicaWaitSeen_);
  crossReplicaWaitSeen_ = crossReplicaWait;
  if (isLocalMode() && r.phase != "warmup") {
    ++local_.localSteps;
    local_.computeSeconds += std::max(0.0, r.stepSeconds - stepCrossWait);
    local_.blockedSeconds += stepCrossWait;
    local_.rounds += r.synced;
  }
  r.local = local_;
  return r;
}

void Trainer::finalSync() {
  // Local modes end on synchronized weights: a last whole-model sync if local steps
  // were made since the previous one (A-EDiT's loop already ended on a sync).
  if (!isLocalMode() || !outerReady_ || mode_.clock == SyncClock::Seconds) return;
  drainOverlap();
  if (stepsSinceSync_ == 0) return;
  StepOutcome out;
  syncWholeModel(out);
  recordRound(out);
  stepsSinceSync_ = 0;  // the final checkpoint ends on this round: a resume starts a new interval
  failIfStalled();
}

void Trainer::evaluateAndSaveFinal(TrainResult& result) {
  result.valLoss = evaluate(cfg_.data.valBatches, Group::World);
  if (cfg_.checkpoint.dir.empty()) return;
  const int64_t id = mode_.clock == SyncClock::Seconds ? std::max(controlId_, lastCheckpointId_ + 1) : step_;
  if (id != lastCheckpointId_) saveCheckpoint(id);
}

}  // namespace edit
