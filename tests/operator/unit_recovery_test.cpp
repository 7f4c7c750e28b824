// The planner's in-place replica recovery (controller/recovery.h): which failures are
// replaced in place and which restart the gang, the recovery record, EDIT_JOIN ranks,
// events and conditions, the shared backoff budget. Hangs and pod disruptions during or
// around a recovery: unit_recovery_disruption_test.cpp.
#include <gtest/gtest.h>

#include "controller/plan.h"
#include "plan_fixtures.h"
#include "util/log.h"

using namespace edit::op;
using namespace edit::op::controller;
using namespace edit::op::controller::plantest;
using nlohmann::json;

TEST(Recovery, KilledNonZeroRankIsReplacedInPlace) {
  PlanInput in = input({}, kRunning);
  in.pods = {pod(0, "Running"), pod(1, "Failed", 0, 137)};
  in.pods[1].reason = "Error";
  Plan p = planReconcile(in);
  EXPECT_FALSE(p.gangRestarted);
  EXPECT_EQ(p.podsToDelete, std::vector<std::string>{"j-worker-1"});  // only the failed pod
  EXPECT_FALSE(p.deleteImmediately);
  EXPECT_EQ(p.recoveredRanks, std::vector<int>{1});
  EXPECT_EQ(js(p.status)["phase"], "Running");  // the survivors keep running
  EXPECT_EQ(js(p.status)["restarts"], 0);
  EXPECT_EQ(js(p.status)["restartGeneration"], 0);
  EXPECT_EQ(js(p.status)["replicaRecoveries"], 1);
  EXPECT_EQ(js(p.status)["recovery"]["ranks"], json::array({1}));
  EXPECT_EQ(js(p.status)["recovery"]["startTime"], log::rfc3339(kNow));
  EXPECT_EQ(js(p.status)["recovery"]["failedPodUIDs"], json::array({"uid-1-0"}));
  EXPECT_EQ(condStatus(js(p.status), "Recovering"), "True");
  EXPECT_EQ(condReason(js(p.status), "Recovering"), "ReplicaFailed");
  const std::string msg = findCondition(js(p.status), "Recovering")->value("message", "");
  EXPECT_NE(msg.find("j-worker-1"), std::string::npos) << msg;
  EXPECT_NE(msg.find("exit code 137"), std::string::npos) << msg;
  EXPECT_TRUE(hasEvent(p, "Warning", "RecoveringReplica"));
  EXPECT_FALSE(hasEvent(p, "Warning", "Restarting"));

  // Level-triggered: the same failed pod, now being deleted, is neither counted again nor
  // replaced before it is gone.
  PlanInput again = input({}, js(p.status));
  again.pods = in.pods;
  again.pods[1].deleting = true;
  Plan a = planReconcile(again);
  EXPECT_EQ(js(a.status), js(p.status));
  EXPECT_TRUE(a.events.empty());
  EXPECT_TRUE(a.podsToDelete.empty());
  EXPECT_TRUE(a.ranksToCreate.empty());
  // A stale view without the deletion repeats the delete, still without counting.
  PlanInput stale = input({}, js(p.status));
  stale.pods = in.pods;
  Plan st = planReconcile(stale);
  EXPECT_EQ(st.podsToDelete, std::vector<std::string>{"j-worker-1"});
  EXPECT_EQ(js(st.status)["replicaRecoveries"], 1);
  EXPECT_TRUE(st.events.empty());

  // Once it is gone only rank 1 is created, in the same generation, and it joins.
  PlanInput gone = input({}, js(p.status));
  gone.pods = {pod(0, "Running")};
  Plan g = planReconcile(gone);
  EXPECT_EQ(g.ranksToCreate, std::vector<int>{1});
  EXPECT_EQ(g.joiningRanks, std::vector<int>{1});
  EXPECT_FALSE(g.gangCreated);
  EXPECT_EQ(js(g.status)["restartGeneration"], 0);

  // The replacement (a new pod UID) pending: still recovering.
  PlanInput pending = input({}, js(g.status));
  pending.pods = {pod(0, "Running"), pod(1, "Pending")};
  pending.pods[1].uid = "uid-1-0-replacement";
  Plan w = planReconcile(pending);
  EXPECT_TRUE(js(w.status).contains("recovery"));
  EXPECT_TRUE(w.ranksToCreate.empty());

  // All running again (no telemetry: Running is the only sign): the record goes,
  // Recovering turns False, the time it took is told.
  PlanInput up = input({}, js(w.status));
  up.now = kNow + 12;
  up.pods = {pod(0, "Running"), pod(1, "Running")};
  up.pods[1].uid = "uid-1-0-replacement";
  Plan r = planReconcile(up);
  EXPECT_FALSE(js(r.status).contains("recovery"));
  EXPECT_EQ(condStatus(js(r.status), "Recovering"), "False");
  EXPECT_EQ(condReason(js(r.status), "Recovering"), "Recovered");
  EXPECT_EQ(js(r.status)["replicaRecoveries"], 1);
  EXPECT_EQ(js(r.status)["restarts"], 0);
  ASSERT_TRUE(hasEvent(r, "Normal", "ReplicaRecovered"));
  for (const auto& e : r.events)
    if (e.reason == "ReplicaRecovered") EXPECT_NE(e.message.find("12 s after the failure"), std::string::npos) << e.message;
  EXPECT_EQ(r.recoverySeconds, 12);
  // ... and a further pass is quiet.
  PlanInput after = input({}, js(r.status));
  after.now = kNow + 13;
  after.pods = up.pods;
  Plan q = planReconcile(after);
  EXPECT_TRUE(q.events.empty());
  EXPECT_TRUE(q.joiningRanks.empty());
}

