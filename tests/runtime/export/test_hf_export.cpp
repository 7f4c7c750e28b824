// edit-export's model side: the Hugging Face name table and config.json, gathering a
// synthetic M x N checkpoint (outer weights or one replica's shards), the refusals of
// corrupt or incomplete checkpoints, and the written model (atomic, exact read-back,
// logits equal to the model's own).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <limits>
#include <map>

#include "export/hf_export.h"
#include "export/safetensors.h"
#include "export_test_util.h"
#include "train/checkpoint.h"

using namespace edit;
using namespace edit::test;
namespace fs = std::filesystem;
using nlohmann::json;

// ---- Hugging Face names ----

namespace {
ModelShape smallShape(int64_t layers = 2) {
  ModelShape s{};
  s.vocab = 19;
  s.dim = 8;
  s.layers = layers;
  s.heads = 2;
  s.ffn = 12;
  s.ropeTheta = 10000;
  s.normEps = 1e-5;
  s.initStd = 0.02;
  return s;
}

UnitLayout unitOf(const std::string& name, UnitKind kind,
                  std::vector<std::pair<std::string, std::vector<int64_t>>> params) {
  UnitLayout u{name, kind, {}, 0};
  for (auto& [n, shape] : params) {
    ParamSpec p;
    p.name = n;
    p.shape = shape;
    p.numel = 1;
    for (auto d : shape) p.numel *= d;
    p.offset = u.numel;
    u.numel += p.numel;
    u.params.push_back(p);
  }
  return u;
}
}  // namespace

TEST(HfNames, EveryParameterOfTheLayoutHasItsLlamaName) {
  const auto s = smallShape(2);
  const auto layout = modelLayout(s);
  const auto t = hf::hfTensors(layout, s);
  // Written out from transformers' LlamaForCausalLM state_dict, in forward order.
  std::vector<std::pair<std::string, std::vector<int64_t>>> want = {{"model.embed_tokens.weight", {19, 8}}};
  for (int l = 0; l < 2; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    want.push_back({p + "input_layernorm.weight", {8}});
    want.push_back({p + "self_attn.q_proj.weight", {8, 8}});
    want.push_back({p + "self_attn.k_proj.weight", {8, 8}});
    want.push_back({p + "self_attn.v_proj.weight", {8, 8}});
    want.push_back({p + "self_attn.o_proj.weight", {8, 8}});
    want.push_back({p + "post_attention_layernorm.weight", {8}});
    want.push_back({p + "mlp.gate_proj.weight", {12, 8}});
    want.push_back({p + "mlp.up_proj.weight", {12, 8}});
    want.push_back({p + "mlp.down_proj.weight", {8, 12}});
  }
  want.push_back({"model.norm.weight", {8}});
  want.push_back({"lm_head.weight", {19, 8}});
  ASSERT_EQ(t.size(), want.size());
  for (size_t i = 0; i < t.size(); ++i) {
    EXPECT_EQ(t[i].name, want[i].first);
    EXPECT_EQ(t[i].shape, want[i].second) << t[i].name;
  }
  // Offsets are modelLayout()'s: each tensor lies inside one ParamSpec (a stacked one,
  // wqkv or w13, is split by rows), and the tensors of a ParamSpec tile it exactly.
  std::map<std::pair<int, std::string>, int64_t> covered;
  for (const auto& x : t) {
    const auto& u = layout[x.unit];
    bool found = false;
    for (const auto& p : u.params)
      if (p.name == x.param) {
        EXPECT_GE(x.offset, p.offset) << x.name;
        EXPECT_LE(x.offset + x.numel, p.offset + p.numel) << x.name;
        covered[{static_cast<int>(x.unit), p.name}] += x.numel;
        found = true;
      }
    EXPECT_TRUE(found) << x.name;
  }
  for (size_t u = 0; u < layout.size(); ++u)
    for (const auto& p : layout[u].params)
      EXPECT_EQ((covered[{static_cast<int>(u), p.name}]), p.numel) << layout[u].name << " " << p.name;
}

