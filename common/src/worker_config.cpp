// YAML run configuration: the one table of fields (config_table.cpp: path, rule,
// storage, description) drives parsing, overrides, validation and emission here, so the
// four can never disagree on a key.
#include "worker_config.h"

#include "config_field.h"
#include "modes.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <tuple>

namespace edit {
using namespace config;

namespace {

std::string jsonString(const std::string& v) {
  std::string o = "\"";
  for (char ch : v) {
    switch (ch) {
      case '"': o += "\\\""; break;
      case '\\': o += "\\\\"; break;
      case '\n': o += "\\n"; break;
      default:
        if (static_cast<unsigned char>(ch) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", ch);
          o += buf;
        } else {
          o += ch;
        }
    }
  }
  return o + "\"";
}

// One leaf as an OpenAPI v3 (structural, as in a CRD) property.
std::string leafSchema(const Field& f) {
  std::vector<std::string> kv;
  auto add = [&](const std::string& k, const std::string& v) { kv.push_back(jsonString(k) + ": " + v); };
  const Rule& r = f.rule;
  switch (f.kind) {
    case Kind::Bool: add("type", "\"boolean\""); break;
    case Kind::U64:
      add("type", "\"integer\"");
      add("format", "\"int64\"");
      add("minimum", "0");
      break;
    case Kind::I32:
    case Kind::I64: {
      const bool i32 = f.kind == Kind::I32;
      add("type", "\"integer\"");
      add("format", i32 ? "\"int32\"" : "\"int64\"");
      if (r.ilo != std::numeric_limits<int64_t>::min()) add("minimum", std::to_string(r.ilo));
      if (r.ihi != kI64Max) add("maximum", std::to_string(r.ihi));
      break;
    }
    case Kind::F64:
      add("type", "\"number\"");
      if (std::isfinite(r.dlo)) {
        add("minimum", fmtDouble(r.dlo));
        if (r.loOpen) add("exclusiveMinimum", "true");
      }
      if (std::isfinite(r.dhi)) {
        add("maximum", fmtDouble(r.dhi));
        if (r.hiOpen) add("exclusiveMaximum", "true");
      }
      break;
    case Kind::Enum:
    case Kind::Str:
      add("type", "\"string\"");
      if (!r.choices.empty()) {
        std::string e = "[";
        for (size_t i = 0; i < r.choices.size(); ++i) e += (i ? ", " : "") + jsonString(r.choices[i]);
        add("enum", e + "]");
      } else {
        if (r.nonEmpty) add("minLength", "1");
        add("maxLength", std::to_string(r.maxLen));
      }
      break;
  }
  if (!presetFilled(f.path)) {
    const std::string v = f.text();
    add("default", f.kind == Kind::Str || f.kind == Kind::Enum ? jsonString(v) : v);
  }
  add("description", jsonString(f.doc));
  std::string o = "{";
  for (size_t i = 0; i < kv.size(); ++i) o += (i ? ", " : "") + kv[i];
  return o + "}";
}

// Field paths and the section paths above them ("algorithm", "algorithm.penalty").
struct Schema {
  std::set<std::string> leaves, sections;
  std::map<std::string, std::vector<std::string>> children;  // section -> its keys
  Schema() {
    Config c;
    for (auto& f : fieldsOf(c)) {
      leaves.insert(f.path);
      std::string parent;
      for (const auto& name : splitPath(f.path)) {
        auto& kids = children[parent];
        if (std::find(kids.begin(), kids.end(), name) == kids.end()) kids.push_back(name);
        if (!parent.empty()) sections.insert(parent);
        parent = parent.empty() ? name : parent + "." + name;
      }
    }
  }
};

const Schema& schema() {
  static const Schema s;
  return s;
}

std::string nodeKind(const YAML::Node& n) {
  if (n.IsMap()) return "a map";
  if (n.IsSequence()) return "a list";
  if (n.IsNull()) return "null";
  return "\"" + n.Scalar() + "\"";
}

// Keys a release removed, and what to do instead: a config written for an older release
// gets this, not a bare "unknown key".
const std::map<std::string, std::string>& removedKeys() {
  static const std::map<std::string, std::string> m{
      {"runtime.recoverySnapshotDir",
       "removed: in-place recovery keeps no copy of the outer state any more (the survivors roll forward "
       "from their sync-group peers, docs/replica-recovery.md); delete the key"},
  };
  return m;
}

[[noreturn]] void unknownKey(const std::string& parent, const std::string& path) {
  if (auto it = removedKeys().find(path); it != removedKeys().end()) throw ConfigError(path + ": " + it->second);
  const auto& kids = schema().children.at(parent);
  throw ConfigError(path + ": unknown key (allowed " + (parent.empty() ? "top-level keys" : "under " + parent) +
                    ": " + join(kids) + ")");
}

// Walks a YAML map into (path -> scalar node) pairs, rejecting unknown and duplicate keys.
void flatten(const YAML::Node& node, const std::string& prefix,
             std::map<std::string, YAML::Node>& out) {
  std::set<std::string> seen;
  for (const auto& kv : node) {
    const YAML::Node k = kv.first, v = kv.second;
    if (!k.IsScalar())
      throw ConfigError((prefix.empty() ? std::string("top level") : prefix) + ": keys must be strings");
    std::string key = k.Scalar();
    std::string path = prefix.empty() ? key : prefix + "." + key;
    if (!seen.insert(key).second) throw ConfigError(path + ": duplicate key");
    if (schema().sections.count(path)) {
      if (v.IsNull()) continue;  // "debug:" with nothing under it
      if (!v.IsMap())
        throw ConfigError(path + ": must be a map of " + join(schema().children.at(path)) +
                          " (got " + nodeKind(v) + ")");
      flatten(v, path, out);
    } else if (schema().leaves.count(path)) {
      out[path] = v;
    } else {
      unknownKey(prefix, path);
    }
  }
}

void setFromNode(const Field& f, const YAML::Node& v) {
  if (v.IsMap() || v.IsSequence()) f.fail(nodeKind(v));
  if (v.IsNull()) {
    if (f.kind != Kind::Str) f.fail("null");
    f.set("");
    return;
  }
  f.set(v.Scalar());
}

void applyFields(Config& cfg, const std::map<std::string, YAML::Node>& values) {
  for (auto& f : fieldsOf(cfg)) {
    auto it = values.find(f.path);
    if (it == values.end()) continue;
    setFromNode(f, it->second);
    if (f.path == "model.preset") applyModelPreset(cfg.model, cfg.model.preset);
  }
}

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\r\n"), e = s.find_last_not_of(" \t\r\n");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

// Sets one leaf from raw text (environment variables: no YAML interpretation).
void setRaw(Config& cfg, const std::string& path, const std::string& raw) {
  for (auto& f : fieldsOf(cfg)) {
    if (f.path != path) continue;
    f.set(raw);
    if (f.path == "model.preset") applyModelPreset(cfg.model, cfg.model.preset);
    return;
  }
}

}  // namespace

double resolvedInitStd(const ModelConfig& m) {
  if (m.initStd > 0) return m.initStd;
  for (const auto& p : modelPresets())
    if (m.preset == p.name) return p.initStd;
  return std::max(0.02, 1.0 / std::sqrt(2.0 * static_cast<double>(m.dim)));
}

void applyModelPreset(ModelConfig& m, const std::string& preset) {
  if (preset == "custom") {
    m.preset = preset;
    return;
  }
  for (const auto& p : modelPresets()) {
    if (preset != p.name) continue;
    m.preset = preset;
    m.dim = p.dim;
    m.layers = p.layers;
    m.heads = p.heads;
    m.ffnDim = p.ffnDim;
    return;  // vocabSize belongs to the tokenizer, not the preset
  }
  throw ConfigError("model.preset: must be one of " + join(presetNames()) + " (got \"" + preset + "\")");
}

Config parseConfig(const std::string& yamlText, bool check) {
  YAML::Node root;
  try {
    root = YAML::Load(yamlText);
  } catch (const YAML::Exception& e) {
    throw ConfigError("YAML syntax error at line " + std::to_string(e.mark.line + 1) + ", column " +
                      std::to_string(e.mark.column + 1) + ": " + e.msg);
  }
  Config cfg;
  if (root.IsNull()) {
    if (check) validate(cfg);
    return cfg;
  }
  if (!root.IsMap())
    throw ConfigError("configuration: must be a map of " + join(schema().children.at("")) +
                      " (got " + nodeKind(root) + ")");
  std::map<std::string, YAML::Node> values;
  flatten(root, "", values);
  applyFields(cfg, values);
  if (check) validate(cfg);
  return cfg;
}

Config loadConfigFile(const std::string& path, bool check) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError(path + ": cannot open the configuration file");
  std::ostringstream ss;
  ss << in.rdbuf();
  try {
    return parseConfig(ss.str(), check);
  } catch (const ConfigError& e) {
    throw ConfigError(path + ": " + e.what());
  }
}

