// ZeRO-3 memory inside a replica (docs/memory.md): after a step a rank holds only its
// 1/N slices; full-size parameters and gradients exist only while their unit computes,
// and never more of them at once than the plan's bound.
#include <gtest/gtest.h>

#include "test_util.h"
#include "train/trainer.h"

using namespace edit;

namespace {

struct RankView {
  int64_t sliceBytes = 0, gradBytes = 0, outerBytes = 0;
  int64_t attachedFullBytes = 0;  // memory still attached to a `full` storage after run()
  int boundGrads = 0;             // parameters whose .grad is still defined (sharded)
  int64_t liveBuffers = 0, peakBuffers = 0, cachedBuffers = 0;
  MemoryPlan plan;
};

std::vector<RankView> runAndInspect(const Config& c, int M, int N) {
  const int port = test::freePort();
  std::vector<RankView> views(M * N);
  test::runRanks(M * N, [&](int r) {
    Trainer tr(c, test::meshFor(r, M, N, port));
    const auto res = tr.run();
    auto& v = views[r];
    v.plan = res.memory;
    for (const auto& u : tr.units()) {
      v.sliceBytes += static_cast<int64_t>(u.slice.nbytes());
      v.gradBytes += static_cast<int64_t>(u.gradSlice.nbytes());
      if (u.sharded()) {
        v.attachedFullBytes += static_cast<int64_t>(u.full.storage().nbytes());
        for (const auto& p : u.params) v.boundGrads += p.grad().defined() ? 1 : 0;
      }
    }
    for (const auto& o : tr.outer()) v.outerBytes += static_cast<int64_t>(o.outer.nbytes() + o.momentum.nbytes());
    v.liveBuffers = tr.buffers().liveBytes();
    v.peakBuffers = tr.buffers().peakLiveBytes();
    v.cachedBuffers = tr.buffers().cachedBytes();
  });
  return views;
}

Config deepConfig(const std::string& dir) {
  auto c = test::smallConfig(test::makeTokenFile(dir, 64, 20000, 7));
  c.model.layers = 8;  // many units, so the bound of a few units is well below the model
  c.training.steps = 8;
  c.data.val = c.data.train;
  c.data.valBatches = 2;
  return c;
}

int64_t modelBytes(const Config& c, int N) {
  int64_t b = 0;
  for (const auto& u : modelLayout(shapeOf(c.model))) b += 4 * ((u.numel + N - 1) / N) * N;
  return b;
}

TEST(Zero3Memory, OnlySlicesSurviveAStepAndBuffersStayWithinThePlan) {
  at::set_num_threads(1);
  const auto dir = test::tempDir("edit-mem");
  const auto c = deepConfig(dir);
  const int N = 3;
  const auto views = runAndInspect(c, 1, N);
  const int64_t model = modelBytes(c, N);
  for (const auto& v : views) {
    EXPECT_EQ(v.attachedFullBytes, 0) << "a unit is still gathered after the run";
    EXPECT_EQ(v.boundGrads, 0) << "a full-size gradient is still bound";
    EXPECT_EQ(v.liveBuffers, 0);
    // The persistent slices are 1/N of the model each, as the plan says.
    EXPECT_EQ(v.sliceBytes, model / N);
    EXPECT_EQ(v.sliceBytes, v.plan.parameters);
    EXPECT_EQ(v.gradBytes, v.plan.gradients);
    EXPECT_EQ(v.outerBytes, v.plan.outer);
    // Full-size buffers: some were used (the units were gathered), never more than the
    // plan's bound, which is well below the whole model here; the cache keeps no more.
    EXPECT_GT(v.peakBuffers, 0);
    EXPECT_LE(v.peakBuffers, v.plan.buffers);
    EXPECT_LT(v.plan.buffers, model);
    EXPECT_LE(v.cachedBuffers, v.plan.buffers);
  }
  std::filesystem::remove_all(dir);
}

TEST(Zero3Memory, WithoutReshardAfterForwardTheWholeModelIsGatheredOnce) {
  at::set_num_threads(1);
  const auto dir = test::tempDir("edit-mem2");
  auto c = deepConfig(dir);
  c.runtime.reshardAfterForward = false;
  const int N = 2;
  const auto views = runAndInspect(c, 1, N);
  for (const auto& v : views) {
    EXPECT_EQ(v.attachedFullBytes, 0);
    EXPECT_EQ(v.liveBuffers, 0);
    EXPECT_GE(v.peakBuffers, modelBytes(c, N));  // ZeRO-2: every unit gathered at the end of the forward
    EXPECT_LE(v.peakBuffers, v.plan.buffers);
  }
  std::filesystem::remove_all(dir);
}

// ZeRO-3's traffic inside a replica, as a user reads it from edit_comm_bytes_total
// {op="allgather",group="shard"}: each step gathers every unit for its forward, then the
// blocks again for their backward. Not the head (kept from its forward to its backward)
// and not the embedding (its backward reads only the token ids), whose table is the
// largest unit with a real vocabulary.
TEST(Zero3Traffic, TheBackwardGathersOnlyTheUnitsWhoseWeightsItReads) {
  at::set_num_threads(1);
  const auto dir = test::tempDir("edit-traffic");
  auto c = test::smallConfig(test::makeTokenFile(dir, 64, 20000, 7));
  c.model.layers = 3;
  c.training.steps = 5;
  c.algorithm.mode = Mode::Ddp;  // no sync rounds: the shard group carries only the step's gathers
  const int N = 2;
  const int port = test::freePort();
  std::vector<CommCounts> counts(N);
  test::runRanks(N, [&](int r) {
    Trainer tr(c, test::meshFor(r, 1, N, port));
    tr.run();
    counts[r] = tr.comm().counters();
  });
  int64_t forward = 0, backward = 0;  // bytes a rank sends per step: (N - 1) x its slice
  for (const auto& u : modelLayout(shapeOf(c.model))) {
    const int64_t sent = 4 * (N - 1) * ((u.numel + N - 1) / N);
    forward += sent;
    if (u.kind == UnitKind::Block) backward += sent;
  }
  for (int r = 0; r < N; ++r) {
    const auto& g = counts[r][{"allgather", "shard"}];
    EXPECT_EQ(g.bytes, static_cast<uint64_t>(c.training.steps * (forward + backward))) << "rank " << r;
    EXPECT_EQ(g.calls, static_cast<uint64_t>(c.training.steps * (2 + 2 * c.model.layers))) << "rank " << r;
  }
  std::filesystem::remove_all(dir);
}

TEST(Zero3Memory, UnshardedRanksUseNoBuffers) {
  at::set_num_threads(1);
  const auto dir = test::tempDir("edit-mem3");
  const auto c = deepConfig(dir);
  const auto views = runAndInspect(c, 2, 1);
  for (const auto& v : views) {
    EXPECT_EQ(v.peakBuffers, 0);
    EXPECT_EQ(v.sliceBytes, modelBytes(c, 1));
    // Outer weights + momentum: two more copies of the slice, and no copy of them from
    // before a round (in-place recovery rolls forward: docs/replica-recovery.md).
    EXPECT_EQ(v.outerBytes, 2 * v.sliceBytes);
    EXPECT_EQ(v.plan.state(), 6 * v.sliceBytes);
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
