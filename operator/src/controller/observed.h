// What the planner observes of a job's gang: its pods as the API server shows them and
// the workers' telemetry. Plain data read from the cluster and the telemetry hub; every
// decision on it is made elsewhere (controller/plan.h, controller/failure_policy.h).
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "api/status.h"
#include "link_advice.h"

namespace edit::op::controller {

using nlohmann::json;

// Pod phases as the API server reports them (core/v1 PodPhase).
namespace podphase {
inline constexpr const char* Pending = "Pending";
inline constexpr const char* Running = "Running";
inline constexpr const char* Succeeded = "Succeeded";
inline constexpr const char* Failed = "Failed";
inline constexpr const char* Unknown = "Unknown";
}  // namespace podphase

// One worker pod owned by the job, any restart generation.
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
  std::string created;       // RFC 3339: metadata.creationTimestamp
  // Why a Pending pod does not start, as the kubelet or the scheduler says it: a
  // container's waiting reason (ErrImagePull, CreateContainerConfigError, ...) or the
  // PodScheduled condition's (Unschedulable, SchedulingGated). Empty while it simply starts.
  std::string startReason;
  std::string startMessage;
};

// A waiting reason of a container that does not start by itself (an image, its config).
bool stuckWaitingReason(const std::string& reason);

// Reads a Pod object; fields it lacks keep their defaults.
ObservedPod observePod(const json& pod);

// The workers' telemetry for one job, as the hub holds it when the reconcile runs.
struct TelemetryView {
  bool present = false;
  api::Progress progress;                  // status.progress
  std::vector<api::StragglerStatus> stragglers;  // status.stragglers
  std::string lastReportTime;              // RFC 3339
  double quietSeconds = 0;                 // since the newest report or heartbeat of any rank
  // No rank did a step for hangTimeoutSeconds; and for longer than the workers' own
  // recovery takes (runtimeRecoverySeconds: a collective's timeout, then the rendezvous).
  bool hung = false;
  bool hungPastRecovery = false;
  int replicas = 0;  // replicas rank 0's world has, by its newest report (0: unknown)
  long lowestStep = 0;  // the lowest step reported since the gang (re)started: where it resumed, + 1
  struct RankReport {
    std::string podUid;  // pod that sent the rank's newest report ("" if the worker does not say)
    long step = 0;
    double silentSeconds = 0;  // since its newest report or heartbeat
    LinkMeasurement local;     // its local phase so far (measured fields only; link advice)
  };
  std::map<int, RankReport> ranks;         // newest report of each rank
};

}  // namespace edit::op::controller