void applyOverrides(Config& cfg, const std::vector<std::string>& assignments, bool check) {
  for (const auto& a : assignments) {
    size_t eq = a.find('=');
    if (eq == std::string::npos)
      throw ConfigError("override \"" + a.substr(0, 128) + "\": expected key.path=value");
    std::string path = trim(a.substr(0, eq));
    std::string value = a.substr(eq + 1);
    if (schema().sections.count(path))
      throw ConfigError(path + ": is a section; set one of its keys: " + join(schema().children.at(path)));
    if (!schema().leaves.count(path)) {
      // Name the deepest known section so the message lists its keys.
      std::string parent = path;
      for (;;) {
        size_t dot = parent.rfind('.');
        parent = dot == std::string::npos ? "" : parent.substr(0, dot);
        if (parent.empty() || schema().sections.count(parent)) break;
      }
      unknownKey(parent, path);
    }
    YAML::Node v;
    try {
      v = YAML::Load(value);
    } catch (const YAML::Exception& e) {
      throw ConfigError(path + ": value is not a YAML scalar: " + e.msg);
    }
    std::map<std::string, YAML::Node> values{{path, v}};
    applyFields(cfg, values);
  }
  if (check) validate(cfg);
}

void applyEnvironment(Config& cfg, bool check) {
  static const std::pair<const char*, const char*> kVars[] = {
      {"EDIT_TELEMETRY_ADDR", "telemetry.addr"},
      {"EDIT_TELEMETRY_TOKEN", "telemetry.token"},
      {"EDIT_TELEMETRY_CA_FILE", "telemetry.tlsCaFile"},
      {"EDIT_TELEMETRY_SERVER_NAME", "telemetry.tlsServerName"},
      {"EDIT_TELEMETRY_HEARTBEAT_SECONDS", "telemetry.heartbeatSeconds"},
      {"EDIT_CHECKPOINT_DIR", "checkpoint.dir"},
      {"EDIT_METRICS_PORT", "metrics.port"},
      {"EDIT_METRICS_HOST", "metrics.host"}};
  for (const auto& [var, path] : kVars) {
    const char* v = std::getenv(var);
    if (!v) continue;
    try {
      setRaw(cfg, path, path == std::string("metrics.port") ? trim(v) : std::string(v));
    } catch (const ConfigError& e) {
      throw ConfigError(std::string(var) + ": " + e.what());
    }
  }
  // EDIT_SET last: an explicit assignment wins over the single-purpose variables.
  if (const char* set = std::getenv("EDIT_SET")) {
    std::vector<std::string> parts;
    std::istringstream in(set);
    for (std::string part; std::getline(in, part, ';');)
      if (!trim(part).empty()) parts.push_back(trim(part));
    try {
      applyOverrides(cfg, parts, false);
    } catch (const ConfigError& e) {
      throw ConfigError(std::string("EDIT_SET: ") + e.what());
    }
  }
  if (check) validate(cfg);
}

