#include "api/editjob.h"

#include <regex>

namespace edit::op::api {
namespace {

using nlohmann::json;

const json* field(const json& obj, const char* key) {
  if (!obj.is_object()) return nullptr;
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

long getInt(const json& obj, const char* key, long def, const std::string& path) {
  const json* v = field(obj, key);
  if (!v) return def;
  // Every integer of the spec fits 32 bits; checking the range before any cast keeps
  // huge or fractional values from wrapping (4294967297 replicas is not 1 replica).
  constexpr double kMax = 2147483647.0, kMin = -2147483648.0;
  double d = 0;
  if (v->is_number_unsigned()) {
    const auto u = v->get<unsigned long long>();
    if (u > static_cast<unsigned long long>(kMax)) throw SpecError(path + "." + key, "must be at most 2147483647");
    return static_cast<long>(u);
  }
  if (v->is_number_integer()) {
    const auto i = v->get<long long>();
    if (i > static_cast<long long>(kMax) || i < static_cast<long long>(kMin))
      throw SpecError(path + "." + key, "must be between -2147483648 and 2147483647");
    return static_cast<long>(i);
  }
  if (v->is_number_float()) d = v->get<double>();
  else throw SpecError(path + "." + key, "must be an integer");
  if (!(d >= kMin && d <= kMax)) throw SpecError(path + "." + key, "must be between -2147483648 and 2147483647");
  if (d != static_cast<double>(static_cast<long>(d))) throw SpecError(path + "." + key, "must be an integer");
  return static_cast<long>(d);
}

double getNumber(const json& obj, const char* key, double def, const std::string& path) {
  const json* v = field(obj, key);
  if (!v) return def;
  if (!v->is_number()) throw SpecError(path + "." + key, "must be a number");
  return v->get<double>();
}

std::string getString(const json& obj, const char* key, const std::string& def, const std::string& path) {
  const json* v = field(obj, key);
  if (!v) return def;
  if (!v->is_string()) throw SpecError(path + "." + key, "must be a string");
  return v->get<std::string>();
}

bool getBool(const json& obj, const char* key, bool def, const std::string& path) {
  const json* v = field(obj, key);
  if (!v) return def;
  if (!v->is_boolean()) throw SpecError(path + "." + key, "must be a boolean");
  return v->get<bool>();
}

json getObject(const json& obj, const char* key, const std::string& path) {
  const json* v = field(obj, key);
  if (!v) return json::object();
  if (!v->is_object()) throw SpecError(path + "." + key, "must be an object");
  return *v;
}

json getArray(const json& obj, const char* key, const std::string& path) {
  const json* v = field(obj, key);
  if (!v) return json::array();
  if (!v->is_array()) throw SpecError(path + "." + key, "must be an array");
  return *v;
}

std::vector<std::string> getStrings(const json& obj, const char* key, std::vector<std::string> def,
                                    const std::string& path) {
  const json* v = field(obj, key);
  if (!v) return def;
  if (!v->is_array()) throw SpecError(path + "." + key, "must be an array of strings");
  std::vector<std::string> out;
  for (size_t i = 0; i < v->size(); ++i) {
    if (!(*v)[i].is_string())
      throw SpecError(path + "." + key + "[" + std::to_string(i) + "]", "must be a string");
    out.push_back((*v)[i].get<std::string>());
  }
  return out;
}

void require(bool ok, const std::string& fieldPath, const std::string& problem) {
  if (!ok) throw SpecError(fieldPath, problem);
}

void requireOneOf(const std::string& value, std::initializer_list<const char*> allowed, const std::string& fieldPath) {
  std::string list;
  for (const char* a : allowed) {
    if (value == a) return;
    list += list.empty() ? a : std::string(", ") + a;
  }
  throw SpecError(fieldPath, "must be one of " + list + ", got '" + value + "'");
}

RunPolicy parseRunPolicy(const json& spec) {
  RunPolicy rp;
  json o = getObject(spec, "runPolicy", "spec");
  const std::string p = "spec.runPolicy";
  rp.backoffLimit = static_cast<int>(getInt(o, "backoffLimit", rp.backoffLimit, p));
  require(rp.backoffLimit >= 0, p + ".backoffLimit", "must be >= 0");
  if (field(o, "activeDeadlineSeconds")) {
    rp.activeDeadlineSeconds = getInt(o, "activeDeadlineSeconds", 0, p);
    require(*rp.activeDeadlineSeconds >= 1, p + ".activeDeadlineSeconds", "must be >= 1");
  }
  if (field(o, "ttlSecondsAfterFinished")) {
    rp.ttlSecondsAfterFinished = getInt(o, "ttlSecondsAfterFinished", 0, p);
    require(*rp.ttlSecondsAfterFinished >= 0, p + ".ttlSecondsAfterFinished", "must be >= 0");
  }
  rp.cleanPodPolicy = getString(o, "cleanPodPolicy", rp.cleanPodPolicy, p);
  requireOneOf(rp.cleanPodPolicy, {"All", "Running", "None"}, p + ".cleanPodPolicy");
  rp.suspend = getBool(o, "suspend", false, p);
  rp.replicaRecovery = getString(o, "replicaRecovery", rp.replicaRecovery, p);
  requireOneOf(rp.replicaRecovery, {"InPlace", "GangRestart"}, p + ".replicaRecovery");
  return rp;
}

StragglerPolicy parseStragglerPolicy(const json& spec) {
  StragglerPolicy sp;
  json o = getObject(spec, "stragglerPolicy", "spec");
  const std::string p = "spec.stragglerPolicy";
  sp.threshold = getNumber(o, "threshold", sp.threshold, p);
  require(sp.threshold >= 1.0 && sp.threshold <= 100, p + ".threshold", "must be in [1, 100] (a ratio to the job median)");
  sp.windowSteps = static_cast<int>(getInt(o, "windowSteps", sp.windowSteps, p));
  require(sp.windowSteps >= 1 && sp.windowSteps <= 10000, p + ".windowSteps", "must be in [1, 10000]");
  sp.action = getString(o, "action", sp.action, p);
  requireOneOf(sp.action, {"Report", "Replace"}, p + ".action");
  sp.minReports = static_cast<int>(getInt(o, "minReports", std::min(sp.minReports, sp.windowSteps), p));
  require(sp.minReports >= 1, p + ".minReports", "must be >= 1");
  return sp;
}

// Every value of an object must be a string (labels, annotations).
json getStringMap(const json& obj, const char* key, const std::string& path) {
  json m = getObject(obj, key, path);
  for (auto it = m.begin(); it != m.end(); ++it)
    require(it.value().is_string(), path + "." + key + "[\"" + it.key() + "\"]", "must be a string");
  return m;
}

PodTemplateOverride parsePodTemplate(const json& spec) {
  PodTemplateOverride t;
  const std::string p = "spec.podTemplate";
  json o = getObject(spec, "podTemplate", "spec");
  json md = getObject(o, "metadata", p);
  t.labels = getStringMap(md, "labels", p + ".metadata");
  for (auto it = t.labels.begin(); it != t.labels.end(); ++it)
    require(it.key().rfind("edit.io/", 0) != 0, p + ".metadata.labels[\"" + it.key() + "\"]",
            "labels under edit.io/ are set by the operator");
  t.annotations = getStringMap(md, "annotations", p + ".metadata");
  json ps = getObject(o, "spec", p);
  t.imagePullSecrets = getArray(ps, "imagePullSecrets", p + ".spec");
  for (size_t i = 0; i < t.imagePullSecrets.size(); ++i) {
    const json& e = t.imagePullSecrets[i];
    require(e.is_object() && e.contains("name") && e["name"].is_string() && !e["name"].get<std::string>().empty(),
            p + ".spec.imagePullSecrets[" + std::to_string(i) + "].name", "is required");
  }
  if (field(ps, "securityContext")) t.securityContext = getObject(ps, "securityContext", p + ".spec");
  if (field(ps, "containerSecurityContext"))
    t.containerSecurityContext = getObject(ps, "containerSecurityContext", p + ".spec");
  return t;
}

ExportSpec parseExport(const json& spec, const std::string& mode) {
  ExportSpec e;
  const std::string p = "spec.export";
  json o = getObject(spec, "export", "spec");
  e.path = getString(o, "path", "", p);
  require(!e.path.empty(), p + ".path",
          "is required: the directory to write, relative to the checkpoint volume (e.g. export)");
  require(e.path[0] != '/', p + ".path",
          "must be relative to the checkpoint volume (e.g. export), got the absolute path '" + e.path + "'");
  bool named = false;
  for (size_t start = 0; start <= e.path.size();) {
    size_t end = e.path.find('/', start);
    if (end == std::string::npos) end = e.path.size();
    const std::string seg = e.path.substr(start, end - start);
    require(seg != "..", p + ".path", "must stay inside the checkpoint volume: remove '..' from '" + e.path + "'");
    if (!seg.empty() && seg != ".") named = true;
    start = end + 1;
  }
  require(named, p + ".path", "must name a directory inside the checkpoint volume (e.g. export), got '" + e.path + "'");
  require(e.path.size() <= 1024, p + ".path", "must be at most 1024 characters");
  e.dtype = getString(o, "dtype", e.dtype, p);
  requireOneOf(e.dtype, {"f32", "bf16"}, p + ".dtype");
  e.weights = getString(o, "weights", e.weights, p);
  requireOneOf(e.weights, {"auto", "outer", "replica"}, p + ".weights");
  // ddp synchronizes every step and keeps no outer weights: edit-export would refuse.
  require(!(e.weights == "outer" && mode == "ddp"), p + ".weights",
          "outer: algorithm.mode ddp keeps no outer weights; use auto or replica (every replica holds the same model)");
  return e;
}

}  // namespace

std::string EDiTJobSpec::mode() const {
  const json* m = field(algorithm, "mode");
  return m && m->is_string() ? m->get<std::string>() : edit::kModeTable[0].name;
}

JobMeta parseMeta(const json& obj) {
  JobMeta m;
  const json md = obj.value("metadata", json::object());
  m.name = md.value("name", "");
  m.ns = md.value("namespace", "");
  m.uid = md.value("uid", "");
  m.generation = md.value("generation", 0L);
  m.resourceVersion = md.value("resourceVersion", "");
  m.deleting = md.contains("deletionTimestamp") && !md["deletionTimestamp"].is_null();
  return m;
}

void validateName(const std::string& name, int worldSize) {
  static const std::regex dns1035("[a-z]([-a-z0-9]*[a-z0-9])?");
  require(std::regex_match(name, dns1035), "metadata.name",
          "must be a DNS-1035 label (lower case letters, digits, '-', starting with a letter)");
  std::string longestPod = name + "-worker-" + std::to_string(std::max(0, worldSize - 1));
  require(longestPod.size() <= 63, "metadata.name",
          "too long: pod hostname '" + longestPod + "' would exceed 63 characters");
}

EDiTJobSpec parseSpec(const json& obj) {
  const json* specPtr = field(obj, "spec");
  if (!specPtr || !specPtr->is_object()) throw SpecError("spec", "is required and must be an object");
  const json& spec = *specPtr;
  const std::string p = "spec";
  EDiTJobSpec s;
  if (const json* md = field(obj, "metadata"); md && md->is_object())
    if (const json* labels = field(*md, "labels"); labels && labels->is_object())
      if (const json* q = field(*labels, kKueueQueueLabel); q && q->is_string()) s.kueueQueue = q->get<std::string>();
  s.replicas = static_cast<int>(getInt(spec, "replicas", s.replicas, p));
  require(s.replicas >= 1 && s.replicas <= 4096, "spec.replicas", "must be in [1, 4096]");
  s.shardsPerReplica = static_cast<int>(getInt(spec, "shardsPerReplica", s.shardsPerReplica, p));
  require(s.shardsPerReplica >= 1 && s.shardsPerReplica <= 1024, "spec.shardsPerReplica", "must be in [1, 1024]");
  require(s.worldSize() <= 4096, "spec.replicas", "replicas * shardsPerReplica (the world size) must be at most 4096");
  s.gpusPerWorker = static_cast<int>(getInt(spec, "gpusPerWorker", 0, p));
  require(s.gpusPerWorker >= 0 && s.gpusPerWorker <= 64, "spec.gpusPerWorker", "must be in [0, 64]");
  s.image = getString(spec, "image", "", p);
  require(!s.image.empty(), "spec.image", "is required");
  s.imagePullPolicy = getString(spec, "imagePullPolicy", "", p);
  if (!s.imagePullPolicy.empty())
    requireOneOf(s.imagePullPolicy, {"Always", "IfNotPresent", "Never"}, "spec.imagePullPolicy");
  s.command = getStrings(spec, "command", s.command, p);
  require(!s.command.empty(), "spec.command", "must not be empty");
  s.args = getStrings(spec, "args", {}, p);
  s.resources = getObject(spec, "resources", p);
  s.env = getArray(spec, "env", p);
  for (size_t i = 0; i < s.env.size(); ++i)
    require(s.env[i].is_object() && s.env[i].contains("name") && s.env[i]["name"].is_string(),
            "spec.env[" + std::to_string(i) + "].name", "is required");
  s.nodeSelector = getObject(spec, "nodeSelector", p);
  s.tolerations = getArray(spec, "tolerations", p);
  s.priorityClassName = getString(spec, "priorityClassName", "", p);
  s.schedulerName = getString(spec, "schedulerName", "", p);
  s.serviceAccountName = getString(spec, "serviceAccountName", "", p);
  s.volumes = getArray(spec, "volumes", p);
  s.volumeMounts = getArray(spec, "volumeMounts", p);
  s.masterPort = static_cast<int>(getInt(spec, "masterPort", s.masterPort, p));
  require(s.masterPort >= 1 && s.masterPort <= 65535, "spec.masterPort", "must be in [1, 65535]");
  s.hangTimeoutSeconds = getInt(spec, "hangTimeoutSeconds", s.hangTimeoutSeconds, p);
  require(s.hangTimeoutSeconds >= 0, "spec.hangTimeoutSeconds", "must be >= 0 (0 disables)");
  s.model = getObject(spec, "model", p);
  s.data = getObject(spec, "data", p);
  s.training = getObject(spec, "training", p);
  s.algorithm = getObject(spec, "algorithm", p);
  s.checkpoint = getObject(spec, "checkpoint", p);
  s.debug = getObject(spec, "debug", p);
  s.runtime = getObject(spec, "runtime", p);
  require(!field(s.runtime, "recovery"), "spec.runtime.recovery",
          "is set by the operator from spec.runPolicy.replicaRecovery (InPlace or GangRestart): set it there");
  if (const json* b = field(s.runtime, "backend"); b && b->is_string() && *b == "nccl")
    require(s.gpusPerWorker > 0, "spec.runtime.backend",
            "nccl needs GPUs: set spec.gpusPerWorker above 0, or backend auto or gloo");
  // The worker sections are checked by the runtime's own parser (controller::checkWorkerConfig).
  s.podTemplate = parsePodTemplate(spec);
  if (field(spec, "export")) {
    s.exportModel = parseExport(spec, s.mode());
    const json* dir = field(s.checkpoint, "dir");
    require(field(s.checkpoint, "pvc") || (dir && dir->is_string() && !dir->get<std::string>().empty()),
            "spec.export", "needs a checkpoint to read: set spec.checkpoint.pvc or spec.checkpoint.dir");
  }
  s.runPolicy = parseRunPolicy(spec);
  s.stragglerPolicy = parseStragglerPolicy(spec);
  return s;
}

}  // namespace edit::op::api
