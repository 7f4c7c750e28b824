// YAML run configuration: one table of fields (path, rule, storage) drives parsing,
// overrides, validation and emission, so the four can never disagree on a key.
#include "worker_config.h"

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
namespace {

constexpr int64_t kI64Max = std::numeric_limits<int64_t>::max();
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr size_t kMaxPath = 4096;  // file paths, addresses, tokens
constexpr size_t kMaxHost = 253;   // DNS name limit

const std::vector<std::string> kPresets = {"tiny",     "small",    "llama-350m", "llama-1b",
                                           "llama-3b", "llama-7b", "custom"};
const std::vector<std::string> kModes = modeNames();
const std::vector<std::string> kBackends = {"auto", "gloo", "nccl"};
const std::vector<std::string> kRecoveryModes = {"inPlace", "exit"};
const std::vector<std::string> kWeightings = {"raw", "median"};
const std::vector<std::string> kCompressions = {"none", "int8", "int4"};
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
  const char* doc;  // the description users read (--print-schema, the CRD)

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

// algorithm.mode's description, from the mode table.
const std::string& modeDoc() {
  static const std::string doc = [] {
    std::string d;
    for (const auto& m : kModeTable) d += std::string(d.empty() ? "" : " ") + m.name + " - " + m.summary + ".";
    return d;
  }();
  return doc;
}

// Every key of the file, in the order they are applied and emitted. The preset comes
// before the model sizes so that explicit sizes next to it override it.
std::vector<Field> fieldsOf(Config& c) {
  std::vector<Field> f;
  using Doc = const char*;
  auto I = [&](const char* p, int64_t& v, Rule r, Doc d) { f.push_back({p, Kind::I64, &v, r, d}); };
  auto N = [&](const char* p, int& v, Rule r, Doc d) { f.push_back({p, Kind::I32, &v, r, d}); };
  auto U = [&](const char* p, uint64_t& v, Doc d) { f.push_back({p, Kind::U64, &v, none(), d}); };
  auto D = [&](const char* p, double& v, Rule r, Doc d) { f.push_back({p, Kind::F64, &v, r, d}); };
  auto B = [&](const char* p, bool& v, Doc d) { f.push_back({p, Kind::Bool, &v, none(), d}); };
  auto S = [&](const char* p, std::string& v, Rule r, Doc d) { f.push_back({p, Kind::Str, &v, r, d}); };
  auto& m = c.model;
  S("model.preset", m.preset, oneOf(kPresets),
    "Named model size. tiny (vocabSize 256, dim 128, 4 layers, 4 heads, ffnDim 352) "
    "trains on a laptop CPU; custom takes every size from the fields below.");
  I("model.vocabSize", m.vocabSize, ints(2, 1 << 24),
    "Vocabulary size (256 for the byte-level tokenizer; presets do not change it).");
  I("model.dim", m.dim, ints(1, 65536), "Hidden size. Default from the preset.");
  I("model.layers", m.layers, ints(1, 1024), "Number of transformer blocks. Default from the preset.");
  I("model.heads", m.heads, ints(1, 1024), "Attention heads; must divide dim. Default from the preset.");
  I("model.ffnDim", m.ffnDim, ints(1, 1 << 20),
    "Inner size of the SwiGLU feed-forward block. Default from the preset.");
  D("model.ropeTheta", m.ropeTheta, positive(),
    "Base of the rotary position embedding frequencies (10000 by default).");
  D("model.normEps", m.normEps, nums(0, 1, true, true), "Epsilon of RMSNorm (1e-5 by default).");
  D("model.initStd", m.initStd, nums(0, 1, true, false),
    "Standard deviation of the initial weights (0.02 by default).");
  auto& d = c.data;
  S("data.train", d.train, str(kMaxPath, true),
    "Token file for training (llm.c or nanoGPT format, from edit-data). A relative "
    "path is resolved under the data PVC's mount when pvc is set.");
  S("data.val", d.val, str(kMaxPath), "Token file for validation; empty disables validation.");
  I("data.seqLen", d.seqLen, ints(1, 1 << 20), "Tokens per sequence.");
  I("data.batchSize", d.batchSize, ints(1, 1 << 20), "Sequences per rank per step.");
  I("data.valBatches", d.valBatches, ints(0, 1 << 20), "Batches per validation pass.");
  I("data.valEvery", d.valEvery, ints(0), "Steps between validation passes; 0 validates only at the end.");
  auto& t = c.training;
  I("training.steps", t.steps, ints(1, int64_t(1) << 40),
    "Steps per replica (EDiT and the baselines). For A-EDiT the job's budget is "
    "replicas * steps, shared among fast and slow replicas.");
  I("training.tokens", t.tokens, ints(0), "Alternative budget in tokens over all ranks; 0 uses steps.");
  U("training.seed", t.seed, "Seed of initialization and data order (identical on every rank).");
  D("training.lr", t.lr, nums(0, 10, true, false), "Peak learning rate of the inner AdamW.");
  D("training.minLr", t.minLr, nums(0, 10, false, false), "Learning rate the cosine schedule decays to.");
  I("training.lrWarmupSteps", t.lrWarmupSteps, ints(0), "Linear learning-rate warm-up steps.");
  D("training.weightDecay", t.weightDecay, nums(0, 10, false, false),
    "Decoupled weight decay, applied to matrices only.");
  D("training.beta1", t.beta1, nums(0, 1, false, true), "AdamW first-moment coefficient.");
  D("training.beta2", t.beta2, nums(0, 1, false, true), "AdamW second-moment coefficient.");
  D("training.eps", t.eps, nums(0, 1, true, false), "AdamW denominator epsilon.");
  D("training.gradClip", t.gradClip, nonNegative(),
    "Global gradient-norm clip of each inner step; 0 turns it off.");
  I("training.logEvery", t.logEvery, ints(1), "Steps between log lines of rank 0.");
  auto& a = c.algorithm;
  S("algorithm.mode", a.mode, oneOf(kModes), modeDoc().c_str());
  I("algorithm.syncInterval", a.syncInterval, ints(1, 1 << 30),
    "Local steps between synchronizations (tau).");
  D("algorithm.syncSeconds", a.syncSeconds, nums(0, 86400, false, false),
    "A-EDiT only (required there, > 0) - wall time between synchronizations.");
  I("algorithm.minStepsPerSync", a.minStepsPerSync, ints(0, 1 << 30),
    "A-EDiT - a sync window with fewer local steps than this is skipped.");
  I("algorithm.maxStepsPerSync", a.maxStepsPerSync, ints(0, 1 << 30),
    "A-EDiT - force a sync after this many local steps; 0 sets no cap.");
  I("algorithm.warmupSteps", a.warmupSteps, ints(0),
    "Synchronous (ddp-style) steps before local training starts.");
  D("algorithm.outer.lr", a.outer.lr, nums(0, 10, true, false), "Outer learning rate.");
  Rule momentum = nums(-1, 1, false, true);  // and not in (-1, 0): validate()
  momentum.text = "-1 (the mode's default) or a number in [0, 1)";
  D("algorithm.outer.momentum", a.outer.momentum, momentum,
    "Outer momentum; -1 takes the mode's published default (0.8 for edit and a-edit, "
    "0.9 for diloco). An explicit value applies to every mode but localsgd (plain "
    "averaging).");
  B("algorithm.outer.nesterov", a.outer.nesterov, "Use Nesterov momentum.");
  auto& p = a.penalty;
  B("algorithm.penalty.anomaly", p.anomaly,
    "Drop a replica's pseudo-gradient whose norm is an EWMA z-score outlier.");
  D("algorithm.penalty.emaAlpha", p.emaAlpha, nums(0, 1, true, true),
    "EWMA coefficient of the norm statistics.");
  D("algorithm.penalty.zThreshold", p.zThreshold, positive(),
    "z-score over which a norm is an anomaly (one-sided).");
  I("algorithm.penalty.anomalyWarmup", p.anomalyWarmup, ints(0),
    "EWMA updates before the z-test is trusted.");
  B("algorithm.penalty.weighted", p.weighted,
    "Weight replicas by softmax(-norm / temperature) instead of a plain mean.");
  D("algorithm.penalty.temperature", p.temperature, positive(), "Temperature of the softmax weights.");
  S("algorithm.penalty.weighting", p.weighting, oneOf(kWeightings),
    "raw - softmax(-g/T) of the replicas' norms g (the paper); median - softmax(-g/(T "
    "median g)), which does not depend on the unit's size.");
  B("algorithm.penalty.clip", p.clip, "Clip the averaged pseudo-gradient to clipNorm.");
  D("algorithm.penalty.clipNorm", p.clipNorm, positive(), "Norm bound of the averaged pseudo-gradient.");
  D("algorithm.penalty.stepShare", p.stepShare, nums(0, 1, false, false),
    "A-EDiT - how much each replica's share of steps since the last sync counts in "
    "its weight.");
  I("algorithm.penalty.maxSkippedRounds", p.maxSkippedRounds, ints(0),
    "Fail the job (reason TrainingStalled) when a unit's outer step was skipped this "
    "many sync rounds in a row because every replica was anomalous; 0 never fails.");
  B("algorithm.prefetch", a.prefetch,
    "Overlap the next unit's sync and all-gather with this unit's compute.");
  B("algorithm.offloadOuterState", a.offloadOuterState,
    "Keep outer weights and momentum in host memory (GPU only).");
  S("algorithm.syncCompression", a.syncCompression, oneOf(kCompressions),
    "Pseudo-gradients exchanged in the sync group: none (fp32), int8 or int4 (per-block absmax "
    "scaling with error feedback; about 26% or 13% of the fp32 bytes at any number of replicas). "
    "Also compresses the synchronous warm-up's gradient average across replicas (ddp stays "
    "fp32). For slow links between replicas.");
  I("algorithm.compressionBlock", a.compressionBlock, ints(16, 1 << 20),
    "int8/int4 only - elements per scale (one fp32 scale per block).");
  I("algorithm.overlapSteps", a.overlapSteps, ints(0, 1 << 20),
    "Local steps a sync round's exchange may run behind: 0 completes the round in its sync "
    "step; d > 0 exchanges during the next d local steps (at most until the next round) and "
    "applies the outer step then, keeping the local progress made meanwhile. Hides the "
    "exchange on slow links at the cost of d steps of staleness; a checkpoint applies the "
    "round in flight first; in-place recovery is off (a lost peer means a gang restart). "
    "Gloo only.");
  auto& k = c.checkpoint;
  S("checkpoint.dir", k.dir, str(kMaxPath),
    "Checkpoint directory; empty disables checkpoints unless pvc is set. A relative "
    "or empty dir is resolved under the checkpoint PVC's mount.");
  I("checkpoint.everySteps", k.everySteps, ints(0),
    "Steps between checkpoints; 0 writes one only on SIGTERM and at the end.");
  I("checkpoint.keep", k.keep, ints(1, 1000), "Newest complete checkpoints kept.");
  B("checkpoint.resume", k.resume, "Resume from the newest complete checkpoint in dir.");
  S("metrics.host", c.metrics.host, str(kMaxHost, true),
    "Address the worker's /metrics endpoint listens on.");
  N("metrics.port", c.metrics.port, ints(-1, 65535),
    "Port of the worker's /metrics endpoint; -1 serves none, 0 picks a free port.");
  S("telemetry.addr", c.telemetry.addr, str(kMaxHost + 6),
    "The operator's gRPC telemetry endpoint, host:port; empty sends no telemetry (env "
    "EDIT_TELEMETRY_ADDR).");
  S("telemetry.token", c.telemetry.token, str(kMaxPath, false, true),
    "The job's telemetry token (env EDIT_TELEMETRY_TOKEN); never logged or printed.");
  I("telemetry.everySteps", c.telemetry.everySteps, ints(1), "Steps between two telemetry reports.");
  D("telemetry.heartbeatSeconds", c.telemetry.heartbeatSeconds, nums(0, 3600, false, false),
    "Resend the last report after this long without one, so the operator tells a "
    "stopped worker from one waiting in a collective; 0 never resends.");
  S("telemetry.tlsCaFile", c.telemetry.tlsCaFile, str(kMaxPath),
    "PEM CA bundle that verifies the operator's certificate; set, telemetry uses TLS "
    "and never falls back to plaintext.");
  S("telemetry.tlsServerName", c.telemetry.tlsServerName, str(kMaxHost),
    "Name checked in the operator's certificate instead of the host of addr; needs "
    "tlsCaFile.");
  auto& sd = c.debug.injectStepDelay;
  N("debug.injectStepDelay.rank", sd.rank, ints(-1, 1 << 20), "Rank to slow down; -1 slows none.");
  D("debug.injectStepDelay.seconds", sd.seconds, nums(0, 3600, false, false), "Extra seconds per step.");
  B("debug.injectStepDelay.random", sd.random,
    "Slow a random rank each step (chosen from the seed and step).");
  auto& cr = c.debug.corruptReplica;
  N("debug.corruptReplica.replica", cr.replica, ints(-1, 1 << 20),
    "Replica whose weights get noise; -1 corrupts none.");
  I("debug.corruptReplica.atSync", cr.atSync, ints(1),
    "Sync round (1-based) before which the noise is added.");
  S("debug.corruptReplica.kind", cr.kind, oneOf(kCorruptKinds),
    "noise - add noise of standard deviation scale x the weights' RMS; pseudoGradient "
    "- multiply the replica's pseudo-gradient by scale.");
  D("debug.corruptReplica.scale", cr.scale, nums(0, 1e6, false, false),
    "Noise standard deviation relative to the weights' RMS, or the pseudo-gradient "
    "factor.");
  B("debug.corruptReplica.nan", cr.nan, "Write a NaN instead.");
  I("debug.corruptReplica.rounds", cr.rounds, ints(1, 1 << 30),
    "Number of sync rounds corrupted - atSync, atSync + every, ...");
  I("debug.corruptReplica.every", cr.every, ints(1, 1 << 30), "Sync rounds between two corrupted ones.");
  N("debug.killAtStep.rank", c.debug.killAtStep.rank, ints(-1, 1 << 20),
    "Rank that kills itself; -1 kills none.");
  I("debug.killAtStep.step", c.debug.killAtStep.step, ints(0),
    "Step at whose start it dies; a replacement pod (EDIT_JOIN=1) never does.");
  N("runtime.threads", c.runtime.threads, ints(0, 4096),
    "Intra-op threads per worker; 0 divides the cores among the local workers.");
  D("runtime.collectiveTimeoutSeconds", c.runtime.collectiveTimeoutSeconds,
    nums(0, 7 * 86400, true, false),
    "A collective that takes longer fails (a peer is gone).");
  S("runtime.backend", c.runtime.backend, oneOf(kBackends),
    "Process-group backend - auto picks nccl on a GPU and gloo on a CPU.");
  S("runtime.recovery", c.runtime.recovery, oneOf(kRecoveryModes),
    "When a peer dies in a local phase - inPlace waits for its replacement and "
    "re-forms the groups; exit exits 75 so the whole gang restarts from the newest "
    "checkpoint.");
  D("runtime.rendezvousTimeoutSeconds", c.runtime.rendezvousTimeoutSeconds,
    nums(1, 7 * 86400, true, false),
    "How long ranks wait for each other to form (or re-form) the process groups.");
  S("runtime.recoverySnapshotDir", c.runtime.recoverySnapshotDir, str(kMaxPath),
    "Where in-place recovery keeps the outer state of the sync round in progress (2 x "
    "parameters / shards bytes) - empty keeps it in memory; a directory on disk keeps it "
    "in an unlinked file there, out of the worker's resident memory (not tmpfs, which is "
    "memory). Written at every sync round.");
  B("runtime.reshardAfterForward", c.runtime.reshardAfterForward,
    "ZeRO-3 - free a unit's gathered parameters after its forward and gather them "
    "again for its backward; false keeps them to the backward (less communication, "
    "more memory).");
  I("runtime.allocatorCacheMB", c.runtime.allocatorCacheMB, ints(0, 1 << 20),
    "CPU blocks of 64 KiB to 64 MiB kept for reuse by the next step instead of going "
    "back to the OS; 0 turns the caching allocator off.");
  I("runtime.bucketMB", c.runtime.bucketMB, ints(0, 1 << 16),
    "Gradient slices of neighbouring units all-reduced as one collective (ddp and the "
    "warm-up), up to this size; 0 sends one per unit.");
  return f;
}

// Each section's description and the cross-field rules the runtime checks in validate(),
// as the CEL rules the CRD must carry (the API server rejects what the runtime would; the
// operator then runs the parser itself). The top-level sections metrics, telemetry and
// runtime are set by the operator or the launcher, not by an EDiTJob.
struct SectionDoc {
  const char* path;
  const char* doc;
  std::vector<std::pair<const char*, const char*>> rules;  // (CEL, message)
};

const std::vector<SectionDoc>& sectionDocs() {
  static const std::vector<SectionDoc> k = {
      {"model",
       "The transformer (Llama-style: RMSNorm, RoPE, SwiGLU). A preset fills the sizes; an explicit "
       "size next to a preset overrides it.",
       {{"!has(self.dim) || !has(self.heads) || self.dim % self.heads == 0", "heads must divide dim"},
        {"!has(self.dim) || !has(self.heads) || self.dim % self.heads != 0 || (self.dim / self.heads) % 2 == 0",
         "dim / heads must be even (rotary embeddings)"}}},
      {"data", "Training data (token files) and batch shape.", {}},
      {"training", "Budget, inner optimizer (AdamW) and schedule of every replica.",
       {{"self.minLr <= self.lr", "minLr must not exceed lr"}}},
      {"algorithm", "Training algorithm and its synchronization, outer optimizer and penalty.",
       {{"self.mode != 'a-edit' || (has(self.syncSeconds) && self.syncSeconds > 0.0)",
         "mode a-edit needs syncSeconds > 0"},
        {"!has(self.maxStepsPerSync) || self.maxStepsPerSync == 0 || self.maxStepsPerSync >= self.minStepsPerSync",
         "maxStepsPerSync must be 0 (no cap) or at least minStepsPerSync"},
        {"!has(self.outer) || !has(self.outer.momentum) || self.outer.momentum == -1.0 || self.outer.momentum >= 0.0",
         "outer.momentum must be -1 (the mode's default) or in [0, 1)"}}},
      {"algorithm.outer", "Outer optimizer - Nesterov SGD applied to the averaged pseudo-gradient.", {}},
      {"algorithm.penalty",
       "Pseudo-gradient penalty against loss spikes - anomaly elimination, weighted averaging over "
       "replicas and clipping.",
       {}},
      {"checkpoint", "Checkpoints, used to restart the job after a failure.", {}},
      {"metrics", "The worker's Prometheus endpoint.", {}},
      {"telemetry", "Reports to the operator (progress, step times, heartbeats) over gRPC.", {}},
      {"debug", "Fault injection for tests and benchmarks. Leave unset in production.", {}},
      {"debug.injectStepDelay", "Slow one rank down (an artificial straggler).", {}},
      {"debug.corruptReplica", "Corrupt one replica's weights before sync rounds (tests the penalty).", {}},
      {"debug.killAtStep", "Kill one worker with SIGKILL at a given step (tests failure recovery).", {}},
      {"runtime", "Process groups, threads, memory and recovery of the worker process.", {}},
  };
  return k;
}

// Sizes a preset sets (applyModelPreset): no schema default, or it would override the preset.
bool presetFilled(const std::string& path) {
  return path == "model.dim" || path == "model.layers" || path == "model.heads" || path == "model.ffnDim";
}

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
    add("default", f.kind == Kind::Str ? jsonString(v) : v);
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
