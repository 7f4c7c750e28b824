// Model building blocks against naive element-by-element implementations.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "model/model.h"

using namespace edit;

TEST(Model, RmsNormMatchesDefinition) {
  auto x = torch::randn({3, 8});
  auto g = torch::rand({8});
  auto y = rmsNorm(x, g, 1e-5);
  for (int i = 0; i < 3; ++i) {
    double ms = 0;
    for (int j = 0; j < 8; ++j) ms += std::pow(x[i][j].item<double>(), 2) / 8;
    for (int j = 0; j < 8; ++j)
      EXPECT_NEAR(y[i][j].item<double>(),
                  x[i][j].item<double>() / std::sqrt(ms + 1e-5) * g[j].item<double>(), 1e-5);
  }
}

TEST(Model, RopeRotatesEachPairByPositionAngle) {
  ModelShape s{16, 8, 1, 2, 16, 10000.0, 1e-5, 0.02};
  auto rope = makeRope(s, 5);
  auto x = torch::randn({1, 2, 5, 4});  // [B, H, T, hd]
  auto y = applyRope(x, rope.cos, rope.sin);
  auto yq = applyRope(x, rope.qcos, rope.qsin);
  for (int t = 0; t < 5; ++t)
    for (int h = 0; h < 2; ++h)
      for (int i = 0; i < 2; ++i) {
        const double theta = t * std::pow(10000.0, -2.0 * i / 4);
        const double a = x[0][h][t][i].item<double>(), b = x[0][h][t][i + 2].item<double>();
        EXPECT_NEAR(y[0][h][t][i].item<double>(), a * std::cos(theta) - b * std::sin(theta), 1e-5);
        EXPECT_NEAR(y[0][h][t][i + 2].item<double>(), b * std::cos(theta) + a * std::sin(theta), 1e-5);
        // The query tables also scale by 1/sqrt(hd) = 1/2.
        EXPECT_NEAR(yq[0][h][t][i].item<double>(), (a * std::cos(theta) - b * std::sin(theta)) / 2, 1e-5);
      }
  // Rotation keeps norms.
  EXPECT_NEAR(y.norm().item<double>(), x.norm().item<double>(), 1e-4);
}

TEST(Model, CausalAttentionMatchesNaiveLoop) {
  // Both paths: float32 on the CPU takes the fused kernel, float64 the LibTorch ops.
  for (auto dtype : {torch::kFloat32, torch::kFloat64}) {
    auto q = torch::randn({1, 1, 4, 3}, dtype), k = torch::randn({1, 1, 4, 3}, dtype),
         v = torch::randn({1, 1, 4, 3}, dtype);
    ModelShape s{16, 3, 1, 1, 16, 10000.0, 1e-5, 0.02};
    auto y = causalAttention(q / std::sqrt(3.0), k, v, makeRope(s, 6).mask.to(dtype));  // q arrives pre-scaled
    ASSERT_EQ(y.sizes(), (std::vector<int64_t>{1, 4, 3}));  // [B, T, H*hd]
    for (int i = 0; i < 4; ++i) {
      std::vector<double> w;
      double z = 0;
      for (int j = 0; j <= i; ++j) {
        double dot = 0;
        for (int d = 0; d < 3; ++d) dot += q[0][0][i][d].item<double>() * k[0][0][j][d].item<double>();
        w.push_back(std::exp(dot / std::sqrt(3.0)));
        z += w.back();
      }
      for (int d = 0; d < 3; ++d) {
        double acc = 0;
        for (int j = 0; j <= i; ++j) acc += w[j] / z * v[0][0][j][d].item<double>();
        EXPECT_NEAR(y[0][i][d].item<double>(), acc, 1e-5);
      }
    }
  }
}

