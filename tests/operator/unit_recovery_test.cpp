// The planner's in-place replica recovery (controller/recovery.h): which failures are
// replaced in place and which restart the gang, the recovery record, EDIT_JOIN ranks,
// events and conditions, the shared backoff budget, hangs during a recovery.
#include <gtest/gtest.h>

#include "controller/plan.h"
#include "plan_fixtures.h"
#include "util/log.h"

using namespace edit::op;
using namespace edit::op::controller;
using namespace edit::op::controller::plantest;
using nlohmann::json;

namespace {

const json kRunning = {{"phase", "Running"}, {"restarts", 0}, {"restartGeneration", 0}, {"startTime", "2027-01-15T08:00:00Z"}};

bool hasEvent(const Plan& p, const std::string& type, const std::string& reason) {
  for (const auto& e : p.events)
    if (e.type == type && e.reason == reason) return true;
  return false;
}

// A failure that must restart the whole gang: generation bumped, every pod deleted, no record.
void expectGangRestart(const Plan& p) {
  EXPECT_TRUE(p.gangRestarted);
  EXPECT_EQ(p.status["restarts"], 1);
  EXPECT_EQ(p.status["restartGeneration"], 1);
  EXPECT_EQ(p.status.value("replicaRecoveries", 0), 0);
  EXPECT_FALSE(p.status.contains("recovery"));
  EXPECT_TRUE(p.recoveredRanks.empty());
}

}  // namespace

