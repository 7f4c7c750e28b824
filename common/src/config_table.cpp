// The worker configuration's one table: every key with its type, rule, default (the
// Config member's initial value) and description, and each section's description and
// cross-field CEL rules. Parsing, overrides, validation, --print-config, --print-schema,
// the CRD and the fuzz dictionary all derive from it (worker_config.cpp,
// scripts/schema_outputs.py).
#include "config_field.h"

#include <type_traits>

#include "modes.h"

namespace edit::config {

namespace {

// model.preset's names: the presets' table (worker_config.h), then custom.
const std::vector<std::string> kPresets = [] {
  std::vector<std::string> v;
  for (const auto& p : modelPresets()) v.emplace_back(p.name);
  v.emplace_back("custom");
  return v;
}();

// algorithm.mode's description, from the mode table.
const std::string& modeDoc() {
  static const std::string doc = [] {
    std::string d;
    for (const auto& m : kModeTable) d += std::string(d.empty() ? "" : " ") + m.name + " - " + m.summary + ".";
    return d;
  }();
  return doc;
}

}  // namespace

const std::vector<std::string>& presetNames() { return kPresets; }

}  // namespace edit::config

namespace edit {
const std::vector<ModelPreset>& modelPresets() {
  static const std::vector<ModelPreset> k = {
      {"tiny", 128, 4, 4, 352, 0.0625},          {"small", 256, 6, 8, 704, 0.0442},
      {"llama-350m", 1024, 24, 16, 2752, 0.02}, {"llama-1b", 2048, 24, 16, 5504, 0.02},
      {"llama-3b", 3200, 26, 32, 8640, 0.02},   {"llama-7b", 4096, 32, 32, 11008, 0.02}};
  return k;
}
}  // namespace edit

