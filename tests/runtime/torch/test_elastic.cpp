// Changing the number of replicas M: the operator's absolute target (ControlRequests::scaleTarget, from the
// telemetry SCALE command), and resuming a checkpoint at another M (docs/elastic.md).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "test_util.h"
#include "train/checkpoint.h"
#include "train/trainer.h"

using namespace edit;

namespace {

// Runs M x N ranks of `c` as threads; onStep(rank, trainer, report) after every step.
std::vector<TrainResult> train(const Config& c, int M, int N,
                               const std::function<void(int, Trainer&, const StepReport&)>& onStep = nullptr,
                               const std::function<void(Trainer&)>& beforeRun = nullptr) {
  const int port = test::freePort();
  std::vector<TrainResult> res(M * N);
  test::runRanks(M * N, [&](int r) {
    TrainerHooks h;
    h.log = [r](const std::string& s) {  // EDIT_TEST_LOG=1: the trainers' log lines on stderr
      if (std::getenv("EDIT_TEST_LOG")) std::fprintf(stderr, "[rank %d] %s\n", r, s.c_str());
    };
    Trainer* self = nullptr;
    if (onStep) h.onStep = [&, r](const StepReport& rep) { onStep(r, *self, rep); };
    Trainer tr(c, test::meshFor(r, M, N, port), h);
    self = &tr;
    if (beforeRun) beforeRun(tr);
    res[r] = tr.run();
  });
  return res;
}

NamedTensors rankFile(const std::string& root, int64_t step, int rank) {
  return readCheckpointFile(rankFileName(stepDirName(root, step), rank));
}

bool sameTensor(const torch::Tensor& a, const torch::Tensor& b) {
  return a.sizes() == b.sizes() && a.dtype() == b.dtype() && torch::equal(a, b);
}

// The state of one rank that a new replica must copy whole.
const std::vector<std::string> kCopiedState = {"theta", "adam_m", "adam_v", "ewma", "outer", "momentum"};

Config smallEdit(const std::string& dir) {
  auto c = test::smallConfig(test::makeTokenFile(dir, 64, 20000, 3));
  c.training.steps = 16;
  c.algorithm.mode = Mode::Edit;
  c.checkpoint.dir = dir + "/ckpt";
  return c;
}

}  // namespace

TEST(ElasticTarget, OperatorTargetWinsOverSignalsAndAResentTargetIsNoScale) {
  // Warm-up to step 3 (a control exchange every step), then rounds at steps 6, 9 and 12.
  // In the warm-up the operator asks for the size the job has: nothing happens. Before
  // the round at 6 a SIGUSR1 asks for one replica more, but the operator's target given
  // with it wins: 2 -> 1 after that round. Resending the target later changes nothing.
  at::set_num_threads(1);
  const auto dir = test::tempDir("edit-scale-target");
  auto c = smallEdit(dir);
  c.training.steps = 15;
  c.checkpoint.dir = "";
  std::vector<int> replicasSeen;
  int leftTarget = -1, leftDelta = -1;
  const auto res = train(c, 2, 1, [&](int rank, Trainer& tr, const StepReport& r) {
    if (rank != 0) return;
    auto& asks = tr.requests();
    replicasSeen.push_back(r.replicas);
    if (r.step == 1) asks.scaleTarget = 2;
    if (r.step == 5) {
      asks.scaleDelta = 1;
      asks.scaleTarget = 1;
    }
    if (r.step == 8 || r.step == 11) asks.scaleTarget = 1;
    leftTarget = asks.scaleTarget, leftDelta = asks.scaleDelta;
  });
  EXPECT_EQ(leftTarget, 0);  // each taken at the next exchange
  EXPECT_EQ(leftDelta, 0);
  EXPECT_EQ(res[0].scales, 1);
  EXPECT_FALSE(res[0].leftAtScale);
  EXPECT_EQ(res[0].steps, 15);
  EXPECT_TRUE(res[1].leftAtScale);
  EXPECT_EQ(res[1].steps, 7);  // after the round at step 6
  // The reports say how many replicas the world has: 2 up to the round at 6 (reported as
  // step 7), 1 from the step redone after the scale on.
  ASSERT_GE(replicasSeen.size(), 8u);
  EXPECT_EQ(replicasSeen.front(), 2);
  EXPECT_EQ(replicasSeen[5], 2);
  EXPECT_EQ(replicasSeen.back(), 1);
  std::filesystem::remove_all(dir);
}