TEST(Recovery, KilledNonZeroRankIsReplacedInPlace) {
  PlanInput in = input({}, kRunning);
  in.pods = {pod(0, "Running"), pod(1, "Failed", 0, 137)};
  in.pods[1].reason = "Error";
  Plan p = planReconcile(in);
  EXPECT_FALSE(p.gangRestarted);
  EXPECT_EQ(p.podsToDelete, std::vector<std::string>{"j-worker-1"});  // only the failed pod
  EXPECT_FALSE(p.deleteImmediately);
  EXPECT_EQ(p.recoveredRanks, std::vector<int>{1});
  EXPECT_EQ(p.status["phase"], "Running");  // the survivors keep running
  EXPECT_EQ(p.status["restarts"], 0);
  EXPECT_EQ(p.status["restartGeneration"], 0);
  EXPECT_EQ(p.status["replicaRecoveries"], 1);
  EXPECT_EQ(p.status["recovery"]["ranks"], json::array({1}));
  EXPECT_EQ(p.status["recovery"]["startTime"], log::rfc3339(kNow));
  EXPECT_EQ(p.status["recovery"]["failedPodUIDs"], json::array({"uid-1-0"}));
  EXPECT_EQ(condStatus(p.status, "Recovering"), "True");
  EXPECT_EQ(condReason(p.status, "Recovering"), "ReplicaFailed");
  const std::string msg = findCondition(p.status, "Recovering")->value("message", "");
  EXPECT_NE(msg.find("j-worker-1"), std::string::npos) << msg;
  EXPECT_NE(msg.find("exit code 137"), std::string::npos) << msg;
  EXPECT_TRUE(hasEvent(p, "Warning", "RecoveringReplica"));
  EXPECT_FALSE(hasEvent(p, "Warning", "Restarting"));

  // Level-triggered: the same failed pod, now being deleted, is neither counted again nor
  // replaced before it is gone.
  PlanInput again = input({}, p.status);
  again.pods = in.pods;
  again.pods[1].deleting = true;
  Plan a = planReconcile(again);
  EXPECT_EQ(a.status, p.status);
  EXPECT_TRUE(a.events.empty());
  EXPECT_TRUE(a.podsToDelete.empty());
  EXPECT_TRUE(a.ranksToCreate.empty());
  // A stale view without the deletion repeats the delete, still without counting.
  PlanInput stale = input({}, p.status);
  stale.pods = in.pods;
  Plan st = planReconcile(stale);
  EXPECT_EQ(st.podsToDelete, std::vector<std::string>{"j-worker-1"});
  EXPECT_EQ(st.status["replicaRecoveries"], 1);
  EXPECT_TRUE(st.events.empty());

  // Once it is gone only rank 1 is created, in the same generation, and it joins.
  PlanInput gone = input({}, p.status);
  gone.pods = {pod(0, "Running")};
  Plan g = planReconcile(gone);
  EXPECT_EQ(g.ranksToCreate, std::vector<int>{1});
  EXPECT_EQ(g.joiningRanks, std::vector<int>{1});
  EXPECT_FALSE(g.gangCreated);
  EXPECT_EQ(g.status["restartGeneration"], 0);

  // The replacement (a new pod UID) pending: still recovering.
  PlanInput pending = input({}, g.status);
  pending.pods = {pod(0, "Running"), pod(1, "Pending")};
  pending.pods[1].uid = "uid-1-0-replacement";
  Plan w = planReconcile(pending);
  EXPECT_TRUE(w.status.contains("recovery"));
  EXPECT_TRUE(w.ranksToCreate.empty());

  // All running again (no telemetry: Running is the only sign): the record goes,
  // Recovering turns False, the time it took is told.
  PlanInput up = input({}, w.status);
  up.now = kNow + 12;
  up.pods = {pod(0, "Running"), pod(1, "Running")};
  up.pods[1].uid = "uid-1-0-replacement";
  Plan r = planReconcile(up);
  EXPECT_FALSE(r.status.contains("recovery"));
  EXPECT_EQ(condStatus(r.status, "Recovering"), "False");
  EXPECT_EQ(condReason(r.status, "Recovering"), "Recovered");
  EXPECT_EQ(r.status["replicaRecoveries"], 1);
  EXPECT_EQ(r.status["restarts"], 0);
  ASSERT_TRUE(hasEvent(r, "Normal", "ReplicaRecovered"));
  for (const auto& e : r.events)
    if (e.reason == "ReplicaRecovered") EXPECT_NE(e.message.find("12 s after the failure"), std::string::npos) << e.message;
  EXPECT_EQ(r.recoverySeconds, 12);
  // ... and a further pass is quiet.
  PlanInput after = input({}, r.status);
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
  EXPECT_TRUE(w.status.contains("recovery"));
  EXPECT_EQ(condStatus(w.status, "Recovering"), "True");
  EXPECT_NE(w.status.value("message", "").find("waiting for their first training step"), std::string::npos)
      << w.status.dump();
  EXPECT_FALSE(w.recoverySeconds);
  EXPECT_FALSE(hasEvent(w, "Normal", "ReplicaRecovered"));

  // The replacement reports: recovered, with the step and the time from the failure.
  PlanInput joined = input({}, w.status);
  joined.now = kNow + 21;
  joined.pods = in.pods;
  joined.telemetry = in.telemetry;
  joined.telemetry.ranks[1] = {"uid-1-new", 41};
  Plan r = planReconcile(joined);
  EXPECT_FALSE(r.status.contains("recovery"));
  EXPECT_EQ(condReason(r.status, "Recovering"), "Recovered");
  EXPECT_EQ(r.recoverySeconds, 21);
  ASSERT_TRUE(hasEvent(r, "Normal", "ReplicaRecovered"));
  for (const auto& e : r.events)
    if (e.reason == "ReplicaRecovered") {
      EXPECT_NE(e.message.find("step 41 reported"), std::string::npos) << e.message;
      EXPECT_NE(e.message.find("21 s after the failure"), std::string::npos) << e.message;
    }

  // Workers that do not send their pod UID: Running is all there is to go on.
  PlanInput old = input({}, w.status);
  old.pods = in.pods;
  old.telemetry = in.telemetry;
  old.telemetry.ranks[1] = {"", 44};
  EXPECT_EQ(condReason(planReconcile(old).status, "Recovering"), "Recovered");
  // No report of rank 1 at all yet: still waiting.
  PlanInput none = input({}, w.status);
  none.pods = in.pods;
  none.telemetry = in.telemetry;
  none.telemetry.ranks.erase(1);
  EXPECT_TRUE(planReconcile(none).status.contains("recovery"));
}

