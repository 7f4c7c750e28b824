// int8 and int4 compression of the sync round (algorithm.syncCompression): the runtime's
// quantizer and int4 packing against the independent reference in
// compression_reference.h, its error bound, error feedback conserving the sum over rounds, syncUnit on M x N ranks against
// the reference round (penalty_reference.h on the dequantized values), replicas bit for
// bit identical, a NaN dropped before it is quantized, and the bytes each rank sends.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "sync/compression.h"
#include "compression_reference.h"
#include "sync/outer_sync.h"
#include "penalty_reference.h"
#include "test_util.h"

using namespace edit;

namespace {

std::vector<float> randomVec(int64_t n, uint64_t seed, double scale = 1.0) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> nd;
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(scale * nd(rng));
  return v;
}

torch::Tensor tensorOf(const std::vector<float>& v) {
  return torch::from_blob(const_cast<float*>(v.data()), {static_cast<int64_t>(v.size())}, torch::kFloat32).clone();
}

std::vector<float> vecOf(const torch::Tensor& t) {
  auto c = t.to(torch::kFloat32).contiguous();
  return std::vector<float>(c.data_ptr<float>(), c.data_ptr<float>() + c.numel());
}

TEST(Compression, QuantizeMatchesReferenceWithinHalfAStep) {
  // A tail block shorter than the block, an all-zero block, and blocks whose magnitudes
  // differ by 1e6 (one scale per block keeps the small ones).
  for (auto [block, levels] : {std::pair<int64_t, int>{16, 127}, {256, 127}, {16, 7}, {256, 7}}) {
    SCOPED_TRACE("levels " + std::to_string(levels));
    auto x = randomVec(1000, 3);
    for (int64_t i = 0; i < 16; ++i) x[i] = 0;
    for (int64_t i = 300; i < 600; ++i) x[i] *= 1e-6f;
    const auto want = ref::quantize(x, block, levels);
    auto q = torch::empty({1000}, torch::kInt8);
    auto scales = torch::empty({blockCount(1000, block)});
    ASSERT_TRUE(quantizeBlocks(tensorOf(x), block, levels, q, scales));
    ASSERT_EQ(scales.numel(), static_cast<int64_t>(want.scales.size()));
    for (size_t b = 0; b < want.scales.size(); ++b) EXPECT_EQ(scales[b].item<float>(), want.scales[b]) << b;
    auto qa = q.accessor<int8_t, 1>();
    for (int64_t i = 0; i < 1000; ++i) ASSERT_EQ(qa[i], want.q[i]) << "block " << block << " element " << i;
    auto back = torch::empty({1000});
    dequantizeBlocks(q, scales, block, back);
    const auto got = vecOf(back);
    EXPECT_EQ(got, ref::dequantize(want, block));
    for (int64_t b = 0; b < 1000; b += block) {
      double amax = 0;
      for (int64_t i = b; i < std::min<int64_t>(1000, b + block); ++i) amax = std::max(amax, std::fabs(double(x[i])));
      for (int64_t i = b; i < std::min<int64_t>(1000, b + block); ++i)
        EXPECT_LE(std::fabs(double(got[i]) - x[i]), amax / (2 * levels) * (1 + 1e-6)) << "block " << block << " element " << i;
    }
  }
}

TEST(Compression, NonFiniteIsReportedNotQuantized) {
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    auto x = randomVec(100, 5);
    x[57] = bad;
    EXPECT_FALSE(ref::quantize(x, 32).finite);
    auto q = torch::full({100}, 3, torch::kInt8);
    auto scales = torch::full({4}, 1.0f);
    EXPECT_FALSE(quantizeBlocks(tensorOf(x), 32, 127, q, scales));
    EXPECT_EQ(q.abs().sum().item<int64_t>(), 0);
    EXPECT_EQ(scales.abs().sum().item<float>(), 0.0f);
  }
}

// What a case feeds in: per round, each replica's pseudo-gradient of the unit (length P).
struct Scenario {
  int M = 2, N = 2;
  int64_t P = 100;
  std::vector<std::vector<std::vector<double>>> D;  // [round][replica][P]
  std::vector<double> outer0;
};

struct RankRound {
  UnitSyncResult res;
  std::vector<float> fed;  // the pseudo-gradient syncUnit saw: outer - inner, in float
  std::vector<float> outer, momentum, residual, averageResidual;
};

