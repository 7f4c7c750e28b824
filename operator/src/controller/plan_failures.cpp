// The planner's failure policy: failed, deleted and hung workers and disruptions, answered
// by an in-place recovery of the lost ranks or a gang restart within runPolicy.backoffLimit
// (the decision table itself: controller/failure_policy.h).
#include <algorithm>
#include <set>

#include "controller/desired.h"
#include "controller/planner.h"
#include "util/log.h"

namespace edit::op::controller {
namespace {

std::string rankList(const std::vector<const ObservedPod*>& pods) {
  std::vector<int> ranks;
  for (const auto* p : pods) ranks.push_back(p->rank);
  return controller::rankList(ranks);
}

}  // namespace

void Planner::restart(const std::string& reason, const std::string& msg) {
  budget_.gangRestarts++;
  restartGen_++;
  st_["restarts"] = budget_.gangRestarts;
  st_["restartGeneration"] = restartGen_;
  setPhase("Restarting");
  st_["message"] = msg;
  cond("Restarting", "True", reason, msg);
  if (findCondition(st_, "Running")) cond("Running", "False", reason, msg);
  clearRecovery("GangRestarted", msg);
  clearScaling("GangRestarted", msg);
  event("Warning", "Restarting",
        msg + "; restarting the gang (restart " + std::to_string(budget_.gangRestarts) + "; " + budget_.usage() + ")");
  for (const auto& p : in_.pods)
    if (!p.deleting) plan_.podsToDelete.push_back(p.name);
  plan_.gangRestarted = true;
  plan_.requeueAfterSeconds = 1;
}

// Records a disruption of a current pod in the Disrupted condition, so that the failures
// it causes later (its worker leaves with exit 76, or in a synchronous phase every worker
// checkpoints and exits 143) are still recognized once the evicted pod is gone.
void Planner::noteDisruptions() {
  if (conditionTrue(st_, "Disrupted")) return;
  for (const auto* p : current()) {
    if (p->disruption.empty()) continue;
    const std::string msg = "pod " + p->name + " is being taken away (" + p->disruption +
                            "); the recovery or restart it causes (workers leaving with exit 76 or stopping "
                            "with exit 143) does not count against runPolicy.backoffLimit";
    cond("Disrupted", "True", p->disruption, msg);
    event("Warning", "Disrupted", msg);
    return;
  }
}

// A pod of the running gang that someone else deleted (vanished()) is a disruption in
// itself: the operator may never have seen its DisruptionTarget condition (an eviction
// whose pod went before a reconcile looked) or there was none (kubectl delete pod).
void Planner::noteDeletedPod(const ObservedPod& p) {
  if (conditionTrue(st_, "Disrupted")) return;
  const std::string msg = "pod " + p.name + " was deleted (an eviction, a drain or kubectl delete pod); "
                          "replacing it does not count against runPolicy.backoffLimit";
  cond("Disrupted", "True", "PodDeleted", msg);
  event("Warning", "Disrupted", msg);
}

// Whether the failure being handled comes from a disruption; if so it is counted in
// status.disruptions (and so not against the budget) and the condition is consumed.
bool Planner::consumeDisruption(const std::string& what) {
  if (!conditionTrue(st_, "Disrupted")) return false;
  budget_.disruptions++;
  st_["disruptions"] = budget_.disruptions;
  cond("Disrupted", "False", "Handled", what + " after the disruption (not counted against runPolicy.backoffLimit)");
  return true;
}

bool Planner::handleFailures() {
  std::vector<const ObservedPod*> failed;  // failures not acted on yet
  for (const auto* p : current()) {
    if (p->phase != "Failed") continue;
    if (recovery_ && recovery_->replaces(*p)) {
      // Already being replaced: repeat the delete (idempotent) in case the last one was lost.
      if (!p->deleting) plan_.podsToDelete.push_back(p->name);
      continue;
    }
    failed.push_back(p);
  }
  if (const auto permanent = permanentFailure(failed)) {
    fail(permanent->reason, permanent->message, true);
    return true;
  }
  for (const auto* p : vanished()) {
    failed.push_back(p);
    noteDeletedPod(*p);
  }
  if (!failed.empty()) {
    handleFailedWorkers(failed);
    return true;
  }
  if (in_.telemetry.hung && phase_ == "Running") return handleHang();
  return false;
}

void Planner::handleFailedWorkers(const std::vector<const ObservedPod*>& failed) {
  std::string msg = describeExits(failed);
  const std::string why = gangRestartReason(*spec_, phase_, failed, recovery_ ? &*recovery_ : nullptr);
  const bool disrupted = causedByDisruption(failed, conditionTrue(st_, "Disrupted"));
  const FailureResponse response = respondToFailedWorkers(why, recovery_.has_value(), disrupted, budget_);
  if (response == FailureResponse::JoinRecovery) {
    replaceInPlace(failed, msg);
    return;
  }
  if (response == FailureResponse::StartRecovery) {
    startRecovery();
    if (disrupted) consumeDisruption("in-place recovery");
    replaceInPlace(failed, msg);
    return;
  }
  if (!why.empty()) msg += "; gang restart: " + why;
  restartOrFail(response, "WorkerFailed", msg, disrupted);
}

bool Planner::handleHang() {
  // The survivors of a recovery make no progress while they wait for the replacement.
  if (recoveryYoungerThanHangTimeout()) return false;
  const std::string msg = "no training progress for hangTimeoutSeconds=" + std::to_string(spec_->hangTimeoutSeconds);
  double longest = 0;
  const auto silent = silentPods(current(), in_.telemetry, spec_->hangTimeoutSeconds, &longest);
  const bool silentReplaceable = !silent.empty() && gangRestartReason(*spec_, phase_, silent, nullptr).empty();
  const FailureResponse response = respondToHang(silentReplaceable, recovery_.has_value(), budget_);
  if (response == FailureResponse::StartRecovery) {
    replaceSilentInPlace(silent, longest, msg);
    return true;
  }
  cond("Hung", "True", "NoProgress", msg);
  event("Warning", "Hung", msg);
  // Its workers are stuck (in a collective, or stopped): SIGTERM cannot make them
  // checkpoint, so waiting out the grace period only delays the restart.
  plan_.deleteImmediately = true;
  restartOrFail(response, "Hung", msg, false);
  return true;
}

// The failure policy's answer when nothing can be replaced in place.
void Planner::restartOrFail(FailureResponse response, const std::string& reason, std::string msg, bool disrupted) {
  if (response == FailureResponse::FailJob) {
    fail("BackoffLimitExceeded", msg + "; " + budget_.exhaustedMessage(), true);
    return;
  }
  if (disrupted) {
    consumeDisruption("gang restart");
    msg += " after a disruption";
  }
  restart(reason, msg);
}

// A new in-place recovery: one unit of budget (given back by consumeDisruption when a
// disruption caused it).
void Planner::startRecovery() {
  budget_.inPlaceRecoveries++;
  st_["replicaRecoveries"] = budget_.inPlaceRecoveries;
  recovery_ = RecoveryRecord{{}, now_, {}};
}

// Ranks of the running gang whose pod vanished without the operator seeing it fail: a pod
// someone else deleted (kubectl delete pod, an eviction, a node drain) goes as soon as its
// worker exits, often before a reconcile sees it Failed. Every pod the operator deletes
// itself is in status.recovery or of an old generation. SIGTERM reached only those
// workers, which left (edit-train exit 76) while the others wait for replacements, so
// the ranks are replaced in place like failed pods; recreated as fresh ranks they could
// not join a gang that formed without them. (A deleted pod seen Failed takes the failed
// path with its exit code: 76 in place, 143 when the gang stopped together.) Not when no
// pod stays running, the job is being deleted, or the policy restarts the gang anyway.
std::vector<const ObservedPod*> Planner::vanished() {
  std::vector<const ObservedPod*> out;
  if (phase_ != "Running" || in_.meta.deleting || !gangRestartReason(*spec_, phase_, {}, nullptr).empty())
    return out;
  std::set<int> present;
  bool someStay = false;
  for (const auto* p : current()) {
    present.insert(p->rank);
    someStay |= !p->deleting && p->phase == "Running";
  }
  if (!someStay) return out;
  vanished_.clear();
  vanished_.reserve(spec_->worldSize());
  for (int r = 0; r < spec_->worldSize(); ++r) {
    if (present.count(r) || (recovery_ && recovery_->covers(r))) continue;
    ObservedPod gone;
    gone.name = podName(in_.meta.name, r);
    gone.rank = r;
    gone.generation = restartGen_;
    gone.deleting = true;  // nothing left to delete
    vanished_.push_back(gone);
  }
  for (const auto& p : vanished_) out.push_back(&p);
  return out;
}

// A hang where some workers fell silent (no report, not even a heartbeat, for half the
// hang timeout) while the others kept reporting: the silent ones are stopped or frozen,
// the others wait for them in a collective. Killing the silent pods breaks those
// collectives at once and the rest recover in place around their replacements. Without
// such a split (every worker silent, or every one alive: a deadlock) the gang restarts.
// longest: the longest silence among them, in seconds.
void Planner::replaceSilentInPlace(const std::vector<const ObservedPod*>& silent, double longest, const std::string& msg) {
  const std::string who = "rank(s) " + rankList(silent) + " sent nothing for " +
                          std::to_string(static_cast<long>(longest)) + " s while the others kept reporting";
  cond("Hung", "True", "WorkerUnresponsive", msg + "; " + who);
  event("Warning", "Hung", msg + "; " + who);
  startRecovery();
  for (const auto* p : silent) {
    recovery_->add(*p);
    plan_.podsToDelete.push_back(p->name);
    plan_.recoveredRanks.push_back(p->rank);
  }
  st_["recovery"] = recovery_->toJson();
  const std::string what = "killing unresponsive rank(s) " + recovery_->rankList() +
                           " and replacing them in place; the other workers wait for them";
  st_["message"] = what;
  cond("Recovering", "True", "WorkerUnresponsive", what);
  event("Warning", "RecoveringReplica",
        who + "; " + what + " (in-place recovery " + std::to_string(budget_.inPlaceRecoveries) + "; " +
            budget_.usage() + ")");
  plan_.deleteImmediately = true;  // a stopped process cannot act on SIGTERM
  plan_.requeueAfterSeconds = 1;
}

// Deletes the failed pods (normal grace) and records their ranks, so that createMissing
// recreates them with EDIT_JOIN=1 in the same restart generation.
void Planner::replaceInPlace(const std::vector<const ObservedPod*>& failed, const std::string& msg) {
  for (const auto* p : failed) {
    recovery_->add(*p);
    if (!p->deleting) plan_.podsToDelete.push_back(p->name);
    plan_.recoveredRanks.push_back(p->rank);
  }
  st_["recovery"] = recovery_->toJson();
  const std::string what = "replacing rank(s) " + recovery_->rankList() + " in place; the other workers wait for them";
  st_["message"] = what;
  cond("Recovering", "True", "ReplicaFailed", msg + "; " + what);
  event("Warning", "RecoveringReplica",
        msg + "; replacing rank(s) " + rankList(failed) + " in place (in-place recovery " +
            std::to_string(budget_.inPlaceRecoveries) + "; " + budget_.usage() + ")");
  plan_.requeueAfterSeconds = 1;
}

void Planner::clearDisruption(const std::string& reason, const std::string& msg) {
  if (conditionTrue(st_, "Disrupted")) cond("Disrupted", "False", reason, msg);
}

// The survivors make no progress until the replacements joined, took their state and
// trained a step; a replacement's start-up (process, rendezvous, state copy) counts from
// when its container started, not from the failure (deleting the failed pod and
// scheduling the new one come first, and on a busy node take a while).
bool Planner::recoveryYoungerThanHangTimeout() const {
  if (!recovery_ || spec_->hangTimeoutSeconds <= 0) return false;
  std::time_t started = log::parseRfc3339(recovery_->startTime);
  if (!started) return false;
  for (const auto* p : current())
    if (recovery_->covers(p->rank) && !recovery_->replaces(*p) && !p->started.empty())
      started = std::max(started, log::parseRfc3339(p->started));
  return in_.now - started < spec_->hangTimeoutSeconds;
}

// Ends a recovery record (done, or superseded by a gang restart, a failure, a suspend).
void Planner::clearRecovery(const std::string& reason, const std::string& msg) {
  recovery_.reset();
  st_.erase("recovery");
  if (conditionTrue(st_, "Recovering")) cond("Recovering", "False", reason, msg);
}

// A recovery is over when every rank runs a pod that is not an incarnation it replaces
// (a killed straggler may still be visible, Running, while it is being deleted) and
// every replacement has reported a training step: it joined the rendezvous, took its
// state from its peers and trains again. Running alone says nothing about the join.
void Planner::endRecoveryIfRejoined(bool allWorkersUp) {
  bool replacementsUp = allWorkersUp;
  for (const auto* p : current())
    if (p->deleting || recovery_->replaces(*p)) replacementsUp = false;
  if (!replacementsUp) return;
  std::vector<int> waiting;
  long resumedAt = -1;
  for (const auto* p : current()) {
    if (!recovery_->covers(p->rank)) continue;
    if (auto step = rejoinedAtStep(*p, in_.telemetry)) resumedAt = std::max(resumedAt, *step);
    else waiting.push_back(p->rank);
  }
  if (!waiting.empty()) {
    st_["message"] = "replacement(s) of rank(s) " + controller::rankList(waiting) + " running; waiting for their first training step";
    return;
  }
  const std::time_t started = log::parseRfc3339(recovery_->startTime);
  const long seconds = started ? std::max(0L, static_cast<long>(in_.now - started)) : 0L;
  std::string what = "rank(s) " + recovery_->rankList() + " replaced in place; ";
  what += resumedAt >= 0 ? "training again (step " + std::to_string(resumedAt) + " reported) "
                         : "all " + std::to_string(spec_->worldSize()) + " workers running again ";
  what += std::to_string(seconds) + " s after the failure";
  clearRecovery("Recovered", what);
  if (conditionTrue(st_, "Hung")) cond("Hung", "False", "Recovered", what);
  st_["message"] = "all workers running";
  event("Normal", "ReplicaRecovered", what);
  if (started) plan_.recoverySeconds = seconds;
}

}  // namespace edit::op::controller
