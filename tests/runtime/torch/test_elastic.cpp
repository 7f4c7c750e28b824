// Changing the number of replicas M: the operator's absolute target (gScaleTarget, from the
// telemetry SCALE command) (docs/elastic.md).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "test_util.h"
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

Config smallEdit(const std::string& dir) {
  auto c = test::smallConfig(test::makeTokenFile(dir, 64, 20000, 3));
  c.training.steps = 16;
  c.algorithm.mode = "edit";
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
  const auto res = train(c, 2, 1, [&](int rank, Trainer&, const StepReport& r) {
    if (rank != 0) return;
    replicasSeen.push_back(r.replicas);
    if (r.step == 1) gScaleTarget = 2;
    if (r.step == 5) {
      gScaleRequest = 1;
      gScaleTarget = 1;
    }
    if (r.step == 8 || r.step == 11) gScaleTarget = 1;
  });
  EXPECT_EQ(gScaleTarget.load(), 0);  // taken at the next exchange
  EXPECT_EQ(gScaleRequest.load(), 0);
  gScaleTarget = 0;
  gScaleRequest = 0;
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
