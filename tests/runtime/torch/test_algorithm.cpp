// The EDiT math pieces against hand-computed values and LibTorch's own optimizers.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "model/cpu_allocator.h"
#include "dist/flat_units.h"
#include "sync/optim.h"
#include "sync/outer_sync.h"
#include "sync/penalty.h"

using namespace edit;

TEST(Ewma, MatchesHandComputedSequence) {
  PenaltyConfig p;
  p.emaAlpha = 0.5;
  p.anomalyWarmup = 2;
  p.zThreshold = 3;
  EwmaDetector d;
  EXPECT_FALSE(d.observe(1.0, p).anomaly);  // init: mean 1, var 0
  EXPECT_DOUBLE_EQ(d.mean, 1.0);
  EXPECT_DOUBLE_EQ(d.var, 0.0);
  EXPECT_FALSE(d.observe(3.0, p).anomaly);  // d=2, mean=2, var=0.5*(0+0.5*2*1)=0.5
  EXPECT_DOUBLE_EQ(d.mean, 2.0);
  EXPECT_DOUBLE_EQ(d.var, 0.5);
  // sigma is bias-corrected: var / (1 - (1-a)^(count-1)) = 0.5 / 0.5 -> 1, so z = 0.5.
  // d=0.5 mean=2.25 var=0.5*(0.5+0.5*0.5*0.25)=0.28125
  auto v = d.observe(2.5, p);
  EXPECT_FALSE(v.anomaly);
  EXPECT_NEAR(v.z, 0.5, 1e-12);
  EXPECT_DOUBLE_EQ(d.var, 0.28125);
  // A spike: sigma = sqrt(0.28125 / 0.75) = sqrt(0.375), z = 7.75 / sigma = 12.7 > 3 ->
  // anomaly. The statistics take it clamped to mean + 3 sigma (no lock-out, no blow-up):
  // x = 2.25 + 3s, d = 3s, mean = 2.25 + 1.5s, var = 0.5 * (0.28125 + 0.5 * 3s * 1.5s).
  v = d.observe(10.0, p);
  EXPECT_TRUE(v.anomaly);
  const double sd = std::sqrt(0.375);
  EXPECT_NEAR(v.z, 7.75 / sd, 1e-9);
  EXPECT_NEAR(d.mean, 2.25 + 1.5 * sd, 1e-12);
  EXPECT_NEAR(d.var, 0.5 * (0.28125 + 0.5 * 3 * sd * 1.5 * sd), 1e-12);
  EXPECT_EQ(d.count, 4);
  // One-sided: a tiny norm is not an anomaly. NaN is, and leaves the statistics alone.
  EXPECT_FALSE(d.observe(0.0, p).anomaly);
  const auto before = d.count;
  EXPECT_TRUE(d.observe(std::numeric_limits<double>::quiet_NaN(), p).anomaly);
  EXPECT_EQ(d.count, before);
}

TEST(Ewma, AcceptsALastingShiftInsteadOfLockingOut) {
  // Norms around 1 (+-2%) for 200 rounds, then 10% higher for good: flagged for a while,
  // then normal again (the detector used to flag such a shift forever).
  PenaltyConfig p;
  p.anomalyWarmup = 10;
  EwmaDetector d;
  for (int i = 0; i < 200; ++i) d.observe(1.0 + 0.02 * std::sin(i), p);
  int flagged = 0, last = -1;
  for (int i = 0; i < 200; ++i)
    if (d.observe(1.1 + 0.02 * std::sin(i), p).anomaly) {
      ++flagged;
      last = i;
    }
  EXPECT_GT(flagged, 0);
  EXPECT_LT(last, 60) << "still flagged " << last << " rounds after the shift";
}

TEST(Ewma, NoVerdictDuringWarmupOrWhenDisabled) {
  PenaltyConfig p;
  p.anomalyWarmup = 10;
  EwmaDetector d;
  for (int i = 0; i < 5; ++i) d.observe(1.0 + 0.01 * i, p);
  EXPECT_FALSE(d.observe(1000.0, p).anomaly);
  p.anomaly = false;
  p.anomalyWarmup = 0;
  EwmaDetector e;
  for (int i = 0; i < 5; ++i) e.observe(1.0 + 0.01 * i, p);
  EXPECT_FALSE(e.observe(1000.0, p).anomaly);
}

