#include "train/trainer.h"

#include <algorithm>

#include "modes.h"

namespace edit {

Trainer::Trainer(Config cfg, MeshSpec mesh, TrainerHooks hooks)
    : cfg_(std::move(cfg)),
      mesh_(std::move(mesh)),
      hooks_(std::move(hooks)),
      requests_(hooks_.requests ? hooks_.requests : &ownRequests_) {}

void Trainer::log(const std::string& s) {
  if (hooks_.log) hooks_.log(s);
}

void Trainer::setup() {
  faults_ = FaultInjector::make(cfg_, mesh_, logger());
  const torch::Device device = selectDevice(cfg_.runtime, mesh_);
  membership_ = std::make_unique<Membership>(cfg_, mesh_, groups_, *requests_, progress_, faults_.get(), logger(),
                                             hooks_.scaleTarget);
  membership_->formFirstGeneration();
  const bool localPhases = hasLocalPhases(cfg_.algorithm.mode);
  engine_ = std::make_unique<StepEngine>(cfg_, mesh_, groups_, device, localPhases,
                                         localPhases && cfg_.algorithm.overlapSteps > 0, logger());
  schedule_ = SyncSchedule::make(cfg_, groups_, engine_->units(), progress_, faults_.get(), logger());
  membership_->attach(*engine_, *schedule_);
  progress_.totalSteps = cfg_.training.steps;
  if (cfg_.training.tokens > 0) {
    const int64_t perStep = static_cast<int64_t>(mesh_.world) * engine_->tokensPerStep();
    progress_.totalSteps = std::max<int64_t>(1, (cfg_.training.tokens + perStep - 1) / perStep);
  }
  if (mesh_.rank == 0) {
    const ModelShape& shape = engine_->shape();
    log("model: " + cfg_.model.preset + ", " + std::to_string(parameterCount(shape)) + " parameters (dim " +
        std::to_string(shape.dim) + ", " + std::to_string(shape.layers) + " layers), initial weights N(0, " +
        std::to_string(shape.initStd).substr(0, 6) + ")");
    log(schedule_->describe(progress_.totalSteps));
    if (const std::string w = schedule_->anomalyWarmupWarning(progress_.totalSteps); !w.empty()) log("warning: " + w);
  }
}

TrainResult Trainer::run() {
  const double start = nowSeconds();
  TrainResult result;
  startOrResume(result);
  const uint64_t tokensAtStart = progress_.tokens;
  const double loopStart = nowSeconds();
  result.startupSeconds = loopStart - start;

  const double lastLoss = stepLoop(result);
  const MembershipStats& m = membership_->stats();
  // A replica that left at a scale-down has no process groups any more: the others end.
  const bool ends = !result.stopped && !m.leftAtScale;
  if (ends) schedule_->finalRound();
  result.trainSeconds = nowSeconds() - loopStart;
  if (ends) evaluateAndSaveFinal(result);

  result.steps = progress_.step;
  result.finalLoss = lastLoss;
  result.tokens = progress_.tokens;
  result.tokensThisRun = progress_.tokens - tokensAtStart;
  result.seconds = nowSeconds() - start;
  result.syncRounds = schedule_->syncRounds();
  result.anomalies = schedule_->anomalies();
  result.outerSkips = schedule_->outerSkips();
  result.stepsAwaitingRound = schedule_->stepsAwaitingRound();
  result.recoveries = m.recoveries;
  result.recoverySeconds = m.recoverySeconds;
  result.stepsRolledBack = m.stepsRolledBack;
  result.scales = m.scales;
  result.scaleSeconds = m.scaleSeconds;
  result.leftAtScale = m.leftAtScale;
  result.scalesAbandoned = m.scalesAbandoned;
  result.comm = groups_.counters();
  result.memory = engine_->memoryPlan();
  result.sync = schedule_->settings();
  result.penalty = schedule_->penaltyStats();
  return result;
}

void Trainer::startOrResume(TrainResult& result) {
  setup();
  if (mesh_.join) {
    result.joined = true;
    membership_->joinRunningJob();
  } else if (!cfg_.checkpoint.dir.empty() && cfg_.checkpoint.resume && tryResume()) {
    result.resumedFrom = progress_.step;
  }
  if (schedule_->hasRounds() && progress_.step >= cfg_.algorithm.warmupSteps && !schedule_->outerReady())
    schedule_->initOuter();
}

double Trainer::stepLoop(TrainResult& result) {
  double lastLoss = 0;
  for (;;) {
    try {
      const int64_t t = progress_.step;
      if (t >= progress_.totalSteps && schedule_->endsAtStepCount(t)) break;
      const double t0 = nowSeconds(), wait0 = commWaitSeconds();
      if (schedule_->hasRounds() && t == cfg_.algorithm.warmupSteps && !schedule_->outerReady())
        schedule_->initOuter();
      const bool sync = schedule_->due(t);
      const Boundary b = (sync || schedule_->synchronousAt(t)) ? controlPoint(t, sync) : checkpointIfDue(t);
      // Every rank leaves the round's world exchange together: the next A-EDiT window is
      // timed from here on every replica. Timed from each replica's own end of the sync
      // step instead, a straggler's window starts its extra step time late, it arrives
      // that late at every round, and the others wait for it.
      if (sync) schedule_->markRoundStart();
      if (b == Boundary::Stop) {
        result.stopped = true;
        break;
      }
      // The round in flight lands overlapSteps after its sync step (or at the next round).
      if (schedule_->overlapped() && !sync && t - schedule_->roundBeginStep() >= cfg_.algorithm.overlapSteps)
        schedule_->drainOverlap();
      if (sync) schedule_->beginRound(t);
      if (b == Boundary::BudgetSpent) {
        schedule_->lastRound(t);
        break;
      }
      if (faults_) {
        faults_->killIfAsked(t);
        if (sync)
          faults_->corruptBeforeRound(static_cast<int64_t>(schedule_->syncRounds()) + 1, groups_.comm->replica(),
                                      engine_->units(), [this](size_t u) { return schedule_->roundStartPoint(u); });
      }
      RoundOutcome out;
      lastLoss = step(t, sync, out);
      if (faults_) faults_->delayAfterStep(t, mesh_.world);
      finishStep(t, t0, sync, out);
      if (cfg_.data.valEvery > 0 && progress_.step % cfg_.data.valEvery == 0 && schedule_->validatesPeriodically())
        log("step " + std::to_string(progress_.step) + " replica " + std::to_string(groups_.comm->replica()) +
            " val_loss " + std::to_string(engine_->evaluate(cfg_.data.valBatches, Group::Shard)));
      if (hooks_.onStep) hooks_.onStep(stepReport(t, t0, wait0, lastLoss, out));
      schedule_->failIfStalled();  // after the report, so that the metrics show the streak
      if (out.synced && membership_->scaleIfDue(t)) break;  // this replica left
    } catch (const PeerLost& e) {
      // A peer died or hung: in a local phase the survivors wait for its replacement and
      // continue from the last sync round; otherwise edit-train exits 75 (gang restart).
      if (!membership_->recoverInPlace(e)) throw;
    }
  }
  return lastLoss;
}

double Trainer::step(int64_t t, bool sync, RoundOutcome& out) {
  // A round syncs the whole model at the step boundary, or each unit just before its
  // all-gather in this step's forward (layer-wise: overlapped with the forward).
  const bool layerwise = sync && schedule_->layerwise();
  if (sync && !layerwise) schedule_->wholeModelRound(out);
  StepEngine::UnitTask beforeGather;
  if (layerwise) {
    schedule_->startLayerwise();
    beforeGather = [s = schedule_.get()](size_t u) { s->syncUnitBeforeGather(u); };
  }
  engine_->forward(t, beforeGather);
  ReplicaAverage average;
  average.on = schedule_->synchronousAt(t) && groups_.comm->replicas() > 1;
  if (average.on && schedule_->compressesWarmup()) {
    average.codec = &schedule_->settings().codec;
    average.block = schedule_->settings().block;
  }
  engine_->backward(average);
  if (layerwise) schedule_->finishLayerwise(out);
  engine_->innerStep(t, schedule_->lr(t));
  return engine_->loss();
}

Trainer::Boundary Trainer::controlPoint(int64_t t, bool sync) {
  const Control c = membership_->exchangeControl(t);
  schedule_->setJobSteps(c.replicaSteps, t);
  const int64_t id = schedule_->checkpointId(t, c.replicaSteps);
  progress_.controlId = id;
  const bool saves = !cfg_.checkpoint.dir.empty();
  if (c.stop) {
    log("stop requested: saving a checkpoint at step " + std::to_string(t));
    if (saves) saveCheckpoint(id);
    return Boundary::Stop;
  }
  const bool periodic = schedule_->periodicCheckpointDue(t, id, progress_.lastCheckpointId);
  if (saves && (c.checkpoint || periodic) && id != progress_.lastCheckpointId) saveCheckpoint(id);
  return schedule_->budgetSpent(sync, c.replicaSteps) ? Boundary::BudgetSpent : Boundary::Train;
}

Trainer::Boundary Trainer::checkpointIfDue(int64_t t) {
  const int64_t every = cfg_.checkpoint.everySteps;
  if (!cfg_.checkpoint.dir.empty() && schedule_->checkpointsBetweenControlPoints() && every > 0 && t > 0 &&
      t % every == 0 && t != progress_.lastCheckpointId)
    saveCheckpoint(t);
  return Boundary::Train;
}

void Trainer::finishStep(int64_t t, double t0, bool sync, const RoundOutcome& out) {
  if (!sync && !schedule_->synchronousAt(t)) schedule_->localStepTimed(nowSeconds() - t0);
  progress_.step = t + 1;
  progress_.tokens += static_cast<uint64_t>(engine_->tokensPerStep());
  schedule_->afterStep(t, out);
}

double Trainer::commWaitSeconds() const {
  double w = 0;
  for (auto& [k, c] : groups_.counters()) w += c.waitSeconds;
  return w;
}

StepReport Trainer::stepReport(int64_t t, double t0, double wait0, double loss, const RoundOutcome& out) {
  const Comm& comm = *groups_.comm;
  StepReport r;
  r.rank = mesh_.rank;
  r.replica = comm.replica();
  r.shard = comm.shard();
  r.worldSize = mesh_.world;
  r.replicas = comm.replicas();
  r.step = progress_.step;
  r.totalSteps = progress_.totalSteps;
  r.loss = loss;
  r.tokens = progress_.tokens;
  r.stepSeconds = nowSeconds() - t0;
  r.comm = groups_.counters();
  for (auto& [k, c] : r.comm) r.commWaitSeconds += c.waitSeconds;
  r.computeSeconds = std::max(0.0, r.stepSeconds - (r.commWaitSeconds - wait0));
  r.synced = out.synced;
  r.lastSyncDurationSeconds = out.syncWork;
  r.syncRounds = schedule_->syncRounds();
  r.anomalies = schedule_->anomalies();
  r.outerSkips = schedule_->outerSkips();
  r.skipStreak = schedule_->maxSkipStreak();
  r.pseudoGradNorm = schedule_->lastPseudoGradNorm();
  const PenaltyStats& p = schedule_->penaltyStats();
  r.replicaWeightMin = p.lastWeightMin;
  r.replicaWeightMax = p.lastWeightMax;
  r.clipFactorMin = p.lastClipMin;
  r.unitsClipped = p.unitsClipped;
  r.lr = schedule_->lr(t);
  r.phase = schedule_->phase(t, out.synced);
  // The link advice's R is what the rounds cost across replicas (the sync and world
  // groups); a replica's own ZeRO-3 gathers and reductions (the shard group) come every
  // step whatever tau is, so they count as the step's cost c, not as R.
  double crossReplicaWait = 0;
  for (const auto& [k, c] : r.comm)
    if (k.second != groupName(Group::Shard)) crossReplicaWait += c.waitSeconds;
  const double stepCrossWait = std::max(0.0, crossReplicaWait - crossReplicaWaitSeen_);
  crossReplicaWaitSeen_ = crossReplicaWait;
  if (schedule_->hasRounds() && r.phase != "warmup") {
    ++local_.localSteps;
    local_.computeSeconds += std::max(0.0, r.stepSeconds - stepCrossWait);
    local_.blockedSeconds += stepCrossWait;
    local_.rounds += r.synced;
  }
  r.local = local_;
  return r;
}

void Trainer::evaluateAndSaveFinal(TrainResult& result) {
  result.valLoss = engine_->evaluate(cfg_.data.valBatches, Group::World);
  if (cfg_.checkpoint.dir.empty()) return;
  const int64_t id = schedule_->finalCheckpointId(progress_.step, progress_.controlId, progress_.lastCheckpointId);
  if (id != progress_.lastCheckpointId) saveCheckpoint(id);
}

}  // namespace edit