TEST(HfNames, FusedParametersSplitByRowsInTableOrder) {
  const auto s = smallShape(1);
  const int64_t d = s.dim, f = s.ffn;
  std::vector<UnitLayout> layout = {
      unitOf("embed", UnitKind::Embedding, {{"tok_embeddings", {s.vocab, d}}}),
      unitOf("block.0", UnitKind::Block,
             {{"attn_norm", {d}}, {"wqkv", {3 * d, d}}, {"wo", {d, d}}, {"ffn_norm", {d}},
              {"w13", {2 * f, d}}, {"w2", {d, f}}}),
      unitOf("head", UnitKind::Head, {{"norm", {d}}, {"output", {s.vocab, d}}})};
  std::map<std::string, hf::HfTensor> byName;
  for (const auto& x : hf::hfTensors(layout, s)) byName[x.name] = x;
  const int64_t qkv = d;  // attn_norm comes first
  EXPECT_EQ(byName.at("model.layers.0.self_attn.q_proj.weight").offset, qkv);
  EXPECT_EQ(byName.at("model.layers.0.self_attn.k_proj.weight").offset, qkv + d * d);
  EXPECT_EQ(byName.at("model.layers.0.self_attn.v_proj.weight").offset, qkv + 2 * d * d);
  EXPECT_EQ(byName.at("model.layers.0.self_attn.v_proj.weight").shape, (std::vector<int64_t>{d, d}));
  const int64_t w13 = d + 3 * d * d + d * d + d;
  EXPECT_EQ(byName.at("model.layers.0.mlp.gate_proj.weight").offset, w13);
  EXPECT_EQ(byName.at("model.layers.0.mlp.up_proj.weight").offset, w13 + f * d);
  EXPECT_EQ(byName.size(), 12u);
}

TEST(HfNames, LayoutsTheFormatCannotExpressAreRefused) {
  const auto s = smallShape(1);
  auto layout = modelLayout(s);
  layout[1].params[1].name = "wx";
  EXPECT_ERROR(hf::ExportError, hf::hfTensors(layout, s), "parameter \"wx\" has no Hugging Face name");

  layout = modelLayout(s);
  layout[1] = unitOf("block.0", UnitKind::Block,
                     {{"attn_norm", {s.dim}}, {"wq", {s.dim, s.dim + 2}}, {"wk", {s.dim, s.dim}},
                      {"wv", {s.dim, s.dim}}, {"wo", {s.dim, s.dim}}, {"ffn_norm", {s.dim}},
                      {"w1", {s.ffn, s.dim}}, {"w3", {s.ffn, s.dim}}, {"w2", {s.dim, s.ffn}}});
  EXPECT_ERROR(hf::ExportError, hf::hfTensors(layout, s), "LlamaForCausalLM expects [8, 8]");

  layout = modelLayout(s);
  layout[1].params.pop_back();  // no w2
  EXPECT_ERROR(hf::ExportError, hf::hfTensors(layout, s), "maps to model.layers.0.mlp.down_proj.weight");

  layout = modelLayout(s);
  layout[1] = unitOf("block.0", UnitKind::Block, {{"wqkv", {3 * s.dim + 1, s.dim}}});
  EXPECT_ERROR(hf::ExportError, hf::hfTensors(layout, s), "does not split into 3 equal parts");

  auto odd = smallShape(1);
  odd.dim = 6;  // head dimension 3
  EXPECT_ERROR(hf::ExportError, hf::checkExpressible(odd), "head dimension 3 is odd");
  auto indivisible = smallShape(1);
  indivisible.heads = 3;
  EXPECT_ERROR(hf::ExportError, hf::checkExpressible(indivisible), "does not divide");
}

