// The failure policy: what a failure of a job's gang leads to (fail the job, restart the
// gang from the newest checkpoint, or replace the failed ranks in place), how failures
// spend runPolicy.backoffLimit and what edit-train's exit codes mean for that. Pure
// functions of what the planner observed, like JobSet's failure_policy.go: the planner
// (controller/plan_failures.cpp) carries the answer out in the status, the events and the pods.
//
// Exit codes (common/src/exit_codes.h): a permanent one (2, 3, 126, 127) fails the job.
// Everything else (crash, OOM kill 137, preemption 143) is retried: by replacing the
// failed ranks in place where runPolicy.replicaRecovery allows it (controller/recovery.h),
// else by a gang restart from the newest checkpoint.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "api/editjob.h"
#include "api/status.h"
#include "controller/observed.h"
#include "controller/recovery.h"

namespace edit::op::controller {

// runPolicy.backoffLimit accounting. Gang restarts and in-place recoveries share the
// limit; those a disruption caused are free (as a batch Job's podFailurePolicy Ignore on
// DisruptionTarget), so a drained node cannot fail a job.
struct BackoffBudget {
  int gangRestarts = 0;       // status.restarts
  int inPlaceRecoveries = 0;  // status.replicaRecoveries
  int disruptions = 0;        // status.disruptions: those of the two a disruption caused
  int limit = 0;              // runPolicy.backoffLimit

  int used() const { return gangRestarts + inPlaceRecoveries - disruptions; }
  bool exhausted() const { return used() >= limit; }
  // "2 of runPolicy.backoffLimit=3 used", for events.
  std::string usage() const;
  // Why the job fails once it is exhausted: "runPolicy.backoffLimit=3 already used (...)".
  std::string exhaustedMessage() const;
};

// A failure that retrying cannot fix: the job fails with this reason and message.
struct PermanentFailure {
  std::string reason;   // api::reason::TrainingStalled | CheckpointStorageFull | PermanentError
  std::string message;
};

// The first of these failed pods that exited with a permanent code, as the job's failure;
// nullopt when every failure may be retried. checkpointDir: the workers' checkpoint.dir
// (named when a checkpoint did not fit).
std::optional<PermanentFailure> permanentFailure(const std::vector<const ObservedPod*>& failed,
                                                 const std::string& checkpointDir = "");

// How long the workers' own recovery from a cut or a deadlock may take before the job's
// hang rule restarts the gang: a collective waits runtime.collectiveTimeoutSeconds, then
// (in-place recovery) the rendezvous up to runtime.rendezvousTimeoutSeconds, plus a minute
// for the round after it. With every worker alive and reporting, a gang restart for no
// progress waits at least this long (docs/replica-recovery.md, "A network partition").
long runtimeRecoverySeconds(const api::EDiTJobSpec& spec);

// Whether a disruption (eviction, drain, preemption, a pod deleted by someone else) caused
// these failures, so that they are free of the budget. Either a failed pod was itself
// taken away, or a disruption was seen (disruptionSeen: the job's Disrupted condition)
// and every failed worker stopped on SIGTERM (143, 76) or vanished: the evicted pod may be
// gone by the time the operator looks. A crash of its own (any other code) is charged.
bool causedByDisruption(const std::vector<const ObservedPod*>& failed, bool disruptionSeen);

// Why these failed pods need a gang restart; empty when they can be replaced in place.
// phase: the job's phase before this failure (only a gang that formed can be joined).
// active: the in-place recovery under way, if any.
std::string gangRestartReason(const api::EDiTJobSpec& spec, api::Phase phase,
                              const std::vector<const ObservedPod*>& failed, const api::RecoveryStatus* active);

enum class FailureResponse {
  JoinRecovery,   // replace the ranks within the recovery under way: the same budget
  StartRecovery,  // a new in-place recovery, one unit of budget unless disrupted
  RestartGang,    // every pod deleted, restartGeneration bumped
  FailJob,        // BackoffLimitExceeded
};

// Workers of the running gang failed or vanished (none permanently). gangRestartWhy:
// gangRestartReason's answer for them ("" when they can be replaced in place).
FailureResponse respondToFailedWorkers(const std::string& gangRestartWhy, bool recoveryUnderWay, bool disrupted,
                                       const BackoffBudget& budget);

// The running gang made no progress for hangTimeoutSeconds. silentReplaceable: some
// workers fell silent while the others kept reporting (silentPods) and they could be
// replaced in place; otherwise (every worker silent, or every one alive: a deadlock) the
// gang restarts. Never a hang's recovery on top of one under way.
FailureResponse respondToHang(bool silentReplaceable, bool recoveryUnderWay, const BackoffBudget& budget);

// stragglerPolicy.action Replace spends the budget like a failure; a slow job is better
// than a Failed one, so with the budget spent a straggler is only reported. One joining a
// recovery under way (several stragglers at once) costs nothing more.
bool mayReplaceStraggler(bool recoveryUnderWay, const BackoffBudget& budget);

// "worker pod demo-worker-1 failed with exit code 137 (OOMKilled): ...", for messages.
std::string describeExit(const ObservedPod& pod);
std::string describeExits(const std::vector<const ObservedPod*>& pods);

}  // namespace edit::op::controller
