// The planner's straggler policy: the workers' telemetry in the status, the
// StragglerDetected condition, and stragglerPolicy.action Replace.
#include <set>

#include "controller/desired.h"
#include "controller/plan_context.h"

namespace edit::op::controller {

using api::CondStatus;
namespace condition = api::condition;
namespace reason = api::reason;

namespace {

// status.avoidNodes: the rank's pods get a required anti-affinity to the node for the
// rest of the job, across gang restarts (the GangRestart path of a replacement is one)
// and operator restarts. At most one entry per replacement, so backoffLimit bounds it.
void avoidNode(PlanContext& c, int rank, const std::string& node) {
  if (node.empty()) return;
  for (const auto& e : c.st.avoidNodes)
    if (e.rank == rank && e.node == node) return;
  c.st.avoidNodes.push_back({rank, node});
}

// stragglerPolicy.action Replace: the straggler's pod is recreated with an anti-affinity
// to its node. Where a failed rank could be replaced in place, so is the straggler: it
// is killed at once (a SIGTERM would make every rank checkpoint and stop) and its
// replacement joins the running job. Otherwise it is deleted normally and its peers'
// collectives fail: a gang restart from the newest checkpoint.
void replaceStraggler(PlanContext& c, const ObservedPod& p, const std::string& reportedNode) {
  // Either way the replacement spends the backoff budget (failure_policy.h).
  if (!mayReplaceStraggler(c.st.recovery.has_value(), c.budget())) return;
  const std::string node = p.node.empty() ? reportedNode : p.node;
  c.plan.replacedRanks.emplace_back(p.rank, node);
  avoidNode(c, p.rank, node);
  c.plan.podsToDelete.push_back(p.name);
  const std::string why = gangRestartReason(*c.spec, c.phase(), {&p}, nullptr);
  if (!why.empty()) {
    c.event(api::kWarning, reason::ReplacingStraggler,
            "deleting straggler " + p.name + " to recreate it away from node " + node + " (gang restart: " + why + ")");
    return;
  }
  if (!c.st.recovery) startRecovery(c);
  c.st.recovery->add(p.rank, p.uid);
  c.plan.recoveredRanks.push_back(p.rank);
  c.plan.deleteImmediately = true;
  const std::string what = "replacing straggler rank(s) " + c.st.recovery->rankList() +
                           " in place away from their nodes; the other workers wait for them";
  c.st.message = what;
  c.cond(condition::Recovering, CondStatus::True, reason::StragglerReplaced, what);
  const BackoffBudget b = c.budget();
  c.event(api::kWarning, reason::ReplacingStraggler,
          "killing straggler " + p.name + " on node " + node +
              "; its replacement joins the running job in place (in-place recovery " +
              std::to_string(b.inPlaceRecoveries) + "; " + b.usage() + ")");
  c.plan.requeueAfterSeconds = 1;
}

}  // namespace

void mergeTelemetry(PlanContext& c) {
  const auto& t = c.in.telemetry;
  if (!t.present) return;
  // Not in the reconcile that stopped the gang: its telemetry is still the stopped gang's.
  if (c.st.stoppedAtStep && t.lowestStep > 0 && !c.plan.resetTelemetry) {
    // The new gang's first reports: a worker reports after a step, so resuming from the
    // stop's own checkpoint reports stoppedAtStep + 1 at most. The lowest step since the
    // reset, not the newest progress: a reconcile may come only after several steps.
    const long resumed = t.lowestStep - 1;
    const long lost = *c.st.stoppedAtStep - resumed;
    if (lost > 1) {
      const long g = terminationGraceSeconds(JobRef{c.in.meta, *c.spec});
      c.event(api::kWarning, reason::ResumedFromOlderCheckpoint,
              "the workers resumed at step " + std::to_string(resumed) + ", " + std::to_string(lost) +
                  " steps before step " + std::to_string(*c.st.stoppedAtStep) +
                  " that the stopped gang reached: its newest complete checkpoint is older than the stop (a "
                  "checkpoint on SIGTERM needs the pods' terminationGracePeriodSeconds, " + std::to_string(g) +
                  " s here; checkpoint.everySteps bounds what a crash costs)");
    }
    c.st.stoppedAtStep.reset();
  }
  c.st.progress = t.progress;
  c.st.stragglers = t.stragglers;
  c.st.stragglerCount = static_cast<int>(t.stragglers.size());
  if (!t.lastReportTime.empty()) c.st.lastReportTime = t.lastReportTime;
  std::set<int> before;
  if (c.before.conditionTrue(condition::StragglerDetected) && c.before.stragglers)
    for (const auto& s : *c.before.stragglers) before.insert(s.rank);
  if (!t.stragglers.empty()) {
    std::string msg = "slow workers:";
    bool fresh = false;
    for (const auto& s : t.stragglers) {
      msg += " rank " + std::to_string(s.rank) + " (" + s.pod + ", score " + std::to_string(s.score).substr(0, 4) + ")";
      if (!before.count(s.rank)) fresh = true;
    }
    c.cond(condition::StragglerDetected, CondStatus::True, reason::SlowWorkers, msg);
    if (fresh) c.event(api::kWarning, reason::StragglerDetected, msg);
    // Not during a recovery: every step time is distorted while the survivors wait.
    if (c.spec->stragglerPolicy.action == "Replace" && c.phase() == api::Phase::Running && !c.st.recovery)
      for (const auto& s : t.stragglers)
        for (const auto* p : c.current())
          if (p->rank == s.rank && !p->deleting) replaceStraggler(c, *p, s.node);
  } else {
    c.endCondition(condition::StragglerDetected, reason::NoStragglers, "no worker over the straggler threshold");
  }
}

}  // namespace edit::op::controller