TEST(HfConfig, ConfigJsonRoundTripsAndRefusesOtherLlamas) {
  const auto s = smallShape(3);
  const json j = hf::configJson(s, 64, "float32");
  EXPECT_EQ(j["architectures"], json({"LlamaForCausalLM"}));
  EXPECT_EQ(j["hidden_size"], 8);
  EXPECT_EQ(j["intermediate_size"], 12);
  EXPECT_EQ(j["num_attention_heads"], 2);
  EXPECT_EQ(j["num_key_value_heads"], 2);
  EXPECT_EQ(j["num_hidden_layers"], 3);
  EXPECT_EQ(j["vocab_size"], 19);
  EXPECT_EQ(j["tie_word_embeddings"], false);
  EXPECT_EQ(j["max_position_embeddings"], 64);
  EXPECT_DOUBLE_EQ(j["rms_norm_eps"].get<double>(), 1e-5);
  EXPECT_DOUBLE_EQ(j["rope_theta"].get<double>(), 10000);
  const auto back = hf::shapeFromConfigJson(json::parse(j.dump()), "config.json");
  EXPECT_EQ(back.vocab, s.vocab);
  EXPECT_EQ(back.dim, s.dim);
  EXPECT_EQ(back.layers, s.layers);
  EXPECT_EQ(back.heads, s.heads);
  EXPECT_EQ(back.ffn, s.ffn);
  EXPECT_DOUBLE_EQ(back.normEps, s.normEps);
  EXPECT_DOUBLE_EQ(back.ropeTheta, s.ropeTheta);
  auto with = [&](const char* k, json v) {
    json c = j;
    c[k] = v;
    return c;
  };
  EXPECT_ERROR(hf::ExportError, hf::shapeFromConfigJson(with("num_key_value_heads", 1), "c.json"), "grouped-query");
  EXPECT_ERROR(hf::ExportError, hf::shapeFromConfigJson(with("tie_word_embeddings", true), "c.json"), "untied");
  EXPECT_ERROR(hf::ExportError, hf::shapeFromConfigJson(with("rope_scaling", {{"type", "linear"}}), "c.json"),
               "rope_scaling");
  EXPECT_ERROR(hf::ExportError, hf::shapeFromConfigJson(with("model_type", "mistral"), "c.json"), "model_type");
  EXPECT_ERROR(hf::ExportError, hf::shapeFromConfigJson(with("hidden_size", "8"), "c.json"), "hidden_size");
  EXPECT_ERROR(hf::ExportError, hf::shapeFromConfigJson(with("head_dim", 2), "c.json"),
               "head_dim 2 is not hidden_size / num_attention_heads");
}

// ---- Checkpoints ----

namespace {

// A synthetic checkpoint written with the trainer's file format and key names
// (trainer_checkpoint.cpp): unit values are known, so the gather can be checked exactly.
struct FakeCheckpoint {
  std::string root;
  Config cfg;
  int M = 2, N = 3;
  std::vector<std::vector<torch::Tensor>> theta;  // [replica][unit] full [numel]
  std::vector<torch::Tensor> outer;               // [unit]

  FakeCheckpoint(int64_t step, bool withOuter, int M_ = 2, int N_ = 3) : M(M_), N(N_) {
    root = tempDir("edit-export-ckpt");
    cfg.model.preset = "custom";
    cfg.model.vocabSize = 19;  // numels not divisible by 3: the last chunk is padded
    cfg.model.dim = 8;
    cfg.model.layers = 2;
    cfg.model.heads = 2;
    cfg.model.ffnDim = 12;
    cfg.data.seqLen = 16;
    write(step, withOuter);
  }
  void write(int64_t step, bool withOuter) {
    const auto s = shapeOf(cfg.model);
    const auto layout = modelLayout(s);
    theta.assign(M, {});
    outer.clear();
    for (auto& u : layout) outer.push_back(torch::randn({u.numel}));
    for (int m = 0; m < M; ++m)
      for (auto& u : layout) theta[m].push_back(torch::randn({u.numel}));
    const std::string dir = stepDirName(root, step);
    fs::create_directories(dir);
    Manifest man;
    man.step = step;
    man.world = M * N;
    man.configYaml = toYaml(cfg);
    for (int r = 0; r < M * N; ++r) {
      const int m = r / N, sh = r % N;
      NamedTensors t;
      auto one = [](double v) { return torch::full({1}, v, torch::kFloat64); };
      t["meta/step"] = one(step);
      t["meta/world"] = one(M * N);
      t["meta/shards"] = one(N);
      t["meta/params"] = one(static_cast<double>(parameterCount(s)));
      t["meta/outerReady"] = one(withOuter ? 1 : 0);
      for (size_t u = 0; u < layout.size(); ++u) {
        const int64_t chunk = (layout[u].numel + N - 1) / N;
        auto slice = [&](const torch::Tensor& full) {
          auto padded = torch::full({chunk * N}, 777.0f);  // padding never exported
          padded.narrow(0, 0, full.numel()).copy_(full);
          return padded.narrow(0, sh * chunk, chunk).clone();
        };
        const std::string k = "unit" + std::to_string(u) + "/";
        t[k + "theta"] = slice(theta[m][u]);
        t[k + "adam_m"] = torch::zeros({chunk});
        if (withOuter) t[k + "outer"] = slice(outer[u]);
      }
      man.crcs.push_back(writeCheckpointFile(rankFileName(dir, r), t));
    }
    writeManifest(dir, man);
  }
  std::string stepDir(int64_t step) const { return stepDirName(root, step); }
  ~FakeCheckpoint() { fs::remove_all(root); }
};

void expectUnits(const hf::Model& m, const std::vector<torch::Tensor>& want) {
  ASSERT_EQ(m.units.size(), want.size());
  for (size_t u = 0; u < want.size(); ++u) EXPECT_TRUE(torch::equal(m.units[u], want[u])) << "unit " << u;
}

void flipByte(const std::string& path, size_t at) {
  std::string b = readFile(path);
  b[at] ^= 0x10;
  writeFile(path, b);
}

}  // namespace

