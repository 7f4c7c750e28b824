// The world agrees on checkpoints: every rank resumes from the same step even when one
// rank's view of checkpoint.dir lacks the newest (an NFS client's stale listing, here a
// copy of the folder without it), a rank that can read none is refused by name, and a
// checkpoint one rank cannot write fails on every rank at once and leaves nothing behind.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "test_util.h"
#include "train/checkpoint.h"
#include "train/trainer.h"

using namespace edit;
namespace fs = std::filesystem;

namespace {

struct RankOutcome {
  TrainResult result;
  std::string error;  // what the rank threw, empty if it finished
  bool notSaved = false, noSpace = false, layout = false;
};

// Ranks of an M x 1 ddp run, rank r with checkpoint.dir dirs[r]; each rank's result or error.
std::vector<RankOutcome> run(Config c, const std::vector<std::string>& dirs,
                             const std::function<void(int, const StepReport&)>& onStep = nullptr) {
  const int W = static_cast<int>(dirs.size());
  const int port = test::freePort();
  std::vector<RankOutcome> out(W);
  test::runRanks(W, [&](int r) {
    Config mine = c;
    mine.checkpoint.dir = dirs[r];
    MeshSpec mesh = test::meshFor(r, W, 1, port);
    mesh.timeoutSeconds = 20;  // a rank left waiting fails the test in 20 s, not 60
    TrainerHooks h;
    if (onStep) h.onStep = [&, r](const StepReport& rep) { onStep(r, rep); };
    try {
      Trainer tr(mine, mesh, h);
      out[r].result = tr.run();
    } catch (const CheckpointNotSaved& e) {
      out[r] = {{}, e.what(), true, e.noSpace, false};
    } catch (const CheckpointLayoutError& e) {
      out[r] = {{}, e.what(), false, false, true};
    } catch (const std::exception& e) {
      out[r].error = e.what();
    }
  });
  return out;
}

Config ddpConfig(const std::string& dir) {
  auto c = test::smallConfig(test::makeTokenFile(dir, 64, 20000, 5));
  c.algorithm.mode = Mode::Ddp;
  c.training.steps = 10;
  c.checkpoint.everySteps = 4;
  c.checkpoint.keep = 5;
  return c;
}

// Files whose name says they were never committed (AtomicFile's ".name.tmp-PID").
std::vector<std::string> tempFiles(const std::string& root) {
  std::vector<std::string> found;
  for (const auto& e : fs::recursive_directory_iterator(root))
    if (e.path().filename().string().find(".tmp-") != std::string::npos) found.push_back(e.path().string());
  return found;
}

}  // namespace

TEST(CheckpointAgreement, RankMissingTheNewestStepMakesEveryRankResumeFromTheSameOlderOne) {
  at::set_num_threads(1);
  const auto dir = test::tempDir("edit-agree-stale");
  auto c = ddpConfig(dir);
  const std::string shared = dir + "/ckpt", stale = dir + "/stale";
  for (const auto& r : run(c, {shared, shared})) ASSERT_TRUE(r.error.empty()) << r.error;
  ASSERT_EQ(completeCheckpointSteps(shared), (std::vector<int64_t>{10, 8, 4}));
  // Rank 1 sees the folder as it was before step 10 was written.
  fs::copy(shared, stale, fs::copy_options::recursive);
  fs::remove_all(stepDirName(stale, 10));

  c.training.steps = 12;
  const auto res = run(c, {shared, stale});
  for (size_t r = 0; r < res.size(); ++r) {
    ASSERT_TRUE(res[r].error.empty()) << "rank " << r << ": " << res[r].error;
    EXPECT_EQ(res[r].result.resumedFrom, 8) << "rank " << r;
    EXPECT_EQ(res[r].result.steps, 12) << "rank " << r;
  }
  fs::remove_all(dir);
}

TEST(CheckpointAgreement, RankThatCanReadNoCheckpointIsRefusedNamingTheStepAndTheRank) {
  at::set_num_threads(1);
  const auto dir = test::tempDir("edit-agree-none");
  auto c = ddpConfig(dir);
  const std::string shared = dir + "/ckpt", empty = dir + "/empty";
  for (const auto& r : run(c, {shared, shared})) ASSERT_TRUE(r.error.empty()) << r.error;
  fs::create_directories(empty);

  c.training.steps = 12;
  const auto res = run(c, {shared, empty});
  for (size_t r = 0; r < res.size(); ++r) {
    // Not a fresh start from step 0 beside a rank that could resume.
    ASSERT_TRUE(res[r].layout) << "rank " << r << " did not refuse: " << res[r].error;
    EXPECT_NE(res[r].error.find("the newest, step 10, is not readable on rank 1"), std::string::npos)
        << res[r].error;
  }
  EXPECT_NE(res[1].error.find("MANIFEST: missing"), std::string::npos) << res[1].error;  // rank 1 says why
  // With no checkpoint anywhere, every rank starts over.
  const auto fresh = run(c, {dir + "/none0", dir + "/none1"});
  for (const auto& r : fresh) {
    ASSERT_TRUE(r.error.empty()) << r.error;
    EXPECT_EQ(r.result.resumedFrom, -1);
  }
  fs::remove_all(dir);
}

TEST(CheckpointAgreement, CheckpointOneRankCannotWriteFailsOnEveryRankAndLeavesNothing) {
  at::set_num_threads(1);
  const auto dir = test::tempDir("edit-agree-write");
  auto c = ddpConfig(dir);
  const std::string d0 = dir + "/rank0", d1 = dir + "/rank1";
  // After the checkpoint of step 4, something that is not a directory takes the place of
  // rank 1's step 8: its write fails (ENOTDIR) while rank 0's succeeds.
  const auto res = run(c, {d0, d1}, [&](int r, const StepReport& rep) {
    if (r == 1 && rep.step == 6) std::ofstream(stepDirName(d1, 8)) << "in the way";
  });
  for (size_t r = 0; r < res.size(); ++r) {
    ASSERT_TRUE(res[r].notSaved) << "rank " << r << ": " << res[r].error;
    EXPECT_FALSE(res[r].noSpace);
    EXPECT_NE(res[r].error.find("checkpoint " + stepDirName(r == 0 ? d0 : d1, 8) + " was not saved: ENOTDIR"),
              std::string::npos)
        << res[r].error;
    EXPECT_NE(res[r].error.find("on rank 1"), std::string::npos) << res[r].error;
  }
  // Rank 0's part of step 8 is gone; step 4 is complete and loads.
  EXPECT_FALSE(fs::exists(stepDirName(d0, 8)));
  EXPECT_TRUE(tempFiles(dir).empty());
  EXPECT_EQ(completeCheckpointSteps(d0), (std::vector<int64_t>{4}));
  const Manifest m = readManifest(stepDirName(d0, 4));
  EXPECT_EQ(verifyCheckpointFile(rankFileName(stepDirName(d0, 4), 0)), m.crcs[0]);
  EXPECT_EQ(verifyCheckpointFile(rankFileName(stepDirName(d1, 4), 1)), m.crcs[1]);
  fs::remove_all(dir);
}