TEST(Weights, SoftmaxOfNegativeNorms) {
  PenaltyConfig p;
  p.temperature = 2.0;
  auto w = replicaWeights({1.0, 2.0, 4.0}, {}, p, true, false);
  const double e1 = std::exp(-0.5), e2 = std::exp(-1.0), e4 = std::exp(-2.0), z = e1 + e2 + e4;
  EXPECT_NEAR(w[0], e1 / z, 1e-12);
  EXPECT_NEAR(w[1], e2 / z, 1e-12);
  EXPECT_NEAR(w[2], e4 / z, 1e-12);
}

TEST(Weights, AnomalousReplicaGetsZeroAndUniformWhenUnweighted) {
  PenaltyConfig p;
  const double inf = std::numeric_limits<double>::infinity();
  auto w = replicaWeights({1.0, inf, 1.0, 3.0}, {}, p, false, false);
  EXPECT_DOUBLE_EQ(w[1], 0.0);
  EXPECT_DOUBLE_EQ(w[0], 1.0 / 3);
  EXPECT_DOUBLE_EQ(w[3], 1.0 / 3);
  auto none = replicaWeights({inf, inf}, {}, p, true, false);
  EXPECT_DOUBLE_EQ(none[0] + none[1], 0.0);
  // Huge norms must not underflow to 0/0.
  auto big = replicaWeights({1000.0, 1001.0}, {}, p, true, false);
  EXPECT_NEAR(big[0], 1 / (1 + std::exp(-1.0)), 1e-12);
}

TEST(Weights, MedianTemperatureDoesNotDependOnTheScale) {
  PenaltyConfig p;
  p.weighting = Weighting::Median;
  const double inf = std::numeric_limits<double>::infinity();
  // Median of the kept norms {10, 20, 30} is 20: softmax(-g/20).
  auto w = replicaWeights({10.0, 20.0, inf, 30.0}, {}, p, true, false);
  const double e1 = std::exp(-0.5), e2 = std::exp(-1.0), e3 = std::exp(-1.5), z = e1 + e2 + e3;
  EXPECT_NEAR(w[0], e1 / z, 1e-12);
  EXPECT_NEAR(w[1], e2 / z, 1e-12);
  EXPECT_EQ(w[2], 0.0);
  EXPECT_NEAR(w[3], e3 / z, 1e-12);
  auto scaled = replicaWeights({1000.0, 2000.0, inf, 3000.0}, {}, p, true, false);
  for (int m = 0; m < 4; ++m) EXPECT_NEAR(scaled[m], w[m], 1e-12);
}

TEST(Weights, StepShareBlendsFreshWork) {
  PenaltyConfig p;
  p.stepShare = 0.5;
  // Equal norms: softmax 1/2 each; steps 3 and 1: shares 3/4, 1/4 → 0.625, 0.375.
  auto w = replicaWeights({2.0, 2.0}, {3.0, 1.0}, p, true, true);
  EXPECT_NEAR(w[0], 0.625, 1e-12);
  EXPECT_NEAR(w[1], 0.375, 1e-12);
}

TEST(Clip, ScaleFactor) {
  EXPECT_DOUBLE_EQ(clipScale(5.0, 10.0), 1.0);
  EXPECT_NEAR(clipScale(20.0, 10.0), 10.0 / (20.0 + 1e-6), 1e-15);
}

TEST(OuterStep, MatchesTorchSgdNesterov) {
  for (bool nesterov : {true, false}) {
    auto p = torch::randn({10});
    auto mom = torch::zeros({10});
    auto ref = p.clone().requires_grad_(true);
    torch::optim::SGD sgd({ref}, torch::optim::SGDOptions(0.7).momentum(0.8).nesterov(nesterov));
    for (int i = 0; i < 5; ++i) {
      auto g = torch::randn({10});
      auto scratch = g.clone();  // outerStep overwrites its gradient argument
      outerStep(p, mom, scratch, 0.7, 0.8, nesterov);
      ref.mutable_grad() = g.clone();
      sgd.step();
      ASSERT_TRUE(torch::allclose(p, ref.detach(), 1e-6, 1e-6)) << "nesterov=" << nesterov << " i=" << i;
    }
  }
}

