// The controller's pure decision function: phases, conditions, counts, the exit-code
// failure policy, backoff, deadline, TTL, suspend and straggler conditions. In-place
// replica recovery: unit_recovery_test.cpp.
#include <gtest/gtest.h>

#include "controller/plan.h"
#include "exit_codes.h"
#include "plan_fixtures.h"
#include "util/log.h"
using namespace edit::op;
using namespace edit::op::controller;
using nlohmann::json;
using namespace edit::op::controller::plantest;


TEST(Plan, NewJobCreatesTheWholeGang) {
  Plan p = planReconcile(input());
  EXPECT_EQ(p.ranksToCreate, (std::vector<int>{0, 1}));
  EXPECT_TRUE(p.ensureChildren);
  EXPECT_TRUE(p.gangCreated);
  EXPECT_EQ(js(p.status)["phase"], "Created");
  EXPECT_EQ(condStatus(js(p.status), "Created"), "True");
  EXPECT_EQ(js(p.status)["startTime"], log::rfc3339(kNow));
  EXPECT_EQ(js(p.status)["observedGeneration"], 1);
  EXPECT_EQ(js(p.status)["workers"]["total"], 2);
}

TEST(Plan, IsIdempotent) {
  Plan first = planReconcile(input());
  PlanInput again = input({}, js(first.status));
  again.pods = {pod(0, "Pending"), pod(1, "Pending")};
  Plan second = planReconcile(again);
  EXPECT_TRUE(second.ranksToCreate.empty());
  EXPECT_TRUE(second.events.empty());
  Plan third = planReconcile(again);
  EXPECT_EQ(js(second.status), js(third.status));
}

TEST(Plan, AllRunningThenSucceeded) {
  PlanInput in = input({}, {{"phase", "Created"}, {"startTime", log::rfc3339(kNow - 5)}});
  in.pods = {pod(0, "Running"), pod(1, "Running")};
  Plan p = planReconcile(in);
  EXPECT_EQ(js(p.status)["phase"], "Running");
  EXPECT_EQ(condStatus(js(p.status), "Running"), "True");
  EXPECT_EQ(js(p.status)["workers"]["running"], 2);
  ASSERT_FALSE(p.events.empty());
  EXPECT_EQ(p.events.back().reason, "Running");

  PlanInput done = input({}, js(p.status));
  done.pods = {pod(0, "Succeeded", 0, 0), pod(1, "Succeeded", 0, 0)};
  Plan s = planReconcile(done);
  EXPECT_EQ(js(s.status)["phase"], "Succeeded");
  EXPECT_EQ(condStatus(js(s.status), "Succeeded"), "True");
  EXPECT_EQ(condStatus(js(s.status), "Running"), "False");
  EXPECT_EQ(js(s.status)["completionTime"], log::rfc3339(kNow));
  EXPECT_EQ(js(s.status)["workers"]["succeeded"], 2);
}

TEST(Plan, OneFinishedWhileOthersRunStaysRunning) {
  PlanInput in = input({}, {{"phase", "Running"}});
  in.pods = {pod(0, "Succeeded", 0, 0), pod(1, "Running")};
  Plan p = planReconcile(in);
  EXPECT_EQ(js(p.status)["phase"], "Running");
  EXPECT_TRUE(p.ranksToCreate.empty());
}

