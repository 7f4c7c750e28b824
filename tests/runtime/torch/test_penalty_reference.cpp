// The penalty as the runtime runs it (syncUnit on M x N ranks over Gloo, each rank with
// its slice) against the independent reference in penalty_reference.h, round after round,
// for every branch: one anomalous replica, all anomalous, clipping, a persistent shift of
// the norms (no lock-out), A-EDiT's step shares, the median temperature, disagreeing
// statistics inside a replica, and the collectives a baseline runs.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "sync/outer_sync.h"
#include "penalty_reference.h"
#include "test_util.h"

using namespace edit;

namespace {

// What a case feeds in: per round, each replica's pseudo-gradient of the unit (length P)
// and its local steps since the last sync.
struct Scenario {
  int M = 2, N = 2;
  int64_t P = 64;  // unit size, a multiple of N
  std::vector<std::vector<std::vector<double>>> D;  // [round][replica][P]
  std::vector<std::vector<double>> steps;           // [round][replica]
  std::vector<double> outer0;                       // initial outer weights
  std::vector<ref::Stats> stats0;                   // initial statistics per replica
};

// Per round and rank, what the runtime produced.
struct RankRound {
  UnitSyncResult res;
  std::vector<double> outer, momentum, slice;
  EwmaDetector det;
};

std::vector<double> toVec(const torch::Tensor& t) {
  auto c = t.to(torch::kFloat64).contiguous();
  return std::vector<double>(c.data_ptr<double>(), c.data_ptr<double>() + c.numel());
}

// Direction fixed per replica, norm chosen per round: a pseudo-gradient of norm g.
std::vector<double> ofNorm(int64_t P, uint64_t seed, double g) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> nd;
  std::vector<double> v(P);
  for (auto& x : v) x = nd(rng);
  const double n = ref::l2(v);
  for (auto& x : v) x *= g / n;
  return v;
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
  p.medianTemperature = s.penalty.weighting == Weighting::Median;
  p.stepShare = s.stepShare ? s.penalty.stepShare : 0;
  p.lr = s.lr;
  p.momentum = s.momentum;
  p.nesterov = s.nesterov;
  return p;
}

// Runs the scenario on M x N ranks; detectors of rank r start from stats0[replica], unless
// `startDet` gives a per-rank start. Returns [round][rank].
std::vector<std::vector<RankRound>> runDistributed(const Scenario& sc, const SyncSettings& s,
                                                   std::vector<EwmaDetector> startDet = {},
                                                   std::vector<CommCounts>* counts = nullptr) {
  const int W = sc.M * sc.N;
  const int64_t chunk = sc.P / sc.N;
  const int port = test::freePort();
  std::vector<std::vector<RankRound>> out(sc.D.size(), std::vector<RankRound>(W));
  if (counts) counts->assign(W, {});
  test::runRanks(W, [&](int r) {
    const int m = r / sc.N, sh = r % sc.N;
    Comm comm(test::meshFor(r, sc.M, sc.N, port));
    auto outer0 = torch::tensor(sc.outer0, torch::kFloat64).to(torch::kFloat32);
    FlatUnit unit = test::sliceUnit(sc.N, sh, sc.P);
    OuterUnit o{outer0.narrow(0, sh * chunk, chunk).clone(), torch::zeros({chunk})};
    EwmaDetector det;
    if (!startDet.empty()) {
      det = startDet[r];
    } else {
      det.mean = sc.stats0[m].mean;
      det.var = sc.stats0[m].var;
      det.count = sc.stats0[m].n;
    }
    const auto before = comm.counters();
    for (size_t k = 0; k < sc.D.size(); ++k) {
      auto Dm = torch::tensor(sc.D[k][m], torch::kFloat64).to(torch::kFloat32).narrow(0, sh * chunk, chunk);
      unit.slice.copy_(o.outer - Dm);  // inner weights whose pseudo-gradient is D
      auto& rr = out[k][r];
      rr.res = syncUnit(comm, unit, o, det, s, sc.steps.empty() ? 0 : sc.steps[k][m]);
      rr.outer = toVec(o.outer);
      rr.momentum = toVec(o.momentum);
      rr.slice = toVec(unit.slice);
      rr.det = det;
    }
    if (counts) {
      auto after = comm.counters();
      for (auto& [key, c] : after) {
        auto b = before.count(key) ? before.at(key) : CommCount{};
        if (c.calls > b.calls) (*counts)[r][key] = {c.bytes - b.bytes, 0, c.calls - b.calls};
      }
    }
  });
  return out;
}

