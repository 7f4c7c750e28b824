// adviseLink (common/src/link_advice.h): the tau, window, codec and overlap it suggests keep the
// blocked share under the target by the share's own definition, recomputed here.
#include <gtest/gtest.h>

#include "link_advice.h"
#include "link_advice_json.h"

namespace edit {
namespace {

// The 20 Mbit/s int8 run of bench/results/2026-12-06/compression-link20-fastcpu.md, shaped
// as the run's own counters: 40 rounds of tau 16, 0.063 s of compute per step, 0.54 s
// blocked per round.
LinkMeasurement slowLink(const std::string& mode = "edit", const std::string& codec = "int8") {
  LinkMeasurement m;
  m.mode = mode;
  m.syncInterval = 16;
  m.syncSeconds = 1.0;
  m.compression = codec;
  m.rounds = 40;
  m.localSteps = 40 * 16;
  m.computeSeconds = m.localSteps * 0.063;
  m.blockedSeconds = m.rounds * 0.54;
  return m;
}

// Blocked share of a local phase with rounds of R blocked seconds every tau steps of c.
double share(double R, double c, double tau) { return R / (tau * c + R); }

TEST(LinkAdvice, SuggestsTheSmallestTauThatKeepsTheShareUnderTheTarget) {
  const auto a = adviseLink(slowLink());
  EXPECT_NEAR(a.blockedShare, share(0.54, 0.063, 16), 1e-9);
  EXPECT_NEAR(a.roundSeconds, 0.54, 1e-9);
  EXPECT_NEAR(a.stepSeconds, 0.063, 1e-9);
  EXPECT_LE(share(0.54, 0.063, a.syncInterval), 0.2);
  EXPECT_GT(share(0.54, 0.063, a.syncInterval - 1), 0.2);
  EXPECT_EQ(a.syncInterval, 35);
  EXPECT_NE(a.text.find("algorithm.syncInterval >= 35 (now 16)"), std::string::npos) << a.text;
  EXPECT_NE(a.text.find("blocked training 35%"), std::string::npos) << a.text;
  // One round takes 8.6 steps of compute: 9 overlapped steps hide it.
  EXPECT_EQ(a.overlapSteps, 9);
  EXPECT_NE(a.text.find("algorithm.overlapSteps >= 9"), std::string::npos) << a.text;
  EXPECT_NE(a.text.find("syncCompression=int4"), std::string::npos) << a.text;
}

TEST(LinkAdvice, NamesTheCodecThatHalvesTheBytesNext) {
  EXPECT_NE(adviseLink(slowLink("edit", "none")).text.find("syncCompression=int8"), std::string::npos);
  const auto int4 = adviseLink(slowLink("edit", "int4"));
  EXPECT_FALSE(int4.text.empty());
  EXPECT_EQ(int4.text.find("syncCompression="), std::string::npos) << int4.text;
}

TEST(LinkAdvice, AEditGetsAWindowInSeconds) {
  const auto a = adviseLink(slowLink("a-edit"));
  // window >= 4 R (share 20%), rounded up to a tenth of a second.
  EXPECT_NEAR(a.syncSeconds, 2.2, 1e-9);
  EXPECT_LE(share(0.54, 1.0, a.syncSeconds), 0.2);
  EXPECT_NE(a.text.find("algorithm.syncSeconds >= 2.2 (now 1.0)"), std::string::npos) << a.text;
  EXPECT_EQ(a.text.find("algorithm.syncInterval"), std::string::npos) << a.text;
}

TEST(LinkAdvice, OverlapIsOnlySuggestedWhereTheRunAllowsIt) {
  auto m = slowLink();
  m.overlapAllowed = false;
  EXPECT_EQ(adviseLink(m).text.find("algorithm.overlapSteps"), std::string::npos);
  // Already overlapping 2 steps and still blocked: 2 more than the remaining wait.
  m = slowLink();
  m.overlapSteps = 2;
  EXPECT_EQ(adviseLink(m).overlapSteps, 2 + 9);
}

TEST(LinkAdvice, SilentWhenTheLinkIsNotTheBottleneckOrNothingWasMeasured) {
  auto fast = slowLink();
  fast.blockedSeconds = fast.rounds * 0.1;  // 9% blocked
  const auto a = adviseLink(fast);
  EXPECT_TRUE(a.text.empty());
  EXPECT_NEAR(a.blockedShare, share(0.1, 0.063, 16), 1e-9);
  EXPECT_TRUE(adviseLink(slowLink("ddp")).text.empty());
  auto few = slowLink();
  few.rounds = 2;
  EXPECT_TRUE(adviseLink(few).text.empty());
  // A stricter target turns the 9% run into advice.
  EXPECT_FALSE(adviseLink(fast, 0.05).text.empty());
}

TEST(LinkAdvice, JudgesTheLinkByTheRankThatWaitedLeast) {
  // Rank 3 straggles: the others wait for it at every round, it waits for the exchange only.
  std::vector<LinkMeasurement> ranks(4, slowLink());
  for (int r = 0; r < 3; ++r) ranks[r].blockedSeconds += ranks[r].rounds * 1.0;
  ranks[3].computeSeconds *= 2;
  const auto m = leastBlocked(ranks);
  EXPECT_EQ(m.blockedSeconds, ranks[3].blockedSeconds);
  EXPECT_EQ(m.computeSeconds, ranks[3].computeSeconds);
  // A rank that left at a scale-down after 10 of the rounds, waiting like rank 0 in each:
  // less blocked time in total, not per round.
  auto leaver = ranks[0];
  leaver.rounds = 10;
  leaver.localSteps = 10 * 16;
  leaver.computeSeconds /= 4;
  leaver.blockedSeconds /= 4;
  ranks.push_back(leaver);
  // A rank without a round (it joined at the end) is not a candidate.
  ranks.push_back(LinkMeasurement{});
  EXPECT_EQ(leastBlocked(ranks).blockedSeconds, ranks[3].blockedSeconds);
  EXPECT_EQ(leastBlocked({}).localSteps, 0);
}

TEST(LinkAdvice, TheSummaryObjectRoundTripsAndOlderSummariesKeepTheDefaults) {
  auto m = slowLink("a-edit", "int4");
  m.overlapSteps = 3;
  m.overlapAllowed = false;
  const nlohmann::json j = m;
  const auto back = j.get<LinkMeasurement>();
  EXPECT_EQ(back.mode, "a-edit");
  EXPECT_EQ(back.compression, "int4");
  EXPECT_EQ(back.syncInterval, m.syncInterval);
  EXPECT_EQ(back.syncSeconds, m.syncSeconds);
  EXPECT_EQ(back.overlapSteps, 3);
  EXPECT_FALSE(back.overlapAllowed);
  EXPECT_EQ(back.localSteps, m.localSteps);
  EXPECT_EQ(back.computeSeconds, m.computeSeconds);
  EXPECT_EQ(back.blockedSeconds, m.blockedSeconds);
  EXPECT_EQ(back.rounds, m.rounds);
  const auto empty = nlohmann::json::object().get<LinkMeasurement>();
  EXPECT_EQ(empty.rounds, 0);
  EXPECT_TRUE(empty.overlapAllowed);
  EXPECT_TRUE(adviseLink(empty).text.empty());
}

}  // namespace
}  // namespace edit
