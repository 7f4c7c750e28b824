#include "controller/desired.h"

#include "worker_config.h"

#include <openssl/rand.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <stdexcept>

namespace edit::op::controller {
namespace {

const char* kDataMount = "/data";
// Each worker serves its Prometheus /metrics here (the chart's PodMonitor scrapes port "metrics").
const int kWorkerMetricsPort = 9400;
// uid and gid of the runtime image's user (Dockerfile, target runtime).
const int kRuntimeImageGid = 65532;

std::string b64(const std::string& in) {
  static const char* tbl = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  int val = 0, bits = -6;
  for (unsigned char c : in) {
    val = (val << 8) + c;
    bits += 8;
    while (bits >= 0) {
      out.push_back(tbl[(val >> bits) & 0x3F]);
      bits -= 6;
    }
  }
  if (bits > -6) out.push_back(tbl[((val << 8) >> (bits + 8)) & 0x3F]);
  while (out.size() % 4) out.push_back('=');
  return out;
}

// JSON -> YAML node; numbers keep JSON's shortest round-trip text.
YAML::Node toYaml(const json& j) {
  if (j.is_object()) {
    YAML::Node n(YAML::NodeType::Map);
    for (auto it = j.begin(); it != j.end(); ++it) n[it.key()] = toYaml(it.value());
    return n;
  }
  if (j.is_array()) {
    YAML::Node n(YAML::NodeType::Sequence);
    for (const auto& v : j) n.push_back(toYaml(v));
    return n;
  }
  if (j.is_boolean()) return YAML::Node(j.get<bool>());
  if (j.is_number()) return YAML::Node(j.dump());
  if (j.is_string()) return YAML::Node(j.get<std::string>());
  return YAML::Node();
}

json labelsFor(const JobRef& job) { return {{kLabelJob, job.meta.name}}; }

std::string gangScheduler(const std::string& schedulerName) {
  if (schedulerName == "volcano") return "volcano";
  if (schedulerName.find("scheduler-plugins") != std::string::npos ||
      schedulerName.find("coscheduling") != std::string::npos)
    return "coscheduling";
  return "";
}

json envVar(const std::string& name, const std::string& value) { return {{"name", name}, {"value", value}}; }

}  // namespace

std::string configMapName(const std::string& job) { return job + "-config"; }
std::string secretName(const std::string& job) { return job + "-telemetry"; }

long heartbeatSeconds(const api::EDiTJobSpec& s) {
  if (s.hangTimeoutSeconds <= 0) return 10;
  return std::clamp(s.hangTimeoutSeconds / 5, 1L, 10L);
}
std::string serviceName(const std::string& job) { return job; }
std::string podName(const std::string& job, int rank) { return job + "-worker-" + std::to_string(rank); }
// Workers only: the export pod shares the job label but has no rank.
std::string podSelector(const std::string& job) { return std::string(kLabelJob) + "=" + job + "," + kLabelRank; }
std::string masterAddr(const std::string& job, const std::string& ns) {
  return podName(job, 0) + "." + serviceName(job) + "." + ns + ".svc";
}

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

std::string checkpointDir(const JobRef& job) {
  const json& ckpt = job.spec.checkpoint;
  std::string dir = ckpt.contains("dir") && ckpt["dir"].is_string() ? ckpt["dir"].get<std::string>() : "";
  if (ckpt.contains("pvc") && dir.empty()) dir = std::string(kCheckpointMount) + "/" + job.meta.name;
  return dir;
}

json ownerReference(const api::JobMeta& meta) {
  return {{"apiVersion", api::kApiVersion}, {"kind", api::kKind}, {"name", meta.name},
          {"uid", meta.uid}, {"controller", true}, {"blockOwnerDeletion", true}};
}

std::string workerConfigYaml(const JobRef& job) {
  const auto& s = job.spec;
  json cfg = json::object();
  auto put = [&cfg](const char* key, json section) {
    if (section.is_object() && !section.empty()) cfg[key] = std::move(section);
  };
  put("model", s.model);
  json data = s.data;
  if (data.contains("pvc")) {
    // Relative token-file paths resolve inside the mounted claim.
    for (const char* key : {"train", "val"})
      if (data.contains(key) && data[key].is_string()) {
        std::string p = data[key];
        if (!p.empty() && p[0] != '/') data[key] = std::string(kDataMount) + "/" + p;
      }
    data.erase("pvc");
  }
  put("data", data);
  put("training", s.training);
  put("algorithm", s.algorithm);
  json ckpt = s.checkpoint;
  ckpt.erase("pvc");
  const std::string dir = checkpointDir(job);
  if (!dir.empty()) ckpt["dir"] = dir;
  put("checkpoint", ckpt);
  put("debug", s.debug);
  // What survivors do when a peer dies: wait for its replacement, or exit 75 so that the
  // operator restarts the gang (runPolicy.replicaRecovery; ddp never waits). The rest of
  // the runtime section is the user's (spec.runtime).
  json runtime = s.runtime;
  runtime["recovery"] = s.inPlaceRecovery() ? "inPlace" : "exit";
  cfg["runtime"] = std::move(runtime);
  YAML::Emitter out;
  out << toYaml(cfg);
  return std::string(out.c_str()) + "\n";
}

void checkWorkerConfig(const JobRef& job) {
  try {
    edit::parseConfig(workerConfigYaml(job));
  } catch (const edit::ConfigError& e) {
    // "algorithm.syncSeconds: must be ..." -> field spec.algorithm.syncSeconds.
    const std::string msg = e.what();
    const size_t colon = msg.find(": ");
    if (colon == std::string::npos) throw api::SpecError("spec", msg);
    throw api::SpecError("spec." + msg.substr(0, colon), msg.substr(colon + 2));
  }
}

json desiredConfigMap(const JobRef& job) {
  return {{"apiVersion", "v1"},
          {"kind", "ConfigMap"},
          {"metadata",
           {{"name", configMapName(job.meta.name)}, {"namespace", job.meta.ns}, {"labels", labelsFor(job)},
            {"ownerReferences", json::array({ownerReference(job.meta)})}}},
          {"data", {{kConfigKey, workerConfigYaml(job)}}}};
}

json desiredSecret(const JobRef& job, const std::string& token) {
  return {{"apiVersion", "v1"},
          {"kind", "Secret"},
          {"type", "Opaque"},
          {"metadata",
           {{"name", secretName(job.meta.name)}, {"namespace", job.meta.ns}, {"labels", labelsFor(job)},
            {"ownerReferences", json::array({ownerReference(job.meta)})}}},
          {"data", {{kTokenKey, b64(token)}}}};
}

json desiredService(const JobRef& job) {
  return {{"apiVersion", "v1"},
          {"kind", "Service"},
          {"metadata",
           {{"name", serviceName(job.meta.name)}, {"namespace", job.meta.ns}, {"labels", labelsFor(job)},
            {"ownerReferences", json::array({ownerReference(job.meta)})}}},
          {"spec",
           {{"clusterIP", "None"},
            // Rendezvous happens before any pod is Ready: publish addresses early.
            {"publishNotReadyAddresses", true},
            {"selector", labelsFor(job)},
            {"ports", json::array({{{"name", "master"}, {"port", job.spec.masterPort},
                                    {"targetPort", job.spec.masterPort}, {"protocol", "TCP"}}})}}}};
}

json desiredPodGroup(const JobRef& job) {
  std::string gang = gangScheduler(job.spec.schedulerName);
  if (gang.empty()) return json::object();
  json pg = {{"apiVersion", gang == "volcano" ? "scheduling.volcano.sh/v1beta1" : "scheduling.x-k8s.io/v1alpha1"},
             {"kind", "PodGroup"},
             {"metadata",
              {{"name", job.meta.name}, {"namespace", job.meta.ns}, {"labels", labelsFor(job)},
               {"ownerReferences", json::array({ownerReference(job.meta)})}}},
             {"spec", {{"minMember", job.spec.worldSize()}}}};
  if (gang == "volcano" && !job.spec.priorityClassName.empty())
    pg["spec"]["priorityClassName"] = job.spec.priorityClassName;
  return pg;
}

json desiredPod(const JobRef& job, int rank, int restartGeneration, const OperatorSettings& settings,
                const std::set<std::string>& avoidNodes, PodJoin join, const PodGroupRef& group) {
  const auto& s = job.spec;
  const std::string& name = job.meta.name;
  const std::string& ns = job.meta.ns;
  int replica = rank / s.shardsPerReplica;
  int shard = rank % s.shardsPerReplica;
  std::string pod = podName(name, rank);

  // The job's own labels and annotations first: the operator's (edit.io/*, gang
  // scheduling) overwrite them.
  json labels = s.podTemplate.labels;
  labels.update({{kLabelJob, name}, {kLabelRank, std::to_string(rank)}, {kLabelReplica, std::to_string(replica)},
                 {kLabelShard, std::to_string(shard)}, {kLabelGeneration, std::to_string(restartGeneration)}});
  json annotations = s.podTemplate.annotations;
  std::string gang = gangScheduler(s.schedulerName);
  if (gang == "volcano") annotations["scheduling.k8s.io/group-name"] = name;
  if (gang == "coscheduling") labels["scheduling.x-k8s.io/pod-group"] = name;
  if (!s.kueueQueue.empty()) {
    const PodGroupRef g = group.name.empty() ? gangPodGroup(job, restartGeneration) : group;
    labels[api::kKueueQueueLabel] = s.kueueQueue;
    labels["kueue.x-k8s.io/pod-group-name"] = g.name;
    annotations["kueue.x-k8s.io/pod-group-total-count"] = std::to_string(g.total);
    // A failure ends the group (its quota and finalizers are released): the operator
    // answers it with a new gang, a new group (failure_policy.cpp).
    annotations["kueue.x-k8s.io/retriable-in-group"] = "false";
  }

  json env = json::array({
      envVar("EDIT_JOB", name), envVar("EDIT_NAMESPACE", ns), envVar("RANK", std::to_string(rank)),
      envVar("WORLD_SIZE", std::to_string(s.worldSize())), envVar("EDIT_REPLICAS", std::to_string(s.replicas)),
      envVar("EDIT_SHARDS", std::to_string(s.shardsPerReplica)), envVar("MASTER_ADDR", masterAddr(name, ns)),
      envVar("MASTER_PORT", std::to_string(s.masterPort)),
      envVar("EDIT_TELEMETRY_ADDR", settings.telemetryAdvertiseAddr),
      envVar("EDIT_RESTART_GENERATION", std::to_string(restartGeneration)),
      envVar("EDIT_TERMINATION_LOG", kTerminationMessagePath),
      envVar("EDIT_TELEMETRY_HEARTBEAT_SECONDS", std::to_string(heartbeatSeconds(s))),
      {{"name", "EDIT_CONFIG"},
       {"valueFrom", {{"configMapKeyRef", {{"name", configMapName(name)}, {"key", kConfigKey}}}}}},
      {{"name", "EDIT_TELEMETRY_TOKEN"},
       {"valueFrom", {{"secretKeyRef", {{"name", secretName(name)}, {"key", kTokenKey}}}}}},
      {{"name", "POD_NAME"}, {"valueFrom", {{"fieldRef", {{"fieldPath", "metadata.name"}}}}}},
      {{"name", "POD_UID"}, {"valueFrom", {{"fieldRef", {{"fieldPath", "metadata.uid"}}}}}},
      {{"name", "NODE_NAME"}, {"valueFrom", {{"fieldRef", {{"fieldPath", "spec.nodeName"}}}}}},
      // Gloo binds and /metrics listens on the pod's own address.
      {{"name", "POD_IP"}, {"valueFrom", {{"fieldRef", {{"fieldPath", "status.podIP"}}}}}},
      {{"name", "EDIT_METRICS_HOST"}, {"valueFrom", {{"fieldRef", {{"fieldPath", "status.podIP"}}}}}},
      envVar("EDIT_METRICS_PORT", std::to_string(kWorkerMetricsPort)),
  });
  const bool telemetryTls = !settings.telemetryCaSecret.empty();
  if (telemetryTls) {
    env.push_back(envVar("EDIT_TELEMETRY_CA_FILE", std::string(kTelemetryCaDir) + "/" + kTelemetryCaKey));
    if (!settings.telemetryServerName.empty())
      env.push_back(envVar("EDIT_TELEMETRY_SERVER_NAME", settings.telemetryServerName));
  }
  if (join != PodJoin::Start) env.push_back(envVar("EDIT_JOIN", join == PodJoin::Scale ? "scale" : "1"));
  for (const auto& e : s.env) env.push_back(e);  // after ours: the job's own values win

  json resources = s.resources;
  if (s.gpusPerWorker > 0) {
    resources["limits"]["nvidia.com/gpu"] = std::to_string(s.gpusPerWorker);
    resources["requests"]["nvidia.com/gpu"] = std::to_string(s.gpusPerWorker);
  }

  json volumes = s.volumes;
  json mounts = s.volumeMounts;
  if (s.checkpoint.contains("pvc") && s.checkpoint["pvc"].is_string()) {
    volumes.push_back({{"name", "edit-checkpoint"}, {"persistentVolumeClaim", {{"claimName", s.checkpoint["pvc"]}}}});
    mounts.push_back({{"name", "edit-checkpoint"}, {"mountPath", kCheckpointMount}});
  }
  if (s.data.contains("pvc") && s.data["pvc"].is_string()) {
    volumes.push_back({{"name", "edit-data"}, {"persistentVolumeClaim", {{"claimName", s.data["pvc"]}, {"readOnly", true}}}});
    mounts.push_back({{"name", "edit-data"}, {"mountPath", kDataMount}, {"readOnly", true}});
  }
  if (telemetryTls) {  // only ca.crt: the Secret may hold other keys the worker must not see
    volumes.push_back({{"name", "edit-telemetry-ca"},
                       {"secret", {{"secretName", settings.telemetryCaSecret},
                                   {"items", json::array({{{"key", kTelemetryCaKey}, {"path", kTelemetryCaKey}}})}}}});
    mounts.push_back({{"name", "edit-telemetry-ca"}, {"mountPath", kTelemetryCaDir}, {"readOnly", true}});
  }

  json containerSecurity = containerSecurityContext(s);
  json podSecurity = podSecurityContext(s);

  json container = {{"name", "worker"}, {"image", s.image}, {"command", s.command}, {"env", env},
                    {"securityContext", containerSecurity},
                    {"ports", json::array({{{"name", "master"}, {"containerPort", s.masterPort}, {"protocol", "TCP"}},
                                           {{"name", "metrics"}, {"containerPort", kWorkerMetricsPort}, {"protocol", "TCP"}}})}};
  // edit-train writes why it failed to the termination message file (named in its env too,
  // so that a runtime without mount namespaces can translate the path, as the API
  // stand-in's kubelet does); a worker that dies before it can (a custom command, a
  // crash) still leaves the tail of its log in the pod's status.
  container["terminationMessagePath"] = kTerminationMessagePath;
  container["terminationMessagePolicy"] = "FallbackToLogsOnError";
  if (!s.args.empty()) container["args"] = s.args;
  if (!s.imagePullPolicy.empty()) container["imagePullPolicy"] = s.imagePullPolicy;
  if (!resources.empty()) container["resources"] = resources;
  if (!mounts.empty()) container["volumeMounts"] = mounts;

  // A shard group talks every step: pack a replica onto one node. Replicas only meet at
  // syncs: spread them (a node may hold one whole replica, so skew = N).
  json affinity = {
      {"podAffinity",
       {{"preferredDuringSchedulingIgnoredDuringExecution",
         json::array({{{"weight", 100},
                       {"podAffinityTerm",
                        {{"labelSelector", {{"matchLabels", {{kLabelJob, name}, {kLabelReplica, std::to_string(replica)}}}}},
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
  json spread = json::array({{{"maxSkew", s.shardsPerReplica},
                              {"topologyKey", "kubernetes.io/hostname"},
                              {"whenUnsatisfiable", "ScheduleAnyway"},
                              {"labelSelector", {{"matchLabels", {{kLabelJob, name}}}}}}});

  json spec = {{"hostname", pod},
               {"subdomain", serviceName(name)},
               {"restartPolicy", "Never"},
               {"securityContext", podSecurity},
               {"containers", json::array({container})},
               {"affinity", affinity},
               {"topologySpreadConstraints", spread}};
  if (!volumes.empty()) spec["volumes"] = volumes;
  if (!s.nodeSelector.empty()) spec["nodeSelector"] = s.nodeSelector;
  if (!s.tolerations.empty()) spec["tolerations"] = s.tolerations;
  if (!s.priorityClassName.empty()) spec["priorityClassName"] = s.priorityClassName;
  if (!s.schedulerName.empty()) spec["schedulerName"] = s.schedulerName;
  if (!s.serviceAccountName.empty()) spec["serviceAccountName"] = s.serviceAccountName;
  if (!s.podTemplate.imagePullSecrets.empty()) spec["imagePullSecrets"] = s.podTemplate.imagePullSecrets;

  json metadata = {{"name", pod}, {"namespace", ns}, {"labels", labels},
                   {"ownerReferences", json::array({ownerReference(job.meta)})}};
  if (!annotations.empty()) metadata["annotations"] = annotations;
  return {{"apiVersion", "v1"}, {"kind", "Pod"}, {"metadata", metadata}, {"spec", spec}};
}

namespace {
// "<job>-<suffix>" within a label value's 63 characters (the job name is cut, not the suffix).
std::string groupName(const std::string& job, const std::string& suffix) {
  const size_t room = 63 - suffix.size() - 1;
  std::string head = job.substr(0, room);
  while (!head.empty() && head.back() == '-') head.pop_back();
  return head + "-" + suffix;
}
}  // namespace

PodGroupRef gangPodGroup(const JobRef& job, int restartGeneration) {
  return {groupName(job.meta.name, "g" + std::to_string(restartGeneration)), job.spec.worldSize()};
}

PodGroupRef scalePodGroup(const JobRef& job, int restartGeneration, int from, int to, long scaleStart) {
  return {groupName(job.meta.name, "g" + std::to_string(restartGeneration) + "-scale" + std::to_string(scaleStart)),
          (to - from) * job.spec.shardsPerReplica};
}

std::string randomToken() {
  unsigned char bytes[32];
  if (RAND_bytes(bytes, sizeof bytes) != 1) throw std::runtime_error("RAND_bytes failed");
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (unsigned char b : bytes) {
    out.push_back(hex[b >> 4]);
    out.push_back(hex[b & 15]);
  }
  return out;
}

}  // namespace edit::op::controller
