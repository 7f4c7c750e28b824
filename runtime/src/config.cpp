// YAML run configuration: one table of fields (path, rule, storage) drives parsing,
// overrides, validation and emission, so the four can never disagree on a key.
#include "config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <tuple>

namespace edit {
namespace {

constexpr int64_t kI64Max = std::numeric_limits<int64_t>::max();
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr size_t kMaxPath = 4096;  // file paths, addresses, tokens
constexpr size_t kMaxHost = 253;   // DNS name limit

const std::vector<std::string> kPresets = {"tiny",     "small",    "llama-350m", "llama-1b",
                                           "llama-3b", "llama-7b", "custom"};
const std::vector<std::string> kModes = {"edit", "a-edit", "diloco", "localsgd", "ddp"};
const std::vector<std::string> kBackends = {"auto", "gloo", "nccl"};
const std::vector<std::string> kRecoveryModes = {"inPlace", "exit"};
const std::vector<std::string> kWeightings = {"raw", "median"};
const std::vector<std::string> kCompressions = {"none", "int8"};
const std::vector<std::string> kCorruptKinds = {"noise", "pseudoGradient"};

enum class Kind { I64, I32, U64, F64, Bool, Str };

// What a value must be. Numbers: [lo, hi] with optional open ends; strings: a length cap,
// optionally non-empty or one of `choices`.
struct Rule {
  int64_t ilo = std::numeric_limits<int64_t>::min(), ihi = kI64Max;
  double dlo = -kInf, dhi = kInf;
  bool loOpen = false, hiOpen = false;
  size_t maxLen = kMaxPath;
  bool nonEmpty = false;
  bool secret = false;  // never echo the value in an error
  std::vector<std::string> choices;
  std::string text;     // the allowed values in words, when the range alone says it wrong
};

Rule ints(int64_t lo, int64_t hi = kI64Max) { return Rule{lo, hi}; }
Rule nums(double lo, double hi, bool loOpen, bool hiOpen) {
  return Rule{std::numeric_limits<int64_t>::min(), kI64Max, lo, hi, loOpen, hiOpen};
}
Rule positive() { return nums(0, kInf, true, false); }
Rule nonNegative() { return nums(0, kInf, false, false); }
Rule str(size_t maxLen, bool nonEmpty = false, bool secret = false) {
  Rule r;
  std::tie(r.maxLen, r.nonEmpty, r.secret) = std::make_tuple(maxLen, nonEmpty, secret);
  return r;
}
Rule oneOf(const std::vector<std::string>& c) {
  Rule r;
  r.choices = c;
  return r;
}
Rule none() { return Rule{}; }

// "a.b.c" -> {"a", "b", "c"}
std::vector<std::string> splitPath(const std::string& path) {
  std::vector<std::string> segs;
  size_t start = 0, dot;
  while ((dot = path.find('.', start)) != std::string::npos) {
    segs.push_back(path.substr(start, dot - start));
    start = dot + 1;
  }
  segs.push_back(path.substr(start));
  return segs;
}

std::string join(const std::vector<std::string>& v, const char* sep = ", ") {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) out += (i ? sep : "") + v[i];
  return out;
}

std::string fmtDouble(double v) {
  // Shortest text that reads back as the same double (round-trip through toYaml).
  char buf[64];
  for (int prec = 6; prec <= 17; ++prec) {
    std::snprintf(buf, sizeof buf, "%.*g", prec, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  std::string s = buf;
  // Keep a float looking like a float to YAML readers ("1" would read back as an int).
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
  return s;
}

struct Field {
  std::string path;
  Kind kind;
  void* ptr;
  Rule rule;

  std::string describe() const {
    if (!rule.text.empty()) return rule.text;
    auto bound = [](double v) {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%g", v);
      return std::string(buf);
    };
    switch (kind) {
      case Kind::Bool: return "true or false";
      case Kind::U64: return "a non-negative integer";
      case Kind::I64:
      case Kind::I32:
        if (rule.ihi == kI64Max) return "an integer >= " + std::to_string(rule.ilo);
        return "an integer in [" + std::to_string(rule.ilo) + ", " + std::to_string(rule.ihi) + "]";
      case Kind::F64: {
        bool hasLo = std::isfinite(rule.dlo), hasHi = std::isfinite(rule.dhi);
        if (hasLo && !hasHi) return std::string("a number ") + (rule.loOpen ? "> " : ">= ") + bound(rule.dlo);
        if (!hasLo && hasHi) return std::string("a number ") + (rule.hiOpen ? "< " : "<= ") + bound(rule.dhi);
        if (!hasLo && !hasHi) return "a finite number";
        return std::string("a number in ") + (rule.loOpen ? "(" : "[") + bound(rule.dlo) + ", " +
               bound(rule.dhi) + (rule.hiOpen ? ")" : "]");
      }
      case Kind::Str:
        if (!rule.choices.empty()) return "one of " + join(rule.choices);
        return std::string(rule.nonEmpty ? "a non-empty" : "a") + " string of at most " +
               std::to_string(rule.maxLen) + " characters";
    }
    return "";
  }

  [[noreturn]] void fail(const std::string& got) const {
    throw ConfigError(path + ": must be " + describe() + " (got " + got + ")");
  }
  std::string quoted(const std::string& raw) const {
    if (rule.secret) return "<hidden>";
    std::string shown = raw.size() > 64 ? raw.substr(0, 64) + "...(" + std::to_string(raw.size()) + " characters)" : raw;
    return "\"" + shown + "\"";
  }

  // Parses scalar text into the field, checking type and range.
  void set(const std::string& raw) const {
    switch (kind) {
      case Kind::Bool: {
        std::string t;
        for (char c : raw) t += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
        if (t == "true" || t == "yes" || t == "on") *static_cast<bool*>(ptr) = true;
        else if (t == "false" || t == "no" || t == "off") *static_cast<bool*>(ptr) = false;
        else fail(quoted(raw));
        return;
      }
      case Kind::U64: {
        errno = 0;
        char* end = nullptr;
        unsigned long long v = std::strtoull(raw.c_str(), &end, 10);
        if (raw.empty() || raw[0] == '-' || raw[0] == ' ' || *end || errno) fail(quoted(raw));
        *static_cast<uint64_t*>(ptr) = v;
        return;
      }
      case Kind::I64:
      case Kind::I32: {
        errno = 0;
        char* end = nullptr;
        long long v = std::strtoll(raw.c_str(), &end, 10);
        if (raw.empty() || *end || errno) {
          // Accept integral floats such as 1e6, nothing fractional.
          errno = 0;
          double d = std::strtod(raw.c_str(), &end);
          if (raw.empty() || *end || errno || !std::isfinite(d) || d != std::floor(d) ||
              std::fabs(d) > 9.0e18)
            fail(quoted(raw));
          v = static_cast<long long>(d);
        }
        if (v < rule.ilo || v > rule.ihi) fail(quoted(raw));
        if (kind == Kind::I32) *static_cast<int*>(ptr) = static_cast<int>(v);
        else *static_cast<int64_t*>(ptr) = v;
        return;
      }
      case Kind::F64: {
        errno = 0;
        char* end = nullptr;
        double d = std::strtod(raw.c_str(), &end);
        if (raw.empty() || *end || errno == ERANGE || !std::isfinite(d) || !inRange(d)) fail(quoted(raw));
        *static_cast<double*>(ptr) = d;
        return;
      }
      case Kind::Str: {
        if (raw.size() > rule.maxLen) fail(rule.secret ? "<hidden>" : std::to_string(raw.size()) + " characters");
        if (rule.nonEmpty && raw.empty()) fail("an empty string");
        if (!rule.choices.empty() && std::find(rule.choices.begin(), rule.choices.end(), raw) == rule.choices.end())
          fail(quoted(raw));
        *static_cast<std::string*>(ptr) = raw;
        return;
      }
    }
  }

  bool inRange(double d) const {
    return (rule.loOpen ? d > rule.dlo : d >= rule.dlo) && (rule.hiOpen ? d < rule.dhi : d <= rule.dhi);
  }

  // Current value as scalar text (what set() accepts).
  std::string text() const {
    switch (kind) {
      case Kind::Bool: return *static_cast<bool*>(ptr) ? "true" : "false";
      case Kind::U64: return std::to_string(*static_cast<uint64_t*>(ptr));
      case Kind::I64: return std::to_string(*static_cast<int64_t*>(ptr));
      case Kind::I32: return std::to_string(*static_cast<int*>(ptr));
      case Kind::F64: return fmtDouble(*static_cast<double*>(ptr));
      case Kind::Str: return *static_cast<std::string*>(ptr);
    }
    return "";
  }

  // Re-checks a value set in code (validate() on a Config built without the parser):
  // text() is exact, so parsing it back applies the same rule to the same value.
  void check() const { set(text()); }
};

// Every key of the file, in the order they are applied and emitted. The preset comes
// before the model sizes so that explicit sizes next to it override it.
std::vector<Field> fieldsOf(Config& c) {
  std::vector<Field> f;
  auto I = [&](const char* p, int64_t& v, Rule r) { f.push_back({p, Kind::I64, &v, r}); };
  auto N = [&](const char* p, int& v, Rule r) { f.push_back({p, Kind::I32, &v, r}); };
  auto U = [&](const char* p, uint64_t& v) { f.push_back({p, Kind::U64, &v, none()}); };
  auto D = [&](const char* p, double& v, Rule r) { f.push_back({p, Kind::F64, &v, r}); };
  auto B = [&](const char* p, bool& v) { f.push_back({p, Kind::Bool, &v, none()}); };
  auto S = [&](const char* p, std::string& v, Rule r) { f.push_back({p, Kind::Str, &v, r}); };
  auto& m = c.model;
  S("model.preset", m.preset, oneOf(kPresets));
  I("model.vocabSize", m.vocabSize, ints(2, 1 << 24));
  I("model.dim", m.dim, ints(1, 65536));
  I("model.layers", m.layers, ints(1, 1024));
  I("model.heads", m.heads, ints(1, 1024));
  I("model.ffnDim", m.ffnDim, ints(1, 1 << 20));
  D("model.ropeTheta", m.ropeTheta, positive());
  D("model.normEps", m.normEps, nums(0, 1, true, true));
  D("model.initStd", m.initStd, nums(0, 1, true, false));
  auto& d = c.data;
  S("data.train", d.train, str(kMaxPath, true));
  S("data.val", d.val, str(kMaxPath));
  I("data.seqLen", d.seqLen, ints(1, 1 << 20));
  I("data.batchSize", d.batchSize, ints(1, 1 << 20));
  I("data.valBatches", d.valBatches, ints(0, 1 << 20));
  I("data.valEvery", d.valEvery, ints(0));
  auto& t = c.training;
  I("training.steps", t.steps, ints(1, int64_t(1) << 40));
  I("training.tokens", t.tokens, ints(0));
  U("training.seed", t.seed);
  D("training.lr", t.lr, nums(0, 100, true, false));
  D("training.minLr", t.minLr, nums(0, 100, false, false));
  I("training.lrWarmupSteps", t.lrWarmupSteps, ints(0));
  D("training.weightDecay", t.weightDecay, nums(0, 100, false, false));
  D("training.beta1", t.beta1, nums(0, 1, false, true));
  D("training.beta2", t.beta2, nums(0, 1, false, true));
  D("training.eps", t.eps, nums(0, 1, true, false));
  D("training.gradClip", t.gradClip, nonNegative());
  I("training.logEvery", t.logEvery, ints(1));
  auto& a = c.algorithm;
  S("algorithm.mode", a.mode, oneOf(kModes));
  I("algorithm.syncInterval", a.syncInterval, ints(1, 1 << 30));
  D("algorithm.syncSeconds", a.syncSeconds, nums(0, 86400, false, false));
  I("algorithm.minStepsPerSync", a.minStepsPerSync, ints(0, 1 << 30));
  I("algorithm.maxStepsPerSync", a.maxStepsPerSync, ints(0, 1 << 30));
  I("algorithm.warmupSteps", a.warmupSteps, ints(0));
  D("algorithm.outer.lr", a.outer.lr, nums(0, 100, true, false));
  Rule momentum = nums(-1, 1, false, true);  // and not in (-1, 0): validate()
  momentum.text = "-1 (the mode's default) or a number in [0, 1)";
  D("algorithm.outer.momentum", a.outer.momentum, momentum);
  B("algorithm.outer.nesterov", a.outer.nesterov);
  auto& p = a.penalty;
  B("algorithm.penalty.anomaly", p.anomaly);
  D("algorithm.penalty.emaAlpha", p.emaAlpha, nums(0, 1, true, true));
  D("algorithm.penalty.zThreshold", p.zThreshold, positive());
  I("algorithm.penalty.anomalyWarmup", p.anomalyWarmup, ints(0));
  B("algorithm.penalty.weighted", p.weighted);
  D("algorithm.penalty.temperature", p.temperature, positive());
  S("algorithm.penalty.weighting", p.weighting, oneOf(kWeightings));
  B("algorithm.penalty.clip", p.clip);
  D("algorithm.penalty.clipNorm", p.clipNorm, positive());
  D("algorithm.penalty.stepShare", p.stepShare, nums(0, 1, false, false));
  I("algorithm.penalty.maxSkippedRounds", p.maxSkippedRounds, ints(0));
  B("algorithm.prefetch", a.prefetch);
  B("algorithm.offloadOuterState", a.offloadOuterState);
  S("algorithm.syncCompression", a.syncCompression, oneOf(kCompressions));
  I("algorithm.compressionBlock", a.compressionBlock, ints(16, 1 << 20));
  auto& k = c.checkpoint;
  S("checkpoint.dir", k.dir, str(kMaxPath));
  I("checkpoint.everySteps", k.everySteps, ints(0));
  I("checkpoint.keep", k.keep, ints(1, 1000));
  B("checkpoint.resume", k.resume);
  S("metrics.host", c.metrics.host, str(kMaxHost, true));
  N("metrics.port", c.metrics.port, ints(-1, 65535));
  S("telemetry.addr", c.telemetry.addr, str(kMaxHost + 6));
  S("telemetry.token", c.telemetry.token, str(kMaxPath, false, true));
  I("telemetry.everySteps", c.telemetry.everySteps, ints(1));
  D("telemetry.heartbeatSeconds", c.telemetry.heartbeatSeconds, nums(0, 3600, false, false));
  S("telemetry.tlsCaFile", c.telemetry.tlsCaFile, str(kMaxPath));
  S("telemetry.tlsServerName", c.telemetry.tlsServerName, str(kMaxHost));
  auto& sd = c.debug.injectStepDelay;
  N("debug.injectStepDelay.rank", sd.rank, ints(-1, 1 << 20));
  D("debug.injectStepDelay.seconds", sd.seconds, nums(0, 3600, false, false));
  B("debug.injectStepDelay.random", sd.random);
  auto& cr = c.debug.corruptReplica;
  N("debug.corruptReplica.replica", cr.replica, ints(-1, 1 << 20));
  I("debug.corruptReplica.atSync", cr.atSync, ints(1));
  S("debug.corruptReplica.kind", cr.kind, oneOf(kCorruptKinds));
  D("debug.corruptReplica.scale", cr.scale, nums(0, 1e6, false, false));
  B("debug.corruptReplica.nan", cr.nan);
  I("debug.corruptReplica.rounds", cr.rounds, ints(1, 1 << 30));
  I("debug.corruptReplica.every", cr.every, ints(1, 1 << 30));
  N("debug.killAtStep.rank", c.debug.killAtStep.rank, ints(-1, 1 << 20));
  I("debug.killAtStep.step", c.debug.killAtStep.step, ints(0));
  N("runtime.threads", c.runtime.threads, ints(0, 4096));
  D("runtime.collectiveTimeoutSeconds", c.runtime.collectiveTimeoutSeconds,
    nums(0, 7 * 86400, true, false));
  S("runtime.backend", c.runtime.backend, oneOf(kBackends));
  S("runtime.recovery", c.runtime.recovery, oneOf(kRecoveryModes));
  D("runtime.rendezvousTimeoutSeconds", c.runtime.rendezvousTimeoutSeconds,
    nums(1, 7 * 86400, true, false));
  B("runtime.reshardAfterForward", c.runtime.reshardAfterForward);
  I("runtime.allocatorCacheMB", c.runtime.allocatorCacheMB, ints(0, 1 << 20));
  I("runtime.bucketMB", c.runtime.bucketMB, ints(0, 1 << 16));
  return f;
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

[[noreturn]] void unknownKey(const std::string& parent, const std::string& path) {
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

void applyModelPreset(ModelConfig& m, const std::string& preset) {
  struct Sizes { const char* name; int64_t dim, layers, heads, ffn; };
  static const Sizes kSizes[] = {
      {"tiny", 128, 4, 4, 352},          {"small", 256, 6, 8, 704},
      {"llama-350m", 1024, 24, 16, 2752}, {"llama-1b", 2048, 24, 16, 5504},
      {"llama-3b", 3200, 26, 32, 8640},   {"llama-7b", 4096, 32, 32, 11008}};
  if (preset == "custom") {
    m.preset = preset;
    return;
  }
  for (const auto& s : kSizes) {
    if (preset != s.name) continue;
    m.preset = preset;
    m.dim = s.dim;
    m.layers = s.layers;
    m.heads = s.heads;
    m.ffnDim = s.ffn;
    return;  // vocabSize belongs to the tokenizer, not the preset
  }
  throw ConfigError("model.preset: must be one of " + join(kPresets) + " (got \"" + preset + "\")");
}

Config parseConfig(const std::string& yamlText) {
  YAML::Node root;
  try {
    root = YAML::Load(yamlText);
  } catch (const YAML::Exception& e) {
    throw ConfigError("YAML syntax error at line " + std::to_string(e.mark.line + 1) + ", column " +
                      std::to_string(e.mark.column + 1) + ": " + e.msg);
  }
  Config cfg;
  if (root.IsNull()) {
    validate(cfg);
    return cfg;
  }
  if (!root.IsMap())
    throw ConfigError("configuration: must be a map of " + join(schema().children.at("")) +
                      " (got " + nodeKind(root) + ")");
  std::map<std::string, YAML::Node> values;
  flatten(root, "", values);
  applyFields(cfg, values);
  validate(cfg);
  return cfg;
}

Config loadConfigFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError(path + ": cannot open the configuration file");
  std::ostringstream ss;
  ss << in.rdbuf();
  try {
    return parseConfig(ss.str());
  } catch (const ConfigError& e) {
    throw ConfigError(path + ": " + e.what());
  }
}

void applyOverrides(Config& cfg, const std::vector<std::string>& assignments) {
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
  validate(cfg);
}

void applyEnvironment(Config& cfg) {
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
      applyOverrides(cfg, parts);
    } catch (const ConfigError& e) {
      throw ConfigError(std::string("EDIT_SET: ") + e.what());
    }
  }
  validate(cfg);
}

void validate(const Config& cfg) {
  Config copy = cfg;
  for (auto& f : fieldsOf(copy)) f.check();  // every key's own range, presets included

  const auto& m = cfg.model;
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
  if (a.mode == "a-edit" && !(a.syncSeconds > 0))
    throw ConfigError("algorithm.syncSeconds: must be > 0 when algorithm.mode is a-edit (got " +
                      fmtDouble(a.syncSeconds) + ")");
  if (a.outer.momentum < 0 && a.outer.momentum != -1)
    throw ConfigError("algorithm.outer.momentum: must be -1 (the mode's default) or a number in [0, 1) (got " +
                      fmtDouble(a.outer.momentum) + "); -1 gives edit and a-edit 0.8, diloco 0.9");
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
    if (f.kind == Kind::Str) out << YAML::DoubleQuoted << f.text();
    else out << f.text();
  }
  while (!open.empty()) {
    out << YAML::EndMap;
    open.pop_back();
  }
  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

}  // namespace edit
