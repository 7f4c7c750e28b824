// Run configuration of an EDiT worker: one YAML file (the same one the operator puts in
// the job's ConfigMap), plus overrides from the environment or the command line.
// Plain data, no LibTorch: the parser is cheap to compile and to fuzz.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "modes.h"

namespace edit {

// Thrown for every bad configuration; the message names the key and the allowed values.
struct ConfigError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The configuration's enumerations, parsed once into these types (the names below are
// their config and CRD values, in enumerator order; algorithm.mode is modes.h's Mode).
enum class Backend { Auto, Gloo, Nccl };                // runtime.backend
enum class RecoveryMode { InPlace, Exit };              // runtime.recovery
enum class Weighting { Raw, Median };                   // algorithm.penalty.weighting
enum class Compression { None, Int8, Int4 };            // algorithm.syncCompression
enum class CorruptKind { Noise, PseudoGradient };       // debug.corruptReplica.kind

template <class E>
struct EnumNames;
template <>
struct EnumNames<Backend> {
  static const std::vector<std::string>& get() {
    static const std::vector<std::string> v{"auto", "gloo", "nccl"};
    return v;
  }
};
template <>
struct EnumNames<RecoveryMode> {
  static const std::vector<std::string>& get() {
    static const std::vector<std::string> v{"inPlace", "exit"};
    return v;
  }
};
template <>
struct EnumNames<Weighting> {
  static const std::vector<std::string>& get() {
    static const std::vector<std::string> v{"raw", "median"};
    return v;
  }
};
template <>
struct EnumNames<Compression> {
  static const std::vector<std::string>& get() {
    static const std::vector<std::string> v{"none", "int8", "int4"};
    return v;
  }
};
template <>
struct EnumNames<CorruptKind> {
  static const std::vector<std::string>& get() {
    static const std::vector<std::string> v{"noise", "pseudoGradient"};
    return v;
  }
};
template <>
struct EnumNames<Mode> {
  static const std::vector<std::string>& get() {
    static const std::vector<std::string> v = modeNames();
    return v;
  }
};

// The config name of an enumerator, e.g. nameOf(Compression::Int8) == "int8".
template <class E>
const std::string& nameOf(E e) {
  return EnumNames<E>::get().at(static_cast<size_t>(e));
}
// The enumerator of a config name; throws ConfigError naming `what` for an unknown one.
template <class E>
E enumOf(const std::string& name, const char* what) {
  const auto& v = EnumNames<E>::get();
  for (size_t i = 0; i < v.size(); ++i)
    if (v[i] == name) return static_cast<E>(i);
  std::string all;
  for (const auto& n : v) all += (all.empty() ? "" : ", ") + n;
  throw ConfigError(std::string(what) + ": must be one of " + all + " (got \"" + name + "\")");
}

struct ModelConfig {
  std::string preset = "tiny";  // a name of modelPresets(), or custom
  int64_t vocabSize = 256;      // byte-level tokenizer by default
  int64_t dim = 128;
  int64_t layers = 4;
  int64_t heads = 4;
  int64_t ffnDim = 352;
  double ropeTheta = 10000.0;
  double normEps = 1e-5;
  // Standard deviation of the initial weights; -1: the preset's, for custom max(0.02,
  // 1/sqrt(2 dim)) (resolvedInitStd; docs/design-decisions.md, "Initialization").
  double initStd = -1;
};

struct DataConfig {
  std::string train = "data/brown/train.bin";  // llm.c or nanoGPT token file
  std::string val = "data/brown/val.bin";      // empty: no validation
  int64_t seqLen = 128;
  int64_t batchSize = 8;     // sequences per rank per step
  int64_t valBatches = 8;    // batches per validation pass
  int64_t valEvery = 0;      // steps between validation passes (0: only at the end)
};

struct TrainingConfig {
  int64_t steps = 200;       // steps per replica (EDiT); A-EDiT: the job's budget is replicas * steps
  int64_t tokens = 0;        // alternative budget: total tokens over all ranks (0: use steps)
  uint64_t seed = 1234;
  double lr = 3e-3;          // inner AdamW peak learning rate
  double minLr = 3e-4;       // cosine decays to this
  int64_t lrWarmupSteps = 20;
  double weightDecay = 0.1;  // decoupled, matrices only
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double gradClip = 1.0;     // global gradient-norm clip of the inner step (0: off)
  int64_t logEvery = 10;
};

struct PenaltyConfig {
  bool anomaly = true;        // EWMA z-score anomaly elimination
  double emaAlpha = 0.02;
  double zThreshold = 3.0;
  // Rounds (EWMA updates) before the z-test is trusted: the reference implementation's EDiT
  // example uses 10 (its library default, 120, never arms in most runs; a start-up warning
  // says when it cannot arm).
  int64_t anomalyWarmup = 10;
  bool weighted = true;       // softmax(-g/T) weights over replicas
  double temperature = 1.0;
  // What g is divided by in the softmax: raw (T alone, the paper) or median (T times the
  // median norm of the round: weights independent of the unit's size). docs/algorithm.md.
  Weighting weighting = Weighting::Raw;
  bool clip = true;           // clip the averaged pseudo-gradient
  double clipNorm = 10.0;
  double stepShare = 0.5;     // A-EDiT: blend of the replicas' share of steps into the weights
  // A unit whose outer step was skipped (every replica anomalous) this many sync rounds in
  // a row fails the job: training has stalled (0: never fail).
  int64_t maxSkippedRounds = 3;
};

struct OuterOptimizerConfig {
  double lr = 0.7;
  // -1: the mode's published default, 0.8 for edit and a-edit (ATorch's example), 0.9 for
  // diloco (the DiLoCo paper). An explicit value applies to every mode but localsgd.
  double momentum = -1;
  bool nesterov = true;
};

struct AlgorithmConfig {
  Mode mode = Mode::Edit;
  int64_t syncInterval = 16;  // tau: local steps between synchronizations
  double syncSeconds = 0;     // A-EDiT: wall time between synchronizations (required for a-edit)
  int64_t minStepsPerSync = 1;  // A-EDiT: skip a sync with fewer local steps than this
  int64_t maxStepsPerSync = 0;  // A-EDiT: force a sync after this many local steps (0: no cap)
  int64_t warmupSteps = 20;   // synchronous (ddp) steps before local training starts
  OuterOptimizerConfig outer;
  PenaltyConfig penalty;
  bool prefetch = true;       // overlap unit l+1's sync/all-gather with unit l's compute
  bool offloadOuterState = false;  // keep outer weights + momentum in host memory (GPU only)
  // Pseudo-gradients exchanged in the sync group as fp32 (none) or as per-block absmax
  // int8 or int4 with error feedback: docs/algorithm.md, "Compressed synchronization".
  Compression syncCompression = Compression::None;
  int64_t compressionBlock = 256;  // elements per scale (int8/int4)
  // Local steps a sync round's exchange may run behind (0: none, the round completes in its
  // sync step): its outer step lands that many steps late, keeping the local progress made
  // meanwhile. docs/algorithm.md, "Overlapped synchronization".
  int64_t overlapSteps = 0;
};

struct CheckpointConfig {
  std::string dir = "";       // empty: no checkpoints
  int64_t everySteps = 0;     // 0: only on SIGTERM / at the end
  int64_t keep = 2;           // newest complete checkpoints kept
  bool resume = true;         // resume from the newest complete checkpoint in dir
};

struct MetricsConfig {
  std::string host = "127.0.0.1";
  int port = -1;              // -1: no /metrics; 0: any free port
};

struct TelemetryConfig {
  std::string addr = "";      // operator gRPC endpoint host:port (env EDIT_TELEMETRY_ADDR)
  std::string token = "";     // per-job token (env EDIT_TELEMETRY_TOKEN); never logged
  int64_t everySteps = 1;
  // Resend the last report after this many seconds without one (0: never), so that the
  // operator can tell a silent (stopped, frozen) worker from one waiting in a collective
  // (env EDIT_TELEMETRY_HEARTBEAT_SECONDS; the operator derives it from hangTimeoutSeconds).
  double heartbeatSeconds = 5;
  // PEM CA bundle that verifies the operator's certificate; non-empty: TLS, never a
  // plaintext fallback (env EDIT_TELEMETRY_CA_FILE).
  std::string tlsCaFile = "";
  // Name checked in the operator's certificate instead of addr's host; needs tlsCaFile
  // (env EDIT_TELEMETRY_SERVER_NAME).
  std::string tlsServerName = "";
};

struct StepDelay {
  int rank = -1;              // rank to slow down (-1: none)
  double seconds = 0;         // extra seconds per step, slept after the step's compute
  bool random = false;        // a random rank each step (chosen from the seed and step)
};

struct CorruptReplica {
  int replica = -1;           // replica whose weights get noise (-1: none)
  int64_t atSync = 1;         // before this sync round (1-based)
  // noise: add noise of standard deviation scale x the weights' RMS; pseudoGradient:
  // multiply the replica's pseudo-gradient by scale (theta := outer - scale (outer - theta)).
  CorruptKind kind = CorruptKind::Noise;
  double scale = 10.0;
  bool nan = false;           // write a NaN instead
  int64_t rounds = 1;         // corrupt this many sync rounds, atSync, atSync + every, ...
  int64_t every = 1;
};

struct KillAtStep {
  int rank = -1;              // rank that kills itself with SIGKILL (-1: none)
  int64_t step = 0;           // at the start of this step; never in a replacement
  int unit = -1;              // >= 0: in that step's sync round, just before this unit's sync
};

struct DebugConfig {
  StepDelay injectStepDelay;
  CorruptReplica corruptReplica;
  KillAtStep killAtStep;
};

struct RuntimeConfig {
  int threads = 0;            // intra-op threads (0: cores / local workers)
  double collectiveTimeoutSeconds = 300;
  Backend backend = Backend::Auto;
  // When a peer dies in a local phase: inPlace keeps this process, waits for the
  // replacement and re-forms the process groups (docs/replica-recovery.md); exit exits
  // 75 so the launcher restarts the gang from the newest checkpoint.
  RecoveryMode recovery = RecoveryMode::InPlace;
  double rendezvousTimeoutSeconds = 600;  // how long survivors wait for replacements
  // ZeRO-3 (true): a unit's gathered parameters are freed after its forward and gathered
  // again for its backward. false: kept until the backward (ZeRO-2's memory: one all-gather
  // per step instead of two). docs/memory.md.
  bool reshardAfterForward = true;
  // Free CPU blocks (64 KiB - 64 MiB) kept for reuse by the next step instead of going back
  // to the OS and faulting in again (cpu_allocator.h); 0 turns the caching allocator off.
  int64_t allocatorCacheMB = 256;
  // Gradient slices of neighbouring units all-reduced across replicas as one collective
  // (ddp and the synchronous warm-up), up to this size.
  int64_t bucketMB = 4;
};

struct Config {
  ModelConfig model;
  DataConfig data;
  TrainingConfig training;
  AlgorithmConfig algorithm;
  CheckpointConfig checkpoint;
  MetricsConfig metrics;
  TelemetryConfig telemetry;
  DebugConfig debug;
  RuntimeConfig runtime;
};

// Parses YAML text. Unknown keys, wrong types and out-of-range values throw ConfigError
// naming the key path (e.g. "algorithm.penalty.zThreshold") and the allowed range.
// A model preset fills the model sizes; explicit sizes next to a preset override it.
// check = false leaves the cross-field checks (validate()) to the caller: a program that
// applies overrides next validates once, after the last one, so that a file made valid
// by an override is accepted.
Config parseConfig(const std::string& yamlText, bool check = true);
Config loadConfigFile(const std::string& path, bool check = true);

// Applies "a.b.c=value" overrides (command line --set, or EDIT_SET="k=v;k=v"), with the
// same validation as the file.
void applyOverrides(Config& cfg, const std::vector<std::string>& assignments, bool check = true);

// Reads EDIT_SET and the single-purpose variables (EDIT_TELEMETRY_ADDR,
// EDIT_TELEMETRY_TOKEN, EDIT_TELEMETRY_CA_FILE, EDIT_TELEMETRY_SERVER_NAME,
// EDIT_CHECKPOINT_DIR, EDIT_METRICS_PORT) from the environment.
void applyEnvironment(Config& cfg, bool check = true);

// Cross-field checks (e.g. a-edit needs syncSeconds > 0; heads divide dim).
void validate(const Config& cfg);

// The configuration back as YAML (for logs, checkpoints and the operator's ConfigMap).
std::string toYaml(const Config& cfg);

// The one schema of the worker configuration as JSON (OpenAPI v3, structural: what a CRD
// holds): every key's type, range, enum, default and description, and each section's
// description and cross-field rules as CEL. `edit-train --print-schema` prints it; the
// CRD's worker sections are checked against it (tests/packaging/check_crd.py).
std::string workerConfigSchemaJson();
// Keys and sections without a description (a unit test keeps this empty).
std::vector<std::string> undocumentedConfigKeys();

// The model presets: model.preset's names (and custom) and their sizes, in one table.
struct ModelPreset {
  const char* name;
  int64_t dim, layers, heads, ffnDim;
  double initStd;  // measured for tiny and small; the common 0.02 for the rest
};
const std::vector<ModelPreset>& modelPresets();

// model.initStd as the model is built with: the explicit value, else the preset's, else
// (custom) max(0.02, 1/sqrt(2 dim)).
double resolvedInitStd(const ModelConfig& m);

// Fills model sizes from a preset name; throws ConfigError for an unknown one.
void applyModelPreset(ModelConfig& m, const std::string& preset);

}  // namespace edit
