#include "controller/observed.h"

#include "api/editjob.h"

namespace edit::op::controller {
namespace {

int labelInt(const json& labels, const char* key, int def) {
  if (!labels.contains(key) || !labels[key].is_string()) return def;
  try {
    return std::stoi(labels[key].get<std::string>());
  } catch (...) {
    return def;
  }
}

}  // namespace

bool stuckWaitingReason(const std::string& r) {
  for (const char* k : {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull",
                        "CreateContainerConfigError", "CreateContainerError", "RunContainerError"})
    if (r == k) return true;
  return false;
}

ObservedPod observePod(const json& pod) {
  ObservedPod o;
  const json& md = pod["metadata"];
  o.name = md.value("name", "");
  o.uid = md.value("uid", "");
  json labels = md.value("labels", json::object());
  o.rank = labelInt(labels, api::kLabelRank, -1);
  o.generation = labelInt(labels, api::kLabelGeneration, 0);
  o.deleting = md.contains("deletionTimestamp") && !md["deletionTimestamp"].is_null();
  o.created = md.value("creationTimestamp", "");
  const json status = pod.value("status", json::object());
  o.phase = status.value("phase", std::string(podphase::Pending));
  o.node = pod.value("spec", json::object()).value("nodeName", "");
  o.reason = status.value("reason", "");
  if (o.reason == "Evicted") o.disruption = "Evicted";
  for (const auto& c : status.value("conditions", json::array())) {
    if (c.value("type", "") == "DisruptionTarget" && c.value("status", "") == "True")
      o.disruption = c.value("reason", "DisruptionTarget");
    if (c.value("type", "") == "PodScheduled" && c.value("status", "") == "False") {
      o.startReason = c.value("reason", "Unschedulable");
      o.startMessage = c.value("message", "");
    }
  }
  for (const auto& cs : status.value("containerStatuses", json::array())) {
    const json waiting = cs.value("state", json::object()).value("waiting", json::object());
    if (waiting.is_object() && stuckWaitingReason(waiting.value("reason", ""))) {
      o.startReason = waiting.value("reason", "");
      o.startMessage = waiting.value("message", "");
      break;
    }
  }
  for (const auto& cs : status.value("containerStatuses", json::array())) {
    const json st = cs.value("state", json::object());
    if (o.started.empty() && st.contains("running") && st["running"].is_object())
      o.started = st["running"].value("startedAt", "");
    for (const char* which : {"state", "lastState"}) {
      const json st = cs.value(which, json::object());
      if (st.contains("terminated") && st["terminated"].contains("exitCode")) {
        o.exitCode = st["terminated"]["exitCode"].get<int>();
        std::string r = st["terminated"].value("reason", "");
        if (!r.empty()) o.reason = r;
        if (st["terminated"].contains("message") && st["terminated"]["message"].is_string())
          o.message = st["terminated"]["message"].get<std::string>();
        break;
      }
    }
    if (o.exitCode) break;
  }
  return o;
}

}  // namespace edit::op::controller
