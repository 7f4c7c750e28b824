// The planner's lifecycle policy: the phases (Pending, Created, Running, Succeeded,
// Failed, Suspended), activeDeadlineSeconds, cleanPodPolicy and the TTL, and creating the
// pods that are missing. Failures: plan_failures.cpp; stragglers: plan_stragglers.cpp.
#include <algorithm>
#include <set>

#include "controller/desired.h"
#include "controller/plan_context.h"
#include "util/log.h"

namespace edit::op::controller {

using api::CondStatus;
using api::Phase;
namespace condition = api::condition;
namespace reason = api::reason;

namespace {

// Deletes pods the finished job no longer needs, by runPolicy.cleanPodPolicy.
void cleanup(PlanContext& c, bool forceRunning) {
  const std::string& policy = c.spec->runPolicy.cleanPodPolicy;
  for (const auto& p : c.in.pods) {
    if (p.deleting) continue;
    bool active = p.phase == podphase::Running || p.phase == podphase::Pending || p.phase == podphase::Unknown;
    if (policy == "All" || ((policy == "Running" || forceRunning) && active)) c.plan.podsToDelete.push_back(p.name);
  }
}

void scheduleTtl(PlanContext& c) {
  if (!c.spec->runPolicy.ttlSecondsAfterFinished) return;
  std::time_t finishedAt = log::parseRfc3339(c.st.completionTime.value_or(""));
  if (!finishedAt) finishedAt = c.in.now;
  long remaining = static_cast<long>(finishedAt + *c.spec->runPolicy.ttlSecondsAfterFinished - c.in.now);
  if (remaining <= 0)
    c.plan.deleteJob = true;
  else
    c.plan.requeueAfterSeconds = remaining;
}

}  // namespace

void countWorkers(PlanContext& c) {
  api::WorkerCounts w;
  w.total = c.spec ? c.spec->worldSize() : 0;
  for (const auto* p : c.current()) {
    if (p->phase == podphase::Running) w.running++;
    else if (p->phase == podphase::Succeeded) w.succeeded++;
    else if (p->phase == podphase::Failed) w.failed++;
    else w.pending++;
  }
  c.st.workers = w;
}

Plan invalidSpec(PlanContext& c) {
  if (c.phase() != Phase::Failed) {
    c.setPhase(Phase::Failed);
    c.st.completionTime = c.now;
    c.event(api::kWarning, reason::InvalidSpec, c.in.specError);
  }
  c.st.message = c.in.specError;
  c.cond(condition::Failed, CondStatus::True, reason::InvalidSpec, c.in.specError);
  c.plan.status = c.st;
  return c.plan;
}

Plan finished(PlanContext& c) {
  cleanup(c, false);
  scheduleTtl(c);
  return c.done();
}

Plan suspended(PlanContext& c) {
  for (const auto& p : c.in.pods)
    if (!p.deleting) c.plan.podsToDelete.push_back(p.name);
  if (c.phase() != Phase::Suspended) {
    c.setPhase(Phase::Suspended);
    c.cond(condition::Suspended, CondStatus::True, reason::Suspended, "runPolicy.suspend is true");
    c.falseIfPresent(condition::Running, reason::Suspended, "job suspended");
    c.event(api::kNormal, reason::Suspended, "job suspended; workers deleted");
    c.st.startTime.reset();  // the deadline counts from the next start
  }
  clearRecovery(c, reason::Suspended, "job suspended");  // resuming creates a whole new gang
  clearScaling(c, reason::Suspended, "job suspended; spec.replicas applies on resume");
  clearDisruption(c, reason::Suspended, "job suspended");
  return c.done();
}

void resumeIfSuspended(PlanContext& c) {
  if (c.phase() == Phase::Suspended) {
    c.cond(condition::Suspended, CondStatus::False, reason::Resumed, "job resumed");
    c.event(api::kNormal, reason::Resumed, "job resumed; recreating workers");
    c.setPhase(Phase::Pending);
  }
  if (c.phase() == Phase::Unset) c.setPhase(Phase::Pending);
}

// The old gang must be gone before the new one (same pod names) is created.
bool oldGangLeft(PlanContext& c) {
  bool stale = false;
  for (const auto& pod : c.in.pods) {
    if (pod.generation == c.restartGeneration()) continue;
    stale = true;
    if (!pod.deleting) c.plan.podsToDelete.push_back(pod.name);
  }
  if (stale) c.plan.requeueAfterSeconds = 1;
  return !stale;
}

void fail(PlanContext& c, const std::string& why, const std::string& msg, bool stopRunning) {
  c.setPhase(Phase::Failed);
  c.st.completionTime = c.now;
  c.st.message = msg;
  c.cond(condition::Failed, CondStatus::True, why, msg);
  c.falseIfPresent(condition::Running, why, msg);
  c.falseIfPresent(condition::Restarting, why, msg);
  clearRecovery(c, why, msg);
  clearDisruption(c, why, msg);
  clearScaling(c, why, msg);
  c.endCondition(condition::TelemetryLost, why, msg);
  c.event(api::kWarning, why, msg);
  cleanup(c, stopRunning);
  scheduleTtl(c);
}

bool deadlineExceeded(PlanContext& c) {
  const auto& deadline = c.spec->runPolicy.activeDeadlineSeconds;
  if (!deadline || !c.st.startTime) return false;
  std::time_t started = log::parseRfc3339(*c.st.startTime);
  if (!started) return false;
  long left = static_cast<long>(started + *deadline - c.in.now);
  if (left > 0) {
    c.plan.requeueAfterSeconds = left;
    return false;
  }
  fail(c, reason::DeadlineExceeded, "job ran longer than runPolicy.activeDeadlineSeconds=" + std::to_string(*deadline),
       true);
  return true;
}

namespace {

// A pod deleted just as its worker finished goes before its exit is seen, and its rank
// is replaced in place (plan_failures.cpp, vanished). If every other rank then succeeds,
// the gang finished without the replacement: the end of training is collective (the
// final sync, evaluation and checkpoint barrier need every rank), so the deleted worker
// got there too. Its replacement, waiting to join, is not needed. Returns whether the
// job succeeded; `unneeded` says which replacements were not needed.
bool allWorkersSucceeded(PlanContext& c, std::string* unneeded) {
  std::set<int> done;
  for (const auto* p : c.current())
    if (p->phase == podphase::Succeeded) done.insert(p->rank);
  const int ok = static_cast<int>(done.size());
  if (ok >= c.spec->worldSize()) return true;
  const auto& recovery = c.st.recovery;
  if (!recovery || ok == 0) return false;
  std::vector<int> ranks;
  for (int r = 0; r < c.spec->worldSize(); ++r) {
    if (done.count(r)) continue;
    if (!recovery->covers(r)) return false;
    ranks.push_back(r);
  }
  for (const auto* p : c.current())
    if (!done.count(p->rank) && !p->deleting) c.plan.podsToDelete.push_back(p->name);
  *unneeded = "; rank(s) " + rankList(ranks) + ": the pod was deleted as its worker finished, the replacement was not needed";
  return true;
}

}  // namespace

bool succeeded(PlanContext& c) {
  std::string unneeded;
  if (!allWorkersSucceeded(c, &unneeded)) return false;
  c.setPhase(Phase::Succeeded);
  c.st.completionTime = c.now;
  const std::string msg = "all " + std::to_string(c.spec->worldSize()) + " workers succeeded" + unneeded;
  c.st.message = msg;
  c.cond(condition::Succeeded, CondStatus::True, reason::AllWorkersSucceeded, msg);
  c.falseIfPresent(condition::Running, reason::Completed, "job finished");
  c.falseIfPresent(condition::Restarting, reason::Completed, "job finished");
  clearRecovery(c, reason::Completed, "job finished");
  clearDisruption(c, reason::Completed, "job finished");
  clearScaling(c, reason::Completed, "job finished");
  c.endCondition(condition::Hung, reason::Completed, "job finished");
  c.endCondition(condition::TelemetryLost, reason::Completed, "job finished");
  c.event(api::kNormal, reason::Succeeded, msg);
  mergeTelemetry(c);
  planLink(c);  // the run's final word on its link, for the next run's settings
  // Every worker exited 0, so training reached its budget even when the last reports
  // were lost (e.g. the operator restarted just before the end).
  if (auto& p = c.st.progress) {
    if (p->totalSteps > 0 && p->step < p->totalSteps) p->step = p->totalSteps;
    p->etaSeconds = 0;
  }
  cleanup(c, false);
  // An unneeded replacement goes whatever cleanPodPolicy says (it would wait to join).
  auto& del = c.plan.podsToDelete;
  std::sort(del.begin(), del.end());
  del.erase(std::unique(del.begin(), del.end()), del.end());
  scheduleTtl(c);
  return true;
}

void createMissing(PlanContext& c) {
  // A whole new gang (first start, resume, restart) trains with spec.replicas; it resumes
  // a checkpoint written with another number of replicas.
  const bool noPods = std::none_of(c.in.pods.begin(), c.in.pods.end(),
                                   [&](const ObservedPod& p) { return p.generation == c.restartGeneration(); });
  if (noPods && c.running.replicas != c.in.spec->replicas) {
    c.adoptReplicas(c.in.spec->replicas);
    clearScaling(c, reason::GangCreated, "a new gang starts with spec.replicas");
  }
  std::set<int> present;
  for (const auto* p : c.current()) present.insert(p->rank);
  for (int r = 0; r < c.spec->worldSize(); ++r)
    if (!present.count(r)) c.plan.ranksToCreate.push_back(r);
  if (c.plan.ranksToCreate.empty()) return;
  c.plan.ensureChildren = true;
  if (!c.st.startTime) c.st.startTime = c.now;
  if (static_cast<int>(c.plan.ranksToCreate.size()) == c.spec->worldSize()) {
    // Nothing left to join (e.g. every pod was deleted): a new gang, no replacements.
    noteGangStop(c);
    clearRecovery(c, reason::GangRecreated, "every worker pod was gone; creating the gang again");
    // Once per gang: a retry after a refused create (phase still Created) is not a new one.
    if (c.phase() != Phase::Created) {
      c.plan.gangCreated = true;
      c.event(api::kNormal, reason::Created,
              "creating " + std::to_string(c.spec->worldSize()) + " worker pods (restart generation " +
                  std::to_string(c.restartGeneration()) + ")");
    }
  }
  if (c.st.recovery)
    for (int r : c.plan.ranksToCreate)
      if (c.st.recovery->covers(r)) c.plan.joiningRanks.push_back(r);
  if (c.phase() == Phase::Pending) {
    c.setPhase(Phase::Created);
    c.cond(condition::Created, CondStatus::True, reason::GangCreated, "worker pods, service and config created");
  }
}

namespace {

// ErrImagePull and ImagePullBackOff alternate while the kubelet retries: one problem.
std::string problemKind(const std::string& reason) {
  return reason == "ErrImagePull" || reason == "ImagePullBackOff" ? "ImagePull" : reason;
}

}  // namespace

bool watchPodsStarting(PlanContext& c) {
  const ObservedPod* stuck = nullptr;
  const ObservedPod* oldest = nullptr;  // the longest-waiting pod that has not started
  int stuckPods = 0;
  for (const auto* p : c.current()) {
    if (p->deleting || p->phase != podphase::Pending) continue;
    if (!oldest || (!p->created.empty() && p->created < oldest->created)) oldest = p;
    if (p->startReason.empty()) continue;
    ++stuckPods;
    if (!stuck) stuck = p;
  }
  std::string why, msg;
  if (stuck) {
    why = stuck->startReason;
    msg = "worker pod " + stuck->name + " cannot start: " + why + (stuck->startMessage.empty() ? "" : ": " + stuck->startMessage);
    if (stuckPods > 1) msg += " (" + std::to_string(stuckPods) + " pods cannot start)";
  } else if (!c.in.createError.empty() && !c.plan.ranksToCreate.empty()) {
    why = reason::FailedCreate;
    msg = c.in.createError;
  }
  const auto* before = c.before.condition(condition::PodsReady);
  if (!why.empty()) {
    const bool fresh = !before || before->status != api::CondStatus::False || problemKind(before->reason) != problemKind(why);
    c.cond(condition::PodsReady, CondStatus::False, why, msg);
    c.st.message = msg;
    // A refused create has its event already: the reconciler records it when the API refuses.
    if (fresh && why != reason::FailedCreate) c.event(api::kWarning, why, msg);
  } else if (before && before->status == api::CondStatus::False && !oldest) {
    c.cond(condition::PodsReady, CondStatus::True, reason::PodsStarted, "every worker pod started");
  }
  // runPolicy.scheduleTimeoutSeconds: as Kueue's waitForPodsReady and PyTorchJob's
  // schedulingPolicy.scheduleTimeoutSeconds, counted from the waiting pod's creation.
  const auto& timeout = c.spec->runPolicy.scheduleTimeoutSeconds;
  if (!timeout) return false;
  std::time_t since = oldest ? log::parseRfc3339(oldest->created) : 0;
  if (!oldest && why == reason::FailedCreate && before && before->reason == why)
    since = log::parseRfc3339(before->lastTransitionTime);
  if (!since) return false;
  const long left = static_cast<long>(since + *timeout - c.in.now);
  if (left > 0) {
    if (!c.plan.requeueAfterSeconds || left < *c.plan.requeueAfterSeconds) c.plan.requeueAfterSeconds = left;
    return false;
  }
  const std::string pod = oldest ? "worker pod " + oldest->name : std::string("a worker pod");
  fail(c, why.empty() ? reason::ScheduleTimeout : why,
       pod + " did not start within runPolicy.scheduleTimeoutSeconds=" + std::to_string(*timeout) +
           (msg.empty() ? std::string(" (Pending)") : "; " + msg),
       true);
  return true;
}

void updateRunning(PlanContext& c) {
  int running = 0, finishedOk = 0;
  for (const auto* p : c.current()) {
    if (p->phase == podphase::Running) running++;
    if (p->phase == podphase::Succeeded) finishedOk++;
  }
  const int world = c.spec->worldSize();
  bool allUp = running > 0 && running + finishedOk == world;
  if (allUp && c.phase() != Phase::Running) {
    bool wasRestarting = c.phase() == Phase::Restarting;
    c.setPhase(Phase::Running);
    c.st.message = "all workers running";
    c.cond(condition::Running, CondStatus::True, reason::AllWorkersRunning,
           "all " + std::to_string(world) + " workers are running");
    if (wasRestarting) c.cond(condition::Restarting, CondStatus::False, reason::Recovered, "gang recreated and running");
    c.endCondition(condition::Hung, reason::Recovered, "gang restarted");
    c.event(api::kNormal, reason::Running, "all " + std::to_string(world) + " workers are running");
  }
  if (c.st.recovery) endRecoveryIfRejoined(c, allUp);
}

}  // namespace edit::op::controller
