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

// A three-way merge of a job's status: base (what a reconcile read), ours (what it
// planned), theirs (what is stored now, written by someone else meanwhile). What we did
// not change stays theirs; what we changed is ours, unless they changed the same field (a
// condition, by type) to something else: nullopt, plan again from what is stored.
std::optional<json> mergeStatus(const json& base, const json& ours, const json& theirs);

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
  // Stores the plan's status (false: skipped, progress only and written recently; `later`
  // is when to write it).
  void persistStatus(const Observed& o, const Plan& plan, std::optional<std::chrono::milliseconds>* later);
  void applyTelemetry(const Observed& o, const Plan& plan);
  void applyDeletes(const Observed& o, const Plan& plan);
  // false: creations wait for the job's own children (a leftover is being removed).
  bool applyCreates(const Observed& o, const Plan& plan);
  void applyExport(const Observed& o, std::optional<int> attempt);
  std::optional<std::chrono::milliseconds> requeueAfter(const Observed& o, const Plan& plan);

  std::vector<json> ownedPods(const api::JobMeta& meta);
  // The job's telemetry token, from its own Secret (created when mayCreate); "" while
  // there is none of its own: a Secret of the same name left by an earlier job is never
  // used (its token would be the wrong one, and the garbage collector would delete it
  // under the new job's pods).
  std::string ensureToken(const JobRef& job, bool mayCreate, const json& jobObj);
  // ConfigMap, Service and PodGroup; false while one of them is not the job's own yet.
  bool ensureChildren(const JobRef& job, const json& jobObj);
  // joiningRanks: replacements of an in-place recovery (EDIT_JOIN=1); status: the job's
  // new status (status.avoidNodes).
  // scaleJoin: the ranks are a scale-up's new replicas (EDIT_JOIN=scale).
  // Returns false when a pod could not be created yet (a leftover of the same name).
  bool createPods(const JobRef& job, const std::vector<int>& ranks, int restartGeneration,
                  const std::vector<int>& joiningRanks, const api::EDiTJobStatus& status, const json& jobObj,
                  bool scaleJoin = false, const PodGroupRef& group = {});
  // What creating a child found: it made it, the job's own was there (409), or one of
  // the same name that is not the job's (another controller's, or left by an earlier job
  // of the same name: waited out until the garbage collector removes it, never adopted).
  enum class Child { Created, Ours, Foreign };
  // Any refusal but 409 (Pod Security, quota, RBAC, a missing CRD) becomes a Warning event
  // FailedCreate on the job with the API's message, as a ReplicaSet does, and is thrown on.
  Child createChild(const kube::ResourceType& rt, const json& obj, const json& jobObj);
  // An existing child of the job's name that the job does not control: logged and waited
  // out when an earlier EDiTJob of this name owned it, else reported (event ChildConflict).
  Child notOurs(const kube::ResourceType& rt, const json& existing, const json& jobObj);
  void recordOnce(const json& jobObj, const std::string& reason, const std::string& msg);
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
  // job uid -> the API's refusal of the last pod create, until a create succeeds: the
  // planner shows it (condition PodsReady, reason FailedCreate).
  std::map<std::string, std::string> createErrors_;
  // job uid -> when its status was last written: progress alone is written at most every
  // kProgressWriteInterval (state changes at once).
  std::map<std::string, std::chrono::steady_clock::time_point> lastStatusWrite_;
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
  // A job event worth a reconcile: anything but a change of status alone (the operator's
  // own status writes would otherwise bring every job straight back).
  bool changedBeyondStatus(const std::string& type, const json& obj);

  Reconciler& reconciler_;
  kube::Informer& jobs_;
  kube::Informer& pods_;
  metrics::Metrics& metrics_;
  int workers_;
  int resyncSeconds_;
  kube::WorkQueue queue_;
  std::vector<std::thread> threads_;
  std::atomic<bool> stop_{false};
  std::mutex seenMu_;
  std::map<std::string, std::string> seen_;  // job key -> what of it besides status was seen last
};

}  // namespace edit::op::controller
