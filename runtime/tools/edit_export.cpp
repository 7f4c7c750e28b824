// edit-export: a trained model out of an edit-train checkpoint, as Hugging Face's
// LlamaForCausalLM (model.safetensors + config.json), and the checks around it
// (docs/export.md).
//
//   edit-export --checkpoint DIR --out DIR [--dtype f32|bf16] [--force] ...
//   edit-export --checkpoint DIR|--model DIR [--dump-logits FILE] [--eval] ...
//
// stdout: one line "@edit-export {json}" (what was written, from which checkpoint, the
// validation loss); human-readable lines go to stderr. Exit codes: 0 done; 2 refused
// (bad arguments, corrupt or incomplete checkpoint, existing output, a model the format
// cannot express: permanent, do not retry); 1 other failures (I/O).
#include <nlohmann/json.hpp>

#include <dlfcn.h>
#include <sched.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <thread>

#include "launch/blas_env.h"
#include "train/checkpoint.h"
#include "data/data.h"
#include "export/hf_export.h"
#include "export/safetensors.h"

using namespace edit;
using nlohmann::json;

namespace {

constexpr int kExitRefused = 2;

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

const char* kUsage =
    "usage:\n"
    "  edit-export --checkpoint DIR --out DIR [--dtype f32|bf16] [--force]\n"
    "              [--step S] [--weights auto|outer|replica] [--replica R]\n"
    "              [--dump-logits FILE] [--eval]\n"
    "  edit-export --model DIR [--dump-logits FILE] [--eval]\n"
    "\n"
    "  --checkpoint DIR  checkpoint.dir (its newest complete step) or one step-XXXXXXXX dir\n"
    "  --step S          with checkpoint.dir: this step instead of the newest\n"
    "  --weights W       auto (default): the outer, synchronized weights when the checkpoint\n"
    "                    has them, else the local weights; outer; replica (local weights)\n"
    "  --replica R       whose shards to gather (default 0)\n"
    "  --out DIR         write DIR/model.safetensors and DIR/config.json (LlamaForCausalLM);\n"
    "                    refused when DIR exists unless --force\n"
    "  --dtype T         f32 (default) or bf16\n"
    "  --model DIR       an edit-export output, read back instead of a checkpoint\n"
    "  --dump-logits F   write the project's logits on validation batch 0 of stream 0 to F\n"
    "                    (safetensors: tokens, targets, logits, loss)\n"
    "  --eval            print the validation loss of the batches edit-train's final\n"
    "                    validation uses (every rank's stream)\n"
    "  --val FILE, --batch-size B, --seq-len T, --seed S, --streams W, --batches K\n"
    "                    validation data and batches (default: the training configuration)\n"
    "  --threads N       intra-op threads (default: the CPUs this process may use)\n"
    "  --report FILE     also write the result (or {\"error\": ...}) as JSON to FILE, e.g.\n"
    "                    /dev/termination-log, where Kubernetes shows it in the pod status\n";

struct Options {
  std::string checkpoint, model, out, logits, val, report;
  hf::Source src;
  bool bf16 = false, force = false, eval = false;
  int threads = 0;
  std::optional<int64_t> batchSize, seqLen, batches, streams;
  std::optional<uint64_t> seed;
};

int64_t number(const std::string& flag, const std::string& v, int64_t lo) {
  try {
    size_t p = 0;
    const long long n = std::stoll(v, &p);
    if (p == v.size() && n >= lo) return n;
  } catch (...) {
  }
  throw UsageError(flag + ": expected an integer >= " + std::to_string(lo) + ", got \"" + v + "\"");
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) throw UsageError(a + " needs a value");
      return argv[++i];
    };
    if (a == "-h" || a == "--help") {
      std::cout << kUsage;
      std::exit(0);
    } else if (a == "--checkpoint") o.src.checkpoint = next();
    else if (a == "--model") o.model = next();
    else if (a == "--out") o.out = next();
    else if (a == "--step") o.src.step = number(a, next(), 0);
    else if (a == "--replica") o.src.replica = static_cast<int>(number(a, next(), 0));
    else if (a == "--weights") {
      const std::string w = next();
      if (w == "auto") o.src.weights = hf::Weights::Auto;
      else if (w == "outer") o.src.weights = hf::Weights::Outer;
      else if (w == "replica") o.src.weights = hf::Weights::Replica;
      else throw UsageError("--weights: expected auto, outer or replica, got \"" + w + "\"");
    } else if (a == "--dtype") {
      const std::string d = next();
      if (d == "f32" || d == "float32") o.bf16 = false;
      else if (d == "bf16" || d == "bfloat16") o.bf16 = true;
      else throw UsageError("--dtype: expected f32 or bf16, got \"" + d + "\"");
    } else if (a == "--force") o.force = true;
    else if (a == "--dump-logits") o.logits = next();
    else if (a == "--eval") o.eval = true;
    else if (a == "--val") o.val = next();
    else if (a == "--batch-size") o.batchSize = number(a, next(), 1);
    else if (a == "--seq-len") o.seqLen = number(a, next(), 1);
    else if (a == "--batches") o.batches = number(a, next(), 1);
    else if (a == "--streams") o.streams = number(a, next(), 1);
    else if (a == "--report") o.report = next();
    else if (a == "--threads") o.threads = static_cast<int>(number(a, next(), 1));
    else if (a == "--seed") o.seed = static_cast<uint64_t>(number(a, next(), 0));
    else throw UsageError("unknown argument \"" + a + "\"");
  }
  if (o.src.checkpoint.empty() == o.model.empty())
    throw UsageError("give exactly one of --checkpoint DIR and --model DIR");
  if (!o.model.empty() && !o.out.empty())
    throw UsageError("--out needs --checkpoint (--model is already an export)");
  if (o.out.empty() && o.logits.empty() && !o.eval)
    throw UsageError("nothing to do: give --out, --dump-logits or --eval");
  return o;
}

