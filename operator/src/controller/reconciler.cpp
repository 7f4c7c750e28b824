#include "controller/reconciler.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "controller/export_pod.h"
#include "controller/export_policy.h"
#include "controller/failure_policy.h"
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
// Progress alone (the workers' step, loss, tokens/s, scores) reaches the status at most
// this often per job: 4 writes a minute, whatever the job's size and step rate. Phases,
// conditions and messages are written at once.
constexpr auto kProgressWriteInterval = std::chrono::seconds(15);
const char* const kLiveFields[] = {"progress", "lastReportTime", "stragglers", "link"};

json withoutLive(json st) {
  for (const char* f : kLiveFields) st.erase(f);
  return st;
}

const json* member(const json& o, const std::string& key) {
  if (!o.is_object()) return nullptr;
  auto it = o.find(key);
  return it == o.end() ? nullptr : &*it;
}
bool same(const json* a, const json* b) { return a == b || (a && b && *a == *b) || (!a && b && b->is_null()) || (!b && a && a->is_null()); }

// conditions as type -> condition.
std::map<std::string, json> byType(const json* conds) {
  std::map<std::string, json> out;
  if (conds && conds->is_array())
    for (const auto& c : *conds) out[c.value("type", "")] = c;
  return out;
}

}  // namespace

std::optional<json> mergeStatus(const json& base, const json& ours, const json& theirs) {
  json out = theirs.is_object() ? theirs : json::object();
  std::set<std::string> keys;
  for (const json* o : {&base, &ours})
    if (o->is_object())
      for (auto it = o->begin(); it != o->end(); ++it) keys.insert(it.key());
  for (const auto& key : keys) {
    const json *b = member(base, key), *o = member(ours, key), *t = member(theirs, key);
    if (same(o, b)) continue;
    if (!same(t, b) && !same(t, o)) {
      if (key != "conditions") return std::nullopt;
      auto bm = byType(b), om = byType(o), tm = byType(t);
      std::set<std::string> types;
      for (const auto* m : {&bm, &om})
        for (const auto& [type, c] : *m) types.insert(type);
      for (const auto& type : types) {
        const json* bc = bm.count(type) ? &bm[type] : nullptr;
        const json* oc = om.count(type) ? &om[type] : nullptr;
        const json* tc = tm.count(type) ? &tm[type] : nullptr;
        if (same(oc, bc)) continue;
        if (!same(tc, bc) && !same(tc, oc)) return std::nullopt;
        if (oc) tm[type] = *oc;
        else tm.erase(type);
      }
      json list = json::array();
      for (const auto& [type, c] : tm) list.push_back(c);
      out["conditions"] = list;
      continue;
    }
    if (o) out[key] = *o;
    else out.erase(key);
  }
  return out;
}

namespace {

}  // namespace

void Reconciler::recordOnce(const json& jobObj, const std::string& reason, const std::string& msg) {
  const std::string uid = jobObj["metadata"].value("uid", "");
  bool repeat = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto now = std::chrono::steady_clock::now();
    auto it = lastFailedCreate_.find(uid);
    repeat = it != lastFailedCreate_.end() && it->second.first == msg && now - it->second.second < kFailedCreateRepeat;
    if (!repeat) lastFailedCreate_[uid] = {msg, now};
  }
  if (!repeat) events_.record(jobObj, api::kWarning, reason, msg);
}

Reconciler::Child Reconciler::notOurs(const kube::ResourceType& rt, const json& existing, const json& jobObj) {
  const json& md = existing["metadata"];
  const std::string ns = md.value("namespace", ""), name = md.value("name", "");
  const std::string jobName = jobObj["metadata"].value("name", "");
  const json owner = controllerRef(existing);
  if (owner.value("kind", "") == api::kKind && owner.value("name", "") == jobName) {
    // An earlier job of this name was deleted and the garbage collector has not removed
    // its children yet (it works in the background, after `kubectl delete` returned):
    // wait for it, as a Job's controller waits for its old pods.
    log::info("waiting for the garbage collector to remove a child of an earlier job of the same name",
              {{"namespace", ns}, {"job", jobName}, {"kind", rt.kind}, {"name", name}, {"ownerUid", owner.value("uid", "")}});
    return Child::Foreign;
  }
  std::string kind = rt.kind;
  std::transform(kind.begin(), kind.end(), kind.begin(), [](unsigned char c) { return std::tolower(c); });
  const std::string by = !owner.empty() ? owner.value("kind", "") + " " + owner.value("name", "")
                                        : std::string("no controller");
  recordOnce(jobObj, api::reason::ChildConflict,
             kind + " " + name + " exists and is not this job's (controller: " + by +
                 "): delete it or give the job another name");
  return Child::Foreign;
}