// syncUnit with int8 on M x N ranks; returns [round][rank], and each rank's bytes sent
// in the sync group.
std::vector<std::vector<RankRound>> runDistributed(const Scenario& sc, const SyncSettings& s,
                                                   std::vector<uint64_t>* syncBytes = nullptr) {
  const int W = sc.M * sc.N;
  const int64_t chunk = sc.P / sc.N;
  const int port = test::freePort();
  std::vector<std::vector<RankRound>> out(sc.D.size(), std::vector<RankRound>(W));
  if (syncBytes) syncBytes->assign(W, 0);
  test::runRanks(W, [&](int r) {
    const int m = r / sc.N, sh = r % sc.N;
    Comm comm(test::meshFor(r, sc.M, sc.N, port));
    auto outer0 = torch::tensor(sc.outer0, torch::kFloat64).to(torch::kFloat32);
    FlatUnit unit = test::sliceUnit(sc.N, sh, sc.P);
    OuterUnit o{outer0.narrow(0, sh * chunk, chunk).clone(), torch::zeros({chunk}), torch::zeros({chunk}),
                torch::zeros({ownedPartLength(chunk, s.block, sc.M, m)})};
    EwmaDetector det;
    for (size_t k = 0; k < sc.D.size(); ++k) {
      auto Dm = torch::tensor(sc.D[k][m], torch::kFloat64).to(torch::kFloat32).narrow(0, sh * chunk, chunk);
      unit.slice.copy_(o.outer - Dm);
      auto& rr = out[k][r];
      rr.fed = vecOf(o.outer - unit.slice);
      rr.res = syncUnit(comm, unit, o, det, s, 1);
      rr.outer = vecOf(o.outer);
      rr.momentum = vecOf(o.momentum);
      rr.residual = vecOf(o.residual);
      rr.averageResidual = vecOf(o.averageResidual);
      EXPECT_TRUE(torch::equal(unit.slice, o.outer)) << "rank " << r << ": inner weights must be the outer ones";
    }
    if (syncBytes)
      for (auto& [key, c] : comm.counters())
        if (key.second == "sync") (*syncBytes)[r] += c.bytes;
  });
  return out;
}

