// edit-train: one EDiT worker. Reads its rank and the rendezvous from the environment
// (set by edit-run locally, by the operator in a pod), trains, and exits with a code the
// launcher and the operator understand (common/src/exit_codes.h, bin/exit_reason.h).
//
// stdout carries machine-readable lines for edit-run:  "@edit {json}" every logEvery
// steps and "@edit-summary {json}" at the end. Human-readable logs go to stderr.
#include <nlohmann/json.hpp>
#include <sys/resource.h>

#include <dlfcn.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <iostream>
#include <thread>

#include "bin/exit_reason.h"
#include "launch/blas_env.h"
#include "train/checkpoint.h"
#include "link_advice_json.h"
#include "worker_config.h"
#include "model/cpu_allocator.h"
#include "data/data.h"
#include "telemetry/telemetry.h"
#include "train/trainer.h"

#ifdef EDIT_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#endif

using namespace edit;
using nlohmann::json;

// Peak resident memory of this process (what the kernel's OOM killer and a pod's memory
// limit see), from getrusage.
static int64_t peakRssBytes() {
  struct rusage ru {};
  ::getrusage(RUSAGE_SELF, &ru);
  return static_cast<int64_t>(ru.ru_maxrss) * 1024;
}

namespace {

// Signals and the operator's commands reach the trainer here (every member lock-free).
ControlRequests gRequests;
void onTerminate(int) { gRequests.terminate = true; }

std::string envOr(const char* k, const std::string& d) {
  const char* v = std::getenv(k);
  return v && *v ? v : d;
}

// Why this worker failed, where Kubernetes shows it: the container's termination message
// (pod status, read by the operator into its condition). Written only when the file exists,
// as the kubelet mounts it; elsewhere stderr has the same text.
void terminationMessage(const std::string& text) {
  const std::string path = envOr("EDIT_TERMINATION_LOG", "/dev/termination-log");
  if (::access(path.c_str(), W_OK) != 0) return;
  if (FILE* f = std::fopen(path.c_str(), "w")) {
    std::fwrite(text.data(), 1, std::min<size_t>(text.size(), 4000), f);  // the kubelet keeps 4 KiB
    std::fclose(f);
  }
}

void usage() {
  std::cerr << "usage: edit-train [--config FILE] [--set key=value]... [--print-config | --print-schema]\n"
               "  The configuration comes from --config, else $EDIT_CONFIG_FILE, else the YAML\n"
               "  text in $EDIT_CONFIG (what the operator sets), else the built-in defaults.\n"
               "  Rank and rendezvous: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT,\n"
               "  EDIT_REPLICAS, EDIT_SHARDS.\n"
               "  --print-config prints the resulting configuration; --print-schema prints the\n"
               "  schema of every key (JSON, OpenAPI v3: types, ranges, defaults, descriptions).\n";
}

Config loadConfig(int argc, char** argv, bool& printOnly) {
  std::string file = envOr("EDIT_CONFIG_FILE", "");
  std::vector<std::string> sets;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--config" && i + 1 < argc) file = argv[++i];
    else if (a == "--set" && i + 1 < argc) sets.push_back(argv[++i]);
    else if (a == "--print-config") printOnly = true;
    else if (a == "--print-schema") { std::cout << workerConfigSchemaJson(); std::exit(0); }
    else if (a == "-h" || a == "--help") { usage(); std::exit(0); }
    else throw ConfigError("unknown argument \"" + a + "\" (see --help)");
  }
  Config cfg;
  // Every key is checked as it is set; the cross-field rules once, after the last override.
  if (!file.empty()) cfg = loadConfigFile(file, false);
  else if (const char* text = std::getenv("EDIT_CONFIG"); text && *text) cfg = parseConfig(text, false);
  applyEnvironment(cfg, false);
  applyOverrides(cfg, sets, false);
  validate(cfg);
  return cfg;
}

