#include "controller/reconciler.h"

#include <algorithm>
#include <cmath>

#include "controller/export_pod.h"
#include "controller/export_policy.h"
#include "util/log.h"

namespace edit::op::controller {

namespace {

using kube::ApiError;
namespace res = kube::resources;

api::Progress progressOf(const telemetry::Progress& p) {
  // Rounded so that status changes only when something a reader sees changes.
  auto round3 = [](double v) { return std::round(v * 1000.0) / 1000.0; };
  api::Progress out;
  out.step = static_cast<long>(p.step);
  out.totalSteps = static_cast<long>(p.totalSteps);
  out.tokens = static_cast<long>(p.tokens);
  out.loss = round3(p.loss);
  out.tokensPerSecond = std::round(p.tokensPerSecond);
  out.syncRounds = static_cast<long>(p.syncRounds);
  out.anomalies = static_cast<long>(p.anomalies);
  if (p.etaSeconds >= 0) out.etaSeconds = std::round(p.etaSeconds);
  return out;
}

constexpr auto kFailedCreateRepeat = std::chrono::minutes(5);

}  // namespace

bool Reconciler::createChild(const kube::ResourceType& rt, const json& obj, const json& jobObj) {
  const std::string ns = obj["metadata"].value("namespace", "");
  try {
    client_.create(rt, ns, obj);
    return true;
  } catch (const ApiError& e) {
    if (e.conflict()) return false;  // deterministic name: it already exists
    // The API's own words ("pods \"x\" is forbidden: violates PodSecurity ..."), without our prefix.
    std::string apiMessage = e.what();
    if (apiMessage.rfind("HTTP ", 0) == 0 && apiMessage.find(": ") != std::string::npos)
      apiMessage = apiMessage.substr(apiMessage.find(": ") + 2);
    std::string kind = rt.kind;
    std::transform(kind.begin(), kind.end(), kind.begin(), [](unsigned char c) { return std::tolower(c); });
    const std::string msg = "Error creating " + kind + " " + obj["metadata"].value("name", "") + ": " + apiMessage;
    const std::string uid = jobObj["metadata"].value("uid", "");
    bool repeat = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto now = std::chrono::steady_clock::now();
      auto it = lastFailedCreate_.find(uid);
      repeat = it != lastFailedCreate_.end() && it->second.first == msg && now - it->second.second < kFailedCreateRepeat;
      if (!repeat) lastFailedCreate_[uid] = {msg, now};
    }
    if (!repeat) events_.record(jobObj, api::kWarning, api::reason::FailedCreate, msg);
    throw;
  }
}

std::vector<json> Reconciler::ownedPods(const api::JobMeta& meta) {
  std::vector<json> out;
  for (auto& pod : pods_.list(meta.ns, {{api::kLabelJob, meta.name}})) {
    const json refs = pod["metadata"].value("ownerReferences", json::array());
    bool ours = false, otherController = false;
    for (const auto& r : refs) {
      if (!r.value("controller", false)) continue;
      if (r.value("uid", "") == meta.uid) ours = true;
      else otherController = true;
    }
    if (otherController) continue;
    if (!ours) {
      // An orphan with our label (e.g. its owner reference was removed): adopt it.
      std::string name = pod["metadata"].value("name", "");
      try {
        client_.mergePatch(res::Pods, meta.ns, name, {{"metadata", {{"ownerReferences", json::array({ownerReference(meta)})}}}});
        log::info("adopted pod", {{"namespace", meta.ns}, {"job", meta.name}, {"pod", name}});
      } catch (const std::exception& e) {
        log::warn("could not adopt pod", {{"namespace", meta.ns}, {"job", meta.name}, {"pod", name}, {"error", e.what()}});
        continue;
      }
    }
    out.push_back(std::move(pod));
  }
  return out;
}

