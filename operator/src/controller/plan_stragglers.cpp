// The planner's straggler policy: the workers' telemetry in the status, the
// StragglerDetected condition, and stragglerPolicy.action Replace.
#include <set>

#include "controller/planner.h"

namespace edit::op::controller {

void Planner::mergeTelemetry() {
  const auto& t = in_.telemetry;
  if (!t.present) return;
  st_["progress"] = t.progress;
  st_["stragglers"] = t.stragglers;
  st_["stragglerCount"] = t.stragglers.size();
  if (!t.lastReportTime.empty()) st_["lastReportTime"] = t.lastReportTime;
  std::set<int> before;
  const json oldStatus = in_.status.is_object() ? in_.status : json::object();
  if (const json* c = findCondition(oldStatus, "StragglerDetected");
      c && c->value("status", "") == "True" && oldStatus.contains("stragglers"))
    for (const auto& s : oldStatus["stragglers"]) before.insert(s.value("rank", -1));
  if (!t.stragglers.empty()) {
    std::string msg = "slow workers:";
    bool fresh = false;
    for (const auto& s : t.stragglers) {
      msg += " rank " + std::to_string(s.value("rank", -1)) + " (" + s.value("pod", "") + ", score " +
             std::to_string(s.value("score", 0.0)).substr(0, 4) + ")";
      if (!before.count(s.value("rank", -1))) fresh = true;
    }
    cond("StragglerDetected", "True", "SlowWorkers", msg);
    if (fresh) event("Warning", "StragglerDetected", msg);
    // Not during a recovery: every step time is distorted while the survivors wait.
    if (spec_->stragglerPolicy.action == "Replace" && phase_ == "Running" && !recovery_)
      for (const auto& s : t.stragglers)
        for (const auto* p : current())
          if (p->rank == s.value("rank", -1) && !p->deleting) replaceStraggler(*p, s.value("node", ""));
  } else if (conditionTrue(st_, "StragglerDetected")) {
    cond("StragglerDetected", "False", "NoStragglers", "no worker over the straggler threshold");
  }
}

// stragglerPolicy.action Replace: the straggler's pod is recreated with an anti-affinity
// to its node. Where a failed rank could be replaced in place, so is the straggler: it
// is killed at once (a SIGTERM would make every rank checkpoint and stop) and its
// replacement joins the running job. Otherwise it is deleted normally and its peers'
// collectives fail: a gang restart from the newest checkpoint.
void Planner::replaceStraggler(const ObservedPod& p, const std::string& reportedNode) {
  // Either way the replacement spends the backoff budget (failure_policy.h).
  if (!mayReplaceStraggler(recovery_.has_value(), budget_)) return;
  const std::string node = p.node.empty() ? reportedNode : p.node;
  plan_.replacedRanks.emplace_back(p.rank, node);
  avoidNode(p.rank, node);
  plan_.podsToDelete.push_back(p.name);
  const std::string why = gangRestartReason(*spec_, phase_, {&p}, nullptr);
  if (!why.empty()) {
    event("Warning", "ReplacingStraggler",
          "deleting straggler " + p.name + " to recreate it away from node " + node + " (gang restart: " + why + ")");
    return;
  }
  if (!recovery_) startRecovery();
  recovery_->add(p);
  st_["recovery"] = recovery_->toJson();
  plan_.recoveredRanks.push_back(p.rank);
  plan_.deleteImmediately = true;
  const std::string what = "replacing straggler rank(s) " + recovery_->rankList() +
                           " in place away from their nodes; the other workers wait for them";
  st_["message"] = what;
  cond("Recovering", "True", "StragglerReplaced", what);
  event("Warning", "ReplacingStraggler",
        "killing straggler " + p.name + " on node " + node + "; its replacement joins the running job in place (in-place recovery " +
            std::to_string(budget_.inPlaceRecoveries) + "; " + budget_.usage() + ")");
  plan_.requeueAfterSeconds = 1;
}

// status.avoidNodes: the rank's pods get a required anti-affinity to the node for the
// rest of the job, across gang restarts (the GangRestart path of a replacement is one)
// and operator restarts. At most one entry per replacement, so backoffLimit bounds it.
void Planner::avoidNode(int rank, const std::string& node) {
  if (node.empty()) return;
  json& list = st_["avoidNodes"];
  if (!list.is_array()) list = json::array();
  for (const auto& e : list)
    if (e.is_object() && e.value("rank", -1) == rank && e.value("node", "") == node) return;
  list.push_back({{"rank", rank}, {"node", node}});
}

}  // namespace edit::op::controller
