#include "model/model.h"

#include <cmath>
#include <cstdlib>
#include <limits>

#include "data/data.h"
#include "model/attention_cpu.h"
#include "model/pointwise_cpu.h"

namespace edit {

ModelShape shapeOf(const ModelConfig& m) {
  return {m.vocabSize, m.dim, m.layers, m.heads, m.ffnDim, m.ropeTheta, m.normEps, resolvedInitStd(m)};
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
    // q, k, v stacked (and gate, up stacked): one matmul each instead of three and two.
    add(b, "attn_norm", {s.dim}, 0);
    add(b, "wqkv", {3 * s.dim, s.dim}, std);
    add(b, "wo", {s.dim, s.dim}, outStd);
    add(b, "ffn_norm", {s.dim}, 0);
    add(b, "w13", {2 * s.ffn, s.dim}, std);
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
  const double scale = 1.0 / std::sqrt(static_cast<double>(s.headDim()));
  Rope r;
  r.cos = angles.cos().to(torch::kFloat32);
  r.sin = angles.sin().to(torch::kFloat32);
  r.qcos = (angles.cos() * scale).to(torch::kFloat32);
  r.qsin = (angles.sin() * scale).to(torch::kFloat32);
  r.mask = torch::full({seqLen, seqLen}, -std::numeric_limits<float>::infinity()).triu(1);
  return r;
}

namespace {
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// RMSNorm with its backward written out: saves only x and the per-row 1/rms.
//   y = x * r * g,  r = (mean(x^2) + eps)^-1/2
//   dx = r * (dy*g - xh * mean(dy*g*xh)),  xh = x*r;   dg = sum_rows(dy * xh)
// On the CPU in float32, one pass per row (model/pointwise_cpu.h); elsewhere LibTorch ops.
struct RmsNormFn : torch::autograd::Function<RmsNormFn> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& gain,
                               double eps) {
    const int64_t dim = x.size(-1);
    if (fusedCpuKernels(x)) {
      auto xc = x.contiguous();
      auto y = torch::empty_like(xc);
      auto rs = xc.sizes().vec();
      rs.back() = 1;
      auto r = torch::empty(rs, xc.options());
      const auto g = gain.contiguous();
      const float *xp = xc.data_ptr<float>(), *gp = g.data_ptr<float>();
      float *yp = y.data_ptr<float>(), *rp = r.data_ptr<float>();
      at::parallel_for(0, xc.numel() / dim, 16, [&](int64_t first, int64_t last) {
        cpu_pointwise::rmsNormForward(xp, gp, static_cast<float>(eps), dim, yp, rp, first, last);
      });
      ctx->save_for_backward({xc, gain, r});
      return y;
    }
    auto r = at::linalg_vector_norm(x, 2, {-1}, true, c10::nullopt);  // one pass, no x^2 temporary
    r.square_().div_(static_cast<double>(dim)).add_(eps).rsqrt_();
    ctx->save_for_backward({x, gain, r});
    return (x * r).mul_(gain);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &x = saved[0], &gain = saved[1], &r = saved[2];
    if (fusedCpuKernels(x)) {
      const auto dy = grads[0].contiguous();
      const int64_t dim = x.size(-1), rows = x.numel() / dim;
      auto dx = torch::empty_like(x);
      // The gain's gradient sums over rows: one partial sum per chunk of rows, added after.
      const int64_t chunks = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), rows / 16));
      auto dgParts = torch::zeros({chunks, dim}, x.options());
      const auto g = gain.contiguous();
      const float *xp = x.data_ptr<float>(), *gp = g.data_ptr<float>(), *rp = r.data_ptr<float>(),
                  *dyp = dy.data_ptr<float>();
      float *dxp = dx.data_ptr<float>(), *dgp = dgParts.data_ptr<float>();
      at::parallel_for(0, chunks, 1, [&](int64_t c0, int64_t c1) {
        for (int64_t c = c0; c < c1; ++c)
          cpu_pointwise::rmsNormBackward(xp, gp, rp, dyp, dim, dxp, dgp + c * dim, rows * c / chunks,
                                         rows * (c + 1) / chunks);
      });
      return {dx, chunks == 1 ? dgParts[0] : dgParts.sum(0), torch::Tensor()};
    }
    const auto& dy = grads[0];
    auto xh = x * r;
    auto dg = (dy * xh).reshape({-1, x.size(-1)}).sum(0);
    auto dyg = dy * gain;
    auto c = (dyg * xh).mean(-1, true);
    auto dx = dyg.sub_(xh.mul_(c)).mul_(r);
    return {dx, dg, torch::Tensor()};
  }
};