Reconciler::Child Reconciler::createChild(const kube::ResourceType& rt, const json& obj, const json& jobObj) {
  const std::string ns = obj["metadata"].value("namespace", "");
  const std::string name = obj["metadata"].value("name", "");
  try {
    client_.create(rt, ns, obj);
    return Child::Created;
  } catch (const ApiError& e) {
    if (e.conflict()) {
      // A name of ours is taken: by our own child (created before), or by another's.
      auto existing = client_.tryGet(rt, ns, name);
      if (!existing) return Child::Foreign;  // gone meanwhile: created on the next try
      if (controllerRef(*existing).value("uid", "") == jobObj["metadata"].value("uid", "")) return Child::Ours;
      return notOurs(rt, *existing, jobObj);
    }
    if (e.reason() == "NotLeader") throw;
    // The API's own words ("pods \"x\" is forbidden: violates PodSecurity ..."), without our prefix.
    std::string apiMessage = e.what();
    if (apiMessage.rfind("HTTP ", 0) == 0 && apiMessage.find(": ") != std::string::npos)
      apiMessage = apiMessage.substr(apiMessage.find(": ") + 2);
    std::string kind = rt.kind;
    std::transform(kind.begin(), kind.end(), kind.begin(), [](unsigned char c) { return std::tolower(c); });
    const std::string msg = "Error creating " + kind + " " + name + ": " + apiMessage;
    if (rt.plural == "pods") {
      std::lock_guard<std::mutex> lock(mu_);
      createErrors_[jobObj["metadata"].value("uid", "")] = msg;
    }
    recordOnce(jobObj, api::reason::FailedCreate, msg);
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
  auto secret = client_.tryGet(res::Secrets, job.meta.ns, secretName(job.meta.name));
  if (secret && controllerRef(*secret).value("uid", "") != job.meta.uid) {
    if (mayCreate) notOurs(res::Secrets, *secret, jobObj);
    return "";
  }
  if (!secret && mayCreate) {
    // Created once; a lost race (409) means another writer made it: read it, if it is ours.
    const Child made = createChild(res::Secrets, desiredSecret(job, randomToken()), jobObj);
    if (made == Child::Foreign) return "";
    if (made == Child::Created)
      log::info("created telemetry secret", {{"namespace", job.meta.ns}, {"job", job.meta.name}});
    secret = client_.tryGet(res::Secrets, job.meta.ns, secretName(job.meta.name));
    if (secret && controllerRef(*secret).value("uid", "") != job.meta.uid) return "";
  }
  if (!secret) return "";
  std::string token;
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

bool Reconciler::ensureChildren(const JobRef& job, const json& jobObj) {
  const std::string& ns = job.meta.ns;
  bool ours = createChild(res::ConfigMaps, desiredConfigMap(job), jobObj) != Child::Foreign;
  ours = createChild(res::Services, desiredService(job), jobObj) != Child::Foreign && ours;
  if (settings_.workerNetworkPolicy)
    ours = createChild(res::NetworkPolicies, desiredNetworkPolicy(job, settings_), jobObj) != Child::Foreign && ours;
  json pg = desiredPodGroup(job);
  if (!pg.empty()) {
    const auto& rt = pg["apiVersion"] == "scheduling.volcano.sh/v1beta1" ? res::VolcanoPodGroups : res::CoschedulingPodGroups;
    try {
      // The group outlives a gang: a gang restarted or a scale finished at another size
      // must not leave a minMember that the new world cannot meet (its pods would stay
      // Pending) or that undercounts it.
      const Child made = createChild(rt, pg, jobObj);
      if (made == Child::Ours)
        client_.mergePatch(rt, ns, pg["metadata"]["name"].get<std::string>(),
                           {{"spec", {{"minMember", pg["spec"]["minMember"]}}}});
      ours = made != Child::Foreign && ours;
    } catch (const ApiError& e) {
      if (e.reason() == "NotLeader") throw;
      // No gang scheduler installed (the event says so): the pods are still created.
      log::warn("could not create PodGroup", {{"namespace", ns}, {"job", job.meta.name}, {"error", e.what()}});
    }
  }
  return ours;
}

bool Reconciler::createPods(const JobRef& job, const std::vector<int>& ranks, int restartGeneration,
                            const std::vector<int>& joiningRanks, const api::EDiTJobStatus& status,
                            const json& jobObj, bool scaleJoin, const PodGroupRef& group) {
  auto avoid = avoidNodesByRank(status);
  bool all = true;
  for (int rank : ranks) {
    const bool join = std::find(joiningRanks.begin(), joiningRanks.end(), rank) != joiningRanks.end();
    const PodJoin how = scaleJoin ? PodJoin::Scale : join ? PodJoin::Replace : PodJoin::Start;
    json pod = desiredPod(job, rank, restartGeneration, settings_, avoid[rank], how, group);
    const Child made = createChild(res::Pods, pod, jobObj);
    all = all && made != Child::Foreign;
    if (made != Child::Created) continue;
    {
      std::lock_guard<std::mutex> lock(mu_);
      createErrors_.erase(job.meta.uid);
    }
    if (scaleJoin)
      log::info("created pod of a new replica (joins at the next sync round)",
                {{"namespace", job.meta.ns}, {"job", job.meta.name}, {"rank", rank}});
    else if (join)
      log::info("created replacement pod (joins the running job)",
                {{"namespace", job.meta.ns}, {"job", job.meta.name}, {"rank", rank}});
    else
      log::debug("created pod", {{"namespace", job.meta.ns}, {"job", job.meta.name}, {"rank", rank}});
  }
  return all;
}

TelemetryView Reconciler::telemetryView(const JobRef& job, api::Phase phase, const std::vector<ObservedPod>& pods) {
  TelemetryView v;
  auto snap = hub_.snapshot(job.meta.ns, job.meta.name);
  if (!snap || !snap->hasReports) return v;
  v.present = true;
  v.progress = progressOf(snap->progress);
  v.lowestStep = static_cast<long>(snap->lowestStep);
  for (const auto& s : snap->stragglers) {
    std::string pod = s.pod.empty() ? podName(job.meta.name, s.rank) : s.pod;
    std::string node = s.node;
    for (const auto& p : pods)
      if (p.rank == s.rank && node.empty()) node = p.node;
    v.stragglers.push_back({s.rank, pod, node, std::round(s.score * 100) / 100});
  }
  v.lastReportTime = log::rfc3339(static_cast<std::time_t>(snap->lastReportUnix));
  const double now = telemetry::unixNow();
  v.quietSeconds = std::max(0.0, now - snap->lastReportUnix);
  for (const auto& [rank, r] : snap->ranks)
    v.ranks[rank] = {r.podUid, static_cast<long>(r.step), std::max(0.0, now - r.lastSeenUnix), r.local};
  if (auto r0 = snap->ranks.find(0); r0 != snap->ranks.end()) v.replicas = r0->second.replicas;
  const double hang = static_cast<double>(job.spec.hangTimeoutSeconds);
  v.hung = phase == api::Phase::Running && hub_.hung(job.meta.ns, job.meta.name, hang);
  v.hungPastRecovery = v.hung && hub_.hung(job.meta.ns, job.meta.name,
                                           std::max(hang, static_cast<double>(runtimeRecoverySeconds(job.spec))));
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
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = createErrors_.find(in.meta.uid); it != createErrors_.end()) in.createError = it->second;
  }
  const std::string token = ensureToken(*o.job, !api::isFinished(o.oldPhase), jobObj);
  const auto& sp = in.spec->stragglerPolicy;
  if (!token.empty())
    hub_.registerJob(in.meta.ns, in.meta.name, token, {sp.threshold, sp.windowSteps, sp.minReports},
                     in.status.value("restartGeneration", 0),
                     in.spec->shardsPerReplica * std::max(in.spec->replicas, in.status.value("replicas", 0)),
                     in.meta.uid);
  in.telemetry = telemetryView(*o.job, o.oldPhase, in.pods);
  return o;
}

