// The planner's in-place replica recovery around hangs and pod disruptions: hang
// detection while survivors wait, a silent worker replaced in place, suspend, pods
// deleted or evicted by someone else, a gang that finishes without its replacement.
#include <gtest/gtest.h>

#include "controller/plan.h"
#include "plan_fixtures.h"
#include "util/log.h"

using namespace edit::op;
using namespace edit::op::controller;
using namespace edit::op::controller::plantest;
using nlohmann::json;

TEST(Recovery, HangIsNotDeclaredWhileSurvivorsWaitForAReplacement) {
  json st = kRunning;
  st["replicaRecoveries"] = 1;
  st["recovery"] = {{"ranks", {1}}, {"startTime", log::rfc3339(kNow - 20)}, {"failedPodUIDs", {"uid-1-0"}}};
  PlanInput in = input({{"hangTimeoutSeconds", 60}}, st);
  in.pods = {pod(0, "Running"), pod(1, "Pending")};
  in.pods[1].uid = "uid-1-0-replacement";
  in.telemetry.present = true;
  in.telemetry.hung = true;
  in.telemetry.hungPastRecovery = true;
  Plan p = planReconcile(in);
  EXPECT_FALSE(p.gangRestarted);
  EXPECT_NE(condStatus(js(p.status), "Hung"), "True");
  EXPECT_TRUE(js(p.status).contains("recovery"));

  // A recovery older than hangTimeoutSeconds does not shield a hang.
  in.now = kNow + 41;
  Plan late = planReconcile(in);
  EXPECT_TRUE(late.gangRestarted);
  EXPECT_EQ(condReason(js(late.status), "Restarting"), "Hung");
  EXPECT_FALSE(js(late.status).contains("recovery"));

  // ... counted from the replacement's start when it started later: its start-up (joining,
  // copying its state) gets the whole hang timeout, however long its pod took to come.
  in.pods[1].phase = "Running";
  in.pods[1].started = log::rfc3339(kNow + 5);
  Plan starting = planReconcile(in);  // 36 s after its start
  EXPECT_FALSE(starting.gangRestarted);
  EXPECT_TRUE(js(starting.status).contains("recovery"));
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
  EXPECT_EQ(js(p.status)["restarts"], 0);
  EXPECT_EQ(js(p.status)["replicaRecoveries"], 1);
  EXPECT_EQ(js(p.status)["recovery"]["failedPodUIDs"], json::array({"uid-1-0"}));
  EXPECT_EQ(condStatus(js(p.status), "Hung"), "True");
  EXPECT_EQ(condReason(js(p.status), "Hung"), "WorkerUnresponsive");
  const std::string msg = findCondition(js(p.status), "Hung")->value("message", "");
  EXPECT_NE(msg.find("rank(s) 1 sent nothing for 11 s"), std::string::npos) << msg;
  EXPECT_EQ(condReason(js(p.status), "Recovering"), "WorkerUnresponsive");

  // Its replacement joins and reports: recovered, and the hang is over.
  PlanInput up = input({{"hangTimeoutSeconds", 10}}, js(p.status));
  up.now = kNow + 8;
  up.pods = {pod(0, "Running"), pod(1, "Running")};
  up.pods[1].uid = "uid-1-new";
  up.telemetry.present = true;
  up.telemetry.ranks[0] = {"uid-0-0", 21, 0.5};
  up.telemetry.ranks[1] = {"uid-1-new", 21, 0.5};
  Plan r = planReconcile(up);
  EXPECT_EQ(condReason(js(r.status), "Recovering"), "Recovered");
  EXPECT_EQ(condStatus(js(r.status), "Hung"), "False");
  EXPECT_EQ(condReason(js(r.status), "Hung"), "Recovered");
  EXPECT_FALSE(r.gangRestarted);
}

