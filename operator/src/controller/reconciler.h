// The EDiTJob reconciler, in JobSet's shape: observe the job, plan with the pure
// planReconcile (and planExport), store the status once, then apply the rest of the plan
// in small steps; and the controller around it: informer handlers -> work queue -> worker
// threads.
#pragma once

#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "controller/pod_spec.h"
#include "controller/export_policy.h"
#include "controller/plan.h"
#include "kube/client.h"
#include "kube/events.h"
#include "kube/informer.h"
#include "kube/workqueue.h"
#include "metrics/metrics.h"
#include "telemetry/server.h"

namespace edit::op::controller {

class Reconciler {
 public:
  Reconciler(kube::Client& client, kube::Informer& pods, telemetry::TelemetryHub& hub, metrics::Metrics& metrics,
             kube::EventRecorder& events, OperatorSettings settings)
      : client_(client), pods_(pods), hub_(hub), metrics_(metrics), events_(events), settings_(std::move(settings)) {}

  // Brings one job closer to its desired state. Returns when to look again (nullopt:
  // only on the next change). Throws on API errors (the caller retries with backoff).
  std::optional<std::chrono::milliseconds> reconcile(const std::string& ns, const std::string& name);

 private:
  // What a reconcile read: the job, the planner's input, the export pods.
  struct Observed {
    json obj;                   // the EDiTJob object
    PlanInput in;
    api::Phase oldPhase = api::Phase::Unset;
    std::optional<JobRef> job;  // set when the spec is valid
    std::vector<ExportPod> exportPods;
  };
  Observed observe(const json& jobObj);
  void persistStatus(const Observed& o, const Plan& plan);
  void applyTelemetry(const Observed& o, const Plan& plan);
  void applyDeletes(const Observed& o, const Plan& plan);
  void applyCreates(const Observed& o, const Plan& plan);
  void applyExport(const Observed& o, std::optional<int> attempt);
  std::optional<std::chrono::milliseconds> requeueAfter(const Observed& o, const Plan& plan);

  std::vector<json> ownedPods(const api::JobMeta& meta);
  std::string ensureToken(const JobRef& job, bool mayCreate, const json& jobObj);
  void ensureChildren(const JobRef& job, const json& jobObj);
  // joiningRanks: replacements of an in-place recovery (EDIT_JOIN=1); status: the job's
  // new status (status.avoidNodes).
  // scaleJoin: the ranks are a scale-up's new replicas (EDIT_JOIN=scale).
  void createPods(const JobRef& job, const std::vector<int>& ranks, int restartGeneration,
                  const std::vector<int>& joiningRanks, const api::EDiTJobStatus& status, const json& jobObj,
                  bool scaleJoin = false, const PodGroupRef& group = {});
  // Creates a child; 409 (it exists) is false. Any other refusal (Pod Security, quota,
  // RBAC, a missing CRD) becomes a Warning event FailedCreate on the job with the API's
  // message, as a ReplicaSet does, and is thrown on.
  bool createChild(const kube::ResourceType& rt, const json& obj, const json& jobObj);
  TelemetryView telemetryView(const JobRef& job, api::Phase phase, const std::vector<ObservedPod>& pods);
  void forget(const std::string& ns, const std::string& name);

  kube::Client& client_;
  kube::Informer& pods_;
  telemetry::TelemetryHub& hub_;
  metrics::Metrics& metrics_;
  kube::EventRecorder& events_;
  OperatorSettings settings_;
  std::mutex mu_;
  std::map<std::string, std::string> tokens_;  // job uid -> token
  // job uid -> the last FailedCreate message and when it was recorded: a retry that fails
  // the same way within kFailedCreateRepeat records no new event.
  std::map<std::string, std::pair<std::string, std::chrono::steady_clock::time_point>> lastFailedCreate_;
};

class Controller {
 public:
  Controller(Reconciler& reconciler, kube::Informer& jobs, kube::Informer& pods, metrics::Metrics& metrics,
             int workers, int resyncSeconds);
  ~Controller();
  void start();
  void stop();
  kube::WorkQueue& queue() { return queue_; }

 private:
  void work();

  Reconciler& reconciler_;
  kube::Informer& jobs_;
  kube::Informer& pods_;
  metrics::Metrics& metrics_;
  int workers_;
  int resyncSeconds_;
  kube::WorkQueue queue_;
  std::vector<std::thread> threads_;
  std::atomic<bool> stop_{false};
};

}  // namespace edit::op::controller
