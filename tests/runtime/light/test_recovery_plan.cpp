// The in-place recovery's decisions (runtime/src/train/recovery_plan.h): which sync round every
// rank continues from, who copies the outer state from whom, and at which step. Each case
// is a table the ranks could exchange after a real loss (docs/replica-recovery.md).
#include <gtest/gtest.h>

#include <vector>

#include "train/recovery_plan.h"

using edit::planRecovery;
using edit::RecoveryOffer;

namespace {

RecoveryOffer joiner() {
  RecoveryOffer o;
  o.joiner = true;
  return o;
}
// Between rounds: `cur` complete, applied at step `step`.
RecoveryOffer between(int64_t cur, int64_t step) {
  RecoveryOffer o;
  o.cur = cur;
  o.curStep = step;
  return o;
}
// Inside round `round` (begun at `step`), not finished; snapshot of round-1 from `snapStep`.
RecoveryOffer inside(int64_t round, int64_t step, int64_t snapStep) {
  RecoveryOffer o;
  o.snap = round - 1;
  o.snapStep = snapStep;
  o.next = round;
  o.nextStep = step;
  return o;
}
// Finished round `round` (begun at `step`) in this or a later step; snapshot of round-1.
RecoveryOffer finished(int64_t round, int64_t step, int64_t snapStep) {
  RecoveryOffer o;
  o.cur = round;
  o.curStep = step;
  o.snap = round - 1;
  o.snapStep = snapStep;
  return o;
}

}  // namespace

// The fault suite's flake (test_kill_rank0, 2 x 2, tau 4): rank 0 died in the middle of its
// last unit of round 11 (begun at step 52), after the unit's sync-group exchange. Its shard
// peer, rank 1, could not finish that unit (the averaged norm is a shard-group sum); ranks
// 2 and 3 finished the round and trained 4 more local steps. Round 11 exists for both shard
// indices (on ranks 2 and 3): everyone continues from it, rank 1 takes it from rank 3.
// Before, everyone went back to round 10 and ranks 2 and 3 redid 8 steps (2 x tau).
TEST(RecoveryPlan, AShardPeerInsideTheLastUnitTakesTheRoundFromItsSyncPeer) {
  const auto p = planRecovery({joiner(), inside(11, 52, 48), finished(11, 52, 48), finished(11, 52, 48)}, 2, 2);
  ASSERT_EQ(p.why, "");
  EXPECT_EQ(p.round, 11);
  EXPECT_EQ(p.source, (std::vector<int>{1, 1}));
  EXPECT_EQ(p.receives, (std::vector<bool>{true, true, false, false}));
  EXPECT_EQ(p.fromSnapshot, (std::vector<bool>{false, false, false, false}));
  EXPECT_EQ(p.step, (std::vector<int64_t>{52, 52, 52, 52}));
  EXPECT_EQ(p.stepFrom[0], 1);  // its replica's surviving shard
}

// A rank lost in a local phase: every survivor holds the same round, only the replacement
// copies, everyone goes back to the step of that round.
TEST(RecoveryPlan, LostInALocalPhase) {
  const auto p = planRecovery({between(10, 48), joiner(), between(10, 48), between(10, 48)}, 2, 2);
  ASSERT_EQ(p.why, "");
  EXPECT_EQ(p.round, 10);
  EXPECT_EQ(p.source, (std::vector<int>{0, 1}));  // shard 1's lowest survivor is replica 1
  EXPECT_EQ(p.receives, (std::vector<bool>{false, true, false, false}));
  EXPECT_EQ(p.step, (std::vector<int64_t>{48, 48, 48, 48}));
}

// Rank 1 died before its shard peer finished any unit of round 11: ranks 0 and 2 are stuck
// inside it, rank 3 finished it. Shard 0 has no copy of round 11, so everyone goes back to
// round 10; rank 3 and the half-updated ranks restore their snapshots.
TEST(RecoveryPlan, ARoundNotFinishedForEveryShardIsRolledBack) {
  const auto p = planRecovery({inside(11, 52, 48), joiner(), inside(11, 52, 48), finished(11, 52, 48)}, 2, 2);
  ASSERT_EQ(p.why, "");
  EXPECT_EQ(p.round, 10);
  EXPECT_EQ(p.fromSnapshot, (std::vector<bool>{true, false, true, true}));
  EXPECT_EQ(p.receives, (std::vector<bool>{false, true, false, false}));
  EXPECT_EQ(p.source, (std::vector<int>{0, 1}));
  EXPECT_EQ(p.step, (std::vector<int64_t>{48, 48, 48, 48}));
}

// A survivor inside round 11 while another survivor of the same shard never began it: the
// round cannot have finished anywhere, nobody moves forward.
TEST(RecoveryPlan, NoNewerRoundWithoutAHolder) {
  const auto p = planRecovery({between(10, 48), inside(11, 52, 48), joiner(), joiner()}, 4, 1);
  ASSERT_EQ(p.why, "");
  EXPECT_EQ(p.round, 10);
  EXPECT_EQ(p.fromSnapshot, (std::vector<bool>{false, true, false, false}));
}

// A-EDiT: replicas apply a round at their own steps; each rank continues at its replica's.
TEST(RecoveryPlan, EachReplicaKeepsItsOwnStep) {
  const auto p = planRecovery({between(5, 40), between(5, 40), joiner(), between(5, 33)}, 2, 2);
  ASSERT_EQ(p.why, "");
  EXPECT_EQ(p.step, (std::vector<int64_t>{40, 40, 33, 33}));
  EXPECT_EQ(p.stepFrom[2], 3);
  EXPECT_EQ(p.source, (std::vector<int>{0, 0}));
}

// A whole replica lost: both its ranks copy from replica 0 and take its step.
TEST(RecoveryPlan, AWholeReplicaCopiesFromAnother) {
  const auto p = planRecovery({between(7, 36), between(7, 36), joiner(), joiner()}, 2, 2);
  ASSERT_EQ(p.why, "");
  EXPECT_EQ(p.receives, (std::vector<bool>{false, false, true, true}));
  EXPECT_EQ(p.stepFrom, (std::vector<int>{0, 1, 0, 1}));
  EXPECT_EQ(p.step, (std::vector<int64_t>{36, 36, 36, 36}));
}

TEST(RecoveryPlan, RefusesWhatCannotBeRecovered) {
  // The synchronous warm-up: no outer state anywhere.
  EXPECT_EQ(planRecovery({RecoveryOffer{}, joiner()}, 2, 1).why, "no survivor holds an outer state yet");
  // Every replica's rank with shard 1 is gone.
  EXPECT_EQ(planRecovery({between(3, 20), joiner(), between(3, 20), joiner()}, 2, 2).why,
            "every replica's rank with shard 1 was lost");
  // Survivors two rounds apart (cannot happen with the control-exchange fence): refused,
  // not guessed.
  EXPECT_EQ(planRecovery({between(3, 20), between(5, 28), joiner(), between(5, 28)}, 4, 1).why,
            "rank 1 no longer holds sync round 3");
}
