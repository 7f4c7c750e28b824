#include "controller/export_pod.h"

#include <filesystem>

#include "api/editjob.h"
#include "controller/pod_spec.h"

namespace edit::op::controller {
namespace {

namespace fs = std::filesystem;

std::string normal(const std::string& p) {
  std::string s = fs::path(p).lexically_normal().string();
  while (s.size() > 1 && s.back() == '/') s.pop_back();
  return s;
}

// Whether `inner` is `outer` or lies below it (lexically).
bool within(const std::string& inner, const std::string& outer) {
  if (outer == "/") return !inner.empty() && inner[0] == '/';
  return inner == outer || inner.rfind(outer + "/", 0) == 0;
}

}  // namespace

std::string exportRoot(const JobRef& job) {
  const auto& s = job.spec;
  if (!s.checkpointPvc.empty()) return kCheckpointMount;
  const std::string dir = normal(checkpointDir(job));
  std::string best;
  for (const auto& m : s.volumeMounts) {
    if (!m.is_object() || !m.contains("mountPath") || !m["mountPath"].is_string()) continue;
    const std::string mp = normal(m["mountPath"].get<std::string>());
    if (within(dir, mp) && mp.size() > best.size()) best = mp;
  }
  if (!best.empty()) return best;
  const std::string parent = fs::path(dir).parent_path().string();
  return parent.empty() ? "." : parent;
}

std::string exportOutDir(const JobRef& job) {
  return normal(exportRoot(job) + "/" + job.spec.exportModel->path);
}

void checkExport(const JobRef& job) {
  if (!job.spec.exportModel) return;
  const std::string out = exportOutDir(job), dir = normal(checkpointDir(job));
  if (within(dir, out))
    throw api::SpecError("spec.export.path",
                         "'" + job.spec.exportModel->path + "' resolves to " + out + ", which holds the checkpoint (" +
                             dir + "); choose a directory beside it, e.g. " + job.meta.name + "-hf");
}

std::string exportPodName(const std::string& job, int attempt) {
  return job + "-export-" + std::to_string(attempt);
}

json desiredExportPod(const JobRef& job, int attempt) {
  const auto& s = job.spec;
  const auto& e = *s.exportModel;
  PodParts parts;
  parts.name = exportPodName(job.meta.name, attempt);
  parts.labels = {{api::kLabelComponent, api::kComponentExport}, {api::kLabelExportAttempt, std::to_string(attempt)}};

  // The export runs on CPU: the workers' resources without accelerators.
  json resources = json::object();
  for (const char* part : {"requests", "limits"}) {
    if (!s.resources.contains(part) || !s.resources[part].is_object()) continue;
    for (auto it = s.resources[part].begin(); it != s.resources[part].end(); ++it) {
      const std::string& k = it.key();
      if (k.size() >= 4 && k.compare(k.size() - 4, 4, "/gpu") == 0) continue;
      resources[part][k] = it.value();
    }
  }
  json mounts = s.volumeMounts;
  addCheckpointVolume(s, parts.volumes, mounts);
  // edit-export writes its JSON report (or {"error": ...}) as the termination message;
  // the operator reads the result from the pod's status. --force: a retried attempt
  // replaces what a killed one left.
  parts.container = {{"name", "export"},
                     {"command", json::array({"edit-export", "--checkpoint", checkpointDir(job), "--out",
                                              exportOutDir(job), "--dtype", e.dtype, "--weights", e.weights, "--force",
                                              "--report", kTerminationMessagePath})},
                     {"resources", resources},
                     {"volumeMounts", mounts}};
  if (!s.env.empty()) parts.container["env"] = s.env;
  // No schedulerName: one pod needs no gang scheduling.
  return basePod(job, std::move(parts));
}

}  // namespace edit::op::controller
