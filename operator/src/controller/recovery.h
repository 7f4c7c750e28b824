// In-place replica recovery, the planner's part: the record of a recovery in progress
// (status.recovery) and how the planner tells that the replacements joined or that
// workers fell silent. Whether failed workers may be replaced without a gang restart is
// the failure policy's rule (controller/failure_policy.h). The runtime's side: a pod
// started with EDIT_JOIN=1 joins the running job and takes the outer state from its
// sync-group peers, while the survivors wait for it (runtime.recovery: inPlace). Pure
// functions, like the rest of the planner.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "controller/observed.h"

namespace edit::op::controller {

// "1, 3": ranks for messages.
std::string rankList(const std::vector<int>& ranks);

// status.recovery while failed ranks are being replaced in place.
struct RecoveryRecord {
  std::vector<int> ranks;                   // replaced ranks; their new pods get EDIT_JOIN=1
  std::string startTime;                    // RFC 3339, when the first failure was seen
  std::vector<std::string> failedPodUIDs;   // the failed incarnations (same pod names as their replacements)

  static std::optional<RecoveryRecord> fromStatus(const json& status);
  json toJson() const;
  bool covers(int rank) const;
  // The failed incarnation this record replaces (to be deleted, not counted again).
  bool replaces(const ObservedPod& pod) const;
  // A pod of a recovered rank created after the failure: the replacement.
  bool isReplacement(const ObservedPod& pod) const { return covers(pod.rank) && !replaces(pod); }
  // Adds failed pods to the record (a second rank failing while the first is replaced).
  void add(const ObservedPod& pod);
  std::string rankList() const;  // "1, 3"
};

// The step a replacement `pod` reported training at; nullopt while it has not (its rank's
// newest report comes from another pod, or there is none). Without telemetry, or from a
// worker that sends no pod UID, a Running pod is the best sign there is: -1 (step unknown).
std::optional<long> rejoinedAtStep(const ObservedPod& pod, const TelemetryView& t);

// Of a hung job's Running pods, those whose rank sent nothing (no report, no heartbeat)
// for more than half of hangTimeoutSeconds while another rank kept reporting: stopped or
// frozen workers the others wait for. Empty when there is no such split. `longest`: the
// longest silence among them, in seconds.
std::vector<const ObservedPod*> silentPods(const std::vector<const ObservedPod*>& pods, const TelemetryView& t,
                                           long hangTimeoutSeconds, double* longest);

}  // namespace edit::op::controller
