// The generations of the job's world: the first one, the control exchange, recovery in
// place and scaling. Restoring the state in a new generation is membership_restore.cpp.
#include "train/membership.h"

#include <algorithm>
#include <thread>

#include "modes.h"

#include "train/step_engine.h"
#include "train/sync_schedule.h"

namespace edit {

Membership::Membership(const Config& cfg, MeshSpec& mesh, Groups& groups, ControlRequests& requests,
                       Progress& progress, FaultInjector* faults, Log log, std::function<int()> scaleTarget)
    : cfg_(cfg),
      mesh_(mesh),
      groups_(groups),
      requests_(requests),
      progress_(progress),
      faults_(faults),
      log_(std::move(log)),
      scaleTarget_(std::move(scaleTarget)),
      localPhases_(hasLocalPhases(cfg.algorithm.mode)),
      overlap_(cfg.algorithm.overlapSteps > 0 && localPhases_) {}

bool Membership::recoversInPlace() const {
  return cfg_.runtime.recovery == RecoveryMode::InPlace && localPhases_ && mesh_.backend != "nccl";
}

const char* Membership::whyNotScalable() const {
  return !localPhases_ ? "a local mode (edit, a-edit, diloco or localsgd): ddp has no sync rounds"
         : cfg_.runtime.recovery != RecoveryMode::InPlace
             ? "runtime.recovery inPlace (a scale re-forms the world like an in-place recovery)"
         : overlap_                ? "algorithm.overlapSteps 0"
         : mesh_.backend == "nccl" ? "the Gloo backend (the NCCL path of a re-formed world has not run)"
                                   : nullptr;
}

void Membership::formFirstGeneration() {
  rendezvous_ = std::make_unique<Rendezvous>(mesh_);
  if (mesh_.join) {
    log_(mesh_.scaleJoin ? "joining the running job as rank " + std::to_string(mesh_.rank) + " of a new replica"
                         : "joining the running job as a replacement for rank " + std::to_string(mesh_.rank));
    rendezvous_->join(cfg_.runtime.rendezvousTimeoutSeconds, requests_.terminate);
    takeGenerationSize();
  }
  groups_.comm = std::make_unique<Comm>(mesh_, rendezvous_->store(), rendezvous_->prefix());
  if (overlap_) {
    if (mesh_.backend == "nccl")
      throw ConfigError("algorithm.overlapSteps: runs on Gloo only (its NCCL path has not run yet); set it to "
                        "0 or use runtime.backend gloo");
    groups_.roundComm = std::make_unique<Comm>(mesh_, rendezvous_->store(), rendezvous_->prefix() + "overlap/");
    groups_.roundStream = std::make_unique<CommStream>(*groups_.roundComm, mesh_.device);
  }
  if (const char* needs = whyNotScalable(); needs && !mesh_.scaleAt.empty())
    throw ConfigError(std::string("EDIT_SCALE_AT (edit-run --scale-at) needs ") + needs);
  rendezvous_->formed(SyncSchedule::postsArrivals(cfg_.algorithm, mesh_.rank % mesh_.shards));
  groups_.stream = std::make_unique<CommStream>(*groups_.comm, mesh_.device);
}

void Membership::formGeneration() {
  groups_.comm = std::make_unique<Comm>(mesh_, rendezvous_->store(), rendezvous_->prefix());
  rendezvous_->formed(SyncSchedule::postsArrivals(cfg_.algorithm, mesh_.rank % mesh_.shards));
  groups_.stream = std::make_unique<CommStream>(*groups_.comm, mesh_.device);
}

void Membership::leaveGeneration() {
  groups_.leave();
  if (engine_) engine_->releaseAll();  // the failed step may have left units gathered
}

void Membership::takeGenerationSize() {
  const int world = rendezvous_->world();
  if (world == mesh_.world) return;
  log_("the running job has " + std::to_string(world / mesh_.shards) + " replicas, not the " +
       std::to_string(mesh_.replicas) + " of this worker's environment (a scale ended meanwhile): joining at " +
       std::to_string(world / mesh_.shards));
  mesh_.world = world;
  mesh_.replicas = world / mesh_.shards;
}

Control Membership::exchangeControl(int64_t t) {
  Comm& comm = *groups_.comm;
  // A scale asked of rank 0: the operator's target (telemetry SCALE), else a step from
  // SIGUSR1/SIGUSR2 (edit-run sends them to rank 0 only). A target the job has already
  // (or will have after the scale agreed before) asks nothing: the operator may resend it
  // until the reports show it done.
  double replicas = 0;
  if (mesh_.rank == 0) {
    const int delta = requests_.scaleDelta.exchange(0), target = requests_.scaleTarget.exchange(0);
    if (target > 0) {
      if (target != (pendingReplicas_ > 0 ? pendingReplicas_ : comm.replicas())) replicas = target;
    } else if (delta != 0) {
      replicas = std::max(1, comm.replicas() + delta);
    }
  }
  auto mine = torch::tensor({requests_.stop ? 1.0 : 0.0, requests_.checkpoint ? 1.0 : 0.0, static_cast<double>(t),
                             requests_.terminate ? 1.0 : 0.0, replicas},
                            torch::kFloat64);
  const int W = comm.world();
  auto all = torch::empty({W, 5}, torch::kFloat64);
  std::vector<torch::Tensor> outs;
  for (int r = 0; r < W; ++r) outs.push_back(all[r]);
  comm.allgather(Group::World, mine, outs);
  auto acc = all.accessor<double, 2>();
  Control c;
  int terminated = 0, asked = 0;
  for (int r = 0; r < W; ++r) {
    c.stop = c.stop || acc[r][0] > 0;
    c.checkpoint = c.checkpoint || acc[r][1] > 0;
    if (r % comm.shards() == 0) c.replicaSteps += static_cast<int64_t>(acc[r][2]);
    terminated += acc[r][3] > 0 ? 1 : 0;
    asked = std::max(asked, static_cast<int>(acc[r][4]));
  }
  requests_.checkpoint = false;
  if (asked > 0) {
    // Every rank decides alike: the scale runs right after this step's round (or the first
    // round, in the synchronous warm-up), or not at all.
    if (const char* needs = whyNotScalable()) {
      if (asked != ignoredReplicas_)  // once: the operator resends its target
        log_("scale to " + std::to_string(asked) + " replicas asked: ignored, it needs " + needs);
      ignoredReplicas_ = asked;
    } else if (asked == comm.replicas()) {
      // Back to this size before the agreed scale ran (or -USR2 at one replica).
      log_("scale to " + std::to_string(asked) + " replicas asked: the job has " + std::to_string(asked) +
           (pendingReplicas_ > 0 ? ", the scale to " + std::to_string(pendingReplicas_) + " is cancelled"
                                 : " already"));
      pendingReplicas_ = 0;
    } else {
      if (asked != pendingReplicas_) log_("scale to " + std::to_string(asked) + " replicas asked: after the next sync round");
      pendingReplicas_ = asked;
    }
  }
  // SIGTERM on every rank (Ctrl-C, a suspended or deleted job) stops the gang after a
  // checkpoint. On some ranks only (their pods were deleted or evicted) those ranks leave
  // and the others recover in place around their replacements, where that is possible;
  // but only once the same holds at a second exchange, because a whole gang's signals
  // arrive spread out and one exchange can fall between them.
  const bool inPlace = recoversInPlace() && !schedule_->synchronousAt(t) && schedule_->outerReady();
  if (terminated == W || (terminated > 0 && !inPlace)) {
    c.stop = true;
  } else if (terminated > 0 && !c.stop) {
    if (++partialTermExchanges_ >= 2 && acc[mesh_.rank][3] > 0)
      throw LeftAlone("SIGTERM reached " + std::to_string(terminated) + " of " + std::to_string(W) +
                      " workers: leaving alone, the others recover in place");
  } else {
    partialTermExchanges_ = 0;
  }
  return c;
}

bool Membership::recoverInPlace(const PeerLost& e) {
  // NCCL: tearing down a communicator with work in flight needs ncclCommAbort, which this
  // LibTorch's ProcessGroupNCCL does not expose; the GPU path has not run yet either.
  const char* why = cfg_.runtime.recovery != RecoveryMode::InPlace ? " (runtime.recovery=exit)"
                    : !localPhases_ || !schedule_->outerReady()    ? " (no outer state yet: synchronous phase)"
                    : mesh_.backend == "nccl"                      ? " (not supported with NCCL yet)"
                    : overlap_                                     ? " (not supported with algorithm.overlapSteps)"
                                                                   : nullptr;
  if (why) {
    log_(std::string("peer lost: ") + e.what() + why + "; exiting for a gang restart");
    return false;
  }
  const double t0 = nowSeconds(), deadline = t0 + cfg_.runtime.rendezvousTimeoutSeconds;
  const int64_t stepBefore = progress_.step;
  scaling_ = false;  // a scale that failed part way continues as a recovery in its new world
  log_(std::string("peer lost: ") + e.what() + "; recovering in place (waiting up to " +
       std::to_string(static_cast<int64_t>(cfg_.runtime.rendezvousTimeoutSeconds)) + " s for the replacement)");
  for (int attempt = 1;; ++attempt) {
    leaveGeneration();
    // Throws PeerLost (exit 75) once the deadline has passed, or at once on SIGTERM.
    rendezvous_->rejoin(std::max(0.0, deadline - nowSeconds()), requests_.terminate);
    try {
      formGeneration();
      restoreFromPeers(false);
      break;
    } catch (const RecoveryImpossible&) {
      throw;  // every rank decided so from the same table: a retry would decide the same
    } catch (const PeerLost& again) {
      // A connection lost while the groups formed or the state was copied: another rank
      // failed or left meanwhile (often the replacement). Go round again: every other rank
      // of this generation fails too once our groups are gone, and all meet in the next.
      if (requests_.terminate || nowSeconds() > deadline) throw;
      log_("recovery attempt " + std::to_string(attempt) + " in generation " +
           std::to_string(rendezvous_->generation()) + " failed: " + again.what() + "; retrying");
    }
  }
  stats_.recoveries++;
  stats_.recoverySeconds += nowSeconds() - t0;
  stats_.stepsRolledBack += std::max<int64_t>(0, stepBefore - progress_.step);
  return true;
}

void Membership::joinRunningJob() {
  // A replacement: the survivors may lose a connection while it copies its state (another
  // rank failed or left), then it meets them again in the next generation.
  const double deadline = nowSeconds() + cfg_.runtime.rendezvousTimeoutSeconds;
  for (int attempt = 1;; ++attempt) {
    try {
      if (attempt > 1) {
        leaveGeneration();
        rendezvous_->join(std::max(0.0, deadline - nowSeconds()), requests_.terminate);
        takeGenerationSize();
        formGeneration();
      }
      restoreFromPeers(true);
      return;
    } catch (const RecoveryImpossible&) {
      throw;
    } catch (const PeerLost& e) {
      if (requests_.terminate || nowSeconds() > deadline) throw;
      log_("joining in generation " + std::to_string(rendezvous_->generation()) + " failed: " + e.what() +
           "; retrying");
    }
  }
}

bool Membership::scaleIfDue(int64_t t) {
  int to = pendingReplicas_;
  if (to == 0) {
    // Every rank must decide alike: the step of a step-clocked round is the same
    // everywhere; A-EDiT's replicas reach a round at different steps, so its points are in
    // the job's progress, agreed at the round's control exchange.
    if (nextScale_ >= mesh_.scaleAt.size() || schedule_->scaleProgress(t) < mesh_.scaleAt[nextScale_].step)
      return false;
    to = mesh_.scaleAt[nextScale_++].replicas;
  }
  // An asked scale first; a --scale-at point due at the same round waits for the next.
  pendingReplicas_ = 0;
  return scale(t, to);
}

bool Membership::scale(int64_t t, int replicas) {
  // Right after a sync round every rank holds the same outer state: the world re-forms with
  // the new number of replicas the way an in-place recovery does (new rendezvous
  // generation, new process groups), a new replica copies the outer state, momentum and
  // inner moments from its sync-group peers, and everyone continues from this round (inner
  // := outer, this step redone without its round). No checkpoint is read.
  const int M = groups_.comm->replicas(), N = groups_.comm->shards();
  if (replicas == M) {
    log_("scale: already " + std::to_string(M) + " replicas");
    return false;
  }
  const bool leaving = groups_.comm->replica() >= replicas;
  log_("scaling from " + std::to_string(M) + " to " + std::to_string(replicas) + " replicas after sync round " +
       std::to_string(schedule_->syncRounds()) + " (step " + std::to_string(t) + ")" +
       (leaving ? ": this replica leaves the job" : ""));
  const double t0 = nowSeconds();
  const int64_t stepBefore = progress_.step;
  leaveGeneration();
  if (leaving) {
    stats_.scales++;
    stats_.leftAtScale = true;
    return true;
  }
  mesh_.replicas = replicas;
  mesh_.world = replicas * N;
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
  if (replicas > M && scaleTarget_) {
    watch.thread = std::thread([this, &watch, replicas] {
      while (!watch.waited) {
        const int target = scaleTarget_();
        if (target > 0 && target != replicas) watch.callOff = true;
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
    });
    watch.rdzv = rendezvous_.get();
    rendezvous_->setCallOff(&watch.callOff);
  }
  try {
    rendezvous_->rejoin(cfg_.runtime.rendezvousTimeoutSeconds, requests_.terminate);
    watch.stop();
  } catch (const PeerLost& e) {
    watch.stop();
    if (replicas < M || requests_.terminate) throw;
    // A new replica that never arrived (its pod died or never started): the job stays at M
    // replicas in the generation after the abandoned one. (A peer lost after the groups
    // formed is an ordinary in-place recovery in the new world: the step loop's.)
    log_("scale-up to " + std::to_string(replicas) + " replicas failed (" + e.what() + "); continuing with " +
         std::to_string(M) + " replicas");
    stats_.scalesAbandoned++;
    mesh_.replicas = M;
    mesh_.world = M * N;
    rendezvous_->setWorld(mesh_.world);
    rendezvous_->abandonForming();
    rendezvous_->rejoin(cfg_.runtime.rendezvousTimeoutSeconds, requests_.terminate);
  }
  formGeneration();
  // The compressed sync's owned part depends on M: its residual restarts at zero anyway.
  schedule_->resizeOwnedParts();
  restoreFromPeers(false);
  scaling_ = false;
  if (mesh_.replicas == replicas) stats_.scales++;
  stats_.stepsRolledBack += std::max<int64_t>(0, stepBefore - progress_.step);  // the round's step, redone
  stats_.scaleSeconds += nowSeconds() - t0;
  return false;
}

}  // namespace edit
