// The export pod of spec.export: one pod, after the job succeeded, that runs edit-export on
// the job's checkpoint (docs/export.md). Pure, like desired.h; the decisions about when to
// create it are in export_policy.h.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "controller/desired.h"

namespace edit::op::controller {

// The directory spec.export.path is relative to, as the pods see it: the claim's mount
// (/checkpoints) with checkpoint.pvc; else the spec.volumeMounts entry that holds
// checkpoint.dir; else the directory that holds checkpoint.dir.
std::string exportRoot(const JobRef& job);
// exportRoot + spec.export.path, normalized: edit-export's --out.
std::string exportOutDir(const JobRef& job);
// Refuses an export path that would hold the checkpoint (edit-export refuses it too, but
// only after the job trained); throws api::SpecError naming spec.export.path.
void checkExport(const JobRef& job);

// Deterministic per attempt (1, 2, ...): an operator restart finds the pod it created.
std::string exportPodName(const std::string& job, int attempt);
json desiredExportPod(const JobRef& job, int attempt);

}  // namespace edit::op::controller