TEST(Plan, RetryableFailureRestartsTheGang) {
  const json gang = {{"runPolicy", {{"replicaRecovery", "GangRestart"}}}};
  PlanInput in = input(gang, {{"phase", "Running"}, {"restarts", 0}, {"restartGeneration", 0}});
  in.pods = {pod(0, "Running"), pod(1, "Failed", 0, 1)};
  Plan p = planReconcile(in);
  EXPECT_TRUE(p.gangRestarted);
  EXPECT_EQ(js(p.status)["phase"], "Restarting");
  EXPECT_EQ(js(p.status)["restarts"], 1);
  EXPECT_EQ(js(p.status)["restartGeneration"], 1);
  EXPECT_EQ(condStatus(js(p.status), "Restarting"), "True");
  EXPECT_EQ(condReason(js(p.status), "Restarting"), "WorkerFailed");
  EXPECT_EQ(p.podsToDelete.size(), 2u);
  EXPECT_TRUE(p.ranksToCreate.empty());

  // While old-generation pods linger nothing new is created.
  PlanInput wait = input(gang, js(p.status));
  wait.pods = {pod(0, "Running", 0), pod(1, "Failed", 0, 1)};
  wait.pods[0].deleting = true;
  Plan w = planReconcile(wait);
  EXPECT_TRUE(w.ranksToCreate.empty());
  EXPECT_EQ(w.podsToDelete, std::vector<std::string>{"j-worker-1"});
  EXPECT_FALSE(w.gangRestarted);
  EXPECT_EQ(js(w.status)["restarts"], 1);

  // Once they are gone the new generation is created, and Running clears Restarting.
  Plan c = planReconcile(input(gang, js(p.status)));
  EXPECT_EQ(c.ranksToCreate.size(), 2u);
  EXPECT_TRUE(c.joiningRanks.empty());  // a new gang starts its own rendezvous
  EXPECT_EQ(js(c.status)["phase"], "Restarting");
  PlanInput up = input(gang, js(c.status));
  up.pods = {pod(0, "Running", 1), pod(1, "Running", 1)};
  Plan r = planReconcile(up);
  EXPECT_EQ(js(r.status)["phase"], "Running");
  EXPECT_EQ(condStatus(js(r.status), "Restarting"), "False");
}

TEST(Plan, BackoffLimitFails) {
  PlanInput in = input({{"runPolicy", {{"backoffLimit", 2}}}}, {{"phase", "Running"}, {"restarts", 2}, {"restartGeneration", 2}});
  in.pods = {pod(0, "Running", 2), pod(1, "Failed", 2, 137)};
  Plan p = planReconcile(in);
  EXPECT_EQ(js(p.status)["phase"], "Failed");
  EXPECT_EQ(condReason(js(p.status), "Failed"), "BackoffLimitExceeded");
  EXPECT_NE(js(p.status)["message"].get<std::string>().find("backoffLimit=2"), std::string::npos);
  EXPECT_EQ(p.podsToDelete, std::vector<std::string>{"j-worker-0"});  // the running one stops
}

TEST(Plan, PermanentExitCodesFailWithoutRestart) {
  // One table for edit-run and the operator (common/src/exit_codes.h).
  for (int code : {2, 3, 126, 127}) {
    EXPECT_TRUE(edit::isPermanentExit(code)) << code;
    EXPECT_FALSE(edit::replaceableExit(code)) << code;  // edit-run does not replace it either
  }
  for (int code : {1, 75, 76, 137, 143}) EXPECT_FALSE(edit::isPermanentExit(code)) << code;
  for (int code : {1, 76, 137, 139}) EXPECT_TRUE(edit::replaceableExit(code)) << code;
  for (int code : {0, 75, 143}) EXPECT_FALSE(edit::replaceableExit(code)) << code;
  PlanInput in = input({}, {{"phase", "Running"}});
  in.pods = {pod(0, "Failed", 0, 2), pod(1, "Running")};
  Plan p = planReconcile(in);
  EXPECT_EQ(js(p.status)["phase"], "Failed");
  EXPECT_EQ(condReason(js(p.status), "Failed"), "PermanentError");
  EXPECT_FALSE(p.gangRestarted);
  EXPECT_FALSE(js(p.status).contains("restarts") && js(p.status)["restarts"] != 0);
}