void validate(const Config& cfg) {
  Config copy = cfg;
  for (auto& f : fieldsOf(copy)) f.check();  // every key's own range, presets included

  const auto& m = cfg.model;
  if (m.initStd <= 0 && m.initStd != -1)
    throw ConfigError("model.initStd: must be -1 (the preset's) or a number in (0, 1] (got " + fmtDouble(m.initStd) +
                      ")");
  if (m.dim % m.heads != 0)
    throw ConfigError("model.heads: must divide model.dim (dim " + std::to_string(m.dim) + ", heads " +
                      std::to_string(m.heads) + ")");
  if ((m.dim / m.heads) % 2 != 0)
    throw ConfigError("model.heads: model.dim / model.heads must be even for rotary embeddings (got " +
                      std::to_string(m.dim / m.heads) + ")");
  // 12 d^2 per block plus embeddings and head: refuse what no machine could hold.
  double params = 12.0 * double(m.dim) * double(m.dim) * double(m.layers) +
                  2.0 * double(m.vocabSize) * double(m.dim);
  if (params > 1e12)
    throw ConfigError("model: about " + fmtDouble(params) + " parameters; at most 1e12 are supported");

  const auto& t = cfg.training;
  if (t.minLr > t.lr)
    throw ConfigError("training.minLr: must be <= training.lr (" + fmtDouble(t.lr) + ")");

  const auto& a = cfg.algorithm;
  if (a.syncInterval < 1) throw ConfigError("algorithm.syncInterval: must be an integer >= 1");
  if (modeTraits(a.mode).clock == SyncClock::Seconds && !(a.syncSeconds > 0))
    throw ConfigError("algorithm.syncSeconds: must be > 0 when algorithm.mode is a-edit (got " +
                      fmtDouble(a.syncSeconds) + ")");
  if (a.outer.momentum < 0 && a.outer.momentum != -1)
    throw ConfigError("algorithm.outer.momentum: must be -1 (the mode's default) or a number in [0, 1) (got " +
                      fmtDouble(a.outer.momentum) + "); -1 gives edit and a-edit 0.5, diloco 0.9");
  if (a.maxStepsPerSync != 0 && a.maxStepsPerSync < a.minStepsPerSync)
    throw ConfigError("algorithm.maxStepsPerSync: must be 0 or >= algorithm.minStepsPerSync (" +
                      std::to_string(a.minStepsPerSync) + ")");

  const auto& addr = cfg.telemetry.addr;
  if (!addr.empty()) {
    size_t colon = addr.rfind(':');
    std::string port = colon == std::string::npos ? "" : addr.substr(colon + 1);
    char* end = nullptr;
    long p = port.empty() ? 0 : std::strtol(port.c_str(), &end, 10);
    if (colon == 0 || port.empty() || *end || p < 1 || p > 65535)
      throw ConfigError("telemetry.addr: must be host:port (got \"" + addr.substr(0, 64) + "\")");
  }
  if (!cfg.telemetry.tlsServerName.empty() && cfg.telemetry.tlsCaFile.empty())
    throw ConfigError("telemetry.tlsServerName: needs telemetry.tlsCaFile (TLS is on only with a CA bundle)");
}

