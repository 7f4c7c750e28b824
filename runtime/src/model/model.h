// Llama-style decoder (RMSNorm, RoPE, SwiGLU, causal attention, no biases, untied
// embeddings) written as plain functions over parameter tensors, so the parameters can
// live anywhere — here, as views into one flat buffer per unit (see flat_units.h).
//
// The model is a chain of units: the embedding, each transformer block, and the final
// norm + output head. A unit is what ZeRO-3 gathers and what EDiT synchronizes at once.
#pragma once

#include <torch/torch.h>

#include <string>
#include <vector>

#include "worker_config.h"

namespace edit {

struct ModelShape {
  int64_t vocab, dim, layers, heads, ffn;
  double ropeTheta, normEps, initStd;
  int64_t headDim() const { return dim / heads; }
};
ModelShape shapeOf(const ModelConfig& m);

struct ParamSpec {
  std::string name;
  std::vector<int64_t> shape;
  int64_t offset = 0;  // inside the unit's flat vector
  int64_t numel = 0;
  bool decay = false;  // matrices get weight decay, norm gains do not
  double initStd = 0;  // 0: constant 1 (norm gains)
};

enum class UnitKind { Embedding, Block, Head };

struct UnitLayout {
  std::string name;
  UnitKind kind;
  std::vector<ParamSpec> params;
  int64_t numel = 0;
};

// embed, block.0 .. block.L-1, head — in forward order.
std::vector<UnitLayout> modelLayout(const ModelShape& s);
int64_t parameterCount(const ModelShape& s);
// Forward+backward FLOPs per token (6 x matmul params + attention), for efficiency reports.
double flopsPerToken(const ModelShape& s, int64_t seqLen);

// Deterministic initial values of unit `index` (independent of sharding and rank).
torch::Tensor initialUnitValues(const UnitLayout& u, int index, uint64_t seed);
// The same, written into the first u.numel values of `flat` (no temporary).
void fillInitialUnitValues(const UnitLayout& u, int index, uint64_t seed, torch::Tensor flat);

// Views of each parameter inside `flat` (which holds at least u.numel values).
std::vector<torch::Tensor> parameterViews(const UnitLayout& u, const torch::Tensor& flat);

// Tables every block shares for one sequence length: the rotary angles, the query's copy
// pre-scaled by 1/sqrt(headDim) (so attention needs no scaling pass), and the additive
// causal mask (0 on and below the diagonal, -inf above). Sliced to a shorter sequence on use.
struct Rope {
  torch::Tensor cos, sin;    // [seqLen, headDim/2]
  torch::Tensor qcos, qsin;  // the same times 1/sqrt(headDim)
  torch::Tensor mask;        // [seqLen, seqLen]
  Rope to(torch::Device d) const { return {cos.to(d), sin.to(d), qcos.to(d), qsin.to(d), mask.to(d)}; }
};
Rope makeRope(const ModelShape& s, int64_t seqLen);

// Per-unit forward functions; p are the unit's parameters in layout order. A block's
// parameters: attn_norm, wqkv ([3 dim, dim]: the q, k and v projections stacked), wo,
// ffn_norm, w13 ([2 ffn, dim]: the gate w1 and up w3 projections stacked), w2.
torch::Tensor embedForward(const std::vector<torch::Tensor>& p, const torch::Tensor& tokens);
// Whether a unit's backward reads its parameters' values. The embedding's does not: its
// gradient is the output gradient scattered to the token ids, so a sharded step need not
// gather the table again for it (with a real vocabulary, the largest unit).
inline bool backwardReadsParameters(UnitKind k) { return k != UnitKind::Embedding; }
torch::Tensor blockForward(const std::vector<torch::Tensor>& p, const torch::Tensor& x,
                           const Rope& rope, const ModelShape& s);
// Returns the mean cross-entropy of next-token prediction.
torch::Tensor headLoss(const std::vector<torch::Tensor>& p, const torch::Tensor& x,
                       const torch::Tensor& targets, const ModelShape& s);

// Building blocks, exposed for tests against naive implementations. rmsNorm, applyRope and
// swiglu have hand-written backward passes (fewer passes over memory, less saved).
torch::Tensor rmsNorm(const torch::Tensor& x, const torch::Tensor& gain, double eps);
// x: [B, H, T, hd]; rotates the pairs (i, i + hd/2) of each head by the position's angle,
// with the tables cos/sin [>= T, hd/2] (Rope::cos/sin, or qcos/qsin to also scale).
torch::Tensor applyRope(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin);
// q, k, v: [B, H, T, hd], q already scaled by 1/sqrt(hd); returns [B, T, H*hd] (heads
// merged). float32 on the CPU goes through the fused kernel (model/attention_cpu.h);
// anything else through LibTorch ops with the additive mask [>= T, >= T].
torch::Tensor causalAttention(const torch::Tensor& q, const torch::Tensor& k,
                              const torch::Tensor& v, const torch::Tensor& mask);
// Whether rmsNorm and swiglu take the plain-C++ kernels (model/pointwise_cpu.h) for
// tensors like t: float32 on the CPU, unless EDIT_CPU_KERNELS=aten.
bool fusedCpuKernels(const torch::Tensor& t);
// Whether causalAttention takes the fused CPU kernel for tensors like q: the same, and a
// BLAS sgemm_ loaded in the process.
bool fusedCpuAttention(const torch::Tensor& q);
// A block's attention from its stacked projection's output qkv [B, T, 3 dim] (q, k, v of
// `heads` heads each): RoPE on q (scaled) and k, then causalAttention; returns [B, T, dim].
// On the fused CPU path it is one autograd node whose backward writes dqkv directly.
torch::Tensor attentionFromQkv(const torch::Tensor& qkv, const Rope& rope, int64_t heads);
// silu(a) * b for h = [a | b] along the last dimension.
torch::Tensor swiglu(const torch::Tensor& h);

}  // namespace edit