TEST(Plan, StalledTrainingFailsWithTheWorkersReason) {
  // edit-train exits 3 when the outer step was skipped maxSkippedRounds rounds in a row and
  // says why in its termination message: the job fails (no restart) and says it too.
  EXPECT_TRUE(edit::isPermanentExit(edit::kExitStalled));
  PlanInput in = input({}, {{"phase", "Running"}});
  in.pods = {pod(0, "Failed", 0, 3), pod(1, "Failed", 0, 3)};
  in.pods[0].message = "training stalled: the outer step of unit block.1 was skipped in the last 3 sync rounds";
  Plan p = planReconcile(in);
  EXPECT_EQ(js(p.status)["phase"], "Failed");
  EXPECT_EQ(condReason(js(p.status), "Failed"), "TrainingStalled");
  const std::string msg = findCondition(js(p.status), "Failed")->value("message", "");
  EXPECT_NE(msg.find("exit code 3"), std::string::npos) << msg;
  EXPECT_NE(msg.find("the outer step of unit block.1 was skipped"), std::string::npos) << msg;
  EXPECT_FALSE(p.gangRestarted);
  EXPECT_TRUE(p.ranksToCreate.empty());
}

TEST(Plan, InvalidSpecFailsAndCreatesNothing) {
  PlanInput in = input();
  in.spec.reset();
  in.specError = "spec.replicas: must be in [1, 4096]";
  Plan p = planReconcile(in);
  EXPECT_EQ(js(p.status)["phase"], "Failed");
  EXPECT_EQ(condReason(js(p.status), "Failed"), "InvalidSpec");
  EXPECT_NE(findCondition(js(p.status), "Failed")->value("message", "").find("spec.replicas"), std::string::npos);
  EXPECT_TRUE(p.ranksToCreate.empty());
  EXPECT_FALSE(p.ensureChildren);
  ASSERT_EQ(p.events.size(), 1u);
  // A second pass changes nothing and emits no second event.
  PlanInput again = in;
  again.status = js(p.status);
  Plan q = planReconcile(again);
  EXPECT_EQ(js(q.status), js(p.status));
  EXPECT_TRUE(q.events.empty());
}

TEST(Plan, DeadlineExceeded) {
  PlanInput in = input({{"runPolicy", {{"activeDeadlineSeconds", 10}}}},
                       {{"phase", "Running"}, {"startTime", log::rfc3339(kNow - 11)}});
  in.pods = {pod(0, "Running"), pod(1, "Running")};
  Plan p = planReconcile(in);
  EXPECT_EQ(js(p.status)["phase"], "Failed");
  EXPECT_EQ(condReason(js(p.status), "Failed"), "DeadlineExceeded");
  EXPECT_EQ(p.podsToDelete.size(), 2u);

  PlanInput early = input({{"runPolicy", {{"activeDeadlineSeconds", 10}}}},
                          {{"phase", "Running"}, {"startTime", log::rfc3339(kNow - 4)}});
  early.pods = {pod(0, "Running"), pod(1, "Running")};
  Plan e = planReconcile(early);
  EXPECT_EQ(js(e.status)["phase"], "Running");
  ASSERT_TRUE(e.requeueAfterSeconds);
  EXPECT_EQ(*e.requeueAfterSeconds, 6);
}

TEST(Plan, TtlAndCleanPodPolicy) {
  json finished = {{"phase", "Succeeded"}, {"completionTime", log::rfc3339(kNow - 3)}};
  PlanInput in = input({{"runPolicy", {{"ttlSecondsAfterFinished", 10}, {"cleanPodPolicy", "All"}}}}, finished);
  in.pods = {pod(0, "Succeeded", 0, 0), pod(1, "Succeeded", 0, 0)};
  Plan p = planReconcile(in);
  EXPECT_FALSE(p.deleteJob);
  EXPECT_EQ(*p.requeueAfterSeconds, 7);
  EXPECT_EQ(p.podsToDelete.size(), 2u);
  in.now = kNow + 8;
  EXPECT_TRUE(planReconcile(in).deleteJob);

  PlanInput none = input({{"runPolicy", {{"cleanPodPolicy", "None"}}}}, {{"phase", "Failed"}});
  none.pods = {pod(0, "Running")};
  EXPECT_TRUE(planReconcile(none).podsToDelete.empty());
  PlanInput running = input({}, {{"phase", "Failed"}});
  running.pods = {pod(0, "Running"), pod(1, "Failed", 0, 1)};
  EXPECT_EQ(planReconcile(running).podsToDelete, std::vector<std::string>{"j-worker-0"});
}

