#include "controller/pod_spec.h"

#include "api/worker_env.h"

namespace edit::op::controller {
namespace {

// uid and gid of the runtime image's user (Dockerfile, target runtime).
constexpr int kRuntimeImageGid = 65532;

json envVar(const std::string& name, const std::string& value) { return {{"name", name}, {"value", value}}; }
json envFrom(const std::string& name, const json& source) { return {{"name", name}, {"valueFrom", source}}; }
json fieldRef(const char* path) { return {{"fieldRef", {{"fieldPath", path}}}}; }

// The operator's labels and annotations of a worker pod over the job's own: identity,
// gang scheduling and the Kueue group.
void workerMetadata(const JobRef& job, int rank, int restartGeneration, const PodGroupRef& group, PodParts& parts) {
  const auto& s = job.spec;
  const std::string& name = job.meta.name;
  parts.labels.update({{api::kLabelRank, std::to_string(rank)},
                       {api::kLabelReplica, std::to_string(rank / s.shardsPerReplica)},
                       {api::kLabelShard, std::to_string(rank % s.shardsPerReplica)},
                       {api::kLabelGeneration, std::to_string(restartGeneration)}});
  const std::string gang = gangScheduler(s.schedulerName);
  if (gang == "volcano") parts.annotations["scheduling.k8s.io/group-name"] = name;
  if (gang == "coscheduling") parts.labels["scheduling.x-k8s.io/pod-group"] = name;
  if (s.kueueQueue.empty()) return;
  const PodGroupRef g = group.name.empty() ? gangPodGroup(job, restartGeneration) : group;
  parts.labels[api::kKueueQueueLabel] = s.kueueQueue;
  parts.labels["kueue.x-k8s.io/pod-group-name"] = g.name;
  parts.annotations["kueue.x-k8s.io/pod-group-total-count"] = std::to_string(g.total);
  // A failure ends the group (its quota and finalizers are released): the operator
  // answers it with a new gang, a new group (failure_policy.cpp).
  parts.annotations["kueue.x-k8s.io/retriable-in-group"] = "false";
}

// The worker's environment: who it is, where the rendezvous and the operator are, its
// config and token; then the job's own spec.env, which wins.
json workerEnv(const JobRef& job, int rank, int restartGeneration, const OperatorSettings& settings, PodJoin join) {
  const auto& s = job.spec;
  const std::string &name = job.meta.name, &ns = job.meta.ns;
  namespace e = api::env;
  json env = json::array({
      envVar(e::Job, name), envVar(e::Namespace, ns), envVar(e::Rank, std::to_string(rank)),
      envVar(e::WorldSize, std::to_string(s.worldSize())), envVar(e::Replicas, std::to_string(s.replicas)),
      envVar(e::Shards, std::to_string(s.shardsPerReplica)), envVar(e::MasterAddr, masterAddr(name, ns)),
      envVar(e::MasterPort, std::to_string(s.masterPort)),
      envVar(e::TelemetryAddr, settings.telemetryAdvertiseAddr),
      envVar(e::RestartGeneration, std::to_string(restartGeneration)),
      envVar(e::TerminationLog, kTerminationMessagePath),
      envVar(e::HeartbeatSeconds, std::to_string(heartbeatSeconds(s))),
      envFrom(e::Config, {{"configMapKeyRef", {{"name", configMapName(name)}, {"key", kConfigKey}}}}),
      envFrom(e::TelemetryToken, {{"secretKeyRef", {{"name", secretName(name)}, {"key", kTokenKey}}}}),
      envFrom(e::PodName, fieldRef("metadata.name")),
      envFrom(e::PodUid, fieldRef("metadata.uid")),
      envFrom(e::NodeName, fieldRef("spec.nodeName")),
      // Gloo binds and /metrics listens on the pod's own address.
      envFrom(e::PodIp, fieldRef("status.podIP")),
      envFrom(e::MetricsHost, fieldRef("status.podIP")),
      envVar(e::MetricsPort, std::to_string(kWorkerMetricsPort)),
  });
  if (!settings.telemetryCaSecret.empty()) {
    env.push_back(envVar("EDIT_TELEMETRY_CA_FILE", std::string(kTelemetryCaDir) + "/" + kTelemetryCaKey));
    if (!settings.telemetryServerName.empty())
      env.push_back(envVar("EDIT_TELEMETRY_SERVER_NAME", settings.telemetryServerName));
  }
  if (join != PodJoin::Start) env.push_back(envVar(e::Join, join == PodJoin::Scale ? "scale" : "1"));
  for (const auto& v : s.env) env.push_back(v);  // none of ours (api/worker_env.h): the CA settings may be overridden
  return env;
}

// The claims (checkpoints, data) and the telemetry CA a worker mounts.
void workerVolumes(const JobRef& job, const OperatorSettings& settings, json& volumes, json& mounts) {
  const auto& s = job.spec;
  addCheckpointVolume(s, volumes, mounts);
  if (!s.dataPvc.empty()) {
    volumes.push_back({{"name", "edit-data"}, {"persistentVolumeClaim", {{"claimName", s.dataPvc}, {"readOnly", true}}}});
    mounts.push_back({{"name", "edit-data"}, {"mountPath", kDataMount}, {"readOnly", true}});
  }
  if (!settings.telemetryCaSecret.empty()) {  // only ca.crt: the Secret may hold other keys the worker must not see
    volumes.push_back({{"name", "edit-telemetry-ca"},
                       {"secret", {{"secretName", settings.telemetryCaSecret},
                                   {"items", json::array({{{"key", kTelemetryCaKey}, {"path", kTelemetryCaKey}}})}}}});
    mounts.push_back({{"name", "edit-telemetry-ca"}, {"mountPath", kTelemetryCaDir}, {"readOnly", true}});
  }
}

// A shard group talks every step: pack a replica onto one node. Replicas only meet at
// syncs: spread them (a node may hold one whole replica, so skew = N). A replaced
// straggler's rank keeps off the nodes it left.
void placeWorker(const JobRef& job, int replica, const std::set<std::string>& avoidNodes, json& spec) {
  const std::string& name = job.meta.name;
  json affinity = {
      {"podAffinity",
       {{"preferredDuringSchedulingIgnoredDuringExecution",
         json::array({{{"weight", 100},
                       {"podAffinityTerm",
                        {{"labelSelector",
                          {{"matchLabels", {{api::kLabelJob, name}, {api::kLabelReplica, std::to_string(replica)}}}}},
                         {"topologyKey", "kubernetes.io/hostname"}}}}})}}}};
  if (!avoidNodes.empty()) {
    json values = json::array();
    for (const auto& n : avoidNodes) values.push_back(n);
    affinity["nodeAffinity"] = {
        {"requiredDuringSchedulingIgnoredDuringExecution",
         {{"nodeSelectorTerms",
           json::array({{{"matchExpressions",
                          json::array({{{"key", "kubernetes.io/hostname"}, {"operator", "NotIn"}, {"values", values}}})}}})}}}};
  }
  spec["affinity"] = affinity;
  spec["topologySpreadConstraints"] = json::array({{{"maxSkew", job.spec.shardsPerReplica},
                                                    {"topologyKey", "kubernetes.io/hostname"},
                                                    {"whenUnsatisfiable", "ScheduleAnyway"},
                                                    {"labelSelector", {{"matchLabels", {{api::kLabelJob, name}}}}}}});
}

// "<job>-<suffix>" within a label value's 63 characters (the job name is cut, not the suffix).
std::string groupName(const std::string& job, const std::string& suffix) {
  const size_t room = 63 - suffix.size() - 1;
  std::string head = job.substr(0, room);
  while (!head.empty() && head.back() == '-') head.pop_back();
  return head + "-" + suffix;
}

}  // namespace

// Restricted Pod Security Standard by default, so that workers run in namespaces that
// enforce it; spec.podTemplate replaces either part as a whole.
json containerSecurityContext(const api::EDiTJobSpec& s) {
  return s.podTemplate.containerSecurityContext.value_or(
      json{{"allowPrivilegeEscalation", false}, {"capabilities", {{"drop", json::array({"ALL"})}}}, {"runAsNonRoot", true}});
}

json podSecurityContext(const api::EDiTJobSpec& s) {
  return s.podTemplate.securityContext.value_or(
      json{{"runAsNonRoot", true},
           {"seccompProfile", {{"type", "RuntimeDefault"}}},
           // The runtime image's group: new checkpoint and data volumes are writable.
           {"fsGroup", kRuntimeImageGid},
           {"fsGroupChangePolicy", "OnRootMismatch"}});
}

void addCheckpointVolume(const api::EDiTJobSpec& s, json& volumes, json& mounts) {
  if (s.checkpointPvc.empty()) return;
  volumes.push_back({{"name", "edit-checkpoint"}, {"persistentVolumeClaim", {{"claimName", s.checkpointPvc}}}});
  mounts.push_back({{"name", "edit-checkpoint"}, {"mountPath", kCheckpointMount}});
}

json basePod(const JobRef& job, PodParts parts) {
  const auto& s = job.spec;
  // The job's own labels and annotations first: the operator's (edit.io/*, gang
  // scheduling) overwrite them.
  json labels = s.podTemplate.labels;
  labels.update(parts.labels);
  labels[api::kLabelJob] = job.meta.name;
  json annotations = s.podTemplate.annotations;
  annotations.update(parts.annotations);

  json& c = parts.container;
  c["image"] = s.image;
  c["securityContext"] = containerSecurityContext(s);
  // A failure before the container wrote its termination message (a crash, OOM) still
  // leaves the tail of its log in the pod's status.
  c["terminationMessagePolicy"] = "FallbackToLogsOnError";
  if (!s.imagePullPolicy.empty()) c["imagePullPolicy"] = s.imagePullPolicy;
  if (c.contains("resources") && c["resources"].empty()) c.erase("resources");
  if (c.contains("volumeMounts") && c["volumeMounts"].empty()) c.erase("volumeMounts");

  json volumes = s.volumes;
  for (const auto& v : parts.volumes) volumes.push_back(v);
  json spec = {{"restartPolicy", "Never"},
               {"securityContext", podSecurityContext(s)},
               {"containers", json::array({c})},
               // The pods never call the API: no token of their ServiceAccount in them.
               {"automountServiceAccountToken", false},
               {"terminationGracePeriodSeconds", terminationGraceSeconds(job)}};
  if (!volumes.empty()) spec["volumes"] = volumes;
  if (!s.nodeSelector.empty()) spec["nodeSelector"] = s.nodeSelector;
  if (!s.tolerations.empty()) spec["tolerations"] = s.tolerations;
  if (!s.priorityClassName.empty()) spec["priorityClassName"] = s.priorityClassName;
  if (!s.serviceAccountName.empty()) spec["serviceAccountName"] = s.serviceAccountName;
  if (!s.podTemplate.imagePullSecrets.empty()) spec["imagePullSecrets"] = s.podTemplate.imagePullSecrets;

  json metadata = {{"name", parts.name}, {"namespace", job.meta.ns}, {"labels", labels},
                   {"ownerReferences", json::array({ownerReference(job.meta)})}};
  if (!annotations.empty()) metadata["annotations"] = annotations;
  return {{"apiVersion", "v1"}, {"kind", "Pod"}, {"metadata", metadata}, {"spec", spec}};
}

json desiredPod(const JobRef& job, int rank, int restartGeneration, const OperatorSettings& settings,
                const std::set<std::string>& avoidNodes, PodJoin join, const PodGroupRef& group) {
  const auto& s = job.spec;
  PodParts parts;
  parts.name = podName(job.meta.name, rank);
  workerMetadata(job, rank, restartGeneration, group, parts);

  json resources = s.resources;
  if (s.gpusPerWorker > 0) {
    resources["limits"]["nvidia.com/gpu"] = std::to_string(s.gpusPerWorker);
    resources["requests"]["nvidia.com/gpu"] = std::to_string(s.gpusPerWorker);
  }
  json mounts = s.volumeMounts;
  workerVolumes(job, settings, parts.volumes, mounts);
  parts.container = {{"name", "worker"},
                     {"command", s.command},
                     {"env", workerEnv(job, rank, restartGeneration, settings, join)},
                     {"resources", resources},
                     {"volumeMounts", mounts},
                     {"ports", json::array({{{"name", "master"}, {"containerPort", s.masterPort}, {"protocol", "TCP"}},
                                            {{"name", "metrics"}, {"containerPort", kWorkerMetricsPort}, {"protocol", "TCP"}}})}};
  // edit-train writes why it failed to the termination message file (named in its env
  // too, so that a runtime without mount namespaces can translate the path, as the API
  // stand-in's kubelet does).
  parts.container["terminationMessagePath"] = kTerminationMessagePath;
  if (!s.args.empty()) parts.container["args"] = s.args;

  json pod = basePod(job, std::move(parts));
  json& spec = pod["spec"];
  spec["hostname"] = podName(job.meta.name, rank);
  spec["subdomain"] = serviceName(job.meta.name);
  if (!s.schedulerName.empty()) spec["schedulerName"] = s.schedulerName;
  placeWorker(job, rank / s.shardsPerReplica, avoidNodes, spec);
  return pod;
}

PodGroupRef gangPodGroup(const JobRef& job, int restartGeneration) {
  return {groupName(job.meta.name, "g" + std::to_string(restartGeneration)), job.spec.worldSize()};
}

PodGroupRef scalePodGroup(const JobRef& job, int restartGeneration, int from, int to, long scaleStart) {
  return {groupName(job.meta.name, "g" + std::to_string(restartGeneration) + "-scale" + std::to_string(scaleStart)),
          (to - from) * job.spec.shardsPerReplica};
}

}  // namespace edit::op::controller