// The reference of each round: every replica sends its slices through
// ref::sendWithFeedback, and ref::round (the penalty and the outer step) runs on what was
// sent, averaging each part of each slice with ref::averageAndSend at its owner (sync
// rank c owns part c). A dropped replica's residual stays as it was. Compares every
// rank, every round.
void expectMatchesReference(const Scenario& sc, const SyncSettings& s, const ref::Params& p,
                            const std::vector<std::vector<RankRound>>& got,
                            std::vector<ref::Round>* roundsOut = nullptr) {
  const int64_t chunk = sc.P / sc.N;
  std::vector<ref::Stats> stats(sc.M);
  std::vector<double> outer(sc.outer0.begin(), sc.outer0.end()), momentum(sc.P, 0.0);
  for (auto& x : outer) x = static_cast<float>(x);
  std::vector<std::vector<float>> residual(sc.M * sc.N, std::vector<float>(chunk, 0.0f));
  std::vector<std::vector<float>> ownerResidual(sc.M * sc.N);  // rank c*N+sh owns part c of shard sh
  for (int r = 0; r < sc.M * sc.N; ++r) {
    const auto [b, e] = ref::partRange(chunk, s.block, sc.M, r / sc.N);
    ownerResidual[r].assign(e - b, 0.0f);
  }
  auto average = [&](const std::vector<std::vector<double>>& D, const std::vector<double>& w) {
    std::vector<double> avg(sc.P, 0.0);
    for (int sh = 0; sh < sc.N; ++sh)
      for (int c = 0; c < sc.M; ++c) {
        const auto [b, e] = ref::partRange(chunk, s.block, sc.M, c);
        std::vector<std::vector<float>> parts(sc.M);
        for (int m = 0; m < sc.M; ++m)
          for (int64_t i = b; i < e; ++i) parts[m].push_back(static_cast<float>(D[m][sh * chunk + i]));
        const auto got = ref::averageAndSend(parts, w, ownerResidual[c * sc.N + sh], s.block, s.codec.levels());
        for (int64_t i = b; i < e; ++i) avg[sh * chunk + i] = got[i - b];
      }
    return avg;
  };
  for (size_t k = 0; k < sc.D.size(); ++k) {
    std::vector<std::vector<double>> sent(sc.M, std::vector<double>(sc.P));
    auto next = residual;
    for (int r = 0; r < sc.M * sc.N; ++r) {
      const auto part = ref::sendWithFeedback(got[k][r].fed, next[r], s.block, s.codec.levels());
      for (int64_t i = 0; i < chunk; ++i)
        sent[r / sc.N][(r % sc.N) * chunk + i] = part[i];
      bool finite = true;
      for (float x : got[k][r].fed) finite &= std::isfinite(x);
      if (!finite)  // the reference quantizer sends nothing for it: mark the replica
        for (auto& x : sent[r / sc.N]) x = NAN;
    }
    const auto rr = ref::round(sent, stats, outer, momentum, p, {}, average);
    if (roundsOut) roundsOut->push_back(rr);
    for (int r = 0; r < sc.M * sc.N; ++r)
      if (!rr.flagged[r / sc.N]) residual[r] = next[r];
    for (int r = 0; r < sc.M * sc.N; ++r) {
      const int m = r / sc.N, sh = r % sc.N;
      const auto& g = got[k][r];
      const std::string at = "round " + std::to_string(k) + " rank " + std::to_string(r);
      EXPECT_EQ(g.res.anomaly, static_cast<bool>(rr.flagged[m])) << at;
      EXPECT_EQ(g.res.skipped, rr.skipped) << at;
      if (s.penaltyOn() && !rr.flagged[m]) EXPECT_NEAR(g.res.norm, rr.norms[m], 1e-5 * (1 + rr.norms[m])) << at;
      if (!rr.skipped) EXPECT_NEAR(g.res.weight, rr.weights[m], 1e-6) << at;
      EXPECT_EQ(g.residual, residual[r]) << at << ": residual";
      // The owner's average depends on the weights, which the reference computes from its
      // own (double) norms: equal to ~1e-7 relative, far below one quantization step
      // (~1e-3 here), so a wrongly quantized element would still show.
      ASSERT_EQ(g.averageResidual.size(), ownerResidual[r].size()) << at;
      for (size_t i = 0; i < g.averageResidual.size(); ++i)
        EXPECT_NEAR(g.averageResidual[i], ownerResidual[r][i], s.penalty.weighted ? 1e-6 : 0.0)
            << at << " element " << i << ": residual of the owned part's average";
      for (int64_t i = 0; i < chunk; ++i) {
        const double want = outer[sh * chunk + i], mom = momentum[sh * chunk + i];
        const bool ok = std::fabs(g.outer[i] - want) <= 2e-5 * (1 + std::fabs(want)) &&
                        std::fabs(g.momentum[i] - mom) <= 2e-5 * (1 + std::fabs(mom));
        EXPECT_TRUE(ok) << at << " element " << i << ": outer " << g.outer[i] << " want " << want;
        if (!ok) break;
      }
      // Every replica holds the same outer slice, bit for bit.
      EXPECT_EQ(g.outer, got[k][sh].outer) << at;
      EXPECT_EQ(g.momentum, got[k][sh].momentum) << at;
      for (float x : g.outer) ASSERT_TRUE(std::isfinite(x)) << at;
    }
  }
}

ref::Params refParams(const SyncSettings& s) {
  ref::Params p;
  p.anomaly = s.penalty.anomaly;
  p.weighted = s.penalty.weighted;
  p.clip = s.penalty.clip;
  p.alpha = s.penalty.emaAlpha;
  p.z = s.penalty.zThreshold;
  p.temperature = s.penalty.temperature;
  p.clipNorm = s.penalty.clipNorm;
  p.warmup = s.penalty.anomalyWarmup;
  p.lr = s.lr;
  p.momentum = s.momentum;
  p.nesterov = s.nesterov;
  return p;
}

Scenario makeScenario(int M, int N, int rounds, const std::function<double(int, int, double)>& norm = {}) {
  Scenario sc;
  sc.M = M;
  sc.N = N;
  sc.P = 50 * N;  // slices of 50: three blocks of 16 and a tail of 2
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<double> u(-0.05, 0.05);
  for (int k = 0; k < rounds; ++k) {
    sc.D.emplace_back();
    for (int m = 0; m < M; ++m) {
      const double g = norm ? norm(k, m, 1.0 + u(rng)) : 1.0 + u(rng);
      auto v = randomVec(sc.P, 100 * m + k);
      double n = 0;
      for (float x : v) n += double(x) * x;
      std::vector<double> d(sc.P);
      for (int64_t i = 0; i < sc.P; ++i) d[i] = v[i] * g / std::sqrt(n);
      sc.D.back().push_back(d);
    }
  }
  auto o = randomVec(sc.P, 7, 0.4);
  sc.outer0.assign(o.begin(), o.end());
  return sc;
}