// The fused CPU kernel (float32, tiles of 64 query rows) against the textbook formulas in
// float64, output and gradients, at shapes that cover one row, a partial tile, several
// tiles with a partial last one, odd head sizes, and large scores (a softmax near one-hot).
TEST(Model, FusedCpuAttentionMatchesTheFormulasWithGradients) {
  ASSERT_TRUE(fusedCpuAttention(torch::zeros({1}))) << "no BLAS sgemm_ in this process: the fused path is untested";
  struct Case {
    int64_t B, H, T, hd;
    double scoreScale;
  };
  for (const Case& c : {Case{1, 1, 1, 4, 1}, Case{2, 3, 5, 3, 1}, Case{1, 2, 64, 8, 1}, Case{2, 2, 130, 16, 1},
                        Case{1, 1, 200, 32, 30}}) {
    SCOPED_TRACE("B " + std::to_string(c.B) + " H " + std::to_string(c.H) + " T " + std::to_string(c.T) +
                 " hd " + std::to_string(c.hd));
    auto opts = torch::dtype(torch::kFloat64);
    auto q = torch::randn({c.B, c.H, c.T, c.hd}, opts) * c.scoreScale / std::sqrt(double(c.hd));
    auto k = torch::randn({c.B, c.H, c.T, c.hd}, opts), v = torch::randn({c.B, c.H, c.T, c.hd}, opts);
    auto w = torch::randn({c.B, c.T, c.H * c.hd}, opts);
    auto textbook = [&](std::vector<torch::Tensor>& in) {
      auto sc = torch::matmul(in[0], in[1].transpose(-2, -1));
      sc = sc.masked_fill(torch::ones({c.T, c.T}, torch::kBool).triu(1), -INFINITY);
      return torch::matmul(torch::softmax(sc, -1), in[2]).transpose(1, 2).reshape({c.B, c.T, c.H * c.hd});
    };
    auto run = [&](torch::ScalarType dtype, bool fused) {
      std::vector<torch::Tensor> in;
      for (const auto& t : {q, k, v}) in.push_back(t.to(dtype).requires_grad_(true));
      auto y = fused ? causalAttention(in[0], in[1], in[2], torch::Tensor()) : textbook(in);
      (y * w.to(dtype)).sum().backward();
      return std::vector<torch::Tensor>{y.detach(), in[0].grad(), in[1].grad(), in[2].grad()};
    };
    auto got = run(torch::kFloat32, true), want = run(torch::kFloat64, false);
    const char* names[] = {"output", "dq", "dk", "dv"};
    for (int i = 0; i < 4; ++i) {
      const double scale = want[i].abs().max().item<double>() + 1e-12;
      const double err = (got[i].to(torch::kFloat64) - want[i]).abs().max().item<double>();
      EXPECT_LT(err / scale, 2e-5) << names[i] << " differs by " << err << " (largest value " << scale << ")";
    }
  }
}

// The hand-written backward passes against autograd through the plain formulas, in double.
namespace {
torch::Tensor naiveRms(const torch::Tensor& x, const torch::Tensor& g, double eps) {
  return x * torch::rsqrt(x.pow(2).mean(-1, true) + eps) * g;
}
torch::Tensor naiveRope(const torch::Tensor& x, const torch::Tensor& c, const torch::Tensor& s) {
  const int64_t h = x.size(-1) / 2, T = x.size(2);
  auto cc = c.narrow(0, 0, T), ss = s.narrow(0, 0, T);
  auto x1 = x.narrow(-1, 0, h), x2 = x.narrow(-1, h, h);
  return torch::cat({x1 * cc - x2 * ss, x2 * cc + x1 * ss}, -1);
}
torch::Tensor naiveSwiglu(const torch::Tensor& hh) {
  const int64_t f = hh.size(-1) / 2;
  auto a = hh.narrow(-1, 0, f), b = hh.narrow(-1, f, f);
  return a * torch::sigmoid(a) * b;
}
// Gradients of sum(w * f(inputs)) for a random w, through f and through ref.
void expectSameGradients(const std::function<torch::Tensor(std::vector<torch::Tensor>&)>& f,
                         const std::function<torch::Tensor(std::vector<torch::Tensor>&)>& ref,
                         std::vector<torch::Tensor> inputs) {
  auto run = [&](const auto& fn) {
    std::vector<torch::Tensor> in;
    for (auto& t : inputs) in.push_back(t.detach().clone().requires_grad_(true));
    auto y = fn(in);
    torch::manual_seed(3);
    auto w = torch::randn_like(y);
    (y * w).sum().backward();
    std::vector<torch::Tensor> out{y.detach()};
    for (auto& t : in) out.push_back(t.grad());
    return out;
  };
  auto a = run(f), b = run(ref);
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_TRUE(torch::allclose(a[i], b[i], 1e-9, 1e-11)) << "output/gradient " << i << " differs by "
                                                          << (a[i] - b[i]).abs().max().item<double>();
}
}  // namespace