TEST(Plan, SuspendAndResume) {
  PlanInput in = input({{"runPolicy", {{"suspend", true}}}}, {{"phase", "Running"}, {"startTime", log::rfc3339(kNow)}});
  in.pods = {pod(0, "Running"), pod(1, "Running")};
  Plan p = planReconcile(in);
  EXPECT_EQ(js(p.status)["phase"], "Suspended");
  EXPECT_EQ(condStatus(js(p.status), "Suspended"), "True");
  EXPECT_EQ(p.podsToDelete.size(), 2u);
  EXPECT_FALSE(js(p.status).contains("startTime"));

  Plan r = planReconcile(input({}, js(p.status)));
  EXPECT_EQ(js(r.status)["phase"], "Created");
  EXPECT_EQ(condStatus(js(r.status), "Suspended"), "False");
  EXPECT_EQ(r.ranksToCreate.size(), 2u);
}

TEST(Plan, HangRestartsTheGang) {
  PlanInput in = input({}, {{"phase", "Running"}});
  in.pods = {pod(0, "Running"), pod(1, "Running")};
  in.telemetry.present = true;
  in.telemetry.hung = true;
  in.telemetry.hungPastRecovery = true;
  Plan p = planReconcile(in);
  EXPECT_EQ(condStatus(js(p.status), "Hung"), "True");
  EXPECT_TRUE(p.gangRestarted);
  EXPECT_EQ(condReason(js(p.status), "Restarting"), "Hung");
  EXPECT_TRUE(p.deleteImmediately);  // stuck workers cannot use a grace period
}

TEST(Plan, SucceededReportsTheFullBudgetEvenWithStaleTelemetry) {
  PlanInput in = input({}, {{"phase", "Running"}, {"progress", {{"step", 22}, {"totalSteps", 64}}}});
  in.pods = {pod(0, "Succeeded"), pod(1, "Succeeded")};
  Plan p = planReconcile(in);
  EXPECT_EQ(js(p.status)["phase"], "Succeeded");
  EXPECT_EQ(js(p.status)["progress"]["step"], 64);
  EXPECT_EQ(js(p.status)["progress"]["etaSeconds"], 0);
}