// The one status write: if we crash after it, the next run sees the new generation and
// cleans up the old pods instead of counting the same failure twice. Written with the
// resourceVersion this reconcile read: a status someone else wrote meanwhile (another
// operator replica, a user) is merged, never overwritten (mergeStatus).
void Reconciler::persistStatus(const Observed& o, const Plan& plan, std::optional<std::chrono::milliseconds>* later) {
  const json st = plan.status.toJson();
  if (st == o.in.status) return;
  const api::JobMeta& meta = o.in.meta;
  const auto now = std::chrono::steady_clock::now();
  if (withoutLive(st) == withoutLive(o.in.status)) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = lastStatusWrite_.find(meta.uid);
    if (it != lastStatusWrite_.end() && now - it->second < kProgressWriteInterval) {
      *later = std::chrono::duration_cast<std::chrono::milliseconds>(kProgressWriteInterval - (now - it->second));
      return;
    }
  }
  json obj = o.obj;
  obj["status"] = st;
  for (int attempt = 0;; ++attempt) {
    try {
      client_.updateStatus(res::EDiTJobs, meta.ns, obj);
      break;
    } catch (const ApiError& e) {
      if (e.notFound()) return;
      if (!e.conflict() || attempt >= 3) throw;
      auto fresh = client_.tryGet(res::EDiTJobs, meta.ns, meta.name);
      if (!fresh || (*fresh)["metadata"].value("uid", "") != meta.uid) return;
      auto merged = mergeStatus(o.in.status, st, fresh->value("status", json::object()));
      if (!merged)
        throw ApiError(409, "Conflict",
                       "the status changed meanwhile where this reconcile changed it too; planning again");
      obj = *fresh;
      obj["status"] = *merged;
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  lastStatusWrite_[meta.uid] = now;
}

// The telemetry hub follows the plan (generations, ranks, scale requests); metrics and events.
void Reconciler::applyTelemetry(const Observed& o, const Plan& plan) {
  const std::string &ns = o.in.meta.ns, &name = o.in.meta.name;
  const api::Phase phase = plan.status.phase;
  if (plan.gangRestarted) metrics_.jobRestarted();
  if (plan.gangRestarted || plan.resetTelemetry) hub_.resetJob(ns, name, plan.status.restartGeneration.value_or(0));
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

// Each delete carries the UID of the pod the plan was made on: a pod of the same name
// created meanwhile (a replacement) is not the one the plan meant.
void Reconciler::applyDeletes(const Observed& o, const Plan& plan) {
  std::map<std::string, std::string> uids;
  for (const auto& p : o.in.pods) uids[p.name] = p.uid;
  for (const auto& p : o.exportPods) uids[p.name] = p.uid;
  for (const auto& pod : plan.podsToDelete)
    client_.remove(res::Pods, o.in.meta.ns, pod, "Background", plan.deleteImmediately ? 0 : -1, uids[pod]);
}

// Children, the missing pods of the gang, a scale-up's new pods. The pods enter the world
// the workers run (status.replicas), not spec.replicas.
bool Reconciler::applyCreates(const Observed& o, const Plan& plan) {
  if (!o.job) return true;
  const int restartGen = plan.status.restartGeneration.value_or(0);
  JobRef running = *o.job;
  running.spec.replicas = plan.replicas;
  if (plan.ensureChildren) {
    // Pods only once the job's own Secret and ConfigMap exist: a pod that read a leftover's
    // would run with the wrong token or config, or wait on a Secret the garbage collector
    // deletes under it.
    const bool tokenReady = !ensureToken(running, true, o.obj).empty();
    const bool childrenReady = ensureChildren(running, o.obj);
    if (!tokenReady || !childrenReady) return false;
  }
  bool all = true;
  if (!plan.ranksToCreate.empty()) {
    all = createPods(running, plan.ranksToCreate, restartGen, plan.joiningRanks, plan.status, o.obj);
    if (plan.gangCreated) metrics_.jobCreated();
  }
  if (!plan.scaleJoinRanks.empty()) {
    JobRef larger = *o.job;
    larger.spec.replicas = plan.scaleTo;
    const std::string start = plan.status.scaling ? plan.status.scaling->startTime : "";
    const PodGroupRef group = scalePodGroup(larger, restartGen, plan.replicas, plan.scaleTo,
                                            static_cast<long>(log::parseRfc3339(start)));
    all = createPods(larger, plan.scaleJoinRanks, restartGen, {}, plan.status, o.obj, true, group) && all;
  }
  return all;
}

void Reconciler::applyExport(const Observed& o, std::optional<int> attempt) {
  if (!o.job || !attempt) return;
  const std::string &ns = o.in.meta.ns, &name = o.in.meta.name;
  if (createChild(res::Pods, desiredExportPod(*o.job, *attempt), o.obj) == Child::Created)
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

  std::optional<std::chrono::milliseconds> progressLater;
  persistStatus(o, plan, &progressLater);
  applyTelemetry(o, plan);
  applyDeletes(o, plan);
  const bool created = applyCreates(o, plan);
  applyExport(o, exportAttempt);
  if (plan.deleteJob) {
    log::info("deleting finished job (ttlSecondsAfterFinished)", {{"namespace", ns}, {"job", name}});
    client_.remove(res::EDiTJobs, ns, name, "Background", -1, o.in.meta.uid);
    forget(ns, name);
    return std::nullopt;
  }
  auto requeue = requeueAfter(o, plan);
  auto sooner = [&requeue](std::chrono::milliseconds d) {
    if (!requeue || d < *requeue) requeue = d;
  };
  if (progressLater) sooner(*progressLater);
  if (!created) sooner(std::chrono::milliseconds(1000));  // a leftover of the same name is going
  return requeue;
}

}  // namespace edit::op::controller