// With telemetry, a Running replacement has not rejoined yet: the recovery ends with the
// first report sent by the replacement pod itself (same pod name, new UID).
TEST(Recovery, EndsWhenTheReplacementReportsATrainingStep) {
  json recovering = kRunning;
  recovering["replicaRecoveries"] = 1;
  recovering["recovery"] = {{"ranks", {1}}, {"startTime", log::rfc3339(kNow)}, {"failedPodUIDs", {"uid-1-0"}}};
  recovering["conditions"] = json::array();
  setCondition(recovering, "Recovering", "True", "ReplicaFailed", "j-worker-1 failed", log::rfc3339(kNow), 1);
  PlanInput in = input({}, recovering);
  in.now = kNow + 9;
  in.pods = {pod(0, "Running"), pod(1, "Running")};
  in.pods[1].uid = "uid-1-new";
  in.telemetry.present = true;
  in.telemetry.ranks[0] = {"uid-0-0", 48};
  in.telemetry.ranks[1] = {"uid-1-0", 44};  // the newest report of rank 1 is still the dead pod's
  Plan w = planReconcile(in);
  EXPECT_TRUE(js(w.status).contains("recovery"));
  EXPECT_EQ(condStatus(js(w.status), "Recovering"), "True");
  EXPECT_NE(js(w.status).value("message", "").find("waiting for their first training step"), std::string::npos)
      << js(w.status).dump();
  EXPECT_FALSE(w.recoverySeconds);
  EXPECT_FALSE(hasEvent(w, "Normal", "ReplicaRecovered"));

  // The replacement reports: recovered, with the step and the time from the failure.
  PlanInput joined = input({}, js(w.status));
  joined.now = kNow + 21;
  joined.pods = in.pods;
  joined.telemetry = in.telemetry;
  joined.telemetry.ranks[1] = {"uid-1-new", 41};
  Plan r = planReconcile(joined);
  EXPECT_FALSE(js(r.status).contains("recovery"));
  EXPECT_EQ(condReason(js(r.status), "Recovering"), "Recovered");
  EXPECT_EQ(r.recoverySeconds, 21);
  ASSERT_TRUE(hasEvent(r, "Normal", "ReplicaRecovered"));
  for (const auto& e : r.events)
    if (e.reason == "ReplicaRecovered") {
      EXPECT_NE(e.message.find("step 41 reported"), std::string::npos) << e.message;
      EXPECT_NE(e.message.find("21 s after the failure"), std::string::npos) << e.message;
    }

  // Workers that do not send their pod UID: Running is all there is to go on.
  PlanInput old = input({}, js(w.status));
  old.pods = in.pods;
  old.telemetry = in.telemetry;
  old.telemetry.ranks[1] = {"", 44};
  EXPECT_EQ(condReason(js(planReconcile(old).status), "Recovering"), "Recovered");
  // No report of rank 1 at all yet: still waiting.
  PlanInput none = input({}, js(w.status));
  none.pods = in.pods;
  none.telemetry = in.telemetry;
  none.telemetry.ranks.erase(1);
  EXPECT_TRUE(js(planReconcile(none).status).contains("recovery"));
}

TEST(Recovery, FailureWithoutExitCodeIsReplacedInPlace) {
  PlanInput in = input({}, kRunning);
  in.pods = {pod(0, "Running"), pod(1, "Failed")};  // e.g. its node was lost
  Plan p = planReconcile(in);
  EXPECT_FALSE(p.gangRestarted);
  EXPECT_EQ(js(p.status)["replicaRecoveries"], 1);
  EXPECT_EQ(p.podsToDelete, std::vector<std::string>{"j-worker-1"});
}