TEST(Plan, StragglersAndReplace) {
  PlanInput in = input({}, {{"phase", "Running"}});
  in.pods = {pod(0, "Running"), pod(1, "Running")};
  in.pods[1].node = "n1";
  in.telemetry.present = true;
  in.telemetry.progress.step = 10;
  in.telemetry.stragglers = {{1, "j-worker-1", "n1", 3.0}};
  Plan p = planReconcile(in);
  EXPECT_EQ(condStatus(js(p.status), "StragglerDetected"), "True");
  EXPECT_EQ(js(p.status)["stragglerCount"], 1);
  EXPECT_EQ(js(p.status)["progress"]["step"], 10);
  EXPECT_TRUE(p.podsToDelete.empty());  // action Report
  bool evented = false;
  for (const auto& e : p.events) evented |= e.reason == "StragglerDetected";
  EXPECT_TRUE(evented);

  PlanInput rep = input({{"stragglerPolicy", {{"action", "Replace"}}}}, js(p.status));
  rep.pods = in.pods;
  rep.telemetry = in.telemetry;
  Plan r = planReconcile(rep);
  EXPECT_EQ(r.podsToDelete, std::vector<std::string>{"j-worker-1"});
  ASSERT_EQ(r.replacedRanks.size(), 1u);
  EXPECT_EQ(r.replacedRanks[0].second, "n1");
  for (const auto& e : r.events) EXPECT_NE(e.reason, "StragglerDetected");  // already reported
  // Replaced in place (replicaRecovery InPlace is the default): killed at once, its new
  // pod joins the running job; a recovery, not a gang restart.
  EXPECT_TRUE(r.deleteImmediately);
  EXPECT_EQ(r.recoveredRanks, std::vector<int>{1});
  EXPECT_EQ(js(r.status).value("replicaRecoveries", 0), 1);
  EXPECT_EQ(js(r.status).value("restarts", 0), 0);
  EXPECT_EQ(condStatus(js(r.status), "Recovering"), "True");
  EXPECT_EQ(js(r.status)["recovery"]["ranks"], json::array({1}));
  // The node to avoid is in the status, so an operator restart does not forget it.
  EXPECT_EQ(js(r.status)["avoidNodes"], json::parse(R"([{"rank": 1, "node": "n1"}])"));
  EXPECT_EQ(avoidNodesFromStatus(js(r.status)), (std::map<int, std::set<std::string>>{{1, {"n1"}}}));
  // While the killed straggler is still visible (Running, being deleted) the recovery is
  // not over, and its rank is recreated as a replacement once it is gone.
  PlanInput during = input({{"stragglerPolicy", {{"action", "Replace"}}}}, js(r.status));
  during.pods = in.pods;
  during.pods[1].deleting = true;
  Plan d = planReconcile(during);
  EXPECT_EQ(condStatus(js(d.status), "Recovering"), "True");
  PlanInput gone = input({{"stragglerPolicy", {{"action", "Replace"}}}}, js(d.status));
  gone.pods = {in.pods[0]};
  Plan g = planReconcile(gone);
  EXPECT_EQ(g.ranksToCreate, std::vector<int>{1});
  EXPECT_EQ(g.joiningRanks, std::vector<int>{1});

  // GangRestart and ddp opt out: deleted with its grace period, no recovery record (its
  // peers fail and the gang restarts).
  for (const auto& [which, spec] : {std::pair<int, json>{1, {{"stragglerPolicy", {{"action", "Replace"}}},
                                                             {"algorithm", {{"mode", "ddp"}}}}},
                                    std::pair<int, json>{1, {{"stragglerPolicy", {{"action", "Replace"}}},
                                                             {"runPolicy", {{"replicaRecovery", "GangRestart"}}}}}}) {
    PlanInput g = input(spec, js(p.status));
    g.pods = in.pods;
    g.telemetry = in.telemetry;
    g.telemetry.stragglers[0].rank = which;
    Plan gp = planReconcile(g);
    EXPECT_EQ(gp.podsToDelete, std::vector<std::string>{"j-worker-" + std::to_string(which)});
    EXPECT_FALSE(gp.deleteImmediately);
    EXPECT_TRUE(gp.recoveredRanks.empty());
    EXPECT_FALSE(js(gp.status).contains("recovery"));
    EXPECT_EQ(js(gp.status)["avoidNodes"], json::parse(R"([{"rank": 1, "node": "n1"}])"));
    // Its peers fail next: the gang restart keeps the node to avoid for the new gang.
    PlanInput peers = input(spec, js(gp.status));
    peers.pods = {pod(0, "Failed", 0, 75), pod(1, "Failed", 0, 137)};
    Plan rp = planReconcile(peers);
    EXPECT_TRUE(rp.gangRestarted);
    EXPECT_EQ(js(rp.status)["avoidNodes"], js(gp.status)["avoidNodes"]);
  }

  // With runPolicy.backoffLimit spent a straggler is only reported: slow beats Failed.
  PlanInput spent = input({{"stragglerPolicy", {{"action", "Replace"}}}, {"runPolicy", {{"backoffLimit", 1}}}}, js(p.status));
  spent.status["restarts"] = 1;
  spent.pods = in.pods;
  spent.telemetry = in.telemetry;
  Plan sp = planReconcile(spent);
  EXPECT_TRUE(sp.podsToDelete.empty());
  EXPECT_EQ(condStatus(js(sp.status), "StragglerDetected"), "True");

  PlanInput clear = input({}, js(p.status));
  clear.pods = in.pods;
  clear.telemetry.present = true;
  Plan c = planReconcile(clear);
  EXPECT_EQ(condStatus(js(c.status), "StragglerDetected"), "False");
}

