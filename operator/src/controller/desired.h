// The objects an EDiTJob should own, derived purely from the job (no API calls):
// worker config (ConfigMap), telemetry token (Secret), headless Service and PodGroup; the
// pods: controller/pod_spec.h. Kept pure so that tests can check every field.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "api/editjob.h"

namespace edit::op::controller {

using nlohmann::json;

inline constexpr const char* kConfigKey = "config.yaml";
inline constexpr const char* kTokenKey = "token";
inline constexpr const char* kCheckpointMount = "/checkpoints";  // where spec.checkpoint.pvc is mounted
inline constexpr const char* kDataMount = "/data";               // where spec.data.pvc is mounted
// Where a worker or export container writes why it ended (the kubelet's default path).
inline constexpr const char* kTerminationMessagePath = "/dev/termination-log";

struct JobRef {
  api::JobMeta meta;
  api::EDiTJobSpec spec;
};

// Options that come from the operator, not the job.
struct OperatorSettings {
  std::string telemetryAdvertiseAddr;  // EDIT_TELEMETRY_ADDR given to workers
  // Secret in the job's namespace whose key ca.crt verifies the operator's telemetry
  // certificate (--telemetry-tls-ca-secret). Set: workers mount it at kTelemetryCaDir
  // and get EDIT_TELEMETRY_CA_FILE, which turns TLS on. Empty: plaintext.
  std::string telemetryCaSecret;
  std::string telemetryServerName;  // EDIT_TELEMETRY_SERVER_NAME (only with telemetryCaSecret)
  // --worker-network-policy: each job gets NetworkPolicy <job>-workers (desiredNetworkPolicy).
  bool workerNetworkPolicy = false;
  std::string metricsNamespace;  // --worker-metrics-namespace: where Prometheus scrapes the workers from
};
inline constexpr const char* kTelemetryCaDir = "/etc/edit/telemetry-tls";
inline constexpr const char* kTelemetryCaKey = "ca.crt";

std::string configMapName(const std::string& job);
std::string secretName(const std::string& job);
std::string serviceName(const std::string& job);
std::string podName(const std::string& job, int rank);
std::string masterAddr(const std::string& job, const std::string& ns);

json ownerReference(const api::JobMeta& meta);
// The object's controller owner reference ({} when it has none).
json controllerRef(const json& obj);
// checkpoint.dir as the workers get it ("" when the job keeps no checkpoints).
std::string checkpointDir(const JobRef& job);

// The pods' terminationGracePeriodSeconds: spec.terminationGracePeriodSeconds, else what a
// checkpoint on SIGTERM costs: 30 s to reach a step every rank agrees on and to start,
// plus the rank's share of the state (docs/memory.md: 4 k P / N bytes, k = 6 in the local
// modes, 4 in ddp) written at kCheckpointBytesPerSecond. At least 30 s (Kubernetes' default).
inline constexpr double kCheckpointBytesPerSecond = 50e6;
long terminationGraceSeconds(const JobRef& job);

// The worker YAML (common/src/worker_config.h structure) from spec.model/data/training/
// algorithm/checkpoint/debug; volume claims become mount paths.
std::string workerConfigYaml(const JobRef& job);
// Runs the runtime's own parser (common/src/worker_config.h) on that YAML, so that a job the
// CRD admits but a worker would refuse (exit 2) fails before any pod starts; throws
// api::SpecError naming the spec field and the allowed values.
void checkWorkerConfig(const JobRef& job);
json desiredConfigMap(const JobRef& job);
json desiredSecret(const JobRef& job, const std::string& token);
json desiredService(const JobRef& job);
// Empty object when no gang scheduler is named.
json desiredPodGroup(const JobRef& job);
std::string networkPolicyName(const std::string& job);
// The job's pods accept connections from each other (the rendezvous and Gloo's own ports:
// every port) and, on the workers' metrics port, from settings.metricsNamespace; nothing
// else. Egress is not restricted.
json desiredNetworkPolicy(const JobRef& job, const OperatorSettings& settings);
inline constexpr int kWorkerMetricsPort = 9400;  // each worker's /metrics (the PodMonitor's port "metrics")
// "volcano", "coscheduling" or "" (no gang scheduler) for spec.schedulerName.
std::string gangScheduler(const std::string& schedulerName);
// How often an idle worker resends its last report: a fifth of hangTimeoutSeconds, within
// [1, 10] s, so that when the job hangs a stopped worker has been silent far longer than
// the others (controller/recovery.cpp tells them apart at half the hang timeout).
long heartbeatSeconds(const api::EDiTJobSpec& s);

// The label selector of a job's worker pods, in label-selector text (status.selector, read
// by the scale subresource).
std::string podSelector(const std::string& job);

// 32 random bytes as 64 hex characters (from the OS CSPRNG).
std::string randomToken();

}  // namespace edit::op::controller