TEST(ShardedAdamW, MatchesTorchAdamWOnTheSameSlices) {
  TrainingConfig c;
  c.weightDecay = 0.1;
  ModelShape s{16, 8, 1, 2, 12, 10000.0, 1e-5, 0.02};
  for (int shards : {1, 3}) {
    for (int shard = 0; shard < shards; ++shard) {
      auto units = buildUnits(s, shards, shard, 5);
      ShardedAdamW opt(c, units);
      // Reference: each unit's slice as two parameters (decay / no decay) split by mask.
      std::vector<torch::Tensor> dec, nodec, masks;
      for (auto& u : units) {
        // Decay mask from the layout (matrices decay, gains do not), cut to this slice.
        auto full = torch::zeros({u.padded}, torch::kBool);
        for (const auto& p : u.layout.params)
          if (p.shape.size() >= 2) full.narrow(0, p.offset, p.numel).fill_(true);
        auto m = full.narrow(0, shard * u.chunk, u.chunk).clone();
        masks.push_back(m);
        dec.push_back(u.slice.masked_select(m).clone().requires_grad_(true));
        nodec.push_back(u.slice.masked_select(~m).clone().requires_grad_(true));
      }
      std::vector<torch::optim::OptimizerParamGroup> groups;
      groups.emplace_back(dec, std::make_unique<torch::optim::AdamWOptions>(
                                   torch::optim::AdamWOptions(1e-2).betas({c.beta1, c.beta2}).eps(c.eps).weight_decay(0.1)));
      groups.emplace_back(nodec, std::make_unique<torch::optim::AdamWOptions>(
                                     torch::optim::AdamWOptions(1e-2).betas({c.beta1, c.beta2}).eps(c.eps).weight_decay(0)));
      torch::optim::AdamW ref(groups, torch::optim::AdamWOptions(1e-2));
      for (int step = 0; step < 4; ++step) {
        for (size_t i = 0; i < units.size(); ++i) {
          auto g = torch::randn({units[i].chunk});
          units[i].gradSlice.copy_(g);
          dec[i].mutable_grad() = g.masked_select(masks[i]);
          nodec[i].mutable_grad() = g.masked_select(~masks[i]);
        }
        opt.step(units, 1e-2);
        ref.step();
      }
      for (size_t i = 0; i < units.size(); ++i) {
        EXPECT_TRUE(torch::allclose(units[i].slice.masked_select(masks[i]), dec[i].detach(), 1e-5, 1e-6));
        EXPECT_TRUE(torch::allclose(units[i].slice.masked_select(~masks[i]), nodec[i].detach(), 1e-5, 1e-6));
      }
    }
  }
}

TEST(LearningRate, WarmupThenCosine) {
  TrainingConfig c;
  c.lr = 1.0;
  c.minLr = 0.1;
  c.lrWarmupSteps = 10;
  EXPECT_DOUBLE_EQ(learningRate(c, 0, 110), 0.1);
  EXPECT_DOUBLE_EQ(learningRate(c, 9, 110), 1.0);
  EXPECT_NEAR(learningRate(c, 10, 110), 1.0, 1e-12);
  EXPECT_NEAR(learningRate(c, 60, 110), 0.55, 1e-12);
  EXPECT_NEAR(learningRate(c, 110, 110), 0.1, 1e-12);
}