TEST(Model, FusedBackwardsMatchAutogradOfTheFormulas) {
  auto opts = torch::dtype(torch::kFloat64);
  expectSameGradients([](auto& in) { return rmsNorm(in[0], in[1], 1e-5); },
                      [](auto& in) { return naiveRms(in[0], in[1], 1e-5); },
                      {torch::randn({2, 5, 8}, opts), torch::rand({8}, opts) + 0.5});
  auto c = torch::rand({7, 3}, opts), s = torch::rand({7, 3}, opts);
  expectSameGradients([&](auto& in) { return applyRope(in[0], c, s); },
                      [&](auto& in) { return naiveRope(in[0], c, s); }, {torch::randn({2, 3, 5, 6}, opts)});
  expectSameGradients([](auto& in) { return swiglu(in[0]); }, [](auto& in) { return naiveSwiglu(in[0]); },
                      {torch::randn({2, 5, 10}, opts) * 3});
}

TEST(Model, FusedCpuRmsNormAndSwigluMatchTheFormulasWithGradients) {
  // float32 on the CPU takes the plain-C++ kernels (model/pointwise_cpu.h): against the
  // formulas in float64 through autograd. Widths that are not a multiple of the kernels'
  // 16 lanes, one row, enough rows for several chunks of the gain's gradient on 2 threads,
  // a zero row (r = 1/sqrt(eps)), and gate values far out in both tails of the sigmoid.
  ASSERT_TRUE(fusedCpuKernels(torch::zeros({1})));
  const int threads = at::get_num_threads();
  at::set_num_threads(2);
  auto compare = [](const std::function<torch::Tensor(std::vector<torch::Tensor>&)>& f,
                    const std::function<torch::Tensor(std::vector<torch::Tensor>&)>& ref,
                    const std::vector<torch::Tensor>& inputs) {
    auto run = [&](const auto& fn, torch::ScalarType dtype) {
      std::vector<torch::Tensor> in;
      for (const auto& t : inputs) in.push_back(t.to(dtype).requires_grad_(true));
      auto y = fn(in);
      torch::manual_seed(7);
      auto w = torch::randn(y.sizes(), torch::kFloat64).to(dtype);
      (y * w).sum().backward();
      std::vector<torch::Tensor> out{y.detach()};
      for (auto& t : in) out.push_back(t.grad());
      return out;
    };
    auto got = run(f, torch::kFloat32), want = run(ref, torch::kFloat64);
    for (size_t i = 0; i < got.size(); ++i) {
      const double scale = want[i].abs().max().item<double>() + 1e-12;
      const double err = (got[i].to(torch::kFloat64) - want[i]).abs().max().item<double>();
      EXPECT_LT(err / scale, 1e-5) << (i == 0 ? "output" : "gradient of input " + std::to_string(i - 1))
                                   << " differs by " << err << " (largest value " << scale << ")";
    }
  };
  auto opts = torch::dtype(torch::kFloat64);
  for (auto shape : {std::vector<int64_t>{1, 1, 37}, {2, 5, 8}, {4, 300, 48}, {3, 7, 130}}) {
    SCOPED_TRACE("shape [" + std::to_string(shape[0]) + ", " + std::to_string(shape[1]) + ", " +
                 std::to_string(shape[2]) + "]");
    auto x = torch::randn(shape, opts) * 3;
    if (shape[1] > 1) x[0][1].zero_();
    compare([](auto& in) { return rmsNorm(in[0], in[1], 1e-5); },
            [](auto& in) { return naiveRms(in[0], in[1], 1e-5); }, {x, torch::rand({shape[2]}, opts) + 0.5});
    auto h = torch::randn({shape[0], shape[1], 2 * shape[2]}, opts) * 4;
    h.view(-1)[0] = 100;
    h.view(-1)[1] = -100;
    h.view(-1)[2] = 0;
    compare([](auto& in) { return swiglu(in[0]); }, [](auto& in) { return naiveSwiglu(in[0]); }, {h});
  }
  at::set_num_threads(threads);
}

