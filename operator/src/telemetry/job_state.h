// Per-job telemetry state and its math, free of gRPC so that tests can feed synthetic
// reports: latest report per rank, progress (step, tokens, loss, tokens/s, ETA), the
// straggler score and the hang signal. Times are seconds on one monotonic-ish clock.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "link_advice.h"

namespace edit::op::telemetry {

struct CommSample {
  std::string op;
  std::string group;
  uint64_t bytes = 0;
  double waitSeconds = 0;
};

// What one WorkerReport says (the operator's copy, without the token).
struct Report {
  int rank = 0;
  int replica = 0;
  int shard = 0;
  std::string pod;
  std::string podUid;  // empty from workers that do not send it
  std::string node;
  int64_t step = 0;
  int64_t totalSteps = 0;
  double loss = 0;
  uint64_t tokens = 0;
  uint64_t syncRounds = 0;
  uint64_t anomalies = 0;
  double stepSeconds = 0;
  double commWaitSeconds = 0;  // cumulative
  double lastSyncDurationSeconds = 0;  // the last sync round's wall time (sync_seconds on the wire)
  std::vector<CommSample> comm;
  int restartGeneration = 0;
  int replicas = 0;        // replicas the worker's world has (0: a worker that does not say)
  bool heartbeat = false;  // a resend: the worker is alive, no new step
  // The local phase so far (local_phase on the wire): localSteps, computeSeconds,
  // blockedSeconds and rounds only.
  LinkMeasurement local;
};

struct Progress {
  int64_t step = 0;          // min over ranks that reported
  int64_t totalSteps = 0;
  uint64_t tokens = 0;       // sum over ranks
  double loss = 0;           // mean over ranks of their last loss
  double tokensPerSecond = 0;
  uint64_t syncRounds = 0;
  uint64_t anomalies = 0;
  double etaSeconds = -1;    // -1: unknown
  double lastSyncDurationSeconds = 0;  // mean over ranks of their last sync round's duration
  int ranksReporting = 0;
};

struct WorkerScore {
  int rank = 0;
  std::string pod;
  std::string node;
  double meanStepSeconds = 0;
  double score = 0;          // mean / job median of means; 0 when not scored yet
  bool scored = false;
};

struct StragglerSettings {
  double threshold = 1.5;
  int windowSteps = 20;
  int minReports = 5;
};

class JobTelemetry {
 public:
  explicit JobTelemetry(StragglerSettings s = {}, double rateWindowSeconds = 30.0)
      : settings_(s), rateWindow_(rateWindowSeconds) {}

  void setSettings(const StragglerSettings& s) { settings_ = s; }
  const StragglerSettings& settings() const { return settings_; }

  // O(log ranks): a report's cost must not grow with the job (every worker reports every
  // step); what spans every rank (progress, scores) is computed when it is read.
  void add(const Report& r, double now);
  // Forget one rank's step-time window (after it was replaced) or everything (restart).
  void resetRank(int rank);
  // Forget a rank that left the job (a scale-down): its last report no longer counts.
  void removeRank(int rank);
  void reset();

  Progress progress() const;
  std::vector<WorkerScore> scores() const;
  std::vector<WorkerScore> stragglers() const;  // score > threshold, sorted by rank
  static bool isStraggler(const WorkerScore& w, double threshold) { return w.scored && w.score > threshold; }

  bool hasReports() const { return !ranks_.empty(); }
  double lastReportTime() const { return lastReport_; }
  // No step advanced on any rank for `timeout` seconds (and at least one report seen).
  bool hung(double now, double timeoutSeconds) const;

  struct RankState {
    Report last;
    std::deque<double> stepTimes;  // the last windowSteps reported step times
    double lastSeen = 0;
  };
  const std::map<int, RankState>& ranks() const { return ranks_; }

 private:
  StragglerSettings settings_;
  double rateWindow_;
  // Forgets a rank's last report in the running totals below.
  void dropTotals(const Report& r);

  std::map<int, RankState> ranks_;
  // Running totals over ranks_' last reports, for the rate samples: the job's tokens (sum)
  // and step (min) without a pass over every rank per report.
  uint64_t tokens_ = 0;
  std::multiset<int64_t> steps_;
  std::deque<std::pair<double, std::pair<uint64_t, int64_t>>> samples_;  // (time, (tokens, step))
  double lastReport_ = 0;
  double lastProgress_ = 0;
};

double median(std::vector<double> v);

// Compares secrets in time independent of where they differ (length leaks only).
bool constantTimeEquals(const std::string& a, const std::string& b);

// The comm counter labels a worker sends (common/src/comm_labels.h, the runtime's one
// list); a report with another is refused, so that no worker can create Prometheus series
// at will.
bool knownCommOp(const std::string& op);
bool knownCommGroup(const std::string& group);
const std::string& knownCommOps();  // "allgather, allreduce, ...", for messages
const std::string& knownCommGroups();

}  // namespace edit::op::telemetry
