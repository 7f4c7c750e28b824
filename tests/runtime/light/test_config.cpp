// Configuration: defaults, per-key errors, ranges, presets, overrides, environment,
// YAML round trip and the bad-input corpus.
#include <gtest/gtest.h>

#include <cstdlib>
#include <dirent.h>
#include <fstream>
#include <sstream>
#include <string>

#include <yaml-cpp/yaml.h>

#include <functional>
#include <vector>

#include "modes.h"
#include "worker_config.h"

// The repository root: from CMake, else derived from this file's path.
#ifndef EDIT_SOURCE_DIR
#define EDIT_SOURCE_DIR (std::string(__FILE__).substr(0, std::string(__FILE__).rfind("/tests/runtime/light/")))
#endif

using edit::Config;
using edit::ConfigError;

namespace {

// The ConfigError message of parsing `yaml` ("" when it parsed).
std::string errorOf(const std::string& yaml) {
  try {
    edit::parseConfig(yaml);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

std::string overrideErrorOf(const std::string& assignment) {
  Config c;
  try {
    edit::applyOverrides(c, {assignment});
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

// Sets an environment variable for one scope.
struct ScopedEnv {
  std::string name;
  ScopedEnv(const std::string& n, const std::string& v) : name(n) { setenv(n.c_str(), v.c_str(), 1); }
  ~ScopedEnv() { unsetenv(name.c_str()); }
};

}  // namespace

TEST(Config, DefaultsAreValid) {
  Config c;
  EXPECT_NO_THROW(edit::validate(c));
  Config parsed = edit::parseConfig("");
  EXPECT_EQ(parsed.model.dim, 128);
  EXPECT_EQ(parsed.algorithm.mode, edit::Mode::Edit);
  EXPECT_EQ(parsed.metrics.port, -1);
}

TEST(Config, ParsesEverySection) {
  Config c = edit::parseConfig(R"(
model: {preset: small, vocabSize: 512}
data: {train: a.bin, val: "", seqLen: 64, batchSize: 4}
training: {steps: 10, seed: 18446744073709551615, lr: 1e-3, minLr: 1e-4}
algorithm:
  mode: a-edit
  syncSeconds: 2.5
  outer: {lr: 0.5, momentum: 0.9, nesterov: false}
  penalty: {anomaly: false, zThreshold: 2, temperature: 0.5, weighting: median, maxSkippedRounds: 0}
checkpoint: {dir: /tmp/ck, everySteps: 5}
metrics: {host: 0.0.0.0, port: 0}
telemetry: {addr: "op:9443", token: s3cret}
debug:
  injectStepDelay: {rank: 1, seconds: 0.5}
  corruptReplica: {replica: 0, atSync: 2, nan: true, kind: pseudoGradient, rounds: 3, every: 2}
runtime: {threads: 2, backend: gloo}
)");
  EXPECT_EQ(c.algorithm.penalty.weighting, edit::Weighting::Median);
  EXPECT_EQ(c.algorithm.penalty.maxSkippedRounds, 0);
  EXPECT_DOUBLE_EQ(c.algorithm.outer.momentum, 0.9);
  EXPECT_EQ(c.debug.corruptReplica.kind, edit::CorruptKind::PseudoGradient);
  EXPECT_EQ(c.debug.corruptReplica.rounds, 3);
  EXPECT_EQ(c.debug.corruptReplica.every, 2);
  EXPECT_EQ(c.model.dim, 256);
  EXPECT_EQ(c.model.vocabSize, 512);
  EXPECT_EQ(c.data.val, "");
  EXPECT_EQ(c.training.seed, 18446744073709551615ULL);
  EXPECT_DOUBLE_EQ(c.training.lr, 1e-3);
  EXPECT_EQ(c.algorithm.mode, edit::Mode::AEdit);
  EXPECT_FALSE(c.algorithm.outer.nesterov);
  EXPECT_FALSE(c.algorithm.penalty.anomaly);
  EXPECT_DOUBLE_EQ(c.algorithm.penalty.zThreshold, 2.0);
  EXPECT_EQ(c.metrics.port, 0);
  EXPECT_EQ(c.telemetry.token, "s3cret");
  EXPECT_EQ(c.debug.injectStepDelay.rank, 1);
  EXPECT_TRUE(c.debug.corruptReplica.nan);
  EXPECT_EQ(c.runtime.backend, edit::Backend::Gloo);
}

TEST(Config, OuterMomentumDefaultsToTheModes) {
  // -1 (the default) means each mode's published momentum; it survives a round trip.
  Config c = edit::parseConfig("");
  EXPECT_DOUBLE_EQ(c.algorithm.outer.momentum, -1);
  EXPECT_DOUBLE_EQ(edit::parseConfig(edit::toYaml(c)).algorithm.outer.momentum, -1);
  EXPECT_DOUBLE_EQ(edit::parseConfig("algorithm: {outer: {momentum: 0}}").algorithm.outer.momentum, 0);
  EXPECT_NE(errorOf("algorithm: {outer: {momentum: -0.2}}").find("must be -1 (the mode's default)"),
            std::string::npos);
  EXPECT_NE(errorOf("algorithm: {penalty: {maxSkippedRounds: -1}}").find("algorithm.penalty.maxSkippedRounds"),
            std::string::npos);
  EXPECT_NE(errorOf("debug: {corruptReplica: {kind: flip}}").find("one of noise, pseudoGradient"),
            std::string::npos);
}

TEST(Config, ErrorsNameTheFullKeyAndRange) {
  EXPECT_EQ(errorOf("algorithm: {penalty: {zThreshold: abc}}"),
            "algorithm.penalty.zThreshold: must be a number > 0 (got \"abc\")");
  EXPECT_NE(errorOf("data: {seqLen: 0}").find("data.seqLen: must be an integer in [1, 1048576]"), std::string::npos);
  EXPECT_NE(errorOf("model: {dim: -5}").find("model.dim"), std::string::npos);
  EXPECT_NE(errorOf("training: {steps: 1.5}").find("training.steps"), std::string::npos);
  EXPECT_NE(errorOf("algorithm: {mode: fast}").find("algorithm.mode: must be one of edit, a-edit, diloco, localsgd, ddp"),
            std::string::npos);
  EXPECT_NE(errorOf("algorithm: {penalty: {emaAlpha: 1}}").find("algorithm.penalty.emaAlpha: must be a number in (0, 1)"),
            std::string::npos);
  EXPECT_NE(errorOf("algorithm: {outer: {momentum: 1.0}}").find("algorithm.outer.momentum"), std::string::npos);
  EXPECT_NE(errorOf("algorithm: {outer: {lr: 0}}").find("algorithm.outer.lr"), std::string::npos);
  EXPECT_NE(errorOf("algorithm: {penalty: {temperature: -1}}").find("algorithm.penalty.temperature"), std::string::npos);
  EXPECT_NE(errorOf("algorithm: {prefetch: maybe}").find("algorithm.prefetch: must be true or false"), std::string::npos);
  EXPECT_NE(errorOf("metrics: {port: 70000}").find("metrics.port"), std::string::npos);
  EXPECT_NE(errorOf("training: {lr: .nan}").find("training.lr"), std::string::npos);
  EXPECT_NE(errorOf("training: {seed: -1}").find("training.seed"), std::string::npos);
  EXPECT_NE(errorOf("data: {seqLen: [1, 2]}").find("data.seqLen: must be an integer in [1, 1048576] (got a list)"),
            std::string::npos);
  EXPECT_NE(errorOf("model: 3").find("model: must be a map"), std::string::npos);
  EXPECT_NE(errorOf("- a\n- b").find("must be a map"), std::string::npos);
  EXPECT_NE(errorOf("model: {dim: [").find("YAML syntax error"), std::string::npos);
}

TEST(Config, UnknownAndDuplicateKeys) {
  EXPECT_NE(errorOf("modle: {}").find("modle: unknown key (allowed top-level keys: model, data"), std::string::npos);
  EXPECT_NE(errorOf("algorithm: {penalty: {zthreshold: 3}}").find("algorithm.penalty.zthreshold: unknown key"),
            std::string::npos);
  EXPECT_NE(errorOf("algorithm: {penalty: {zthreshold: 3}}").find("zThreshold"), std::string::npos);
  EXPECT_NE(errorOf("data: {seqLen: 8, seqLen: 9}").find("data.seqLen: duplicate key"), std::string::npos);
}

TEST(Config, CrossFieldRules) {
  EXPECT_NE(errorOf("algorithm: {mode: a-edit}").find("algorithm.syncSeconds"), std::string::npos);
  EXPECT_EQ(errorOf("algorithm: {mode: a-edit, syncSeconds: 1}"), "");
  EXPECT_NE(errorOf("model: {preset: custom, dim: 100, heads: 3}").find("model.heads: must divide model.dim"),
            std::string::npos);
  EXPECT_NE(errorOf("model: {preset: custom, dim: 96, heads: 32}").find("even"), std::string::npos);
  EXPECT_NE(errorOf("algorithm: {minStepsPerSync: 5, maxStepsPerSync: 3}").find("algorithm.maxStepsPerSync"),
            std::string::npos);
  EXPECT_EQ(errorOf("algorithm: {minStepsPerSync: 5, maxStepsPerSync: 0}"), "");
  EXPECT_NE(errorOf("training: {lr: 0.001, minLr: 0.01}").find("training.minLr"), std::string::npos);
  EXPECT_NE(errorOf("telemetry: {addr: nohost}").find("telemetry.addr"), std::string::npos);
  for (const char* b : {"auto", "gloo", "nccl"})
    EXPECT_EQ(errorOf(std::string("runtime: {backend: ") + b + "}"), "") << b;

  Config c;
  c.algorithm.syncInterval = 0;  // built in code, not parsed: validate() still catches it
  EXPECT_THROW(edit::validate(c), ConfigError);
}

TEST(Config, Presets) {
  struct P { const char* name; int64_t d, l, h, f; };
  for (const P& p : {P{"tiny", 128, 4, 4, 352}, P{"small", 256, 6, 8, 704}, P{"llama-350m", 1024, 24, 16, 2752},
                     P{"llama-1b", 2048, 24, 16, 5504}, P{"llama-3b", 3200, 26, 32, 8640},
                     P{"llama-7b", 4096, 32, 32, 11008}}) {
    Config c = edit::parseConfig(std::string("model: {preset: ") + p.name + ", vocabSize: 32000}");
    EXPECT_EQ(c.model.dim, p.d) << p.name;
    EXPECT_EQ(c.model.layers, p.l) << p.name;
    EXPECT_EQ(c.model.heads, p.h) << p.name;
    EXPECT_EQ(c.model.ffnDim, p.f) << p.name;
    EXPECT_EQ(c.model.vocabSize, 32000) << p.name;  // presets never touch the vocabulary
    EXPECT_NO_THROW(edit::validate(c)) << p.name;
  }
  // Explicit sizes next to a preset override it, wherever they appear in the map.
  Config c = edit::parseConfig("model: {layers: 2, preset: small}");
  EXPECT_EQ(c.model.dim, 256);
  EXPECT_EQ(c.model.layers, 2);
  Config custom = edit::parseConfig("model: {preset: custom, dim: 64, layers: 1, heads: 2, ffnDim: 100}");
  EXPECT_EQ(custom.model.dim, 64);
  EXPECT_EQ(custom.model.ffnDim, 100);
  edit::ModelConfig m;
  EXPECT_THROW(edit::applyModelPreset(m, "llama-70b"), ConfigError);
}

TEST(Config, Overrides) {
  Config c;
  edit::applyOverrides(c, {"algorithm.penalty.zThreshold=2.5", "data.seqLen=256", "model.preset=llama-1b",
                           "algorithm.mode=diloco", "data.val="});
  EXPECT_DOUBLE_EQ(c.algorithm.penalty.zThreshold, 2.5);
  EXPECT_EQ(c.data.seqLen, 256);
  EXPECT_EQ(c.model.dim, 2048);
  EXPECT_EQ(c.algorithm.mode, edit::Mode::DiLoCo);
  EXPECT_EQ(c.data.val, "");
  EXPECT_NE(overrideErrorOf("algorithm.penalty.zThreshold=abc").find(
                "algorithm.penalty.zThreshold: must be a number > 0 (got \"abc\")"),
            std::string::npos);
  EXPECT_NE(overrideErrorOf("algorithm.penalty.nope=1").find("algorithm.penalty.nope: unknown key"), std::string::npos);
  EXPECT_NE(overrideErrorOf("nope.deeper.key=1").find("nope.deeper.key: unknown key"), std::string::npos);
  EXPECT_NE(overrideErrorOf("algorithm=1").find("algorithm: is a section"), std::string::npos);
  EXPECT_NE(overrideErrorOf("data.seqLen").find("key.path=value"), std::string::npos);
  EXPECT_NE(overrideErrorOf("algorithm.mode=a-edit").find("algorithm.syncSeconds"), std::string::npos);
}

TEST(Config, Environment) {
  Config c;
  {
    ScopedEnv a("EDIT_TELEMETRY_ADDR", "edit-operator.edit-system:9443");
    ScopedEnv t("EDIT_TELEMETRY_TOKEN", "*tok: en#");
    ScopedEnv d("EDIT_CHECKPOINT_DIR", "/ckpt/job");
    ScopedEnv p("EDIT_METRICS_PORT", "9100");
    ScopedEnv s("EDIT_SET", "training.steps=7; algorithm.syncInterval=4;;checkpoint.dir=/other");
    edit::applyEnvironment(c);
  }
  EXPECT_EQ(c.telemetry.addr, "edit-operator.edit-system:9443");
  EXPECT_EQ(c.telemetry.token, "*tok: en#");  // taken verbatim, not as YAML
  EXPECT_EQ(c.metrics.port, 9100);
  EXPECT_EQ(c.training.steps, 7);
  EXPECT_EQ(c.algorithm.syncInterval, 4);
  EXPECT_EQ(c.checkpoint.dir, "/other");  // EDIT_SET wins over the single-purpose variable

  ScopedEnv bad("EDIT_METRICS_PORT", "http");
  Config d;
  try {
    edit::applyEnvironment(d);
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("EDIT_METRICS_PORT: metrics.port"), std::string::npos) << e.what();
  }
}

TEST(Config, TokenNeverInErrorsOrYaml) {
  Config c;
  c.telemetry.token = "super-secret-token";
  std::string y = edit::toYaml(c);
  EXPECT_EQ(y.find("super-secret-token"), std::string::npos);
  EXPECT_NE(y.find("token: \"\""), std::string::npos) << y;
  std::string err = errorOf("telemetry: {token: [super-secret-token]}");
  EXPECT_NE(err.find("telemetry.token"), std::string::npos);
  EXPECT_EQ(err.find("super-secret"), std::string::npos) << err;
}

TEST(Config, YamlRoundTrip) {
  Config c = edit::parseConfig(R"(
model: {preset: small, layers: 3, ropeTheta: 500000, normEps: 1e-6, initStd: 0.0123456789}
data: {train: "path with: colon #x.bin", val: "", seqLen: 77}
training: {seed: 18446744073709551615, lr: 0.1, minLr: 0.1}
algorithm: {mode: a-edit, syncSeconds: 0.3, outer: {momentum: 0.0}, penalty: {stepShare: 0.33}}
checkpoint: {dir: "yes"}
debug: {injectStepDelay: {random: true}}
runtime: {backend: nccl, collectiveTimeoutSeconds: 12.5}
)");
  Config back = edit::parseConfig(edit::toYaml(c));
  EXPECT_EQ(edit::toYaml(back), edit::toYaml(c));
  EXPECT_EQ(back.model.layers, 3);
  EXPECT_EQ(back.model.dim, 256);
  EXPECT_DOUBLE_EQ(back.model.initStd, 0.0123456789);
  EXPECT_EQ(back.model.normEps, 1e-6);
  EXPECT_EQ(back.data.train, "path with: colon #x.bin");
  EXPECT_EQ(back.checkpoint.dir, "yes");
  EXPECT_EQ(back.training.seed, 18446744073709551615ULL);
  EXPECT_DOUBLE_EQ(back.algorithm.penalty.stepShare, 0.33);
  EXPECT_TRUE(back.debug.injectStepDelay.random);
  EXPECT_EQ(back.runtime.backend, edit::Backend::Nccl);

  Config defaults;
  EXPECT_EQ(edit::toYaml(edit::parseConfig(edit::toYaml(defaults))), edit::toYaml(defaults));
}

TEST(Config, LoadFileNamesThePath) {
  try {
    edit::loadConfigFile("/nonexistent/edit.yaml");
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/edit.yaml"), std::string::npos);
  }
}

// Every file of tests/bad_input/configs must be rejected with the message its first
// line announces ("# expect: <substring>").
TEST(Config, BadInputCorpus) {
  const std::string dir = std::string(EDIT_SOURCE_DIR) + "/tests/bad_input/configs";
  DIR* d = opendir(dir.c_str());
  ASSERT_NE(d, nullptr) << dir;
  int files = 0;
  while (dirent* e = readdir(d)) {
    std::string name = e->d_name;
    if (name.size() < 6 || name.substr(name.size() - 5) != ".yaml") continue;
    std::ifstream in(dir + "/" + name);
    std::string first;
    std::getline(in, first);
    const std::string tag = "# expect: ";
    ASSERT_EQ(first.rfind(tag, 0), 0u) << name << ": first line must be '# expect: ...'";
    const std::string expect = first.substr(tag.size());
    std::string err;
    try {
      edit::loadConfigFile(dir + "/" + name);
    } catch (const ConfigError& ex) {
      err = ex.what();
    }
    EXPECT_NE(err, "") << name << " was accepted";
    EXPECT_NE(err.find(expect), std::string::npos) << name << ": got \"" << err << "\"";
    ++files;
  }
  closedir(d);
  EXPECT_GE(files, 10);
}

// --- the schema (edit-train --print-schema; the CRD is checked against it) ------------

namespace {
// The leaf at "a.b.c" of the printed schema (JSON is YAML: yaml-cpp reads it).
YAML::Node schemaLeaf(const YAML::Node& root, const std::string& path) {
  YAML::Node n = root;
  std::stringstream ss(path);
  // reset(), not =: assigning a yaml-cpp node overwrites the node it refers to.
  for (std::string seg; std::getline(ss, seg, '.');) n.reset(n["properties"][seg]);
  return n;
}
}  // namespace

TEST(ConfigSchema, EveryKeyAndSectionHasADescription) {
  EXPECT_EQ(edit::undocumentedConfigKeys(), std::vector<std::string>{});
}

TEST(ConfigSchema, PrintsEveryKeyWithItsRangeEnumAndDefault) {
  const YAML::Node root = YAML::Load(edit::workerConfigSchemaJson());
  // A sample of keys of every kind: the schema says what the parser enforces.
  auto syncSeconds = schemaLeaf(root, "algorithm.syncSeconds");
  EXPECT_EQ(syncSeconds["type"].as<std::string>(), "number");
  EXPECT_EQ(syncSeconds["maximum"].as<double>(), 86400);
  EXPECT_EQ(errorOf("algorithm: {syncSeconds: 100000}").rfind("algorithm.syncSeconds: must be", 0), 0u);
  auto steps = schemaLeaf(root, "training.steps");
  EXPECT_EQ(steps["minimum"].as<int64_t>(), 1);
  EXPECT_EQ(steps["default"].as<int64_t>(), Config{}.training.steps);
  EXPECT_EQ(schemaLeaf(root, "debug.injectStepDelay.seconds")["maximum"].as<double>(), 3600);
  auto mode = schemaLeaf(root, "algorithm.mode");
  std::vector<std::string> modes;
  for (const auto& m : mode["enum"]) modes.push_back(m.as<std::string>());
  EXPECT_EQ(modes, (std::vector<std::string>{"edit", "a-edit", "diloco", "localsgd", "ddp"}));
  for (const auto& m : modes) EXPECT_EQ(errorOf("algorithm: {mode: " + m + ", syncSeconds: 1}"), "") << m;
  auto lr = schemaLeaf(root, "training.lr");
  EXPECT_TRUE(lr["exclusiveMinimum"].as<bool>());
  EXPECT_NE(errorOf("training: {lr: 0}"), "");
  // Preset-filled sizes have no default (a default would override the preset).
  EXPECT_FALSE(schemaLeaf(root, "model.dim")["default"].IsDefined());
  EXPECT_EQ(schemaLeaf(root, "model.vocabSize")["default"].as<int64_t>(), 256);
  EXPECT_EQ(schemaLeaf(root, "data.train")["minLength"].as<int>(), 1);
  // Cross-field rules travel as CEL on their section.
  auto rules = root["properties"]["algorithm"]["x-kubernetes-validations"];
  ASSERT_TRUE(rules.IsSequence());
  EXPECT_NE(rules[0]["rule"].as<std::string>().find("syncSeconds"), std::string::npos);
}

TEST(ConfigSchema, EveryParsedKeyIsInTheSchemaWithItsDefault) {
  const YAML::Node root = YAML::Load(edit::workerConfigSchemaJson());
  // --print-config's keys (the parser's table) against the schema's leaves, both ways.
  const YAML::Node dump = YAML::Load(edit::toYaml(Config{}));
  int leaves = 0;
  std::function<void(const YAML::Node&, const YAML::Node&, const std::string&)> walk =
      [&](const YAML::Node& d, const YAML::Node& s, const std::string& path) {
        ASSERT_TRUE(s["properties"].IsMap()) << path;
        EXPECT_EQ(d.size(), s["properties"].size()) << path;
        for (const auto& kv : d) {
          const std::string key = kv.first.as<std::string>();
          const std::string p = path.empty() ? key : path + "." + key;
          const YAML::Node sub = s["properties"][key];
          ASSERT_TRUE(sub.IsDefined()) << p << " is not in the schema";
          if (kv.second.IsMap()) {
            walk(kv.second, sub, p);
            continue;
          }
          ++leaves;
          EXPECT_FALSE(sub["description"].as<std::string>().empty()) << p;
          if (sub["default"].IsDefined())
            EXPECT_EQ(sub["default"].as<std::string>(), kv.second.as<std::string>()) << p;
        }
      };
  walk(dump, root, "");
  EXPECT_GT(leaves, 70);
}

TEST(ConfigSchema, CrossFieldRulesRunOnceAfterTheLastOverride) {
  // a-edit without syncSeconds is invalid alone; an override after the file makes it valid.
  Config c = edit::parseConfig("algorithm: {mode: a-edit}\n", false);
  edit::applyOverrides(c, {"algorithm.syncSeconds=2.5"}, false);
  EXPECT_NO_THROW(edit::validate(c));
  EXPECT_DOUBLE_EQ(c.algorithm.syncSeconds, 2.5);
  // Checked by default, and a key's own range is checked as it is set either way.
  EXPECT_THROW(edit::parseConfig("algorithm: {mode: a-edit}\n"), ConfigError);
  EXPECT_THROW(edit::parseConfig("algorithm: {syncSeconds: -1}\n", false), ConfigError);
}

TEST(ModeTable, TheConfigAcceptsExactlyTheTablesModesWithTheirClocks) {
  const YAML::Node root = YAML::Load(edit::workerConfigSchemaJson());
  std::vector<std::string> schemaModes;
  for (const auto& m : schemaLeaf(root, "algorithm.mode")["enum"]) schemaModes.push_back(m.as<std::string>());
  EXPECT_EQ(schemaModes, edit::modeNames());
  for (const auto& m : edit::kModeTable) {
    // A time-clocked mode needs syncSeconds; the others do not.
    const std::string err = errorOf(std::string("algorithm: {mode: ") + m.name + "}");
    if (m.clock == edit::SyncClock::Seconds) EXPECT_EQ(err.rfind("algorithm.syncSeconds:", 0), 0u) << m.name;
    else EXPECT_EQ(err, "") << m.name;
    // Every mode's description reaches users.
    EXPECT_NE(schemaLeaf(root, "algorithm.mode")["description"].as<std::string>().find(m.summary),
              std::string::npos) << m.name;
    EXPECT_EQ(edit::findMode(m.name), &m);
  }
  EXPECT_EQ(edit::findMode("sgd"), nullptr);
}

TEST(Config, SyncCompression) {
  EXPECT_EQ(edit::parseConfig("").algorithm.syncCompression, edit::Compression::None);
  EXPECT_EQ(edit::parseConfig("").algorithm.compressionBlock, 256);
  auto c = edit::parseConfig("algorithm: {syncCompression: int8, compressionBlock: 64}");
  EXPECT_EQ(c.algorithm.syncCompression, edit::Compression::Int8);
  EXPECT_EQ(c.algorithm.compressionBlock, 64);
  EXPECT_NE(edit::toYaml(c).find("syncCompression: \"int8\""), std::string::npos);
  EXPECT_EQ(edit::parseConfig("algorithm: {syncCompression: int4}").algorithm.syncCompression, edit::Compression::Int4);
  EXPECT_NE(errorOf("algorithm: {syncCompression: int2}").find("algorithm.syncCompression: must be one of none, int8, int4"),
            std::string::npos);
  EXPECT_NE(errorOf("algorithm: {compressionBlock: 8}").find("algorithm.compressionBlock: must be an integer in [16, 1048576]"),
            std::string::npos);
}

TEST(Config, InitStdIsThePresetsUnlessSet) {
  // -1 by default: the preset's value, measured for the small presets (docs/design-decisions.md).
  EXPECT_DOUBLE_EQ(edit::parseConfig("").model.initStd, -1);
  EXPECT_DOUBLE_EQ(edit::resolvedInitStd(edit::parseConfig("").model), 0.0625);
  EXPECT_DOUBLE_EQ(edit::resolvedInitStd(edit::parseConfig("model: {preset: small}").model), 0.0442);
  EXPECT_DOUBLE_EQ(edit::resolvedInitStd(edit::parseConfig("model: {preset: llama-1b}").model), 0.02);
  // custom: max(0.02, 1/sqrt(2 dim)), the rule the measured presets follow.
  const auto narrow = edit::parseConfig("model: {preset: custom, dim: 32, heads: 2}").model;
  EXPECT_DOUBLE_EQ(edit::resolvedInitStd(narrow), 0.125);
  const auto wide = edit::parseConfig("model: {preset: custom, dim: 4096, heads: 32}").model;
  EXPECT_DOUBLE_EQ(edit::resolvedInitStd(wide), 0.02);
  // An explicit value wins over every preset.
  EXPECT_DOUBLE_EQ(edit::resolvedInitStd(edit::parseConfig("model: {preset: small, initStd: 0.03}").model), 0.03);
  EXPECT_NE(errorOf("model: {initStd: 0}").find("model.initStd: must be -1 (the preset's) or a number in (0, 1]"),
            std::string::npos);
  EXPECT_NE(errorOf("model: {initStd: -0.5}").find("model.initStd"), std::string::npos);
}
