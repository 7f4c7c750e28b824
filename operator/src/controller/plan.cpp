// The planner's lifecycle policy: the phases (Pending, Created, Running, Succeeded,
// Failed, Suspended), activeDeadlineSeconds, cleanPodPolicy and the TTL, and creating the
// pods that are missing. Failures: plan_failures.cpp; stragglers: plan_stragglers.cpp.
#include <algorithm>
#include <set>

#include "controller/desired.h"
#include "controller/planner.h"
#include "util/log.h"

namespace edit::op::controller {

std::map<int, std::set<std::string>> avoidNodesFromStatus(const json& status) {
  std::map<int, std::set<std::string>> out;
  if (!status.is_object() || !status.contains("avoidNodes") || !status["avoidNodes"].is_array()) return out;
  for (const auto& e : status["avoidNodes"])
    if (e.is_object() && e.contains("rank") && e["rank"].is_number_integer() && e.contains("node") &&
        e["node"].is_string() && !e["node"].get<std::string>().empty())
      out[e["rank"].get<int>()].insert(e["node"].get<std::string>());
  return out;
}

const json* findCondition(const json& status, const std::string& type) {
  if (!status.contains("conditions")) return nullptr;
  for (const auto& c : status["conditions"])
    if (c.value("type", "") == type) return &c;
  return nullptr;
}

bool setCondition(json& status, const std::string& type, const std::string& condStatus, const std::string& reason,
                  const std::string& message, const std::string& now, long observedGeneration) {
  if (!status.contains("conditions") || !status["conditions"].is_array()) status["conditions"] = json::array();
  for (auto& c : status["conditions"]) {
    if (c.value("type", "") != type) continue;
    if (c.value("status", "") == condStatus && c.value("reason", "") == reason && c.value("message", "") == message &&
        c.value("observedGeneration", 0L) == observedGeneration)
      return false;
    if (c.value("status", "") != condStatus) c["lastTransitionTime"] = now;
    c["status"] = condStatus;
    c["reason"] = reason;
    c["message"] = message;
    c["observedGeneration"] = observedGeneration;
    return true;
  }
  status["conditions"].push_back({{"type", type}, {"status", condStatus}, {"reason", reason}, {"message", message},
                                  {"lastTransitionTime", now}, {"observedGeneration", observedGeneration}});
  return true;
}

Plan planReconcile(const PlanInput& in) { return Planner(in).run(); }

Planner::Planner(const PlanInput& in) : in_(in), st_(in.status.is_object() ? in.status : json::object()) {
  now_ = log::rfc3339(in.now);
  gen_ = in.meta.generation;
  phase_ = st_.value("phase", "");
  restartGen_ = st_.value("restartGeneration", 0);
  budget_.gangRestarts = st_.value("restarts", 0);
  budget_.inPlaceRecoveries = st_.value("replicaRecoveries", 0);
  budget_.disruptions = st_.value("disruptions", 0);
  recovery_ = RecoveryRecord::fromStatus(st_);
  if (!recovery_) st_.erase("recovery");  // unreadable: nothing to resume
}

Plan Planner::run() {
  st_["observedGeneration"] = gen_;
  st_["restarts"] = budget_.gangRestarts;  // 0 shows in kubectl get ej -o wide (RESTARTS), not blank
  if (!in_.spec) return invalid();
  // The world the workers run: status.replicas once a gang started (a change of
  // spec.replicas is a scale, plan_scaling.cpp), else spec.replicas.
  running_ = *in_.spec;
  const json* trained = st_.contains("replicas") ? &st_["replicas"] : nullptr;
  if (trained && trained->is_number_integer() && trained->get<int>() >= 1 &&
      trained->get<int>() * running_.shardsPerReplica <= 4096)
    running_.replicas = trained->get<int>();
  spec_ = &running_;
  adoptReplicas(running_.replicas);
  st_["selector"] = podSelector(in_.meta.name);
  budget_.limit = spec_->runPolicy.backoffLimit;
  countWorkers();
  if (phase_ == "Succeeded" || phase_ == "Failed") return finished();
  if (spec_->runPolicy.suspend) return suspended();
  if (phase_ == "Suspended") {
    cond("Suspended", "False", "Resumed", "job resumed");
    event("Normal", "Resumed", "job resumed; recreating workers");
    setPhase("Pending");
  }
  if (phase_.empty()) setPhase("Pending");

  // The old gang must be gone before the new one (same pod names) is created.
  bool stale = false;
  for (const auto& pod : in_.pods) {
    if (pod.generation == restartGen_) continue;
    stale = true;
    if (!pod.deleting) plan_.podsToDelete.push_back(pod.name);
  }
  if (stale) {
    plan_.requeueAfterSeconds = 1;
    return done();
  }

  if (deadlineExceeded()) return done();
  noteDisruptions();
  if (handleFailures()) return done();
  planScaling();
  if (succeeded()) return done();
  createMissing();
  updateRunning();
  mergeTelemetry();
  planLink();
  return done();
}

Plan Planner::done() {
  countWorkers();
  if (spec_) plan_.replicas = running_.replicas;
  plan_.status = st_;
  return plan_;
}

std::vector<const ObservedPod*> Planner::current() const {
  std::vector<const ObservedPod*> out;
  // Ranks beyond the world are a scale's new or leaving pods (plan_scaling.cpp).
  for (const auto& p : in_.pods)
    if (p.generation == restartGen_ && (!spec_ || p.rank < spec_->worldSize())) out.push_back(&p);
  return out;
}

void Planner::countWorkers() {
  int total = spec_ ? spec_->worldSize() : 0;
  int pending = 0, running = 0, succeeded = 0, failed = 0;
  for (const auto* p : current()) {
    if (p->phase == "Running") running++;
    else if (p->phase == "Succeeded") succeeded++;
    else if (p->phase == "Failed") failed++;
    else pending++;
  }
  st_["workers"] = {{"total", total}, {"pending", pending}, {"running", running}, {"succeeded", succeeded},
                    {"failed", failed}};
}

Plan Planner::invalid() {
  if (phase_ != "Failed") {
    setPhase("Failed");
    st_["completionTime"] = now_;
    event("Warning", "InvalidSpec", in_.specError);
  }
  st_["message"] = in_.specError;
  cond("Failed", "True", "InvalidSpec", in_.specError);
  plan_.status = st_;
  return plan_;
}

// Deletes pods the finished job no longer needs, by runPolicy.cleanPodPolicy.
void Planner::cleanup(bool forceRunning) {
  const std::string& policy = spec_->runPolicy.cleanPodPolicy;
  for (const auto& p : in_.pods) {
    if (p.deleting) continue;
    bool active = p.phase == "Running" || p.phase == "Pending" || p.phase == "Unknown";
    if (policy == "All" || ((policy == "Running" || forceRunning) && active)) plan_.podsToDelete.push_back(p.name);
  }
}

void Planner::scheduleTtl() {
  if (!spec_->runPolicy.ttlSecondsAfterFinished) return;
  std::time_t finished = log::parseRfc3339(st_.value("completionTime", ""));
  if (!finished) finished = in_.now;
  long remaining = static_cast<long>(finished + *spec_->runPolicy.ttlSecondsAfterFinished - in_.now);
  if (remaining <= 0)
    plan_.deleteJob = true;
  else
    plan_.requeueAfterSeconds = remaining;
}

Plan Planner::finished() {
  cleanup(false);
  scheduleTtl();
  return done();
}

Plan Planner::suspended() {
  for (const auto& p : in_.pods)
    if (!p.deleting) plan_.podsToDelete.push_back(p.name);
  if (phase_ != "Suspended") {
    setPhase("Suspended");
    cond("Suspended", "True", "Suspended", "runPolicy.suspend is true");
    if (findCondition(st_, "Running")) cond("Running", "False", "Suspended", "job suspended");
    event("Normal", "Suspended", "job suspended; workers deleted");
    st_.erase("startTime");  // the deadline counts from the next start
  }
  clearRecovery("Suspended", "job suspended");  // resuming creates a whole new gang
  clearScaling("Suspended", "job suspended; spec.replicas applies on resume");
  clearDisruption("Suspended", "job suspended");
  return done();
}

void Planner::fail(const std::string& reason, const std::string& msg, bool stopRunning) {
  setPhase("Failed");
  st_["completionTime"] = now_;
  st_["message"] = msg;
  cond("Failed", "True", reason, msg);
  if (findCondition(st_, "Running")) cond("Running", "False", reason, msg);
  if (findCondition(st_, "Restarting")) cond("Restarting", "False", reason, msg);
  clearRecovery(reason, msg);
  clearDisruption(reason, msg);
  clearScaling(reason, msg);
  event("Warning", reason, msg);
  cleanup(stopRunning);
  scheduleTtl();
}

bool Planner::deadlineExceeded() {
  if (!spec_->runPolicy.activeDeadlineSeconds || !st_.contains("startTime")) return false;
  std::time_t started = log::parseRfc3339(st_.value("startTime", ""));
  if (!started) return false;
  long left = static_cast<long>(started + *spec_->runPolicy.activeDeadlineSeconds - in_.now);
  if (left > 0) {
    plan_.requeueAfterSeconds = left;
    return false;
  }
  fail("DeadlineExceeded",
       "job ran longer than runPolicy.activeDeadlineSeconds=" + std::to_string(*spec_->runPolicy.activeDeadlineSeconds),
       true);
  return true;
}

bool Planner::succeeded() {
  int ok = 0;
  std::set<int> done;
  for (const auto* p : current())
    if (p->phase == "Succeeded") {
      ok++;
      done.insert(p->rank);
    }
  std::string unneeded;
  if (ok < spec_->worldSize()) {
    // A pod deleted just as its worker finished goes before its exit is seen, and its
    // rank is replaced in place (vanished()). If every other rank then succeeds, the
    // gang finished without the replacement: the end of training is collective (the
    // final sync, evaluation and checkpoint barrier need every rank), so the deleted
    // worker got there too. Its replacement, waiting to join, is not needed.
    if (!recovery_ || ok == 0) return false;
    std::vector<int> ranks;
    for (int r = 0; r < spec_->worldSize(); ++r) {
      if (done.count(r)) continue;
      if (!recovery_->covers(r)) return false;
      ranks.push_back(r);
    }
    for (const auto* p : current())
      if (!done.count(p->rank) && !p->deleting) plan_.podsToDelete.push_back(p->name);
    unneeded = "; rank(s) " + controller::rankList(ranks) +
               ": the pod was deleted as its worker finished, the replacement was not needed";
  }
  setPhase("Succeeded");
  st_["completionTime"] = now_;
  st_["message"] = "all " + std::to_string(spec_->worldSize()) + " workers succeeded" + unneeded;
  cond("Succeeded", "True", "AllWorkersSucceeded", st_["message"]);
  if (findCondition(st_, "Running")) cond("Running", "False", "Completed", "job finished");
  if (findCondition(st_, "Restarting")) cond("Restarting", "False", "Completed", "job finished");
  clearRecovery("Completed", "job finished");
  clearDisruption("Completed", "job finished");
  clearScaling("Completed", "job finished");
  if (conditionTrue(st_, "Hung")) cond("Hung", "False", "Completed", "job finished");
  event("Normal", "Succeeded", st_["message"]);
  mergeTelemetry();
  planLink();  // the run's final word on its link, for the next run's settings
  // Every worker exited 0, so training reached its budget even when the last reports
  // were lost (e.g. the operator restarted just before the end).
  if (st_.contains("progress") && st_["progress"].is_object()) {
    auto& p = st_["progress"];
    const long total = p.value("totalSteps", 0L);
    if (total > 0 && p.value("step", 0L) < total) p["step"] = total;
    p["etaSeconds"] = 0;
  }
  cleanup(false);
  // An unneeded replacement goes whatever cleanPodPolicy says (it would wait to join).
  auto& del = plan_.podsToDelete;
  std::sort(del.begin(), del.end());
  del.erase(std::unique(del.begin(), del.end()), del.end());
  scheduleTtl();
  return true;
}

void Planner::createMissing() {
  // A whole new gang (first start, resume, restart) trains with spec.replicas; it resumes
  // a checkpoint written with another number of replicas.
  const bool noPods = std::none_of(in_.pods.begin(), in_.pods.end(),
                                   [&](const ObservedPod& p) { return p.generation == restartGen_; });
  if (noPods && running_.replicas != in_.spec->replicas) {
    adoptReplicas(in_.spec->replicas);
    clearScaling("GangCreated", "a new gang starts with spec.replicas");
  }
  std::set<int> present;
  for (const auto* p : current()) present.insert(p->rank);
  for (int r = 0; r < spec_->worldSize(); ++r)
    if (!present.count(r)) plan_.ranksToCreate.push_back(r);
  if (plan_.ranksToCreate.empty()) return;
  plan_.ensureChildren = true;
  if (!st_.contains("startTime")) st_["startTime"] = now_;
  if (static_cast<int>(plan_.ranksToCreate.size()) == spec_->worldSize()) {
    // Nothing left to join (e.g. every pod was deleted): a new gang, no replacements.
    clearRecovery("GangRecreated", "every worker pod was gone; creating the gang again");
    // Once per gang: a retry after a refused create (phase still Created) is not a new one.
    if (phase_ != "Created") {
      plan_.gangCreated = true;
      event("Normal", "Created",
            "creating " + std::to_string(spec_->worldSize()) + " worker pods (restart generation " +
                std::to_string(restartGen_) + ")");
    }
  }
  if (recovery_)
    for (int r : plan_.ranksToCreate)
      if (recovery_->covers(r)) plan_.joiningRanks.push_back(r);
  if (phase_ == "Pending") {
    setPhase("Created");
    cond("Created", "True", "GangCreated", "worker pods, service and config created");
  }
}

void Planner::updateRunning() {
  int running = 0, finishedOk = 0;
  for (const auto* p : current()) {
    if (p->phase == "Running") running++;
    if (p->phase == "Succeeded") finishedOk++;
  }
  bool allUp = running > 0 && running + finishedOk == spec_->worldSize();
  if (allUp && phase_ != "Running") {
    bool wasRestarting = phase_ == "Restarting";
    setPhase("Running");
    st_["message"] = "all workers running";
    cond("Running", "True", "AllWorkersRunning", "all " + std::to_string(spec_->worldSize()) + " workers are running");
    if (wasRestarting) cond("Restarting", "False", "Recovered", "gang recreated and running");
    if (conditionTrue(st_, "Hung")) cond("Hung", "False", "Recovered", "gang restarted");
    event("Normal", "Running", "all " + std::to_string(spec_->worldSize()) + " workers are running");
  }
  if (recovery_) endRecoveryIfRejoined(allUp);
}

}  // namespace edit::op::controller
