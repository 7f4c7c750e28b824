// Resume: K steps, stop (checkpoint), resume to 2K equals 2K straight; a corrupt newest
// checkpoint is skipped in favour of the previous good one.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "train/checkpoint.h"
#include "test_util.h"
#include "train/trainer.h"

using namespace edit;

namespace {
std::vector<std::vector<torch::Tensor>> train(const Config& c, int M, int N,
                                               std::function<void(Trainer&, const StepReport&)> onStep,
                                               std::vector<TrainResult>* results = nullptr) {
  const int port = test::freePort();
  std::vector<std::vector<torch::Tensor>> out(M * N);
  std::vector<TrainResult> res(M * N);
  test::runRanks(M * N, [&](int r) {
    TrainerHooks h;
    Trainer* self = nullptr;
    if (onStep) h.onStep = [&](const StepReport& rep) { onStep(*self, rep); };
    Trainer tr(c, test::meshFor(r, M, N, port), h);
    self = &tr;
    res[r] = tr.run();
    for (auto& u : tr.units()) out[r].push_back(u.slice.clone());
  });
  if (results) *results = res;
  return out;
}

// Stops a run of `c` after step 7 (acted on at the sync boundary of step 9, with a
// checkpoint in c.checkpoint.dir), resumes it to the end, and checks that it ends where
// `straight` did.
void stopResumeAndCompare(const Config& c, const std::vector<std::vector<torch::Tensor>>& straight) {
  std::vector<TrainResult> first, second;
  train(c, 2, 2, [](Trainer& t, const StepReport& r) { if (r.step == 7) t.requestStop(); }, &first);
  for (auto& r : first) {
    EXPECT_TRUE(r.stopped);
    EXPECT_EQ(r.steps, 9);
  }
  const auto resumed = train(c, 2, 2, nullptr, &second);
  for (auto& r : second) {
    EXPECT_EQ(r.resumedFrom, 9);
    EXPECT_EQ(r.steps, c.training.steps);
  }
  for (size_t r = 0; r < straight.size(); ++r)
    for (size_t u = 0; u < straight[r].size(); ++u)
      EXPECT_TRUE(torch::allclose(resumed[r][u], straight[r][u], 1e-6, 1e-7)) << r << " " << u;
}
}  // namespace

TEST(Resume, StopAndResumeEqualsStraightRun) {
  at::set_num_threads(1);
  const auto dir = test::tempDir("edit-resume");
  auto c = test::smallConfig(test::makeTokenFile(dir, 64, 20000, 3));
  c.training.steps = 16;
  c.algorithm.mode = Mode::Edit;
  const auto straight = train(c, 2, 2, nullptr);

  c.checkpoint.dir = dir + "/ckpt";
  stopResumeAndCompare(c, straight);
  std::filesystem::remove_all(dir);
}

TEST(Resume, Int8ResidualIsCheckpointed) {
  // With int8 compression the error feedback is state: a resume that lost it would send
  // different pseudo-gradients than the straight run.
  at::set_num_threads(1);
  const auto dir = test::tempDir("edit-resume-int8");
  auto c = test::smallConfig(test::makeTokenFile(dir, 64, 20000, 3));
  c.training.steps = 16;
  c.algorithm.mode = Mode::Edit;
  c.algorithm.syncCompression = Compression::Int8;
  c.algorithm.compressionBlock = 16;
  const auto straight = train(c, 2, 2, nullptr);
  c.checkpoint.dir = dir + "/ckpt";
  train(c, 2, 2, [](Trainer& t, const StepReport& r) { if (r.step == 7) t.requestStop(); });
  // The file holds each unit's residual, and it is not all zero after a round.
  const auto saved = readCheckpointFile(rankFileName(stepDirName(c.checkpoint.dir, 9), 1));
  ASSERT_TRUE(saved.count("unit0/residual"));
  EXPECT_GT(saved.at("unit0/residual").abs().max().item<double>(), 0.0);
  EXPECT_EQ(saved.at("unit0/residual").numel(), saved.at("unit0/outer").numel());
  // And the residual of the average of the part this rank owns (sync rank 1 of 2: the
  // second half of the slice's blocks).
  ASSERT_TRUE(saved.count("unit0/averageResidual"));
  EXPECT_GT(saved.at("unit0/averageResidual").abs().max().item<double>(), 0.0);
  EXPECT_EQ(saved.at("unit0/averageResidual").numel(),
            ownedPartLength(saved.at("unit0/outer").numel(), c.algorithm.compressionBlock, 2, 1));
  std::vector<TrainResult> second;
  const auto resumed = train(c, 2, 2, nullptr, &second);
  for (auto& r : second) EXPECT_EQ(r.resumedFrom, 9);
  for (size_t r = 0; r < straight.size(); ++r)
    for (size_t u = 0; u < straight[r].size(); ++u)
      EXPECT_TRUE(torch::allclose(resumed[r][u], straight[r][u], 1e-6, 1e-7)) << r << " " << u;
  std::filesystem::remove_all(dir);
}

TEST(Resume, OverlappedRoundIsAppliedBeforeACheckpoint) {
  // algorithm.overlapSteps: a checkpoint applies the round in flight first, so resuming from
  // it equals a straight run that checkpointed at the same step (and drained there too).
  at::set_num_threads(1);
  const auto dir = test::tempDir("edit-resume-overlap");
  auto c = test::smallConfig(test::makeTokenFile(dir, 64, 20000, 3));
  c.training.steps = 16;
  c.algorithm.mode = Mode::Edit;
  c.algorithm.overlapSteps = 3;  // = syncInterval: in flight until the next round
  c.checkpoint.everySteps = 9;
  c.checkpoint.dir = dir + "/straight";
  std::vector<TrainResult> straightResults;
  const auto straight = train(c, 2, 2, nullptr, &straightResults);
  for (auto& r : straightResults) EXPECT_EQ(r.syncRounds, 5u);  // steps 6, 9, 12, 15 and the last

  c.checkpoint.dir = dir + "/ckpt";
  stopResumeAndCompare(c, straight);
  std::filesystem::remove_all(dir);
}

TEST(Resume, CorruptNewestCheckpointFallsBackToPrevious) {
  at::set_num_threads(1);
  const auto dir = test::tempDir("edit-corrupt");
  auto c = test::smallConfig(test::makeTokenFile(dir, 64, 20000, 4));
  c.algorithm.mode = Mode::Ddp;
  c.training.steps = 10;
  c.checkpoint.dir = dir + "/ckpt";
  c.checkpoint.everySteps = 4;
  c.checkpoint.keep = 5;
  train(c, 2, 1, nullptr);
  EXPECT_EQ(completeCheckpointSteps(c.checkpoint.dir), (std::vector<int64_t>{10, 8, 4}));
  // Flip a byte in rank 1's file of the newest checkpoint.
  const auto bad = rankFileName(stepDirName(c.checkpoint.dir, 10), 1);
  {
    std::fstream f(bad, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(100);
    f.put('\x7f');
  }
  c.training.steps = 12;
  std::vector<TrainResult> res;
  train(c, 2, 1, nullptr, &res);
  for (auto& r : res) {
    EXPECT_EQ(r.resumedFrom, 8);
    EXPECT_EQ(r.steps, 12);
  }
  std::filesystem::remove_all(dir);
}
