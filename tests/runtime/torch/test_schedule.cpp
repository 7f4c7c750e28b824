// The sync schedule's account of a run: how many rounds a step-clocked run makes (the
// start-up line and the anomaly warm-up warning depend on it), and the penalty's weights
// and clip factors as the summary and /metrics report them.
#include <gtest/gtest.h>

#include <mutex>
#include <set>

#include "test_util.h"
#include "train/trainer.h"

using namespace edit;

namespace {

struct TrainedRun {
  std::vector<TrainResult> results;
  std::vector<std::string> rank0Log;
};

TrainedRun train(const Config& c, int M, int N = 1) {
  const int port = test::freePort();
  TrainedRun run;
  run.results.resize(M * N);
  std::mutex mu;
  test::runRanks(M * N, [&](int r) {
    TrainerHooks h;
    h.log = [&, r](const std::string& s) {
      std::lock_guard<std::mutex> lock(mu);
      if (r == 0) run.rank0Log.push_back(s);
    };
    Trainer tr(c, test::meshFor(r, M, N, port), h);
    run.results[r] = tr.run();
  });
  return run;
}

// Rounds of a step-clocked run, counted the plain way: a round at step t when t is past the
// warm-up by a multiple of tau, and a final one over the steps after the last round.
int64_t countRounds(int64_t steps, int64_t warmup, int64_t tau) {
  int64_t rounds = 0, last = warmup;
  for (int64_t t = 0; t < steps; ++t)
    if (t > warmup && (t - warmup) % tau == 0) ++rounds, last = t;
  return rounds + (steps > last ? 1 : 0);
}

bool logHas(const TrainedRun& run, const std::string& text) {
  for (const auto& l : run.rank0Log)
    if (l.find(text) != std::string::npos) return true;
  return false;
}

}  // namespace

TEST(Schedule, StartUpLineNamesTheRoundsTheRunMakes) {
  at::set_num_threads(1);
  const auto dir = test::tempDir("edit-schedule");
  auto c = test::smallConfig(test::makeTokenFile(dir, 64, 20000, 3));
  c.algorithm.mode = Mode::Edit;
  for (auto [steps, warmup, tau] : {std::tuple<int64_t, int64_t, int64_t>{12, 3, 3}, {13, 3, 3}, {11, 2, 4}}) {
    c.training.steps = steps;
    c.algorithm.warmupSteps = warmup;
    c.algorithm.syncInterval = tau;
    const TrainedRun run = train(c, 2);
    const int64_t expected = countRounds(steps, warmup, tau);
    EXPECT_EQ(static_cast<int64_t>(run.results[0].syncRounds), expected) << steps << "/" << warmup << "/" << tau;
    EXPECT_TRUE(logHas(run, "(" + std::to_string(expected) + " rounds)")) << steps << "/" << warmup << "/" << tau;
  }
  std::filesystem::remove_all(dir);
}

TEST(Schedule, AnAnomalyWarmupThatCannotArmIsWarnedAbout) {
  at::set_num_threads(1);
  const auto dir = test::tempDir("edit-schedule-warn");
  auto c = test::smallConfig(test::makeTokenFile(dir, 64, 20000, 3));
  c.algorithm.mode = Mode::Edit;  // 12 steps, warm-up 3, tau 3: 3 rounds
  c.algorithm.penalty.anomalyWarmup = 3;
  const TrainedRun never = train(c, 2);
  EXPECT_TRUE(logHas(never, "the anomaly test never arms in this run: algorithm.penalty.anomalyWarmup is 3 rounds "
                            "and the run has 3"));
  c.algorithm.penalty.anomalyWarmup = 2;
  EXPECT_FALSE(logHas(train(c, 2), "never arms"));
  // Nothing to warn about where nothing is tested: the penalty off, or no rounds.
  c.algorithm.penalty.anomalyWarmup = 100;
  c.algorithm.mode = Mode::DiLoCo;
  EXPECT_FALSE(logHas(train(c, 2), "never arms"));
  std::filesystem::remove_all(dir);
}

TEST(Schedule, PenaltyWeightsAndClipFactorsAreReported) {
  at::set_num_threads(1);
  const auto dir = test::tempDir("edit-schedule-penalty");
  auto c = test::smallConfig(test::makeTokenFile(dir, 64, 20000, 3));
  c.algorithm.mode = Mode::Edit;
  c.algorithm.penalty.anomaly = false;  // every replica weighted at every round
  c.algorithm.penalty.clipNorm = 1e6;   // never binding
  const TrainedRun loose = train(c, 2);
  const size_t units = 4;  // embedding, 2 blocks, head
  for (const auto& r : loose.results) {
    EXPECT_EQ(r.penalty.unitRounds, r.syncRounds * units);
    EXPECT_EQ(r.penalty.unitsClipped, 0u);
    EXPECT_DOUBLE_EQ(r.penalty.clipMin, 1.0);
    EXPECT_GT(r.penalty.weightMin, 0.0);
    EXPECT_LT(r.penalty.weightMax, 1.0);
  }
  // Two replicas' softmax weights of a unit sum to 1, so the smallest weight replica 0 had
  // and the largest replica 1 had are complements.
  EXPECT_NEAR(loose.results[0].penalty.weightMin + loose.results[1].penalty.weightMax, 1.0, 1e-9);
  EXPECT_NEAR(loose.results[1].penalty.weightMin + loose.results[0].penalty.weightMax, 1.0, 1e-9);

  c.algorithm.penalty.clipNorm = 1e-6;  // every averaged pseudo-gradient clipped
  const TrainedRun tight = train(c, 2);
  for (const auto& r : tight.results) {
    EXPECT_EQ(r.penalty.unitsClipped, r.penalty.unitRounds);
    EXPECT_GT(r.penalty.unitRounds, 0u);
    EXPECT_LT(r.penalty.clipMin, 1e-3);
  }
  // Without the penalty (diloco) nothing is counted.
  c.algorithm.mode = Mode::DiLoCo;
  EXPECT_EQ(train(c, 2).results[0].penalty.unitRounds, 0u);
  std::filesystem::remove_all(dir);
}

TEST(Schedule, EveryCommLabelOfARunIsInTheSharedList) {
  // The operator refuses a report whose counters carry a label outside common/src/comm_labels.h:
  // every label a run produces (layer-wise rounds, ZeRO-3 gathers and reductions, a
  // compressed warm-up average, the control exchange) must be in that list.
  at::set_num_threads(1);
  const auto dir = test::tempDir("edit-schedule-labels");
  auto c = test::smallConfig(test::makeTokenFile(dir, 64, 20000, 3));
  c.algorithm.mode = Mode::Edit;
  c.algorithm.syncCompression = Compression::Int8;
  const TrainedRun run = train(c, 2, 2);
  std::set<std::string> ops;
  for (const auto& r : run.results)
    for (const auto& [key, count] : r.comm) {
      EXPECT_TRUE(isCommOp(key.first)) << key.first;
      EXPECT_TRUE(isCommGroup(key.second)) << key.second;
      ops.insert(key.first);
    }
  for (const char* op : {"sync", "compressed_mean", "allgather", "reduce_scatter"}) EXPECT_TRUE(ops.count(op)) << op;
  std::filesystem::remove_all(dir);
}