// Intra-op threads: the cores shared by the workers on this machine; one pool only.
void configureThreads(const Config& cfg) {
  int threads = cfg.runtime.threads;
  if (threads <= 0) {
    const int local = std::max(1, std::atoi(envOr("EDIT_LOCAL_WORLD_SIZE", "1").c_str()));
    threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / local);
  }
  if (cfg.runtime.allocatorCacheMB > 0) installCachingCpuAllocator(cfg.runtime.allocatorCacheMB << 20);
  at::set_num_threads(threads);
  at::set_num_interop_threads(1);
  // OpenBLAS keeps its own pool (one thread per core by default) beside LibTorch's, and
  // its idle threads spin: with several workers per machine that ate ~35% of the CPU.
  if (auto* setBlasThreads = reinterpret_cast<void (*)(int)>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads")))
    setBlasThreads(threads);
}

// Where a worker's progress goes besides its logs: /metrics and the operator.
struct Reporting {
  std::unique_ptr<WorkerMetrics> metrics;
  std::unique_ptr<TelemetryClient> telemetry;
};

Reporting startReporting(const Config& cfg, const MeshSpec& mesh, const std::string& job, const std::string& tag) {
  Reporting r;
  if (cfg.metrics.port >= 0) {
    r.metrics = std::make_unique<WorkerMetrics>(cfg.metrics.host, cfg.metrics.port, job, mesh.rank,
                                                mesh.rank / mesh.shards, mesh.rank % mesh.shards);
    std::cerr << tag << "metrics on http://" << cfg.metrics.host << ":" << r.metrics->port() << "/metrics\n";
  }
  if (!cfg.telemetry.addr.empty())
    r.telemetry = std::make_unique<TelemetryClient>(
        cfg.telemetry.addr, cfg.telemetry.token,
        TelemetryIdentity{envOr("EDIT_NAMESPACE", "default"), job, envOr("POD_NAME", envOr("HOSTNAME", "local")),
                          envOr("POD_UID", ""), envOr("NODE_NAME", ""), mesh.restartGeneration},
        TelemetryTls{cfg.telemetry.tlsCaFile, cfg.telemetry.tlsServerName}, cfg.telemetry.heartbeatSeconds);
  return r;
}

// What the per-step hook accumulates for the summary, and the "@edit" lines it prints.
struct StepLog {
  const Config& cfg;
  Reporting& out;
  const double startT = nowSeconds();
  double lastT = startT;
  uint64_t lastTokens = 0;
  double stepSecondsTotal = 0, syncWorkTotal = 0;  // for the sync share in the summary
  LinkMeasurement link;  // the local phase's compute and blocked time (summary "link")

  StepLog(const Config& c, Reporting& o, const MeshSpec& mesh) : cfg(c), out(o) {
    link.mode = nameOf(cfg.algorithm.mode);
    link.syncInterval = cfg.algorithm.syncInterval;
    link.syncSeconds = cfg.algorithm.syncSeconds;
    link.compression = nameOf(cfg.algorithm.syncCompression);
    link.overlapSteps = cfg.algorithm.overlapSteps;
    link.overlapAllowed = mesh.backend != "nccl";
  }

  void onStep(const StepReport& r) {
    stepSecondsTotal += r.stepSeconds;
    syncWorkTotal += r.lastSyncDurationSeconds;
    link.localSteps = r.local.localSteps;
    link.computeSeconds = r.local.computeSeconds;
    link.blockedSeconds = r.local.blockedSeconds;
    link.rounds = r.local.rounds;
    if (out.metrics) out.metrics->update(r);
    if (out.telemetry) relay(r, *out.telemetry);
    if (r.step % std::max<int64_t>(1, cfg.training.logEvery) == 0 || r.step == r.totalSteps) printLine(r);
  }

  // Sends the report, and hands the operator's commands to the trainer: the replica count
  // goes to rank 0's next control exchange (docs/elastic.md).
  void relay(const StepReport& r, TelemetryClient& t) const {
    if (r.step % std::max<int64_t>(1, cfg.telemetry.everySteps) == 0 || r.step == r.totalSteps) t.send(r);
    switch (t.takeCommand()) {
      case OperatorCommand::Stop: gRequests.stop = true; break;
      case OperatorCommand::Checkpoint: gRequests.checkpoint = true; break;
      default: break;
    }
    if (const int target = t.takeScaleTarget(); target > 0) gRequests.scaleTarget = target;
  }