TEST(ExportCheckpoint, GathersOuterWeightsOrOneReplicasShards) {
  FakeCheckpoint c(10, true);
  c.write(20, true);  // the newest complete step is the default
  hf::Source src;
  src.checkpoint = c.root;
  auto m = hf::loadCheckpoint(src);
  expectUnits(m, c.outer);
  EXPECT_EQ(m.provenance.at("edit.weights"), "outer");
  EXPECT_EQ(m.provenance.at("edit.step"), "20");
  EXPECT_EQ(m.provenance.at("edit.mesh"), "2x3");
  src.weights = hf::Weights::Replica;
  src.replica = 1;
  m = hf::loadCheckpoint(src);
  expectUnits(m, c.theta[1]);
  src.replica = 2;
  EXPECT_ERROR(hf::ExportError, hf::loadCheckpoint(src), "replicas 0..1");
  // A step directory directly, and --step.
  hf::Source one;
  one.checkpoint = c.stepDir(20);
  expectUnits(hf::loadCheckpoint(one), c.outer);
  one.step = 10;
  EXPECT_ERROR(hf::ExportError, hf::loadCheckpoint(one), "is the checkpoint of step 20, not --step 10");
  hf::Source missing;
  missing.checkpoint = c.root;
  missing.step = 15;
  EXPECT_ERROR(hf::ExportError, hf::loadCheckpoint(missing), "complete steps: 20");
}

TEST(ExportCheckpoint, WithoutOuterWeightsAutoTakesTheReplicaAndOuterIsRefused) {
  FakeCheckpoint c(5, false, 1, 4);
  hf::Source src;
  src.checkpoint = c.root;
  auto m = hf::loadCheckpoint(src);
  expectUnits(m, c.theta[0]);
  EXPECT_EQ(m.provenance.at("edit.weights"), "replica");
  src.weights = hf::Weights::Outer;
  EXPECT_ERROR(hf::ExportError, hf::loadCheckpoint(src), "holds no outer weights");
}

