// crds/editjob.yaml against the tables it is made from (operator/src/api/crd_schema.h):
// every made node field by field, every spec-level rule the operator enforces. Runs in
// every build with the operator (yaml-cpp, no Python); the fix for a failure is
// `python3 scripts/schema_outputs.py --write`. And the operator's parser against its own
// table: each field's bounds are where the CRD says.
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <fstream>
#include <limits>
#include <regex>
#include <set>
#include <sstream>

#include "api/crd_schema.h"
#include "api/editjob.h"
#include "api/spec_table.h"
#include "api/status.h"
#include "status_fixture.h"

using nlohmann::json;
namespace api = edit::op::api;

namespace {

// A YAML node as JSON, with YAML 1.2 core scalars: plain true/false, null, integers and
// floats; quoted and block scalars are strings.
json toJson(const YAML::Node& n) {
  switch (n.Type()) {
    case YAML::NodeType::Map: {
      json o = json::object();
      for (const auto& kv : n) o[kv.first.as<std::string>()] = toJson(kv.second);
      return o;
    }
    case YAML::NodeType::Sequence: {
      json a = json::array();
      for (const auto& v : n) a.push_back(toJson(v));
      return a;
    }
    case YAML::NodeType::Scalar: {
      const std::string s = n.Scalar();
      if (n.Tag() == "!") return s;
      if (s == "true" || s == "false") return s == "true";
      if (s == "null" || s == "~") return nullptr;
      static const std::regex integer("[-+]?[0-9]+"), number("[-+]?([0-9]+\\.?[0-9]*|\\.[0-9]+)([eE][-+]?[0-9]+)?");
      if (std::regex_match(s, integer)) return std::stoll(s);
      if (std::regex_match(s, number)) return std::stod(s);
      return s;
    }
    default: return nullptr;
  }
}

json crdSpec() {
  std::ifstream f(EDIT_SOURCE_ROOT "/crds/editjob.yaml");
  std::stringstream text;
  text << f.rdbuf();
  const json crd = toJson(YAML::Load(text.str()));
  return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"];
}

// Every difference between two schema nodes, one line each.
void differences(const json& want, const json& have, const std::string& path, std::vector<std::string>& out) {
  if (!have.is_object()) {
    out.push_back(path + ": missing");
    return;
  }
  std::set<std::string> keys;
  for (auto it = want.begin(); it != want.end(); ++it) keys.insert(it.key());
  for (auto it = have.begin(); it != have.end(); ++it) keys.insert(it.key());
  for (const auto& k : keys) {
    const json w = want.value(k, json()), h = have.value(k, json());
    if (k == "properties" && w.is_object() && h.is_object()) {
      for (auto it = w.begin(); it != w.end(); ++it) differences(it.value(), h.value(it.key(), json()), path + "." + it.key(), out);
      for (auto it = h.begin(); it != h.end(); ++it)
        if (!w.contains(it.key())) out.push_back(path + "." + it.key() + ": not in the table");
    } else if (w != h) {
      out.push_back(path + ": " + k + " is " + h.dump() + ", the table's is " + w.dump());
    }
  }
}

std::string lines(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& l : v) s += "\n  " + l;
  return s;
}

}  // namespace

TEST(CrdSchema, MadeNodesEqualTheTables) {
  const json made = json::parse(api::crdSpecSchema().dump());
  const json spec = crdSpec();
  std::vector<std::string> problems;
  for (auto it = made["properties"].begin(); it != made["properties"].end(); ++it)
    differences(it.value(), spec["properties"].value(it.key(), json()), "spec." + it.key(), problems);
  EXPECT_TRUE(problems.empty()) << "crds/editjob.yaml differs from the tables (python3 scripts/schema_outputs.py "
                                   "--write):"
                                << lines(problems);
  // The worker sections and the operator's own are all made; nothing of them is hand-written.
  for (const auto& s : api::workerSections()) EXPECT_TRUE(made["properties"].contains(s)) << s;
  for (const auto& s : api::specSections()) EXPECT_TRUE(made["properties"].contains(s.path)) << s.path;
}

TEST(CrdSchema, EveryRuleTheOperatorChecksIsInTheCrd) {
  const json made = json::parse(api::crdSpecSchema().dump());
  const json have = crdSpec().value("x-kubernetes-validations", json::array());
  for (const auto& rule : made["x-kubernetes-validations"]) {
    bool found = false;
    for (const auto& h : have) found |= h == rule;
    EXPECT_TRUE(found) << "spec's x-kubernetes-validations lacks " << rule.dump();
  }
}

namespace {

// parseSpec of a job whose only non-default field is `path` = v; "" when accepted, else
// the field the error names.
std::string errorFieldOf(const std::string& path, const json& v) {
  json spec = {{"image", "img"}, {"checkpoint", {{"pvc", "c"}}}, {"export", {{"path", "hf"}}}};
  json* node = &spec;
  for (size_t start = 0;;) {
    const size_t dot = path.find('.', start);
    const std::string key = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (dot == std::string::npos) {
      (*node)[key] = v;
      break;
    }
    node = &(*node)[key];
    start = dot + 1;
  }
  try {
    api::parseSpec({{"metadata", {{"name", "j"}}}, {"spec", spec}});
  } catch (const api::SpecError& e) {
    return e.field();
  }
  return "";
}

}  // namespace

