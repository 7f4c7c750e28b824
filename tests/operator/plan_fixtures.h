// Inputs and readers shared by the planner's unit tests (unit_plan_test.cpp,
// unit_recovery_test.cpp, unit_recovery_disruption_test.cpp).
#pragma once

#include <gtest/gtest.h>

#include <ctime>
#include <optional>
#include <string>

#include "controller/plan.h"

namespace edit::op::controller::plantest {

using nlohmann::json;

inline const std::time_t kNow = 1800000000;

// A job "ns/j" with 2 x 1 workers; specExtra is merged into its spec.
inline PlanInput input(json specExtra = json::object(), json status = json::object()) {
  json spec = {{"image", "i"}, {"replicas", 2}, {"shardsPerReplica", 1}};
  if (specExtra.is_object()) spec.update(specExtra);
  json obj = {{"metadata", {{"name", "j"}, {"namespace", "ns"}, {"uid", "u"}, {"generation", 1}}}, {"spec", spec}};
  PlanInput in;
  in.meta = api::parseMeta(obj);
  in.spec = api::parseSpec(obj);
  in.status = status;
  in.now = kNow;
  return in;
}

inline ObservedPod pod(int rank, const std::string& phase, int gen = 0, std::optional<int> exit = std::nullopt) {
  ObservedPod p;
  p.name = "j-worker-" + std::to_string(rank);
  p.uid = "uid-" + std::to_string(rank) + "-" + std::to_string(gen);
  p.rank = rank;
  p.generation = gen;
  p.phase = phase;
  p.exitCode = exit;
  return p;
}

inline std::string condStatus(const json& st, const std::string& type) {
  const json* c = findCondition(st, type);
  return c ? c->value("status", "") : "";
}
inline std::string condReason(const json& st, const std::string& type) {
  const json* c = findCondition(st, type);
  return c ? c->value("reason", "") : "";
}

// ---- in-place recovery (unit_recovery_test.cpp, unit_recovery_disruption_test.cpp) ----

// The status of a job that is running its first generation.
inline const json kRunning = {{"phase", "Running"}, {"restarts", 0}, {"restartGeneration", 0},
                              {"startTime", "2027-01-15T08:00:00Z"}};

inline bool hasEvent(const Plan& p, const std::string& type, const std::string& reason) {
  for (const auto& e : p.events)
    if (e.type == type && e.reason == reason) return true;
  return false;
}

// A failure that must restart the whole gang: generation bumped, every pod deleted, no record.
inline void expectGangRestart(const Plan& p) {
  EXPECT_TRUE(p.gangRestarted);
  EXPECT_EQ(p.status["restarts"], 1);
  EXPECT_EQ(p.status["restartGeneration"], 1);
  EXPECT_EQ(p.status.value("replicaRecoveries", 0), 0);
  EXPECT_FALSE(p.status.contains("recovery"));
  EXPECT_TRUE(p.recoveredRanks.empty());
}

}  // namespace edit::op::controller::plantest