TEST(Recovery, FailureWithoutExitCodeIsReplacedInPlace) {
  PlanInput in = input({}, kRunning);
  in.pods = {pod(0, "Running"), pod(1, "Failed")};  // e.g. its node was lost
  Plan p = planReconcile(in);
  EXPECT_FALSE(p.gangRestarted);
  EXPECT_EQ(p.status["replicaRecoveries"], 1);
  EXPECT_EQ(p.podsToDelete, std::vector<std::string>{"j-worker-1"});
}

TEST(Recovery, WholeReplicaIsReplacedInOneRecovery) {
  PlanInput in = input({{"shardsPerReplica", 2}}, kRunning);
  in.pods = {pod(0, "Running"), pod(1, "Running"), pod(2, "Failed", 0, 137), pod(3, "Failed", 0, 137)};
  Plan p = planReconcile(in);
  EXPECT_FALSE(p.gangRestarted);
  EXPECT_EQ(p.status["replicaRecoveries"], 1);
  EXPECT_EQ(p.status["recovery"]["ranks"], json::array({2, 3}));
  EXPECT_EQ(p.podsToDelete, (std::vector<std::string>{"j-worker-2", "j-worker-3"}));

  PlanInput gone = input({{"shardsPerReplica", 2}}, p.status);
  gone.pods = {pod(0, "Running"), pod(1, "Running")};
  Plan g = planReconcile(gone);
  EXPECT_EQ(g.ranksToCreate, (std::vector<int>{2, 3}));
  EXPECT_EQ(g.joiningRanks, (std::vector<int>{2, 3}));
}

TEST(Recovery, SecondRankFailingJoinsTheRecoveryInProgress) {
  PlanInput in = input({{"shardsPerReplica", 2}}, kRunning);
  in.pods = {pod(0, "Running"), pod(1, "Running"), pod(2, "Failed", 0, 137), pod(3, "Running")};
  Plan p = planReconcile(in);
  PlanInput next = input({{"shardsPerReplica", 2}}, p.status);
  next.now = kNow + 1;
  next.pods = {pod(0, "Running"), pod(1, "Running"), pod(3, "Failed", 0, 137)};
  Plan n = planReconcile(next);
  EXPECT_FALSE(n.gangRestarted);
  EXPECT_EQ(n.status["replicaRecoveries"], 1);  // the same recovery
  EXPECT_EQ(n.status["recovery"]["ranks"], json::array({2, 3}));
  EXPECT_EQ(n.status["recovery"]["startTime"], log::rfc3339(kNow));
  EXPECT_EQ(n.podsToDelete, std::vector<std::string>{"j-worker-3"});
  EXPECT_TRUE(hasEvent(n, "Warning", "RecoveringReplica"));
  // Next pass: rank 2 is gone and is created joining; rank 3 once its failed pod is gone.
  PlanInput later = input({{"shardsPerReplica", 2}}, n.status);
  later.pods = next.pods;
  later.pods[2].deleting = true;
  Plan l = planReconcile(later);
  EXPECT_EQ(l.ranksToCreate, std::vector<int>{2});
  EXPECT_EQ(l.joiningRanks, std::vector<int>{2});
  EXPECT_EQ(l.status["replicaRecoveries"], 1);
}

