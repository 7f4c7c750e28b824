#include "controller/plan.h"

#include <algorithm>
#include <set>

#include "controller/desired.h"
#include "controller/failure_policy.h"
#include "controller/recovery.h"
#include "util/log.h"

namespace edit::op::controller {
namespace {

std::string rankList(const std::vector<const ObservedPod*>& pods) {
  std::vector<int> ranks;
  for (const auto* p : pods) ranks.push_back(p->rank);
  return controller::rankList(ranks);
}

}  // namespace

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

namespace {

bool conditionTrue(const json& status, const std::string& type) {
  const json* c = findCondition(status, type);
  return c && c->value("status", "") == "True";
}

class Planner {
 public:
  explicit Planner(const PlanInput& in) : in_(in), st_(in.status.is_object() ? in.status : json::object()) {
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

  Plan run() {
    st_["observedGeneration"] = gen_;
    st_["restarts"] = budget_.gangRestarts;  // 0 shows in kubectl get ej -o wide (RESTARTS), not blank
    if (!in_.spec) return invalid();
    spec_ = &*in_.spec;
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
    if (succeeded()) return done();
    createMissing();
    updateRunning();
    mergeTelemetry();
    return done();
  }

 private:
  Plan done() {
    countWorkers();
    plan_.status = st_;
    return plan_;
  }

  void setPhase(const std::string& p) {
    phase_ = p;
    st_["phase"] = p;
  }
  void cond(const std::string& type, const std::string& s, const std::string& reason, const std::string& msg) {
    setCondition(st_, type, s, reason, msg, now_, gen_);
  }
  void event(const std::string& type, const std::string& reason, const std::string& msg) {
    plan_.events.push_back({type, reason, msg});
  }

  std::vector<const ObservedPod*> current() const {
    std::vector<const ObservedPod*> out;
    for (const auto& p : in_.pods)
      if (p.generation == restartGen_) out.push_back(&p);
    return out;
  }

  void countWorkers() {
    int total = in_.spec ? in_.spec->worldSize() : 0;
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

  Plan invalid() {
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
  void cleanup(bool forceRunning) {
    const std::string& policy = spec_->runPolicy.cleanPodPolicy;
    for (const auto& p : in_.pods) {
      if (p.deleting) continue;
      bool active = p.phase == "Running" || p.phase == "Pending" || p.phase == "Unknown";
      if (policy == "All" || ((policy == "Running" || forceRunning) && active)) plan_.podsToDelete.push_back(p.name);
    }
  }

  void scheduleTtl() {
    if (!spec_->runPolicy.ttlSecondsAfterFinished) return;
    std::time_t finished = log::parseRfc3339(st_.value("completionTime", ""));
    if (!finished) finished = in_.now;
    long remaining = static_cast<long>(finished + *spec_->runPolicy.ttlSecondsAfterFinished - in_.now);
    if (remaining <= 0)
      plan_.deleteJob = true;
    else
      plan_.requeueAfterSeconds = remaining;
  }

  Plan finished() {
    cleanup(false);
    scheduleTtl();
    return done();
  }

  Plan suspended() {
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
    clearDisruption("Suspended", "job suspended");
    return done();
  }

  void fail(const std::string& reason, const std::string& msg, bool stopRunning) {
    setPhase("Failed");
    st_["completionTime"] = now_;
    st_["message"] = msg;
    cond("Failed", "True", reason, msg);
    if (findCondition(st_, "Running")) cond("Running", "False", reason, msg);
    if (findCondition(st_, "Restarting")) cond("Restarting", "False", reason, msg);
    clearRecovery(reason, msg);
    clearDisruption(reason, msg);
    event("Warning", reason, msg);
    cleanup(stopRunning);
    scheduleTtl();
  }

  bool deadlineExceeded() {
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

  void restart(const std::string& reason, const std::string& msg) {
    budget_.gangRestarts++;
    restartGen_++;
    st_["restarts"] = budget_.gangRestarts;
    st_["restartGeneration"] = restartGen_;
    setPhase("Restarting");
    st_["message"] = msg;
    cond("Restarting", "True", reason, msg);
    if (findCondition(st_, "Running")) cond("Running", "False", reason, msg);
    clearRecovery("GangRestarted", msg);
    event("Warning", "Restarting",
          msg + "; restarting the gang (restart " + std::to_string(budget_.gangRestarts) + "; " + budget_.usage() + ")");
    for (const auto& p : in_.pods)
      if (!p.deleting) plan_.podsToDelete.push_back(p.name);
    plan_.gangRestarted = true;
    plan_.requeueAfterSeconds = 1;
  }

  // Records a disruption of a current pod in the Disrupted condition, so that the failures
  // it causes later (its worker leaves with exit 76, or in a synchronous phase every worker
  // checkpoints and exits 143) are still recognized once the evicted pod is gone.
  void noteDisruptions() {
    if (conditionTrue(st_, "Disrupted")) return;
    for (const auto* p : current()) {
      if (p->disruption.empty()) continue;
      const std::string msg = "pod " + p->name + " is being taken away (" + p->disruption +
                              "); the recovery or restart it causes (workers leaving with exit 76 or stopping "
                              "with exit 143) does not count against runPolicy.backoffLimit";
      cond("Disrupted", "True", p->disruption, msg);
      event("Warning", "Disrupted", msg);
      return;
    }
  }

  // A pod of the running gang that someone else deleted (vanished()) is a disruption in
  // itself: the operator may never have seen its DisruptionTarget condition (an eviction
  // whose pod went before a reconcile looked) or there was none (kubectl delete pod).
  void noteDeletedPod(const ObservedPod& p) {
    if (conditionTrue(st_, "Disrupted")) return;
    const std::string msg = "pod " + p.name + " was deleted (an eviction, a drain or kubectl delete pod); "
                            "replacing it does not count against runPolicy.backoffLimit";
    cond("Disrupted", "True", "PodDeleted", msg);
    event("Warning", "Disrupted", msg);
  }

  // Whether the failure being handled comes from a disruption; if so it is counted in
  // status.disruptions (and so not against the budget) and the condition is consumed.
  bool consumeDisruption(const std::string& what) {
    if (!conditionTrue(st_, "Disrupted")) return false;
    budget_.disruptions++;
    st_["disruptions"] = budget_.disruptions;
    cond("Disrupted", "False", "Handled", what + " after the disruption (not counted against runPolicy.backoffLimit)");
    return true;
  }

  bool handleFailures() {
    std::vector<const ObservedPod*> failed;  // failures not acted on yet
    for (const auto* p : current()) {
      if (p->phase != "Failed") continue;
      if (recovery_ && recovery_->replaces(*p)) {
        // Already being replaced: repeat the delete (idempotent) in case the last one was lost.
        if (!p->deleting) plan_.podsToDelete.push_back(p->name);
        continue;
      }
      failed.push_back(p);
    }
    if (const auto permanent = permanentFailure(failed)) {
      fail(permanent->reason, permanent->message, true);
      return true;
    }
    for (const auto* p : vanished()) {
      failed.push_back(p);
      noteDeletedPod(*p);
    }
    if (!failed.empty()) {
      handleFailedWorkers(failed);
      return true;
    }
    if (in_.telemetry.hung && phase_ == "Running") return handleHang();
    return false;
  }

  void handleFailedWorkers(const std::vector<const ObservedPod*>& failed) {
    std::string msg = describeExits(failed);
    const std::string why = gangRestartReason(*spec_, phase_, failed, recovery_ ? &*recovery_ : nullptr);
    const bool disrupted = causedByDisruption(failed, conditionTrue(st_, "Disrupted"));
    const FailureResponse response = respondToFailedWorkers(why, recovery_.has_value(), disrupted, budget_);
    if (response == FailureResponse::JoinRecovery) {
      replaceInPlace(failed, msg);
      return;
    }
    if (response == FailureResponse::StartRecovery) {
      startRecovery();
      if (disrupted) consumeDisruption("in-place recovery");
      replaceInPlace(failed, msg);
      return;
    }
    if (!why.empty()) msg += "; gang restart: " + why;
    restartOrFail(response, "WorkerFailed", msg, disrupted);
  }

  bool handleHang() {
    // The survivors of a recovery make no progress while they wait for the replacement.
    if (recoveryYoungerThanHangTimeout()) return false;
    const std::string msg = "no training progress for hangTimeoutSeconds=" + std::to_string(spec_->hangTimeoutSeconds);
    double longest = 0;
    const auto silent = silentPods(current(), in_.telemetry, spec_->hangTimeoutSeconds, &longest);
    const bool silentReplaceable = !silent.empty() && gangRestartReason(*spec_, phase_, silent, nullptr).empty();
    const FailureResponse response = respondToHang(silentReplaceable, recovery_.has_value(), budget_);
    if (response == FailureResponse::StartRecovery) {
      replaceSilentInPlace(silent, longest, msg);
      return true;
    }
    cond("Hung", "True", "NoProgress", msg);
    event("Warning", "Hung", msg);
    // Its workers are stuck (in a collective, or stopped): SIGTERM cannot make them
    // checkpoint, so waiting out the grace period only delays the restart.
    plan_.deleteImmediately = true;
    restartOrFail(response, "Hung", msg, false);
    return true;
  }

  // The failure policy's answer when nothing can be replaced in place.
  void restartOrFail(FailureResponse response, const std::string& reason, std::string msg, bool disrupted) {
    if (response == FailureResponse::FailJob) {
      fail("BackoffLimitExceeded", msg + "; " + budget_.exhaustedMessage(), true);
      return;
    }
    if (disrupted) {
      consumeDisruption("gang restart");
      msg += " after a disruption";
    }
    restart(reason, msg);
  }

  // A new in-place recovery: one unit of budget (given back by consumeDisruption when a
  // disruption caused it).
  void startRecovery() {
    budget_.inPlaceRecoveries++;
    st_["replicaRecoveries"] = budget_.inPlaceRecoveries;
    recovery_ = RecoveryRecord{{}, now_, {}};
  }

  // Ranks of the running gang whose pod vanished without the operator seeing it fail: a pod
  // someone else deleted (kubectl delete pod, an eviction, a node drain) goes as soon as its
  // worker exits, often before a reconcile sees it Failed. Every pod the operator deletes
  // itself is in status.recovery or of an old generation. SIGTERM reached only those
  // workers, which left (edit-train exit 76) while the others wait for replacements, so
  // the ranks are replaced in place like failed pods; recreated as fresh ranks they could
  // not join a gang that formed without them. (A deleted pod seen Failed takes the failed
  // path with its exit code: 76 in place, 143 when the gang stopped together.) Not when no
  // pod stays running, the job is being deleted, or the policy restarts the gang anyway.
  std::vector<const ObservedPod*> vanished() {
    std::vector<const ObservedPod*> out;
    if (phase_ != "Running" || in_.meta.deleting || !gangRestartReason(*spec_, phase_, {}, nullptr).empty())
      return out;
    std::set<int> present;
    bool someStay = false;
    for (const auto* p : current()) {
      present.insert(p->rank);
      someStay |= !p->deleting && p->phase == "Running";
    }
    if (!someStay) return out;
    vanished_.clear();
    vanished_.reserve(spec_->worldSize());
    for (int r = 0; r < spec_->worldSize(); ++r) {
      if (present.count(r) || (recovery_ && recovery_->covers(r))) continue;
      ObservedPod gone;
      gone.name = podName(in_.meta.name, r);
      gone.rank = r;
      gone.generation = restartGen_;
      gone.deleting = true;  // nothing left to delete
      vanished_.push_back(gone);
    }
    for (const auto& p : vanished_) out.push_back(&p);
    return out;
  }

  // A hang where some workers fell silent (no report, not even a heartbeat, for half the
  // hang timeout) while the others kept reporting: the silent ones are stopped or frozen,
  // the others wait for them in a collective. Killing the silent pods breaks those
  // collectives at once and the rest recover in place around their replacements. Without
  // such a split (every worker silent, or every one alive: a deadlock) the gang restarts.
  // longest: the longest silence among them, in seconds.
  void replaceSilentInPlace(const std::vector<const ObservedPod*>& silent, double longest, const std::string& msg) {
    const std::string who = "rank(s) " + rankList(silent) + " sent nothing for " +
                            std::to_string(static_cast<long>(longest)) + " s while the others kept reporting";
    cond("Hung", "True", "WorkerUnresponsive", msg + "; " + who);
    event("Warning", "Hung", msg + "; " + who);
    startRecovery();
    for (const auto* p : silent) {
      recovery_->add(*p);
      plan_.podsToDelete.push_back(p->name);
      plan_.recoveredRanks.push_back(p->rank);
    }
    st_["recovery"] = recovery_->toJson();
    const std::string what = "killing unresponsive rank(s) " + recovery_->rankList() +
                             " and replacing them in place; the other workers wait for them";
    st_["message"] = what;
    cond("Recovering", "True", "WorkerUnresponsive", what);
    event("Warning", "RecoveringReplica",
          who + "; " + what + " (in-place recovery " + std::to_string(budget_.inPlaceRecoveries) + "; " +
              budget_.usage() + ")");
    plan_.deleteImmediately = true;  // a stopped process cannot act on SIGTERM
    plan_.requeueAfterSeconds = 1;
  }

  // Deletes the failed pods (normal grace) and records their ranks, so that createMissing
  // recreates them with EDIT_JOIN=1 in the same restart generation.
  void replaceInPlace(const std::vector<const ObservedPod*>& failed, const std::string& msg) {
    for (const auto* p : failed) {
      recovery_->add(*p);
      if (!p->deleting) plan_.podsToDelete.push_back(p->name);
      plan_.recoveredRanks.push_back(p->rank);
    }
    st_["recovery"] = recovery_->toJson();
    const std::string what = "replacing rank(s) " + recovery_->rankList() + " in place; the other workers wait for them";
    st_["message"] = what;
    cond("Recovering", "True", "ReplicaFailed", msg + "; " + what);
    event("Warning", "RecoveringReplica",
          msg + "; replacing rank(s) " + rankList(failed) + " in place (in-place recovery " +
              std::to_string(budget_.inPlaceRecoveries) + "; " + budget_.usage() + ")");
    plan_.requeueAfterSeconds = 1;
  }

  // stragglerPolicy.action Replace: the straggler's pod is recreated with an anti-affinity
  // to its node. Where a failed rank could be replaced in place, so is the straggler: it
  // is killed at once (a SIGTERM would make every rank checkpoint and stop) and its
  // replacement joins the running job. Otherwise it is deleted normally and its peers'
  // collectives fail: a gang restart from the newest checkpoint.
  void replaceStraggler(const ObservedPod& p, const std::string& reportedNode) {
    // Either way the replacement spends the backoff budget (failure_policy.h).
    if (!mayReplaceStraggler(recovery_.has_value(), budget_)) return;
    const std::string node = p.node.empty() ? reportedNode : p.node;
    plan_.replacedRanks.emplace_back(p.rank, node);
    avoidNode(p.rank, node);
    plan_.podsToDelete.push_back(p.name);
    const std::string why = gangRestartReason(*spec_, phase_, {&p}, nullptr);
    if (!why.empty()) {
      event("Warning", "ReplacingStraggler",
            "deleting straggler " + p.name + " to recreate it away from node " + node + " (gang restart: " + why + ")");
      return;
    }
    if (!recovery_) startRecovery();
    recovery_->add(p);
    st_["recovery"] = recovery_->toJson();
    plan_.recoveredRanks.push_back(p.rank);
    plan_.deleteImmediately = true;
    const std::string what = "replacing straggler rank(s) " + recovery_->rankList() +
                             " in place away from their nodes; the other workers wait for them";
    st_["message"] = what;
    cond("Recovering", "True", "StragglerReplaced", what);
    event("Warning", "ReplacingStraggler",
          "killing straggler " + p.name + " on node " + node + "; its replacement joins the running job in place (in-place recovery " +
              std::to_string(budget_.inPlaceRecoveries) + "; " + budget_.usage() + ")");
    plan_.requeueAfterSeconds = 1;
  }

  // status.avoidNodes: the rank's pods get a required anti-affinity to the node for the
  // rest of the job, across gang restarts (the GangRestart path of a replacement is one)
  // and operator restarts. At most one entry per replacement, so backoffLimit bounds it.
  void avoidNode(int rank, const std::string& node) {
    if (node.empty()) return;
    json& list = st_["avoidNodes"];
    if (!list.is_array()) list = json::array();
    for (const auto& e : list)
      if (e.is_object() && e.value("rank", -1) == rank && e.value("node", "") == node) return;
    list.push_back({{"rank", rank}, {"node", node}});
  }

  void clearDisruption(const std::string& reason, const std::string& msg) {
    if (conditionTrue(st_, "Disrupted")) cond("Disrupted", "False", reason, msg);
  }

  // The survivors make no progress until the replacements joined, took their state and
  // trained a step; a replacement's start-up (process, rendezvous, state copy) counts from
  // when its container started, not from the failure (deleting the failed pod and
  // scheduling the new one come first, and on a busy node take a while).
  bool recoveryYoungerThanHangTimeout() const {
    if (!recovery_ || spec_->hangTimeoutSeconds <= 0) return false;
    std::time_t started = log::parseRfc3339(recovery_->startTime);
    if (!started) return false;
    for (const auto* p : current())
      if (recovery_->covers(p->rank) && !recovery_->replaces(*p) && !p->started.empty())
        started = std::max(started, log::parseRfc3339(p->started));
    return in_.now - started < spec_->hangTimeoutSeconds;
  }

  // Ends a recovery record (done, or superseded by a gang restart, a failure, a suspend).
  void clearRecovery(const std::string& reason, const std::string& msg) {
    recovery_.reset();
    st_.erase("recovery");
    if (conditionTrue(st_, "Recovering")) cond("Recovering", "False", reason, msg);
  }

  bool succeeded() {
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
    if (conditionTrue(st_, "Hung")) cond("Hung", "False", "Completed", "job finished");
    event("Normal", "Succeeded", st_["message"]);
    mergeTelemetry();
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

  void createMissing() {
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

  void updateRunning() {
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
    if (!recovery_) return;
    // A recovery is over when every rank runs a pod that is not an incarnation it replaces
    // (a killed straggler may still be visible, Running, while it is being deleted) and
    // every replacement has reported a training step: it joined the rendezvous, took its
    // state from its peers and trains again. Running alone says nothing about the join.
    bool replacementsUp = allUp;
    for (const auto* p : current())
      if (p->deleting || recovery_->replaces(*p)) replacementsUp = false;
    if (!replacementsUp) return;
    std::vector<int> waiting;
    long resumedAt = -1;
    for (const auto* p : current()) {
      if (!recovery_->covers(p->rank)) continue;
      if (auto step = rejoinedAtStep(*p, in_.telemetry)) resumedAt = std::max(resumedAt, *step);
      else waiting.push_back(p->rank);
    }
    if (!waiting.empty()) {
      st_["message"] = "replacement(s) of rank(s) " + controller::rankList(waiting) + " running; waiting for their first training step";
      return;
    }
    const std::time_t started = log::parseRfc3339(recovery_->startTime);
    const long seconds = started ? std::max(0L, static_cast<long>(in_.now - started)) : 0L;
    std::string what = "rank(s) " + recovery_->rankList() + " replaced in place; ";
    what += resumedAt >= 0 ? "training again (step " + std::to_string(resumedAt) + " reported) "
                           : "all " + std::to_string(spec_->worldSize()) + " workers running again ";
    what += std::to_string(seconds) + " s after the failure";
    clearRecovery("Recovered", what);
    if (conditionTrue(st_, "Hung")) cond("Hung", "False", "Recovered", what);
    st_["message"] = "all workers running";
    event("Normal", "ReplicaRecovered", what);
    if (started) plan_.recoverySeconds = seconds;
  }

  void mergeTelemetry() {
    const auto& t = in_.telemetry;
    if (!t.present) return;
    st_["progress"] = t.progress;
    st_["stragglers"] = t.stragglers;
    st_["stragglerCount"] = t.stragglers.size();
    if (!t.lastReportTime.empty()) st_["lastReportTime"] = t.lastReportTime;
    std::set<int> before;
    const json oldStatus = in_.status.is_object() ? in_.status : json::object();
    if (const json* c = findCondition(oldStatus, "StragglerDetected");
        c && c->value("status", "") == "True" && oldStatus.contains("stragglers"))
      for (const auto& s : oldStatus["stragglers"]) before.insert(s.value("rank", -1));
    if (!t.stragglers.empty()) {
      std::string msg = "slow workers:";
      bool fresh = false;
      for (const auto& s : t.stragglers) {
        msg += " rank " + std::to_string(s.value("rank", -1)) + " (" + s.value("pod", "") + ", score " +
               std::to_string(s.value("score", 0.0)).substr(0, 4) + ")";
        if (!before.count(s.value("rank", -1))) fresh = true;
      }
      cond("StragglerDetected", "True", "SlowWorkers", msg);
      if (fresh) event("Warning", "StragglerDetected", msg);
      // Not during a recovery: every step time is distorted while the survivors wait.
      if (spec_->stragglerPolicy.action == "Replace" && phase_ == "Running" && !recovery_)
        for (const auto& s : t.stragglers)
          for (const auto* p : current())
            if (p->rank == s.value("rank", -1) && !p->deleting) replaceStraggler(*p, s.value("node", ""));
    } else if (conditionTrue(st_, "StragglerDetected")) {
      cond("StragglerDetected", "False", "NoStragglers", "no worker over the straggler threshold");
    }
  }

  const PlanInput& in_;
  json st_;
  Plan plan_;
  const api::EDiTJobSpec* spec_ = nullptr;
  std::string now_;
  long gen_ = 0;
  std::string phase_;
  int restartGen_ = 0;
  BackoffBudget budget_;                    // status.restarts, replicaRecoveries, disruptions
  std::optional<RecoveryRecord> recovery_;  // status.recovery: ranks being replaced in place
  std::vector<ObservedPod> vanished_;       // current ranks without a pod (vanished())
};

}  // namespace

Plan planReconcile(const PlanInput& in) { return Planner(in).run(); }

}  // namespace edit::op::controller