int worldOf(const hf::Model& m) {
  // "MxN" from the checkpoint: the trainer's validation ran one stream per rank.
  auto it = m.provenance.find("edit.mesh");
  if (it == m.provenance.end()) return 1;
  int M = 1, N = 1;
  if (std::sscanf(it->second.c_str(), "%dx%d", &M, &N) != 2 || M < 1 || N < 1) return 1;
  return M * N;
}

// Best effort: the report is a convenience for the caller, never the reason to fail.
void writeReport(const std::string& path, const json& j) {
  if (path.empty()) return;
  std::ofstream f(path, std::ios::trunc);
  f << j.dump() << "\n";
  if (!f) std::cerr << "edit-export: cannot write the report to " << path << "\n";
}

int run(const Options& o) {
  auto log = [](const std::string& s) { std::cerr << "edit-export: " << s << "\n"; };
  json report = json::object();
  hf::Model m;
  if (!o.model.empty()) {
    m = hf::loadExport(o.model);
    report["model_dir"] = o.model;
  } else {
    m = hf::loadCheckpoint(o.src, log);
  }
  for (const auto& k : {"edit.checkpoint", "edit.step", "edit.weights", "edit.replica", "edit.mesh"})
    if (auto it = m.provenance.find(k); it != m.provenance.end()) report[std::string(k).substr(5)] = it->second;
  report["params"] = parameterCount(m.shape);

  if (!o.out.empty()) {
    hf::ExportOptions eo;
    eo.out = o.out;
    eo.bf16 = o.bf16;
    eo.force = o.force;
    eo.protect = m.provenance.at("edit.checkpoint");
    const auto res = hf::exportModel(m, eo);
    log("wrote " + res.modelPath + " (" + std::to_string(res.tensors) + " tensors, " +
        std::to_string(res.bytes) + " bytes, " + (o.bf16 ? "bf16" : "f32") + ") and " + res.configPath);
    report["out"] = std::filesystem::absolute(o.out).lexically_normal().string();
    report["model"] = res.modelPath;
    report["config"] = res.configPath;
    report["bytes"] = res.bytes;
    report["dtype"] = o.bf16 ? "bf16" : "f32";
  }

  const auto& d = m.cfg.data;
  const std::string val = o.val.empty() ? d.val : o.val;
  const int64_t B = o.batchSize.value_or(d.batchSize), T = o.seqLen.value_or(d.seqLen);
  const uint64_t seed = o.seed.value_or(m.cfg.training.seed);
  if (!o.logits.empty()) {
    if (std::filesystem::exists(o.logits) && !o.force)
      throw hf::ExportError(o.logits + ": exists; pass --force to replace it");
    auto [in, tg] = hf::validationBatch(val, B, T, seed, m.shape.vocab);
    auto lg = hf::logits(m, in);
    auto loss = torch::nn::functional::cross_entropy(lg.reshape({-1, m.shape.vocab}), tg.reshape({-1}));
    st::writeFile(o.logits,
                  {{"tokens", in, st::DType::I64}, {"targets", tg, st::DType::I64},
                   {"logits", lg, st::DType::F32}, {"loss", loss.reshape({}), st::DType::F32}},
                  {{"format", "pt"}, {"edit.val", val}});
    log("logits of " + std::to_string(B) + " x " + std::to_string(T) + " validation tokens -> " + o.logits +
        " (loss " + std::to_string(loss.item<double>()) + ")");
    report["logits"] = o.logits;
    report["logits_loss"] = loss.item<double>();
  }
  if (o.eval) {
    const int streams = static_cast<int>(o.streams.value_or(worldOf(m)));
    const int64_t K = o.batches.value_or(d.valBatches);
    const double loss = hf::validationLoss(m, val, streams, K, B, T, seed);
    log("validation loss " + std::to_string(loss) + " (" + std::to_string(streams) + " streams x " +
        std::to_string(K) + " batches of " + std::to_string(B) + " x " + std::to_string(T) + ")");
    report["val_loss"] = loss;
  }
  std::cout << "@edit-export " << report.dump() << std::endl;
  writeReport(o.report, report);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  reexecWithLibraryEnv(argv);  // Debian's OpenBLAS otherwise picks slow kernels here
  Options o;
  try {
    o = parse(argc, argv);
  } catch (const UsageError& e) {
    std::cerr << "edit-export: " << e.what() << "\n" << kUsage;
    return kExitRefused;
  }
  int threads = o.threads;
  if (threads <= 0) {
    cpu_set_t set;
    threads = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set)
                                                          : static_cast<int>(std::thread::hardware_concurrency());
    threads = std::max(1, threads);
  }
  at::set_num_threads(threads);
  if (auto* setBlasThreads = reinterpret_cast<void (*)(int)>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads")))
    setBlasThreads(threads);
  std::string error;
  int code = kExitRefused;
  try {
    return run(o);
  } catch (const hf::ExportError& e) {
    error = std::string("refused: ") + e.what();
  } catch (const CheckpointError& e) {
    error = std::string("refused: ") + e.what();
  } catch (const st::FormatError& e) {
    error = std::string("refused: ") + e.what();
  } catch (const ConfigError& e) {
    error = std::string("refused: invalid configuration: ") + e.what();
  } catch (const data::DataError& e) {
    error = std::string("refused: invalid data: ") + e.what();
  } catch (const std::exception& e) {
    error = std::string("error: ") + e.what();
    code = 1;
  }
  std::cerr << "edit-export: " << error << "\n";
  writeReport(o.report, {{"error", error}, {"exit_code", code}});
  return code;
}