  void printLine(const StepReport& r) {
    const double now = nowSeconds();
    json j = {{"rank", r.rank}, {"replica", r.replica}, {"shard", r.shard}, {"step", r.step},
              {"total", r.totalSteps}, {"replicas", r.replicas}, {"loss", r.loss}, {"lr", r.lr}, {"tokens", r.tokens},
              {"tps", (r.tokens - lastTokens) / std::max(1e-9, now - lastT)},
              {"sync_rounds", r.syncRounds}, {"anomalies", r.anomalies},
              {"outer_skips", r.outerSkips}, {"skip_streak", r.skipStreak},
              {"pgnorm", r.pseudoGradNorm}, {"phase", r.phase},
              {"comm_wait", r.commWaitSeconds}, {"step_seconds", r.stepSeconds},
              {"elapsed", now - startT}};  // seconds since the process started training
    std::cout << "@edit " << j.dump() << std::endl;
    lastT = now;
    lastTokens = r.tokens;
  }
};

// The "@edit-summary" line: what edit-run's table, the benchmarks and the tests read.
json summaryJson(const Config& cfg, const MeshSpec& mesh, const TrainResult& res, const StepLog& steps) {
  double wait = 0;
  json comm = json::array();
  for (const auto& [k, c] : res.comm) {
    wait += c.waitSeconds;
    comm.push_back({{"op", k.first}, {"group", k.second}, {"bytes", c.bytes}, {"wait", c.waitSeconds},
                    {"calls", c.calls}});
  }
  // No step in this run (resumed from the final checkpoint): no training loss to report.
  const json loss = res.tokensThisRun > 0 ? json(res.finalLoss) : json(nullptr);
  const auto& m = res.memory;
  json s = {{"rank", mesh.rank}, {"replica", mesh.rank / mesh.shards}, {"shard", mesh.rank % mesh.shards},
            {"steps", res.steps}, {"loss", loss}, {"val_loss", res.valLoss}, {"tokens", res.tokens},
            {"seconds", res.seconds}, {"tps", res.tokensThisRun / std::max(1e-9, res.seconds)},
            {"train_seconds", res.trainSeconds}, {"startup_seconds", res.startupSeconds},
            {"train_tps", res.tokensThisRun / std::max(1e-9, res.trainSeconds)},
            {"sync_rounds", res.syncRounds}, {"anomalies", res.anomalies},
            {"outer_skips", res.outerSkips}, {"steps_awaiting_round", res.stepsAwaitingRound},
            {"comm_wait", wait}, {"resumed_from", res.resumedFrom},
            {"stopped", res.stopped}, {"joined", res.joined}, {"recoveries", res.recoveries},
            {"recovery_seconds", res.recoverySeconds}, {"steps_rolled_back", res.stepsRolledBack},
            {"scales", res.scales}, {"scale_seconds", res.scaleSeconds}, {"left_at_scale", res.leftAtScale},
            {"scales_abandoned", res.scalesAbandoned},
            {"comm", comm}, {"peak_rss_bytes", peakRssBytes()},
            {"memory_plan", {{"state", m.state()}, {"buffers", m.buffers}, {"parameters", m.parameters},
                             {"gradients", m.gradients}, {"optimizer", m.optimizer}, {"outer", m.outer},
                             {"overlap", m.overlap}}},
            // Efficiency reports (scripts/gpu-smoke.sh): model FLOPs, and the time of the
            // steps and of the synchronization work within them.
            {"params", parameterCount(shapeOf(cfg.model))},
            {"flops_per_token", flopsPerToken(shapeOf(cfg.model), cfg.data.seqLen)},
            {"step_seconds_total", steps.stepSecondsTotal}, {"sync_work_seconds", steps.syncWorkTotal},
            // The local phase's time, for edit-run's advice on a slow link (common/src/link_advice.h).
            {"link", steps.link},
            // The outer step as resolved for the mode, and what the penalty did.
            {"outer", modeTraits(cfg.algorithm.mode).outerOptimizer
                          ? json{{"lr", res.sync.lr}, {"momentum", res.sync.momentum}, {"nesterov", res.sync.nesterov}}
                          : json(nullptr)},  // ddp, localsgd: no outer optimizer
            {"penalty", {{"on", res.sync.penaltyOn()}, {"unit_rounds", res.penalty.unitRounds},
                         {"units_clipped", res.penalty.unitsClipped}, {"clip_factor_min", res.penalty.clipMin},
                         {"weight_min", res.penalty.weightMin}, {"weight_max", res.penalty.weightMax}}},
            {"device", "cpu"}};
#ifdef EDIT_WITH_CUDA
  // The GPU this worker trained on (selectDevice, train/step_engine.h, made it current).
  if (cfg.runtime.backend != Backend::Gloo && torch::cuda::is_available()) {
    const int dev = c10::cuda::current_device();
    const DeviceMemoryPeak peak = deviceMemoryPeak(dev);
    s["device"] = "cuda:" + std::to_string(dev);
    s["peak_gpu_allocated_bytes"] = peak.allocated;
    s["peak_gpu_reserved_bytes"] = peak.reserved;
  }
#endif
  return s;
}