std::string Reconciler::ensureToken(const JobRef& job, bool mayCreate, const json& jobObj) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = tokens_.find(job.meta.uid);
    if (it != tokens_.end()) return it->second;
  }
  std::string token;
  auto secret = client_.tryGet(res::Secrets, job.meta.ns, secretName(job.meta.name));
  if (!secret && mayCreate) {
    // Created once; a lost race (409) means another writer made it: read theirs.
    if (createChild(res::Secrets, desiredSecret(job, randomToken()), jobObj))
      log::info("created telemetry secret", {{"namespace", job.meta.ns}, {"job", job.meta.name}});
    secret = client_.tryGet(res::Secrets, job.meta.ns, secretName(job.meta.name));
  }
  if (!secret) return "";
  if (secret->contains("data") && (*secret)["data"].contains(kTokenKey))
    token = kube::base64Decode((*secret)["data"][kTokenKey].get<std::string>());
  else if (secret->contains("stringData") && (*secret)["stringData"].contains(kTokenKey))
    token = (*secret)["stringData"][kTokenKey].get<std::string>();
  if (!token.empty()) {
    std::lock_guard<std::mutex> lock(mu_);
    tokens_[job.meta.uid] = token;
  }
  return token;
}

void Reconciler::ensureChildren(const JobRef& job, const json& jobObj) {
  const std::string& ns = job.meta.ns;
  createChild(res::ConfigMaps, desiredConfigMap(job), jobObj);
  createChild(res::Services, desiredService(job), jobObj);
  json pg = desiredPodGroup(job);
  if (!pg.empty()) {
    const auto& rt = pg["apiVersion"] == "scheduling.volcano.sh/v1beta1" ? res::VolcanoPodGroups : res::CoschedulingPodGroups;
    try {
      // The group outlives a gang: a gang restarted or a scale finished at another size
      // must not leave a minMember that the new world cannot meet (its pods would stay
      // Pending) or that undercounts it.
      if (!createChild(rt, pg, jobObj))
        client_.mergePatch(rt, ns, pg["metadata"]["name"].get<std::string>(),
                           {{"spec", {{"minMember", pg["spec"]["minMember"]}}}});
    } catch (const ApiError& e) {
      // No gang scheduler installed (the event says so): the pods are still created.
      log::warn("could not create PodGroup", {{"namespace", ns}, {"job", job.meta.name}, {"error", e.what()}});
    }
  }
}

void Reconciler::createPods(const JobRef& job, const std::vector<int>& ranks, int restartGeneration,
                            const std::vector<int>& joiningRanks, const api::EDiTJobStatus& status,
                            const json& jobObj, bool scaleJoin, const PodGroupRef& group) {
  auto avoid = avoidNodesByRank(status);
  for (int rank : ranks) {
    const bool join = std::find(joiningRanks.begin(), joiningRanks.end(), rank) != joiningRanks.end();
    const PodJoin how = scaleJoin ? PodJoin::Scale : join ? PodJoin::Replace : PodJoin::Start;
    json pod = desiredPod(job, rank, restartGeneration, settings_, avoid[rank], how, group);
    if (createChild(res::Pods, pod, jobObj)) {
      if (scaleJoin)
        log::info("created pod of a new replica (joins at the next sync round)",
                  {{"namespace", job.meta.ns}, {"job", job.meta.name}, {"rank", rank}});
      else if (join)
        log::info("created replacement pod (joins the running job)",
                  {{"namespace", job.meta.ns}, {"job", job.meta.name}, {"rank", rank}});
      else
        log::debug("created pod", {{"namespace", job.meta.ns}, {"job", job.meta.name}, {"rank", rank}});
    }
  }
}

