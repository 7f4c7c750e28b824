// Model building blocks against naive element-by-element implementations.
#include <gtest/gtest.h>

#include <cmath>

#include "model.h"

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
  auto x = torch::randn({1, 5, 2, 4});
  auto y = applyRope(x, rope);
  for (int t = 0; t < 5; ++t)
    for (int h = 0; h < 2; ++h)
      for (int i = 0; i < 2; ++i) {
        const double theta = t * std::pow(10000.0, -2.0 * i / 4);
        const double a = x[0][t][h][i].item<double>(), b = x[0][t][h][i + 2].item<double>();
        EXPECT_NEAR(y[0][t][h][i].item<double>(), a * std::cos(theta) - b * std::sin(theta), 1e-5);
        EXPECT_NEAR(y[0][t][h][i + 2].item<double>(), b * std::cos(theta) + a * std::sin(theta), 1e-5);
      }
  // Rotation keeps norms.
  EXPECT_NEAR(y.norm().item<double>(), x.norm().item<double>(), 1e-4);
}

TEST(Model, CausalAttentionMatchesNaiveLoop) {
  auto q = torch::randn({1, 1, 4, 3}), k = torch::randn({1, 1, 4, 3}), v = torch::randn({1, 1, 4, 3});
  auto y = causalAttention(q, k, v);
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
      EXPECT_NEAR(y[0][0][i][d].item<double>(), acc, 1e-5);
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
  EXPECT_NEAR(views[1].std().item<double>(), 0.02, 0.002);
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
