#include "metrics/metrics.h"

namespace edit::op::metrics {

using prometheus::BuildCounter;
using prometheus::BuildGauge;
using prometheus::BuildHistogram;

Metrics::Metrics()
    : registry_(std::make_shared<prometheus::Registry>()),
      workerStep_(BuildGauge().Name("edit_worker_step_seconds").Help("Duration of the worker's last training step in seconds.").Register(*registry_)),
      workerScore_(BuildGauge().Name("edit_worker_straggler_score").Help("Worker mean step time over the window divided by the job median.").Register(*registry_)),
      workerCommWait_(BuildCounter().Name("edit_worker_comm_wait_seconds_total").Help("Seconds the worker was blocked in collectives (rate(): the fraction of its time).").Register(*registry_)),
      workerCommBytes_(BuildCounter().Name("edit_worker_comm_bytes_total").Help("Bytes the worker sent, by collective and process group.").Register(*registry_)),
      workerAge_(BuildGauge().Name("edit_worker_last_report_age_seconds").Help("Seconds since the worker's last telemetry report.").Register(*registry_)),
      jobStragglers_(BuildGauge().Name("edit_job_stragglers").Help("Workers of the job over the straggler threshold.").Register(*registry_)),
      jobTps_(BuildGauge().Name("edit_job_tokens_per_second").Help("Training throughput of the job in tokens per second.").Register(*registry_)),
      jobLoss_(BuildGauge().Name("edit_job_loss").Help("Mean of the workers' latest training loss.").Register(*registry_)),
      jobStep_(BuildGauge().Name("edit_job_step").Help("Training steps completed by the slowest worker.").Register(*registry_)),
      jobSync_(BuildGauge().Name("edit_job_sync_seconds").Help("Mean duration of the workers' last synchronization round in seconds.").Register(*registry_)),
      jobPhase_(BuildGauge().Name("edit_job_phase").Help("1 for the job's current phase, 0 for the others.").Register(*registry_)),
      jobRestarts_(BuildCounter().Name("edit_job_restarts_total").Help("Gang restarts of the job.").Register(*registry_)),
      jobRecoveries_(BuildCounter().Name("edit_job_replica_recoveries_total").Help("In-place recoveries of the job: failed workers replaced without a gang restart.").Register(*registry_)),
      jobReplicas_(BuildGauge().Name("edit_job_replicas").Help("Model replicas the job trains with now (status.replicas); changes when it scales in place.").Register(*registry_)),
      jobSyncBlocked_(BuildGauge().Name("edit_job_sync_blocked_ratio").Help("Share of the local phase the sync rounds blocked training, on the rank that waited least (status.link.blockedShare; condition LinkBound above 0.2).").Register(*registry_)),
      reconcileTotal_(BuildCounter().Name("edit_operator_reconcile_total").Help("Reconciliations by result.").Register(*registry_)),
      reconcileSeconds_(BuildHistogram().Name("edit_operator_reconcile_seconds").Help("Duration of reconciliations in seconds.").Register(*registry_)),
      reconcileHist_(&reconcileSeconds_.Add({}, prometheus::Histogram::BucketBoundaries{0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10})),
      recoveryHist_(&BuildHistogram().Name("edit_operator_replica_recovery_seconds").Help("In-place recoveries: seconds from a worker's failure to its replacement's first training step.").Register(*registry_).Add({}, prometheus::Histogram::BucketBoundaries{2, 5, 10, 15, 20, 30, 45, 60, 90, 120, 180, 300, 600})),
      scalesTotal_(BuildCounter().Name("edit_operator_scales_total").Help("In-place scales of jobs' replicas that ended, by result (Succeeded, Abandoned).").Register(*registry_)),
      scaleHist_(&BuildHistogram().Name("edit_operator_scale_seconds").Help("In-place scales that succeeded: seconds from the change of spec.replicas to the resized world's first report.").Register(*registry_).Add({}, prometheus::Histogram::BucketBoundaries{2, 5, 10, 15, 20, 30, 45, 60, 90, 120, 180, 300, 600})),
      jobsCreated_(&BuildCounter().Name("edit_operator_jobs_created_total").Help("Worker gangs created (first start and restarts).").Register(*registry_).Add({})),
      jobsSucceeded_(&BuildCounter().Name("edit_operator_jobs_succeeded_total").Help("Jobs that reached Succeeded.").Register(*registry_).Add({})),
      jobsFailed_(&BuildCounter().Name("edit_operator_jobs_failed_total").Help("Jobs that reached Failed.").Register(*registry_).Add({})),
      jobsRestarted_(&BuildCounter().Name("edit_operator_jobs_restarted_total").Help("Gang restarts over all jobs.").Register(*registry_).Add({})),
      leader_(&BuildGauge().Name("edit_operator_leader").Help("1 while this operator instance is the leader.").Register(*registry_).Add({})) {
  for (const char* r : {"success", "error", "requeue"}) reconcileTotal_.Add({{"result", r}});
  for (const char* r : {api::kScaleSucceeded, api::kScaleAbandoned}) scalesTotal_.Add({{"result", r}});  // 0 before the first scale
}

void Metrics::removeWorkerLocked(WorkerSeries& s) {
  workerStep_.Remove(s.step);
  workerScore_.Remove(s.score);
  workerCommWait_.Remove(s.commWait);
  workerAge_.Remove(s.age);
  for (auto& [key, c] : s.bytes) workerCommBytes_.Remove(c.first);
  s.bytes.clear();
}

void Metrics::setWorker(const WorkerSample& w) {
  std::map<std::string, std::string> labels = {{"namespace", w.ns}, {"job", w.job}, {"rank", std::to_string(w.rank)},
                                               {"replica", std::to_string(w.replica)}, {"shard", std::to_string(w.shard)},
                                               {"pod", w.pod}, {"node", w.node}};
  std::lock_guard<std::mutex> lock(mu_);
  RankKey key{w.ns, w.job, w.rank};
  auto it = workers_.find(key);
  if (it != workers_.end() && it->second.labels != labels) {
    removeWorkerLocked(it->second);
    workers_.erase(it);
    it = workers_.end();
  }
  if (it == workers_.end()) {
    WorkerSeries s;
    s.labels = labels;
    s.step = &workerStep_.Add(labels);
    s.score = &workerScore_.Add(labels);
    s.commWait = &workerCommWait_.Add(labels);
    s.age = &workerAge_.Add(labels);
    it = workers_.emplace(key, std::move(s)).first;
  }
  auto& s = it->second;
  s.step->Set(w.stepSeconds);
  // A restarted worker's cumulative value starts again from zero: count it from there.
  const double delta = w.commWaitSeconds >= s.commWaitSeen ? w.commWaitSeconds - s.commWaitSeen : w.commWaitSeconds;
  s.commWaitSeen = w.commWaitSeconds;
  if (delta > 0) s.commWait->Increment(delta);
  s.lastReportUnix = w.lastReportUnix;
  s.age->Set(0);
}

void Metrics::addCommBytes(const WorkerSample& w, const std::string& op, const std::string& group,
                           double cumulativeBytes) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = workers_.find(RankKey{w.ns, w.job, w.rank});
  if (it == workers_.end()) return;
  auto& entry = it->second.bytes[{op, group}];
  if (!entry.first) {
    auto labels = it->second.labels;
    labels["op"] = op;
    labels["group"] = group;
    entry.first = &workerCommBytes_.Add(labels);
    entry.second = 0;
  }
  double delta = cumulativeBytes >= entry.second ? cumulativeBytes - entry.second : cumulativeBytes;
  entry.second = cumulativeBytes;
  if (delta > 0) entry.first->Increment(delta);
}

