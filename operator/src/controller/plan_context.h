// The planner behind planReconcile (controller/plan.h), in the manner of JobSet's
// policies: one reconcile's state (PlanContext: the input, the status being planned, the
// plan) and one file of free functions per policy, each pure:
//   plan.cpp            the order the policies run in; the context's helpers
//   plan_lifecycle.cpp  phases, suspend, deadline, success, TTL, clean-up, creating pods
//   plan_failures.cpp   failed, deleted and hung workers: gang restart or in-place recovery
//   plan_recovery.cpp   an in-place recovery: its record, its end
//   plan_stragglers.cpp telemetry in the status, the StragglerDetected condition, Replace
//   plan_scaling.cpp    a change of spec.replicas: in-place scale up or down, the Scaling condition
//   plan_link.cpp       the LinkBound condition: the sync rounds' share of the time, and the fix
// Internal to the controller; nothing outside plan*.cpp includes it.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "controller/failure_policy.h"
#include "controller/plan.h"
#include "controller/recovery.h"

namespace edit::op::controller {

struct PlanContext {
  explicit PlanContext(const PlanInput& input);

  const PlanInput& in;
  const api::EDiTJobStatus before;  // the status as read
  api::EDiTJobStatus st;            // the status being planned
  Plan plan;
  // The spec as the workers run it: spec.replicas replaced by the replicas training now
  // (status.replicas), which differ while a scale is pending or in progress. spec points
  // at it once the job's spec is valid.
  api::EDiTJobSpec running;
  const api::EDiTJobSpec* spec = nullptr;
  std::string now;  // in.now, RFC 3339
  long gen = 0;     // metadata.generation

  api::Phase phase() const { return st.phase; }
  void setPhase(api::Phase p) { st.phase = p; }
  int restartGeneration() const { return st.restartGeneration.value_or(0); }
  // runPolicy.backoffLimit's accounting, from the status's counters.
  BackoffBudget budget() const;
  // Pods of the current restart generation inside the world (ranks beyond it are a scale's
  // new or leaving pods).
  std::vector<const ObservedPod*> current() const;
  void cond(const char* type, api::CondStatus s, const std::string& reason, const std::string& msg) {
    st.setCondition(type, s, reason, msg, now, gen);
  }
  // Sets the condition False only where it holds now (a clean-up that says why it ended).
  void endCondition(const char* type, const std::string& reason, const std::string& msg) {
    if (st.conditionTrue(type)) cond(type, api::CondStatus::False, reason, msg);
  }
  // Sets the condition False where it exists at all.
  void falseIfPresent(const char* type, const std::string& reason, const std::string& msg) {
    if (st.condition(type)) cond(type, api::CondStatus::False, reason, msg);
  }
  void event(const char* type, const std::string& reason, const std::string& msg) {
    plan.events.push_back({type, reason, msg});
  }
  // The world the workers train with: a whole new gang takes spec.replicas.
  void adoptReplicas(int replicas);
  Plan done();
};

// plan_lifecycle.cpp
Plan invalidSpec(PlanContext& c);
void countWorkers(PlanContext& c);
Plan finished(PlanContext& c);
Plan suspended(PlanContext& c);
void resumeIfSuspended(PlanContext& c);
bool oldGangLeft(PlanContext& c);  // false while pods of an older generation remain (deleted first)
bool deadlineExceeded(PlanContext& c);
bool succeeded(PlanContext& c);
void createMissing(PlanContext& c);
void updateRunning(PlanContext& c);
void fail(PlanContext& c, const std::string& reason, const std::string& msg, bool stopRunning);
// Pods of the gang that do not start: the PodsReady condition, runPolicy.scheduleTimeoutSeconds.
// Returns true when the job failed for it.
bool watchPodsStarting(PlanContext& c);

// plan_failures.cpp
void noteDisruptions(PlanContext& c);
bool handleFailures(PlanContext& c);
void clearDisruption(PlanContext& c, const std::string& reason, const std::string& msg);
// The whole gang stops (a restart, or every pod gone): status.stoppedAtStep keeps the step
// it reached, and its telemetry starts afresh.
void noteGangStop(PlanContext& c);

// plan_recovery.cpp
void startRecovery(PlanContext& c);
void replaceInPlace(PlanContext& c, const std::vector<const ObservedPod*>& failed, const std::string& msg);
void clearRecovery(PlanContext& c, const std::string& reason, const std::string& msg);
bool recoveryYoungerThanHangTimeout(const PlanContext& c);
void endRecoveryIfRejoined(PlanContext& c, bool allWorkersUp);

// plan_scaling.cpp
void planScaling(PlanContext& c);
void clearScaling(PlanContext& c, const std::string& reason, const std::string& msg);

// plan_stragglers.cpp
void mergeTelemetry(PlanContext& c);

// plan_link.cpp
void planLink(PlanContext& c);

}  // namespace edit::op::controller
