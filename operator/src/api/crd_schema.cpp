#include "api/crd_schema.h"

#include <algorithm>

#include "api/spec_table.h"
#include "worker_config.h"

namespace edit::op::api {
namespace {

using ojson = nlohmann::ordered_json;

// Runtime fields the operator sets from another spec field: not in the CRD (the API
// rejects them as unknown fields; parseSpec names where they go).
bool operatorOwned(const std::string& section, const std::string& key) {
  return section == "runtime" && key == "recovery";
}

// Sections default to {} so that the API server fills the runtime's defaults in when a
// section is left out; the debug tree does not (it stays out of jobs that do not use it).
ojson withDefaults(ojson node, bool defaultEmpty) {
  if (node.value("type", "") != "object" || !node.contains("properties")) return node;
  ojson out;
  for (auto it = node.begin(); it != node.end(); ++it) {
    if (it.key() == "properties") {
      if (defaultEmpty) out["default"] = ojson::object();
      ojson props = ojson::object();
      for (auto p = it.value().begin(); p != it.value().end(); ++p) props[p.key()] = withDefaults(p.value(), defaultEmpty);
      out["properties"] = props;
    } else {
      out[it.key()] = it.value();
    }
  }
  return out;
}

std::string head(const std::string& path) { return path.substr(0, path.find('.')); }
std::string tail(const std::string& path) { return path.substr(path.find('.') + 1); }

}  // namespace

const std::vector<std::string>& workerSections() {
  static const std::vector<std::string> k = {"model", "data", "training", "algorithm", "checkpoint", "debug", "runtime"};
  return k;
}

ojson crdSpecSchema() {
  EDiTJobSpec defaults;
  defaults.exportModel.emplace();  // its fields are in the table only when set
  const auto fields = specFields(defaults);
  const ojson worker = ojson::parse(edit::workerConfigSchemaJson());
  ojson props = ojson::object();
  // The operator's fields and sections, in the table's order; each section gathers its fields.
  for (const auto& f : fields) {
    const std::string top = head(f.path);
    if (f.path.find('.') == std::string::npos) {
      props[f.path] = ojson::parse(f.schema().dump());
      continue;
    }
    if (std::find(workerSections().begin(), workerSections().end(), top) != workerSections().end()) continue;
    ojson& sec = props[top];
    if (sec.is_null()) {
      for (const auto& s : specSections()) {
        if (top != s.path) continue;
        sec["type"] = "object";
        if (s.defaultEmpty) sec["default"] = ojson::object();
        sec["description"] = s.doc;
      }
    }
    if (f.required) sec["required"].push_back(tail(f.path));
    sec["properties"][tail(f.path)] = ojson::parse(f.schema().dump());
  }
  ojson specRulesCrd = ojson::array();
  for (const auto& r : specRules()) {
    if (!r.cel) continue;
    const ojson rule = ojson::parse(r.crdRule().dump());
    if (!*r.on) {
      specRulesCrd.push_back(rule);
      continue;
    }
    props[r.on]["x-kubernetes-validations"].push_back(rule);
  }
  // The worker sections, plus the operator's fields inside them (the volume claims).
  for (const auto& name : workerSections()) {
    ojson node = withDefaults(worker["properties"][name], name != "debug");
    ojson kept = ojson::object();
    for (auto it = node["properties"].begin(); it != node["properties"].end(); ++it)
      if (!operatorOwned(name, it.key())) kept[it.key()] = it.value();
    for (const auto& f : fields)
      if (head(f.path) == name && f.path != name) kept[tail(f.path)] = ojson::parse(f.schema().dump());
    if (name == "checkpoint" && kept.contains("everySteps")) {
      kept["everySteps"]["default"] = kClusterCheckpointEverySteps;
      kept["everySteps"]["description"] =
          kept["everySteps"].value("description", "") + " On a cluster the default is " +
          std::to_string(kClusterCheckpointEverySteps) +
          ": a worker killed before its checkpoint on SIGTERM finished resumes from the newest periodic one.";
    }
    node["properties"] = kept;
    props[name] = node;
  }
  return {{"properties", props}, {"x-kubernetes-validations", specRulesCrd}};
}

}  // namespace edit::op::api
