// The controller's decisions as a pure function: from the job (spec, current status),
// the pods it owns and the telemetry view to the new status plus the actions to take.
// Level-triggered: the same inputs always give the same plan, so a re-run is harmless.
// What it observes: controller/observed.h; how it answers failures: controller/failure_policy.h;
// the policies, one file each: controller/plan_context.h.
#pragma once

#include <ctime>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "api/editjob.h"
#include "api/status.h"
#include "controller/observed.h"

namespace edit::op::controller {

using nlohmann::json;

// status.avoidNodes as rank -> nodes its pods must not use.
std::map<int, std::set<std::string>> avoidNodesByRank(const api::EDiTJobStatus& status);

struct PlannedEvent {
  std::string type;   // Normal | Warning
  std::string reason;
  std::string message;
};

// One reconcile's decisions. The reconciler stores the status first (once), then carries
// out the rest, one applier per group (controller/reconciler.cpp).
struct Plan {
  api::EDiTJobStatus status;         // the status to store
  std::vector<PlannedEvent> events;
  int replicas = 0;                  // replicas the workers train with (status.replicas): the pods' world
  std::optional<long> requeueAfterSeconds;

  // Telemetry and metrics (applyTelemetry).
  bool gangRestarted = false;        // restartGeneration was bumped in this plan
  bool resetTelemetry = false;       // the whole gang stops: its reports no longer count
  std::vector<int> recoveredRanks;   // ranks whose failed pods this plan starts to replace in place
  std::vector<std::pair<int, std::string>> replacedRanks;  // straggler (rank, node) being replaced (also in status.avoidNodes)
  std::vector<int> leftRanks;        // ranks that left the job at a scale-down that finished in this plan
  std::optional<int> scaleRequest;   // ask the workers (rank 0, over telemetry) to scale to this many replicas
  std::optional<long> recoverySeconds;  // a recovery ended in this plan: failure to rejoin, seconds
  struct ScaleEnd {
    std::string result;  // Succeeded | Abandoned
    double seconds = 0;
  };
  std::optional<ScaleEnd> scaleEnded;

  // Deletions (applyDeletes).
  std::vector<std::string> podsToDelete;
  bool deleteImmediately = false;    // a hung gang cannot checkpoint: no grace period
  bool deleteJob = false;            // TTL after finish expired

  // Creations (applyCreates), in the current restartGeneration.
  bool ensureChildren = false;       // ConfigMap, Secret, Service, PodGroup must exist (the PodGroup's
                                     // minMember the size of `replicas`)
  std::vector<int> ranksToCreate;
  std::vector<int> joiningRanks;     // of ranksToCreate: replacements that join the running job (EDIT_JOIN=1)
  bool gangCreated = false;          // a whole gang is being created
  std::vector<int> scaleJoinRanks;   // pods of a scale-up's new replicas to create (EDIT_JOIN=scale)
  int scaleTo = 0;                   // the replicas of the world those pods enter
};

struct PlanInput {
  api::JobMeta meta;
  std::optional<api::EDiTJobSpec> spec;  // nullopt: invalid, see specError
  std::string specError;
  json status = json::object();          // as read from the API server
  std::vector<ObservedPod> pods;         // pods owned by the job (any generation)
  TelemetryView telemetry;
  std::time_t now = 0;
  // The API's refusal of the job's last pod create (quota, Pod Security, ...), until a
  // create succeeds; "" when none.
  std::string createError;
};

Plan planReconcile(const PlanInput& in);

}  // namespace edit::op::controller