namespace {
// A block by the textbook formulas on separate q/k/v and gate/up matrices cut from the
// stacked ones (in[0]: x [B, T, d], in[1]: the block's flat parameters).
torch::Tensor plainBlock(std::vector<torch::Tensor>& in, const UnitLayout& layout, const Rope& r64,
                         const ModelShape& s) {
  auto p = parameterViews(layout, in[1]);
  const int64_t B = in[0].size(0), T = in[0].size(1), H = s.heads, hd = s.headDim(), d = s.dim, f = s.ffn;
  auto h = naiveRms(in[0], p[0], 1e-5);
  auto q = torch::linear(h, p[1].narrow(0, 0, d)).view({B, T, H, hd}).transpose(1, 2);
  auto k = torch::linear(h, p[1].narrow(0, d, d)).view({B, T, H, hd}).transpose(1, 2);
  auto v = torch::linear(h, p[1].narrow(0, 2 * d, d)).view({B, T, H, hd}).transpose(1, 2);
  q = naiveRope(q, r64.cos, r64.sin);
  k = naiveRope(k, r64.cos, r64.sin);
  auto sc = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(double(hd));
  sc = sc.masked_fill(torch::ones({T, T}, torch::kBool).triu(1), -INFINITY);
  auto a = torch::matmul(torch::softmax(sc, -1), v).transpose(1, 2).reshape({B, T, d});
  auto x1 = in[0] + torch::linear(a, p[2]);
  auto h2 = naiveRms(x1, p[3], 1e-5);
  auto g = torch::linear(h2, p[4].narrow(0, 0, f)), u = torch::linear(h2, p[4].narrow(0, f, f));
  return x1 + torch::linear(torch::silu(g) * u, p[5]);
}
Rope toDouble(const Rope& r) {
  return Rope{r.cos.to(torch::kFloat64), r.sin.to(torch::kFloat64), r.qcos.to(torch::kFloat64),
              r.qsin.to(torch::kFloat64), r.mask.to(torch::kFloat64)};
}
}  // namespace

TEST(Model, BlockMatchesAPlainComposition) {
  // The whole block (float64: the LibTorch-ops path) against the textbook formulas,
  // including its gradients.
  ModelShape s{16, 8, 1, 2, 12, 10000.0, 1e-5, 0.02};
  auto layout = modelLayout(s);
  auto flat = initialUnitValues(layout[1], 1, 5).to(torch::kFloat64);
  auto r64 = toDouble(makeRope(s, 5));
  auto x = torch::randn({2, 5, 8}, torch::kFloat64);
  auto plain = [&](std::vector<torch::Tensor>& in) { return plainBlock(in, layout[1], r64, s); };
  auto fused = [&](std::vector<torch::Tensor>& in) {
    return blockForward(parameterViews(layout[1], in[1]), in[0], r64, s);
  };
  expectSameGradients(fused, plain, {x, flat});
}

