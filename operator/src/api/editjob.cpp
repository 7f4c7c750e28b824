#include "api/editjob.h"

#include <algorithm>
#include <regex>

#include "api/spec_table.h"

namespace edit::op::api {
namespace {

using nlohmann::json;

const json* field(const json& obj, const char* key) {
  if (!obj.is_object()) return nullptr;
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
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

// The value at a dotted path under obj, or nullptr.
const json* at(const json& obj, const std::string& path) {
  const json* cur = &obj;
  for (size_t start = 0; cur;) {
    const size_t dot = path.find('.', start);
    cur = field(*cur, path.substr(start, dot == std::string::npos ? std::string::npos : dot - start).c_str());
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return cur;
}

void require(bool ok, const std::string& fieldPath, const std::string& problem) {
  if (!ok) throw SpecError(fieldPath, problem);
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

// The worker container's fields of Kubernetes types: their shape, not their contents
// (the API server checks those when the pod is created).
void parseContainer(const json& spec, EDiTJobSpec& s) {
  const std::string p = "spec";
  s.command = getStrings(spec, "command", s.command, p);
  require(!s.command.empty(), "spec.command", "must not be empty");
  s.args = getStrings(spec, "args", {}, p);
  s.resources = getObject(spec, "resources", p);
  s.env = getArray(spec, "env", p);
  for (size_t i = 0; i < s.env.size(); ++i) {
    const std::string at = "spec.env[" + std::to_string(i) + "].name";
    require(s.env[i].is_object() && s.env[i].contains("name") && s.env[i]["name"].is_string(), at, "is required");
    const std::string problem = reservedEnvProblem(s.env[i]["name"].get<std::string>());
    require(problem.empty(), at, problem);
  }
  s.nodeSelector = getObject(spec, "nodeSelector", p);
  s.tolerations = getArray(spec, "tolerations", p);
  s.volumes = getArray(spec, "volumes", p);
  s.volumeMounts = getArray(spec, "volumeMounts", p);
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
  // Sections first: the table's fields inside them need an object to be read from.
  for (const auto& sec : specSections()) getObject(spec, sec.path, p);
  if (field(spec, "export")) s.exportModel.emplace();
  s.model = getObject(spec, "model", p);
  s.data = getObject(spec, "data", p);
  s.training = getObject(spec, "training", p);
  s.algorithm = getObject(spec, "algorithm", p);
  s.checkpoint = getObject(spec, "checkpoint", p);
  s.debug = getObject(spec, "debug", p);
  s.runtime = getObject(spec, "runtime", p);
  bool minReportsSet = false;
  for (const auto& f : specFields(s)) {
    const json* v = at(spec, f.path);
    if (!v) {
      if (f.required) throw SpecError("spec." + f.path, "is required");
      continue;
    }
    f.read(*v);
    minReportsSet |= f.path == "stragglerPolicy.minReports";
  }
  if (!minReportsSet) s.stragglerPolicy.minReports = std::min(s.stragglerPolicy.minReports, s.stragglerPolicy.windowSteps);
  parseContainer(spec, s);
  // The worker sections are checked by the runtime's own parser (controller::checkWorkerConfig).
  require(!field(s.runtime, "recovery"), "spec.runtime.recovery",
          "is set by the operator from spec.runPolicy.replicaRecovery (InPlace or GangRestart): set it there");
  s.podTemplate = parsePodTemplate(spec);
  for (const auto& r : specRules())
    if (r.holds && !r.holds(s)) throw SpecError(r.field, r.problem());
  return s;
}

}  // namespace edit::op::api
