// The planner's link policy (plan_link.cpp): the condition LinkBound from the workers'
// local-phase telemetry. The expected tau is computed here from the blocked share's
// definition, R / (tau c + R) <= 20%, not taken from the code under test.
#include <gtest/gtest.h>

#include <cmath>

#include "plan_fixtures.h"

using namespace edit::op::controller;
using namespace edit::op::controller::plantest;

namespace {

// A running 2 x 1 job whose ranks report their local phase: `rounds` rounds, `steps`
// local steps of `c` seconds of compute, and `blocked[r]` seconds blocked in all.
PlanInput runningWith(json spec, const std::vector<double>& blocked, double c = 0.1, long steps = 160,
                      long rounds = 10, json status = json::object()) {
  if (status.empty()) status = {{"phase", "Running"}};
  PlanInput in = input(spec, status);
  in.pods = {pod(0, "Running"), pod(1, "Running")};
  in.telemetry.present = true;
  for (int r = 0; r < static_cast<int>(blocked.size()); ++r) {
    TelemetryView::RankReport rep;
    rep.podUid = "uid-" + std::to_string(r) + "-0";
    rep.step = steps;
    rep.local.localSteps = steps;
    rep.local.computeSeconds = c * static_cast<double>(steps);
    rep.local.blockedSeconds = blocked[r];
    rep.local.rounds = rounds;
    in.telemetry.ranks[r] = rep;
  }
  return in;
}

std::string condMessage(const json& st, const std::string& type) {
  const auto c = findCondition(st, type);
  return c ? c->value("message", "") : "";
}

// The smallest tau with R / (tau c + R) <= 0.2.
long tauFor(double R, double c) {
  long tau = 1;
  while (R / (static_cast<double>(tau) * c + R) > 0.2 + 1e-12) ++tau;
  return tau;
}

}  // namespace