TEST(ExportCheckpoint, CorruptOrIncompleteCheckpointsAreRefused) {
  FakeCheckpoint c(7, true);
  hf::Source src;
  src.checkpoint = c.root;
  const std::string rank4 = rankFileName(c.stepDir(7), 4);
  {
    // A flipped byte inside a rank file of the replica being read.
    flipByte(rankFileName(c.stepDir(7), 1), 100);
    EXPECT_ERROR(CheckpointError, hf::loadCheckpoint(src), "rank-00001.ckpt: checksum mismatch");
  }
  c.write(7, true);
  {
    // Intact but not the file the manifest vouches for (another run's rank file).
    const std::string saved = readFile(rank4);
    FakeCheckpoint other(7, true);
    fs::copy_file(rankFileName(other.stepDir(7), 4), rank4, fs::copy_options::overwrite_existing);
    src.replica = 1;
    EXPECT_ERROR(CheckpointError, hf::loadCheckpoint(src), "rank-00004.ckpt: does not match the checksum");
    writeFile(rank4, saved);
    EXPECT_NO_THROW(hf::loadCheckpoint(src));
    src.replica = 0;
  }
  {
    // A rank file of another replica missing: incomplete even though replica 0 is intact.
    fs::rename(rank4, rank4 + ".away");
    EXPECT_ERROR(hf::ExportError, hf::loadCheckpoint(src), "rank-00004.ckpt: missing; the checkpoint is incomplete");
    fs::rename(rank4 + ".away", rank4);
  }
  {
    // No manifest: never complete.
    fs::rename(c.stepDir(7) + "/MANIFEST", c.stepDir(7) + "/M");
    EXPECT_ERROR(hf::ExportError, hf::loadCheckpoint(src), "no complete checkpoint");
    hf::Source direct;
    direct.checkpoint = c.stepDir(7);
    EXPECT_ERROR(hf::ExportError, hf::loadCheckpoint(direct), "no complete checkpoint");
    fs::rename(c.stepDir(7) + "/M", c.stepDir(7) + "/MANIFEST");
  }
  {
    // The manifest's configuration describes another model than the files hold.
    const std::string path = c.stepDir(7) + "/MANIFEST";
    const std::string saved = readFile(path);
    std::string edited = saved;
    const auto at = edited.find("layers: 2");
    ASSERT_NE(at, std::string::npos) << edited;
    edited.replace(at, 9, "layers: 3");
    writeFile(path, edited);
    EXPECT_ERROR(hf::ExportError, hf::loadCheckpoint(src), "configuration in the MANIFEST describes");
    writeFile(path, saved);
  }
  EXPECT_NO_THROW(hf::loadCheckpoint(src));
  hf::Source nowhere;
  nowhere.checkpoint = c.root + "/nope";
  EXPECT_ERROR(hf::ExportError, hf::loadCheckpoint(nowhere), "no such checkpoint directory");
}

// ---- The export ----

TEST(ExportModel, WritesAtomicallyRefusesExistingOutputAndReadsBackExactly) {
  FakeCheckpoint c(3, true);
  hf::Source src;
  src.checkpoint = c.root;
  const auto m = hf::loadCheckpoint(src);
  const auto base = tempDir("edit-export-out");
  hf::ExportOptions o;
  o.out = base + "/model";
  o.protect = m.provenance.at("edit.checkpoint");
  const auto res = hf::exportModel(m, o);
  EXPECT_EQ(res.tensors, 3u + 9u * 2u);
  EXPECT_EQ(res.bytes, fs::file_size(res.modelPath));
  // Only the output directory is left: no temporary or old directories.
  int entries = 0;
  for (auto it = fs::directory_iterator(base); it != fs::directory_iterator(); ++it) ++entries;
  EXPECT_EQ(entries, 1);

  auto back = hf::loadExport(o.out);
  expectUnits(back, c.outer);
  EXPECT_EQ(back.provenance.at("format"), "pt");
  EXPECT_EQ(back.provenance.at("edit.step"), "3");
  EXPECT_EQ(back.cfg.model.layers, 2);  // the training configuration travels in the metadata

  EXPECT_ERROR(hf::ExportError, hf::exportModel(m, o), "exists; pass --force");
  o.force = true;
  o.bf16 = true;
  const auto res2 = hf::exportModel(m, o);
  EXPECT_LT(res2.bytes, res.bytes);
  back = hf::loadExport(o.out);
  for (size_t u = 0; u < c.outer.size(); ++u)
    EXPECT_TRUE(torch::equal(back.units[u], c.outer[u].to(torch::kBFloat16).to(torch::kFloat32))) << u;
  entries = 0;
  for (auto it = fs::directory_iterator(base); it != fs::directory_iterator(); ++it) ++entries;
  EXPECT_EQ(entries, 1);

  // An output that would contain the checkpoint (and be deleted by --force) is refused.
  hf::ExportOptions inside;
  inside.out = c.root;
  inside.force = true;
  inside.protect = m.provenance.at("edit.checkpoint");
  EXPECT_ERROR(hf::ExportError, hf::exportModel(m, inside), "would contain");
  EXPECT_TRUE(fs::exists(c.stepDir(3) + "/MANIFEST"));
  fs::remove_all(base);
}

