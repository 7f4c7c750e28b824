// The operator's Prometheus metrics (every name is listed in tests/packaging/metrics.txt,
// which the dashboards and alert rules are checked against). Worker series are keyed by
// (namespace, job, rank) and replaced when the rank's pod or node changes; every series
// of a job goes when the job is deleted. main.cpp serves them on the shared PlainServer.
#pragma once

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>

#include "api/status.h"

namespace edit::op::metrics {

struct WorkerSample {
  std::string ns, job;
  int rank = 0, replica = 0, shard = 0;
  std::string pod, node;
  double stepSeconds = 0;
  double commWaitSeconds = 0;     // cumulative since the worker process started
  double lastReportUnix = 0;      // wall clock of the last report (operator's clock)
};

struct JobSample {
  double stragglers = 0, tokensPerSecond = 0, loss = 0, step = 0, lastSyncDurationSeconds = 0;
};

class Metrics {
 public:
  Metrics();
  std::shared_ptr<prometheus::Registry> registry() const { return registry_; }
  // The text exposition of every metric (what /metrics serves).
  // Runs the before-scrape hook first.
  std::string scrape() const;
  // Called at the start of every scrape, to set series that are cheaper to compute when
  // read than on every update (TelemetryHub::publishJobMetrics); nullptr removes it.
  void setBeforeScrape(std::function<void()> hook);

  void setWorker(const WorkerSample& w);
  // Cumulative bytes of one (op, group) from a worker; the counter grows by the increase
  // (a restarted worker's counter starting again counts from zero).
  void addCommBytes(const WorkerSample& w, const std::string& op, const std::string& group, double cumulativeBytes);
  void setStragglerScore(const std::string& ns, const std::string& job, int rank, double score);
  void setJob(const std::string& ns, const std::string& job, const JobSample& s);
  // edit_job_phase{phase}: 1 for the job's phase, 0 for every other of api::kPhases.
  void setJobPhase(const std::string& ns, const std::string& job, api::Phase phase);
  void setJobRestarts(const std::string& ns, const std::string& job, double total);
  // status.replicaRecoveries: failed ranks replaced in place, without a gang restart.
  void setJobReplicaRecoveries(const std::string& ns, const std::string& job, double total);
  // Replicas training now (status.replicas): changes when the job scales in place.
  void setJobReplicas(const std::string& ns, const std::string& job, double replicas);
  // status.link.blockedShare: the series exists only once the job has measured it (a
  // zero before that would read as "never blocked").
  void setJobSyncBlocked(const std::string& ns, const std::string& job, double share);
  // A worker that left the job (a scale-down): its series go.
  void removeWorker(const std::string& ns, const std::string& job, int rank);
  void removeJob(const std::string& ns, const std::string& job);
  // Recomputes edit_worker_last_report_age_seconds for every worker.
  void refreshAges(double nowUnix);

  void reconcileDone(const std::string& result, double seconds);
  void jobCreated() { jobsCreated_->Increment(); }
  void jobSucceeded() { jobsSucceeded_->Increment(); }
  void jobFailed() { jobsFailed_->Increment(); }
  void jobRestarted() { jobsRestarted_->Increment(); }
  // An in-place recovery ended: seconds from the failure to the replacements' first step.
  void replicaRecovered(double seconds) { recoveryHist_->Observe(seconds); }
  void setLeader(bool leader) { leader_->Set(leader ? 1 : 0); }
  // An in-place scale ended: result Succeeded or Abandoned, seconds from the change of
  // spec.replicas to the new world's first report.
  void jobScaled(const std::string& result, double seconds);

 private:
  using JobKey = std::pair<std::string, std::string>;
  using RankKey = std::tuple<std::string, std::string, int>;
  struct WorkerSeries {
    std::map<std::string, std::string> labels;
    prometheus::Gauge *step, *score, *age;
    // Cumulative in the reports: exported as a counter (rate() of it is the fraction of
    // wall time spent waiting), grown by each report's increase.
    prometheus::Counter* commWait;
    double commWaitSeen = 0;
    std::map<std::pair<std::string, std::string>, std::pair<prometheus::Counter*, double>> bytes;
    double lastReportUnix = 0;
  };
  struct JobSeries {
    prometheus::Gauge *stragglers, *tps, *loss, *step, *sync;
    std::map<std::string, prometheus::Gauge*> phases;
    prometheus::Counter* restarts;
    double restartsSeen = 0;
    prometheus::Counter* recoveries;
    double recoveriesSeen = 0;
    prometheus::Gauge* replicas;
    prometheus::Gauge* syncBlocked = nullptr;  // added by setJobSyncBlocked
  };
  void removeWorkerLocked(WorkerSeries& s);
  JobSeries& jobLocked(const std::string& ns, const std::string& job);

  std::shared_ptr<prometheus::Registry> registry_;
  std::mutex mu_;
  // Held while the hook is replaced or runs: a hub going away waits for a scrape in it.
  mutable std::mutex hookMu_;
  std::function<void()> beforeScrape_;
  std::map<RankKey, WorkerSeries> workers_;
  std::map<JobKey, JobSeries> jobs_;

  prometheus::Family<prometheus::Gauge>& workerStep_;
  prometheus::Family<prometheus::Gauge>& workerScore_;
  prometheus::Family<prometheus::Counter>& workerCommWait_;
  prometheus::Family<prometheus::Counter>& workerCommBytes_;
  prometheus::Family<prometheus::Gauge>& workerAge_;
  prometheus::Family<prometheus::Gauge>& jobStragglers_;
  prometheus::Family<prometheus::Gauge>& jobTps_;
  prometheus::Family<prometheus::Gauge>& jobLoss_;
  prometheus::Family<prometheus::Gauge>& jobStep_;
  prometheus::Family<prometheus::Gauge>& jobSync_;
  prometheus::Family<prometheus::Gauge>& jobPhase_;
  prometheus::Family<prometheus::Counter>& jobRestarts_;
  prometheus::Family<prometheus::Counter>& jobRecoveries_;
  prometheus::Family<prometheus::Gauge>& jobReplicas_;
  prometheus::Family<prometheus::Gauge>& jobSyncBlocked_;
  prometheus::Family<prometheus::Counter>& reconcileTotal_;
  prometheus::Family<prometheus::Histogram>& reconcileSeconds_;
  prometheus::Histogram* reconcileHist_;
  prometheus::Histogram* recoveryHist_;
  prometheus::Family<prometheus::Counter>& scalesTotal_;
  prometheus::Histogram* scaleHist_;
  prometheus::Counter *jobsCreated_, *jobsSucceeded_, *jobsFailed_, *jobsRestarted_;
  prometheus::Gauge* leader_;
};

}  // namespace edit::op::metrics