TEST(ElasticResume, MoreReplicasCopyAnExistingReplicasWholeState) {
  // 2 replicas x 2 shards stop at step 9 (a sync step, with int8 compression's residuals);
  // the same checkpoint resumed with 3 replicas stops at once, before any step, so its
  // checkpoint shows what each rank loaded: ranks of replicas 0 and 1 their own state,
  // replica 2 a copy of replica 0's, with no compression error of its own and no tokens.
  at::set_num_threads(1);
  const auto dir = test::tempDir("edit-resume-grow");
  auto c = smallEdit(dir);
  c.algorithm.syncCompression = Compression::Int8;
  c.algorithm.compressionBlock = 16;
  train(c, 2, 2, [](int, Trainer& t, const StepReport& r) { if (r.step == 7) t.requestStop(); });
  std::vector<NamedTensors> before;
  for (int r = 0; r < 4; ++r) before.push_back(rankFile(c.checkpoint.dir, 9, r));

  const auto grown = train(c, 3, 2, nullptr, [](Trainer& t) { t.requestStop(); });
  for (auto& r : grown) {
    EXPECT_EQ(r.resumedFrom, 9);
    EXPECT_TRUE(r.stopped);
  }
  const Manifest m = readManifest(stepDirName(c.checkpoint.dir, 9));
  EXPECT_EQ(m.world, 6);
  for (int r = 0; r < 6; ++r) {
    const auto after = rankFile(c.checkpoint.dir, 9, r);
    const int source = r % 4;  // (replica % 2) * 2 + shard
    for (int u = 0; after.count("unit" + std::to_string(u) + "/theta"); ++u) {
      const std::string k = "unit" + std::to_string(u) + "/";
      for (const auto& name : kCopiedState)
        EXPECT_TRUE(sameTensor(after.at(k + name), before[source].at(k + name))) << "rank " << r << " " << k << name;
      // What quantization has not sent yet is this rank's own: kept, or zero for a new one.
      const auto& residual = after.at(k + "residual");
      if (r < 4) EXPECT_TRUE(sameTensor(residual, before[r].at(k + "residual"))) << r;
      else EXPECT_EQ(residual.abs().max().item<double>(), 0.0) << r;
      // The owned part of the average moves with M: from zero, in this run's size.
      EXPECT_EQ(after.at(k + "averageResidual").abs().max().item<double>(), 0.0) << r;
      EXPECT_EQ(after.at(k + "averageResidual").numel(),
                ownedPartLength(after.at(k + "outer").numel(), c.algorithm.compressionBlock, 3, r / 2));
    }
    EXPECT_EQ(after.at("meta/step").item<double>(), 9);
    const double tokens = after.at("meta/tokens").item<double>();
    if (r < 4) EXPECT_EQ(tokens, before[r].at("meta/tokens").item<double>()) << r;
    else EXPECT_EQ(tokens, 0.0) << "a new replica counts only what it trains";
  }

  // And the grown job trains on to the end, its replicas identical after the final sync.
  const auto res = train(c, 3, 2);
  for (auto& r : res) {
    EXPECT_EQ(r.resumedFrom, 9);
    EXPECT_EQ(r.steps, 16);
  }
  EXPECT_EQ(res[4].tokens, 7u * c.data.batchSize * c.data.seqLen);
  for (int r = 2; r < 6; ++r) {
    const auto final = rankFile(c.checkpoint.dir, 16, r), peer = rankFile(c.checkpoint.dir, 16, r % 2);
    for (const auto& [k, v] : final)
      if (k.size() > 6 && (k.substr(k.size() - 6) == "/theta" || k.substr(k.size() - 6) == "/outer"))
        EXPECT_TRUE(sameTensor(v, peer.at(k))) << "rank " << r << " " << k;
  }
  std::filesystem::remove_all(dir);
}

TEST(ElasticResume, FewerReplicasKeepTheirOwnState) {
  at::set_num_threads(1);
  const auto dir = test::tempDir("edit-resume-shrink");
  auto c = smallEdit(dir);
  train(c, 3, 1, [](int, Trainer& t, const StepReport& r) { if (r.step == 7) t.requestStop(); });
  std::vector<NamedTensors> before;
  for (int r = 0; r < 2; ++r) before.push_back(rankFile(c.checkpoint.dir, 9, r));
  const auto shrunk = train(c, 2, 1, nullptr, [](Trainer& t) { t.requestStop(); });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(shrunk[r].resumedFrom, 9);
    const auto after = rankFile(c.checkpoint.dir, 9, r);
    for (const auto& [k, v] : before[r])  // the job's world and progress are counted again
      if (k != "meta/world" && k != "meta/jobSteps")
        EXPECT_TRUE(sameTensor(after.at(k), v)) << "rank " << r << " " << k;
    EXPECT_EQ(after.at("meta/jobSteps").item<double>(), 2 * 9);
  }
  EXPECT_EQ(readManifest(stepDirName(c.checkpoint.dir, 9)).world, 2);
  std::filesystem::remove_all(dir);
}

TEST(ElasticResume, OtherShardsOrModelIsRefusedNamingBothLayouts) {
  at::set_num_threads(1);
  const auto dir = test::tempDir("edit-resume-layout");
  auto c = smallEdit(dir);
  c.training.steps = 4;
  train(c, 2, 2);  // a final checkpoint at step 4, 2 x 2
  auto refusal = [&](const Config& cfg, int M, int N) {
    std::string what;
    try {
      train(cfg, M, N);
    } catch (const CheckpointLayoutError& e) {
      what = e.what();
    }
    return what;
  };
  std::string why = refusal(c, 4, 1);
  EXPECT_NE(why.find("written with 2 replicas x 2 shards, this run has 4 replicas x 1 shards"), std::string::npos)
      << why;
  why = refusal(c, 1, 3);
  EXPECT_NE(why.find("written by 4 ranks, not a whole number of replicas of 3 shards"), std::string::npos) << why;
  auto wider = c;
  wider.model.dim = 48;
  wider.model.ffnDim = 96;
  why = refusal(wider, 2, 2);
  EXPECT_NE(why.find("written for a model of"), std::string::npos) << why;
  // The refused checkpoint is still there, untouched.
  EXPECT_EQ(completeCheckpointSteps(c.checkpoint.dir), (std::vector<int64_t>{4}));
  std::filesystem::remove_all(dir);
}
