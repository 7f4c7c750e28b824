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

#include "controller/plan_context.h"
#include "util/log.h"

namespace edit::op::controller {

using api::CondStatus;
namespace condition = api::condition;
namespace reason = api::reason;

namespace {

// Resend an unanswered SCALE this often: the hub holds it in memory only (an operator
// restart, a worker's reconnect or a recovery in progress can drop it).
constexpr long kScaleResendSeconds = 10;

long scaleDeadlineSeconds(const api::EDiTJobSpec& s) { return std::max(600L, 2 * s.hangTimeoutSeconds); }

std::string replicasText(int n) { return std::to_string(n) + (n == 1 ? " replica" : " replicas"); }

double secondsSinceStart(const PlanContext& c) {
  const std::time_t started = log::parseRfc3339(c.st.scaling->startTime);
  return started ? static_cast<double>(c.in.now - started) : 0.0;
}

long age(const PlanContext& c) {
  const std::string& start = c.st.scaling->startTime;
  return static_cast<long>(c.in.now - log::parseRfc3339(start.empty() ? c.now : start));
}

const char* whyNotInPlace(const PlanContext& c) {
  const api::EDiTJobSpec& spec = *c.in.spec;
  if (!edit::hasLocalPhases(spec.mode())) return "algorithm.mode ddp has no sync rounds to scale at";
  if (spec.runPolicy.replicaRecovery != "InPlace")
    return "runPolicy.replicaRecovery InPlace (a scale re-forms the world like an in-place recovery)";
  const json& overlap = spec.algorithm.value("overlapSteps", json(0));
  if (overlap.is_number() && overlap.get<double>() != 0) return "algorithm.overlapSteps 0";
  if (spec.gpusPerWorker > 0) return "the Gloo backend (GPU workers use NCCL, whose re-formed world has not run)";
  return nullptr;
}

void requestScale(PlanContext& c, int to) {
  api::ScalingStatus& scaling = *c.st.scaling;
  const std::time_t last = scaling.requestTime ? log::parseRfc3339(*scaling.requestTime) : 0;
  if (!last || c.in.now - last >= kScaleResendSeconds) {
    c.plan.scaleRequest = to;
    scaling.requestTime = c.now;
    if (!last)
      c.cond(condition::Scaling, CondStatus::True, to > scaling.from ? reason::ScalingUp : reason::ScalingDown,
             "asked the workers to scale to " + replicasText(to) + " after their next sync round");
  }
  const long wait = last ? std::max(1L, kScaleResendSeconds - static_cast<long>(c.in.now - last)) : kScaleResendSeconds;
  if (!c.plan.requeueAfterSeconds || *c.plan.requeueAfterSeconds > wait) c.plan.requeueAfterSeconds = wait;
}

void finishScale(PlanContext& c, int from, int to, const std::vector<int>& leftRanks) {
  const double seconds = secondsSinceStart(c);
  const std::string msg = "scaled from " + replicasText(from) + " to " + std::to_string(to) + " in " +
                          std::to_string(static_cast<long>(seconds)) + " s, no worker restarted";
  c.adoptReplicas(to);
  c.st.scaling.reset();
  c.st.lastScale = api::LastScale{from, to, api::kScaleSucceeded, seconds, msg, c.gen};
  c.cond(condition::Scaling, CondStatus::False, reason::Scaled, msg);
  c.event(api::kNormal, reason::Scaled, msg);
  c.plan.leftRanks = leftRanks;
  c.plan.scaleEnded = Plan::ScaleEnd{api::kScaleSucceeded, seconds};
  c.plan.ensureChildren = true;  // the PodGroup's minMember follows the new world
}

void abandonScale(PlanContext& c, int from, int to, const std::string& why) {
  const double seconds = secondsSinceStart(c);
  // Workers already asked wait for the new replicas at their rendezvous: the old size as
  // the target tells them to stop waiting and go on as they were.
  if (c.st.scaling->requestTime) c.plan.scaleRequest = from;
  const std::string msg = "scale from " + replicasText(from) + " to " + std::to_string(to) + " abandoned: " + why +
                          "; training continues with " + replicasText(from) +
                          " (to retry, set spec.replicas to another value and back)";
  c.st.scaling.reset();
  c.st.lastScale = api::LastScale{from, to, api::kScaleAbandoned, seconds, msg, c.gen};
  c.cond(condition::Scaling, CondStatus::False, reason::ScaleAbandoned, msg);
  c.event(api::kWarning, reason::ScaleAbandoned, msg);
  c.plan.scaleEnded = Plan::ScaleEnd{api::kScaleAbandoned, seconds};
}

void scaleUp(PlanContext& c, int from, int to) {
  const int N = c.running.shardsPerReplica;
  const bool asked = c.st.scaling->requestTime.has_value();
  // Taken back before the workers were asked: nothing happened yet.
  if (!asked && c.in.spec->replicas != to) {
    clearScaling(c, reason::Cancelled, "spec.replicas changed to " + std::to_string(c.in.spec->replicas) +
                                           " before the workers were asked to scale to " + std::to_string(to));
    return;
  }
  std::map<int, const ObservedPod*> joiners;
  for (const auto& p : c.in.pods)
    if (p.generation == c.restartGeneration() && p.rank >= from * N && p.rank < to * N && !p.deleting)
      joiners[p.rank] = &p;
  for (const auto& [rank, p] : joiners)
    if (p->phase == podphase::Failed) {
      std::string why = "pod " + p->name + " of a new replica failed";
      if (p->exitCode) why += " (exit " + std::to_string(*p->exitCode) + ")";
      if (!p->message.empty()) why += ": " + p->message;
      abandonScale(c, from, to, why);
      return;
    }
  if (age(c) > scaleDeadlineSeconds(*c.spec)) {
    abandonScale(c, from, to, "the new replicas did not join within " + std::to_string(scaleDeadlineSeconds(*c.spec)) + " s");
    return;
  }
  // Joined: rank 0 trains in the larger world, or every new rank reported from its pod
  // (or finished: a short job may end before a report was seen).
  const bool allThere = static_cast<int>(joiners.size()) == (to - from) * N;
  bool allRunning = allThere, allJoined = allThere;
  for (const auto& [rank, p] : joiners) {
    allRunning = allRunning && (p->phase == podphase::Running || p->phase == podphase::Succeeded);
    auto rep = c.in.telemetry.ranks.find(rank);
    const bool reported = rep != c.in.telemetry.ranks.end() && rep->second.podUid == p->uid && rep->second.step > 0;
    allJoined = allJoined && (p->phase == podphase::Succeeded || reported);
  }
  if (asked && (c.in.telemetry.replicas == to || allJoined)) {
    finishScale(c, from, to, {});
    return;
  }
  for (int r = from * N; r < to * N; ++r)
    if (!joiners.count(r)) c.plan.scaleJoinRanks.push_back(r);
  if (!c.plan.scaleJoinRanks.empty()) {
    c.plan.scaleTo = to;
    c.plan.ensureChildren = true;
  }
  // Ask only once every new pod runs: the workers wait for them at the next round.
  if (allRunning) requestScale(c, to);
}

void scaleDown(PlanContext& c, int from, int to) {
  const int N = c.running.shardsPerReplica;
  bool allLeft = true;
  std::vector<int> leaving;
  for (int r = to * N; r < from * N; ++r) leaving.push_back(r);
  for (int r : leaving) {
    bool left = false;
    for (const auto* p : c.current())
      if (p->rank == r && p->phase == podphase::Succeeded) left = true;
    allLeft = allLeft && left;
  }
  if (c.st.scaling->requestTime && (c.in.telemetry.replicas == to || allLeft)) {
    finishScale(c, from, to, leaving);
    return;
  }
  if (age(c) > scaleDeadlineSeconds(*c.spec)) {
    abandonScale(c, from, to, "the workers did not scale down within " + std::to_string(scaleDeadlineSeconds(*c.spec)) + " s");
    return;
  }
  requestScale(c, to);
}

void startScale(PlanContext& c, int to) {
  const int from = c.running.replicas;
  c.st.scaling = api::ScalingStatus{from, to, c.now, std::nullopt};
  const std::string msg = "scaling from " + replicasText(from) + " to " + std::to_string(to) +
                          (to > from ? ": creating the new replicas' pods" : ": asking the workers");
  c.cond(condition::Scaling, CondStatus::True, to > from ? reason::ScalingUp : reason::ScalingDown, msg);
  c.event(api::kNormal, reason::ScalingStarted, msg);
  if (to > from)
    scaleUp(c, from, to);
  else
    scaleDown(c, from, to);
}

// Pods of ranks outside the world that no scale in progress needs: a scale-down's leavers
// once it finished, or the new pods of an abandoned or cancelled scale-up.
void deleteStrays(PlanContext& c, int joinersUpTo) {
  const int limit = std::max(joinersUpTo, c.running.replicas) * c.running.shardsPerReplica;
  for (const auto& p : c.in.pods)
    if (p.generation == c.restartGeneration() && p.rank >= limit && !p.deleting) c.plan.podsToDelete.push_back(p.name);
}

}  // namespace

void planScaling(PlanContext& c) {
  const int want = c.in.spec->replicas;
  const int now = c.running.replicas;
  int joinersUpTo = 0;  // a scale-up in progress: its new pods (ranks below joinersUpTo * N) are wanted
  if (c.st.scaling) {
    const int from = c.st.scaling->from, to = c.st.scaling->to;
    if (from != now || to < 1) {
      clearScaling(c, reason::Invalid, "status.scaling did not match status.replicas");  // edited by hand
    } else if (to > from) {
      scaleUp(c, from, to);
      if (c.st.scaling) joinersUpTo = to;
    } else {
      scaleDown(c, from, to);
    }
  } else if (want != now && c.phase() == api::Phase::Running && !c.st.recovery) {
    const auto& last = c.st.lastScale;
    const bool abandonedHere = last && last->result == api::kScaleAbandoned && last->to == want && last->generation == c.gen;
    if (abandonedHere) {
      // Not retried until spec.replicas changes again: the same pods would fail the same way.
    } else if (const char* why = whyNotInPlace(c)) {
      c.cond(condition::Scaling, CondStatus::False, reason::AppliesAtRestart,
             std::string("spec.replicas ") + std::to_string(want) + " applies when the workers next start " +
                 "(suspend and resume the job); resizing in place needs " + why);
    } else {
      startScale(c, want);
      if (want > now) joinersUpTo = want;
    }
  }
  deleteStrays(c, joinersUpTo);
}

void clearScaling(PlanContext& c, const std::string& why, const std::string& msg) {
  if (!c.st.scaling) return;
  c.st.scaling.reset();
  c.endCondition(condition::Scaling, why, msg);
}

}  // namespace edit::op::controller