// Rotary embedding on [B, H, T, hd]: a rotation, so the backward is the inverse rotation
// and nothing needs saving but the tables. Written into halves of one output: no cat.
//   y1 = x1 c - x2 s,  y2 = x2 c + x1 s;   dx1 = d1 c + d2 s,  dx2 = d2 c - d1 s
torch::Tensor rotate(const torch::Tensor& x, const torch::Tensor& c, const torch::Tensor& s, bool inverse) {
  const int64_t half = x.size(-1) / 2;
  auto y = torch::empty_like(x, at::MemoryFormat::Contiguous);
  auto x1 = x.narrow(-1, 0, half), x2 = x.narrow(-1, half, half);
  auto y1 = y.narrow(-1, 0, half), y2 = y.narrow(-1, half, half);
  const double sign = inverse ? 1.0 : -1.0;
  at::mul_out(y1, x1, c).addcmul_(x2, s, sign);
  at::mul_out(y2, x2, c).addcmul_(x1, s, -sign);
  return y;
}

struct RopeFn : torch::autograd::Function<RopeFn> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& cos,
                               const torch::Tensor& sin) {
    ctx->save_for_backward({cos, sin});
    return rotate(x, cos, sin, false);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    return {rotate(grads[0], saved[0], saved[1], true), torch::Tensor(), torch::Tensor()};
  }
};

// SwiGLU on h = [a | b]: y = silu(a) * b. Saves h only (no silu(a) or sigmoid copies).
//   da = dy * b * s * (1 + a (1 - s)),  db = dy * silu(a),  s = sigmoid(a)
// On the CPU in float32, one pass per row (model/pointwise_cpu.h); elsewhere LibTorch ops.
struct SwigluFn : torch::autograd::Function<SwigluFn> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& h) {
    const int64_t f = h.size(-1) / 2;
    if (fusedCpuKernels(h)) {
      auto hc = h.contiguous();
      auto ys = hc.sizes().vec();
      ys.back() = f;
      auto y = torch::empty(ys, hc.options());
      const float* hp = hc.data_ptr<float>();
      float* yp = y.data_ptr<float>();
      at::parallel_for(0, hc.numel() / (2 * f), 16, [&](int64_t first, int64_t last) {
        cpu_pointwise::swigluForward(hp, f, yp, first, last);
      });
      ctx->save_for_backward({hc});
      return y;
    }
    ctx->save_for_backward({h});
    auto a = h.narrow(-1, 0, f), b = h.narrow(-1, f, f);
    return at::silu(a).mul_(b);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto h = ctx->get_saved_variables()[0];
    const int64_t f = h.size(-1) / 2;
    auto dh = torch::empty_like(h, at::MemoryFormat::Contiguous);
    if (fusedCpuKernels(h)) {
      const auto dy = grads[0].contiguous();
      const float *hp = h.data_ptr<float>(), *dyp = dy.data_ptr<float>();
      float* dhp = dh.data_ptr<float>();
      at::parallel_for(0, h.numel() / (2 * f), 16, [&](int64_t first, int64_t last) {
        cpu_pointwise::swigluBackward(hp, dyp, f, dhp, first, last);
      });
      return {dh};
    }
    auto a = h.narrow(-1, 0, f), b = h.narrow(-1, f, f);
    const auto& dy = grads[0];
    auto da = dh.narrow(-1, 0, f), db = dh.narrow(-1, f, f);
    auto sg = at::sigmoid(a);
    at::mul_out(db, a, sg).mul_(dy);                  // db = silu(a) dy
    auto t = (1 - sg).mul_(a).add_(1).mul_(sg);       // silu'(a)
    at::mul_out(da, dy, b).mul_(t);
    return {dh};
  }
};
}  // namespace

torch::Tensor rmsNorm(const torch::Tensor& x, const torch::Tensor& gain, double eps) {
  return RmsNormFn::apply(x, gain, eps);
}

torch::Tensor applyRope(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
  const int64_t T = x.size(2), half = x.size(3) / 2;
  return RopeFn::apply(x, cos.narrow(0, 0, T).view({T, half}), sin.narrow(0, 0, T).view({T, half}));
}

