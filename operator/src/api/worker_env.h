// The worker environment the operator owns: the variables it sets on every worker pod
// (controller/pod_spec.cpp builds the env from these names) and those edit-train reads
// for its identity or rendezvous, which only the operator may decide. spec.env may set
// none of them: the CRD refuses it (a CEL rule made from this list, api/spec_table.cpp)
// and so does parseSpec, naming the entry. EDIT_TELEMETRY_CA_FILE and
// EDIT_TELEMETRY_SERVER_NAME are not here: a job may point at its own CA (operator/README.md).
#pragma once

#include <string>

namespace edit::op::api {

struct WorkerEnvVar {
  const char* name;
  const char* what;  // for the error: what the operator puts there
};

namespace env {
inline constexpr const char* Job = "EDIT_JOB";
inline constexpr const char* Namespace = "EDIT_NAMESPACE";
inline constexpr const char* Rank = "RANK";
inline constexpr const char* WorldSize = "WORLD_SIZE";
inline constexpr const char* Replicas = "EDIT_REPLICAS";
inline constexpr const char* Shards = "EDIT_SHARDS";
inline constexpr const char* MasterAddr = "MASTER_ADDR";
inline constexpr const char* MasterPort = "MASTER_PORT";
inline constexpr const char* TelemetryAddr = "EDIT_TELEMETRY_ADDR";
inline constexpr const char* RestartGeneration = "EDIT_RESTART_GENERATION";
inline constexpr const char* TerminationLog = "EDIT_TERMINATION_LOG";
inline constexpr const char* HeartbeatSeconds = "EDIT_TELEMETRY_HEARTBEAT_SECONDS";
inline constexpr const char* Config = "EDIT_CONFIG";
inline constexpr const char* TelemetryToken = "EDIT_TELEMETRY_TOKEN";
inline constexpr const char* PodName = "POD_NAME";
inline constexpr const char* PodUid = "POD_UID";
inline constexpr const char* NodeName = "NODE_NAME";
inline constexpr const char* PodIp = "POD_IP";
inline constexpr const char* MetricsHost = "EDIT_METRICS_HOST";
inline constexpr const char* MetricsPort = "EDIT_METRICS_PORT";
inline constexpr const char* Join = "EDIT_JOIN";
}  // namespace env

inline constexpr WorkerEnvVar kReservedWorkerEnv[] = {
    {env::Job, "the job's name"},
    {env::Namespace, "the job's namespace"},
    {env::Rank, "the worker's rank"},
    {env::WorldSize, "the number of workers"},
    {env::Replicas, "the number of replicas"},
    {env::Shards, "spec.shardsPerReplica"},
    {env::MasterAddr, "rank 0's address"},
    {env::MasterPort, "spec.masterPort"},
    {env::TelemetryAddr, "the operator's telemetry address"},
    {env::RestartGeneration, "the gang's restart generation"},
    {env::TerminationLog, "the termination message file"},
    {env::HeartbeatSeconds, "the heartbeat interval (from spec.hangTimeoutSeconds)"},
    {env::Config, "the worker config (the ConfigMap)"},
    {env::TelemetryToken, "the job's token (its Secret)"},
    {env::PodName, "the pod's name"},
    {env::PodUid, "the pod's UID"},
    {env::NodeName, "the pod's node"},
    {env::PodIp, "the pod's address"},
    {env::MetricsHost, "the pod's address"},
    {env::MetricsPort, "the metrics port the PodMonitor scrapes"},
    {env::Join, "how a pod joins a running job (recovery, scaling)"},
    // Read by edit-train, set by edit-run on one machine; on a cluster they follow from the above.
    {"LOCAL_RANK", "derived from RANK"},
    {"EDIT_BIND_ADDR", "the pod's address (POD_IP)"},
    {"EDIT_STORE_SECRET", "the job's token (the job store's secret)"},
    {"EDIT_SCALE_AT", "spec.replicas (kubectl scale)"},
};

// The entry for a name, or nullptr when a job may set it.
inline const WorkerEnvVar* reservedWorkerEnv(const std::string& name) {
  for (const auto& v : kReservedWorkerEnv)
    if (name == v.name) return &v;
  return nullptr;
}

}  // namespace edit::op::api
