#include "model.h"

#include <cmath>

#include "data.h"

namespace edit {

ModelShape shapeOf(const ModelConfig& m) {
  return {m.vocabSize, m.dim, m.layers, m.heads, m.ffnDim, m.ropeTheta, m.normEps, m.initStd};
}

static void add(UnitLayout& u, std::string name, std::vector<int64_t> shape, double std) {
  ParamSpec p;
  p.name = std::move(name);
  p.shape = std::move(shape);
  p.numel = 1;
  for (auto d : p.shape) p.numel *= d;
  p.offset = u.numel;
  p.decay = p.shape.size() >= 2;
  p.initStd = std;
  u.numel += p.numel;
  u.params.push_back(std::move(p));
}

std::vector<UnitLayout> modelLayout(const ModelShape& s) {
  std::vector<UnitLayout> units;
  const double std = s.initStd;
  // Residual output projections are scaled down with depth (GPT-2 style) so the residual
  // stream's variance does not grow with the number of layers.
  const double outStd = s.initStd / std::sqrt(2.0 * static_cast<double>(s.layers));
  UnitLayout embed{"embed", UnitKind::Embedding, {}, 0};
  add(embed, "tok_embeddings", {s.vocab, s.dim}, std);
  units.push_back(embed);
  for (int64_t l = 0; l < s.layers; ++l) {
    UnitLayout b{"block." + std::to_string(l), UnitKind::Block, {}, 0};
    add(b, "attn_norm", {s.dim}, 0);
    add(b, "wq", {s.dim, s.dim}, std);
    add(b, "wk", {s.dim, s.dim}, std);
    add(b, "wv", {s.dim, s.dim}, std);
    add(b, "wo", {s.dim, s.dim}, outStd);
    add(b, "ffn_norm", {s.dim}, 0);
    add(b, "w1", {s.ffn, s.dim}, std);
    add(b, "w3", {s.ffn, s.dim}, std);
    add(b, "w2", {s.dim, s.ffn}, outStd);
    units.push_back(b);
  }
  UnitLayout head{"head", UnitKind::Head, {}, 0};
  add(head, "norm", {s.dim}, 0);
  add(head, "output", {s.vocab, s.dim}, std);
  units.push_back(head);
  return units;
}

int64_t parameterCount(const ModelShape& s) {
  int64_t n = 0;
  for (const auto& u : modelLayout(s)) n += u.numel;
  return n;
}

double flopsPerToken(const ModelShape& s, int64_t seqLen) {
  // Matmul parameters (the embedding lookup is not a matmul) and causal attention
  // scores + values: 2 * T * d per layer forward, halved by the mask; x3 for backward.
  const double matmul = static_cast<double>(parameterCount(s) - s.vocab * s.dim);
  const double attn = 2.0 * s.layers * seqLen * s.dim;
  return 6.0 * matmul + 3.0 * attn;
}

torch::Tensor initialUnitValues(const UnitLayout& u, int index, uint64_t seed) {
  auto flat = torch::empty({u.numel}, torch::kFloat32);
  fillInitialUnitValues(u, index, seed, flat);
  return flat;
}

void fillInitialUnitValues(const UnitLayout& u, int index, uint64_t seed, torch::Tensor flat) {
  torch::NoGradGuard ng;
  auto gen = at::detail::createCPUGenerator(data::mix64(seed ^ data::mix64(index + 1)));
  for (const auto& p : u.params) {
    auto view = flat.narrow(0, p.offset, p.numel);
    if (p.initStd == 0) {
      view.fill_(1.0);
    } else {
      view.normal_(0.0, p.initStd, gen);
    }
  }
}

std::vector<torch::Tensor> parameterViews(const UnitLayout& u, const torch::Tensor& flat) {
  std::vector<torch::Tensor> views;
  views.reserve(u.params.size());
  for (const auto& p : u.params) views.push_back(flat.narrow(0, p.offset, p.numel).view(p.shape));
  return views;
}

Rope makeRope(const ModelShape& s, int64_t seqLen) {
  const int64_t half = s.headDim() / 2;
  auto i = torch::arange(half, torch::kFloat64);
  auto invFreq = torch::pow(s.ropeTheta, -2.0 * i / static_cast<double>(s.headDim()));
  auto t = torch::arange(seqLen, torch::kFloat64);
  auto angles = torch::outer(t, invFreq);
  return {angles.cos().to(torch::kFloat32), angles.sin().to(torch::kFloat32)};
}

torch::Tensor rmsNorm(const torch::Tensor& x, const torch::Tensor& gain, double eps) {
  return x * torch::rsqrt(x.pow(2).mean(-1, true) + eps) * gain;
}

torch::Tensor applyRope(const torch::Tensor& x, const Rope& rope) {
  // Rotate the two halves of each head as pairs (x1, x2) by the position's angle.
  const int64_t T = x.size(1), half = x.size(3) / 2;
  auto cos = rope.cos.narrow(0, 0, T).view({1, T, 1, half});
  auto sin = rope.sin.narrow(0, 0, T).view({1, T, 1, half});
  auto x1 = x.narrow(3, 0, half), x2 = x.narrow(3, half, half);
  return torch::cat({x1 * cos - x2 * sin, x2 * cos + x1 * sin}, 3);
}

torch::Tensor causalAttention(const torch::Tensor& q, const torch::Tensor& k,
                              const torch::Tensor& v) {
  const int64_t T = q.size(2);
  auto scores = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(q.size(3)));
  auto mask = torch::ones({T, T}, q.options().dtype(torch::kBool)).triu(1);
  scores = scores.masked_fill(mask, -std::numeric_limits<float>::infinity());
  return torch::matmul(torch::softmax(scores, -1), v);
}

torch::Tensor embedForward(const std::vector<torch::Tensor>& p, const torch::Tensor& tokens) {
  return torch::embedding(p[0], tokens);
}

torch::Tensor blockForward(const std::vector<torch::Tensor>& p, const torch::Tensor& x,
                           const Rope& rope, const ModelShape& s) {
  const int64_t B = x.size(0), T = x.size(1), H = s.heads, hd = s.headDim();
  auto h = rmsNorm(x, p[0], s.normEps);
  auto q = applyRope(torch::linear(h, p[1]).view({B, T, H, hd}), rope).transpose(1, 2);
  auto k = applyRope(torch::linear(h, p[2]).view({B, T, H, hd}), rope).transpose(1, 2);
  auto v = torch::linear(h, p[3]).view({B, T, H, hd}).transpose(1, 2);
  auto attn = causalAttention(q, k, v).transpose(1, 2).reshape({B, T, s.dim});
  auto x1 = x + torch::linear(attn, p[4]);
  auto h2 = rmsNorm(x1, p[5], s.normEps);
  auto ffn = torch::linear(torch::silu(torch::linear(h2, p[6])) * torch::linear(h2, p[7]), p[8]);
  return x1 + ffn;
}

torch::Tensor headLoss(const std::vector<torch::Tensor>& p, const torch::Tensor& x,
                       const torch::Tensor& targets, const ModelShape& s) {
  auto logits = torch::linear(rmsNorm(x, p[0], s.normEps), p[1]);
  return torch::nn::functional::cross_entropy(logits.view({-1, s.vocab}), targets.reshape({-1}));
}

}  // namespace edit
