// The planner behind planReconcile (controller/plan.h): one object per reconcile that
// reads the job's status, pods and telemetry and writes the new status and the plan. Its
// policies live in one file each:
//   plan.cpp            the lifecycle: phases, suspend, deadline, success, TTL, creating pods
//   plan_failures.cpp   failed, deleted and hung workers: gang restart or in-place recovery
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

inline bool conditionTrue(const json& status, const std::string& type) {
  const json* c = findCondition(status, type);
  return c && c->value("status", "") == "True";
}

class Planner {
 public:
  explicit Planner(const PlanInput& in);
  Plan run();

 private:
  // plan.cpp: the lifecycle
  Plan done();
  std::vector<const ObservedPod*> current() const;
  void countWorkers();
  Plan invalid();
  void cleanup(bool forceRunning);
  void scheduleTtl();
  Plan finished();
  Plan suspended();
  void fail(const std::string& reason, const std::string& msg, bool stopRunning);
  bool deadlineExceeded();
  bool succeeded();
  void createMissing();
  void updateRunning();
  void setPhase(const std::string& p) {
    phase_ = p;
    st_["phase"] = p;
  }
  void cond(const std::string& type, const std::string& s, const std::string& reason, const std::string& msg) {
    setCondition(st_, type, s, reason, msg, now_, gen_);
  }
  void event(const std::string& type, const std::string& reason, const std::string& msg) {
    plan_.events.push_back({type, reason, msg});
  }

  // plan_failures.cpp: failures, hangs, disruptions, gang restarts, in-place recovery
  void restart(const std::string& reason, const std::string& msg);
  void noteDisruptions();
  void noteDeletedPod(const ObservedPod& p);
  bool consumeDisruption(const std::string& what);
  bool handleFailures();
  void handleFailedWorkers(const std::vector<const ObservedPod*>& failed);
  bool handleHang();
  void restartOrFail(FailureResponse response, const std::string& reason, std::string msg, bool disrupted);
  void startRecovery();
  std::vector<const ObservedPod*> vanished();
  void replaceSilentInPlace(const std::vector<const ObservedPod*>& silent, double longest, const std::string& msg);
  void replaceInPlace(const std::vector<const ObservedPod*>& failed, const std::string& msg);
  void clearDisruption(const std::string& reason, const std::string& msg);
  bool recoveryYoungerThanHangTimeout() const;
  void clearRecovery(const std::string& reason, const std::string& msg);
  void endRecoveryIfRejoined(bool allWorkersUp);

  // plan_scaling.cpp: changes of spec.replicas
  void adoptReplicas(int replicas);
  void planScaling();
  const char* whyNotInPlace() const;
  void startScale(int to);
  void scaleUp(int from, int to);
  void scaleDown(int from, int to);
  void requestScale(int to);
  void finishScale(int from, int to, const std::vector<int>& leftRanks);
  void abandonScale(int from, int to, const std::string& why);
  void clearScaling(const std::string& reason, const std::string& msg);
  void deleteStrays(int joinersUpTo);

  // plan_stragglers.cpp: telemetry and stragglers
  void mergeTelemetry();
  void replaceStraggler(const ObservedPod& p, const std::string& reportedNode);
  void avoidNode(int rank, const std::string& node);

  // plan_link.cpp: is the sync group's link the bottleneck
  void planLink();

  const PlanInput& in_;
  json st_;
  Plan plan_;
  // The spec as the workers run it: spec.replicas replaced by the replicas training now
  // (status.replicas), which differ while a scale is pending or in progress.
  api::EDiTJobSpec running_;
  const api::EDiTJobSpec* spec_ = nullptr;
  std::string now_;
  long gen_ = 0;
  std::string phase_;
  int restartGen_ = 0;
  BackoffBudget budget_;                    // status.restarts, replicaRecoveries, disruptions
  std::optional<RecoveryRecord> recovery_;  // status.recovery: ranks being replaced in place
  std::vector<ObservedPod> vanished_;       // current ranks without a pod (vanished())
};

}  // namespace edit::op::controller