TEST(Recovery, WholeReplicaIsReplacedInOneRecovery) {
  PlanInput in = input({{"shardsPerReplica", 2}}, kRunning);
  in.pods = {pod(0, "Running"), pod(1, "Running"), pod(2, "Failed", 0, 137), pod(3, "Failed", 0, 137)};
  Plan p = planReconcile(in);
  EXPECT_FALSE(p.gangRestarted);
  EXPECT_EQ(js(p.status)["replicaRecoveries"], 1);
  EXPECT_EQ(js(p.status)["recovery"]["ranks"], json::array({2, 3}));
  EXPECT_EQ(p.podsToDelete, (std::vector<std::string>{"j-worker-2", "j-worker-3"}));

  PlanInput gone = input({{"shardsPerReplica", 2}}, js(p.status));
  gone.pods = {pod(0, "Running"), pod(1, "Running")};
  Plan g = planReconcile(gone);
  EXPECT_EQ(g.ranksToCreate, (std::vector<int>{2, 3}));
  EXPECT_EQ(g.joiningRanks, (std::vector<int>{2, 3}));
}

TEST(Recovery, SecondRankFailingJoinsTheRecoveryInProgress) {
  PlanInput in = input({{"shardsPerReplica", 2}}, kRunning);
  in.pods = {pod(0, "Running"), pod(1, "Running"), pod(2, "Failed", 0, 137), pod(3, "Running")};
  Plan p = planReconcile(in);
  PlanInput next = input({{"shardsPerReplica", 2}}, js(p.status));
  next.now = kNow + 1;
  next.pods = {pod(0, "Running"), pod(1, "Running"), pod(3, "Failed", 0, 137)};
  Plan n = planReconcile(next);
  EXPECT_FALSE(n.gangRestarted);
  EXPECT_EQ(js(n.status)["replicaRecoveries"], 1);  // the same recovery
  EXPECT_EQ(js(n.status)["recovery"]["ranks"], json::array({2, 3}));
  EXPECT_EQ(js(n.status)["recovery"]["startTime"], log::rfc3339(kNow));
  EXPECT_EQ(n.podsToDelete, std::vector<std::string>{"j-worker-3"});
  EXPECT_TRUE(hasEvent(n, "Warning", "RecoveringReplica"));
  // Next pass: rank 2 is gone and is created joining; rank 3 once its failed pod is gone.
  PlanInput later = input({{"shardsPerReplica", 2}}, js(n.status));
  later.pods = next.pods;
  later.pods[2].deleting = true;
  Plan l = planReconcile(later);
  EXPECT_EQ(l.ranksToCreate, std::vector<int>{2});
  EXPECT_EQ(l.joiningRanks, std::vector<int>{2});
  EXPECT_EQ(js(l.status)["replicaRecoveries"], 1);
}

TEST(Recovery, Rank0IsReplacedInPlaceToo) {
  // Rank 0 hosted the rendezvous store; its replacement hosts a fresh one at the same
  // address and the survivors reconnect (runtime/src/dist/rendezvous.h).
  PlanInput in = input({}, kRunning);
  in.pods = {pod(0, "Failed", 0, 137), pod(1, "Running")};
  Plan p = planReconcile(in);
  EXPECT_EQ(p.podsToDelete, std::vector<std::string>{"j-worker-0"});
  EXPECT_EQ(p.recoveredRanks, std::vector<int>{0});
  EXPECT_EQ(js(p.status).value("restarts", 0), 0);
  EXPECT_EQ(js(p.status).value("replicaRecoveries", 0), 1);
}

TEST(Recovery, Exit75NeedsAGangRestart) {
  PlanInput in = input({}, kRunning);
  in.pods = {pod(0, "Running"), pod(1, "Failed", 0, 75)};
  expectGangRestart(planReconcile(in));
}

TEST(Recovery, SigtermedWorkerNeedsAGangRestart) {
  // A SIGTERM makes every rank checkpoint and stop together: restart from that checkpoint.
  PlanInput in = input({}, kRunning);
  in.pods = {pod(0, "Running"), pod(1, "Failed", 0, 143)};
  expectGangRestart(planReconcile(in));
}

TEST(Recovery, GangRestartPolicy) {
  PlanInput in = input({{"runPolicy", {{"replicaRecovery", "GangRestart"}}}}, kRunning);
  in.pods = {pod(0, "Running"), pod(1, "Failed", 0, 137)};
  Plan p = planReconcile(in);
  expectGangRestart(p);
  EXPECT_NE(js(p.status)["message"].get<std::string>().find("runPolicy.replicaRecovery is GangRestart"), std::string::npos);
}

