// The controller's decisions as a pure function: from the job (spec, current status),
// the pods it owns and the telemetry view to the new status plus the actions to take.
// Level-triggered: the same inputs always give the same plan, so a re-run is harmless.
#pragma once

#include <ctime>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "api/editjob.h"
#include "exit_codes.h"

namespace edit::op::controller {

using nlohmann::json;

struct ObservedPod {
  std::string name;
  std::string uid;
  int rank = -1;
  int generation = 0;        // edit.io/restart-generation label
  std::string phase;         // Pending | Running | Succeeded | Failed | Unknown
  bool deleting = false;
  std::optional<int> exitCode;
  std::string node;
  std::string reason;        // terminated reason or pod status reason
  std::string message;       // the container's termination message (edit-train: why it failed)
  // Set when the pod is being taken away rather than failing on its own: its
  // DisruptionTarget condition (eviction, node drain, preemption, taint) or a kubelet
  // eviction (status.reason Evicted). Such a failure does not spend backoffLimit.
  std::string disruption;    // e.g. "EvictionByEvictionAPI"; "" when none
  std::string started;       // RFC 3339: when its (first) container last started running; "" if not running
};

ObservedPod observePod(const json& pod);

// Exit codes (common/src/exit_codes.h): a permanent one (2, 3, 126, 127) fails the job.
// Everything else (crash, OOM kill 137, preemption 143) is retried: by replacing the
// failed ranks in place where runPolicy.replicaRecovery allows it (controller/recovery.h),
// else by a gang restart from the newest checkpoint.

// status.avoidNodes as rank -> nodes its pods must not use (entries that do not parse are
// skipped: the status is ours, but a user may have edited it).
std::map<int, std::set<std::string>> avoidNodesFromStatus(const json& status);

struct TelemetryView {
  bool present = false;
  json progress = json::object();          // status.progress
  json stragglers = json::array();         // status.stragglers
  std::string lastReportTime;              // RFC 3339
  bool hung = false;
  struct RankReport {
    std::string podUid;  // pod that sent the rank's newest report ("" if the worker does not say)
    long step = 0;
    double silentSeconds = 0;  // since its newest report or heartbeat
  };
  std::map<int, RankReport> ranks;         // newest report of each rank
};

struct PlannedEvent {
  std::string type;   // Normal | Warning
  std::string reason;
  std::string message;
};

struct Plan {
  json status;                       // the status to store
  bool ensureChildren = false;       // ConfigMap, Secret, Service, PodGroup must exist
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