void Metrics::setStragglerScore(const std::string& ns, const std::string& job, int rank, double score) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = workers_.find(RankKey{ns, job, rank});
  if (it != workers_.end()) it->second.score->Set(score);
}

Metrics::JobSeries& Metrics::jobLocked(const std::string& ns, const std::string& job) {
  JobKey key{ns, job};
  auto it = jobs_.find(key);
  if (it != jobs_.end()) return it->second;
  std::map<std::string, std::string> labels = {{"namespace", ns}, {"job", job}};
  JobSeries s;
  s.stragglers = &jobStragglers_.Add(labels);
  s.tps = &jobTps_.Add(labels);
  s.loss = &jobLoss_.Add(labels);
  s.step = &jobStep_.Add(labels);
  s.sync = &jobSync_.Add(labels);
  s.restarts = &jobRestarts_.Add(labels);
  s.recoveries = &jobRecoveries_.Add(labels);
  s.replicas = &jobReplicas_.Add(labels);
  for (api::Phase p : api::kPhases) {
    auto l = labels;
    l["phase"] = api::phaseName(p);
    s.phases[api::phaseName(p)] = &jobPhase_.Add(l);
  }
  return jobs_.emplace(key, std::move(s)).first->second;
}

void Metrics::setJob(const std::string& ns, const std::string& job, const JobSample& v) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& s = jobLocked(ns, job);
  s.stragglers->Set(v.stragglers);
  s.tps->Set(v.tokensPerSecond);
  s.loss->Set(v.loss);
  s.step->Set(v.step);
  s.sync->Set(v.lastSyncDurationSeconds);
}