TEST(Recovery, Rank0IsReplacedInPlaceToo) {
  // Rank 0 hosted the rendezvous store; its replacement hosts a fresh one at the same
  // address and the survivors reconnect (runtime/src/dist/rendezvous.h).
  PlanInput in = input({}, kRunning);
  in.pods = {pod(0, "Failed", 0, 137), pod(1, "Running")};
  Plan p = planReconcile(in);
  EXPECT_EQ(p.podsToDelete, std::vector<std::string>{"j-worker-0"});
  EXPECT_EQ(p.recoveredRanks, std::vector<int>{0});
  EXPECT_EQ(p.status.value("restarts", 0), 0);
  EXPECT_EQ(p.status.value("replicaRecoveries", 0), 1);
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
  EXPECT_NE(p.status["message"].get<std::string>().find("runPolicy.replicaRecovery is GangRestart"), std::string::npos);
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
  const json recovering = planReconcile(in).status;

  // The replacement itself fails.
  PlanInput joinFailed = input({}, recovering);
  joinFailed.pods = {pod(0, "Running"), pod(1, "Failed", 0, 1)};
  joinFailed.pods[1].uid = "uid-1-0-replacement";
  Plan j = planReconcile(joinFailed);
  EXPECT_TRUE(j.gangRestarted);
  EXPECT_EQ(j.status["restarts"], 1);
  EXPECT_EQ(j.status["replicaRecoveries"], 1);
  EXPECT_FALSE(j.status.contains("recovery"));
  EXPECT_EQ(condStatus(j.status, "Recovering"), "False");
  EXPECT_EQ(condReason(j.status, "Recovering"), "GangRestarted");
  EXPECT_NE(j.status["message"].get<std::string>().find("replacement pod j-worker-1"), std::string::npos);
  // A fresh gang never joins.
  Plan fresh = planReconcile(input({}, j.status));
  EXPECT_EQ(fresh.ranksToCreate, (std::vector<int>{0, 1}));
  EXPECT_TRUE(fresh.joiningRanks.empty());

  // A survivor gives up waiting (exit 75), e.g. the failure hit the synchronous warm-up.
  PlanInput gaveUp = input({{"shardsPerReplica", 2}}, kRunning);
  gaveUp.pods = {pod(0, "Running"), pod(1, "Running"), pod(2, "Failed", 0, 137), pod(3, "Running")};
  PlanInput next = input({{"shardsPerReplica", 2}}, planReconcile(gaveUp).status);
  next.pods = {pod(0, "Running"), pod(1, "Running"), pod(2, "Failed", 0, 137), pod(3, "Failed", 0, 75)};
  next.pods[2].deleting = true;
  Plan g = planReconcile(next);
  EXPECT_TRUE(g.gangRestarted);
  EXPECT_FALSE(g.status.contains("recovery"));
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
  EXPECT_EQ(p.status["phase"], "Failed");
  EXPECT_EQ(condReason(p.status, "Failed"), "BackoffLimitExceeded");
  const std::string msg = p.status["message"];
  EXPECT_NE(msg.find("1 gang restarts, 1 in-place recoveries"), std::string::npos) << msg;

  // One left: an in-place recovery may use it...
  json oneLeft = kRunning;
  oneLeft["replicaRecoveries"] = 1;
  PlanInput ok = input(limit2, oneLeft);
  ok.pods = {pod(0, "Running"), pod(1, "Failed", 0, 137)};
  Plan o = planReconcile(ok);
  EXPECT_EQ(o.status["replicaRecoveries"], 2);
  EXPECT_FALSE(o.gangRestarted);
  // ... and recoveries count against gang restarts too.
  oneLeft["replicaRecoveries"] = 2;
  PlanInput none = input(limit2, oneLeft);
  none.pods = {pod(0, "Failed", 0, 137), pod(1, "Running")};
  EXPECT_EQ(condReason(planReconcile(none).status, "Failed"), "BackoffLimitExceeded");
}

