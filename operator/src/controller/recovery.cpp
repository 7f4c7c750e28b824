#include "controller/recovery.h"

#include <algorithm>

namespace edit::op::controller {

std::optional<RecoveryRecord> RecoveryRecord::fromStatus(const json& status) {
  if (!status.is_object() || !status.contains("recovery") || !status["recovery"].is_object()) return std::nullopt;
  const json& r = status["recovery"];
  RecoveryRecord rec;
  for (const auto& v : r.value("ranks", json::array()))
    if (v.is_number_integer()) rec.ranks.push_back(v.get<int>());
  for (const auto& v : r.value("failedPodUIDs", json::array()))
    if (v.is_string()) rec.failedPodUIDs.push_back(v.get<std::string>());
  rec.startTime = r.value("startTime", "");
  if (rec.ranks.empty()) return std::nullopt;
  return rec;
}

json RecoveryRecord::toJson() const {
  return {{"ranks", ranks}, {"startTime", startTime}, {"failedPodUIDs", failedPodUIDs}};
}

bool RecoveryRecord::covers(int rank) const { return std::find(ranks.begin(), ranks.end(), rank) != ranks.end(); }

bool RecoveryRecord::replaces(const ObservedPod& pod) const {
  return !pod.uid.empty() && std::find(failedPodUIDs.begin(), failedPodUIDs.end(), pod.uid) != failedPodUIDs.end();
}

void RecoveryRecord::add(const ObservedPod& pod) {
  if (!covers(pod.rank)) {
    ranks.push_back(pod.rank);
    std::sort(ranks.begin(), ranks.end());
  }
  if (!pod.uid.empty() && !replaces(pod)) failedPodUIDs.push_back(pod.uid);
}

std::string rankList(const std::vector<int>& ranks) {
  std::string s;
  for (int r : ranks) s += (s.empty() ? "" : ", ") + std::to_string(r);
  return s;
}

std::string RecoveryRecord::rankList() const { return controller::rankList(ranks); }

std::optional<long> rejoinedAtStep(const ObservedPod& pod, const TelemetryView& t) {
  if (!t.present) return -1L;
  auto it = t.ranks.find(pod.rank);
  if (it == t.ranks.end()) return std::nullopt;
  if (it->second.podUid.empty() || pod.uid.empty()) return -1L;
  if (it->second.podUid != pod.uid) return std::nullopt;
  return it->second.step;
}

std::vector<const ObservedPod*> silentPods(const std::vector<const ObservedPod*>& pods, const TelemetryView& t,
                                           long hangTimeoutSeconds, double* longest) {
  std::vector<const ObservedPod*> silent;
  if (!t.present) return silent;
  const double threshold = hangTimeoutSeconds / 2.0;
  bool alive = false;
  *longest = 0;
  for (const auto* p : pods) {
    auto it = t.ranks.find(p->rank);
    if (p->phase != "Running" || p->deleting || it == t.ranks.end()) continue;
    const auto& r = it->second;
    if (!r.podUid.empty() && !p->uid.empty() && r.podUid != p->uid) continue;  // another incarnation's report
    if (r.silentSeconds > threshold) {
      silent.push_back(p);
      *longest = std::max(*longest, r.silentSeconds);
    } else {
      alive = true;
    }
  }
  if (!alive) silent.clear();
  return silent;
}

}  // namespace edit::op::controller