// What the CRD says of a field is what the operator enforces: each bound is the last value
// accepted, one step past it is refused naming the field.
TEST(CrdSchema, TheOperatorEnforcesTheTablesBounds) {
  api::EDiTJobSpec s;
  s.exportModel.emplace();
  for (const auto& f : api::specFields(s)) {
    const std::string field = "spec." + f.path;
    SCOPED_TRACE(field);
    if (f.isInteger()) {
      const int64_t lo = f.rule.ilo, hi = f.rule.ihi;
      // minReports must not exceed windowSteps (its own rule): test it below windowSteps' default.
      const int64_t top = f.path == "stragglerPolicy.minReports" ? 20 : hi;
      EXPECT_EQ(errorFieldOf(f.path, lo), "");
      EXPECT_EQ(errorFieldOf(f.path, top), "");
      EXPECT_EQ(errorFieldOf(f.path, lo - 1), field);
      if (hi < std::numeric_limits<int64_t>::max()) EXPECT_EQ(errorFieldOf(f.path, hi + 1), field);
      EXPECT_EQ(errorFieldOf(f.path, "1"), field);
      EXPECT_EQ(errorFieldOf(f.path, 1.5), field);
    } else if (f.kind == api::FieldKind::F64) {
      EXPECT_EQ(errorFieldOf(f.path, f.rule.dhi), "");
      EXPECT_EQ(errorFieldOf(f.path, f.rule.dhi + 1), field);
      EXPECT_EQ(errorFieldOf(f.path, f.rule.dlo), f.rule.loOpen ? field : "");
    } else if (f.kind == api::FieldKind::Str && !f.rule.choices.empty()) {
      for (const auto& c : f.rule.choices) EXPECT_EQ(errorFieldOf(f.path, c), "") << c;
      EXPECT_EQ(errorFieldOf(f.path, "none of them"), field);
    } else if (f.kind == api::FieldKind::Str) {
      if (f.path == "export.path") continue;  // its own rules: unit_export_test.cpp
      EXPECT_EQ(errorFieldOf(f.path, std::string(f.rule.maxLength, 'a')), "");
      EXPECT_EQ(errorFieldOf(f.path, std::string(f.rule.maxLength + 1, 'a')), field);
      EXPECT_EQ(errorFieldOf(f.path, 7), field);
    } else {
      EXPECT_EQ(errorFieldOf(f.path, true), "");
      EXPECT_EQ(errorFieldOf(f.path, "yes"), field);
    }
  }
}

// kubectl and the phase metric list the same phases as the operator sets.
TEST(CrdSchema, PhasesAreTheOperators) {
  std::ifstream f(EDIT_SOURCE_ROOT "/crds/editjob.yaml");
  std::stringstream text;
  text << f.rdbuf();
  const json crd = toJson(YAML::Load(text.str()));
  json names = json::array();
  for (api::Phase p : api::kPhases) names.push_back(api::phaseName(p));
  EXPECT_EQ(crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]["phase"]["enum"],
            names);
}

namespace {

// Where a status value and the CRD's status schema disagree: a field the schema lacks, or
// a JSON type it does not allow; and (complete) a schema field the value lacks.
void statusMismatches(const json& schema, const json& value, const std::string& path, std::vector<std::string>& out) {
  const std::string type = schema.value("type", "");
  const bool ok = value.is_object() ? type == "object"
                  : value.is_array() ? type == "array"
                  : value.is_boolean() ? type == "boolean"
                  : value.is_string() ? type == "string"
                  : value.is_number_integer() ? type == "integer" || type == "number"
                  : value.is_number() ? type == "number"
                                       : false;
  if (!ok) out.push_back(path + ": the operator writes " + value.dump() + ", the CRD's type is '" + type + "'");
  if (value.is_array())
    for (const auto& v : value) statusMismatches(schema.value("items", json::object()), v, path + "[]", out);
  if (!value.is_object()) return;
  const json props = schema.value("properties", json::object());
  for (auto it = value.begin(); it != value.end(); ++it) {
    if (props.contains(it.key())) statusMismatches(props[it.key()], it.value(), path + "." + it.key(), out);
    else out.push_back(path + "." + it.key() + ": written by the operator, not in the CRD");
  }
  for (auto it = props.begin(); it != props.end(); ++it)
    if (!value.contains(it.key())) out.push_back(path + "." + it.key() + ": in the CRD, never written by the operator");
}

}  // namespace

// The CRD's status schema (hand-written, with its descriptions) holds exactly the fields
// the typed status writes, with their types: a field added to api::EDiTJobStatus that the
// CRD lacks would be pruned by the API server.
TEST(CrdSchema, StatusSchemaIsTheTypedStatus) {
  std::ifstream f(EDIT_SOURCE_ROOT "/crds/editjob.yaml");
  std::stringstream text;
  text << f.rdbuf();
  const json crd = toJson(YAML::Load(text.str()));
  const json schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"];
  const json written = api::EDiTJobStatus::fromJson(kFullStatus()).toJson();
  ASSERT_EQ(written, kFullStatus());  // every field survives the typed status
  std::vector<std::string> problems;
  statusMismatches(schema, written, "status", problems);
  EXPECT_TRUE(problems.empty()) << lines(problems);
}
