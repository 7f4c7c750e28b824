// The in-place recovery's decisions (runtime/src/train/recovery_plan.h): which sync round every
// rank continues from, how far into it each shard's outer state got, who copies the outer
// state from whom, and at which step. Each case is a table the ranks could exchange after a
// real loss (docs/replica-recovery.md).
#include <gtest/gtest.h>

#include <vector>

#include "train/recovery_plan.h"

using edit::planRecovery;
using edit::RecoveryOffer;

namespace {

constexpr int64_t kUnits = 6;  // embedding, four blocks, head

RecoveryOffer joiner() {
  RecoveryOffer o;
  o.joiner = true;
  return o;
}
// Between rounds: `cur` complete, applied at step `step`; the rank is now at step `now`.
RecoveryOffer between(int64_t cur, int64_t step, int64_t now = -1) {
  RecoveryOffer o;
  o.cur = cur;
  o.curStep = step;
  o.stepNow = now < 0 ? step : now;
  return o;
}
// Inside round `round` (begun at `step`) with its first `done` units applied.
RecoveryOffer inside(int64_t round, int64_t step, int64_t done) {
  RecoveryOffer o;
  o.cur = round - 1;
  o.curStep = step - 4;
  o.next = round;
  o.nextStep = step;
  o.unitsDone = done;
  o.stepNow = step;
  return o;
}
// Finished round `round` (begun at `step`) in this or a later step.
RecoveryOffer finished(int64_t round, int64_t step) { return between(round, step, step + 2); }

}  // namespace

// The fault suite's old flake (test_kill_rank0, 2 x 2, tau 4): rank 0 died in the middle of
// its last unit of round 11 (begun at step 52), after the unit's sync-group exchange. Its
// shard peer, rank 1, could not finish that unit (the averaged norm is a shard-group sum);
// ranks 2 and 3 finished the round and trained on. Everyone continues from round 11, rank 1
// takes it from rank 3.
TEST(RecoveryPlan, AShardPeerInsideTheLastUnitTakesTheRoundFromItsSyncPeer) {
  const auto p = planRecovery({joiner(), inside(11, 52, kUnits - 1), finished(11, 52), finished(11, 52)}, 2, 2,
                              kUnits, true);
  ASSERT_EQ(p.why, "");
  EXPECT_EQ(p.round, 11);
  EXPECT_EQ(p.unitsApplied, (std::vector<int64_t>{kUnits, kUnits}));
  EXPECT_EQ(p.source, (std::vector<int>{1, 1}));
  EXPECT_EQ(p.receives, (std::vector<bool>{true, true, false, false}));
  EXPECT_EQ(p.step, (std::vector<int64_t>{52, 52, 52, 52}));
  EXPECT_EQ(p.stepFrom[0], 1);  // its replica's surviving shard
}

// A rank lost in a local phase: every survivor holds the same round, only the replacement
// copies, everyone goes back to the step of that round.
TEST(RecoveryPlan, LostInALocalPhase) {
  const auto p = planRecovery({between(10, 48, 50), joiner(), between(10, 48, 50), between(10, 48, 50)}, 2, 2,
                              kUnits, true);
  ASSERT_EQ(p.why, "");
  EXPECT_EQ(p.round, 10);
  EXPECT_EQ(p.unitsApplied, (std::vector<int64_t>{kUnits, kUnits}));
  EXPECT_EQ(p.source, (std::vector<int>{0, 1}));  // shard 1's lowest survivor is replica 1
  EXPECT_EQ(p.receives, (std::vector<bool>{false, true, false, false}));
  EXPECT_EQ(p.step, (std::vector<int64_t>{48, 48, 48, 48}));
}

// Rank 1 died inside round 11 before its sync group finished a unit; shard 0's sync group
// (ranks 0 and 2) got through 3 units, rank 3 had finished the round. Round 11 goes on
// with shard 0's units 3.. keeping round 10's state; nobody goes back an interval, and
// nobody holding the furthest state copies anything but the replacement.
TEST(RecoveryPlan, AHalfAppliedRoundRollsForward) {
  const auto p = planRecovery({inside(11, 52, 3), joiner(), inside(11, 52, 3), finished(11, 52)}, 2, 2, kUnits,
                              true);
  ASSERT_EQ(p.why, "");
  EXPECT_EQ(p.round, 11);
  EXPECT_EQ(p.unitsApplied, (std::vector<int64_t>{3, kUnits}));
  EXPECT_EQ(p.source, (std::vector<int>{0, 1}));
  EXPECT_EQ(p.receives, (std::vector<bool>{false, true, false, false}));
  EXPECT_EQ(p.step, (std::vector<int64_t>{52, 52, 52, 52}));
}