torch::Tensor swiglu(const torch::Tensor& h) { return SwigluFn::apply(h); }

namespace {
// The fused CPU attention (model/attention_cpu.h) as autograd functions. Both save q, k, v,
// the output (which the output projection saves anyway) and one log-sum-exp per row.
cpu_attention::Dims dimsOf(const torch::Tensor& q) { return {q.size(0), q.size(1), q.size(2), q.size(3)}; }

// Attention forward over all heads: returns {out [B, T, H*hd], lse [B, H, T]}.
std::pair<torch::Tensor, torch::Tensor> fusedForward(const torch::Tensor& q, const torch::Tensor& k,
                                                     const torch::Tensor& v) {
  const auto d = dimsOf(q);
  auto out = torch::empty({d.batch, d.seq, d.heads * d.headDim}, q.options());
  auto lse = torch::empty({d.batch, d.heads, d.seq}, q.options());
  const float *qp = q.data_ptr<float>(), *kp = k.data_ptr<float>(), *vp = v.data_ptr<float>();
  float *op = out.data_ptr<float>(), *lp = lse.data_ptr<float>();
  at::parallel_for(0, d.batch * d.heads, 1, [&](int64_t first, int64_t last) {
    cpu_attention::forward(qp, kp, vp, op, lp, d, first, last);
  });
  return {out, lse};
}

// The backward of heads [first, last) from saved {q, k, v, out, lse}.
void fusedBackward(const variable_list& saved, const torch::Tensor& dOut, torch::Tensor& dq, torch::Tensor& dk,
                   torch::Tensor& dv, int64_t first, int64_t last) {
  cpu_attention::backward(saved[0].data_ptr<float>(), saved[1].data_ptr<float>(), saved[2].data_ptr<float>(),
                          saved[3].data_ptr<float>(), saved[4].data_ptr<float>(), dOut.data_ptr<float>(),
                          dq.data_ptr<float>(), dk.data_ptr<float>(), dv.data_ptr<float>(), dimsOf(saved[0]), first,
                          last);
}

struct CpuAttentionFn : torch::autograd::Function<CpuAttentionFn> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& v) {
    auto [out, lse] = fusedForward(q, k, v);
    ctx->save_for_backward({q, k, v, out, lse});
    return out;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto dOut = grads[0].contiguous();
    auto dq = torch::empty_like(saved[0]), dk = torch::empty_like(saved[1]), dv = torch::empty_like(saved[2]);
    const auto d = dimsOf(saved[0]);
    at::parallel_for(0, d.batch * d.heads, 1,
                     [&](int64_t first, int64_t last) { fusedBackward(saved, dOut, dq, dk, dv, first, last); });
    return {dq, dk, dv};
  }
};

// From the stacked projection's output qkv [B, T, 3 dim] to the attention output: the head
// split, RoPE and the attention in one autograd node, whose backward writes dqkv in the
// projection's layout. Through LibTorch ops the same took a permuted copy, two rotations,
// and in the backward three zero-filled qkv-sized gradients (one per select) summed.
struct QkvAttentionFn : torch::autograd::Function<QkvAttentionFn> {
  static cpu_attention::Rotary rotary(const variable_list& t) {
    return {t[0].data_ptr<float>(), t[1].data_ptr<float>(), t[2].data_ptr<float>(), t[3].data_ptr<float>()};
  }
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& qkv, const torch::Tensor& qcos,
                               const torch::Tensor& qsin, const torch::Tensor& kcos, const torch::Tensor& ksin,
                               int64_t heads) {
    const int64_t B = qkv.size(0), T = qkv.size(1), hd = qkv.size(2) / 3 / heads;
    const cpu_attention::Dims d{B, heads, T, hd};
    auto q = torch::empty({B, heads, T, hd}, qkv.options()), k = torch::empty_like(q), v = torch::empty_like(q);
    const auto r = rotary({qcos, qsin, kcos, ksin});
    const float* src = qkv.data_ptr<float>();
    float *qp = q.data_ptr<float>(), *kp = k.data_ptr<float>(), *vp = v.data_ptr<float>();
    at::parallel_for(0, B * heads, 1, [&](int64_t first, int64_t last) {
      cpu_attention::splitHeads(src, r, qp, kp, vp, d, first, last);
    });
    auto [out, lse] = fusedForward(q, k, v);
    ctx->save_for_backward({q, k, v, out, lse, qcos, qsin, kcos, ksin});
    return out;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto dOut = grads[0].contiguous();
    const auto d = dimsOf(saved[0]);
    auto dq = torch::empty_like(saved[0]), dk = torch::empty_like(saved[1]), dv = torch::empty_like(saved[2]);
    auto dqkv = torch::empty({d.batch, d.seq, 3 * d.heads * d.headDim}, saved[0].options());
    const auto r = rotary({saved[5], saved[6], saved[7], saved[8]});
    at::parallel_for(0, d.batch * d.heads, 1, [&](int64_t first, int64_t last) {
      fusedBackward(saved, dOut, dq, dk, dv, first, last);
      cpu_attention::mergeHeadGrads(dq.data_ptr<float>(), dk.data_ptr<float>(), dv.data_ptr<float>(), r,
                                    dqkv.data_ptr<float>(), d, first, last);
    });
    return {dqkv, torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};
}  // namespace