TEST(Model, BlockOnTheFusedCpuPathMatchesAPlainComposition) {
  // float32 on the CPU: the head split, RoPE and attention are one fused node
  // (attentionFromQkv). Against the textbook block in float64, output and gradients, with
  // a sequence shorter than the rotary tables and more than one tile of queries.
  ASSERT_TRUE(fusedCpuAttention(torch::zeros({1})));
  for (int64_t T : {1, 5, 70}) {
    SCOPED_TRACE("T " + std::to_string(T));
    ModelShape s{16, 24, 1, 3, 20, 10000.0, 1e-5, 0.2};
    auto layout = modelLayout(s);
    auto flat = initialUnitValues(layout[1], 1, 5).to(torch::kFloat64);
    const auto rope = makeRope(s, 80);
    auto r64 = toDouble(rope);
    auto x = torch::randn({2, T, s.dim}, torch::kFloat64);
    auto w = torch::randn({2, T, s.dim}, torch::kFloat64);
    auto run = [&](bool fused) {
      std::vector<torch::Tensor> in{x.clone(), flat.clone()};
      if (fused)
        for (auto& t : in) t = t.to(torch::kFloat32);
      for (auto& t : in) t.requires_grad_(true);
      auto y = fused ? blockForward(parameterViews(layout[1], in[1]), in[0], rope, s) : plainBlock(in, layout[1], r64, s);
      (y * w.to(y.scalar_type())).sum().backward();
      return std::vector<torch::Tensor>{y.detach(), in[0].grad(), in[1].grad()};
    };
    auto got = run(true), want = run(false);
    const char* names[] = {"output", "dx", "dparameters"};
    for (int i = 0; i < 3; ++i) {
      const double scale = want[i].abs().max().item<double>();
      const double err = (got[i].to(torch::kFloat64) - want[i]).abs().max().item<double>();
      EXPECT_LT(err / scale, 1e-4) << names[i] << " differs by " << err << " (largest value " << scale << ")";
    }
  }
}

TEST(Model, TinyPresetHasExpectedSizeAndUnits) {
  ModelConfig m;  // defaults are the tiny preset
  auto s = shapeOf(m);
  auto units = modelLayout(s);
  ASSERT_EQ(units.size(), 6u);  // embed, 4 blocks, head
  const int64_t block = 4 * 128 * 128 + 3 * 128 * 352 + 2 * 128;
  EXPECT_EQ(units[1].numel, block);
  EXPECT_EQ(parameterCount(s), 2 * 256 * 128 + 4 * block + 128);
}

TEST(Model, InitIsDeterministicAndScaled) {
  ModelConfig m;
  auto units = modelLayout(shapeOf(m));
  auto a = initialUnitValues(units[1], 1, 42), b = initialUnitValues(units[1], 1, 42);
  EXPECT_TRUE(torch::equal(a, b));
  EXPECT_FALSE(torch::equal(a, initialUnitValues(units[1], 1, 43)));
  auto views = parameterViews(units[1], a);
  EXPECT_TRUE(torch::all(views[0] == 1).item<bool>());  // norm gain
  // The default preset (tiny) starts from N(0, 0.0625) (docs/algorithm.md, "Initialization").
  EXPECT_NEAR(views[1].std().item<double>(), 0.0625, 0.005);
  m.initStd = 0.02;  // an explicit value wins
  auto c = initialUnitValues(modelLayout(shapeOf(m))[1], 1, 42);
  EXPECT_NEAR(parameterViews(units[1], c)[1].std().item<double>(), 0.02, 0.002);
}

TEST(Model, LossOfUniformLogitsIsLogVocab) {
  ModelShape s{32, 8, 1, 2, 16, 10000.0, 1e-5, 0.02};
  auto units = modelLayout(s);
  auto head = torch::zeros({units.back().numel});
  auto p = parameterViews(units.back(), head);
  p[0].fill_(1);  // output weights 0: uniform logits
  auto x = torch::randn({2, 3, 8});
  auto y = torch::randint(0, 32, {2, 3});
  EXPECT_NEAR(headLoss(p, x, y, s).item<double>(), std::log(32.0), 1e-5);
}