TEST(Recovery, HangIsNotDeclaredWhileSurvivorsWaitForAReplacement) {
  json st = kRunning;
  st["replicaRecoveries"] = 1;
  st["recovery"] = {{"ranks", {1}}, {"startTime", log::rfc3339(kNow - 20)}, {"failedPodUIDs", {"uid-1-0"}}};
  PlanInput in = input({{"hangTimeoutSeconds", 60}}, st);
  in.pods = {pod(0, "Running"), pod(1, "Pending")};
  in.pods[1].uid = "uid-1-0-replacement";
  in.telemetry.present = true;
  in.telemetry.hung = true;
  Plan p = planReconcile(in);
  EXPECT_FALSE(p.gangRestarted);
  EXPECT_NE(condStatus(p.status, "Hung"), "True");
  EXPECT_TRUE(p.status.contains("recovery"));

  // A recovery older than hangTimeoutSeconds does not shield a hang.
  in.now = kNow + 41;
  Plan late = planReconcile(in);
  EXPECT_TRUE(late.gangRestarted);
  EXPECT_EQ(condReason(late.status, "Restarting"), "Hung");
  EXPECT_FALSE(late.status.contains("recovery"));

  // ... counted from the replacement's start when it started later: its start-up (joining,
  // copying its state) gets the whole hang timeout, however long its pod took to come.
  in.pods[1].phase = "Running";
  in.pods[1].started = log::rfc3339(kNow + 5);
  Plan starting = planReconcile(in);  // 36 s after its start
  EXPECT_FALSE(starting.gangRestarted);
  EXPECT_TRUE(starting.status.contains("recovery"));
  in.now = kNow + 66;  // 61 s
  EXPECT_TRUE(planReconcile(in).gangRestarted);
  // The failed incarnation's start does not count.
  in.pods[1].uid = "uid-1-0";
  in.now = kNow + 41;
  EXPECT_TRUE(planReconcile(in).gangRestarted);
}

// A hang where one worker fell silent (stopped, frozen) while the others kept sending
// heartbeats from their collectives: that worker is killed and replaced in place.
TEST(Recovery, HungWithASilentWorkerReplacesItInPlace) {
  PlanInput in = input({{"hangTimeoutSeconds", 10}}, kRunning);
  in.pods = {pod(0, "Running"), pod(1, "Running")};
  in.telemetry.present = true;
  in.telemetry.hung = true;
  in.telemetry.ranks[0] = {"uid-0-0", 24, 1.5};
  in.telemetry.ranks[1] = {"uid-1-0", 24, 11.0};
  Plan p = planReconcile(in);
  EXPECT_FALSE(p.gangRestarted);
  EXPECT_EQ(p.podsToDelete, std::vector<std::string>{"j-worker-1"});
  EXPECT_TRUE(p.deleteImmediately);  // a stopped process cannot act on SIGTERM
  EXPECT_EQ(p.recoveredRanks, std::vector<int>{1});
  EXPECT_EQ(p.status["restarts"], 0);
  EXPECT_EQ(p.status["replicaRecoveries"], 1);
  EXPECT_EQ(p.status["recovery"]["failedPodUIDs"], json::array({"uid-1-0"}));
  EXPECT_EQ(condStatus(p.status, "Hung"), "True");
  EXPECT_EQ(condReason(p.status, "Hung"), "WorkerUnresponsive");
  const std::string msg = findCondition(p.status, "Hung")->value("message", "");
  EXPECT_NE(msg.find("rank(s) 1 sent nothing for 11 s"), std::string::npos) << msg;
  EXPECT_EQ(condReason(p.status, "Recovering"), "WorkerUnresponsive");

  // Its replacement joins and reports: recovered, and the hang is over.
  PlanInput up = input({{"hangTimeoutSeconds", 10}}, p.status);
  up.now = kNow + 8;
  up.pods = {pod(0, "Running"), pod(1, "Running")};
  up.pods[1].uid = "uid-1-new";
  up.telemetry.present = true;
  up.telemetry.ranks[0] = {"uid-0-0", 21, 0.5};
  up.telemetry.ranks[1] = {"uid-1-new", 21, 0.5};
  Plan r = planReconcile(up);
  EXPECT_EQ(condReason(r.status, "Recovering"), "Recovered");
  EXPECT_EQ(condStatus(r.status, "Hung"), "False");
  EXPECT_EQ(condReason(r.status, "Hung"), "Recovered");
  EXPECT_FALSE(r.gangRestarted);
}