// The exit code of a run that threw (bin/exit_reason.h), with the reason written where
// the operator reads it.
int exitCodeOf(std::exception_ptr failure, const std::string& tag) {
  const ExitReason r = exitReasonOf(failure);
  std::cerr << tag << r.text << "\n";
  if (r.terminationLog) terminationMessage(r.text);
  return r.code;
}

}  // namespace

int main(int argc, char** argv) {
  reexecWithLibraryEnv(argv);
  Config cfg;
  MeshSpec mesh;
  bool printOnly = false;
  try {
    cfg = loadConfig(argc, argv, printOnly);
    if (printOnly) {
      std::cout << toYaml(cfg);
      return kExitOk;
    }
    mesh = MeshSpec::fromEnvironment();
    mesh.timeoutSeconds = cfg.runtime.collectiveTimeoutSeconds;
    // Test hook (tests/runtime/integration/test_elastic.py): a new replica's rank that dies
    // before it joins, like a pod that never starts.
    if (const char* v = std::getenv("EDIT_TEST_SCALE_JOIN_EXIT"); v && *v && mesh.scaleJoin) return std::atoi(v);
  } catch (const std::exception& e) {
    std::cerr << "edit-train: invalid configuration: " << e.what() << "\n";
    terminationMessage(std::string("invalid configuration: ") + e.what());
    return kExitInvalidInput;
  }
  std::signal(SIGTERM, onTerminate);
  std::signal(SIGINT, onTerminate);
  // One replica more (USR1) or fewer (USR2) at the next sync round (docs/elastic.md).
  std::signal(SIGUSR1, [](int) { gRequests.scaleDelta.fetch_add(1); });
  std::signal(SIGUSR2, [](int) { gRequests.scaleDelta.fetch_sub(1); });
  configureThreads(cfg);

  const std::string tag = "[rank " + std::to_string(mesh.rank) + "] ";
  if (auto* coreName = reinterpret_cast<char* (*)()>(dlsym(RTLD_DEFAULT, "openblas_get_corename")))
    std::cerr << tag << "OpenBLAS kernels: " << coreName() << "\n";  // Prescott here is the slow fallback
  std::cerr << tag << "OpenMP wait policy: " << envOr("OMP_WAIT_POLICY", "(libgomp default: spin)") << "\n";
  Reporting reporting;
  try {
    reporting = startReporting(cfg, mesh, envOr("EDIT_JOB", "local"), tag);
  } catch (const std::exception& e) {
    std::cerr << tag << "cannot start metrics/telemetry: " << e.what() << "\n";
    return kExitInvalidInput;
  }
  StepLog steps(cfg, reporting, mesh);
  TrainerHooks hooks;
  hooks.requests = &gRequests;
  hooks.log = [&](const std::string& s) { std::cerr << tag << s << "\n"; };
  hooks.onStep = [&](const StepReport& r) { steps.onStep(r); };
  if (reporting.telemetry) hooks.scaleTarget = [&] { return reporting.telemetry->peekScaleTarget(); };
  try {
    Trainer trainer(cfg, mesh, hooks);
    const TrainResult res = trainer.run();
    std::cout << "@edit-summary " << summaryJson(cfg, mesh, res, steps).dump() << std::endl;
    return res.stopped ? kExitTerminated : kExitOk;
  } catch (...) {
    return exitCodeOf(std::current_exception(), tag);
  }
}
