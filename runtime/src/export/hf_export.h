// Export of a trained model to Hugging Face's LlamaForCausalLM layout (docs/export.md):
// gather the flat unit vectors from an edit-train checkpoint (any M x N), name each
// parameter the way transformers does, and write model.safetensors + config.json.
// Also the way back (an exported directory into flat units) and the project's own
// forward pass over flat units, for the logits and validation-loss checks.
//
// Conventions that make the mapping a pure renaming (no transposes, no permutations):
//  - every matrix is stored [out, in] and applied as torch::linear(x, W): nn.Linear's
//    layout, which is what HF stores;
//  - RoPE rotates the two halves of each head (x1 = dims [0, hd/2), x2 = [hd/2, hd)) with
//    inv_freq = theta^(-2i/hd): HF Llama's rotate_half convention. The permutation in HF's
//    convert_llama_weights_to_hf.py exists only for Meta's interleaved-pair checkpoints.
#pragma once

#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "worker_config.h"
#include "model/model.h"

namespace edit::hf {

// A refused export: a checkpoint that is incomplete or inconsistent, an output that
// exists, a model the format cannot express. Permanent (edit-export exits 2).
struct ExportError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// THE mapping table: one row per parameter name of a unit (model.h, modelLayout()).
// "{L}" stands for the block's layer index. A row with several Hugging Face names is a
// fused parameter: its rows (dim 0) split into equal parts, in the order listed. Offsets
// and shapes come from modelLayout(), never from here.
struct NameRule {
  UnitKind kind;
  std::string param;
  std::vector<std::string> hf;
};
const std::vector<NameRule>& nameTable();

// One Hugging Face tensor: rows [rowBegin, rowBegin + shape[0]) of parameter `param` of
// unit `unit`, i.e. `numel` values at `offset` in that unit's flat vector.
struct HfTensor {
  std::string name;
  int unit = 0;
  std::string param;
  std::vector<int64_t> shape;
  int64_t offset = 0, numel = 0;
};

// The Hugging Face tensors of a layout, in forward order. Throws ExportError for a
// parameter without a rule, a fused parameter that does not split evenly, or a shape
// other than what LlamaForCausalLM builds from config.json for this ModelShape.
std::vector<HfTensor> hfTensors(const std::vector<UnitLayout>& layout, const ModelShape& s);

// config.json of LlamaForCausalLM. maxPositions: the trained context (data.seqLen).
nlohmann::json configJson(const ModelShape& s, int64_t maxPositions, const std::string& torchDtype);
// The ModelShape of a config.json; ExportError for a Llama variant this model is not
// (grouped KV heads, tied embeddings, biases, RoPE scaling, another activation).
ModelShape shapeFromConfigJson(const nlohmann::json& j, const std::string& what);
// A model the safetensors/LlamaForCausalLM pair cannot express (ExportError): odd head
// dimension, heads not dividing dim, non-positive sizes.
void checkExpressible(const ModelShape& s);

// ---- From a checkpoint ----

enum class Weights { Auto, Outer, Replica };

struct Source {
  std::string checkpoint;       // checkpoint.dir (newest complete step) or one step-* dir
  int64_t step = -1;            // with a checkpoint.dir: this step instead of the newest
  Weights weights = Weights::Auto;  // Auto: the outer weights when saved, else replica's
  int replica = 0;              // whose shards to gather
};

struct Model {
  ModelShape shape{};
  std::vector<UnitLayout> layout;
  std::vector<torch::Tensor> units;  // per unit, [numel] float32
  Config cfg;                        // the training configuration (checkpoint MANIFEST)
  std::map<std::string, std::string> provenance;  // edit.* metadata: step, weights, ...
};

// Reads the checkpoint: the MANIFEST (must exist: a checkpoint without one is
// incomplete), the configuration in it, every rank file present, and the rank files of
// one replica checked against the manifest's CRC-32 before use. Throws
// CheckpointError/ExportError naming the file and what to do.
Model loadCheckpoint(const Source& src, const std::function<void(const std::string&)>& log = {});

// ---- To and from an exported directory ----

struct ExportOptions {
  std::string out;            // directory to create: model.safetensors + config.json
  bool bf16 = false;          // store BF16 instead of F32
  bool force = false;         // replace an existing `out`
  std::string protect;        // refuse an `out` equal to or containing this path (the checkpoint)
};

struct ExportResult {
  std::string modelPath, configPath;
  uint64_t bytes = 0;
  size_t tensors = 0;
};

// Writes `out` atomically: both files in a temporary sibling directory, fsynced, then
// renamed into place (with force, the old directory is moved away first and removed after).
// ExportError when out exists without force or the model is not expressible or not finite.
ExportResult exportModel(const Model& m, const ExportOptions& o);

// Reads an exported directory back into flat units (BF16 widened to float32). Every
// expected tensor must be present with its shape, and nothing else.
Model loadExport(const std::string& dir);

// ---- The project's forward pass over flat units (model.h) ----

// Logits [B, T, vocab] for tokens [B, T].
torch::Tensor logits(const Model& m, const torch::Tensor& tokens);
// Mean next-token cross-entropy over `batches` batches of each of `streams` validation
// streams: the batches edit-train's final validation pass uses (rank r's stream is r).
double validationLoss(const Model& m, const std::string& valFile, int streams, int64_t batches,
                      int64_t batchSize, int64_t seqLen, uint64_t seed);
// Batch 0 of validation stream 0: inputs and targets [B, T] int64.
std::pair<torch::Tensor, torch::Tensor> validationBatch(const std::string& valFile, int64_t batchSize,
                                                        int64_t seqLen, uint64_t seed, int64_t vocab);

}  // namespace edit::hf