TEST(Recovery, DdpNeedsAGangRestart) {
  PlanInput in = input({{"algorithm", {{"mode", "ddp"}}}}, kRunning);
  in.pods = {pod(0, "Running"), pod(1, "Failed", 0, 137)};
  expectGangRestart(planReconcile(in));
}

TEST(Recovery, GangThatNeverRanNeedsAGangRestart) {
  PlanInput in = input({}, {{"phase", "Created"}});
  in.pods = {pod(0, "Pending"), pod(1, "Failed", 0, 1)};
  expectGangRestart(planReconcile(in));
}

TEST(Recovery, FailureDuringRecoveryRestartsTheGang) {
  PlanInput in = input({}, kRunning);
  in.pods = {pod(0, "Running"), pod(1, "Failed", 0, 137)};
  const json recovering = js(planReconcile(in).status);

  // The replacement itself fails.
  PlanInput joinFailed = input({}, recovering);
  joinFailed.pods = {pod(0, "Running"), pod(1, "Failed", 0, 1)};
  joinFailed.pods[1].uid = "uid-1-0-replacement";
  Plan j = planReconcile(joinFailed);
  EXPECT_TRUE(j.gangRestarted);
  EXPECT_EQ(js(j.status)["restarts"], 1);
  EXPECT_EQ(js(j.status)["replicaRecoveries"], 1);
  EXPECT_FALSE(js(j.status).contains("recovery"));
  EXPECT_EQ(condStatus(js(j.status), "Recovering"), "False");
  EXPECT_EQ(condReason(js(j.status), "Recovering"), "GangRestarted");
  EXPECT_NE(js(j.status)["message"].get<std::string>().find("replacement pod j-worker-1"), std::string::npos);
  // A fresh gang never joins.
  Plan fresh = planReconcile(input({}, js(j.status)));
  EXPECT_EQ(fresh.ranksToCreate, (std::vector<int>{0, 1}));
  EXPECT_TRUE(fresh.joiningRanks.empty());

  // A survivor gives up waiting (exit 75), e.g. the failure hit the synchronous warm-up.
  PlanInput gaveUp = input({{"shardsPerReplica", 2}}, kRunning);
  gaveUp.pods = {pod(0, "Running"), pod(1, "Running"), pod(2, "Failed", 0, 137), pod(3, "Running")};
  PlanInput next = input({{"shardsPerReplica", 2}}, js(planReconcile(gaveUp).status));
  next.pods = {pod(0, "Running"), pod(1, "Running"), pod(2, "Failed", 0, 137), pod(3, "Failed", 0, 75)};
  next.pods[2].deleting = true;
  Plan g = planReconcile(next);
  EXPECT_TRUE(g.gangRestarted);
  EXPECT_FALSE(js(g.status).contains("recovery"));
  EXPECT_EQ(g.podsToDelete.size(), 3u);  // every pod not already being deleted
}

TEST(Recovery, RecoveriesAndRestartsShareTheBackoffLimit) {
  const json limit2 = {{"runPolicy", {{"backoffLimit", 2}}}};
  json used = kRunning;
  used["restarts"] = 1;
  used["restartGeneration"] = 1;
  used["replicaRecoveries"] = 1;
  PlanInput spent = input(limit2, used);
  spent.pods = {pod(0, "Running", 1), pod(1, "Failed", 1, 137)};
  Plan p = planReconcile(spent);
  EXPECT_EQ(js(p.status)["phase"], "Failed");
  EXPECT_EQ(condReason(js(p.status), "Failed"), "BackoffLimitExceeded");
  const std::string msg = js(p.status)["message"];
  EXPECT_NE(msg.find("1 gang restarts, 1 in-place recoveries"), std::string::npos) << msg;

  // One left: an in-place recovery may use it...
  json oneLeft = kRunning;
  oneLeft["replicaRecoveries"] = 1;
  PlanInput ok = input(limit2, oneLeft);
  ok.pods = {pod(0, "Running"), pod(1, "Failed", 0, 137)};
  Plan o = planReconcile(ok);
  EXPECT_EQ(js(o.status)["replicaRecoveries"], 2);
  EXPECT_FALSE(o.gangRestarted);
  // ... and recoveries count against gang restarts too.
  oneLeft["replicaRecoveries"] = 2;
  PlanInput none = input(limit2, oneLeft);
  none.pods = {pod(0, "Failed", 0, 137), pod(1, "Running")};
  EXPECT_EQ(condReason(js(planReconcile(none).status), "Failed"), "BackoffLimitExceeded");
}