TEST(Plan, AvoidNodesFromStatusSkipsWhatDoesNotParse) {
  json st = json::parse(R"({"avoidNodes": [{"rank": 0, "node": "a"}, {"rank": 0, "node": "b"}, {"rank": 2, "node": "a"},
                                           {"rank": "1", "node": "c"}, {"rank": 3}, {"rank": 4, "node": ""}, 7]})");
  EXPECT_EQ(avoidNodesFromStatus(st), (std::map<int, std::set<std::string>>{{0, {"a", "b"}}, {2, {"a"}}}));
  EXPECT_TRUE(avoidNodesFromStatus(json::object()).empty());
  EXPECT_TRUE(avoidNodesFromStatus(json::parse(R"({"avoidNodes": "n1"})")).empty());
}

TEST(Plan, ConditionTransitionTimeOnlyOnFlip) {
  json st = json::object();
  EXPECT_TRUE(setCondition(st, "Running", "True", "A", "m", "t1", 1));
  EXPECT_FALSE(setCondition(st, "Running", "True", "A", "m", "t2", 1));
  EXPECT_TRUE(setCondition(st, "Running", "True", "B", "m", "t3", 1));
  EXPECT_EQ(findCondition(st, "Running")->value("lastTransitionTime", ""), "t1");
  EXPECT_TRUE(setCondition(st, "Running", "False", "B", "m", "t4", 1));
  EXPECT_EQ(findCondition(st, "Running")->value("lastTransitionTime", ""), "t4");
}

TEST(Plan, ObservePodReadsExitCodes) {
  json p = {{"metadata", {{"name", "j-worker-1"}, {"labels", {{"edit.io/rank", "1"}, {"edit.io/restart-generation", "2"}}}}},
            {"spec", {{"nodeName", "n"}}},
            {"status", {{"phase", "Failed"},
                        {"containerStatuses", {{{"state", {{"terminated", {{"exitCode", 127}, {"reason", "Error"},
                                                                             {"message", "no edit-train"}}}}}}}}}}};
  ObservedPod o = observePod(p);
  EXPECT_EQ(o.message, "no edit-train");
  EXPECT_EQ(o.rank, 1);
  EXPECT_EQ(o.generation, 2);
  EXPECT_EQ(o.phase, "Failed");
  EXPECT_EQ(*o.exitCode, 127);
  EXPECT_EQ(o.node, "n");
}

TEST(Plan, ObservePodReadsDisruptions) {
  json evicted = {{"metadata", {{"name", "j-worker-0"}, {"labels", {{"edit.io/rank", "0"}}}}},
                  {"status", {{"phase", "Running"},
                              {"conditions", {{{"type", "DisruptionTarget"}, {"status", "True"},
                                               {"reason", "EvictionByEvictionAPI"}}}}}}};
  EXPECT_EQ(observePod(evicted).disruption, "EvictionByEvictionAPI");
  json byKubelet = {{"metadata", {{"name", "j-worker-0"}}}, {"status", {{"phase", "Failed"}, {"reason", "Evicted"}}}};
  EXPECT_EQ(observePod(byKubelet).disruption, "Evicted");
  json falseCond = evicted;
  falseCond["status"]["conditions"][0]["status"] = "False";
  EXPECT_EQ(observePod(falseCond).disruption, "");
}

// A drained node or a preemption takes a pod away: the gang restart it causes does not
// spend backoffLimit (as a batch Job's podFailurePolicy with DisruptionTarget: Ignore),
// even when the evicted pod is gone by the time its peers exit 143.
TEST(Plan, DisruptionsDoNotSpendTheBackoffLimit) {
  const json spec = {{"runPolicy", {{"backoffLimit", 0}}}};
  PlanInput seen = input(spec, {{"phase", "Running"}});
  seen.pods = {pod(0, "Running"), pod(1, "Running")};
  seen.pods[0].deleting = true;
  seen.pods[0].disruption = "EvictionByEvictionAPI";
  Plan p1 = planReconcile(seen);
  EXPECT_EQ(condStatus(js(p1.status), "Disrupted"), "True");
  EXPECT_EQ(condReason(js(p1.status), "Disrupted"), "EvictionByEvictionAPI");
  ASSERT_FALSE(p1.events.empty());
  EXPECT_EQ(p1.events.back().reason, "Disrupted");
  EXPECT_FALSE(p1.gangRestarted);

  PlanInput failed = input(spec, js(p1.status));  // the evicted pod is gone; its peer stopped (143)
  failed.pods = {pod(1, "Failed", 0, 143)};
  Plan p2 = planReconcile(failed);
  EXPECT_TRUE(p2.gangRestarted);
  EXPECT_EQ(js(p2.status)["phase"], "Restarting");
  EXPECT_EQ(js(p2.status)["restarts"], 1);
  EXPECT_EQ(js(p2.status)["disruptions"], 1);
  EXPECT_EQ(condStatus(js(p2.status), "Disrupted"), "False");

  // A failure of its own afterwards finds the budget (0) unspent... and exceeded.
  PlanInput again = input(spec, js(p2.status));
  again.status["phase"] = "Running";
  again.status["restartGeneration"] = 1;
  again.pods = {pod(0, "Running", 1), pod(1, "Failed", 1, 1)};
  Plan p3 = planReconcile(again);
  EXPECT_EQ(js(p3.status)["phase"], "Failed");
  EXPECT_EQ(condReason(js(p3.status), "Failed"), "BackoffLimitExceeded");
}