// Survivors of one sync group that got to different units (Gloo returns a collective on
// some ranks before others fail): the ones behind take the furthest one's state.
TEST(RecoveryPlan, RanksBehindInASyncGroupTakeTheFurthestOnesUnits) {
  const auto p = planRecovery({inside(11, 52, 2), inside(11, 52, 4), joiner(), inside(11, 52, 4)}, 4, 1, kUnits,
                              true);
  ASSERT_EQ(p.why, "");
  EXPECT_EQ(p.round, 11);
  EXPECT_EQ(p.unitsApplied, (std::vector<int64_t>{4}));
  EXPECT_EQ(p.source, (std::vector<int>{1}));
  EXPECT_EQ(p.receives, (std::vector<bool>{true, false, true, false}));
}

// A survivor inside round 11 with no unit applied while another never began it: nothing of
// round 11 exists, everyone goes back to round 10.
TEST(RecoveryPlan, NothingOfTheNewRoundAppliedGoesBackToTheLastOne) {
  const auto p = planRecovery({between(10, 48, 52), inside(11, 52, 0), joiner(), joiner()}, 4, 1, kUnits, true);
  ASSERT_EQ(p.why, "");
  EXPECT_EQ(p.round, 10);
  EXPECT_EQ(p.unitsApplied, (std::vector<int64_t>{kUnits}));
  EXPECT_EQ(p.receives, (std::vector<bool>{false, false, true, true}));
  EXPECT_EQ(p.step, (std::vector<int64_t>{48, 48, 48, 48}));
}

// A-EDiT: replicas apply a round at their own steps; each rank continues at its replica's.
TEST(RecoveryPlan, EachReplicaKeepsItsOwnStep) {
  const auto p = planRecovery({between(5, 40), between(5, 40), joiner(), between(5, 33)}, 2, 2, kUnits, false);
  ASSERT_EQ(p.why, "");
  EXPECT_EQ(p.step, (std::vector<int64_t>{40, 40, 33, 33}));
  EXPECT_EQ(p.stepFrom[2], 3);
  EXPECT_EQ(p.source, (std::vector<int>{0, 0}));
}

// Round 6 was applied in shard 0's sync group, but replica 0's surviving rank never left
// the round's control exchange (its shard peer, which had, died). A-EDiT: replica 0
// continues at the step its survivor is at. Step-clocked: at the round's step, which every
// replica shares (the survivor may have failed a step earlier, in its last all-gather).
TEST(RecoveryPlan, AReplicaThatHadNotEnteredTheRoundTakesTheRightStep) {
  const std::vector<RecoveryOffer> aedit{joiner(), between(5, 33, 40), inside(6, 47, 2), inside(6, 47, 0)};
  auto p = planRecovery(aedit, 2, 2, kUnits, false);
  ASSERT_EQ(p.why, "");
  EXPECT_EQ(p.round, 6);
  EXPECT_EQ(p.unitsApplied, (std::vector<int64_t>{2, 0}));
  EXPECT_EQ(p.receives, (std::vector<bool>{true, false, false, false}));
  EXPECT_EQ(p.step, (std::vector<int64_t>{40, 40, 47, 47}));
  const std::vector<RecoveryOffer> stepped{joiner(), between(5, 36, 39), inside(6, 40, 2), inside(6, 40, 0)};
  p = planRecovery(stepped, 2, 2, kUnits, true);
  ASSERT_EQ(p.why, "");
  EXPECT_EQ(p.step, (std::vector<int64_t>{40, 40, 40, 40}));
}

// A whole replica lost: both its ranks copy from replica 0 and take its step.
TEST(RecoveryPlan, AWholeReplicaCopiesFromAnother) {
  const auto p = planRecovery({between(7, 36), between(7, 36), joiner(), joiner()}, 2, 2, kUnits, true);
  ASSERT_EQ(p.why, "");
  EXPECT_EQ(p.receives, (std::vector<bool>{false, false, true, true}));
  EXPECT_EQ(p.stepFrom, (std::vector<int>{0, 1, 0, 1}));
  EXPECT_EQ(p.step, (std::vector<int64_t>{36, 36, 36, 36}));
}

TEST(RecoveryPlan, RefusesWhatCannotBeRecovered) {
  // The synchronous warm-up: no outer state anywhere.
  EXPECT_EQ(planRecovery({RecoveryOffer{}, joiner()}, 2, 1, kUnits, true).why,
            "no survivor holds an outer state yet");
  // Every replica's rank with shard 1 is gone.
  EXPECT_EQ(planRecovery({between(3, 20), joiner(), between(3, 20), joiner()}, 2, 2, kUnits, true).why,
            "every replica's rank with shard 1 was lost");
  // Survivors two rounds apart (cannot happen with the control-exchange fence): refused,
  // not guessed.
  EXPECT_EQ(planRecovery({between(3, 20), between(5, 28), joiner(), between(5, 28)}, 4, 1, kUnits, true).why,
            "rank 1 is at sync round 5, more than one round past round 3 of another survivor");
}
