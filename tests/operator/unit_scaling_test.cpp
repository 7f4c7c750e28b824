// The planner's scaling policy (controller/plan_scaling.cpp): a change of spec.replicas on
// a running job, step by step as the reconciles see it.
#include "plan_fixtures.h"
#include "util/log.h"

namespace edit::op::controller {
namespace {

using namespace plantest;

// A job running 2 x 1 workers whose spec now asks for `want` replicas.
PlanInput running(int want, json status = kRunning) {
  if (!status.contains("replicas")) status["replicas"] = 2;
  PlanInput in = input({{"replicas", want}}, status);
  in.pods = {pod(0, "Running"), pod(1, "Running")};
  return in;
}

// The status of a job running `from` replicas while a scale to `to` is in progress, started
// `started` seconds ago; asked `asked` seconds ago (-1: the workers were not asked yet).
json scalingStatus(int from, int to, long started, long asked = -1) {
  json st = kRunning;
  st["replicas"] = from;
  st["scaling"] = {{"from", from}, {"to", to}, {"startTime", log::rfc3339(kNow - started)}};
  if (asked >= 0) st["scaling"]["requestTime"] = log::rfc3339(kNow - asked);
  return st;
}

// Rank `rank`'s newest report came from `uid`, at `step`, in a world of `replicas`.
void reported(PlanInput& in, int rank, const std::string& uid, long step, int replicas = 0) {
  in.telemetry.present = true;
  in.telemetry.ranks[rank] = {uid, step, 0.5};
  if (rank == 0) in.telemetry.replicas = replicas;
}

TEST(Scaling, StatusNamesTheReplicasTrainingAndTheSelector) {
  Plan p = planReconcile(running(2));
  EXPECT_EQ(js(p.status)["replicas"], 2);
  EXPECT_EQ(js(p.status)["selector"], "edit.io/job-name=j,edit.io/rank");  // workers, not the export pod
  EXPECT_EQ(p.replicas, 2);
  EXPECT_FALSE(js(p.status).contains("scaling"));
  EXPECT_EQ(condStatus(js(p.status), "Scaling"), "");
}

TEST(Scaling, UpCreatesTheNewReplicasPodsThenAsksOnceTheyRun) {
  Plan p = planReconcile(running(3));
  EXPECT_EQ(js(p.status)["scaling"]["from"], 2);
  EXPECT_EQ(js(p.status)["scaling"]["to"], 3);
  EXPECT_FALSE(js(p.status)["scaling"].contains("requestTime"));  // not before the new pod runs
  EXPECT_EQ(p.scaleJoinRanks, std::vector<int>{2});
  EXPECT_EQ(p.scaleTo, 3);
  EXPECT_TRUE(p.ranksToCreate.empty());  // the running ranks are all there
  EXPECT_FALSE(p.scaleRequest);
  EXPECT_EQ(js(p.status)["replicas"], 2);   // still training with 2
  EXPECT_EQ(p.replicas, 2);
  EXPECT_EQ(js(p.status)["workers"]["total"], 2);
  EXPECT_EQ(condStatus(js(p.status), "Scaling"), "True");
  EXPECT_EQ(condReason(js(p.status), "Scaling"), "ScalingUp");
  EXPECT_TRUE(hasEvent(p, "Normal", "ScalingStarted"));

  // The new pod is Pending: no second create, no request.
  PlanInput pending = running(3, js(p.status));
  pending.pods.push_back(pod(2, "Pending"));
  Plan q = planReconcile(pending);
  EXPECT_TRUE(q.scaleJoinRanks.empty());
  EXPECT_FALSE(q.scaleRequest);
  EXPECT_TRUE(q.podsToDelete.empty());
  EXPECT_EQ(js(q.status)["phase"], "Running");

  // It runs: rank 0 is asked, and asked again only after the resend interval.
  PlanInput up = running(3, js(q.status));
  up.pods.push_back(pod(2, "Running"));
  Plan r = planReconcile(up);
  ASSERT_TRUE(r.scaleRequest);
  EXPECT_EQ(*r.scaleRequest, 3);
  EXPECT_EQ(js(r.status)["scaling"]["requestTime"], log::rfc3339(kNow));
  ASSERT_TRUE(r.requeueAfterSeconds);
  EXPECT_LE(*r.requeueAfterSeconds, 10);
  PlanInput soon = running(3, js(r.status));
  soon.pods = up.pods;
  soon.now = kNow + 3;
  EXPECT_FALSE(planReconcile(soon).scaleRequest);
  PlanInput later = running(3, js(r.status));
  later.pods = up.pods;
  later.now = kNow + 10;
  EXPECT_TRUE(planReconcile(later).scaleRequest);

  // Rank 0 reports a world of 3 replicas: done; the new rank is part of the job.
  PlanInput done = running(3, js(r.status));
  done.pods = up.pods;
  done.now = kNow + 7;
  reported(done, 0, "uid-0-0", 40, 3);
  Plan d = planReconcile(done);
  EXPECT_EQ(js(d.status)["replicas"], 3);
  EXPECT_EQ(d.replicas, 3);
  EXPECT_FALSE(js(d.status).contains("scaling"));
  EXPECT_EQ(js(d.status)["lastScale"]["result"], "Succeeded");
  EXPECT_EQ(js(d.status)["lastScale"]["from"], 2);
  EXPECT_EQ(js(d.status)["lastScale"]["to"], 3);
  EXPECT_EQ(js(d.status)["lastScale"]["seconds"], 7.0);
  EXPECT_EQ(condStatus(js(d.status), "Scaling"), "False");
  EXPECT_EQ(condReason(js(d.status), "Scaling"), "Scaled");
  EXPECT_TRUE(hasEvent(d, "Normal", "Scaled"));
  ASSERT_TRUE(d.scaleEnded);
  EXPECT_EQ(d.scaleEnded->result, "Succeeded");
  EXPECT_EQ(js(d.status)["workers"]["total"], 3);
  EXPECT_EQ(js(d.status)["workers"]["running"], 3);
  EXPECT_TRUE(d.podsToDelete.empty());
  EXPECT_FALSE(d.gangRestarted);
  // The children follow the new world (a gang PodGroup's minMember: the reconciler
  // renders them from d.replicas).
  EXPECT_TRUE(d.ensureChildren);
}

// With shards, a new replica is several pods: the workers are asked once all of them run.
TEST(Scaling, UpAsksOnlyOnceEveryPodOfTheNewReplicaRuns) {
  json st = scalingStatus(2, 3, 5);
  PlanInput in = input({{"replicas", 3}, {"shardsPerReplica", 2}}, st);
  in.pods = {pod(0, "Running"), pod(1, "Running"), pod(2, "Running"), pod(3, "Running"), pod(4, "Running"),
             pod(5, "Pending")};
  EXPECT_FALSE(planReconcile(in).scaleRequest);
  in.pods[5].phase = "Running";
  Plan p = planReconcile(in);
  ASSERT_TRUE(p.scaleRequest);
  EXPECT_EQ(*p.scaleRequest, 3);
  EXPECT_EQ(js(p.status)["workers"]["total"], 4);
}

TEST(Scaling, UpEndsWhenEveryNewRankReportedFromItsPod) {
  json st = scalingStatus(2, 3, 5, 2);
  PlanInput in = running(3, st);
  in.pods.push_back(pod(2, "Running"));
  reported(in, 2, "another-pod", 12);  // an old incarnation's report does not count
  EXPECT_TRUE(js(planReconcile(in).status).contains("scaling"));
  reported(in, 2, "uid-2-0", 12);
  Plan p = planReconcile(in);
  EXPECT_FALSE(js(p.status).contains("scaling"));
  EXPECT_EQ(js(p.status)["replicas"], 3);
}

TEST(Scaling, ANewPodThatFailsLeavesTheJobAtItsOldSizeWithoutARestart) {
  json st = scalingStatus(2, 3, 5, 2);
  PlanInput in = running(3, st);
  in.pods.push_back(pod(2, "Failed", 0, 1));
  in.pods.back().message = "rendezvous: no peer answered";
  Plan p = planReconcile(in);
  EXPECT_FALSE(p.gangRestarted);
  EXPECT_EQ(js(p.status)["restarts"], 0);
  EXPECT_EQ(js(p.status).value("replicaRecoveries", 0), 0);
  EXPECT_EQ(js(p.status)["replicas"], 2);
  EXPECT_EQ(js(p.status)["phase"], "Running");
  EXPECT_FALSE(js(p.status).contains("scaling"));
  EXPECT_EQ(js(p.status)["lastScale"]["result"], "Abandoned");
  EXPECT_EQ(condReason(js(p.status), "Scaling"), "ScaleAbandoned");
  const std::string msg = findCondition(js(p.status), "Scaling")->value("message", "");
  EXPECT_NE(msg.find("j-worker-2"), std::string::npos) << msg;
  EXPECT_NE(msg.find("no peer answered"), std::string::npos) << msg;
  EXPECT_NE(msg.find("continues with 2 replicas"), std::string::npos) << msg;
  EXPECT_TRUE(hasEvent(p, "Warning", "ScaleAbandoned"));
  EXPECT_EQ(p.podsToDelete, std::vector<std::string>{"j-worker-2"});
  ASSERT_TRUE(p.scaleEnded);
  EXPECT_EQ(p.scaleEnded->result, "Abandoned");
  ASSERT_TRUE(p.scaleRequest);  // the workers were asked: the old size calls their wait off
  EXPECT_EQ(*p.scaleRequest, 2);

  // Not retried for the same spec (same generation) ...
  PlanInput again = running(3, js(p.status));
  Plan a = planReconcile(again);
  EXPECT_FALSE(js(a.status).contains("scaling"));
  EXPECT_TRUE(a.scaleJoinRanks.empty());
  // ... but after spec.replicas changed again (a new generation).
  PlanInput retry = running(3, js(p.status));
  retry.meta.generation = 2;
  EXPECT_EQ(planReconcile(retry).scaleJoinRanks, std::vector<int>{2});
}

TEST(Scaling, UpThatNeverJoinsIsAbandonedAtItsDeadline) {
  json st = scalingStatus(2, 3, 601, 5);
  PlanInput in = running(3, st);
  in.pods.push_back(pod(2, "Running"));
  Plan p = planReconcile(in);
  EXPECT_EQ(js(p.status)["lastScale"]["result"], "Abandoned");
  EXPECT_EQ(js(p.status)["replicas"], 2);
  EXPECT_EQ(p.podsToDelete, std::vector<std::string>{"j-worker-2"});
}

TEST(Scaling, UpTakenBackBeforeTheWorkersWereAskedIsCancelled) {
  json st = scalingStatus(2, 3, 5);
  st["conditions"] = json::array({{{"type", "Scaling"}, {"status", "True"}, {"reason", "ScalingUp"}}});
  PlanInput in = running(2, st);
  in.pods.push_back(pod(2, "Pending"));
  Plan p = planReconcile(in);
  EXPECT_FALSE(js(p.status).contains("scaling"));
  EXPECT_EQ(condReason(js(p.status), "Scaling"), "Cancelled");
  EXPECT_EQ(p.podsToDelete, std::vector<std::string>{"j-worker-2"});
  EXPECT_FALSE(p.scaleRequest);
}

TEST(Scaling, DownAsksAtOnceAndDeletesTheLeaversWhenTheyLeft) {
  json st = kRunning;
  st["replicas"] = 3;
  PlanInput in = input({{"replicas", 2}}, st);
  in.pods = {pod(0, "Running"), pod(1, "Running"), pod(2, "Running")};
  Plan p = planReconcile(in);
  ASSERT_TRUE(p.scaleRequest);
  EXPECT_EQ(*p.scaleRequest, 2);
  EXPECT_EQ(condReason(js(p.status), "Scaling"), "ScalingDown");
  EXPECT_TRUE(p.podsToDelete.empty());
  EXPECT_TRUE(p.scaleJoinRanks.empty());

  // The leaver exited 0: not the job's success, and the scale is done.
  PlanInput left = input({{"replicas", 2}}, js(p.status));
  left.pods = {pod(0, "Running"), pod(1, "Running"), pod(2, "Succeeded", 0, 0)};
  left.now = kNow + 4;
  Plan l = planReconcile(left);
  EXPECT_EQ(js(l.status)["phase"], "Running");
  EXPECT_EQ(js(l.status)["replicas"], 2);
  EXPECT_EQ(l.replicas, 2);
  EXPECT_EQ(js(l.status)["lastScale"]["result"], "Succeeded");
  EXPECT_EQ(l.podsToDelete, std::vector<std::string>{"j-worker-2"});
  EXPECT_EQ(l.leftRanks, std::vector<int>{2});
  EXPECT_TRUE(l.ensureChildren);  // the PodGroup's minMember comes down with the world
  EXPECT_EQ(js(l.status)["workers"]["total"], 2);
  EXPECT_EQ(js(l.status)["workers"]["succeeded"], 0);

  // Later the two that stay finish: the job succeeded with 2 workers.
  PlanInput end = input({{"replicas", 2}}, js(l.status));
  end.pods = {pod(0, "Succeeded", 0, 0), pod(1, "Succeeded", 0, 0), pod(2, "Succeeded", 0, 0)};
  end.pods[2].deleting = true;
  Plan e = planReconcile(end);
  EXPECT_EQ(js(e.status)["phase"], "Succeeded");
  EXPECT_EQ(js(e.status)["message"], "all 2 workers succeeded");
}

TEST(Scaling, DownEndsWhenRankZeroReportsTheSmallerWorld) {
  json st = scalingStatus(3, 2, 3, 3);
  PlanInput in = input({{"replicas", 2}}, st);
  in.pods = {pod(0, "Running"), pod(1, "Running"), pod(2, "Running")};
  reported(in, 0, "uid-0-0", 50, 3);
  EXPECT_TRUE(js(planReconcile(in).status).contains("scaling"));
  reported(in, 0, "uid-0-0", 51, 2);
  Plan p = planReconcile(in);
  EXPECT_EQ(js(p.status)["replicas"], 2);
  EXPECT_EQ(p.podsToDelete, std::vector<std::string>{"j-worker-2"});  // still finishing: deleted anyway
}

TEST(Scaling, ModesThatCannotResizeInPlaceTakeTheSizeAtTheirNextStart) {
  for (const json& extra : {json{{"algorithm", {{"mode", "ddp"}}}}, json{{"runPolicy", {{"replicaRecovery", "GangRestart"}}}}}) {
    json spec = extra;
    spec["replicas"] = 3;
    json st = kRunning;
    st["replicas"] = 2;
    PlanInput in = input(spec, st);
    in.pods = {pod(0, "Running"), pod(1, "Running")};
    Plan p = planReconcile(in);
    EXPECT_FALSE(js(p.status).contains("scaling")) << extra;
    EXPECT_TRUE(p.scaleJoinRanks.empty());
    EXPECT_FALSE(p.scaleRequest);
    EXPECT_EQ(condReason(js(p.status), "Scaling"), "AppliesAtRestart") << extra;
    EXPECT_EQ(js(p.status)["replicas"], 2);
  }
}

TEST(Scaling, ASuspendedJobResumesWithTheNewSize) {
  json st = {{"phase", "Suspended"}, {"replicas", 2}, {"restartGeneration", 0}};
  PlanInput in = input({{"replicas", 3}}, st);
  Plan p = planReconcile(in);
  EXPECT_EQ(js(p.status)["replicas"], 3);
  EXPECT_EQ(p.replicas, 3);
  EXPECT_EQ(p.ranksToCreate, (std::vector<int>{0, 1, 2}));
  EXPECT_TRUE(p.scaleJoinRanks.empty());
  EXPECT_EQ(js(p.status)["workers"]["total"], 3);
}

TEST(Scaling, AScaleInProgressEndsWithTheJob) {
  json st = scalingStatus(2, 3, 5);
  st["conditions"] = json::array({{{"type", "Scaling"}, {"status", "True"}, {"reason", "ScalingUp"}}});
  PlanInput in = running(3, st);
  in.pods = {pod(0, "Succeeded", 0, 0), pod(1, "Succeeded", 0, 0), pod(2, "Pending")};
  Plan p = planReconcile(in);
  EXPECT_EQ(js(p.status)["phase"], "Succeeded");
  EXPECT_FALSE(js(p.status).contains("scaling"));
  EXPECT_EQ(condStatus(js(p.status), "Scaling"), "False");
}

// A Kueue-queued job answers a failed worker with a new gang (a new pod group): Kueue
// keeps a failed pod of a group until a replacement of another name exists.
TEST(Scaling, KueueQueuedJobRestartsTheGangOnAFailure) {
  json st = kRunning;
  st["replicas"] = 2;
  PlanInput in = input({}, st);
  in.spec->kueueQueue = "team-queue";
  in.pods = {pod(0, "Running"), pod(1, "Failed", 0, 137)};
  Plan p = planReconcile(in);
  expectGangRestart(p);
  const std::string msg = findCondition(js(p.status), "Restarting")->value("message", "");
  EXPECT_NE(msg.find("Kueue"), std::string::npos) << msg;
}

}  // namespace
}  // namespace edit::op::controller