SyncSettings compressedSettings(const std::string& mode, const std::string& codec) {
  AlgorithmConfig a;
  a.mode = enumOf<Mode>(mode, "mode");
  a.penalty.anomalyWarmup = 4;
  a.syncCompression = enumOf<Compression>(codec, "codec");
  a.compressionBlock = 16;
  return syncSettingsFor(a);
}

const std::vector<std::string> kCodecs = {"int8", "int4"};

TEST(Compression, SyncRoundsMatchReferenceOn2x2And4x1) {
  for (const auto& codec : kCodecs)
    for (auto [M, N] : {std::pair{2, 2}, std::pair{4, 1}}) {
      SCOPED_TRACE(codec + " " + std::to_string(M) + "x" + std::to_string(N));
      // Replica 1's norm x10 at round 7, after the test is armed: dropped, its residual kept.
      auto sc = makeScenario(M, N, 9, [](int k, int m, double g) { return k == 7 && m == 1 ? 10 * g : g; });
      const auto s = compressedSettings("edit", codec);
      const auto got = runDistributed(sc, s);
      std::vector<ref::Round> rounds;
      expectMatchesReference(sc, s, refParams(s), got, &rounds);
      EXPECT_TRUE(rounds[7].flagged[1]);
      for (int k = 0; k < 7; ++k) EXPECT_FALSE(rounds[k].flagged[1]) << k;
      for (int sh = 0; sh < N; ++sh) EXPECT_EQ(got[7][N + sh].residual, got[6][N + sh].residual);
    }
}

TEST(Compression, NaNIsDroppedBeforeQuantizingAndNeverReachesTheOuterWeights) {
  for (const auto& codec : kCodecs) {
    SCOPED_TRACE(codec);
    const int M = 2, N = 2;
    auto sc = makeScenario(M, N, 4);
    sc.D[2][1][3] = std::numeric_limits<double>::quiet_NaN();  // replica 1, shard 0's slice only
    const auto s = compressedSettings("edit", codec);
    const auto got = runDistributed(sc, s);
    std::vector<ref::Round> rounds;
    expectMatchesReference(sc, s, refParams(s), got, &rounds);
    for (int sh = 0; sh < N; ++sh) {  // the whole replica is dropped, on both its shards
      EXPECT_TRUE(got[2][N + sh].res.anomaly);
      EXPECT_EQ(got[2][N + sh].res.weight, 0.0);
      EXPECT_EQ(got[2][N + sh].residual, got[1][N + sh].residual);
    }
    EXPECT_FALSE(rounds[3].flagged[1]);
  }
}

TEST(Compression, ErrorFeedbackConservesTheSumOverRounds) {
  // Plain averaging (localsgd: outer := outer - the average every rank received): over K
  // rounds, M x (how far the outer weights moved) + every replica's final residual + M x
  // the owner's residual of the average must equal the sum of every pseudo-gradient fed
  // in. Checked for the reference's sending stage too.
  for (const auto& codec : kCodecs) {
    SCOPED_TRACE(codec);
    const int M = 2, N = 2, K = 20;
    auto sc = makeScenario(M, N, K);
    const auto s = compressedSettings("localsgd", codec);
    const auto got = runDistributed(sc, s);
    const int64_t chunk = sc.P / N;
    for (int r = 0; r < M * N; ++r) {
      std::vector<float> res(chunk, 0.0f);
      std::vector<double> fedSum(chunk, 0.0), refSent(chunk, 0.0);
      for (int k = 0; k < K; ++k) {
        const auto part = ref::sendWithFeedback(got[k][r].fed, res, s.block, s.codec.levels());
        for (int64_t i = 0; i < chunk; ++i) {
          fedSum[i] += got[k][r].fed[i];
          refSent[i] += part[i];
        }
      }
      for (int64_t i = 0; i < chunk; ++i) EXPECT_NEAR(refSent[i] + res[i], fedSum[i], 1e-5) << "reference " << i;
    }
    for (int sh = 0; sh < N; ++sh)
      for (int64_t i = 0; i < chunk; ++i) {
        double fed = 0, resid = 0;
        for (int m = 0; m < M; ++m) {
          for (int k = 0; k < K; ++k) fed += got[k][m * N + sh].fed[i];
          resid += got[K - 1][m * N + sh].residual[i];
        }
        for (int c = 0; c < M; ++c) {  // the owner of element i's part
          const auto [b, e] = ref::partRange(chunk, s.block, M, c);
          if (i >= b && i < e) resid += M * got[K - 1][c * N + sh].averageResidual[i - b];
        }
        const double moved = static_cast<double>(static_cast<float>(sc.outer0[sh * chunk + i])) - got[K - 1][sh].outer[i];
        EXPECT_NEAR(M * moved + resid, fed, 1e-4) << "shard " << sh << " element " << i;
      }
  }
}

