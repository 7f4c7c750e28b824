#include "controller/failure_policy.h"

#include <cmath>

#include "exit_codes.h"
#include "modes.h"
#include "worker_config.h"

namespace edit::op::controller {

std::string BackoffBudget::usage() const {
  return std::to_string(used()) + " of runPolicy.backoffLimit=" + std::to_string(limit) + " used";
}

std::string BackoffBudget::exhaustedMessage() const {
  return "runPolicy.backoffLimit=" + std::to_string(limit) + " already used (" + std::to_string(gangRestarts) +
         " gang restarts, " + std::to_string(inPlaceRecoveries) + " in-place recoveries, " +
         std::to_string(disruptions) + " of them after disruptions, not counted)";
}

std::optional<PermanentFailure> permanentFailure(const std::vector<const ObservedPod*>& failed,
                                                 const std::string& checkpointDir) {
  for (const auto* p : failed) {
    if (!p->exitCode || !edit::isPermanentExit(*p->exitCode)) continue;
    // edit-train found the outer step skipped maxSkippedRounds rounds in a row.
    if (*p->exitCode == edit::kExitStalled)
      return PermanentFailure{api::reason::TrainingStalled,
                              describeExit(*p) + "; training stalled, not retried (a restart would replay it)"};
    // Every rank left the partial checkpoint removed and the previous one intact; a restart
    // would train up to the same checkpoint and fail there again.
    if (*p->exitCode == edit::kExitNoSpace)
      return PermanentFailure{
          api::reason::CheckpointStorageFull,
          describeExit(*p) + "; a checkpoint did not fit: free space in checkpoint.dir" +
              (checkpointDir.empty() ? std::string() : " (" + checkpointDir + ")") +
              " or give its volume more, then create the job again (it resumes from the newest complete "
              "checkpoint); not retried"};
    return PermanentFailure{api::reason::PermanentError, describeExit(*p) +
                                                  ": a permanent error (invalid config or data, or command not "
                                                  "runnable); not retried"};
  }
  return std::nullopt;
}

namespace {
double runtimeSeconds(const api::EDiTJobSpec& spec, const char* key, double dflt) {
  if (spec.runtime.is_object()) {
    auto it = spec.runtime.find(key);
    if (it != spec.runtime.end() && it->is_number()) return it->get<double>();
  }
  return dflt;
}
}  // namespace

long runtimeRecoverySeconds(const api::EDiTJobSpec& spec) {
  const edit::Config defaults;
  double s = runtimeSeconds(spec, "collectiveTimeoutSeconds", defaults.runtime.collectiveTimeoutSeconds);
  if (spec.inPlaceRecovery())
    s += runtimeSeconds(spec, "rendezvousTimeoutSeconds", defaults.runtime.rendezvousTimeoutSeconds);
  return static_cast<long>(std::ceil(s)) + 60;
}

bool causedByDisruption(const std::vector<const ObservedPod*>& failed, bool disruptionSeen) {
  bool allStopped = !failed.empty();
  for (const auto* p : failed) {
    if (!p->disruption.empty()) return true;
    // 143: the gang stopped together; 76: SIGTERM reached this worker alone and it left;
    // no exit code and no phase: a pod that vanished (the planner stands one in for it).
    const bool stopped = p->exitCode ? edit::isStopExit(*p->exitCode) : p->phase.empty();
    if (!stopped) allStopped = false;
  }
  return allStopped && disruptionSeen;
}

std::string gangRestartReason(const api::EDiTJobSpec& spec, api::Phase phase,
                              const std::vector<const ObservedPod*>& failed, const api::RecoveryStatus* active) {
  if (spec.runPolicy.replicaRecovery != "InPlace") return "runPolicy.replicaRecovery is " + spec.runPolicy.replicaRecovery;
  // Kueue keeps a failed pod of a group until a replacement of another name exists, and a
  // replacement here takes the failed pod's name once it is gone: the new gang is a new
  // group (docs/elastic.md, Kueue).
  if (!spec.kueueQueue.empty())
    return "the job is queued by Kueue (label kueue.x-k8s.io/queue-name): a failed pod is replaced with its gang";
  if (!edit::hasLocalPhases(spec.mode())) return "mode ddp synchronizes every step, so no rank can be replaced alone";
  // Before every pod ran the gang had not formed: there is no running job to join.
  if (phase != api::Phase::Running) return "the gang was not running yet";
  // edit-train's exit codes that rule out an in-place recovery (docs/design-decisions.md):
  // 75, a peer was lost and this worker could not wait for it; 143, every rank
  // checkpointed and stops together.
  for (const auto* p : failed) {
    if (p->exitCode == edit::kExitPeerLost) return p->name + " could not wait for a replacement (exit 75)";
    if (p->exitCode == edit::kExitTerminated)
      return p->name + " was stopped (exit 143: the gang checkpointed and stops)";
    if (active && isReplacement(*active, *p)) return "the replacement pod " + p->name + " failed while joining";
  }
  return "";
}

FailureResponse respondToFailedWorkers(const std::string& gangRestartWhy, bool recoveryUnderWay, bool disrupted,
                                       const BackoffBudget& budget) {
  const bool inPlace = gangRestartWhy.empty();
  // Another rank failed while the first is replaced: the same recovery, same budget.
  if (inPlace && recoveryUnderWay) return FailureResponse::JoinRecovery;
  if (inPlace && (disrupted || !budget.exhausted())) return FailureResponse::StartRecovery;
  if (!disrupted && budget.exhausted()) return FailureResponse::FailJob;
  return FailureResponse::RestartGang;
}

FailureResponse respondToHang(bool silentReplaceable, bool recoveryUnderWay, const BackoffBudget& budget) {
  if (silentReplaceable && !recoveryUnderWay && !budget.exhausted()) return FailureResponse::StartRecovery;
  if (budget.exhausted()) return FailureResponse::FailJob;
  return FailureResponse::RestartGang;
}

bool mayReplaceStraggler(bool recoveryUnderWay, const BackoffBudget& budget) {
  return recoveryUnderWay || !budget.exhausted();
}

std::string describeExit(const ObservedPod& p) {
  if (p.phase != podphase::Failed) return "worker pod " + p.name + (p.uid.empty() ? " is gone" : " is being deleted");
  std::string s = "worker pod " + p.name + " failed";
  if (p.exitCode) s += " with exit code " + std::to_string(*p.exitCode);
  if (!p.reason.empty()) s += " (" + p.reason + ")";
  // edit-train's own words (its termination message), cut to keep the status small. The
  // end is kept: a message taken from the log's tail (FallbackToLogsOnError) ends with the
  // lines that say why.
  constexpr size_t kKeep = 1024;
  if (!p.message.empty())
    s += ": " + (p.message.size() > kKeep ? "..." + p.message.substr(p.message.size() - kKeep) : p.message);
  return s;
}

std::string describeExits(const std::vector<const ObservedPod*>& pods) {
  std::string s;
  for (const auto* p : pods) s += (s.empty() ? "" : ", ") + describeExit(*p);
  return s;
}

}  // namespace edit::op::controller