// Checks every round of the distributed run against the reference; returns the
// reference's rounds for case-specific assertions.
std::vector<ref::Round> expectMatchesReference(const Scenario& sc, const SyncSettings& s,
                                               const std::vector<std::vector<RankRound>>& got) {
  const auto p = refParams(s);
  std::vector<ref::Stats> stats = sc.stats0;
  std::vector<double> outer = sc.outer0, momentum(sc.P, 0.0);
  std::vector<ref::Round> rounds;
  const int64_t chunk = sc.P / sc.N;
  for (size_t k = 0; k < sc.D.size(); ++k) {
    // The runtime works in float32: feed the reference the same rounded values.
    std::vector<std::vector<double>> D = sc.D[k];
    for (auto& d : D)
      for (auto& x : d) x = static_cast<float>(x);
    auto rr = ref::round(D, stats, outer, momentum, p, sc.steps.empty() ? std::vector<double>{} : sc.steps[k]);
    rounds.push_back(rr);
    for (int r = 0; r < sc.M * sc.N; ++r) {
      const int m = r / sc.N, sh = r % sc.N;
      const auto& g = got[k][r];
      const std::string at = "round " + std::to_string(k) + " rank " + std::to_string(r);
      EXPECT_EQ(g.res.anomaly, static_cast<bool>(rr.flagged[m])) << at << " norm " << rr.norms[m];
      EXPECT_EQ(g.res.skipped, rr.skipped) << at;
      if (s.penaltyOn()) {
        EXPECT_NEAR(g.res.norm, rr.norms[m], 1e-5 * (1 + rr.norms[m])) << at;
        if (!rr.skipped) EXPECT_NEAR(g.res.averagedNorm, rr.averagedNorm, 1e-5 * (1 + rr.averagedNorm)) << at;
        // The runtime's norms are float32 sums: about 1e-7 relative.
        EXPECT_NEAR(g.det.mean, stats[m].mean, 1e-6 * (1 + std::fabs(stats[m].mean))) << at;
        EXPECT_NEAR(g.det.var, stats[m].var, 1e-4 * stats[m].var + 1e-12) << at;
        EXPECT_EQ(g.det.count, stats[m].n) << at;
      }
      if (!rr.skipped) EXPECT_NEAR(g.res.weight, rr.weights[m], 1e-6) << at;
      for (int64_t i = 0; i < chunk; ++i) {  // the first wrong element only
        const double want = outer[sh * chunk + i], mom = momentum[sh * chunk + i];
        const bool ok = std::fabs(g.outer[i] - want) <= 2e-5 * (1 + std::fabs(want)) &&
                        std::fabs(g.momentum[i] - mom) <= 2e-5 * (1 + std::fabs(mom)) && g.slice[i] == g.outer[i];
        EXPECT_TRUE(ok) << at << " element " << i << ": outer " << g.outer[i] << " want " << want << ", momentum "
                        << g.momentum[i] << " want " << mom << ", inner " << g.slice[i] << " (must equal outer)";
        if (!ok) break;
      }
    }
  }
  return rounds;
}

SyncSettings editSettings(int64_t warmup = 5) {
  AlgorithmConfig a;
  a.mode = Mode::Edit;
  a.penalty.anomalyWarmup = warmup;
  return syncSettingsFor(a);
}