// Without a split between silent and reporting workers nothing says which one is stuck:
// the gang restarts, as it does under GangRestart.
TEST(Recovery, HungWithoutASilentMinorityRestartsTheGang) {
  // past: no progress for longer than the workers' own recovery (runtimeRecoverySeconds).
  auto hung = [](json spec, double silent0, double silent1, bool past = false) {
    spec["hangTimeoutSeconds"] = 10;
    PlanInput in = input(spec, kRunning);
    in.pods = {pod(0, "Running"), pod(1, "Running")};
    in.telemetry.present = true;
    in.telemetry.hung = true;
    in.telemetry.hungPastRecovery = past;
    in.telemetry.quietSeconds = std::min(silent0, silent1);
    in.telemetry.ranks[0] = {"uid-0-0", 24, silent0};
    in.telemetry.ranks[1] = {"uid-1-0", 24, silent1};
    return planReconcile(in);
  };
  // A frozen worker the policy cannot replace alone: the gang restarts at once.
  for (const auto& [what, p] : std::vector<std::pair<std::string, Plan>>{
           {"all alive past the workers' recovery (a deadlock)", hung({}, 1, 2, true)},
           {"GangRestart", hung({{"runPolicy", {{"replicaRecovery", "GangRestart"}}}}, 1, 11)},
           {"ddp", hung({{"algorithm", {{"mode", "ddp"}}}}, 1, 11)}}) {
    EXPECT_TRUE(p.gangRestarted) << what;
    EXPECT_EQ(condReason(js(p.status), "Hung"), "NoProgress") << what;
    EXPECT_FALSE(js(p.status).contains("recovery")) << what;
  }
  // Every worker alive, but the workers' own recovery (a collective's timeout, then the
  // rendezvous) may still resolve it: Hung says so, nothing restarts yet.
  const Plan waiting = hung({}, 1, 2);
  EXPECT_FALSE(waiting.gangRestarted);
  EXPECT_TRUE(waiting.podsToDelete.empty());
  EXPECT_EQ(condStatus(js(waiting.status), "Hung"), "True");
  EXPECT_NE(findCondition(js(waiting.status), "Hung")->value("message", "").find("restarts only after 960 s"),
            std::string::npos)
      << js(waiting.status).dump();
  // No report from anyone: telemetry is lost, not the job.
  const Plan quiet = hung({}, 12, 11, true);
  EXPECT_FALSE(quiet.gangRestarted);
  EXPECT_EQ(condStatus(js(quiet.status), "TelemetryLost"), "True");
}

TEST(Recovery, SuspendDropsTheRecord) {
  json st = kRunning;
  st["recovery"] = {{"ranks", {1}}, {"startTime", log::rfc3339(kNow)}, {"failedPodUIDs", {"uid-1-0"}}};
  PlanInput in = input({{"runPolicy", {{"suspend", true}}}}, st);
  in.pods = {pod(0, "Running")};
  Plan p = planReconcile(in);
  EXPECT_FALSE(js(p.status).contains("recovery"));
  // Resumed: a whole new gang, nobody joins.
  Plan r = planReconcile(input({}, js(p.status)));
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
  EXPECT_FALSE(js(p.status).contains("recovery"));
  EXPECT_TRUE(p.podsToDelete.empty());
  EXPECT_TRUE(p.ranksToCreate.empty());

  PlanInput left = input({}, js(p.status));
  left.pods = {pod(0, "Running"), pod(1, "Failed", 0, 76)};
  left.pods[1].deleting = true;
  Plan l = planReconcile(left);
  EXPECT_FALSE(l.gangRestarted);
  EXPECT_TRUE(l.podsToDelete.empty());  // already going
  EXPECT_EQ(l.recoveredRanks, std::vector<int>{1});
  EXPECT_EQ(js(l.status)["replicaRecoveries"], 1);
  EXPECT_EQ(js(l.status)["recovery"]["failedPodUIDs"], json::array({"uid-1-0"}));
  // Gone: recreated in the same generation, joining, not counted again.
  PlanInput gone = input({}, js(l.status));
  gone.pods = {pod(0, "Running")};
  Plan g = planReconcile(gone);
  EXPECT_EQ(g.ranksToCreate, std::vector<int>{1});
  EXPECT_EQ(g.joiningRanks, std::vector<int>{1});
  EXPECT_EQ(js(g.status)["restartGeneration"], 0);
  EXPECT_EQ(js(g.status)["replicaRecoveries"], 1);
}

// The pod went while the operator was not looking (it was restarting): the rank is missing
// from a running gang. It is recreated as a replacement that joins, in one recovery.
TEST(Recovery, RankWhosePodVanishedJoinsAsAReplacement) {
  PlanInput in = input({}, kRunning);
  in.pods = {pod(0, "Running")};
  Plan p = planReconcile(in);
  EXPECT_FALSE(p.gangRestarted);
  EXPECT_EQ(js(p.status)["replicaRecoveries"], 1);
  EXPECT_EQ(js(p.status)["recovery"]["ranks"], json::array({1}));
  const std::string msg = findCondition(js(p.status), "Recovering")->value("message", "");
  EXPECT_NE(msg.find("j-worker-1 is gone"), std::string::npos) << msg;
  // The next pass (the record stored) creates it, joining.
  PlanInput next = input({}, js(p.status));
  next.pods = {pod(0, "Running")};
  Plan n = planReconcile(next);
  EXPECT_EQ(n.ranksToCreate, std::vector<int>{1});
  EXPECT_EQ(n.joiningRanks, std::vector<int>{1});
  EXPECT_EQ(js(n.status)["replicaRecoveries"], 1);
  // Then, the replacement pending, nothing is counted or created again.
  PlanInput again = input({}, js(n.status));
  again.pods = {pod(0, "Running"), pod(1, "Pending")};
  again.pods[1].uid = "uid-1-0-replacement";
  Plan a = planReconcile(again);
  EXPECT_EQ(js(a.status)["replicaRecoveries"], 1);
  EXPECT_TRUE(a.ranksToCreate.empty());
}

