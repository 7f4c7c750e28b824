// The planner's failure policy: failed, deleted and hung workers and disruptions, answered
// by an in-place recovery of the lost ranks or a gang restart within runPolicy.backoffLimit
// (the decision table itself: controller/failure_policy.h; the recovery: plan_recovery.cpp).
#include <algorithm>
#include <set>

#include "controller/desired.h"
#include "controller/plan_context.h"

namespace edit::op::controller {

using api::CondStatus;
using api::Phase;
namespace condition = api::condition;
namespace reason = api::reason;

namespace {

std::string rankList(const std::vector<const ObservedPod*>& pods) {
  std::vector<int> ranks;
  for (const auto* p : pods) ranks.push_back(p->rank);
  return controller::rankList(ranks);
}

void restart(PlanContext& c, const std::string& why, const std::string& msg) {
  noteGangStop(c);
  c.st.restarts = c.st.restarts.value_or(0) + 1;
  c.st.restartGeneration = c.restartGeneration() + 1;
  c.setPhase(Phase::Restarting);
  c.st.message = msg;
  c.cond(condition::Restarting, CondStatus::True, why, msg);
  c.falseIfPresent(condition::Running, why, msg);
  clearRecovery(c, reason::GangRestarted, msg);
  clearScaling(c, reason::GangRestarted, msg);
  const BackoffBudget b = c.budget();
  c.event(api::kWarning, reason::Restarting,
          msg + "; restarting the gang (restart " + std::to_string(b.gangRestarts) + "; " + b.usage() + ")");
  for (const auto& p : c.in.pods)
    if (!p.deleting) c.plan.podsToDelete.push_back(p.name);
  c.plan.gangRestarted = true;
  c.plan.requeueAfterSeconds = 1;
}

// A pod of the running gang that someone else deleted (vanished()) is a disruption in
// itself: the operator may never have seen its DisruptionTarget condition (an eviction
// whose pod went before a reconcile looked) or there was none (kubectl delete pod).
void noteDeletedPod(PlanContext& c, const ObservedPod& p) {
  if (c.st.conditionTrue(condition::Disrupted)) return;
  const std::string msg = "pod " + p.name + " was deleted (an eviction, a drain or kubectl delete pod); "
                          "replacing it does not count against runPolicy.backoffLimit";
  c.cond(condition::Disrupted, CondStatus::True, reason::PodDeleted, msg);
  c.event(api::kWarning, reason::Disrupted, msg);
}

// Whether the failure being handled comes from a disruption; if so it is counted in
// status.disruptions (and so not against the budget) and the condition is consumed.
bool consumeDisruption(PlanContext& c, const std::string& what) {
  if (!c.st.conditionTrue(condition::Disrupted)) return false;
  c.st.disruptions = c.st.disruptions.value_or(0) + 1;
  c.cond(condition::Disrupted, CondStatus::False, reason::Handled,
         what + " after the disruption (not counted against runPolicy.backoffLimit)");
  return true;
}

// The failure policy's answer when nothing can be replaced in place.
void restartOrFail(PlanContext& c, FailureResponse response, const std::string& why, std::string msg, bool disrupted) {
  if (response == FailureResponse::FailJob) {
    fail(c, reason::BackoffLimitExceeded, msg + "; " + c.budget().exhaustedMessage(), true);
    return;
  }
  if (disrupted) {
    consumeDisruption(c, "gang restart");
    msg += " after a disruption";
  }
  restart(c, why, msg);
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
// Each stands in as a pod with no phase, already being deleted.
std::vector<ObservedPod> vanished(const PlanContext& c) {
  std::vector<ObservedPod> out;
  if (c.phase() != Phase::Running || c.in.meta.deleting || !gangRestartReason(*c.spec, c.phase(), {}, nullptr).empty())
    return out;
  std::set<int> present;
  bool someStay = false;
  for (const auto* p : c.current()) {
    present.insert(p->rank);
    someStay |= !p->deleting && p->phase == podphase::Running;
  }
  if (!someStay) return out;
  for (int r = 0; r < c.spec->worldSize(); ++r) {
    if (present.count(r) || (c.st.recovery && c.st.recovery->covers(r))) continue;
    ObservedPod gone;
    gone.name = podName(c.in.meta.name, r);
    gone.rank = r;
    gone.generation = c.restartGeneration();
    gone.deleting = true;  // nothing left to delete
    out.push_back(gone);
  }
  return out;
}

void handleFailedWorkers(PlanContext& c, const std::vector<const ObservedPod*>& failed) {
  std::string msg = describeExits(failed);
  const auto* active = c.st.recovery ? &*c.st.recovery : nullptr;
  const std::string why = gangRestartReason(*c.spec, c.phase(), failed, active);
  const bool disrupted = causedByDisruption(failed, c.st.conditionTrue(condition::Disrupted));
  const FailureResponse response = respondToFailedWorkers(why, c.st.recovery.has_value(), disrupted, c.budget());
  if (response == FailureResponse::JoinRecovery) {
    replaceInPlace(c, failed, msg);
    return;
  }
  if (response == FailureResponse::StartRecovery) {
    startRecovery(c);
    if (disrupted) consumeDisruption(c, "in-place recovery");
    replaceInPlace(c, failed, msg);
    return;
  }
  if (!why.empty()) msg += "; gang restart: " + why;
  restartOrFail(c, response, reason::WorkerFailed, msg, disrupted);
}

// A hang where some workers fell silent (no report, not even a heartbeat, for half the
// hang timeout) while the others kept reporting: the silent ones are stopped or frozen,
// the others wait for them in a collective. Killing the silent pods breaks those
// collectives at once and the rest recover in place around their replacements. Without
// such a split (every worker silent, or every one alive: a deadlock) the gang restarts.
// longest: the longest silence among them, in seconds.
void replaceSilentInPlace(PlanContext& c, const std::vector<const ObservedPod*>& silent, double longest,
                          const std::string& msg) {
  const std::string who = "rank(s) " + rankList(silent) + " sent nothing for " +
                          std::to_string(static_cast<long>(longest)) + " s while the others kept reporting";
  c.cond(condition::Hung, CondStatus::True, reason::WorkerUnresponsive, msg + "; " + who);
  c.event(api::kWarning, reason::Hung, msg + "; " + who);
  startRecovery(c);
  for (const auto* p : silent) {
    c.st.recovery->add(p->rank, p->uid);
    c.plan.podsToDelete.push_back(p->name);
    c.plan.recoveredRanks.push_back(p->rank);
  }
  const std::string what = "killing unresponsive rank(s) " + c.st.recovery->rankList() +
                           " and replacing them in place; the other workers wait for them";
  c.st.message = what;
  c.cond(condition::Recovering, CondStatus::True, reason::WorkerUnresponsive, what);
  const BackoffBudget b = c.budget();
  c.event(api::kWarning, reason::RecoveringReplica,
          who + "; " + what + " (in-place recovery " + std::to_string(b.inPlaceRecoveries) + "; " + b.usage() + ")");
  c.plan.deleteImmediately = true;  // a stopped process cannot act on SIGTERM
  c.plan.requeueAfterSeconds = 1;
}

bool handleHang(PlanContext& c) {
  // The survivors of a recovery make no progress while they wait for the replacement.
  if (recoveryYoungerThanHangTimeout(c)) return false;
  const std::string msg = "no training progress for hangTimeoutSeconds=" + std::to_string(c.spec->hangTimeoutSeconds);
  double longest = 0;
  const auto silent = silentPods(c.current(), c.in.telemetry, c.spec->hangTimeoutSeconds, &longest);
  if (silent.empty() && !c.in.telemetry.hungPastRecovery) {
    // Every worker alive and reporting, none training: a cut between replicas or a
    // deadlock. The workers' collectives time out and they recover in place by
    // themselves (docs/replica-recovery.md, "A network partition"); a gang restart now
    // would throw that away. Say so, and wait for the window.
    const std::string wait = msg + "; every worker still reports, so the gang restarts only after " +
                             std::to_string(std::max(c.spec->hangTimeoutSeconds, runtimeRecoverySeconds(*c.spec))) +
                             " s without progress, unless the workers recover in place first "
                             "(runtime.collectiveTimeoutSeconds, then runtime.rendezvousTimeoutSeconds)";
    if (!c.st.conditionTrue(condition::Hung)) c.event(api::kWarning, reason::Hung, wait);
    c.cond(condition::Hung, CondStatus::True, reason::NoProgress, wait);
    return false;
  }
  const bool silentReplaceable = !silent.empty() && gangRestartReason(*c.spec, c.phase(), silent, nullptr).empty();
  const FailureResponse response = respondToHang(silentReplaceable, c.st.recovery.has_value(), c.budget());
  if (response == FailureResponse::StartRecovery) {
    replaceSilentInPlace(c, silent, longest, msg);
    return true;
  }
  const std::string why =
      silent.empty() ? "no training progress for " + std::to_string(std::max(c.spec->hangTimeoutSeconds, runtimeRecoverySeconds(*c.spec))) +
                           " s (hangTimeoutSeconds=" + std::to_string(c.spec->hangTimeoutSeconds) +
                           "; every worker kept reporting, and their own recovery had its time)"
                     : msg;
  c.cond(condition::Hung, CondStatus::True, reason::NoProgress, why);
  c.event(api::kWarning, reason::Hung, why);
  // Its workers are stuck (in a collective, or stopped): SIGTERM cannot make them
  // checkpoint, so waiting out the grace period only delays the restart.
  c.plan.deleteImmediately = true;
  restartOrFail(c, response, reason::Hung, why, false);
  return true;
}

// No report from any worker, not even a heartbeat, while their pods run: the operator
// cannot tell a hang from a cut between the workers and itself (or its own restart, or a
// slow operator). That is a condition and an event, never a restart: a real hang shows
// as reports without progress, or as some workers silent while the others report.
// Returns whether telemetry is lost now.
bool telemetryLost(PlanContext& c) {
  const auto& t = c.in.telemetry;
  const double after = std::max(c.spec->hangTimeoutSeconds / 2.0, 3.0 * heartbeatSeconds(*c.spec));
  const bool lost = c.phase() == Phase::Running && t.present && t.quietSeconds > after;
  if (!lost) {
    if (t.present && t.quietSeconds <= after)
      c.endCondition(condition::TelemetryLost, reason::ReportsResumed, "the workers' reports arrive again");
    return false;
  }
  const std::string msg = "no telemetry from any of the " + std::to_string(c.spec->worldSize()) + " workers for " +
                          std::to_string(static_cast<long>(t.quietSeconds)) +
                          " s while their pods run: the network between the workers and the operator, or the "
                          "operator, is at fault, or every worker is frozen; hang detection waits for reports "
                          "(no restart without them)";
  if (!c.st.conditionTrue(condition::TelemetryLost)) c.event(api::kWarning, reason::NoReports, msg);
  // The message's seconds would change every reconcile: it keeps the first.
  if (!c.st.conditionTrue(condition::TelemetryLost))
    c.cond(condition::TelemetryLost, CondStatus::True, reason::NoReports, msg);
  return true;
}

}  // namespace

// Records a disruption of a current pod in the Disrupted condition, so that the failures
// it causes later (its worker leaves with exit 76, or in a synchronous phase every worker
// checkpoints and exits 143) are still recognized once the evicted pod is gone.
void noteDisruptions(PlanContext& c) {
  if (c.st.conditionTrue(condition::Disrupted)) return;
  for (const auto* p : c.current()) {
    if (p->disruption.empty()) continue;
    const std::string msg = "pod " + p->name + " is being taken away (" + p->disruption +
                            "); the recovery or restart it causes (workers leaving with exit 76 or stopping "
                            "with exit 143) does not count against runPolicy.backoffLimit";
    c.cond(condition::Disrupted, CondStatus::True, p->disruption, msg);
    c.event(api::kWarning, reason::Disrupted, msg);
    return;
  }
}

bool handleFailures(PlanContext& c) {
  std::vector<const ObservedPod*> failed;  // failures not acted on yet
  for (const auto* p : c.current()) {
    if (p->phase != podphase::Failed) continue;
    if (c.st.recovery && replaces(*c.st.recovery, *p)) {
      // Already being replaced: repeat the delete (idempotent) in case the last one was lost.
      if (!p->deleting) c.plan.podsToDelete.push_back(p->name);
      continue;
    }
    failed.push_back(p);
  }
  if (const auto permanent = permanentFailure(failed, checkpointDir(JobRef{c.in.meta, *c.spec}))) {
    fail(c, permanent->reason, permanent->message, true);
    return true;
  }
  const std::vector<ObservedPod> gone = vanished(c);
  for (const auto& p : gone) {
    failed.push_back(&p);
    noteDeletedPod(c, p);
  }
  if (!failed.empty()) {
    handleFailedWorkers(c, failed);
    return true;
  }
  if (telemetryLost(c)) return false;
  if (c.in.telemetry.hung && c.phase() == Phase::Running) return handleHang(c);
  // Progress again after a wait for the workers' own recovery (handleHang).
  if (c.phase() == Phase::Running && c.in.telemetry.present && !c.in.telemetry.hung) {
    const auto* hung = c.st.condition(condition::Hung);
    if (hung && hung->status == CondStatus::True && hung->reason == reason::NoProgress)
      c.cond(condition::Hung, CondStatus::False, reason::Progressing, "training progresses again");
  }
  return false;
}

void noteGangStop(PlanContext& c) {
  long reached = c.before.progress ? c.before.progress->step : 0;
  if (c.in.telemetry.present) reached = std::max(reached, c.in.telemetry.progress.step);
  if (reached > 0 && !c.st.stoppedAtStep) c.st.stoppedAtStep = reached;
  c.plan.resetTelemetry = true;
}

void clearDisruption(PlanContext& c, const std::string& why, const std::string& msg) {
  c.endCondition(condition::Disrupted, why, msg);
}

}  // namespace edit::op::controller
