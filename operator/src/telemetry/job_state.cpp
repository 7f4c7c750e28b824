#include "telemetry/job_state.h"

#include "comm_labels.h"

#include <algorithm>
#include <iterator>
#include <numeric>

namespace edit::op::telemetry {

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

bool constantTimeEquals(const std::string& a, const std::string& b) {
  size_t n = std::max(a.size(), b.size());
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < n; ++i) {
    unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= static_cast<unsigned char>(x ^ y);
  }
  return diff == 0 && !a.empty();
}

bool knownCommOp(const std::string& op) { return edit::isCommOp(op); }
bool knownCommGroup(const std::string& group) { return edit::isCommGroup(group); }

const std::string& knownCommOps() {
  static const std::string all = edit::listOf(edit::kCommOpNames);
  return all;
}
const std::string& knownCommGroups() {
  static const std::string all = edit::listOf(edit::kCommGroupNames);
  return all;
}

void JobTelemetry::dropTotals(const Report& r) {
  tokens_ -= r.tokens;
  steps_.erase(steps_.find(r.step));
}

void JobTelemetry::add(const Report& r, double now) {
  auto [it, fresh] = ranks_.try_emplace(r.rank);
  auto& st = it->second;
  // A step done is progress, forward or not: after an in-place recovery every rank rolls
  // back to the last sync round and its first steps are below the steps it reported
  // before the failure. A heartbeat repeats the last step.
  bool advanced = (!r.heartbeat && r.step != st.last.step) || st.lastSeen == 0;
  // A new worker process (restart) starts its counters again: drop its old window.
  if (r.step < st.last.step) st.stepTimes.clear();
  if (!fresh) dropTotals(st.last);
  st.last = r;
  tokens_ += r.tokens;
  steps_.insert(r.step);
  st.lastSeen = now;
  // A heartbeat repeats a step time already counted.
  if (r.stepSeconds > 0 && !r.heartbeat) {
    st.stepTimes.push_back(r.stepSeconds);
    while (static_cast<int>(st.stepTimes.size()) > settings_.windowSteps) st.stepTimes.pop_front();
  }
  lastReport_ = now;
  if (advanced) lastProgress_ = now;

  samples_.push_back({now, {tokens_, *steps_.begin()}});
  while (samples_.size() > 2 && samples_.front().first < now - rateWindow_) samples_.pop_front();
}

void JobTelemetry::removeRank(int rank) {
  auto it = ranks_.find(rank);
  if (it == ranks_.end()) return;
  dropTotals(it->second.last);
  ranks_.erase(it);
}

void JobTelemetry::resetRank(int rank) {
  auto it = ranks_.find(rank);
  if (it != ranks_.end()) it->second.stepTimes.clear();
}

void JobTelemetry::reset() {
  ranks_.clear();
  tokens_ = 0;
  steps_.clear();
  samples_.clear();
  lastReport_ = lastProgress_ = 0;
}

Progress JobTelemetry::progress() const {
  Progress p;
  if (ranks_.empty()) return p;
  p.step = INT64_MAX;
  double lossSum = 0, syncSum = 0;
  for (const auto& [rank, st] : ranks_) {
    const Report& r = st.last;
    p.step = std::min(p.step, r.step);
    p.totalSteps = std::max(p.totalSteps, r.totalSteps);
    p.tokens += r.tokens;
    p.syncRounds = std::max(p.syncRounds, r.syncRounds);
    p.anomalies = std::max(p.anomalies, r.anomalies);
    lossSum += r.loss;
    syncSum += r.lastSyncDurationSeconds;
  }
  p.ranksReporting = static_cast<int>(ranks_.size());
  p.loss = lossSum / p.ranksReporting;
  p.lastSyncDurationSeconds = syncSum / p.ranksReporting;
  if (samples_.size() >= 2) {
    const auto& first = samples_.front();
    const auto& last = samples_.back();
    double dt = last.first - first.first;
    if (dt > 0) {
      p.tokensPerSecond = static_cast<double>(last.second.first - std::min(first.second.first, last.second.first)) / dt;
      double stepRate = static_cast<double>(last.second.second - first.second.second) / dt;
      if (stepRate > 0 && p.totalSteps > 0)
        p.etaSeconds = std::max(0.0, static_cast<double>(p.totalSteps) - static_cast<double>(p.step)) / stepRate;
    }
  }
  if (p.totalSteps > 0 && p.step >= p.totalSteps) p.etaSeconds = 0;
  return p;
}

std::vector<WorkerScore> JobTelemetry::scores() const {
  std::vector<WorkerScore> out;
  std::vector<double> means;
  for (const auto& [rank, st] : ranks_) {
    WorkerScore w;
    w.rank = rank;
    w.pod = st.last.pod;
    w.node = st.last.node;
    if (!st.stepTimes.empty())
      w.meanStepSeconds = std::accumulate(st.stepTimes.begin(), st.stepTimes.end(), 0.0) / st.stepTimes.size();
    w.scored = static_cast<int>(st.stepTimes.size()) >= settings_.minReports;
    if (w.scored) means.push_back(w.meanStepSeconds);
    out.push_back(w);
  }
  double med = median(means);
  for (auto& w : out)
    if (w.scored) w.score = med > 0 ? w.meanStepSeconds / med : 1.0;
  return out;
}

std::vector<WorkerScore> JobTelemetry::stragglers() const {
  std::vector<WorkerScore> out;
  for (const auto& w : scores())
    if (isStraggler(w, settings_.threshold)) out.push_back(w);
  return out;
}

bool JobTelemetry::hung(double now, double timeoutSeconds) const {
  if (timeoutSeconds <= 0 || ranks_.empty()) return false;
  return now - lastProgress_ > timeoutSeconds;
}

}  // namespace edit::op::telemetry