// `rounds` rounds of norms around 1 (+-5%, a fixed pseudo-random sequence per replica);
// `norm(k, m)` may override a round's norm.
Scenario makeScenario(int M, int N, int rounds, const std::function<double(int, int, double)>& norm = {}) {
  Scenario sc;
  sc.M = M;
  sc.N = N;
  sc.P = 24 * N;
  std::mt19937_64 rng(42);
  std::uniform_real_distribution<double> u(-0.05, 0.05);
  for (int k = 0; k < rounds; ++k) {
    sc.D.emplace_back();
    for (int m = 0; m < M; ++m) {
      double g = 1.0 + u(rng);
      if (norm) g = norm(k, m, g);
      sc.D.back().push_back(ofNorm(sc.P, 1000 * m + k, g));
    }
  }
  sc.outer0 = ofNorm(sc.P, 7, 3.0);
  sc.stats0.assign(M, {});
  return sc;
}

// Each case on the layouts 2x2 (shards must agree), 4x1 and 3x1 (odd M). One test per
// group of cases: every test is a process, and the unit label has a time budget.
const std::vector<std::pair<int, int>> kLayouts = {{2, 2}, {4, 1}, {3, 1}};
std::string name(int M, int N) { return std::to_string(M) + "x" + std::to_string(N); }

void oneAnomalousReplicaIsDropped(int M, int N) {
  // Replica 1's norm x10 in three rounds in a row, soon after the test is armed: each of
  // them is caught (the first spike must not inflate the statistics enough to hide the
  // next), and nothing else is.
  const auto bad = [](int k, int m) { return m == 1 && k >= 8 && k <= 10; };
  auto sc = makeScenario(M, N, 12, [&](int k, int m, double g) { return bad(k, m) ? 10 * g : g; });
  const auto s = editSettings(5);
  auto rounds = expectMatchesReference(sc, s, runDistributed(sc, s));
  for (int k = 0; k < 12; ++k) {
    EXPECT_FALSE(rounds[k].skipped) << k;
    for (int m = 0; m < M; ++m) EXPECT_EQ(rounds[k].flagged[m], bad(k, m)) << "round " << k << " replica " << m;
    if (k >= 8 && k <= 10) EXPECT_EQ(rounds[k].weights[1], 0.0);
  }
}

void allAnomalousSkipsTheOuterStep(int M, int N) {
  auto sc = makeScenario(M, N, 9, [](int k, int, double g) { return k == 7 ? 20 * g : g; });
  const auto s = editSettings(5);
  const auto got = runDistributed(sc, s);
  auto rounds = expectMatchesReference(sc, s, got);
  EXPECT_TRUE(rounds[7].skipped);
  for (int r = 0; r < M * N; ++r) {
    EXPECT_TRUE(got[7][r].res.skipped);
    EXPECT_EQ(got[7][r].outer, got[6][r].outer) << "rank " << r << ": the outer weights moved";
    EXPECT_EQ(got[7][r].momentum, got[6][r].momentum) << "rank " << r;
  }
  EXPECT_FALSE(rounds[8].skipped);  // the next normal round steps again
}

void clippingActive(int M, int N) {
  auto sc = makeScenario(M, N, 4);
  auto s = editSettings(5);
  s.penalty.clipNorm = 0.1;  // the average of M random directions of norm 1: about 1/sqrt(M)
  auto rounds = expectMatchesReference(sc, s, runDistributed(sc, s));
  for (auto& r : rounds) {
    EXPECT_GT(r.averagedNorm, 0.3);
    EXPECT_LT(r.clipFactor, 0.35);
  }
}

TEST(PenaltyReference, OneAnomalousAllAnomalousAndClipping) {
  at::set_num_threads(1);
  for (auto [M, N] : kLayouts) {
    SCOPED_TRACE(name(M, N));
    {
      SCOPED_TRACE("one anomalous replica");
      oneAnomalousReplicaIsDropped(M, N);
    }
    {
      SCOPED_TRACE("all replicas anomalous");
      allAnomalousSkipsTheOuterStep(M, N);
    }
    {
      SCOPED_TRACE("clipping");
      clippingActive(M, N);
    }
  }
}

