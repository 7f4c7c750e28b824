#include "controller/desired.h"

#include "worker_config.h"

#include <openssl/rand.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "api/spec_table.h"
#include "modes.h"

namespace edit::op::controller {
namespace {

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

json labelsFor(const JobRef& job) { return {{api::kLabelJob, job.meta.name}}; }

}  // namespace

std::string gangScheduler(const std::string& schedulerName) {
  if (schedulerName == "volcano") return "volcano";
  if (schedulerName.find("scheduler-plugins") != std::string::npos ||
      schedulerName.find("coscheduling") != std::string::npos)
    return "coscheduling";
  return "";
}

std::string configMapName(const std::string& job) { return job + "-config"; }
std::string secretName(const std::string& job) { return job + "-telemetry"; }

long heartbeatSeconds(const api::EDiTJobSpec& s) {
  if (s.hangTimeoutSeconds <= 0) return 10;
  return std::clamp(s.hangTimeoutSeconds / 5, 1L, 10L);
}
std::string serviceName(const std::string& job) { return job; }
std::string podName(const std::string& job, int rank) { return job + "-worker-" + std::to_string(rank); }
// Workers only: the export pod shares the job label but has no rank.
std::string podSelector(const std::string& job) { return std::string(api::kLabelJob) + "=" + job + "," + api::kLabelRank; }
std::string masterAddr(const std::string& job, const std::string& ns) {
  return podName(job, 0) + "." + serviceName(job) + "." + ns + ".svc";
}

std::string checkpointDir(const JobRef& job) {
  const json& ckpt = job.spec.checkpoint;
  std::string dir = ckpt.contains("dir") && ckpt["dir"].is_string() ? ckpt["dir"].get<std::string>() : "";
  if (!job.spec.checkpointPvc.empty() && dir.empty()) dir = std::string(kCheckpointMount) + "/" + job.meta.name;
  return dir;
}

json ownerReference(const api::JobMeta& meta) {
  return {{"apiVersion", api::kApiVersion}, {"kind", api::kKind}, {"name", meta.name},
          {"uid", meta.uid}, {"controller", true}, {"blockOwnerDeletion", true}};
}

json controllerRef(const json& obj) {
  if (!obj.contains("metadata") || !obj["metadata"].is_object()) return json::object();
  for (const auto& r : obj["metadata"].value("ownerReferences", json::array()))
    if (r.is_object() && r.value("controller", false)) return r;
  return json::object();
}

std::string workerConfigYaml(const JobRef& job) {
  const auto& s = job.spec;
  json cfg = json::object();
  auto put = [&cfg](const char* key, json section) {
    if (section.is_object() && !section.empty()) cfg[key] = std::move(section);
  };
  put("model", s.model);
  json data = s.data;
  if (!s.dataPvc.empty()) {
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
  if (!ckpt.contains("everySteps") || ckpt["everySteps"].is_null()) ckpt["everySteps"] = api::kClusterCheckpointEverySteps;
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

long terminationGraceSeconds(const JobRef& job) {
  constexpr long kBase = 30;
  if (job.spec.terminationGracePeriodSeconds) return *job.spec.terminationGracePeriodSeconds;
  edit::Config cfg;
  try {
    cfg = edit::parseConfig(workerConfigYaml(job));
  } catch (const std::exception&) {
    return kBase;  // an invalid spec fails before any pod exists
  }
  const double d = static_cast<double>(cfg.model.dim), f = static_cast<double>(cfg.model.ffnDim);
  const double v = static_cast<double>(cfg.model.vocabSize), layers = static_cast<double>(cfg.model.layers);
  // Embedding and head, and per layer attention (4 d^2), the SwiGLU MLP (3 d f) and two norms.
  const double params = 2 * v * d + layers * (4 * d * d + 3 * d * f + 2 * d) + d;
  const double k = edit::hasLocalPhases(job.spec.mode()) ? 6 : 4;
  const double bytes = 4 * k * params / std::max(1, job.spec.shardsPerReplica);
  return kBase + static_cast<long>(std::ceil(bytes / kCheckpointBytesPerSecond));
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

std::string networkPolicyName(const std::string& job) { return job + "-workers"; }

json desiredNetworkPolicy(const JobRef& job, const OperatorSettings& settings) {
  json ingress = json::array({{{"from", json::array({{{"podSelector", {{"matchLabels", labelsFor(job)}}}}})}}});
  if (!settings.metricsNamespace.empty())
    ingress.push_back(
        {{"from", json::array({{{"namespaceSelector",
                                 {{"matchLabels", {{"kubernetes.io/metadata.name", settings.metricsNamespace}}}}}}})},
         {"ports", json::array({{{"port", kWorkerMetricsPort}, {"protocol", "TCP"}}})}});
  return {{"apiVersion", "networking.k8s.io/v1"},
          {"kind", "NetworkPolicy"},
          {"metadata",
           {{"name", networkPolicyName(job.meta.name)}, {"namespace", job.meta.ns}, {"labels", labelsFor(job)},
            {"ownerReferences", json::array({ownerReference(job.meta)})}}},
          {"spec",
           {{"podSelector", {{"matchLabels", labelsFor(job)}}}, {"policyTypes", json::array({"Ingress"})},
            {"ingress", ingress}}}};
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