bool fusedCpuKernels(const torch::Tensor& t) {
  // EDIT_CPU_KERNELS=aten turns the plain-C++ kernels off (LibTorch ops instead), for
  // before/after measurements in one run.
  static const bool aten = [] {
    const char* e = std::getenv("EDIT_CPU_KERNELS");
    return e != nullptr && std::string(e) == "aten";
  }();
  return !aten && t.device().is_cpu() && t.scalar_type() == torch::kFloat32;
}

bool fusedCpuAttention(const torch::Tensor& q) { return fusedCpuKernels(q) && cpu_attention::available(); }

torch::Tensor causalAttention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                              const torch::Tensor& mask) {
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2), hd = q.size(3);
  if (fusedCpuAttention(q)) return CpuAttentionFn::apply(q.contiguous(), k.contiguous(), v.contiguous());
  // Elsewhere (GPU, double): LibTorch ops on [B*H, T, hd] views, batched matmuls with no
  // reshape copies.
  auto q3 = q.reshape({B * H, T, hd}), k3 = k.reshape({B * H, T, hd}), v3 = v.reshape({B * H, T, hd});
  auto scores = torch::bmm(q3, k3.transpose(1, 2));
  scores.add_(mask.narrow(0, 0, T).narrow(1, 0, T));  // in place: the bmm's backward needs no output
  return torch::bmm(torch::softmax(scores, -1), v3).view({B, H, T, hd}).transpose(1, 2).reshape({B, T, H * hd});
}

torch::Tensor attentionFromQkv(const torch::Tensor& qkv, const Rope& rope, int64_t heads) {
  const int64_t B = qkv.size(0), T = qkv.size(1), hd = qkv.size(2) / 3 / heads;
  if (fusedCpuAttention(qkv))
    return QkvAttentionFn::apply(qkv.contiguous(), rope.qcos, rope.qsin, rope.cos, rope.sin, heads);
  // Elsewhere: one copy into [3, B, H, T, hd] so every later op reads contiguous heads.
  auto parts = qkv.view({B, T, 3, heads, hd}).permute({2, 0, 3, 1, 4}).contiguous();
  auto q = applyRope(parts[0], rope.qcos, rope.qsin);  // also scales by 1/sqrt(hd)
  auto k = applyRope(parts[1], rope.cos, rope.sin);
  return causalAttention(q, k, parts[2], rope.mask);
}

torch::Tensor embedForward(const std::vector<torch::Tensor>& p, const torch::Tensor& tokens) {
  return torch::embedding(p[0], tokens);
}

torch::Tensor blockForward(const std::vector<torch::Tensor>& p, const torch::Tensor& x,
                           const Rope& rope, const ModelShape& s) {
  auto h = rmsNorm(x, p[0], s.normEps);
  auto attn = attentionFromQkv(torch::linear(h, p[1]), rope, s.heads);  // one projection for q, k, v
  auto x1 = x + torch::linear(attn, p[2]);
  auto ffn = torch::linear(swiglu(torch::linear(rmsNorm(x1, p[3], s.normEps), p[4])), p[5]);
  return x1 + ffn;
}

torch::Tensor headLoss(const std::vector<torch::Tensor>& p, const torch::Tensor& x,
                       const torch::Tensor& targets, const ModelShape& s) {
  auto logits = torch::linear(rmsNorm(x, p[0], s.normEps), p[1]);
  return torch::nn::functional::cross_entropy(logits.view({-1, s.vocab}), targets.reshape({-1}));
}

}  // namespace edit
