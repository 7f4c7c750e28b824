// In-place recovery from a lost peer (docs/replica-recovery.md).
//
// Every rank of a sync group holds the same outer slice (weights, momentum), so a lost
// rank's outer state survives on its sync-group peers; its anomaly statistics (per
// replica) survive on its shard peers. When a peer is lost in a local phase, the
// survivors tear down their process groups (which
// makes every other rank notice at its next collective), meet the replacement in a new
// recovery generation, and agree on a sync round: the newest any survivor applied any of.
// Units sync in order and a unit's update on one rank is its sync group's, so the ranks
// behind copy it from the furthest one (roll forward) and units nobody reached keep the
// previous round's state; then everyone continues from it: inner weights := outer
// weights, step := the step of that round. The replacement copies the outer state and its
// inner AdamW moments from one peer of its sync group, and the anomaly statistics from
// its own replica. No disk checkpoint is read, and no copy of the outer state is kept.
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <thread>
#include <unistd.h>

#include "train/recovery_plan.h"
#include "train/trainer.h"

namespace edit {
namespace {

// Test hook (tests/runtime/integration/test_recovery.py): EDIT_TEST_DROP_COPY_RANK=r makes
// rank r fail its first state copy as if a connection were lost, after which it leaves the
// generation like any rank whose peer went away.
bool dropThisCopy(int rank) {
  static bool dropped = false;
  const char* v = std::getenv("EDIT_TEST_DROP_COPY_RANK");
  if (dropped || !v || !*v || std::atoi(v) != rank) return false;
  dropped = true;
  return true;
}

}  // namespace

void Trainer::killIfAsked(int64_t t, int unit) {
  const auto& k = cfg_.debug.killAtStep;
  if (k.rank != mesh_.rank || k.step != t || k.unit != unit || mesh_.join) return;
  log("debug.killAtStep: killing this worker (SIGKILL) at step " + std::to_string(t) +
      (unit >= 0 ? " before unit " + std::to_string(unit) + "'s sync" : ""));
  std::fflush(nullptr);
  ::kill(::getpid(), SIGKILL);
}

void Trainer::beginRound(int64_t t) {
  inRound_ = true;
  roundUnitsSynced_ = 0;
  roundBeginStep_ = t;
}

void Trainer::endRound(int64_t t) {
  inRound_ = false;
  roundStep_ = t;
}

bool Trainer::recoverInPlace(const PeerLost& e, TrainResult& result) {
  // NCCL: tearing down a communicator with work in flight needs ncclCommAbort, which this
  // LibTorch's ProcessGroupNCCL does not expose; the GPU path has not run yet either.
  const char* why = cfg_.runtime.recovery != "inPlace" ? " (runtime.recovery=exit)"
                    : !isLocalMode() || !outerReady_   ? " (no outer state yet: synchronous phase)"
                    : mesh_.backend == "nccl"          ? " (not supported with NCCL yet)"
                    : overlap_                         ? " (not supported with algorithm.overlapSteps)"
                                                       : nullptr;
  if (why) {
    log(std::string("peer lost: ") + e.what() + why + "; exiting for a gang restart");
    return false;
  }
  const double t0 = nowSeconds(), deadline = t0 + cfg_.runtime.rendezvousTimeoutSeconds;
  const int64_t stepBefore = step_;
  scaling_ = false;  // a scale that failed part way continues as a recovery in its new world
  log(std::string("peer lost: ") + e.what() + "; recovering in place (waiting up to " +
      std::to_string(static_cast<int64_t>(cfg_.runtime.rendezvousTimeoutSeconds)) +
      " s for the replacement)");
  for (int attempt = 1;; ++attempt) {
    leaveGeneration();
    // Throws PeerLost (exit 75) once the deadline has passed, or at once on SIGTERM.
    rendezvous_->rejoin(std::max(0.0, deadline - nowSeconds()), gTerminateRequested);
    try {
      comm_ = std::make_unique<Comm>(mesh_, rendezvous_->store(), rendezvous_->prefix());
      rendezvous_->formed(postsArrivals());  // the groups are formed (dist/rendezvous.h)
      stream_ = std::make_unique<CommStream>(*comm_, mesh_.device);
      restoreFromPeers(false, &result);
      break;
    } catch (const RecoveryImpossible&) {
      throw;  // every rank decided so from the same table: a retry would decide the same
    } catch (const PeerLost& again) {
      // A connection lost while the groups formed or the state was copied: another rank
      // failed or left meanwhile (often the replacement). Go round again: every other rank
      // of this generation fails too once our groups are gone, and all meet in the next.
      if (gTerminateRequested || nowSeconds() > deadline) throw;
      log("recovery attempt " + std::to_string(attempt) + " in generation " +
          std::to_string(rendezvous_->generation()) + " failed: " + again.what() + "; retrying");
    }
  }
  result.recoveries++;
  result.recoverySeconds += nowSeconds() - t0;
  result.stepsRolledBack += std::max<int64_t>(0, stepBefore - step_);
  return true;
}

void Trainer::leaveGeneration() {
  // Pending tasks fail fast, the one in flight ends (its peer is gone or leaving too), and
  // destroying the process groups closes their connections, which makes every rank still
  // blocked on us notice now instead of at its timeout.
  if (stream_) stream_->abort();
  stream_.reset();
  if (comm_) addCounts(commCarried_, comm_->counters());  // the run's totals outlive the groups
  comm_.reset();
  releaseAll();  // the failed step may have left units gathered
}

void Trainer::joinRunningJob() {
  // A replacement: the survivors may lose a connection while it copies its state (another
  // rank failed or left), then it meets them again in the next generation.
  const double deadline = nowSeconds() + cfg_.runtime.rendezvousTimeoutSeconds;
  for (int attempt = 1;; ++attempt) {
    try {
      if (attempt > 1) {
        leaveGeneration();
        rendezvous_->join(std::max(0.0, deadline - nowSeconds()), gTerminateRequested);
        takeGenerationSize();
        comm_ = std::make_unique<Comm>(mesh_, rendezvous_->store(), rendezvous_->prefix());
        rendezvous_->formed(postsArrivals());  // the groups are formed (dist/rendezvous.h)
        stream_ = std::make_unique<CommStream>(*comm_, mesh_.device);
      }
      restoreFromPeers(true, nullptr);
      return;
    } catch (const RecoveryImpossible&) {
      throw;
    } catch (const PeerLost& e) {
      if (gTerminateRequested || nowSeconds() > deadline) throw;
      log("joining in generation " + std::to_string(rendezvous_->generation()) + " failed: " + e.what() +
          "; retrying");
    }
  }
}

// restoreFromPeers is four phases: every rank states how far it got (offerTable), the pure
// planner picks the round, how far into it each shard gets, and the sources
// (recovery_plan.h), the sync groups copy the outer state and the replicas their anomaly
// statistics, and everyone continues from the round's clock.

namespace {
// The columns of the table the ranks exchange.
enum OfferCol { kJoiner, kCur, kCurStep, kNext, kNextStep, kUnitsDone, kStepNow, kAdam, kCkpt, kScaleNext,
                kTotalSteps, kOfferCols };
}  // namespace

torch::Tensor Trainer::offerTable(bool joiner) {
  // What each rank can offer: the outer state after round `cur`, and how many units of the
  // round in progress it has applied on top (units sync in order).
  auto mine = torch::full({kOfferCols}, -1.0, torch::kFloat64);
  auto m = mine.accessor<double, 1>();
  // A survivor whose copy failed half way holds nothing it can name: it takes everything
  // from its sync group like a replacement.
  const bool holdsNothing = joiner || outerLost_;
  m[kJoiner] = holdsNothing ? 1 : 0;
  if (!holdsNothing) {
    // A round whose every unit was synchronized is complete here even if the step failed
    // afterwards (in an all-gather or the backward): its outer state is final.
    const size_t done = roundUnitsSynced_;
    const bool roundDone = inRound_ && done == units_.size();
    if (outerReady_) m[kCur] = static_cast<double>(syncRounds_ + (roundDone ? 1 : 0));
    m[kCurStep] = static_cast<double>(roundDone ? roundBeginStep_ : roundStep_);
    if (inRound_ && !roundDone) {
      m[kNext] = static_cast<double>(syncRounds_ + 1);
      m[kNextStep] = static_cast<double>(roundBeginStep_);
      m[kUnitsDone] = static_cast<double>(done);
    }
    m[kStepNow] = static_cast<double>(step_);
    m[kAdam] = static_cast<double>(adam_->stepCount());
    m[kCkpt] = static_cast<double>(lastCheckpointId_);
    // What a new replica cannot know: the scale points already applied, and the job's
    // length (training.tokens gives the steps for the world the job started with).
    m[kScaleNext] = static_cast<double>(nextScale_);
    m[kTotalSteps] = static_cast<double>(totalSteps_);
  }
  auto table = torch::empty({comm_->world(), kOfferCols}, torch::kFloat64);
  std::vector<torch::Tensor> rows;
  for (int r = 0; r < comm_->world(); ++r) rows.push_back(table[r]);
  comm_->allgather(Group::World, mine, rows);
  return table;
}

void Trainer::copyOuterState(const RecoveryPlan& plan, bool joiner) {
  // Copy from the source replica over the sync group, if this sync group has a joiner or a
  // survivor that got less far into the round. The source's state is the plan's: the
  // round's update for the units it got to, the previous round's for the rest.
  const int N = comm_->shards(), myShard = comm_->shard();
  bool groupReceives = false;
  for (int rep = 0; rep < comm_->replicas(); ++rep) groupReceives |= plan.receives[rep * N + myShard];
  if (!groupReceives) return;
  const int root = plan.source[myShard];
  if (!joiner && plan.receives[mesh_.rank]) outerLost_ = true;  // half written until the copy is done
  if (dropThisCopy(mesh_.rank))
    throw PeerLost("EDIT_TEST_DROP_COPY_RANK: connections dropped during the state copy");
  for (size_t u = 0; u < units_.size(); ++u) {
    comm_->broadcast(Group::Sync, outer_[u].outer, root);
    comm_->broadcast(Group::Sync, outer_[u].momentum, root);
    // The root sends its inner moments; other survivors keep theirs (receive into scratch).
    const bool keep = !joiner && comm_->replica() != root;
    auto am = keep ? torch::empty_like(adam_->m()[u]) : adam_->m()[u];
    auto av = keep ? torch::empty_like(adam_->v()[u]) : adam_->v()[u];
    comm_->broadcast(Group::Sync, am, root);
    comm_->broadcast(Group::Sync, av, root);
  }
}

void Trainer::copyAnomalyStats(const std::vector<bool>& survivor, const RecoveryPlan& plan) {
  // The anomaly statistics are per replica (they follow its own norms), not per sync
  // group: a replacement takes them from a surviving shard peer of its own replica. A
  // replica that lost every rank takes shard 0's source replica's, the same on all its
  // shards: a prior for a replica that restarts from the outer weights like the others.
  const int N = comm_->shards(), myShard = comm_->shard(), myReplica = comm_->replica();
  auto ewma = torch::empty({static_cast<int64_t>(detectors_.size()), 3}, torch::kFloat64);
  auto pack = [&] {
    for (size_t u = 0; u < detectors_.size(); ++u) {
      ewma[u][0] = detectors_[u].mean;
      ewma[u][1] = detectors_[u].var;
      ewma[u][2] = static_cast<double>(detectors_[u].count);
    }
  };
  auto unpack = [&] {
    for (size_t u = 0; u < detectors_.size(); ++u)
      detectors_[u] = {ewma[u][0].item<double>(), ewma[u][1].item<double>(),
                       static_cast<int64_t>(ewma[u][2].item<double>())};
  };
  auto firstSurvivingShard = [&](int rep) {
    for (int s = 0; s < N; ++s)
      if (survivor[rep * N + s]) return s;
    return -1;
  };
  bool someReplicaLost = false;
  for (int rep = 0; rep < comm_->replicas(); ++rep) someReplicaLost |= firstSurvivingShard(rep) < 0;
  const int peer = firstSurvivingShard(myReplica);
  if (someReplicaLost && myShard == 0) {
    pack();
    comm_->broadcast(Group::Sync, ewma, plan.source[0]);
    if (peer < 0) unpack();
  }
  // Every replica, not only one with a replacement: a round stopped part way may have
  // updated a unit's statistics on some of the replica's shards and not on others.
  if (N > 1) {
    const int root = peer < 0 ? 0 : peer;
    pack();
    comm_->broadcast(Group::Shard, ewma, root);
    if (myShard != root) unpack();
  }
}

void Trainer::agreeSkipStreaks() {
  // The stall check's streaks are the same on every rank in training (a unit's outer step
  // is skipped everywhere or nowhere), but not after a loss: a replacement has none, and
  // only the ranks whose sync step finished counted its round. The largest, so that a stall
  // is neither forgotten nor declared by some ranks only.
  skipStreak_.resize(units_.size(), 0);
  auto streaks = torch::empty({static_cast<int64_t>(units_.size())}, torch::kFloat64);
  for (size_t u = 0; u < units_.size(); ++u) streaks[u] = static_cast<double>(skipStreak_[u]);
  comm_->allreduce(Group::World, streaks, c10d::ReduceOp::MAX);
  for (size_t u = 0; u < units_.size(); ++u) skipStreak_[u] = static_cast<int64_t>(streaks[u].item<double>());
}

void Trainer::continueFromRound(int64_t round, int64_t step, int64_t lastCkpt) {
  // Everyone: inner weights := outer weights of `round`, and the clock of that round.
  for (size_t u = 0; u < units_.size(); ++u) units_[u].slice.copy_(outer_[u].outer);
  // The compression's error feedback (both residuals) restarts at zero on every rank: a
  // survivor's residuals belong to the round it got to, not necessarily `round`, and a
  // replacement has none. What they held (at most half a quantization step per element)
  // is dropped (docs/algorithm.md).
  for (auto& o : outer_) {
    if (o.residual.defined()) o.residual.zero_();
    if (o.averageResidual.defined()) o.averageResidual.zero_();
  }
  step_ = step;
  roundStep_ = step;
  skipSyncAt_ = step;  // the round at this step is the one restored
  stepsSinceSync_ = 0;
  syncRounds_ = static_cast<uint64_t>(round);
  inRound_ = false;
  lastSyncTime_ = nowSeconds();
  lastCheckpointId_ = lastCkpt;
  controlId_ = std::max<int64_t>(controlId_, lastCkpt);
  partialTermExchanges_ = 0;  // a new generation: a joiner counts from zero too
  outerLost_ = false;
  // A scale asked before a recovery is dropped: a replacement would not know of it.
  if (pendingReplicas_ > 0 && !scaling_) log("the scale asked before this recovery is dropped: ask again");
  pendingReplicas_ = 0;
  agreeJobSteps();  // the job's progress at the restored round (A-EDiT's learning rate)
}

void Trainer::checkSyncGroupAgrees() {
  // The copies must be bit-identical across the sync group, as after any sync round.
  double fp = 0;
  for (auto& o : outer_) fp += o.outer.sum(torch::kFloat64).item<double>();
  auto hi = torch::full({1}, fp, torch::kFloat64), lo = torch::full({1}, -fp, torch::kFloat64);
  comm_->allreduce(Group::Sync, hi, c10d::ReduceOp::MAX);
  comm_->allreduce(Group::Sync, lo, c10d::ReduceOp::MAX);
  if (hi.item<double>() != -lo.item<double>() || !std::isfinite(fp))
    throw std::runtime_error("in-place recovery: outer weights differ across the sync group after the copy");
}

void Trainer::restoreFromPeers(bool joiner, TrainResult* result) {
  torch::NoGradGuard ng;
  const int W = comm_->world();
  const torch::Tensor table = offerTable(joiner);
  auto T = table.accessor<double, 2>();
  std::vector<bool> survivor(W);
  std::vector<RecoveryOffer> offers(W);
  for (int r = 0; r < W; ++r) {
    survivor[r] = T[r][kJoiner] == 0;
    auto i = [&](OfferCol c) { return static_cast<int64_t>(T[r][c]); };
    offers[r] = {!survivor[r], i(kCur), i(kCurStep), i(kNext), i(kNextStep), i(kUnitsDone), i(kStepNow)};
  }
  // The round to continue from, how far into it each shard got, each shard's source
  // replica, who copies (recovery_plan.h).
  const RecoveryPlan plan = planRecovery(offers, comm_->replicas(), comm_->shards(),
                                         static_cast<int64_t>(units_.size()), mode_.clock == SyncClock::Steps);
  if (!plan.why.empty()) throw RecoveryImpossible("cannot recover in place: " + plan.why + "; restart from a checkpoint");
  const int me = mesh_.rank;
  const int64_t round = plan.round, step = plan.step[me];
  int64_t lastCkpt = -1;
  int joiners = 0;
  for (int r = 0; r < W; ++r) {
    if (survivor[r]) lastCkpt = std::max(lastCkpt, static_cast<int64_t>(T[r][kCkpt]));
    else joiners++;
  }

  if (joiner) initOuter();  // allocates outer_ in the right place; filled below
  copyOuterState(plan, joiner);
  copyAnomalyStats(survivor, plan);
  agreeSkipStreaks();
  if (joiner) {
    adam_->setStepCount(static_cast<int64_t>(T[plan.stepFrom[me]][kAdam]));
    // A replacement: cumulative tokens as if this rank had trained from the start (what a
    // resume from a checkpoint at `step` holds), so the job's token count does not drop by
    // a rank's share. A new replica of a scale-up counts only what it trains.
    tokens_ = mesh_.scaleJoin ? 0
                              : static_cast<uint64_t>(step) * static_cast<uint64_t>(cfg_.data.batchSize * cfg_.data.seqLen);
    totalSteps_ = static_cast<int64_t>(T[plan.stepFrom[me]][kTotalSteps]);
  }
  int64_t scaleNext = 0;
  for (int r = 0; r < W; ++r)
    if (survivor[r]) scaleNext = std::max(scaleNext, static_cast<int64_t>(T[r][kScaleNext]));
  nextScale_ = static_cast<size_t>(scaleNext);
  continueFromRound(round, step, lastCkpt);
  checkSyncGroupAgrees();
  // Every rank of the generation finished its copy: otherwise a sync group done early
  // would train on and meet the failure in a second recovery instead of this one's retry.
  comm_->barrier(Group::World);

  // A round that stopped part way keeps the previous round's state for the units it did
  // not reach, as if it had skipped them (docs/replica-recovery.md).
  std::string partial;
  for (int s = 0; s < comm_->shards(); ++s)
    if (plan.unitsApplied[s] < static_cast<int64_t>(units_.size()))
      partial += (partial.empty() ? "" : ", ") + std::string("shard ") + std::to_string(s) + " " +
                 std::to_string(plan.unitsApplied[s]) + " of " + std::to_string(units_.size());
  if (!partial.empty())
    log("sync round " + std::to_string(round) + " stopped part way: its update holds for the first units of each " +
        "shard (" + partial + "); the other units keep round " + std::to_string(round - 1) + "'s outer state");
  if (scaling_ || (joiner && mesh_.scaleJoin))
    log("scaled to " + std::to_string(comm_->replicas()) + " replicas (generation " +
        std::to_string(rendezvous_->generation()) + ", " + std::to_string(joiners) +
        " new rank(s)): continuing from sync round " + std::to_string(round) + " at step " + std::to_string(step) +
        (joiner ? " as a new replica" : ""));
  else
    log("recovered in place (generation " + std::to_string(rendezvous_->generation()) + ", " +
        std::to_string(joiners) + " rank(s) replaced): continuing from sync round " + std::to_string(round) +
        " at step " + std::to_string(step) + (result ? "" : " as a replacement"));
}

bool Trainer::scaleDue(int64_t t) const {
  if (nextScale_ >= mesh_.scaleAt.size()) return false;
  // Every rank must decide alike: the step of a step-clocked round is the same everywhere;
  // A-EDiT's replicas reach a round at different steps, so it uses the job's progress in
  // steps per replica, agreed at the round's control exchange.
  const int64_t progress = mode_.clock == SyncClock::Seconds ? jobSteps_ / comm_->replicas() : t;
  return progress >= mesh_.scaleAt[nextScale_].step;
}

bool Trainer::scale(int64_t t, int M2, TrainResult& result) {
  // Right after a sync round every rank holds the same outer state: the world re-forms with
  // M' replicas the way an in-place recovery does (new rendezvous generation, new process
  // groups), a new replica copies the outer state, momentum and inner moments from its
  // sync-group peers, and everyone continues from this round (inner := outer, this step
  // redone without its round). No checkpoint is read.
  const int M = comm_->replicas(), N = comm_->shards();
  if (M2 == M) {
    log("scale: already " + std::to_string(M) + " replicas");
    return false;
  }
  const bool leaving = comm_->replica() >= M2;
  log("scaling from " + std::to_string(M) + " to " + std::to_string(M2) + " replicas after sync round " +
      std::to_string(syncRounds_) + " (step " + std::to_string(t) + ")" +
      (leaving ? ": this replica leaves the job" : ""));
  const double t0 = nowSeconds();
  const int64_t stepBefore = step_;
  leaveGeneration();
  if (leaving) {
    result.scales++;
    result.leftAtScale = true;
    return true;
  }
  mesh_.replicas = M2;
  mesh_.world = M2 * N;
  rendezvous_->setWorld(mesh_.world);
  scaling_ = true;
  // The operator gives a scale-up up when a new pod fails (and says so with another
  // target): rank 0, the one it tells, calls the generation off for everyone waiting.
  struct CallOffWatch {
    std::atomic<bool> callOff{false}, waited{false};
    std::thread thread;
    Rendezvous* rdzv = nullptr;
    void stop() {
      waited = true;
      if (thread.joinable()) thread.join();
      if (rdzv) rdzv->setCallOff(nullptr);
      rdzv = nullptr;
    }
    ~CallOffWatch() { stop(); }
  } watch;
  if (M2 > M && hooks_.scaleTarget) {
    watch.thread = std::thread([this, &watch, M2] {
      while (!watch.waited) {
        const int target = hooks_.scaleTarget();
        if (target > 0 && target != M2) watch.callOff = true;
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
    });
    watch.rdzv = rendezvous_.get();
    rendezvous_->setCallOff(&watch.callOff);
  }
  try {
    rendezvous_->rejoin(cfg_.runtime.rendezvousTimeoutSeconds, gTerminateRequested);
    watch.stop();
  } catch (const PeerLost& e) {
    watch.stop();
    if (M2 < M || gTerminateRequested) throw;
    // A new replica that never arrived (its pod died or never started): the job stays at M
    // replicas in the generation after the abandoned one. (A peer lost after the groups
    // formed is an ordinary in-place recovery in the new world: the step loop's.)
    log("scale-up to " + std::to_string(M2) + " replicas failed (" + e.what() + "); continuing with " +
        std::to_string(M) + " replicas");
    result.scalesAbandoned++;
    mesh_.replicas = M;
    mesh_.world = M * N;
    rendezvous_->setWorld(mesh_.world);
    rendezvous_->abandonForming();
    rendezvous_->rejoin(cfg_.runtime.rendezvousTimeoutSeconds, gTerminateRequested);
  }
  comm_ = std::make_unique<Comm>(mesh_, rendezvous_->store(), rendezvous_->prefix());
  rendezvous_->formed(postsArrivals());
  stream_ = std::make_unique<CommStream>(*comm_, mesh_.device);
  // The compressed sync's owned part depends on M: its residual restarts at zero anyway.
  for (auto& o : outer_)
    if (o.averageResidual.defined()) o.averageResidual = torch::zeros({ownedPart(o.outer.numel())}, o.outer.options());
  restoreFromPeers(false, &result);
  scaling_ = false;
  if (mesh_.replicas == M2) result.scales++;
  result.stepsRolledBack += std::max<int64_t>(0, stepBefore - step_);  // the round's step, redone
  result.scaleSeconds += nowSeconds() - t0;
  return false;
}

}  // namespace edit