// Without a split between silent and reporting workers nothing says which one is stuck:
// the gang restarts, as it does under GangRestart.
TEST(Recovery, HungWithoutASilentMinorityRestartsTheGang) {
  auto hung = [](json spec, double silent0, double silent1) {
    spec["hangTimeoutSeconds"] = 10;
    PlanInput in = input(spec, kRunning);
    in.pods = {pod(0, "Running"), pod(1, "Running")};
    in.telemetry.present = true;
    in.telemetry.hung = true;
    in.telemetry.ranks[0] = {"uid-0-0", 24, silent0};
    in.telemetry.ranks[1] = {"uid-1-0", 24, silent1};
    return planReconcile(in);
  };
  for (const auto& [what, p] : std::vector<std::pair<std::string, Plan>>{
           {"all silent (no heartbeats)", hung({}, 12, 11)},
           {"all alive (a deadlock)", hung({}, 1, 2)},
           {"GangRestart", hung({{"runPolicy", {{"replicaRecovery", "GangRestart"}}}}, 1, 11)},
           {"ddp", hung({{"algorithm", {{"mode", "ddp"}}}}, 1, 11)}}) {
    EXPECT_TRUE(p.gangRestarted) << what;
    EXPECT_EQ(condReason(p.status, "Hung"), "NoProgress") << what;
    EXPECT_FALSE(p.status.contains("recovery")) << what;
  }
}

TEST(Recovery, SuspendDropsTheRecord) {
  json st = kRunning;
  st["recovery"] = {{"ranks", {1}}, {"startTime", log::rfc3339(kNow)}, {"failedPodUIDs", {"uid-1-0"}}};
  PlanInput in = input({{"runPolicy", {{"suspend", true}}}}, st);
  in.pods = {pod(0, "Running")};
  Plan p = planReconcile(in);
  EXPECT_FALSE(p.status.contains("recovery"));
  // Resumed: a whole new gang, nobody joins.
  Plan r = planReconcile(input({}, p.status));
  EXPECT_EQ(r.ranksToCreate, (std::vector<int>{0, 1}));
  EXPECT_TRUE(r.joiningRanks.empty());
}

// `kubectl delete pod` on one worker of a running gang (the soak's fault, bench/soak.py):
// SIGTERM reaches that worker alone, it leaves (exit 76) and its peers wait for a
// replacement. While it still runs nothing happens (were the whole gang stopping, it would
// exit 143 and the gang restart); its exit 76 is replaced in place, and once the pod is
// gone the replacement joins (EDIT_JOIN=1).
TEST(Recovery, PodDeletedBySomeoneElseIsReplacedInPlace) {
  PlanInput in = input({}, kRunning);
  in.pods = {pod(0, "Running"), pod(1, "Running")};
  in.pods[1].deleting = true;
  Plan p = planReconcile(in);
  EXPECT_FALSE(p.status.contains("recovery"));
  EXPECT_TRUE(p.podsToDelete.empty());
  EXPECT_TRUE(p.ranksToCreate.empty());

  PlanInput left = input({}, p.status);
  left.pods = {pod(0, "Running"), pod(1, "Failed", 0, 76)};
  left.pods[1].deleting = true;
  Plan l = planReconcile(left);
  EXPECT_FALSE(l.gangRestarted);
  EXPECT_TRUE(l.podsToDelete.empty());  // already going
  EXPECT_EQ(l.recoveredRanks, std::vector<int>{1});
  EXPECT_EQ(l.status["replicaRecoveries"], 1);
  EXPECT_EQ(l.status["recovery"]["failedPodUIDs"], json::array({"uid-1-0"}));
  // Gone: recreated in the same generation, joining, not counted again.
  PlanInput gone = input({}, l.status);
  gone.pods = {pod(0, "Running")};
  Plan g = planReconcile(gone);
  EXPECT_EQ(g.ranksToCreate, std::vector<int>{1});
  EXPECT_EQ(g.joiningRanks, std::vector<int>{1});
  EXPECT_EQ(g.status["restartGeneration"], 0);
  EXPECT_EQ(g.status["replicaRecoveries"], 1);
}

