// In-place replica recovery, the planner's part: how the planner tells a failed pod from
// its replacement, that the replacements joined, or that workers fell silent (the record
// of a recovery in progress is status.recovery, api::RecoveryStatus). Whether failed workers may be replaced without a gang restart is
// the failure policy's rule (controller/failure_policy.h). The runtime's side: a pod
// started with EDIT_JOIN=1 joins the running job and takes the outer state from its
// sync-group peers, while the survivors wait for it (runtime.recovery: inPlace). Pure
// functions, like the rest of the planner.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "api/status.h"
#include "controller/observed.h"

namespace edit::op::controller {

// "1, 3": ranks for messages.
std::string rankList(const std::vector<int>& ranks);

// The failed incarnation a recovery replaces (to be deleted, not counted again).
bool replaces(const api::RecoveryStatus& recovery, const ObservedPod& pod);
// A pod of a recovered rank created after the failure: the replacement.
inline bool isReplacement(const api::RecoveryStatus& recovery, const ObservedPod& pod) {
  return recovery.covers(pod.rank) && !replaces(recovery, pod);
}

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
