#include "export/hf_export.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "train/checkpoint.h"
#include "data/data.h"
#include "export/safetensors.h"

namespace edit::hf {
namespace fs = std::filesystem;
using nlohmann::json;

const std::vector<NameRule>& nameTable() {
  // Left: modelLayout()'s parameter names; right: transformers' LlamaForCausalLM names.
  // The fused rows (wqkv, w13) are for a layout that concatenates those matrices along
  // their output dimension in the order listed; the independent forward pass
  // (tests/runtime/export/hf_reference.py) fails if the order is wrong.
  static const std::vector<NameRule> table = {
      {UnitKind::Embedding, "tok_embeddings", {"model.embed_tokens.weight"}},
      {UnitKind::Block, "attn_norm", {"model.layers.{L}.input_layernorm.weight"}},
      {UnitKind::Block, "wq", {"model.layers.{L}.self_attn.q_proj.weight"}},
      {UnitKind::Block, "wk", {"model.layers.{L}.self_attn.k_proj.weight"}},
      {UnitKind::Block, "wv", {"model.layers.{L}.self_attn.v_proj.weight"}},
      {UnitKind::Block, "wqkv",
       {"model.layers.{L}.self_attn.q_proj.weight", "model.layers.{L}.self_attn.k_proj.weight",
        "model.layers.{L}.self_attn.v_proj.weight"}},
      {UnitKind::Block, "wo", {"model.layers.{L}.self_attn.o_proj.weight"}},
      {UnitKind::Block, "ffn_norm", {"model.layers.{L}.post_attention_layernorm.weight"}},
      {UnitKind::Block, "w1", {"model.layers.{L}.mlp.gate_proj.weight"}},
      {UnitKind::Block, "w3", {"model.layers.{L}.mlp.up_proj.weight"}},
      {UnitKind::Block, "w13", {"model.layers.{L}.mlp.gate_proj.weight", "model.layers.{L}.mlp.up_proj.weight"}},
      {UnitKind::Block, "w2", {"model.layers.{L}.mlp.down_proj.weight"}},
      {UnitKind::Head, "norm", {"model.norm.weight"}},
      {UnitKind::Head, "output", {"lm_head.weight"}},
  };
  return table;
}

namespace {

std::string withLayer(std::string name, int64_t layer) {
  const auto at = name.find("{L}");
  if (at != std::string::npos) name.replace(at, 3, std::to_string(layer));
  return name;
}

std::string shapeText(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

// What LlamaForCausalLM(config) allocates, from transformers' conventions alone
// (num_key_value_heads = num_attention_heads, head_dim = hidden / heads, untied head).
std::map<std::string, std::vector<int64_t>> expectedHfShapes(const ModelShape& s) {
  std::map<std::string, std::vector<int64_t>> e;
  const int64_t d = s.dim, kv = s.heads * s.headDim();
  e["model.embed_tokens.weight"] = {s.vocab, d};
  for (int64_t l = 0; l < s.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    e[p + "input_layernorm.weight"] = {d};
    e[p + "self_attn.q_proj.weight"] = {s.heads * s.headDim(), d};
    e[p + "self_attn.k_proj.weight"] = {kv, d};
    e[p + "self_attn.v_proj.weight"] = {kv, d};
    e[p + "self_attn.o_proj.weight"] = {d, s.heads * s.headDim()};
    e[p + "post_attention_layernorm.weight"] = {d};
    e[p + "mlp.gate_proj.weight"] = {s.ffn, d};
    e[p + "mlp.up_proj.weight"] = {s.ffn, d};
    e[p + "mlp.down_proj.weight"] = {d, s.ffn};
  }
  e["model.norm.weight"] = {d};
  e["lm_head.weight"] = {s.vocab, d};
  return e;
}

}  // namespace

void checkExpressible(const ModelShape& s) {
  auto fail = [](const std::string& why) {
    throw ExportError("the model cannot be expressed as LlamaForCausalLM: " + why);
  };
  if (s.vocab <= 0 || s.dim <= 0 || s.layers <= 0 || s.heads <= 0 || s.ffn <= 0)
    fail("model sizes must be positive (vocab " + std::to_string(s.vocab) + ", dim " + std::to_string(s.dim) +
         ", layers " + std::to_string(s.layers) + ", heads " + std::to_string(s.heads) + ", ffn " +
         std::to_string(s.ffn) + ")");
  if (s.dim % s.heads != 0)
    fail("model.heads " + std::to_string(s.heads) + " does not divide model.dim " + std::to_string(s.dim));
  if (s.headDim() % 2 != 0)
    fail("head dimension " + std::to_string(s.headDim()) + " is odd; rotate_half needs an even one");
  if (!(s.normEps > 0) || !(s.ropeTheta > 0)) fail("model.normEps and model.ropeTheta must be positive");
}

std::vector<HfTensor> hfTensors(const std::vector<UnitLayout>& layout, const ModelShape& s) {
  checkExpressible(s);
  auto expected = expectedHfShapes(s);
  std::vector<HfTensor> out;
  std::set<std::string> produced;
  int64_t layer = 0;
  for (size_t u = 0; u < layout.size(); ++u) {
    const UnitLayout& unit = layout[u];
    for (const ParamSpec& p : unit.params) {
      const NameRule* rule = nullptr;
      for (const auto& r : nameTable())
        if (r.kind == unit.kind && r.param == p.name) rule = &r;
      if (!rule)
        throw ExportError("unit " + unit.name + " parameter \"" + p.name +
                          "\" has no Hugging Face name: add a row to nameTable() in runtime/src/export/hf_export.cpp");
      const int64_t parts = static_cast<int64_t>(rule->hf.size());
      if (p.shape.empty() || p.shape[0] % parts != 0)
        throw ExportError("unit " + unit.name + " parameter " + p.name + " of shape " + shapeText(p.shape) +
                          " does not split into " + std::to_string(parts) + " equal parts");
      const int64_t rows = p.shape[0] / parts, rowNumel = p.numel / p.shape[0];
      for (int64_t k = 0; k < parts; ++k) {
        HfTensor t;
        t.name = withLayer(rule->hf[k], layer);
        t.unit = static_cast<int>(u);
        t.param = p.name;
        t.shape = p.shape;
        t.shape[0] = rows;
        t.numel = rows * rowNumel;
        t.offset = p.offset + k * t.numel;
        auto e = expected.find(t.name);
        if (e == expected.end())
          throw ExportError("unit " + unit.name + " parameter " + p.name + " maps to " + t.name +
                            ", which LlamaForCausalLM with " + std::to_string(s.layers) + " layers does not have");
        if (e->second != t.shape)
          throw ExportError(t.name + " (unit " + unit.name + " parameter " + p.name + ") has shape " +
                            shapeText(t.shape) + ", LlamaForCausalLM expects " + shapeText(e->second));
        if (!produced.insert(t.name).second)
          throw ExportError(t.name + " produced twice (unit " + unit.name + ", parameter " + p.name + ")");
        out.push_back(std::move(t));
      }
    }
    if (unit.kind == UnitKind::Block) ++layer;
  }
  for (const auto& [name, shape] : expected)
    if (!produced.count(name))
      throw ExportError("no parameter of the model layout maps to " + name + " " + shapeText(shape));
  return out;
}

json configJson(const ModelShape& s, int64_t maxPositions, const std::string& torchDtype) {
  checkExpressible(s);
  return {
      {"architectures", {"LlamaForCausalLM"}},
      {"model_type", "llama"},
      {"vocab_size", s.vocab},
      {"hidden_size", s.dim},
      {"intermediate_size", s.ffn},
      {"num_hidden_layers", s.layers},
      {"num_attention_heads", s.heads},
      {"num_key_value_heads", s.heads},
      {"head_dim", s.headDim()},
      {"hidden_act", "silu"},
      {"max_position_embeddings", maxPositions},
      {"rms_norm_eps", s.normEps},
      {"rope_theta", s.ropeTheta},
      {"rope_scaling", nullptr},
      {"attention_bias", false},
      {"attention_dropout", 0.0},
      {"mlp_bias", false},
      {"tie_word_embeddings", false},
      {"initializer_range", s.initStd},
      {"pretraining_tp", 1},
      {"use_cache", true},
      // Byte-level vocabulary: no special tokens (HF's defaults 1 and 2 are bytes here).
      {"bos_token_id", nullptr},
      {"eos_token_id", nullptr},
      {"torch_dtype", torchDtype},
  };
}

ModelShape shapeFromConfigJson(const json& j, const std::string& what) {
  auto bad = [&](const std::string& why) { return ExportError(what + ": " + why); };
  if (!j.is_object()) throw bad("not a JSON object");
  if (j.contains("model_type") && j["model_type"] != "llama")
    throw bad("model_type is " + j["model_type"].dump() + ", expected \"llama\"");
  auto integer = [&](const char* k) -> int64_t {
    if (!j.contains(k) || !j[k].is_number_integer()) throw bad(std::string(k) + " missing or not an integer");
    return j[k].get<int64_t>();
  };
  auto number = [&](const char* k, double def) -> double {
    if (!j.contains(k)) return def;
    if (!j[k].is_number()) throw bad(std::string(k) + " is not a number");
    return j[k].get<double>();
  };
  ModelShape s{};
  s.vocab = integer("vocab_size");
  s.dim = integer("hidden_size");
  s.ffn = integer("intermediate_size");
  s.layers = integer("num_hidden_layers");
  s.heads = integer("num_attention_heads");
  // transformers' LlamaConfig defaults where a key may be absent.
  s.normEps = number("rms_norm_eps", 1e-6);
  s.ropeTheta = number("rope_theta", 10000.0);
  s.initStd = number("initializer_range", 0.02);
  if (j.contains("num_key_value_heads") && !j["num_key_value_heads"].is_null() &&
      j["num_key_value_heads"] != s.heads)
    throw bad("num_key_value_heads " + j["num_key_value_heads"].dump() +
              " differs from num_attention_heads: grouped-query attention is not this model");
  if (j.contains("head_dim") && !j["head_dim"].is_null() && s.heads > 0 && j["head_dim"] != s.dim / s.heads)
    throw bad("head_dim " + j["head_dim"].dump() + " is not hidden_size / num_attention_heads");
  if (j.value("tie_word_embeddings", false)) throw bad("tie_word_embeddings is true; this model's head is untied");
  if (j.value("attention_bias", false) || j.value("mlp_bias", false)) throw bad("biases are not part of this model");
  if (j.value("hidden_act", std::string("silu")) != "silu") throw bad("hidden_act must be silu");
  if (j.contains("rope_scaling") && !j["rope_scaling"].is_null()) throw bad("rope_scaling is not supported");
  try {
    checkExpressible(s);
  } catch (const ExportError& e) {
    throw bad(e.what());
  }
  return s;
}

// ---- Checkpoint side ----

namespace {

double meta(const NamedTensors& t, const std::string& key, const std::string& file) {
  auto it = t.find(key);
  if (it == t.end() || it->second.numel() != 1)
    throw ExportError(file + ": no " + key + " (not an edit-train rank file, or a version this tool does not know)");
  return it->second.to(torch::kFloat64).item<double>();
}

std::string describeSteps(const std::string& root) {
  std::string s;
  for (auto step : completeCheckpointSteps(root)) s += (s.empty() ? "" : ", ") + std::to_string(step);
  return s.empty() ? "none" : s;
}

// The step directory to read: the one given, the --step asked for, or the newest complete.
std::string resolveStepDir(const Source& src) {
  const fs::path root(src.checkpoint);
  std::error_code ec;
  if (!fs::is_directory(root, ec)) throw ExportError(src.checkpoint + ": no such checkpoint directory");
  if (fs::exists(root / "MANIFEST")) return root.string();
  if (src.step >= 0) {
    std::string stepDir = stepDirName(root.string(), src.step);
    if (!fs::exists(fs::path(stepDir) / "MANIFEST"))
      throw ExportError(stepDir + ": no complete checkpoint at step " + std::to_string(src.step) +
                        " (no MANIFEST); complete steps: " + describeSteps(root.string()));
    return stepDir;
  }
  const auto steps = completeCheckpointSteps(root.string());
  if (steps.empty())
    throw ExportError(src.checkpoint + ": no complete checkpoint (no step-*/MANIFEST); pass checkpoint.dir "
                      "or one step-XXXXXXXX directory");
  return stepDirName(root.string(), steps.front());
}

// Whether to export the outer (synchronized) weights rather than the replica's own.
bool exportOuter(Weights w, bool hasOuter, const std::string& stepDir) {
  switch (w) {
    case Weights::Outer:
      if (!hasOuter)
        throw ExportError(stepDir + ": holds no outer weights (saved during warm-up or in ddp mode); "
                          "use --weights replica");
      return true;
    case Weights::Replica: return false;
    case Weights::Auto: return hasOuter;
  }
  return hasOuter;
}

}  // namespace

Model loadCheckpoint(const Source& src, const std::function<void(const std::string&)>& log) {
  const std::string stepDir = resolveStepDir(src);
  const Manifest man = readManifest(stepDir);
  const std::string manifestPath = (fs::path(stepDir) / "MANIFEST").string();
  if (src.step >= 0 && man.step != src.step)
    throw ExportError(stepDir + " is the checkpoint of step " + std::to_string(man.step) + ", not --step " +
                      std::to_string(src.step) + " (pass checkpoint.dir with --step, or the step directory alone)");

  Model m;
  try {
    m.cfg = parseConfig(man.configYaml);
    validate(m.cfg);
  } catch (const ConfigError& e) {
    throw ExportError(manifestPath + ": the configuration in it is invalid: " + e.what());
  }
  m.shape = shapeOf(m.cfg.model);
  checkExpressible(m.shape);
  m.layout = modelLayout(m.shape);
  hfTensors(m.layout, m.shape);  // refuse an unexpressible layout before reading gigabytes

  for (int r = 0; r < man.world; ++r)
    if (!fs::exists(rankFileName(stepDir, r)))
      throw ExportError(rankFileName(stepDir, r) + ": missing; the checkpoint is incomplete (use another --step)");

  // Verified against the manifest, then read: a file that is intact but from another
  // checkpoint (same name, other run) is refused too.
  auto readRank = [&](int r) {
    const std::string file = rankFileName(stepDir, r);
    if (verifyCheckpointFile(file) != man.crcs[r])
      throw CheckpointError(file + ": does not match the checksum in " + manifestPath +
                            " (corrupt, or from another checkpoint); use another --step");
    return readCheckpointFile(file);
  };

  NamedTensors first = readRank(0);
  const std::string firstFile = rankFileName(stepDir, 0);
  const int N = static_cast<int>(meta(first, "meta/shards", firstFile));
  if (N <= 0 || man.world % N != 0 || meta(first, "meta/world", firstFile) != man.world)
    throw ExportError(firstFile + ": meta/shards " + std::to_string(N) + " and the manifest's world " +
                      std::to_string(man.world) + " do not form an M x N mesh");
  const int M = man.world / N;
  if (src.replica < 0 || src.replica >= M)
    throw ExportError("--replica " + std::to_string(src.replica) + ": the checkpoint has replicas 0.." +
                      std::to_string(M - 1));
  const double params = static_cast<double>(parameterCount(m.shape));
  if (meta(first, "meta/params", firstFile) != params)
    throw ExportError(firstFile + ": holds " + std::to_string(static_cast<int64_t>(meta(first, "meta/params", firstFile))) +
                      " parameters, but the configuration in the MANIFEST describes " +
                      std::to_string(static_cast<int64_t>(params)));
  const bool hasOuter = meta(first, "meta/outerReady", firstFile) > 0 && first.count("unit0/outer");
  const bool outer = exportOuter(src.weights, hasOuter, stepDir);
  const std::string key = outer ? "outer" : "theta";
  if (log)
    log("reading " + stepDir + " (" + std::to_string(M) + " x " + std::to_string(N) + "): " +
        (outer ? "outer (synchronized) weights" : "local weights") + " of replica " + std::to_string(src.replica));

  const size_t U = m.layout.size();
  std::vector<torch::Tensor> full(U);
  std::vector<int64_t> chunk(U);
  for (size_t u = 0; u < U; ++u) {
    chunk[u] = (m.layout[u].numel + N - 1) / N;  // flat_units.h: padded to a multiple of N
    full[u] = torch::empty({chunk[u] * N}, torch::kFloat32);
  }
  for (int s = 0; s < N; ++s) {
    const int r = src.replica * N + s;
    const std::string file = rankFileName(stepDir, r);
    NamedTensors t = r == 0 ? std::move(first) : readRank(r);
    if (meta(t, "meta/shards", file) != N)
      throw ExportError(file + ": meta/shards differs from rank 0's; the checkpoint mixes runs");
    if (t.count("unit" + std::to_string(U) + "/theta") || !t.count("unit" + std::to_string(U - 1) + "/theta"))
      throw ExportError(file + ": its number of units differs from the " + std::to_string(U) +
                        " of the configuration in the MANIFEST");
    for (size_t u = 0; u < U; ++u) {
      const std::string k = "unit" + std::to_string(u) + "/" + key;
      auto it = t.find(k);
      if (it == t.end()) throw ExportError(file + ": no " + k + "; use --weights replica");
      const auto& v = it->second;
      if (v.scalar_type() != torch::kFloat32 || v.dim() != 1 || v.size(0) != chunk[u])
        throw ExportError(file + ": " + k + " has " + std::to_string(v.numel()) + " values, expected a float32 slice of " +
                          std::to_string(chunk[u]) + " (unit " + m.layout[u].name + " over " + std::to_string(N) +
                          " shards): the file does not match the configuration in the MANIFEST");
      full[u].narrow(0, s * chunk[u], chunk[u]).copy_(v);
    }
    if (s == 0)
      m.provenance["edit.step"] = std::to_string(static_cast<int64_t>(meta(t, "meta/step", file)));
  }
  for (size_t u = 0; u < U; ++u) m.units.push_back(full[u].narrow(0, 0, m.layout[u].numel).clone());

  m.provenance["edit.checkpoint"] = fs::absolute(stepDir).lexically_normal().string();
  m.provenance["edit.checkpoint_id"] = std::to_string(man.step);
  m.provenance["edit.weights"] = key == "outer" ? "outer" : "replica";
  m.provenance["edit.replica"] = std::to_string(src.replica);
  m.provenance["edit.mesh"] = std::to_string(M) + "x" + std::to_string(N);
  m.provenance["edit.config"] = man.configYaml;
  return m;
}

// ---- Exported directory ----

namespace {

void fsyncPath(const fs::path& p) {
  if (int fd = ::open(p.c_str(), O_RDONLY | O_DIRECTORY); fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

fs::path normalized(const std::string& p) {
  fs::path a = fs::absolute(p).lexically_normal();
  if (a.filename().empty()) a = a.parent_path();  // "out/" -> "out"
  return a;
}

// True when `inner` is `outer` or lies below it.
bool within(const fs::path& inner, const fs::path& outer) {
  auto i = inner.begin();
  for (auto o = outer.begin(); o != outer.end(); ++o, ++i)
    if (i == inner.end() || *i != *o) return false;
  return true;
}

// A killed export leaves ".NAME.export-tmp-PID" (or "-old-PID") next to NAME; remove the
// ones whose process is gone, so repeated attempts (a retried pod) do not pile them up.
void removeStaleSiblings(const fs::path& parent, const std::string& name) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(parent, ec)) {
    const std::string n = e.path().filename().string();
    for (const std::string prefix : {"." + name + ".export-tmp-", "." + name + ".export-old-"}) {
      if (n.rfind(prefix, 0) != 0) continue;
      const std::string pid = n.substr(prefix.size());
      if (pid.empty() || pid.find_first_not_of("0123456789") != std::string::npos) continue;
      const long p = std::stol(pid);
      if (p != ::getpid() && ::kill(static_cast<pid_t>(p), 0) != 0 && errno == ESRCH) fs::remove_all(e.path(), ec);
    }
  }
}

}  // namespace

ExportResult exportModel(const Model& m, const ExportOptions& o) {
  if (o.out.empty()) throw ExportError("--out: an output directory is required");
  const auto tensors = hfTensors(m.layout, m.shape);
  for (size_t u = 0; u < m.units.size(); ++u)
    if (!torch::isfinite(m.units[u]).all().item<bool>())
      throw ExportError("unit " + m.layout[u].name + " holds NaN or Inf: the weights diverged; export an earlier "
                        "checkpoint (--step)");

  const fs::path out = normalized(o.out);
  if (!o.protect.empty() && within(normalized(o.protect), out))
    throw ExportError(out.string() + ": the output would contain (and --force would delete) the checkpoint " +
                      o.protect + "; choose another --out");
  std::error_code ec;
  if (fs::exists(fs::symlink_status(out, ec)) && !o.force)
    throw ExportError(out.string() + ": exists; pass --force to replace it");
  const fs::path parent = out.parent_path();
  fs::create_directories(parent);
  const std::string pid = std::to_string(::getpid());
  const fs::path tmp = parent / ("." + out.filename().string() + ".export-tmp-" + pid);
  const fs::path old = parent / ("." + out.filename().string() + ".export-old-" + pid);
  removeStaleSiblings(parent, out.filename().string());
  fs::remove_all(tmp);
  fs::create_directory(tmp);
  ExportResult res;
  try {
    std::vector<st::Item> items;
    for (const auto& t : tensors)
      items.push_back({t.name, m.units[t.unit].narrow(0, t.offset, t.numel).view(t.shape),
                       o.bf16 ? st::DType::BF16 : st::DType::F32});
    std::map<std::string, std::string> md = m.provenance;
    md["format"] = "pt";  // transformers refuses safetensors files without it
    md["edit.export"] = "edit-export v1";
    res.bytes = st::writeFile((tmp / "model.safetensors").string(), items, md);
    res.tensors = items.size();
    try {
      writeFileAtomic((tmp / "config.json").string(),
                      configJson(m.shape, m.cfg.data.seqLen, o.bf16 ? "bfloat16" : "float32").dump(2) + "\n");
    } catch (const CheckpointError& e) {
      throw std::runtime_error(e.what());  // an I/O failure, not a refusal
    }
    fsyncPath(tmp);
    if (fs::exists(fs::symlink_status(out, ec))) fs::rename(out, old);
    fs::rename(tmp, out);
    fsyncPath(parent);
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
  fs::remove_all(old, ec);
  res.modelPath = (out / "model.safetensors").string();
  res.configPath = (out / "config.json").string();
  return res;
}

Model loadExport(const std::string& dir) {
  const std::string cfgPath = (fs::path(dir) / "config.json").string();
  const std::string modelPath = (fs::path(dir) / "model.safetensors").string();
  std::ifstream in(cfgPath);
  if (!in) throw ExportError(cfgPath + ": cannot open (is " + dir + " an edit-export output?)");
  json j;
  try {
    j = json::parse(in);
  } catch (const json::exception& e) {
    throw ExportError(cfgPath + ": not valid JSON: " + e.what());
  }
  Model m;
  m.shape = shapeFromConfigJson(j, cfgPath);
  m.layout = modelLayout(m.shape);
  std::map<std::string, torch::Tensor> file;
  const st::Header h = st::readFile(modelPath, file);
  m.provenance = h.metadata;
  if (auto it = h.metadata.find("edit.config"); it != h.metadata.end()) {
    try {
      m.cfg = parseConfig(it->second);
    } catch (const ConfigError& e) {
      throw ExportError(modelPath + ": __metadata__ edit.config is invalid: " + e.what());
    }
  }
  m.cfg.data.seqLen = j.value("max_position_embeddings", m.cfg.data.seqLen);
  for (const auto& u : m.layout) m.units.push_back(torch::zeros({u.numel}, torch::kFloat32));
  std::set<std::string> used;
  for (const auto& t : hfTensors(m.layout, m.shape)) {
    auto it = file.find(t.name);
    if (it == file.end()) throw ExportError(modelPath + ": no tensor " + t.name);
    const auto& v = it->second;
    if (std::vector<int64_t>(v.sizes().begin(), v.sizes().end()) != t.shape)
      throw ExportError(modelPath + ": " + t.name + " has shape " + shapeText({v.sizes().begin(), v.sizes().end()}) +
                        ", config.json implies " + shapeText(t.shape));
    if (!v.is_floating_point()) throw ExportError(modelPath + ": " + t.name + " is not floating point");
    m.units[t.unit].narrow(0, t.offset, t.numel).copy_(v.reshape({-1}).to(torch::kFloat32));
    used.insert(t.name);
  }
  for (const auto& [name, v] : file)
    if (!used.count(name)) throw ExportError(modelPath + ": unexpected tensor " + name);
  return m;
}

// ---- Forward ----

namespace {

torch::Tensor headParam(const Model& m, size_t u, const std::string& name) {
  const auto& l = m.layout[u];
  for (const auto& p : l.params)
    if (p.name == name) return m.units[u].narrow(0, p.offset, p.numel).view(p.shape);
  throw ExportError("unit " + l.name + " has no parameter " + name);
}

torch::Tensor hidden(const Model& m, const torch::Tensor& tokens) {
  const Rope rope = makeRope(m.shape, tokens.size(1));
  torch::Tensor h;
  for (size_t u = 0; u < m.layout.size(); ++u) {
    const auto p = parameterViews(m.layout[u], m.units[u]);
    if (m.layout[u].kind == UnitKind::Embedding) h = embedForward(p, tokens);
    else if (m.layout[u].kind == UnitKind::Block) h = blockForward(p, h, rope, m.shape);
  }
  return h;
}

}  // namespace

torch::Tensor logits(const Model& m, const torch::Tensor& tokens) {
  torch::NoGradGuard ng;
  const size_t head = m.layout.size() - 1;
  // headLoss's own computation before its cross-entropy (model.cpp).
  return torch::linear(rmsNorm(hidden(m, tokens), headParam(m, head, "norm"), m.shape.normEps),
                       headParam(m, head, "output"));
}

namespace {
data::TokenFile openVal(const std::string& valFile, int64_t vocab) {
  if (valFile.empty()) throw ExportError("no validation data: pass --val FILE (data.val is empty)");
  auto f = data::TokenFile::open(valFile);
  if (f.maxToken() >= static_cast<uint64_t>(vocab))
    throw ExportError(valFile + ": token id " + std::to_string(f.maxToken()) + " does not fit vocab_size " +
                      std::to_string(vocab));
  return f;
}
// trainer.cpp's validation sampler: seed ^ 0x5eed, one stream per rank.
constexpr uint64_t kValSeedSalt = 0x5eed;
}  // namespace

std::pair<torch::Tensor, torch::Tensor> validationBatch(const std::string& valFile, int64_t batchSize,
                                                        int64_t seqLen, uint64_t seed, int64_t vocab) {
  const auto f = openVal(valFile, vocab);
  data::BatchSampler sampler(f, seqLen, batchSize, seed ^ kValSeedSalt, 0);
  auto in = torch::empty({batchSize, seqLen}, torch::kInt64);
  auto tg = torch::empty({batchSize, seqLen}, torch::kInt64);
  sampler.fill(0, in.data_ptr<int64_t>(), tg.data_ptr<int64_t>());
  return {in, tg};
}

double validationLoss(const Model& m, const std::string& valFile, int streams, int64_t batches,
                      int64_t batchSize, int64_t seqLen, uint64_t seed) {
  torch::NoGradGuard ng;
  const auto f = openVal(valFile, m.shape.vocab);
  auto in = torch::empty({batchSize, seqLen}, torch::kInt64);
  auto tg = torch::empty({batchSize, seqLen}, torch::kInt64);
  const auto headParams = parameterViews(m.layout.back(), m.units.back());
  double sum = 0;
  for (int r = 0; r < streams; ++r) {
    data::BatchSampler sampler(f, seqLen, batchSize, seed ^ kValSeedSalt, static_cast<uint64_t>(r));
    for (int64_t b = 0; b < batches; ++b) {
      sampler.fill(static_cast<uint64_t>(b), in.data_ptr<int64_t>(), tg.data_ptr<int64_t>());
      sum += headLoss(headParams, hidden(m, in), tg, m.shape).item<double>();
    }
  }
  return sum / static_cast<double>(streams * batches);
}

}  // namespace edit::hf
