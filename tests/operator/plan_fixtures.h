// Inputs and readers shared by the planner's unit tests (unit_plan_test.cpp,
// unit_recovery_test.cpp, unit_recovery_disruption_test.cpp).
#pragma once

#include <gtest/gtest.h>

#include <ctime>
#include <optional>
#include <map>
#include <set>
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

// The status as the API server stores it (what kubectl shows): the planner's output as
// JSON; an input status (already JSON) as it is.
inline json js(const api::EDiTJobStatus& s) { return s.toJson(); }
inline const json& js(const json& s) { return s; }

// A condition of a JSON status, by value (nullopt: none).
inline std::optional<json> findCondition(const json& st, const std::string& type) {
  if (!st.contains("conditions")) return std::nullopt;
  for (const auto& c : st["conditions"])
    if (c.value("type", "") == type) return c;
  return std::nullopt;
}
// Sets a condition in a JSON status (an input of the planner).
inline bool setCondition(json& st, const std::string& type, const std::string& status, const std::string& reason,
                         const std::string& message, const std::string& now, long generation) {
  auto typed = api::EDiTJobStatus::fromJson(st);
  const auto s = status == "True" ? api::CondStatus::True : status == "False" ? api::CondStatus::False : api::CondStatus::Unknown;
  const bool changed = typed.setCondition(type, s, reason, message, now, generation);
  st = typed.toJson();
  return changed;
}
inline std::map<int, std::set<std::string>> avoidNodesFromStatus(const json& st) {
  return avoidNodesByRank(api::EDiTJobStatus::fromJson(st));
}

inline std::string condStatus(const json& st, const std::string& type) {
  const auto c = findCondition(st, type);
  return c ? c->value("status", "") : "";
}
inline std::string condReason(const json& st, const std::string& type) {
  const auto c = findCondition(st, type);
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
  EXPECT_EQ(js(p.status)["restarts"], 1);
  EXPECT_EQ(js(p.status)["restartGeneration"], 1);
  EXPECT_EQ(js(p.status).value("replicaRecoveries", 0), 0);
  EXPECT_FALSE(js(p.status).contains("recovery"));
  EXPECT_TRUE(p.recoveredRanks.empty());
}

}  // namespace edit::op::controller::plantest
