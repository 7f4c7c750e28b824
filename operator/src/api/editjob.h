// EDiTJob (edit.io/v1alpha1) as the operator sees it: typed spec with defaults, parsed
// from the object's JSON and validated again here (the CRD schema may be missing or
// older than this binary). Errors name the field, e.g. "spec.replicas: must be an integer
// in [1, 4096], got 0". The fields, their rules and defaults: api/spec_table.h; the
// status: api/status.h.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "modes.h"

namespace edit::op::api {

inline constexpr const char* kGroup = "edit.io";
inline constexpr const char* kVersion = "v1alpha1";
inline constexpr const char* kApiVersion = "edit.io/v1alpha1";
inline constexpr const char* kKind = "EDiTJob";
inline constexpr const char* kPlural = "editjobs";

// Labels on everything the operator creates for a job; rank, replica, shard and
// generation on worker pods, component and export-attempt on the export pod.
inline constexpr const char* kLabelJob = "edit.io/job-name";
inline constexpr const char* kLabelRank = "edit.io/rank";
inline constexpr const char* kLabelReplica = "edit.io/replica";
inline constexpr const char* kLabelShard = "edit.io/shard";
inline constexpr const char* kLabelGeneration = "edit.io/restart-generation";
inline constexpr const char* kLabelComponent = "edit.io/component";
inline constexpr const char* kComponentExport = "export";
inline constexpr const char* kLabelExportAttempt = "edit.io/export-attempt";
// Kueue's plain-pod integration: the queue label on the job (and on its pods).
inline constexpr const char* kKueueQueueLabel = "kueue.x-k8s.io/queue-name";

// Thrown by parseSpec; field() is the JSON path of the offending field.
class SpecError : public std::runtime_error {
 public:
  SpecError(std::string field, const std::string& problem)
      : std::runtime_error(field + ": " + problem), field_(std::move(field)) {}
  const std::string& field() const { return field_; }

 private:
  std::string field_;
};

struct RunPolicy {
  int backoffLimit = 3;                          // gang restarts allowed before Failed
  std::optional<long> activeDeadlineSeconds;     // from startTime
  std::optional<long> ttlSecondsAfterFinished;   // delete the job this long after finishing
  std::optional<long> scheduleTimeoutSeconds;    // fail when a pod has not started this long after its creation
  std::string cleanPodPolicy = "Running";        // All | Running | None
  bool suspend = false;
  // What a failed worker costs: InPlace recreates only its pod, which rejoins the running
  // job (the survivors wait for it); GangRestart restarts every pod from the newest
  // checkpoint. In-place recoveries and gang restarts share backoffLimit.
  std::string replicaRecovery = "InPlace";       // InPlace | GangRestart
};

struct StragglerPolicy {
  double threshold = 1.5;        // score = mean step time / job median of means
  int windowSteps = 20;          // reports per rank in the mean
  std::string action = "Report"; // Report | Replace
  int minReports = 5;            // a rank needs this many reports before it is scored
};

// spec.export: after the job succeeded, one pod runs edit-export on its final checkpoint
// (controller/export_policy.h). path is relative to the checkpoint volume.
struct ExportSpec {
  std::string path;
  std::string dtype = "f32";     // f32 | bf16
  std::string weights = "auto";  // auto | outer | replica (edit-export --weights)
};

// spec.podTemplate: what a user may add to or replace in the worker pods (in the manner of
// Kubeflow Trainer's pod template overrides).
struct PodTemplateOverride {
  nlohmann::json labels = nlohmann::json::object();       // added; the operator's edit.io/ labels win
  nlohmann::json annotations = nlohmann::json::object();  // added; the operator's win
  nlohmann::json imagePullSecrets = nlohmann::json::array();
  std::optional<nlohmann::json> securityContext;           // replaces the pod's default
  std::optional<nlohmann::json> containerSecurityContext;  // replaces the worker container's default
};

struct EDiTJobSpec {
  int replicas = 1;              // M
  int shardsPerReplica = 1;      // N
  int gpusPerWorker = 0;
  std::string image;
  std::string imagePullPolicy;
  std::vector<std::string> command{"edit-train"};
  std::vector<std::string> args;
  nlohmann::json resources = nlohmann::json::object();
  nlohmann::json env = nlohmann::json::array();
  nlohmann::json nodeSelector = nlohmann::json::object();
  nlohmann::json tolerations = nlohmann::json::array();
  std::string priorityClassName;
  std::string schedulerName;
  std::string serviceAccountName;
  nlohmann::json volumes = nlohmann::json::array();
  nlohmann::json volumeMounts = nlohmann::json::array();
  int masterPort = 29500;
  long hangTimeoutSeconds = 300;  // 0 disables hang detection
  std::optional<long> terminationGracePeriodSeconds;  // unset: controller::terminationGraceSeconds
  // Worker configuration sections, copied through to the worker's YAML config (less the
  // volume claims, which the operator mounts).
  nlohmann::json model = nlohmann::json::object();
  nlohmann::json data = nlohmann::json::object();
  nlohmann::json training = nlohmann::json::object();
  nlohmann::json algorithm = nlohmann::json::object();
  nlohmann::json checkpoint = nlohmann::json::object();
  nlohmann::json debug = nlohmann::json::object();
  std::string dataPvc;        // spec.data.pvc, mounted read-only at /data ("" none)
  std::string checkpointPvc;  // spec.checkpoint.pvc, mounted at /checkpoints ("" none)
  // The worker process's runtime section, less recovery (runPolicy.replicaRecovery sets it).
  nlohmann::json runtime = nlohmann::json::object();
  PodTemplateOverride podTemplate;
  std::optional<ExportSpec> exportModel;  // spec.export
  RunPolicy runPolicy;
  StragglerPolicy stragglerPolicy;

  int worldSize() const { return replicas * shardsPerReplica; }
  // metadata.labels["kueue.x-k8s.io/queue-name"]: the Kueue LocalQueue that admits the
  // job's pods (controller/desired.h, podGroupOf). "" when the job is not queued.
  std::string kueueQueue;
  // algorithm.mode as the runtime sees it (its default is edit).
  std::string mode() const;
  // Whether a failed worker may be replaced without a gang restart: runPolicy asks for it
  // and the mode has local phases (ddp synchronizes every step, so survivors cannot wait).
  bool inPlaceRecovery() const { return runPolicy.replicaRecovery == "InPlace" && edit::hasLocalPhases(mode()); }
};

// The parts of the object's metadata the controller needs.
struct JobMeta {
  std::string name;
  std::string ns;
  std::string uid;
  long generation = 0;
  std::string resourceVersion;
  bool deleting = false;
};

JobMeta parseMeta(const nlohmann::json& obj);

// Parses and validates obj["spec"]; throws SpecError naming the first bad field.
EDiTJobSpec parseSpec(const nlohmann::json& obj);

// Checks that only the object's name keeps derived names valid (pod hostnames <= 63).
void validateName(const std::string& name, int worldSize);

}  // namespace edit::op::api
