// The planner's in-place recovery: failed ranks replaced by pods that join the running
// job (status.recovery, condition Recovering) until every replacement trained a step.
// Which failures may be answered this way: controller/failure_policy.h.
#include <algorithm>

#include "controller/plan_context.h"
#include "util/log.h"

namespace edit::op::controller {

using api::CondStatus;
namespace condition = api::condition;
namespace reason = api::reason;

// A new in-place recovery: one unit of budget (given back when a disruption caused it).
void startRecovery(PlanContext& c) {
  c.st.replicaRecoveries = c.st.replicaRecoveries.value_or(0) + 1;
  c.st.recovery = api::RecoveryStatus{{}, c.now, {}};
}

// Deletes the failed pods (normal grace) and records their ranks, so that createMissing
// recreates them with EDIT_JOIN=1 in the same restart generation.
void replaceInPlace(PlanContext& c, const std::vector<const ObservedPod*>& failed, const std::string& msg) {
  std::vector<int> ranks;
  for (const auto* p : failed) {
    c.st.recovery->add(p->rank, p->uid);
    if (!p->deleting) c.plan.podsToDelete.push_back(p->name);
    c.plan.recoveredRanks.push_back(p->rank);
    ranks.push_back(p->rank);
  }
  const std::string what = "replacing rank(s) " + c.st.recovery->rankList() + " in place; the other workers wait for them";
  c.st.message = what;
  c.cond(condition::Recovering, CondStatus::True, reason::ReplicaFailed, msg + "; " + what);
  const BackoffBudget b = c.budget();
  c.event(api::kWarning, reason::RecoveringReplica,
          msg + "; replacing rank(s) " + rankList(ranks) + " in place (in-place recovery " +
              std::to_string(b.inPlaceRecoveries) + "; " + b.usage() + ")");
  c.plan.requeueAfterSeconds = 1;
}

// Ends a recovery record (done, or superseded by a gang restart, a failure, a suspend).
void clearRecovery(PlanContext& c, const std::string& why, const std::string& msg) {
  c.st.recovery.reset();
  c.endCondition(condition::Recovering, why, msg);
}

// The survivors make no progress until the replacements joined, took their state and
// trained a step; a replacement's start-up (process, rendezvous, state copy) counts from
// when its container started, not from the failure (deleting the failed pod and
// scheduling the new one come first, and on a busy node take a while).
bool recoveryYoungerThanHangTimeout(const PlanContext& c) {
  const auto& recovery = c.st.recovery;
  if (!recovery || c.spec->hangTimeoutSeconds <= 0) return false;
  std::time_t started = log::parseRfc3339(recovery->startTime);
  if (!started) return false;
  for (const auto* p : c.current())
    if (isReplacement(*recovery, *p) && !p->started.empty()) started = std::max(started, log::parseRfc3339(p->started));
  return c.in.now - started < c.spec->hangTimeoutSeconds;
}

// A recovery is over when every rank runs a pod that is not an incarnation it replaces
// (a killed straggler may still be visible, Running, while it is being deleted) and
// every replacement has reported a training step: it joined the rendezvous, took its
// state from its peers and trains again. Running alone says nothing about the join.
void endRecoveryIfRejoined(PlanContext& c, bool allWorkersUp) {
  const api::RecoveryStatus& recovery = *c.st.recovery;
  bool replacementsUp = allWorkersUp;
  for (const auto* p : c.current())
    if (p->deleting || replaces(recovery, *p)) replacementsUp = false;
  if (!replacementsUp) return;
  std::vector<int> waiting;
  long resumedAt = -1;
  for (const auto* p : c.current()) {
    if (!recovery.covers(p->rank)) continue;
    if (auto step = rejoinedAtStep(*p, c.in.telemetry)) resumedAt = std::max(resumedAt, *step);
    else waiting.push_back(p->rank);
  }
  if (!waiting.empty()) {
    c.st.message = "replacement(s) of rank(s) " + rankList(waiting) + " running; waiting for their first training step";
    return;
  }
  const std::time_t started = log::parseRfc3339(recovery.startTime);
  const long seconds = started ? std::max(0L, static_cast<long>(c.in.now - started)) : 0L;
  std::string what = "rank(s) " + recovery.rankList() + " replaced in place; ";
  what += resumedAt >= 0 ? "training again (step " + std::to_string(resumedAt) + " reported) "
                         : "all " + std::to_string(c.spec->worldSize()) + " workers running again ";
  what += std::to_string(seconds) + " s after the failure";
  clearRecovery(c, reason::Recovered, what);  // `recovery` is gone from here on
  c.endCondition(condition::Hung, reason::Recovered, what);
  c.st.message = "all workers running";
  c.event(api::kNormal, reason::ReplicaRecovered, what);
  if (started) c.plan.recoverySeconds = seconds;
}

}  // namespace edit::op::controller
