// The failure policy on its own (controller/failure_policy.h): exit codes, the backoff
// budget, disruptions and the answer to a failure or a hang. The planner's tests
// (unit_plan_test.cpp, unit_recovery_test.cpp) check how it carries the answers out.
#include <gtest/gtest.h>

#include "controller/failure_policy.h"
#include "plan_fixtures.h"

using namespace edit::op::controller;
using namespace edit::op::controller::plantest;

namespace {

TEST(FailurePolicy, BudgetCountsRestartsAndRecoveriesButNotDisruptions) {
  BackoffBudget b{2, 3, 4, 1};
  EXPECT_EQ(b.used(), 1);
  EXPECT_TRUE(b.exhausted());
  EXPECT_EQ(b.usage(), "1 of runPolicy.backoffLimit=1 used");
  EXPECT_EQ(b.exhaustedMessage(),
            "runPolicy.backoffLimit=1 already used (2 gang restarts, 3 in-place recoveries, 4 of them after "
            "disruptions, not counted)");
  b.limit = 2;
  EXPECT_FALSE(b.exhausted());
}

TEST(FailurePolicy, PermanentExitCodesFailTheJob) {
  const ObservedPod crashed = pod(0, "Failed", 0, 1), invalid = pod(1, "Failed", 0, 2), stalled = pod(1, "Failed", 0, 3);
  EXPECT_FALSE(permanentFailure({&crashed}));
  for (int code : {2, 126, 127}) {
    const ObservedPod p = pod(1, "Failed", 0, code);
    auto f = permanentFailure({&crashed, &p});
    ASSERT_TRUE(f) << code;
    EXPECT_EQ(f->reason, "PermanentError");
    EXPECT_NE(f->message.find("j-worker-1 failed with exit code " + std::to_string(code)), std::string::npos);
  }
  auto f = permanentFailure({&stalled, &invalid});
  ASSERT_TRUE(f);
  EXPECT_EQ(f->reason, "TrainingStalled");  // the first permanent one decides
  for (int code : {75, 76, 137, 143}) {
    const ObservedPod p = pod(0, "Failed", 0, code);
    EXPECT_FALSE(permanentFailure({&p})) << code;
  }
}

TEST(FailurePolicy, ALongMessageKeepsItsEnd) {
  // A message from the log's tail (FallbackToLogsOnError) ends with the lines that say why.
  ObservedPod p = pod(1, "Failed", 0, 75);
  p.message = std::string(3000, 'x') + "[rank 1] peer lost: the reason";
  const std::string d = describeExit(p);
  EXPECT_NE(d.find("j-worker-1 failed with exit code 75: ..."), std::string::npos) << d;
  EXPECT_EQ(d.substr(d.size() - 30), "[rank 1] peer lost: the reason");
  EXPECT_LT(d.size(), 1100u);
  p.message = "invalid data: short";
  EXPECT_NE(describeExit(p).find("exit code 75: invalid data: short"), std::string::npos);
}

TEST(FailurePolicy, DisruptionCausesStopsAndVanishedPodsOnly) {
  ObservedPod evicted = pod(0, "Failed", 0, 1);
  evicted.disruption = "EvictionByEvictionAPI";
  EXPECT_TRUE(causedByDisruption({&evicted}, false));  // taken away itself
  const ObservedPod stopped = pod(0, "Failed", 0, 143), left = pod(1, "Failed", 0, 76), crashed = pod(1, "Failed", 0, 1);
  ObservedPod vanished = pod(1, "");
  EXPECT_TRUE(causedByDisruption({&stopped, &left}, true));
  EXPECT_TRUE(causedByDisruption({&vanished}, true));
  EXPECT_FALSE(causedByDisruption({&stopped, &left}, false));  // no disruption seen
  EXPECT_FALSE(causedByDisruption({&stopped, &crashed}, true));  // a crash of its own is charged
  EXPECT_FALSE(causedByDisruption({}, true));
}

TEST(FailurePolicy, FailedWorkers) {
  const BackoffBudget spare{0, 0, 0, 3}, spent{1, 2, 0, 3};
  using R = FailureResponse;
  EXPECT_EQ(respondToFailedWorkers("", false, false, spare), R::StartRecovery);
  EXPECT_EQ(respondToFailedWorkers("", true, false, spent), R::JoinRecovery);  // same recovery, same budget
  EXPECT_EQ(respondToFailedWorkers("", false, true, spent), R::StartRecovery);  // free after a disruption
  EXPECT_EQ(respondToFailedWorkers("", false, false, spent), R::FailJob);
  EXPECT_EQ(respondToFailedWorkers("exit 75", true, false, spare), R::RestartGang);
  EXPECT_EQ(respondToFailedWorkers("exit 75", false, true, spent), R::RestartGang);
  EXPECT_EQ(respondToFailedWorkers("exit 75", false, false, spent), R::FailJob);
}

TEST(FailurePolicy, Hang) {
  const BackoffBudget spare{0, 0, 0, 3}, spent{3, 0, 0, 3};
  using R = FailureResponse;
  EXPECT_EQ(respondToHang(true, false, spare), R::StartRecovery);
  EXPECT_EQ(respondToHang(true, true, spare), R::RestartGang);  // never on top of a recovery
  EXPECT_EQ(respondToHang(false, false, spare), R::RestartGang);
  EXPECT_EQ(respondToHang(true, false, spent), R::FailJob);
  EXPECT_EQ(respondToHang(false, false, spent), R::FailJob);
}

TEST(FailurePolicy, StragglerReplacementNeedsBudgetUnlessItJoinsARecovery) {
  EXPECT_TRUE(mayReplaceStraggler(false, BackoffBudget{0, 0, 0, 1}));
  EXPECT_FALSE(mayReplaceStraggler(false, BackoffBudget{0, 1, 0, 1}));
  EXPECT_TRUE(mayReplaceStraggler(true, BackoffBudget{0, 1, 0, 1}));
}

TEST(FailurePolicy, GangRestartReasonFromExitCodes) {
  const auto spec = *input({{"runPolicy", {{"replicaRecovery", "InPlace"}}}}).spec;
  const ObservedPod killed = pod(1, "Failed", 0, 137), peerLost = pod(1, "Failed", 0, 75),
                    stopped = pod(1, "Failed", 0, 143);
  EXPECT_EQ(gangRestartReason(spec, edit::op::api::Phase::Running, {&killed}, nullptr), "");
  EXPECT_NE(gangRestartReason(spec, edit::op::api::Phase::Running, {&peerLost}, nullptr).find("exit 75"), std::string::npos);
  EXPECT_NE(gangRestartReason(spec, edit::op::api::Phase::Running, {&stopped}, nullptr).find("exit 143"), std::string::npos);
  EXPECT_EQ(gangRestartReason(spec, edit::op::api::Phase::Created, {&killed}, nullptr), "the gang was not running yet");
}

}  // namespace