void Metrics::setJobPhase(const std::string& ns, const std::string& job, api::Phase phase) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& s = jobLocked(ns, job);
  for (auto& [name, g] : s.phases) g->Set(name == api::phaseName(phase) ? 1 : 0);
}

void Metrics::setJobRestarts(const std::string& ns, const std::string& job, double total) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& s = jobLocked(ns, job);
  if (total > s.restartsSeen) s.restarts->Increment(total - s.restartsSeen);
  s.restartsSeen = std::max(s.restartsSeen, total);
}

void Metrics::setJobReplicaRecoveries(const std::string& ns, const std::string& job, double total) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& s = jobLocked(ns, job);
  if (total > s.recoveriesSeen) s.recoveries->Increment(total - s.recoveriesSeen);
  s.recoveriesSeen = std::max(s.recoveriesSeen, total);
}

void Metrics::setJobReplicas(const std::string& ns, const std::string& job, double replicas) {
  std::lock_guard<std::mutex> lock(mu_);
  jobLocked(ns, job).replicas->Set(replicas);
}

void Metrics::setJobSyncBlocked(const std::string& ns, const std::string& job, double share) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& s = jobLocked(ns, job);
  if (!s.syncBlocked) s.syncBlocked = &jobSyncBlocked_.Add({{"namespace", ns}, {"job", job}});
  s.syncBlocked->Set(share);
}

void Metrics::removeWorker(const std::string& ns, const std::string& job, int rank) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = workers_.find(RankKey{ns, job, rank});
  if (it == workers_.end()) return;
  removeWorkerLocked(it->second);
  workers_.erase(it);
}

void Metrics::jobScaled(const std::string& result, double seconds) {
  scalesTotal_.Add({{"result", result}}).Increment();
  if (result == api::kScaleSucceeded) scaleHist_->Observe(seconds);
}

void Metrics::removeJob(const std::string& ns, const std::string& job) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = workers_.begin(); it != workers_.end();) {
    if (std::get<0>(it->first) == ns && std::get<1>(it->first) == job) {
      removeWorkerLocked(it->second);
      it = workers_.erase(it);
    } else {
      ++it;
    }
  }
  auto it = jobs_.find(JobKey{ns, job});
  if (it == jobs_.end()) return;
  auto& s = it->second;
  jobStragglers_.Remove(s.stragglers);
  jobTps_.Remove(s.tps);
  jobLoss_.Remove(s.loss);
  jobStep_.Remove(s.step);
  jobSync_.Remove(s.sync);
  jobRestarts_.Remove(s.restarts);
  jobRecoveries_.Remove(s.recoveries);
  jobReplicas_.Remove(s.replicas);
  if (s.syncBlocked) jobSyncBlocked_.Remove(s.syncBlocked);
  for (auto& [p, g] : s.phases) jobPhase_.Remove(g);
  jobs_.erase(it);
}

std::string Metrics::scrape() const {
  {
    std::lock_guard<std::mutex> lock(hookMu_);
    if (beforeScrape_) beforeScrape_();
  }
  return prometheus::TextSerializer().Serialize(registry_->Collect());
}

void Metrics::setBeforeScrape(std::function<void()> hook) {
  std::lock_guard<std::mutex> lock(hookMu_);
  beforeScrape_ = std::move(hook);
}

void Metrics::refreshAges(double nowUnix) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [key, s] : workers_)
    if (s.lastReportUnix > 0) s.age->Set(std::max(0.0, nowUnix - s.lastReportUnix));
}

void Metrics::reconcileDone(const std::string& result, double seconds) {
  reconcileTotal_.Add({{"result", result}}).Increment();
  reconcileHist_->Observe(seconds);
}

}  // namespace edit::op::metrics