namespace edit::config {

namespace {

// The table's rows, added in order: one helper per value type.
struct Rows {
  std::vector<Field> f;
  using Doc = const char*;
  void I(const char* p, int64_t& v, Rule r, Doc d) { f.push_back({p, Kind::I64, &v, r, d}); }
  void N(const char* p, int& v, Rule r, Doc d) { f.push_back({p, Kind::I32, &v, r, d}); }
  void U(const char* p, uint64_t& v, Doc d) { f.push_back({p, Kind::U64, &v, none(), d}); }
  void D(const char* p, double& v, Rule r, Doc d) { f.push_back({p, Kind::F64, &v, r, d}); }
  void B(const char* p, bool& v, Doc d) { f.push_back({p, Kind::Bool, &v, none(), d}); }
  void S(const char* p, std::string& v, Rule r, Doc d) { f.push_back({p, Kind::Str, &v, r, d}); }
  // An enumeration: its names (worker_config.h's EnumNames) are the allowed values.
  template <class T>
  void E(const char* p, T& v, Doc d) {
    f.push_back({p, Kind::Enum, &v, oneOf(EnumNames<T>::get()), d, enumAccess<T>()});
  }
};

// The preset comes before the model sizes so that explicit sizes next to it override it.
void modelAndDataRows(Rows& r, Config& c) {
  auto& m = c.model;
  r.S("model.preset", m.preset, oneOf(kPresets),
      "Named model size. tiny (vocabSize 256, dim 128, 4 layers, 4 heads, ffnDim 352) "
      "trains on a laptop CPU; custom takes every size from the fields below.");
  r.I("model.vocabSize", m.vocabSize, ints(2, 1 << 24),
      "Vocabulary size (256 for the byte-level tokenizer; presets do not change it).");
  r.I("model.dim", m.dim, ints(1, 65536), "Hidden size. Default from the preset.");
  r.I("model.layers", m.layers, ints(1, 1024), "Number of transformer blocks. Default from the preset.");
  r.I("model.heads", m.heads, ints(1, 1024), "Attention heads; must divide dim. Default from the preset.");
  r.I("model.ffnDim", m.ffnDim, ints(1, 1 << 20),
      "Inner size of the SwiGLU feed-forward block. Default from the preset.");
  r.D("model.ropeTheta", m.ropeTheta, positive(),
      "Base of the rotary position embedding frequencies (10000 by default).");
  r.D("model.normEps", m.normEps, nums(0, 1, true, true), "Epsilon of RMSNorm (1e-5 by default).");
  Rule initStd = nums(-1, 1, false, false);
  initStd.text = "-1 (the preset's) or a number in (0, 1]";
  r.D("model.initStd", m.initStd, initStd,
      "Standard deviation of the initial weights (residual output projections divided by sqrt(2 "
      "layers)); -1 takes the preset's (tiny 0.0625, small 0.0442, the llama presets 0.02; custom "
      "max(0.02, 1/sqrt(2 dim))).");
  auto& d = c.data;
  r.S("data.train", d.train, str(kMaxPath, true),
      "Token file for training (llm.c or nanoGPT format, from edit-data). A relative "
      "path is resolved under the data PVC's mount when pvc is set.");
  r.S("data.val", d.val, str(kMaxPath), "Token file for validation; empty disables validation.");
  r.I("data.seqLen", d.seqLen, ints(1, 1 << 20), "Tokens per sequence.");
  r.I("data.batchSize", d.batchSize, ints(1, 1 << 20), "Sequences per rank per step.");
  r.I("data.valBatches", d.valBatches, ints(0, 1 << 20), "Batches per validation pass.");
  r.I("data.valEvery", d.valEvery, ints(0), "Steps between validation passes; 0 validates only at the end.");
}

void trainingRows(Rows& r, Config& c) {
  auto& t = c.training;
  r.I("training.steps", t.steps, ints(1, int64_t(1) << 40),
      "Steps per replica (EDiT and the baselines). For A-EDiT the job's budget is "
      "replicas * steps, shared among fast and slow replicas.");
  r.I("training.tokens", t.tokens, ints(0), "Alternative budget in tokens over all ranks; 0 uses steps.");
  r.U("training.seed", t.seed, "Seed of initialization and data order (identical on every rank).");
  r.D("training.lr", t.lr, nums(0, 10, true, false), "Peak learning rate of the inner AdamW.");
  r.D("training.minLr", t.minLr, nums(0, 10, false, false), "Learning rate the cosine schedule decays to.");
  r.I("training.lrWarmupSteps", t.lrWarmupSteps, ints(0), "Linear learning-rate warm-up steps.");
  r.D("training.weightDecay", t.weightDecay, nums(0, 10, false, false),
      "Decoupled weight decay, applied to matrices only.");
  r.D("training.beta1", t.beta1, nums(0, 1, false, true), "AdamW first-moment coefficient.");
  r.D("training.beta2", t.beta2, nums(0, 1, false, true), "AdamW second-moment coefficient.");
  r.D("training.eps", t.eps, nums(0, 1, true, false), "AdamW denominator epsilon.");
  r.D("training.gradClip", t.gradClip, nonNegative(),
      "Global gradient-norm clip of each inner step; 0 turns it off.");
  r.I("training.logEvery", t.logEvery, ints(1), "Steps between log lines of rank 0.");
}

void algorithmRows(Rows& r, Config& c) {
  auto& a = c.algorithm;
  r.E("algorithm.mode", a.mode, modeDoc().c_str());
  r.I("algorithm.syncInterval", a.syncInterval, ints(1, 1 << 30),
      "Local steps between synchronizations (tau).");
  r.D("algorithm.syncSeconds", a.syncSeconds, nums(0, 86400, false, false),
      "A-EDiT only (required there, > 0) - wall time between synchronizations.");
  r.I("algorithm.minStepsPerSync", a.minStepsPerSync, ints(0, 1 << 30),
      "A-EDiT - a sync window with fewer local steps than this is skipped.");
  r.I("algorithm.maxStepsPerSync", a.maxStepsPerSync, ints(0, 1 << 30),
      "A-EDiT - force a sync after this many local steps; 0 sets no cap.");
  r.I("algorithm.warmupSteps", a.warmupSteps, ints(0),
      "Synchronous (ddp-style) steps before local training starts.");
  r.D("algorithm.outer.lr", a.outer.lr, nums(0, 10, true, false), "Outer learning rate.");
  Rule momentum = nums(-1, 1, false, true);  // and not in (-1, 0): validate()
  momentum.text = "-1 (the mode's default) or a number in [0, 1)";
  r.D("algorithm.outer.momentum", a.outer.momentum, momentum,
      "Outer momentum; -1 takes the mode's default (0.5 for edit and a-edit, measured at sync "
      "intervals 8 and 16; 0.9, the DiLoCo paper's, for diloco). An explicit value applies to "
      "every mode but localsgd (plain averaging).");
  r.B("algorithm.outer.nesterov", a.outer.nesterov, "Use Nesterov momentum.");
  auto& p = a.penalty;
  r.B("algorithm.penalty.anomaly", p.anomaly,
      "Drop a replica's pseudo-gradient whose norm is an EWMA z-score outlier.");
  r.D("algorithm.penalty.emaAlpha", p.emaAlpha, nums(0, 1, true, true),
      "EWMA coefficient of the norm statistics.");
  r.D("algorithm.penalty.zThreshold", p.zThreshold, positive(),
      "z-score over which a norm is an anomaly (one-sided).");
  r.I("algorithm.penalty.anomalyWarmup", p.anomalyWarmup, ints(0),
      "EWMA updates before the z-test is trusted.");
  r.B("algorithm.penalty.weighted", p.weighted,
      "Weight replicas by softmax(-norm / temperature) instead of a plain mean.");
  r.D("algorithm.penalty.temperature", p.temperature, positive(), "Temperature of the softmax weights.");
  r.E("algorithm.penalty.weighting", p.weighting,
      "raw - softmax(-g/T) of the replicas' norms g (the paper); median - softmax(-g/(T "
      "median g)), which does not depend on the unit's size.");
  r.B("algorithm.penalty.clip", p.clip, "Clip the averaged pseudo-gradient to clipNorm.");
  r.D("algorithm.penalty.clipNorm", p.clipNorm, positive(), "Norm bound of the averaged pseudo-gradient.");
  r.D("algorithm.penalty.stepShare", p.stepShare, nums(0, 1, false, false),
      "A-EDiT - how much each replica's share of steps since the last sync counts in "
      "its weight.");
  r.I("algorithm.penalty.maxSkippedRounds", p.maxSkippedRounds, ints(0),
      "Fail the job (reason TrainingStalled) when a unit's outer step was skipped this "
      "many sync rounds in a row because every replica was anomalous; 0 never fails.");
  r.B("algorithm.prefetch", a.prefetch,
      "Overlap the next unit's sync and all-gather with this unit's compute.");
  r.B("algorithm.offloadOuterState", a.offloadOuterState,
      "Keep outer weights and momentum in host memory (GPU only).");
  r.E("algorithm.syncCompression", a.syncCompression,
      "Pseudo-gradients exchanged in the sync group: none (fp32), int8 or int4 (per-block absmax "
      "scaling with error feedback; about 26% or 13% of the fp32 bytes at any number of replicas). "
      "Also compresses the synchronous warm-up's gradient average across replicas (ddp stays "
      "fp32). For slow links between replicas.");
  r.I("algorithm.compressionBlock", a.compressionBlock, ints(16, 1 << 20),
      "int8/int4 only - elements per scale (one fp32 scale per block).");
  r.I("algorithm.overlapSteps", a.overlapSteps, ints(0, 1 << 20),
      "Local steps a sync round's exchange may run behind: 0 completes the round in its sync "
      "step; d > 0 exchanges during the next d local steps (at most until the next round) and "
      "applies the outer step then, keeping the local progress made meanwhile. Hides the "
      "exchange on slow links at the cost of d steps of staleness; a checkpoint applies the "
      "round in flight first; in-place recovery is off (a lost peer means a gang restart). "
      "Gloo only.");
}

void outputRows(Rows& r, Config& c) {
  auto& k = c.checkpoint;
  r.S("checkpoint.dir", k.dir, str(kMaxPath),
      "Checkpoint directory; empty disables checkpoints unless pvc is set. A relative "
      "or empty dir is resolved under the checkpoint PVC's mount.");
  r.I("checkpoint.everySteps", k.everySteps, ints(0),
      "Steps between checkpoints; 0 writes one only on SIGTERM and at the end.");
  r.I("checkpoint.keep", k.keep, ints(1, 1000), "Newest complete checkpoints kept.");
  r.B("checkpoint.resume", k.resume, "Resume from the newest complete checkpoint in dir.");
  r.S("metrics.host", c.metrics.host, str(kMaxHost, true),
      "Address the worker's /metrics endpoint listens on.");
  r.N("metrics.port", c.metrics.port, ints(-1, 65535),
      "Port of the worker's /metrics endpoint; -1 serves none, 0 picks a free port.");
  r.S("telemetry.addr", c.telemetry.addr, str(kMaxHost + 6),
      "The operator's gRPC telemetry endpoint, host:port; empty sends no telemetry (env "
      "EDIT_TELEMETRY_ADDR).");
  r.S("telemetry.token", c.telemetry.token, str(kMaxPath, false, true),
      "The job's telemetry token (env EDIT_TELEMETRY_TOKEN); never logged or printed.");
  r.I("telemetry.everySteps", c.telemetry.everySteps, ints(1), "Steps between two telemetry reports.");
  r.D("telemetry.heartbeatSeconds", c.telemetry.heartbeatSeconds, nums(0, 3600, false, false),
      "Resend the last report after this long without one, so the operator tells a "
      "stopped worker from one waiting in a collective; 0 never resends.");
  r.S("telemetry.tlsCaFile", c.telemetry.tlsCaFile, str(kMaxPath),
      "PEM CA bundle that verifies the operator's certificate; set, telemetry uses TLS "
      "and never falls back to plaintext.");
  r.S("telemetry.tlsServerName", c.telemetry.tlsServerName, str(kMaxHost),
      "Name checked in the operator's certificate instead of the host of addr; needs "
      "tlsCaFile.");
}

void debugAndRuntimeRows(Rows& r, Config& c) {
  auto& sd = c.debug.injectStepDelay;
  r.N("debug.injectStepDelay.rank", sd.rank, ints(-1, 1 << 20), "Rank to slow down; -1 slows none.");
  r.D("debug.injectStepDelay.seconds", sd.seconds, nums(0, 3600, false, false), "Extra seconds per step.");
  r.B("debug.injectStepDelay.random", sd.random,
      "Slow a random rank each step (chosen from the seed and step).");
  auto& cr = c.debug.corruptReplica;
  r.N("debug.corruptReplica.replica", cr.replica, ints(-1, 1 << 20),
      "Replica whose weights get noise; -1 corrupts none.");
  r.I("debug.corruptReplica.atSync", cr.atSync, ints(1),
      "Sync round (1-based) before which the noise is added.");
  r.E("debug.corruptReplica.kind", cr.kind,
      "noise - add noise of standard deviation scale x the weights' RMS; pseudoGradient "
      "- multiply the replica's pseudo-gradient by scale.");
  r.D("debug.corruptReplica.scale", cr.scale, nums(0, 1e6, false, false),
      "Noise standard deviation relative to the weights' RMS, or the pseudo-gradient "
      "factor.");
  r.B("debug.corruptReplica.nan", cr.nan, "Write a NaN instead.");
  r.I("debug.corruptReplica.rounds", cr.rounds, ints(1, 1 << 30),
      "Number of sync rounds corrupted - atSync, atSync + every, ...");
  r.I("debug.corruptReplica.every", cr.every, ints(1, 1 << 30), "Sync rounds between two corrupted ones.");
  r.N("debug.killAtStep.rank", c.debug.killAtStep.rank, ints(-1, 1 << 20),
      "Rank that kills itself; -1 kills none.");
  r.I("debug.killAtStep.step", c.debug.killAtStep.step, ints(0),
      "Step at whose start it dies; a replacement pod (EDIT_JOIN=1) never does.");
  r.N("debug.killAtStep.unit", c.debug.killAtStep.unit, ints(-1, 1 << 20),
      "-1 dies at the step's start; a unit index dies in that step's sync round, just before "
      "the unit's sync (tests a round lost part way).");
  r.N("runtime.threads", c.runtime.threads, ints(0, 4096),
      "Intra-op threads per worker; 0 divides the cores among the local workers.");
  r.D("runtime.collectiveTimeoutSeconds", c.runtime.collectiveTimeoutSeconds,
      nums(0, 7 * 86400, true, false),
      "A collective that takes longer fails (a peer is gone).");
  r.E("runtime.backend", c.runtime.backend,
      "Process-group backend - auto picks nccl on a GPU and gloo on a CPU.");
  r.E("runtime.recovery", c.runtime.recovery,
      "When a peer dies in a local phase - inPlace waits for its replacement and "
      "re-forms the groups; exit exits 75 so the whole gang restarts from the newest "
      "checkpoint.");
  r.D("runtime.rendezvousTimeoutSeconds", c.runtime.rendezvousTimeoutSeconds,
      nums(1, 7 * 86400, true, false),
      "How long ranks wait for each other to form (or re-form) the process groups.");
  r.B("runtime.reshardAfterForward", c.runtime.reshardAfterForward,
      "ZeRO-3 - free a unit's gathered parameters after its forward and gather them "
      "again for its backward; false keeps them to the backward (less communication, "
      "more memory).");
  r.I("runtime.allocatorCacheMB", c.runtime.allocatorCacheMB, ints(0, 1 << 20),
      "CPU blocks of 64 KiB to 64 MiB kept for reuse by the next step instead of going "
      "back to the OS; 0 turns the caching allocator off.");
  r.I("runtime.bucketMB", c.runtime.bucketMB, ints(0, 1 << 16),
      "Gradient slices of neighbouring units all-reduced as one collective (ddp and the "
      "warm-up), up to this size; 0 sends one per unit.");
}

}  // namespace

// Every key of the file, in the order they are applied and emitted.
std::vector<Field> fieldsOf(Config& c) {
  Rows r;
  modelAndDataRows(r, c);
  trainingRows(r, c);
  algorithmRows(r, c);
  outputRows(r, c);
  debugAndRuntimeRows(r, c);
  return r.f;
}

const std::vector<SectionDoc>& sectionDocs() {
  static const std::vector<SectionDoc> k = {
      {"model",
       "The transformer (Llama-style: RMSNorm, RoPE, SwiGLU). A preset fills the sizes; an explicit "
       "size next to a preset overrides it.",
       {{"!has(self.dim) || !has(self.heads) || self.dim % self.heads == 0", "heads must divide dim"},
        {"!has(self.dim) || !has(self.heads) || self.dim % self.heads != 0 || (self.dim / self.heads) % 2 == 0",
         "dim / heads must be even (rotary embeddings)"},
        {"!has(self.initStd) || self.initStd == -1.0 || self.initStd > 0.0",
         "initStd must be -1 (the preset's) or above 0"}}},
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

}  // namespace edit::config