std::string toYaml(const Config& cfg) {
  Config copy = cfg;
  copy.telemetry.token.clear();  // a secret never leaves the process in a dump
  YAML::Emitter out;
  out << YAML::BeginMap;
  std::vector<std::string> open;  // currently open section path segments
  for (auto& f : fieldsOf(copy)) {
    std::vector<std::string> segs = splitPath(f.path);
    const std::string leaf = segs.back();
    segs.pop_back();
    size_t common = 0;
    while (common < open.size() && common < segs.size() && open[common] == segs[common]) ++common;
    while (open.size() > common) {
      out << YAML::EndMap;
      open.pop_back();
    }
    for (size_t i = common; i < segs.size(); ++i) {
      out << YAML::Key << segs[i] << YAML::Value << YAML::BeginMap;
      open.push_back(segs[i]);
    }
    out << YAML::Key << leaf << YAML::Value;
    if (f.kind == Kind::Str || f.kind == Kind::Enum) out << YAML::DoubleQuoted << f.text();
    else out << f.text();
  }
  while (!open.empty()) {
    out << YAML::EndMap;
    open.pop_back();
  }
  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

std::string workerConfigSchemaJson() {
  Config defaults;
  const auto fields = fieldsOf(defaults);
  // Sections nest: emit depth-first in the field table's order.
  std::function<std::string(const std::string&, int)> section = [&](const std::string& path, int indent) {
    const std::string pad(indent, ' ');
    std::string o = "{\"type\": \"object\"";
    for (const auto& sd : sectionDocs()) {
      if (path != sd.path) continue;
      o += ", \"description\": " + jsonString(sd.doc);
      if (!sd.rules.empty()) {
        o += ", \"x-kubernetes-validations\": [";
        for (size_t i = 0; i < sd.rules.size(); ++i)
          o += std::string(i ? ", " : "") + "{\"rule\": " + jsonString(sd.rules[i].first) +
               ", \"message\": " + jsonString(sd.rules[i].second) + "}";
        o += "]";
      }
    }
    o += ", \"properties\": {";
    bool first = true;
    for (const auto& name : schema().children.at(path)) {
      const std::string child = path.empty() ? name : path + "." + name;
      o += std::string(first ? "" : ",") + "\n" + pad + "  " + jsonString(name) + ": ";
      first = false;
      if (schema().sections.count(child)) {
        o += section(child, indent + 2);
      } else {
        for (const auto& f : fields)
          if (f.path == child) o += leafSchema(f);
      }
    }
    return o + "\n" + pad + "}}";
  };
  return section("", 0) + "\n";
}

std::vector<std::string> undocumentedConfigKeys() {
  Config c;
  std::vector<std::string> out;
  for (const auto& f : fieldsOf(c))
    if (!f.doc || !*f.doc) out.push_back(f.path);
  for (const auto& s : schema().sections) {
    bool found = false;
    for (const auto& sd : sectionDocs()) found |= s == sd.path;
    if (!found) out.push_back(s);
  }
  return out;
}

}  // namespace edit