// The pod went while the operator was not looking (it was restarting): the rank is missing
// from a running gang. It is recreated as a replacement that joins, in one recovery.
TEST(Recovery, RankWhosePodVanishedJoinsAsAReplacement) {
  PlanInput in = input({}, kRunning);
  in.pods = {pod(0, "Running")};
  Plan p = planReconcile(in);
  EXPECT_FALSE(p.gangRestarted);
  EXPECT_EQ(p.status["replicaRecoveries"], 1);
  EXPECT_EQ(p.status["recovery"]["ranks"], json::array({1}));
  const std::string msg = findCondition(p.status, "Recovering")->value("message", "");
  EXPECT_NE(msg.find("j-worker-1 is gone"), std::string::npos) << msg;
  // The next pass (the record stored) creates it, joining.
  PlanInput next = input({}, p.status);
  next.pods = {pod(0, "Running")};
  Plan n = planReconcile(next);
  EXPECT_EQ(n.ranksToCreate, std::vector<int>{1});
  EXPECT_EQ(n.joiningRanks, std::vector<int>{1});
  EXPECT_EQ(n.status["replicaRecoveries"], 1);
  // Then, the replacement pending, nothing is counted or created again.
  PlanInput again = input({}, n.status);
  again.pods = {pod(0, "Running"), pod(1, "Pending")};
  again.pods[1].uid = "uid-1-0-replacement";
  Plan a = planReconcile(again);
  EXPECT_EQ(a.status["replicaRecoveries"], 1);
  EXPECT_TRUE(a.ranksToCreate.empty());
}

// Not a recovery: no pod left running (the gang stopped together), the job itself being
// deleted, a gang that never ran, and policies that cannot replace a rank alone.
TEST(Recovery, MissingRanksThatAreNotReplacedInPlace) {
  PlanInput stopped = input({}, kRunning);
  stopped.pods = {pod(1, "Failed", 0, 143)};
  Plan a = planReconcile(stopped);
  EXPECT_TRUE(a.gangRestarted);
  EXPECT_EQ(a.status.value("replicaRecoveries", 0), 0);

  PlanInput jobGoing = input({}, kRunning);
  jobGoing.meta.deleting = true;
  jobGoing.pods = {pod(0, "Running")};
  EXPECT_FALSE(planReconcile(jobGoing).status.contains("recovery"));

  PlanInput created = input({}, {{"phase", "Created"}});
  created.pods = {pod(0, "Running")};
  Plan c = planReconcile(created);
  EXPECT_FALSE(c.status.contains("recovery"));
  EXPECT_EQ(c.ranksToCreate, std::vector<int>{1});
  EXPECT_TRUE(c.joiningRanks.empty());

  for (json extra : {json{{"runPolicy", {{"replicaRecovery", "GangRestart"}}}}, json{{"algorithm", {{"mode", "ddp"}}}}}) {
    PlanInput in = input(extra, kRunning);
    in.pods = {pod(0, "Running")};
    Plan p = planReconcile(in);
    EXPECT_FALSE(p.status.contains("recovery")) << extra.dump();
  }
}

// An eviction (DisruptionTarget) of one pod: its worker leaves (76), the rank is replaced in
// place and not charged to backoffLimit, also when the pod is already gone.
TEST(Recovery, EvictedPodIsReplacedInPlaceForFree) {
  const json spec = {{"runPolicy", {{"backoffLimit", 0}}}};
  PlanInput seen = input(spec, kRunning);
  seen.pods = {pod(0, "Running"), pod(1, "Running")};
  seen.pods[1].deleting = true;
  seen.pods[1].disruption = "EvictionByEvictionAPI";
  Plan p1 = planReconcile(seen);
  EXPECT_EQ(condStatus(p1.status, "Disrupted"), "True");
  EXPECT_FALSE(p1.status.contains("recovery"));

  PlanInput gone = input(spec, p1.status);
  gone.pods = {pod(0, "Running")};
  Plan p2 = planReconcile(gone);
  EXPECT_FALSE(p2.gangRestarted);
  EXPECT_EQ(p2.status["phase"], "Running");
  EXPECT_EQ(p2.status["replicaRecoveries"], 1);
  EXPECT_EQ(p2.status["disruptions"], 1);
  EXPECT_EQ(p2.status["recovery"]["ranks"], json::array({1}));
  EXPECT_EQ(condStatus(p2.status, "Disrupted"), "False");
}