TEST(ExportModel, NonFiniteWeightsAreRefusedAndNothingIsWritten) {
  FakeCheckpoint c(3, true);
  hf::Source src;
  src.checkpoint = c.root;
  auto m = hf::loadCheckpoint(src);
  m.units[2][5] = std::numeric_limits<float>::quiet_NaN();
  const auto base = tempDir("edit-export-out");
  hf::ExportOptions o;
  o.out = base + "/model";
  EXPECT_ERROR(hf::ExportError, hf::exportModel(m, o), "unit block.1 holds NaN or Inf");
  EXPECT_TRUE(fs::is_empty(base));
  fs::remove_all(base);
}

TEST(ExportModel, ReadingBackRefusesMissingExtraOrMisshapenTensors) {
  FakeCheckpoint c(3, true);
  hf::Source src;
  src.checkpoint = c.root;
  const auto m = hf::loadCheckpoint(src);
  const auto base = tempDir("edit-export-out");
  hf::ExportOptions o;
  o.out = base + "/model";
  hf::exportModel(m, o);
  const std::string file = o.out + "/model.safetensors";
  std::map<std::string, torch::Tensor> t;
  const auto h = st::readFile(file, t);
  auto rewrite = [&](std::map<std::string, torch::Tensor> tensors) {
    std::vector<st::Item> items;
    for (auto& [k, v] : tensors) items.push_back({k, v, st::DType::F32});
    st::writeFile(file, items, h.metadata);
  };
  auto copy = t;
  copy.erase("lm_head.weight");
  rewrite(copy);
  EXPECT_ERROR(hf::ExportError, hf::loadExport(o.out), "no tensor lm_head.weight");
  copy = t;
  copy["model.layers.9.mlp.up_proj.weight"] = torch::zeros({1});
  rewrite(copy);
  EXPECT_ERROR(hf::ExportError, hf::loadExport(o.out), "unexpected tensor model.layers.9.mlp.up_proj.weight");
  copy = t;
  copy["model.norm.weight"] = torch::zeros({9});
  rewrite(copy);
  EXPECT_ERROR(hf::ExportError, hf::loadExport(o.out), "model.norm.weight has shape [9]");
  rewrite(t);
  EXPECT_NO_THROW(hf::loadExport(o.out));
  flipByte(o.out + "/config.json", 0);
  EXPECT_ERROR(hf::ExportError, hf::loadExport(o.out), "config.json: not valid JSON");
  fs::remove_all(base);
}

TEST(ExportModel, LogitsAgreeWithTheModelsOwnLoss) {
  // logits() re-assembles the head by parameter name; its cross-entropy must be headLoss's.
  FakeCheckpoint c(3, true);
  hf::Source src;
  src.checkpoint = c.root;
  auto m = hf::loadCheckpoint(src);
  for (auto& u : m.units) u.mul_(0.1);
  auto tokens = torch::randint(0, 19, {2, 5}, torch::kInt64);
  auto targets = torch::randint(0, 19, {2, 5}, torch::kInt64);
  auto lg = hf::logits(m, tokens);
  ASSERT_EQ(lg.sizes(), (std::vector<int64_t>{2, 5, 19}));
  auto ce = torch::nn::functional::cross_entropy(lg.reshape({-1, 19}), targets.reshape({-1})).item<double>();
  torch::NoGradGuard ng;
  auto h = embedForward(parameterViews(m.layout[0], m.units[0]), tokens);
  const auto rope = makeRope(m.shape, 5);
  for (size_t u = 1; u + 1 < m.layout.size(); ++u)
    h = blockForward(parameterViews(m.layout[u], m.units[u]), h, rope, m.shape);
  const double want = headLoss(parameterViews(m.layout.back(), m.units.back()), h, targets, m.shape).item<double>();
  EXPECT_NEAR(ce, want, 1e-6);
}