TEST(Compression, BytesSentAreAQuantizedReduceScatterAndAllGather) {
  for (const auto& codec : kCodecs)
    for (auto [M, N] : {std::pair{2, 2}, std::pair{4, 1}}) {
      auto sc = makeScenario(M, N, 3);
      std::vector<uint64_t> bytes;
      runDistributed(sc, compressedSettings("edit", codec), &bytes);
      const int64_t chunk = sc.P / N;
      // Per round: to each of the (M - 1) other ranks one part's record (16 header bytes,
      // fp32 scales, the values: a byte each for int8, two per byte for int4, padded to 8),
      // then the owned part's average to each of them (no header). Records are sized for
      // the longest part.
      int64_t longest = 0;
      for (int c = 0; c < M; ++c) {
        const auto [b, e] = ref::partRange(chunk, 16, M, c);
        longest = std::max(longest, e - b);
      }
      const int64_t scales = 4 * ((longest + 15) / 16), values = codec == "int8" ? longest : (longest + 1) / 2;
      const uint64_t toOwner = (16 + scales + values + 7) / 8 * 8, fromOwner = (scales + values + 7) / 8 * 8;
      for (int r = 0; r < M * N; ++r)
        EXPECT_EQ(bytes[r], 3 * (M - 1) * (toOwner + fromOwner)) << codec << " " << M << "x" << N << " rank " << r;
    }
}

TEST(Compression, SendsAtMostThirtyOrFifteenPercentOfTheFp32AllReduce) {
  // A realistic slice (4096 elements per rank, the default block of 256) at M = 2 and 4:
  // int8 <= 30% of fp32's bytes, int4 <= 15%.
  for (const auto& codec : kCodecs)
    for (auto [M, N] : {std::pair{2, 2}, std::pair{4, 1}}) {
      Scenario sc;
      sc.M = M;
      sc.N = N;
      sc.P = 4096 * N;
      sc.D.emplace_back();
      for (int m = 0; m < M; ++m) {
        const auto v = randomVec(sc.P, 40 + m, 1e-3);
        sc.D.back().emplace_back(v.begin(), v.end());
      }
      const auto o = randomVec(sc.P, 8);
      sc.outer0.assign(o.begin(), o.end());
      auto s = compressedSettings("edit", codec);
      s.block = 256;
      std::vector<uint64_t> compressed, fp32;
      runDistributed(sc, s, &compressed);
      s.codec = Codec{};
      runDistributed(sc, s, &fp32);
      for (int r = 0; r < M * N; ++r) {
        EXPECT_GT(fp32[r], 0u);
        EXPECT_LE(static_cast<double>(compressed[r]) / fp32[r], codec == "int8" ? 0.30 : 0.15)
            << codec << " " << M << "x" << N << " rank " << r;
      }
    }
}