TelemetryView Reconciler::telemetryView(const JobRef& job, api::Phase phase, const std::vector<ObservedPod>& pods) {
  TelemetryView v;
  auto snap = hub_.snapshot(job.meta.ns, job.meta.name);
  if (!snap || !snap->hasReports) return v;
  v.present = true;
  v.progress = progressOf(snap->progress);
  for (const auto& s : snap->stragglers) {
    std::string pod = s.pod.empty() ? podName(job.meta.name, s.rank) : s.pod;
    std::string node = s.node;
    for (const auto& p : pods)
      if (p.rank == s.rank && node.empty()) node = p.node;
    v.stragglers.push_back({s.rank, pod, node, std::round(s.score * 100) / 100});
  }
  v.lastReportTime = log::rfc3339(static_cast<std::time_t>(snap->lastReportUnix));
  const double now = telemetry::unixNow();
  for (const auto& [rank, r] : snap->ranks)
    v.ranks[rank] = {r.podUid, static_cast<long>(r.step), std::max(0.0, now - r.lastSeenUnix), r.local};
  if (auto r0 = snap->ranks.find(0); r0 != snap->ranks.end()) v.replicas = r0->second.replicas;
  v.hung = phase == api::Phase::Running && hub_.hung(job.meta.ns, job.meta.name, static_cast<double>(job.spec.hangTimeoutSeconds));
  return v;
}

void Reconciler::forget(const std::string& ns, const std::string& name) { hub_.forgetJob(ns, name); }

// Observe: the job's spec (invalid: specError), its pods and its workers' telemetry.
Reconciler::Observed Reconciler::observe(const json& jobObj) {
  Observed o;
  o.obj = jobObj;
  PlanInput& in = o.in;
  in.meta = api::parseMeta(jobObj);
  in.now = std::time(nullptr);
  in.status = jobObj.value("status", json::object());
  try {
    in.spec = api::parseSpec(jobObj);
    api::validateName(in.meta.name, in.spec->worldSize());
    checkWorkerConfig(JobRef{in.meta, *in.spec});
    checkExport(JobRef{in.meta, *in.spec});
  } catch (const api::SpecError& e) {
    in.spec.reset();
    in.specError = e.what();
  }
  o.oldPhase = api::parsePhase(in.status.value("phase", ""));
  for (const auto& p : ownedPods(in.meta)) {
    if (isExportPod(p)) o.exportPods.push_back(observeExportPod(p));  // spec.export's pods are not workers
    else in.pods.push_back(observePod(p));
  }
  if (!in.spec) return o;
  o.job = JobRef{in.meta, *in.spec};
  const std::string token = ensureToken(*o.job, !api::isFinished(o.oldPhase), jobObj);
  const auto& sp = in.spec->stragglerPolicy;
  if (!token.empty())
    hub_.registerJob(in.meta.ns, in.meta.name, token, {sp.threshold, sp.windowSteps, sp.minReports},
                     in.status.value("restartGeneration", 0),
                     in.spec->shardsPerReplica * std::max(in.spec->replicas, in.status.value("replicas", 0)));
  in.telemetry = telemetryView(*o.job, o.oldPhase, in.pods);
  return o;
}

// The one status write: if we crash after it, the next run sees the new generation and
// cleans up the old pods instead of counting the same failure twice.
void Reconciler::persistStatus(const Observed& o, const Plan& plan) {
  const json st = plan.status.toJson();
  if (st == o.in.status) return;
  const api::JobMeta& meta = o.in.meta;
  client_.updateStatusWithRetry(res::EDiTJobs, meta.ns, meta.name, [&](json& obj) {
    if (obj["metadata"].value("uid", "") != meta.uid) return false;
    obj["status"] = st;
    return true;
  });
}