TEST(PenaltyReference, PersistentShiftIsAcceptedAfterAFewRounds) {
  // From round 30 on, norms are 30% larger for good (a larger syncInterval after a resume,
  // a learning-rate re-warm-up): first for replica 1 alone, then for every replica. They
  // may be dropped for a few rounds, but not forever (the detector used to lock out: it
  // never learned the new level from values it had flagged, and with every replica
  // shifted the outer weights never moved again).
  at::set_num_threads(1);
  const int R = 80, shift = 30;
  for (auto [M, N] : kLayouts) {
    SCOPED_TRACE(name(M, N));
    auto sc = makeScenario(M, N, R, [&](int k, int m, double g) { return k >= shift && m == 1 ? 1.3 * g : g; });
    const auto s = editSettings(10);
    auto rounds = expectMatchesReference(sc, s, runDistributed(sc, s));
    EXPECT_TRUE(rounds[shift].flagged[1]) << "the jump itself is an anomaly";
    int lastFlag = -1;
    for (int k = 0; k < R; ++k)
      if (rounds[k].flagged[1]) lastFlag = k;
    EXPECT_LT(lastFlag, shift + 15) << "replica 1 still dropped at round " << lastFlag;
    for (int k = R - 10; k < R; ++k) EXPECT_GT(rounds[k].weights[1], 0.0) << k;

    auto all = makeScenario(M, N, R, [&](int k, int, double g) { return k >= shift ? 1.3 * g : g; });
    rounds = expectMatchesReference(all, s, runDistributed(all, s));
    int skipped = 0;
    for (int k = 0; k < R; ++k) skipped += rounds[k].skipped;
    EXPECT_GT(skipped, 0);
    for (int k = shift + 15; k < R; ++k) EXPECT_FALSE(rounds[k].skipped) << k;
  }
}

TEST(PenaltyReference, WeightingVariantsAndAEditStepShares) {
  at::set_num_threads(1);
  for (auto [M, N] : kLayouts) {
    SCOPED_TRACE(name(M, N));
    auto sc = makeScenario(M, N, 4, [](int, int m, double g) { return 40 * g * (1 + 0.5 * m); });
    auto s = editSettings(5);
    s.penalty.weighting = Weighting::Median;
    auto rounds = expectMatchesReference(sc, s, runDistributed(sc, s));
    EXPECT_GT(rounds[0].weights[M - 1], 0.05) << "median temperature keeps every replica in";
    s.penalty.weighting = Weighting::Raw;
    rounds = expectMatchesReference(sc, s, runDistributed(sc, s));
    EXPECT_LT(rounds[0].weights[M - 1], 1e-6) << "raw softmax of large norms is one-hot";
    s.penalty.weighted = false;
    expectMatchesReference(sc, s, runDistributed(sc, s));

    auto steps = makeScenario(M, N, 4);
    for (int k = 0; k < 4; ++k) {
      steps.steps.emplace_back();
      for (int m = 0; m < M; ++m) steps.steps.back().push_back(1 + 3 * m + k);
    }
    AlgorithmConfig a;
    a.mode = Mode::AEdit;
    a.syncSeconds = 1;
    a.penalty.anomalyWarmup = 2;
    const auto as = syncSettingsFor(a);
    ASSERT_TRUE(as.stepShare);
    expectMatchesReference(steps, as, runDistributed(steps, as));
  }
}

