// The controller's decisions as a pure function: from the job (spec, current status),
// the pods it owns and the telemetry view to the new status plus the actions to take.
// Level-triggered: the same inputs always give the same plan, so a re-run is harmless.
// What it observes: controller/observed.h; how it answers failures: controller/failure_policy.h;
// the planner, one file per policy: controller/planner.h.
#pragma once

#include <ctime>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "api/editjob.h"
#include "controller/observed.h"

namespace edit::op::controller {

using nlohmann::json;

// status.avoidNodes as rank -> nodes its pods must not use (entries that do not parse are
// skipped: the status is ours, but a user may have edited it).
std::map<int, std::set<std::string>> avoidNodesFromStatus(const json& status);

struct PlannedEvent {
  std::string type;   // Normal | Warning
  std::string reason;
  std::string message;
};

struct Plan {
  json status;                       // the status to store
  bool ensureChildren = false;       // ConfigMap, Secret, Service, PodGroup must exist (the PodGroup's
                                     // minMember the size of `replicas`)
  std::vector<int> ranksToCreate;    // in the current restartGeneration
  std::vector<int> joiningRanks;     // of ranksToCreate: replacements that join the running job (EDIT_JOIN=1)
  std::vector<int> recoveredRanks;   // ranks whose failed pods this plan starts to replace in place
  std::vector<std::string> podsToDelete;
  bool deleteImmediately = false;    // a hung gang cannot checkpoint: no grace period
  bool deleteJob = false;            // TTL after finish expired
  bool gangRestarted = false;        // restartGeneration was bumped in this plan
  bool gangCreated = false;          // a whole gang is being created
  std::vector<std::pair<int, std::string>> replacedRanks;  // straggler (rank, node) being replaced (also in status.avoidNodes)
  std::optional<long> recoverySeconds;  // a recovery ended in this plan: failure to rejoin, seconds
  std::optional<long> requeueAfterSeconds;
  std::vector<PlannedEvent> events;
  // In-place scaling (controller/plan_scaling.cpp).
  int replicas = 0;                 // replicas the workers train with (status.replicas): the pods' world
  std::vector<int> scaleJoinRanks;  // pods of a scale-up's new replicas to create (EDIT_JOIN=scale)
  int scaleTo = 0;                  // the replicas of the world those pods enter
  std::optional<int> scaleRequest;  // ask the workers (rank 0, over telemetry) to scale to this many replicas
  std::vector<int> leftRanks;       // ranks that left the job at a scale-down that finished in this plan
  struct ScaleEnd {
    std::string result;  // Succeeded | Abandoned
    double seconds = 0;
  };
  std::optional<ScaleEnd> scaleEnded;
};

struct PlanInput {
  api::JobMeta meta;
  std::optional<api::EDiTJobSpec> spec;  // nullopt: invalid, see specError
  std::string specError;
  json status = json::object();
  std::vector<ObservedPod> pods;         // pods owned by the job (any generation)
  TelemetryView telemetry;
  std::time_t now = 0;
};

Plan planReconcile(const PlanInput& in);

// Sets a condition; keeps lastTransitionTime when the status did not flip. Returns true
// when anything changed.
bool setCondition(json& status, const std::string& type, const std::string& condStatus, const std::string& reason,
                  const std::string& message, const std::string& now, long observedGeneration);
const json* findCondition(const json& status, const std::string& type);

}  // namespace edit::op::controller