// The telemetry hub follows the plan (generations, ranks, scale requests); metrics and events.
void Reconciler::applyTelemetry(const Observed& o, const Plan& plan) {
  const std::string &ns = o.in.meta.ns, &name = o.in.meta.name;
  const api::Phase phase = plan.status.phase;
  if (plan.gangRestarted) {
    hub_.resetJob(ns, name, plan.status.restartGeneration.value_or(0));
    metrics_.jobRestarted();
  }
  if (phase != o.oldPhase) {
    log::info("phase", {{"namespace", ns}, {"job", name}, {"from", api::phaseName(o.oldPhase)}, {"to", api::phaseName(phase)}});
    if (phase == api::Phase::Succeeded) metrics_.jobSucceeded();
    if (phase == api::Phase::Failed) metrics_.jobFailed();
  }
  metrics_.setJobPhase(ns, name, phase);
  metrics_.setJobRestarts(ns, name, plan.status.restarts.value_or(0));
  metrics_.setJobReplicaRecoveries(ns, name, plan.status.replicaRecoveries.value_or(0));
  if (o.job) metrics_.setJobReplicas(ns, name, plan.replicas);
  if (o.job && plan.status.link) metrics_.setJobSyncBlocked(ns, name, plan.status.link->blockedShare);
  for (const auto& ev : plan.events) events_.record(o.obj, ev.type, ev.reason, ev.message);

  for (const auto& [rank, node] : plan.replacedRanks) hub_.resetRank(ns, name, rank);
  if (plan.recoverySeconds) metrics_.replicaRecovered(static_cast<double>(*plan.recoverySeconds));
  for (int rank : plan.recoveredRanks) hub_.resetRank(ns, name, rank);  // its replacement starts a new window
  for (int rank : plan.leftRanks) hub_.removeRank(ns, name, rank);
  if (plan.scaleEnded) metrics_.jobScaled(plan.scaleEnded->result, plan.scaleEnded->seconds);
  if (plan.scaleRequest)
    hub_.sendScale(ns, name, 0, *plan.scaleRequest, "spec.replicas is " + std::to_string(*plan.scaleRequest));
}

void Reconciler::applyDeletes(const Observed& o, const Plan& plan) {
  for (const auto& pod : plan.podsToDelete)
    client_.remove(res::Pods, o.in.meta.ns, pod, "Background", plan.deleteImmediately ? 0 : -1);
}

// Children, the missing pods of the gang, a scale-up's new pods. The pods enter the world
// the workers run (status.replicas), not spec.replicas.
void Reconciler::applyCreates(const Observed& o, const Plan& plan) {
  if (!o.job) return;
  const int restartGen = plan.status.restartGeneration.value_or(0);
  JobRef running = *o.job;
  running.spec.replicas = plan.replicas;
  if (plan.ensureChildren) {
    ensureToken(running, true, o.obj);
    ensureChildren(running, o.obj);
  }
  if (!plan.ranksToCreate.empty()) {
    createPods(running, plan.ranksToCreate, restartGen, plan.joiningRanks, plan.status, o.obj);
    if (plan.gangCreated) metrics_.jobCreated();
  }
  if (!plan.scaleJoinRanks.empty()) {
    JobRef larger = *o.job;
    larger.spec.replicas = plan.scaleTo;
    const std::string start = plan.status.scaling ? plan.status.scaling->startTime : "";
    const PodGroupRef group = scalePodGroup(larger, restartGen, plan.replicas, plan.scaleTo,
                                            static_cast<long>(log::parseRfc3339(start)));
    createPods(larger, plan.scaleJoinRanks, restartGen, {}, plan.status, o.obj, true, group);
  }
}

void Reconciler::applyExport(const Observed& o, std::optional<int> attempt) {
  if (!o.job || !attempt) return;
  const std::string &ns = o.in.meta.ns, &name = o.in.meta.name;
  if (createChild(res::Pods, desiredExportPod(*o.job, *attempt), o.obj))
    log::info("created export pod", {{"namespace", ns}, {"job", name}, {"pod", exportPodName(name, *attempt)}});
}

std::optional<std::chrono::milliseconds> Reconciler::requeueAfter(const Observed& o, const Plan& plan) {
  std::optional<std::chrono::milliseconds> requeue;
  if (plan.requeueAfterSeconds) requeue = std::chrono::milliseconds(*plan.requeueAfterSeconds * 1000);
  if (o.job && plan.status.phase == api::Phase::Running && o.job->spec.hangTimeoutSeconds > 0) {
    // Hang detection needs a look even when nothing changes.
    auto check = std::chrono::milliseconds(std::min<long>(o.job->spec.hangTimeoutSeconds, 15) * 1000);
    if (!requeue || check < *requeue) requeue = check;
  }
  return requeue;
}

