#include "controller/recovery.h"

#include <algorithm>

namespace edit::op::controller {

bool replaces(const api::RecoveryStatus& recovery, const ObservedPod& pod) { return recovery.hasFailedPod(pod.uid); }

std::string rankList(const std::vector<int>& ranks) {
  std::string s;
  for (int r : ranks) s += (s.empty() ? "" : ", ") + std::to_string(r);
  return s;
}

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
    if (p->phase != podphase::Running || p->deleting || it == t.ranks.end()) continue;
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