// Not a recovery: no pod left running (the gang stopped together), the job itself being
// deleted, a gang that never ran, and policies that cannot replace a rank alone.
TEST(Recovery, MissingRanksThatAreNotReplacedInPlace) {
  PlanInput stopped = input({}, kRunning);
  stopped.pods = {pod(1, "Failed", 0, 143)};
  Plan a = planReconcile(stopped);
  EXPECT_TRUE(a.gangRestarted);
  EXPECT_EQ(js(a.status).value("replicaRecoveries", 0), 0);

  PlanInput jobGoing = input({}, kRunning);
  jobGoing.meta.deleting = true;
  jobGoing.pods = {pod(0, "Running")};
  EXPECT_FALSE(js(planReconcile(jobGoing).status).contains("recovery"));

  PlanInput created = input({}, {{"phase", "Created"}});
  created.pods = {pod(0, "Running")};
  Plan c = planReconcile(created);
  EXPECT_FALSE(js(c.status).contains("recovery"));
  EXPECT_EQ(c.ranksToCreate, std::vector<int>{1});
  EXPECT_TRUE(c.joiningRanks.empty());

  for (json extra : {json{{"runPolicy", {{"replicaRecovery", "GangRestart"}}}}, json{{"algorithm", {{"mode", "ddp"}}}}}) {
    PlanInput in = input(extra, kRunning);
    in.pods = {pod(0, "Running")};
    Plan p = planReconcile(in);
    EXPECT_FALSE(js(p.status).contains("recovery")) << extra.dump();
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
  EXPECT_EQ(condStatus(js(p1.status), "Disrupted"), "True");
  EXPECT_FALSE(js(p1.status).contains("recovery"));

  PlanInput gone = input(spec, js(p1.status));
  gone.pods = {pod(0, "Running")};
  Plan p2 = planReconcile(gone);
  EXPECT_FALSE(p2.gangRestarted);
  EXPECT_EQ(js(p2.status)["phase"], "Running");
  EXPECT_EQ(js(p2.status)["replicaRecoveries"], 1);
  EXPECT_EQ(js(p2.status)["disruptions"], 1);
  EXPECT_EQ(js(p2.status)["recovery"]["ranks"], json::array({1}));
  EXPECT_EQ(condStatus(js(p2.status), "Disrupted"), "False");
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
  EXPECT_EQ(js(p.status)["phase"], "Running");
  EXPECT_EQ(js(p.status)["replicaRecoveries"], 1);
  EXPECT_EQ(js(p.status)["disruptions"], 1);
  EXPECT_EQ(js(p.status)["recovery"]["ranks"], json::array({1}));
  EXPECT_EQ(condStatus(js(p.status), "Disrupted"), "False");
  bool disruptedEvent = false;
  for (const auto& e : p.events) disruptedEvent |= e.reason == "Disrupted";
  EXPECT_TRUE(disruptedEvent);
  // A crash of its own afterwards is charged: the budget of 0 is spent.
  PlanInput crash = input(spec, js(p.status));
  crash.pods = {pod(0, "Failed", 0, 137), pod(1, "Running")};
  crash.pods[1].uid = "uid-1-0-replacement";
  crash.status.erase("recovery");
  EXPECT_EQ(js(planReconcile(crash).status)["phase"], "Failed");
}

// `kubectl delete pod` just as the worker finished: its pod went before its exit 0 was
// seen, so the rank was replaced in place; then every other rank succeeds. The gang
// finished without the replacement (the end of training is collective): the job
// succeeds and the waiting replacement is deleted, instead of waiting for it to time out.
TEST(Recovery, GangThatFinishedWithoutTheReplacementSucceeds) {
  PlanInput in = input({}, kRunning);
  in.pods = {pod(0, "Running")};
  Plan p = planReconcile(in);
  ASSERT_EQ(js(p.status)["recovery"]["ranks"], json::array({1}));
  PlanInput fin = input({}, js(p.status));
  fin.pods = {pod(0, "Succeeded"), pod(1, "Running")};
  fin.pods[1].uid = "uid-1-0-replacement";
  Plan f = planReconcile(fin);
  EXPECT_EQ(js(f.status)["phase"], "Succeeded");
  EXPECT_NE(js(f.status)["message"].get<std::string>().find("rank(s) 1"), std::string::npos) << js(f.status)["message"];
  EXPECT_EQ(f.podsToDelete, std::vector<std::string>{"j-worker-1"});
  EXPECT_FALSE(js(f.status).contains("recovery"));
  // Without a recovery record a missing success is just not finished yet.
  PlanInput plain = input({}, kRunning);
  plain.pods = {pod(0, "Succeeded"), pod(1, "Running")};
  EXPECT_EQ(js(planReconcile(plain).status)["phase"], "Running");
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
