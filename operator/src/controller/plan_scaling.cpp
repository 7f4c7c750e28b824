// The planner's scaling policy: a change of spec.replicas on a running job resizes it in
// place at a sync round, without restarting a worker or reading a checkpoint.
//   scale-up:   create the new replicas' pods (EDIT_JOIN=scale); once they all run, ask
//               rank 0 over telemetry (SCALE, idempotent: resent until done). After the next
//               round the world re-forms and the new replicas copy their peers' state.
//   scale-down: ask at once; the leaving replicas contribute their last round and exit 0,
//               then their pods are deleted.
// The scale ends when rank 0 reports the new size (or every pod that had to join or leave
// did); status.replicas then follows, and so does a gang PodGroup's minMember (while the
// scale runs it keeps the old size: the running gang satisfies it, and the new pods join
// it one by one). A new pod that fails, or a scale that does not end
// within its deadline, leaves the job at its old size (Abandoned): no gang restart.
// A job that cannot resize in place (ddp, replicaRecovery GangRestart, overlapSteps, GPUs)
// takes the new size when its workers next start: a checkpointed restart, as on resume.
#include <algorithm>

#include "controller/desired.h"
#include "controller/planner.h"
#include "util/log.h"

namespace edit::op::controller {
namespace {

// Resend an unanswered SCALE this often: the hub holds it in memory only (an operator
// restart, a worker's reconnect or a recovery in progress can drop it).
constexpr long kScaleResendSeconds = 10;

long scaleDeadlineSeconds(const api::EDiTJobSpec& s) { return std::max(600L, 2 * s.hangTimeoutSeconds); }

std::string replicasText(int n) { return std::to_string(n) + (n == 1 ? " replica" : " replicas"); }

}  // namespace

// The world the workers train with: a whole new gang takes spec.replicas.
void Planner::adoptReplicas(int replicas) {
  running_.replicas = replicas;
  st_["replicas"] = replicas;
  plan_.replicas = replicas;
}

const char* Planner::whyNotInPlace() const {
  if (!edit::hasLocalPhases(in_.spec->mode())) return "algorithm.mode ddp has no sync rounds to scale at";
  if (in_.spec->runPolicy.replicaRecovery != "InPlace")
    return "runPolicy.replicaRecovery InPlace (a scale re-forms the world like an in-place recovery)";
  const json& overlap = in_.spec->algorithm.value("overlapSteps", json(0));
  if (overlap.is_number() && overlap.get<double>() != 0) return "algorithm.overlapSteps 0";
  if (in_.spec->gpusPerWorker > 0) return "the Gloo backend (GPU workers use NCCL, whose re-formed world has not run)";
  return nullptr;
}

void Planner::planScaling() {
  const int want = in_.spec->replicas;
  const int now = running_.replicas;
  int joinersUpTo = 0;  // a scale-up in progress: its new pods (ranks below joinersUpTo * N) are wanted
  if (st_.contains("scaling") && st_["scaling"].is_object()) {
    const int from = st_["scaling"].value("from", now), to = st_["scaling"].value("to", now);
    if (from != now || to < 1) {
      clearScaling("Invalid", "status.scaling did not match status.replicas");  // edited by hand
    } else if (to > from) {
      scaleUp(from, to);
      if (st_.contains("scaling")) joinersUpTo = to;
    } else {
      scaleDown(from, to);
    }
  } else if (want != now && phase_ == "Running" && !recovery_) {
    const json* last = st_.contains("lastScale") ? &st_["lastScale"] : nullptr;
    const bool abandonedHere = last && last->value("result", "") == "Abandoned" && last->value("to", 0) == want &&
                               last->value("generation", 0L) == gen_;
    if (abandonedHere) {
      // Not retried until spec.replicas changes again: the same pods would fail the same way.
    } else if (const char* why = whyNotInPlace()) {
      cond("Scaling", "False", "AppliesAtRestart",
           std::string("spec.replicas ") + std::to_string(want) + " applies when the workers next start " +
               "(suspend and resume the job); resizing in place needs " + why);
    } else {
      startScale(want);
      if (want > now) joinersUpTo = want;
    }
  }
  deleteStrays(joinersUpTo);
}

void Planner::startScale(int to) {
  const int from = running_.replicas;
  st_["scaling"] = {{"from", from}, {"to", to}, {"startTime", now_}};
  const std::string msg = "scaling from " + replicasText(from) + " to " + std::to_string(to) +
                          (to > from ? ": creating the new replicas' pods" : ": asking the workers");
  cond("Scaling", "True", to > from ? "ScalingUp" : "ScalingDown", msg);
  event("Normal", "ScalingStarted", msg);
  if (to > from)
    scaleUp(from, to);
  else
    scaleDown(from, to);
}

void Planner::scaleUp(int from, int to) {
  const int N = running_.shardsPerReplica;
  const json& scaling = st_["scaling"];
  const bool asked = scaling.contains("requestTime");
  // Taken back before the workers were asked: nothing happened yet.
  if (!asked && in_.spec->replicas != to) {
    clearScaling("Cancelled", "spec.replicas changed to " + std::to_string(in_.spec->replicas) +
                                  " before the workers were asked to scale to " + std::to_string(to));
    return;
  }
  std::map<int, const ObservedPod*> joiners;
  for (const auto& p : in_.pods)
    if (p.generation == restartGen_ && p.rank >= from * N && p.rank < to * N && !p.deleting) joiners[p.rank] = &p;
  for (const auto& [rank, p] : joiners)
    if (p->phase == "Failed") {
      std::string why = "pod " + p->name + " of a new replica failed";
      if (p->exitCode) why += " (exit " + std::to_string(*p->exitCode) + ")";
      if (!p->message.empty()) why += ": " + p->message;
      abandonScale(from, to, why);
      return;
    }
  const long age = static_cast<long>(in_.now - log::parseRfc3339(scaling.value("startTime", now_)));
  if (age > scaleDeadlineSeconds(*spec_)) {
    abandonScale(from, to, "the new replicas did not join within " + std::to_string(scaleDeadlineSeconds(*spec_)) + " s");
    return;
  }
  // Joined: rank 0 trains in the larger world, or every new rank reported from its pod
  // (or finished: a short job may end before a report was seen).
  const bool allThere = static_cast<int>(joiners.size()) == (to - from) * N;
  bool allRunning = allThere, allJoined = allThere;
  for (const auto& [rank, p] : joiners) {
    allRunning = allRunning && (p->phase == "Running" || p->phase == "Succeeded");
    auto rep = in_.telemetry.ranks.find(rank);
    const bool reported = rep != in_.telemetry.ranks.end() && rep->second.podUid == p->uid && rep->second.step > 0;
    allJoined = allJoined && (p->phase == "Succeeded" || reported);
  }
  if (asked && (in_.telemetry.replicas == to || allJoined)) {
    finishScale(from, to, {});
    return;
  }
  for (int r = from * N; r < to * N; ++r)
    if (!joiners.count(r)) plan_.scaleJoinRanks.push_back(r);
  if (!plan_.scaleJoinRanks.empty()) {
    plan_.scaleTo = to;
    plan_.ensureChildren = true;
  }
  // Ask only once every new pod runs: the workers wait for them at the next round.
  if (allRunning) requestScale(to);
}

void Planner::scaleDown(int from, int to) {
  const int N = running_.shardsPerReplica;
  bool allLeft = true;
  std::vector<int> leaving;
  for (int r = to * N; r < from * N; ++r) leaving.push_back(r);
  for (int r : leaving) {
    bool left = false;
    for (const auto* p : current())
      if (p->rank == r && p->phase == "Succeeded") left = true;
    allLeft = allLeft && left;
  }
  if (st_["scaling"].contains("requestTime") && (in_.telemetry.replicas == to || allLeft)) {
    finishScale(from, to, leaving);
    return;
  }
  const long age = static_cast<long>(in_.now - log::parseRfc3339(st_["scaling"].value("startTime", now_)));
  if (age > scaleDeadlineSeconds(*spec_)) {
    abandonScale(from, to, "the workers did not scale down within " + std::to_string(scaleDeadlineSeconds(*spec_)) + " s");
    return;
  }
  requestScale(to);
}

void Planner::requestScale(int to) {
  json& scaling = st_["scaling"];
  const std::time_t last = scaling.contains("requestTime") ? log::parseRfc3339(scaling.value("requestTime", "")) : 0;
  if (!last || in_.now - last >= kScaleResendSeconds) {
    plan_.scaleRequest = to;
    scaling["requestTime"] = now_;
    if (!last) cond("Scaling", "True", to > scaling.value("from", 0) ? "ScalingUp" : "ScalingDown",
                    "asked the workers to scale to " + replicasText(to) + " after their next sync round");
  }
  const long wait = last ? std::max(1L, kScaleResendSeconds - static_cast<long>(in_.now - last)) : kScaleResendSeconds;
  if (!plan_.requeueAfterSeconds || *plan_.requeueAfterSeconds > wait) plan_.requeueAfterSeconds = wait;
}

void Planner::finishScale(int from, int to, const std::vector<int>& leftRanks) {
  const std::time_t started = log::parseRfc3339(st_["scaling"].value("startTime", now_));
  const double seconds = started ? static_cast<double>(in_.now - started) : 0.0;
  const std::string msg = "scaled from " + replicasText(from) + " to " + std::to_string(to) + " in " +
                          std::to_string(static_cast<long>(seconds)) + " s, no worker restarted";
  adoptReplicas(to);
  st_.erase("scaling");
  st_["lastScale"] = {{"from", from}, {"to", to}, {"result", "Succeeded"}, {"seconds", seconds},
                      {"message", msg}, {"generation", gen_}};
  cond("Scaling", "False", "Scaled", msg);
  event("Normal", "Scaled", msg);
  plan_.leftRanks = leftRanks;
  plan_.scaleEnded = Plan::ScaleEnd{"Succeeded", seconds};
  plan_.ensureChildren = true;  // the PodGroup's minMember follows the new world
}

void Planner::abandonScale(int from, int to, const std::string& why) {
  const std::time_t started = log::parseRfc3339(st_["scaling"].value("startTime", now_));
  const double seconds = started ? static_cast<double>(in_.now - started) : 0.0;
  // Workers already asked wait for the new replicas at their rendezvous: the old size as
  // the target tells them to stop waiting and go on as they were.
  if (st_["scaling"].contains("requestTime")) plan_.scaleRequest = from;
  const std::string msg = "scale from " + replicasText(from) + " to " + std::to_string(to) + " abandoned: " + why +
                          "; training continues with " + replicasText(from) +
                          " (to retry, set spec.replicas to another value and back)";
  st_.erase("scaling");
  st_["lastScale"] = {{"from", from}, {"to", to}, {"result", "Abandoned"}, {"seconds", seconds},
                      {"message", msg}, {"generation", gen_}};
  cond("Scaling", "False", "ScaleAbandoned", msg);
  event("Warning", "ScaleAbandoned", msg);
  plan_.scaleEnded = Plan::ScaleEnd{"Abandoned", seconds};
}

void Planner::clearScaling(const std::string& reason, const std::string& msg) {
  if (!st_.contains("scaling")) return;
  st_.erase("scaling");
  if (conditionTrue(st_, "Scaling")) cond("Scaling", "False", reason, msg);
}

// Pods of ranks outside the world that no scale in progress needs: a scale-down's leavers
// once it finished, or the new pods of an abandoned or cancelled scale-up.
void Planner::deleteStrays(int joinersUpTo) {
  const int limit = std::max(joinersUpTo, running_.replicas) * running_.shardsPerReplica;
  for (const auto& p : in_.pods)
    if (p.generation == restartGen_ && p.rank >= limit && !p.deleting) plan_.podsToDelete.push_back(p.name);
}

}  // namespace edit::op::controller
