// spec.export as a pure decision: from the job's (planned) status and its export pods to
// the new status.export, the Exported condition and the pod to create. Level-triggered
// like planReconcile: the attempt number is stored in the status before its pod is
// created, so a re-run (or an operator restart) creates the same pod name again, which
// the API refuses with 409, never a second export.
//
// Outcome of an attempt (edit-export's exit codes, docs/export.md):
//   0            -> status.export from the pod's termination message, Exported=True
//   2 (refused)  -> Exported=False with the report's error; permanent, no retry
//   else         -> retry after kExportBackoffSeconds, doubling, up to kExportAttempts
//                   attempts in all, then Exported=False
// The job's phase stays Succeeded throughout.
#pragma once

#include <ctime>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "api/editjob.h"
#include "api/status.h"
#include "controller/plan.h"

namespace edit::op::controller {

inline constexpr int kExportAttempts = 3;
inline constexpr long kExportBackoffSeconds = 10;

struct ExportPod {
  std::string name;
  std::string uid;
  int attempt = 0;           // edit.io/export-attempt
  std::string phase;         // Pending | Running | Succeeded | Failed | Unknown
  bool deleting = false;
  std::optional<int> exitCode;
  std::string reason;        // terminated reason or pod status reason
  std::string message;       // the termination message: edit-export's JSON report, or the log's tail
};

bool isExportPod(const json& pod);
ExportPod observeExportPod(const json& pod);

struct ExportInput {
  std::optional<api::ExportSpec> spec;
  std::string outDir;                        // --out (status.export.path when the report lacks it)
  std::string cleanPodPolicy = "Running";    // All also deletes the export pods once done
  api::EDiTJobStatus status;                 // the job's status as planReconcile left it
  long generation = 0;
  std::vector<ExportPod> pods;
  std::time_t now = 0;
};

struct ExportPlan {
  api::EDiTJobStatus status;
  std::optional<int> createAttempt;         // create exportPodName(job, attempt)
  std::vector<std::string> podsToDelete;
  std::optional<long> requeueAfterSeconds;
  bool inProgress = false;                  // the job must stay (ttlSecondsAfterFinished waits)
  std::vector<PlannedEvent> events;
};

ExportPlan planExport(const ExportInput& in);

// Folds planExport into the reconciler's plan (status, events, deletions, requeue, TTL
// hold); returns the attempt whose pod to create.
std::optional<int> mergeExportPlan(Plan& plan, const ExportInput& in);

}  // namespace edit::op::controller