// The same eviction when the pod was gone before any reconcile saw its DisruptionTarget
// condition (or `kubectl delete pod`, which has none): a pod someone else deleted is a
// disruption in itself, so backoffLimit 0 still allows the in-place replacement.
TEST(Recovery, PodGoneBeforeItsDisruptionWasSeenIsStillFree) {
  const json spec = {{"runPolicy", {{"backoffLimit", 0}}}};
  PlanInput gone = input(spec, kRunning);
  gone.pods = {pod(0, "Running")};
  Plan p = planReconcile(gone);
  EXPECT_FALSE(p.gangRestarted);
  EXPECT_EQ(p.status["phase"], "Running");
  EXPECT_EQ(p.status["replicaRecoveries"], 1);
  EXPECT_EQ(p.status["disruptions"], 1);
  EXPECT_EQ(p.status["recovery"]["ranks"], json::array({1}));
  EXPECT_EQ(condStatus(p.status, "Disrupted"), "False");
  bool disruptedEvent = false;
  for (const auto& e : p.events) disruptedEvent |= e.reason == "Disrupted";
  EXPECT_TRUE(disruptedEvent);
  // A crash of its own afterwards is charged: the budget of 0 is spent.
  PlanInput crash = input(spec, p.status);
  crash.pods = {pod(0, "Failed", 0, 137), pod(1, "Running")};
  crash.pods[1].uid = "uid-1-0-replacement";
  crash.status.erase("recovery");
  EXPECT_EQ(planReconcile(crash).status["phase"], "Failed");
}

// `kubectl delete pod` just as the worker finished: its pod went before its exit 0 was
// seen, so the rank was replaced in place; then every other rank succeeds. The gang
// finished without the replacement (the end of training is collective): the job
// succeeds and the waiting replacement is deleted, instead of waiting for it to time out.
TEST(Recovery, GangThatFinishedWithoutTheReplacementSucceeds) {
  PlanInput in = input({}, kRunning);
  in.pods = {pod(0, "Running")};
  Plan p = planReconcile(in);
  ASSERT_EQ(p.status["recovery"]["ranks"], json::array({1}));
  PlanInput fin = input({}, p.status);
  fin.pods = {pod(0, "Succeeded"), pod(1, "Running")};
  fin.pods[1].uid = "uid-1-0-replacement";
  Plan f = planReconcile(fin);
  EXPECT_EQ(f.status["phase"], "Succeeded");
  EXPECT_NE(f.status["message"].get<std::string>().find("rank(s) 1"), std::string::npos) << f.status["message"];
  EXPECT_EQ(f.podsToDelete, std::vector<std::string>{"j-worker-1"});
  EXPECT_FALSE(f.status.contains("recovery"));
  // Without a recovery record a missing success is just not finished yet.
  PlanInput plain = input({}, kRunning);
  plain.pods = {pod(0, "Succeeded"), pod(1, "Running")};
  EXPECT_EQ(planReconcile(plain).status["phase"], "Running");
}

TEST(Recovery, ObservedPodKnowsWhenItsContainerStarted) {
  json running = {{"metadata", {{"name", "j-worker-1"}, {"uid", "u1"}, {"labels", {{"edit.io/rank", "1"}}}}},
                  {"status", {{"phase", "Running"},
                              {"containerStatuses", {{{"name", "worker"},
                                                      {"state", {{"running", {{"startedAt", "2027-01-15T08:00:05Z"}}}}}}}}}}};
  EXPECT_EQ(observePod(running).started, "2027-01-15T08:00:05Z");
  json waiting = running;
  waiting["status"]["containerStatuses"][0]["state"] = {{"waiting", {{"reason", "ContainerCreating"}}}};
  EXPECT_EQ(observePod(waiting).started, "");
}