// observe -> plan (pure) -> persist the status once -> apply: telemetry, deletes,
// creates, the export pod, the TTL delete.
std::optional<std::chrono::milliseconds> Reconciler::reconcile(const std::string& ns, const std::string& name) {
  auto jobObj = client_.tryGet(res::EDiTJobs, ns, name);
  if (!jobObj) {
    forget(ns, name);
    return std::nullopt;
  }
  if (api::parseMeta(*jobObj).deleting) return std::nullopt;  // garbage collection removes the children
  const Observed o = observe(*jobObj);

  Plan plan = planReconcile(o.in);
  std::optional<int> exportAttempt;
  if (o.job && o.job->spec.exportModel)
    exportAttempt = mergeExportPlan(plan, {o.job->spec.exportModel, exportOutDir(*o.job), o.job->spec.runPolicy.cleanPodPolicy,
                                           plan.status, o.in.meta.generation, o.exportPods, o.in.now});

  persistStatus(o, plan);
  applyTelemetry(o, plan);
  applyDeletes(o, plan);
  applyCreates(o, plan);
  applyExport(o, exportAttempt);
  if (plan.deleteJob) {
    log::info("deleting finished job (ttlSecondsAfterFinished)", {{"namespace", ns}, {"job", name}});
    client_.remove(res::EDiTJobs, ns, name, "Background");
    forget(ns, name);
    return std::nullopt;
  }
  return requeueAfter(o, plan);
}

Controller::Controller(Reconciler& reconciler, kube::Informer& jobs, kube::Informer& pods, metrics::Metrics& metrics,
                       int workers, int resyncSeconds)
    : reconciler_(reconciler), jobs_(jobs), pods_(pods), metrics_(metrics), workers_(std::max(1, workers)),
      resyncSeconds_(resyncSeconds) {
  jobs_.addHandler([this](const std::string&, const json& obj) { queue_.add(kube::objectKey(obj)); });
  pods_.addHandler([this](const std::string&, const json& obj) {
    const json labels = obj["metadata"].value("labels", json::object());
    if (labels.contains(api::kLabelJob))
      queue_.add(obj["metadata"].value("namespace", "") + "/" + labels[api::kLabelJob].get<std::string>());
  });
}

Controller::~Controller() { stop(); }

void Controller::start() {
  for (int i = 0; i < workers_; ++i) threads_.emplace_back([this] { work(); });
  if (resyncSeconds_ > 0)
    threads_.emplace_back([this] {
      auto next = std::chrono::steady_clock::now() + std::chrono::seconds(resyncSeconds_);
      while (!stop_) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        if (std::chrono::steady_clock::now() < next) continue;
        next += std::chrono::seconds(resyncSeconds_);
        for (const auto& key : jobs_.keys()) queue_.add(key);
      }
    });
}

void Controller::stop() {
  if (stop_.exchange(true)) return;
  queue_.shutdown();
  for (auto& t : threads_)
    if (t.joinable()) t.join();
}

void Controller::work() {
  while (auto key = queue_.get()) {
    auto t0 = std::chrono::steady_clock::now();
    auto slash = key->find('/');
    std::string ns = key->substr(0, slash), name = key->substr(slash + 1);
    std::string result = "success";
    try {
      auto requeue = reconciler_.reconcile(ns, name);
      queue_.forget(*key);
      if (requeue) {
        queue_.addAfter(*key, *requeue);
        result = "requeue";
      }
    } catch (const std::exception& e) {
      result = "error";
      log::warn("reconcile failed", {{"namespace", ns}, {"job", name}, {"error", e.what()}});
      queue_.addRateLimited(*key);
    }
    metrics_.reconcileDone(result, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    queue_.done(*key);
  }
}

}  // namespace edit::op::controller