TEST(Plan, DisruptedWorkerIsReplacedInPlaceForFree) {
  PlanInput in = input({{"runPolicy", {{"backoffLimit", 1}}}}, {{"phase", "Running"}, {"replicaRecoveries", 1}});
  in.pods = {pod(0, "Running"), pod(1, "Failed", 0, 137)};
  in.pods[1].disruption = "PreemptionByScheduler";
  Plan p = planReconcile(in);
  EXPECT_FALSE(p.gangRestarted);
  EXPECT_EQ(p.recoveredRanks, (std::vector<int>{1}));
  EXPECT_EQ(js(p.status)["replicaRecoveries"], 2);
  EXPECT_EQ(js(p.status)["disruptions"], 1);
  EXPECT_EQ(condStatus(js(p.status), "Recovering"), "True");
}

// observedGeneration is the generation whose spec the status reflects: a runPolicy change
// (the only kind the API accepts on a running job) is acted on in the same plan.
TEST(Plan, ObservedGenerationFollowsTheSpecActedOn) {
  PlanInput in = input({{"runPolicy", {{"suspend", true}}}}, {{"phase", "Running"}, {"observedGeneration", 1}});
  in.meta.generation = 2;
  in.pods = {pod(0, "Running"), pod(1, "Running")};
  Plan p = planReconcile(in);
  EXPECT_EQ(js(p.status)["observedGeneration"], 2);
  EXPECT_EQ(js(p.status)["phase"], "Suspended");
  EXPECT_EQ(p.podsToDelete.size(), 2u);
  EXPECT_EQ(findCondition(js(p.status), "Suspended")->value("observedGeneration", 0L), 2);
}

// When the API refuses the pods (Pod Security, quota), each retry plans the creation
// again; the Created event and the created-gangs metric come once.
TEST(Plan, RetriedCreationIsNotAnotherGang) {
  Plan first = planReconcile(input());
  ASSERT_TRUE(first.gangCreated);
  Plan retry = planReconcile(input({}, js(first.status)));
  EXPECT_EQ(retry.ranksToCreate, (std::vector<int>{0, 1}));
  EXPECT_FALSE(retry.gangCreated);
  EXPECT_TRUE(retry.events.empty());
}

// After a disruption, only the failures it causes are free: a worker that crashes on its
// own (not exit 143, and not taken away itself) is charged.
TEST(Plan, CrashAfterADisruptionIsCharged) {
  json status = {{"phase", "Running"}};
  setCondition(status, "Disrupted", "True", "EvictionByEvictionAPI", "m", "t", 1);
  PlanInput in = input({{"runPolicy", {{"backoffLimit", 0}, {"replicaRecovery", "GangRestart"}}}}, status);
  in.pods = {pod(0, "Running"), pod(1, "Failed", 0, 1)};
  Plan p = planReconcile(in);
  EXPECT_EQ(js(p.status)["phase"], "Failed");
  EXPECT_EQ(condReason(js(p.status), "Failed"), "BackoffLimitExceeded");
}
