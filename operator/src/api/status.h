// EDiTJob .status as the operator reads and writes it: the phases, the condition types and
// reasons by name, and one typed struct with fromJson/toJson. An optional member is a
// field the status may lack, so a status goes through fromJson and toJson unchanged
// (the reconciler writes it only when it changed). The CRD's status schema describes the
// same fields (crds/editjob.yaml).
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace edit::op::api {

enum class Phase { Unset, Pending, Created, Running, Restarting, Succeeded, Failed, Suspended };
// Every phase a job can be in (Unset is a job not yet seen), in the CRD's order.
inline constexpr Phase kPhases[] = {Phase::Pending,    Phase::Created,   Phase::Running,  Phase::Restarting,
                                    Phase::Succeeded,  Phase::Failed,    Phase::Suspended};
const char* phaseName(Phase p);  // "" for Unset
Phase parsePhase(const std::string& name);  // Unset for anything else
inline bool isFinished(Phase p) { return p == Phase::Succeeded || p == Phase::Failed; }

// Condition types (the CRD's status.conditions names each).
namespace condition {
inline constexpr const char* Created = "Created";
inline constexpr const char* Running = "Running";
inline constexpr const char* Restarting = "Restarting";
inline constexpr const char* Recovering = "Recovering";
inline constexpr const char* Scaling = "Scaling";
inline constexpr const char* Succeeded = "Succeeded";
inline constexpr const char* Failed = "Failed";
inline constexpr const char* Suspended = "Suspended";
inline constexpr const char* StragglerDetected = "StragglerDetected";
inline constexpr const char* Hung = "Hung";
inline constexpr const char* Disrupted = "Disrupted";
inline constexpr const char* Exported = "Exported";
inline constexpr const char* LinkBound = "LinkBound";
inline constexpr const char* PodsReady = "PodsReady";
inline constexpr const char* TelemetryLost = "TelemetryLost";
}  // namespace condition
// Every condition type, for the CRD and README checks (tests/packaging/check_crd.py reads this list).
inline constexpr const char* kConditionTypes[] = {
    condition::Created, condition::Running, condition::Restarting, condition::Recovering, condition::Scaling,
    condition::Succeeded, condition::Failed, condition::Suspended, condition::StragglerDetected, condition::Hung,
    condition::Disrupted, condition::Exported, condition::LinkBound, condition::PodsReady, condition::TelemetryLost};

// Reasons of conditions and events (an event's reason is often the condition's).
namespace reason {
// lifecycle
inline constexpr const char* InvalidSpec = "InvalidSpec";
inline constexpr const char* GangCreated = "GangCreated";
inline constexpr const char* GangRecreated = "GangRecreated";
inline constexpr const char* GangRestarted = "GangRestarted";
inline constexpr const char* Created = "Created";
inline constexpr const char* Running = "Running";
inline constexpr const char* AllWorkersRunning = "AllWorkersRunning";
inline constexpr const char* AllWorkersSucceeded = "AllWorkersSucceeded";
inline constexpr const char* Succeeded = "Succeeded";
inline constexpr const char* Completed = "Completed";
inline constexpr const char* Suspended = "Suspended";
inline constexpr const char* Resumed = "Resumed";
inline constexpr const char* DeadlineExceeded = "DeadlineExceeded";
// failures
inline constexpr const char* WorkerFailed = "WorkerFailed";
inline constexpr const char* Restarting = "Restarting";
inline constexpr const char* BackoffLimitExceeded = "BackoffLimitExceeded";
inline constexpr const char* PermanentError = "PermanentError";
inline constexpr const char* TrainingStalled = "TrainingStalled";
inline constexpr const char* CheckpointStorageFull = "CheckpointStorageFull";
inline constexpr const char* ResumedFromOlderCheckpoint = "ResumedFromOlderCheckpoint";
inline constexpr const char* Hung = "Hung";
inline constexpr const char* NoProgress = "NoProgress";
inline constexpr const char* WorkerUnresponsive = "WorkerUnresponsive";
inline constexpr const char* Disrupted = "Disrupted";
inline constexpr const char* PodDeleted = "PodDeleted";
inline constexpr const char* Handled = "Handled";
inline constexpr const char* Progressing = "Progressing";
// telemetry
inline constexpr const char* NoReports = "NoReports";
inline constexpr const char* ReportsResumed = "ReportsResumed";
// pods that do not start (PodsReady); the pods' own reasons are used as they are
inline constexpr const char* PodsStarted = "PodsStarted";
inline constexpr const char* ScheduleTimeout = "ScheduleTimeout";
// in-place recovery
inline constexpr const char* ReplicaFailed = "ReplicaFailed";
inline constexpr const char* RecoveringReplica = "RecoveringReplica";
inline constexpr const char* ReplicaRecovered = "ReplicaRecovered";
inline constexpr const char* Recovered = "Recovered";
// stragglers and the link
inline constexpr const char* SlowWorkers = "SlowWorkers";
inline constexpr const char* NoStragglers = "NoStragglers";
inline constexpr const char* StragglerDetected = "StragglerDetected";
inline constexpr const char* StragglerReplaced = "StragglerReplaced";
inline constexpr const char* ReplacingStraggler = "ReplacingStraggler";
inline constexpr const char* SyncRoundsBlockTraining = "SyncRoundsBlockTraining";
inline constexpr const char* LinkKeepsUp = "LinkKeepsUp";
inline constexpr const char* LinkBound = "LinkBound";
// scaling
inline constexpr const char* ScalingUp = "ScalingUp";
inline constexpr const char* ScalingDown = "ScalingDown";
inline constexpr const char* ScalingStarted = "ScalingStarted";
inline constexpr const char* Scaled = "Scaled";
inline constexpr const char* ScaleAbandoned = "ScaleAbandoned";
inline constexpr const char* AppliesAtRestart = "AppliesAtRestart";
inline constexpr const char* Cancelled = "Cancelled";
inline constexpr const char* Invalid = "Invalid";
// export
inline constexpr const char* Exporting = "Exporting";
inline constexpr const char* ExportRetrying = "ExportRetrying";
inline constexpr const char* Exported = "Exported";
inline constexpr const char* ExportRefused = "ExportRefused";
inline constexpr const char* ExportFailed = "ExportFailed";
inline constexpr const char* JobFailed = "JobFailed";
// the reconciler
inline constexpr const char* FailedCreate = "FailedCreate";
inline constexpr const char* ChildConflict = "ChildConflict";
}  // namespace reason

// Event types.
inline constexpr const char* kNormal = "Normal";
inline constexpr const char* kWarning = "Warning";

enum class CondStatus { True, False, Unknown };
const char* condStatusName(CondStatus s);

struct Condition {
  std::string type;
  CondStatus status = CondStatus::Unknown;
  std::string reason;
  std::string message;
  std::string lastTransitionTime;  // RFC 3339: when status last changed
  long observedGeneration = 0;
};

// status.workers: the current generation's worker pods by phase.
struct WorkerCounts {
  int total = 0, pending = 0, running = 0, succeeded = 0, failed = 0;
};

// status.scaling: a change of spec.replicas being applied to the running workers.
struct ScalingStatus {
  int from = 0, to = 0;
  std::string startTime;                   // when the operator saw the change
  std::optional<std::string> requestTime;  // when the workers were asked (last time)
};

// status.lastScale: how the most recent scale ended.
inline constexpr const char* kScaleSucceeded = "Succeeded";  // the workers train at the new size
inline constexpr const char* kScaleAbandoned = "Abandoned";  // the job stayed at, or went back to, its old size
struct LastScale {
  int from = 0, to = 0;
  std::string result;  // kScaleSucceeded | kScaleAbandoned
  double seconds = 0;
  std::string message;
  long generation = 0;
};

// status.link: the sync rounds' cost (controller/plan_link.cpp).
struct LinkStatus {
  int rank = 0;
  double blockedShare = 0, roundSeconds = 0, stepSeconds = 0;
  long rounds = 0, localSteps = 0;
};

// status.recovery: failed ranks being replaced in place.
struct RecoveryStatus {
  std::vector<int> ranks;                  // replaced ranks; their new pods get EDIT_JOIN=1
  std::string startTime;                   // RFC 3339, when the first failure was seen
  std::vector<std::string> failedPodUIDs;  // the failed incarnations (same pod names as their replacements)

  bool covers(int rank) const;
  bool hasFailedPod(const std::string& uid) const;
  void add(int rank, const std::string& failedPodUid);  // sorted ranks, no duplicates
  std::string rankList() const;                          // "1, 3"
};

// status.progress: training progress from the workers' telemetry.
struct Progress {
  long step = 0, totalSteps = 0, tokens = 0;
  double loss = 0, tokensPerSecond = 0;
  long syncRounds = 0, anomalies = 0;
  std::optional<double> etaSeconds;
};

struct StragglerStatus {
  int rank = 0;
  std::string pod, node;
  double score = 0;
};

// A node a rank's pods must not use (a straggler replaced away from it).
struct AvoidNode {
  int rank = 0;
  std::string node;
};

// status.export: the model export of spec.export (controller/export_policy.h).
struct ExportStatus {
  std::optional<int> attempts;
  std::optional<std::string> nextAttemptTime;
  std::optional<std::string> path, weights, dtype;
  std::optional<long> step, bytes;
};

struct EDiTJobStatus {
  Phase phase = Phase::Unset;
  std::vector<Condition> conditions;
  std::optional<long> observedGeneration;
  std::optional<int> replicas;  // replicas training now (the scale subresource's)
  std::optional<std::string> selector;
  std::optional<ScalingStatus> scaling;
  std::optional<LastScale> lastScale;
  std::optional<LinkStatus> link;
  std::optional<WorkerCounts> workers;
  std::optional<std::string> startTime, completionTime;
  std::optional<int> restarts, restartGeneration, replicaRecoveries, disruptions;
  std::optional<RecoveryStatus> recovery;
  std::optional<Progress> progress;
  std::optional<std::vector<StragglerStatus>> stragglers;
  std::vector<AvoidNode> avoidNodes;
  std::optional<ExportStatus> exportStatus;  // status.export
  std::optional<int> stragglerCount;
  std::optional<std::string> lastReportTime;
  // The step the gang had reached when it stopped as a whole (a restart, a drain, a
  // suspend); cleared once the new gang reports, with a Warning event when it resumed
  // further back (its newest complete checkpoint is older than the stop).
  std::optional<long> stoppedAtStep;
  std::optional<std::string> message;

  // Reads what parses; a field of the wrong shape is left out (the status is ours, but a
  // user may have edited it).
  static EDiTJobStatus fromJson(const nlohmann::json& j);
  nlohmann::json toJson() const;

  const Condition* condition(const std::string& type) const;
  bool conditionTrue(const std::string& type) const;
  // Sets a condition; keeps lastTransitionTime when the status did not flip. Returns true
  // when anything changed.
  bool setCondition(const std::string& type, CondStatus status, const std::string& reason, const std::string& message,
                    const std::string& now, long observedGeneration);
};

}  // namespace edit::op::api