TEST(PenaltyReference, BaselinesMatchAndRunOnlyTheAverage) {
  at::set_num_threads(1);
  for (const char* mode : {"diloco", "localsgd"}) {
    auto sc = makeScenario(2, 2, 3, [](int k, int m, double g) { return k == 2 && m == 1 ? 50 * g : g; });
    AlgorithmConfig a;
    a.mode = enumOf<Mode>(mode, "mode");
    const auto s = syncSettingsFor(a);
    EXPECT_FALSE(s.penaltyOn()) << mode;
    EXPECT_DOUBLE_EQ(s.momentum, std::string(mode) == "diloco" ? 0.9 : 0.0) << mode;
    std::vector<CommCounts> counts;
    const auto got = runDistributed(sc, s, {}, &counts);
    expectMatchesReference(sc, s, got);
    for (int r = 0; r < 4; ++r) {
      // One all-reduce of the pseudo-gradient per round in the sync group, nothing else:
      // no norm all-reduce, no norm all-gather, no averaged-norm all-reduce.
      ASSERT_EQ(counts[r].size(), 1u) << mode << " rank " << r;
      EXPECT_EQ(counts[r].begin()->first, std::make_pair(std::string("allreduce"), std::string("sync")));
      EXPECT_EQ(counts[r].begin()->second.calls, 3u);
    }
  }
  // Their outer optimizers: the mode's published momentum unless one is set.
  {
  AlgorithmConfig a;
  EXPECT_DOUBLE_EQ(a.outer.momentum, -1);
  for (auto [mode, mu] : {std::pair<const char*, double>{"edit", 0.5}, {"a-edit", 0.5}, {"diloco", 0.9}}) {
    a.mode = enumOf<Mode>(mode, "mode");
    EXPECT_DOUBLE_EQ(syncSettingsFor(a).momentum, mu) << mode;
  }
  a.outer.momentum = 0.5;
  a.mode = Mode::DiLoCo;
  EXPECT_DOUBLE_EQ(syncSettingsFor(a).momentum, 0.5);
  a.mode = Mode::LocalSgd;  // plain averaging is its definition
  EXPECT_DOUBLE_EQ(syncSettingsFor(a).momentum, 0.0);
  }
  // EDiT with the penalty on runs them (the baseline's silence above is not vacuous).
  auto sc = makeScenario(2, 2, 1);
  std::vector<CommCounts> counts;
  runDistributed(sc, editSettings(), {}, &counts);
  EXPECT_TRUE(counts[0].count({"allgather", "sync"}));
  EXPECT_TRUE(counts[0].count({"allreduce", "shard"}));
}

TEST(PenaltyReference, ShardsOfAReplicaAgreeOnTheVerdict) {
  // The two shards of replica 1 hold different statistics (as a replacement that copied
  // another replica's would): only shard 1's would flag the norm. The replica must still
  // take one verdict, on all of its slices, and the result must be the reference's with
  // replica 1 flagged.
  at::set_num_threads(1);
  auto sc = makeScenario(2, 2, 1, [](int, int m, double g) { return m == 1 ? 2.0 : g; });
  std::vector<EwmaDetector> start(4);
  for (auto& d : start) d = {1.0, 0.01, 50};   // armed: 2.0 is 10 sigma above the mean
  start[2] = {2.0, 0.01, 50};                  // replica 1, shard 0: 2.0 is normal here
  const auto s = editSettings(5);
  const auto got = runDistributed(sc, s, start);
  EXPECT_TRUE(got[0][2].res.anomaly);
  EXPECT_TRUE(got[0][3].res.anomaly);
  EXPECT_FALSE(got[0][0].res.anomaly);
  sc.stats0 = {{1.0, 0.01, 50, std::pow(0.98, 49)}, {1.0, 0.01, 50, std::pow(0.98, 49)}};
  // Outer weights as if replica 1 was dropped everywhere (detector statistics differ by
  // construction here, so only the weights and the outer state are compared).
  auto p = refParams(s);
  std::vector<ref::Stats> stats = sc.stats0;
  std::vector<double> outer = sc.outer0, mom(sc.P, 0.0);
  auto D = sc.D[0];
  for (auto& d : D)
    for (auto& x : d) x = static_cast<float>(x);
  auto rr = ref::round(D, stats, outer, mom, p);
  ASSERT_TRUE(rr.flagged[1]);
  for (int r = 0; r < 4; ++r)
    for (int64_t i = 0; i < sc.P / 2; ++i)
      ASSERT_NEAR(got[0][r].outer[i], outer[(r % 2) * sc.P / 2 + i], 2e-5) << "rank " << r;
}

}  // namespace
