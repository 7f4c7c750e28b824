// api::EDiTJobStatus: what the operator writes reads back unchanged (the reconciler
// writes the status only when it changed), and a status someone edited is read as far as
// it parses.
#include <gtest/gtest.h>

#include "api/status.h"
#include "status_fixture.h"

using nlohmann::json;
using namespace edit::op::api;

TEST(Status, WhatTheOperatorWritesReadsBackUnchanged) {
  const json written = kFullStatus();
  EXPECT_EQ(EDiTJobStatus::fromJson(written).toJson(), written);
  // A fresh job's status has nothing to say, and says nothing.
  EXPECT_EQ(EDiTJobStatus{}.toJson(), json::object());
  EXPECT_EQ(EDiTJobStatus::fromJson(json::parse(R"({"stragglers": []})")).toJson(), json::parse(R"({"stragglers": []})"));
}

TEST(Status, WhatDoesNotParseIsLeftOut) {
  const auto s = EDiTJobStatus::fromJson(json::parse(R"({
    "phase": "Exploded", "restarts": "two", "recovery": {"ranks": []}, "avoidNodes": [{"rank": 1}, {"node": "n"}, "x"],
    "conditions": [{"status": "True"}, {"type": "Hung", "status": "Maybe"}], "scaling": 3
  })"));
  EXPECT_EQ(s.phase, Phase::Unset);
  EXPECT_FALSE(s.restarts);
  EXPECT_FALSE(s.recovery);  // no ranks: nothing to resume
  EXPECT_TRUE(s.avoidNodes.empty());
  EXPECT_FALSE(s.scaling);
  ASSERT_EQ(s.conditions.size(), 1u);
  EXPECT_EQ(s.conditions[0].status, CondStatus::Unknown);
}

TEST(Status, SetConditionKeepsTheTransitionTimeUntilTheStatusFlips) {
  EDiTJobStatus st;
  EXPECT_TRUE(st.setCondition(condition::Running, CondStatus::True, "A", "m", "t1", 1));
  EXPECT_FALSE(st.setCondition(condition::Running, CondStatus::True, "A", "m", "t2", 1));
  EXPECT_TRUE(st.setCondition(condition::Running, CondStatus::True, "B", "m", "t3", 1));
  EXPECT_EQ(st.condition(condition::Running)->lastTransitionTime, "t1");
  EXPECT_TRUE(st.setCondition(condition::Running, CondStatus::False, "B", "m", "t4", 1));
  EXPECT_EQ(st.condition(condition::Running)->lastTransitionTime, "t4");
  EXPECT_FALSE(st.conditionTrue(condition::Running));
  EXPECT_EQ(st.condition(condition::Hung), nullptr);
}

TEST(Status, PhaseNamesRoundTrip) {
  for (Phase p : kPhases) EXPECT_EQ(parsePhase(phaseName(p)), p) << phaseName(p);
  EXPECT_EQ(parsePhase(""), Phase::Unset);
  EXPECT_EQ(parsePhase("running"), Phase::Unset);
}

TEST(Status, RecoveryRecordKeepsRanksSortedAndUnique) {
  RecoveryStatus r;
  r.add(3, "u3");
  r.add(1, "u1");
  r.add(3, "u3b");
  r.add(1, "u1");
  EXPECT_EQ(r.ranks, (std::vector<int>{1, 3}));
  EXPECT_EQ(r.failedPodUIDs, (std::vector<std::string>{"u3", "u1", "u3b"}));
  EXPECT_EQ(r.rankList(), "1, 3");
  EXPECT_TRUE(r.hasFailedPod("u3b"));
  EXPECT_FALSE(r.hasFailedPod(""));
}