TEST(LinkPolicy, ABlockedLinkSetsLinkBoundWithTheTauThatFixesIt) {
  // Rank 0 waited 1.0 s per round, rank 1 (a straggler's peer) 1.5 s: the link costs
  // what rank 0 waited. Share 10 / (16 + 10) = 38%.
  Plan p = planReconcile(runningWith({}, {10.0, 15.0}));
  EXPECT_EQ(condStatus(js(p.status), "LinkBound"), "True");
  EXPECT_EQ(condReason(js(p.status), "LinkBound"), "SyncRoundsBlockTraining");
  const std::string msg = condMessage(js(p.status), "LinkBound");
  EXPECT_NE(msg.find("blocked training 38%"), std::string::npos) << msg;
  EXPECT_NE(msg.find("1.00 s per round"), std::string::npos) << msg;
  const long tau = tauFor(1.0, 0.1);
  EXPECT_EQ(tau, 40);
  EXPECT_NE(msg.find("algorithm.syncInterval >= " + std::to_string(tau) + " (now 16)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("syncCompression=int8"), std::string::npos) << msg;
  EXPECT_NE(msg.find("algorithm.overlapSteps >= 10"), std::string::npos) << msg;  // R / c steps hide a round
  EXPECT_TRUE(hasEvent(p, "Warning", "LinkBound"));
  // status.link: the measurement of rank 0, the one that waited least.
  EXPECT_EQ(js(p.status)["link"]["rank"], 0);
  EXPECT_DOUBLE_EQ(js(p.status)["link"]["blockedShare"].get<double>(), std::round(1e4 * 10.0 / 26.0) / 1e4);
  EXPECT_DOUBLE_EQ(js(p.status)["link"]["roundSeconds"].get<double>(), 1.0);
  EXPECT_DOUBLE_EQ(js(p.status)["link"]["stepSeconds"].get<double>(), 0.1);
  EXPECT_EQ(js(p.status)["link"]["rounds"], 10);
  EXPECT_EQ(js(p.status)["link"]["localSteps"], 160);
  // The other way round, rank 1 is measured.
  EXPECT_EQ(js(planReconcile(runningWith({}, {15.0, 10.0})).status)["link"]["rank"], 1);
  // A replacement that joined two rounds ago (blocked little so far) is not measured.
  PlanInput joined = runningWith({}, {10.0, 15.0});
  joined.telemetry.ranks[1].local.rounds = 2;
  joined.telemetry.ranks[1].local.blockedSeconds = 0.2;
  EXPECT_EQ(js(planReconcile(joined).status)["link"]["rank"], 0);

  // The next reconcile keeps it without a second event.
  Plan again = planReconcile(runningWith({}, {10.0, 15.0}, 0.1, 160, 10, js(p.status)));
  EXPECT_EQ(condStatus(js(again.status), "LinkBound"), "True");
  EXPECT_FALSE(hasEvent(again, "Warning", "LinkBound"));

  // The link keeps up again (e.g. a resume with a larger tau): False, with the share.
  Plan ok = planReconcile(runningWith({}, {2.0, 3.0}, 0.1, 160, 10, js(again.status)));
  EXPECT_EQ(condStatus(js(ok.status), "LinkBound"), "False");
  EXPECT_EQ(condReason(js(ok.status), "LinkBound"), "LinkKeepsUp");
  EXPECT_NE(condMessage(js(ok.status), "LinkBound").find("11%"), std::string::npos) << condMessage(js(ok.status), "LinkBound");
}

TEST(LinkPolicy, TheAdviceUsesTheJobsOwnSettings) {
  // tau 32 and int8 from the spec: the message says "now 32" and suggests int4.
  json spec = {{"algorithm", {{"syncInterval", 32}, {"syncCompression", "int8"}}}};
  Plan p = planReconcile(runningWith(spec, {10.0, 10.0}, 0.02, 320, 10));  // share 10 / 16.4 = 61%
  const std::string msg = condMessage(js(p.status), "LinkBound");
  EXPECT_NE(msg.find("algorithm.syncInterval >= " + std::to_string(tauFor(1.0, 0.02)) + " (now 32)"), std::string::npos)
      << msg;
  EXPECT_NE(msg.find("syncCompression=int4"), std::string::npos) << msg;

  // A-EDiT: the window, not tau.
  Plan a = planReconcile(runningWith({{"algorithm", {{"mode", "a-edit"}, {"syncSeconds", 2.0}}}}, {10.0, 10.0}));
  EXPECT_NE(condMessage(js(a.status), "LinkBound").find("algorithm.syncSeconds >= 4.0 (now 2.0)"), std::string::npos)
      << condMessage(js(a.status), "LinkBound");

  // GPU workers run NCCL, which refuses overlapSteps: no such hint.
  Plan g = planReconcile(runningWith({{"gpusPerWorker", 1}}, {10.0, 10.0}));
  EXPECT_EQ(condStatus(js(g.status), "LinkBound"), "True");
  EXPECT_EQ(condMessage(js(g.status), "LinkBound").find("algorithm.overlapSteps"), std::string::npos)
      << condMessage(js(g.status), "LinkBound");
}

TEST(LinkPolicy, NothingToSayWithoutEnoughRoundsForDdpOrUnderTheTarget) {
  EXPECT_FALSE(findCondition(js(planReconcile(runningWith({}, {10.0, 10.0}, 0.1, 160, 2)).status), "LinkBound"));
  EXPECT_FALSE(findCondition(js(planReconcile(runningWith({{"algorithm", {{"mode", "ddp"}}}}, {10.0, 10.0})).status),
                             "LinkBound"));
  Plan under = planReconcile(runningWith({}, {2.0, 2.0}));
  EXPECT_FALSE(findCondition(js(under.status), "LinkBound"));
  EXPECT_DOUBLE_EQ(js(under.status)["link"]["blockedShare"].get<double>(), std::round(1e4 * 2.0 / 18.0) / 1e4);  // shown anyway
  // Still in the warm-up: no local steps yet.
  EXPECT_FALSE(findCondition(js(planReconcile(runningWith({}, {0.0, 0.0}, 0.1, 0, 0)).status), "LinkBound"));
}

TEST(LinkPolicy, AFinishedJobKeepsTheVerdictForTheNextRun) {
  PlanInput in = runningWith({}, {10.0, 12.0});
  in.pods = {pod(0, "Succeeded", 0, 0), pod(1, "Succeeded", 0, 0)};
  Plan p = planReconcile(in);
  EXPECT_EQ(js(p.status)["phase"], "Succeeded");
  EXPECT_EQ(condStatus(js(p.status), "LinkBound"), "True");
}