// The synchronous warm-up's gradient average under compression (compressedMean): every
// rank of a sync group ends with the same bits, equal to the reference (each replica's
// part quantized as sent, no error feedback; the owner's fp32 mean requantized), within
// a quantization step of the exact mean, in about a quarter of the all-reduce's bytes;
// a NaN on one rank makes its part NaN on every rank and leaves the other parts finite.
TEST(Compression, WarmupGradientMeanMatchesReferenceOnEveryRank) {
  for (const auto& codec : kCodecs)
    for (auto [M, N] : {std::pair{2, 2}, std::pair{4, 1}}) {
      const int W = M * N, levels = codec == "int4" ? 7 : 127;
      const int64_t n = 1000, block = 64;  // several parts, a short last block
      std::vector<std::vector<float>> grad(W);
      for (int r = 0; r < W; ++r) grad[r] = randomVec(n, 70 + r, 1e-2);
      for (bool withNaN : {false, true}) {
        const int64_t nanAt = 5;  // in part 0
        std::vector<std::vector<float>> got(W);
        std::vector<uint64_t> bytes(W, 0);
        const int port = test::freePort();
        test::runRanks(W, [&](int r) {
          Comm comm(test::meshFor(r, M, N, port));
          auto x = tensorOf(grad[r]);
          if (withNaN && r == N) x[nanAt] = std::numeric_limits<float>::quiet_NaN();  // replica 1
          compressedMean(comm, x, Codec::of(enumOf<Compression>(codec, "codec")), block);
          got[r] = vecOf(x);
          for (auto& [key, c] : comm.counters())
            if (key.second == "sync") bytes[r] += c.bytes;
        });
        for (int sh = 0; sh < N; ++sh) {
          std::vector<float> want(n);
          for (int c = 0; c < M; ++c) {
            const auto [b, e] = ref::partRange(n, block, M, c);
            std::vector<std::vector<float>> sent(M);
            for (int m = 0; m < M; ++m) {
              std::vector<float> part(grad[m * N + sh].begin() + b, grad[m * N + sh].begin() + e), none(e - b, 0.0f);
              sent[m] = ref::sendWithFeedback(part, none, block, levels);
            }
            std::vector<float> none(e - b, 0.0f);
            const auto mean = ref::averageAndSend(sent, std::vector<double>(M, 1.0 / M), none, block, levels);
            std::copy(mean.begin(), mean.end(), want.begin() + b);
          }
          const auto [b0, e0] = ref::partRange(n, block, M, 0);
          for (int m = 0; m < M; ++m) {
            const auto& g = got[m * N + sh];
            for (int64_t i = 0; i < n; ++i) {
              if (withNaN && sh == 0 && i >= b0 && i < e0) {  // replica 1's shard 0 sent the NaN
                ASSERT_TRUE(std::isnan(g[i])) << codec << " " << M << "x" << N << " replica " << m << " element " << i;
                continue;
              }
              ASSERT_EQ(g[i], want[i]) << codec << " " << M << "x" << N << " replica " << m << " element " << i;
              double exact = 0;
              for (int k = 0; k < M; ++k) exact += grad[k * N + sh][i] / M;
              // Two quantizations, each within half a step of a block whose absmax is at most ~5e-2.
              EXPECT_NEAR(g[i], exact, codec == "int4" ? 1e-2 : 1e-3);
            }
          }
        }
        if (withNaN) continue;
        // An fp32 ring all-reduce sends 2(M-1)/M x 4n bytes; this sends about a quarter (int8).
        const double fp32 = 2.0 * (M - 1) / M * 4 * n;
        for (int r = 0; r < W; ++r) EXPECT_LE(bytes[r] / fp32, codec == "int8" ? 0.30 : 0.16) << codec << " rank " << r;
      }
    }
}

TEST(Compression, Int4PacksTwoValuesPerByteLowNibbleFirst) {
  for (int64_t n : {1, 2, 7, 64, 1001}) {
    std::mt19937_64 rng(n);
    std::uniform_int_distribution<int> u(-7, 7);
    std::vector<int8_t> q(n);
    for (auto& v : q) v = static_cast<int8_t>(u(rng));
    q[0] = -7;
    if (n > 1) q[1] = 7;
    const auto want = ref::packInt4(q);
    auto qt = torch::from_blob(q.data(), {n}, torch::kInt8).clone();
    auto bytes = torch::empty({(n + 1) / 2}, torch::kUInt8);
    packInt4(qt, bytes);
    auto ba = bytes.accessor<uint8_t, 1>();
    for (int64_t i = 0; i < bytes.numel(); ++i) ASSERT_EQ(ba[i], want[i]) << "n " << n << " byte " << i;
    auto back = torch::empty({n}, torch::kInt8);
    unpackInt4(bytes, back);
    EXPECT_TRUE(torch::equal(back, qt)) << "n " << n;
  }
}

}  // namespace