TEST(FlatUnits, UnshardedParametersAreViewsOfTheFlatBuffers) {
  ModelShape s{16, 8, 1, 2, 12, 10000.0, 1e-5, 0.02};
  auto units = buildUnits(s, 1, 0, 3);
  auto& u = units[1];
  EXPECT_TRUE(u.gathered());
  EXPECT_EQ(u.slice.data_ptr<float>(), u.full.data_ptr<float>());
  {
    torch::NoGradGuard ng;
    u.full.fill_(0.5);
  }
  for (auto& p : u.params) EXPECT_TRUE(torch::all(p == 0.5).item<bool>());
  // Gradients accumulate into the flat gradient slice (the whole unit with one shard).
  (u.params[1].sum() * 2).backward();
  EXPECT_DOUBLE_EQ(u.gradSlice.narrow(0, u.layout.params[1].offset, u.layout.params[1].numel).sum().item<double>(),
                   2.0 * u.layout.params[1].numel);
}

TEST(FlatUnits, ShardedParametersHoldMemoryOnlyWhileGathered) {
  ModelShape s{16, 8, 1, 2, 12, 10000.0, 1e-5, 0.02};
  auto units = buildUnits(s, 2, 1, 3);
  auto& u = units[1];
  EXPECT_EQ(u.padded % 2, 0);
  EXPECT_EQ(u.slice.numel(), u.chunk);
  EXPECT_FALSE(u.gathered());
  EXPECT_EQ(u.full.storage().nbytes(), 0u);
  auto w = u.layout.params[1];  // a matrix

  auto a = torch::full({u.padded}, 0.5);
  attachFull(u, a);
  EXPECT_EQ(u.full.storage().nbytes(), static_cast<size_t>(u.padded) * 4);
  for (auto& p : u.params) EXPECT_TRUE(torch::all(p == 0.5).item<bool>());
  // A graph built on the gathered values saves the weight for its backward...
  auto y = (u.params[1] * u.params[1]).sum();
  auto back = detachFull(u);
  EXPECT_TRUE(back.is_same(a));
  EXPECT_EQ(u.full.storage().nbytes(), 0u);
  // ...and sees the memory attached for the backward (the re-gather), not the old one.
  attachFull(u, torch::full({u.padded}, 0.25));
  auto g = torch::zeros({u.padded});
  u.bindGrads(g);
  y.backward();
  EXPECT_TRUE(torch::all(g.narrow(0, w.offset, w.numel) == 0.5).item<bool>());  // d(w^2)/dw = 2w
  EXPECT_EQ(g.narrow(0, 0, w.offset).abs().sum().item<double>(), 0.0);
  u.unbindGrads();
  EXPECT_FALSE(u.params[1].grad().defined());
  detachFull(u);
}

TEST(FlatUnits, BufferCacheReusesAndBoundsWhatItKeeps) {
  BufferCache cache(torch::TensorOptions().dtype(torch::kFloat32), 1);
  auto a = cache.take(100), b = cache.take(100);
  EXPECT_EQ(cache.liveBytes(), 800);
  void* pa = a.data_ptr();
  cache.give(a);
  cache.give(b);  // over the limit of one per size: freed
  EXPECT_EQ(cache.liveBytes(), 0);
  EXPECT_EQ(cache.cachedBytes(), 400);
  EXPECT_EQ(cache.peakLiveBytes(), 800);
  EXPECT_EQ(cache.take(100).data_ptr(), pa);
}

TEST(CachingCpuAllocator, ReusesFreedBlocksOfTheSameSize) {
  installCachingCpuAllocator(int64_t{64} << 20);
  void* first = nullptr;
  {
    auto a = torch::empty({1 << 18});  // 1 MiB: cached size class
    first = a.data_ptr();
  }
  const auto before = cachingAllocatorStats();
  EXPECT_GE(before.cachedBytes, int64_t{1} << 20);
  auto b = torch::empty({1 << 18});
  EXPECT_EQ(b.data_ptr(), first);  // the freed block, not a new one
  EXPECT_EQ(cachingAllocatorStats().hits, before.hits + 1);
  b.fill_(2.5);  // usable memory
  EXPECT_EQ(b.sum().item<double>(), 2.5 * (1 << 18));
  // Small requests are not cached (malloc's bins serve them well).
  const auto misses = cachingAllocatorStats().misses;
  { auto s = torch::empty({16}); }
  EXPECT_EQ(cachingAllocatorStats().misses, misses);
}
