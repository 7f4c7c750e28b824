// What a real cluster does that the operator's authors did not expect, as the planner and
// the pod builder see it: telemetry that stops (no restart for it), a hang the workers may
// still recover from themselves, pods that never start, a full checkpoint volume, a gang
// that resumed behind where it stopped, the grace period and periodic checkpoints, the
// worker variables a job may not set, and a status another writer changed meanwhile.
#include <gtest/gtest.h>

#include "api/editjob.h"
#include "api/worker_env.h"
#include "controller/desired.h"
#include "controller/failure_policy.h"
#include "controller/pod_spec.h"
#include "controller/reconciler.h"
#include "plan_fixtures.h"
#include "util/log.h"

using namespace edit::op;
using namespace edit::op::controller;
using namespace edit::op::controller::plantest;

namespace {

std::string condMessage(const json& st, const std::string& type) {
  const auto c = findCondition(st, type);
  return c ? c->value("message", "") : "";
}

const PlannedEvent* event(const Plan& p, const std::string& reason) {
  for (const auto& e : p.events)
    if (e.reason == reason) return &e;
  return nullptr;
}

// ---- telemetry lost is not a hang --------------------------------------------------------

PlanInput quietJob(double quietSeconds) {
  PlanInput in = input({{"hangTimeoutSeconds", 60}}, kRunning);
  in.pods = {pod(0, "Running"), pod(1, "Running")};
  in.telemetry.present = true;
  in.telemetry.hung = quietSeconds > 60;
  in.telemetry.hungPastRecovery = quietSeconds > 960;
  in.telemetry.quietSeconds = quietSeconds;
  in.telemetry.ranks[0] = {"uid-0-0", 30, quietSeconds};
  in.telemetry.ranks[1] = {"uid-1-0", 30, quietSeconds};
  return in;
}

TEST(ClusterDay, NoReportFromAnyWorkerIsAConditionNotARestart) {
  for (double quiet : {31.0, 180.0, 5000.0}) {  // past half the hang timeout, 3x it, past everything
    const Plan p = planReconcile(quietJob(quiet));
    EXPECT_FALSE(p.gangRestarted) << quiet;
    EXPECT_TRUE(p.podsToDelete.empty()) << quiet;
    EXPECT_EQ(js(p.status).value("restarts", 0), 0) << quiet;
    EXPECT_FALSE(js(p.status).contains("recovery")) << quiet;
    EXPECT_EQ(condStatus(js(p.status), "TelemetryLost"), "True") << quiet;
    EXPECT_NE(condStatus(js(p.status), "Hung"), "True") << quiet;
    ASSERT_NE(event(p, "NoReports"), nullptr) << quiet;
    EXPECT_NE(event(p, "NoReports")->message.find("no telemetry from any of the 2 workers"), std::string::npos);
  }
  // Reports again: the condition ends, and an event is not repeated while it holds.
  const Plan lost = planReconcile(quietJob(180));
  PlanInput again = quietJob(1);
  again.status = js(lost.status);
  const Plan back = planReconcile(again);
  EXPECT_EQ(condStatus(js(back.status), "TelemetryLost"), "False");
  EXPECT_EQ(condReason(js(back.status), "TelemetryLost"), "ReportsResumed");
  PlanInput still = quietJob(240);
  still.status = js(lost.status);
  EXPECT_EQ(event(planReconcile(still), "NoReports"), nullptr);
}

TEST(ClusterDay, AStoppedWorkerAmongReportingOnesIsStillAHang) {
  PlanInput in = quietJob(0);
  in.telemetry.hung = true;
  in.telemetry.ranks[0].silentSeconds = 1;
  in.telemetry.ranks[1].silentSeconds = 45;  // SIGSTOP: its heartbeats stopped, rank 0's did not
  const Plan p = planReconcile(in);
  EXPECT_EQ(condReason(js(p.status), "Hung"), "WorkerUnresponsive");
  EXPECT_EQ(p.podsToDelete, std::vector<std::string>{"j-worker-1"});
  EXPECT_NE(condStatus(js(p.status), "TelemetryLost"), "True");
}

// ---- the hang rule leaves the workers' own recovery its time ------------------------------

TEST(ClusterDay, HangWaitsForTheWorkersOwnRecovery) {
  api::EDiTJobSpec s = *input().spec;
  EXPECT_EQ(runtimeRecoverySeconds(s), 300 + 600 + 60);  // collective timeout, rendezvous, a minute
  s.runtime = {{"collectiveTimeoutSeconds", 30}, {"rendezvousTimeoutSeconds", 40.5}};
  EXPECT_EQ(runtimeRecoverySeconds(s), 30 + 41 + 60);
  s.runPolicy.replicaRecovery = "GangRestart";  // the workers exit 75 after the collective: no rendezvous
  EXPECT_EQ(runtimeRecoverySeconds(s), 30 + 60);

  // Defaults (collective 300 s, hang 300 s): a cut between replicas where every worker
  // keeps reporting is not restarted at the hang timeout.
  PlanInput in = input({}, kRunning);
  in.pods = {pod(0, "Running"), pod(1, "Running")};
  in.telemetry.present = true;
  in.telemetry.hung = true;  // 300 s without a step
  in.telemetry.ranks[0] = {"uid-0-0", 30, 2};
  in.telemetry.ranks[1] = {"uid-1-0", 30, 3};
  const Plan waiting = planReconcile(in);
  EXPECT_FALSE(waiting.gangRestarted);
  EXPECT_EQ(condReason(js(waiting.status), "Hung"), "NoProgress");
  ASSERT_NE(event(waiting, "Hung"), nullptr);
  // The workers recovered in place: progress again ends the condition.
  PlanInput healed = in;
  healed.status = js(waiting.status);
  healed.telemetry.hung = false;
  const Plan ok = planReconcile(healed);
  EXPECT_EQ(condStatus(js(ok.status), "Hung"), "False");
  EXPECT_EQ(condReason(js(ok.status), "Hung"), "Progressing");
  // Still nothing after their recovery had its time: the gang restarts.
  PlanInput late = in;
  late.status = js(waiting.status);
  late.telemetry.hungPastRecovery = true;
  const Plan restart = planReconcile(late);
  EXPECT_TRUE(restart.gangRestarted);
  EXPECT_NE(condMessage(js(restart.status), "Hung").find("no training progress for 960 s"), std::string::npos)
      << js(restart.status).dump();
}

// ---- pods that never start ----------------------------------------------------------------

PlanInput startingJob(json specExtra = json::object()) {
  PlanInput in = input(specExtra, {{"phase", "Created"}, {"restarts", 0}, {"startTime", log::rfc3339(kNow - 100)}});
  in.pods = {pod(0, "Running"), pod(1, "Pending")};
  in.pods[1].created = log::rfc3339(kNow - 40);
  return in;
}

TEST(ClusterDay, APodThatCannotStartIsNamedWithItsReason) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"ErrImagePull", "failed to pull and unpack image \"x.invalid/t:1\""},
      {"ImagePullBackOff", "Back-off pulling image \"x.invalid/t:1\""},
      {"CreateContainerConfigError", "secret \"j-telemetry\" not found"},
      {"Unschedulable", "0/3 nodes are available: 3 Insufficient cpu."},
      {"SchedulingGated", "Scheduling is blocked due to non-empty scheduling gates"}};
  for (const auto& [reason, message] : cases) {
    PlanInput in = startingJob();
    in.pods[1].startReason = reason;
    in.pods[1].startMessage = message;
    const Plan p = planReconcile(in);
    const json st = js(p.status);
    EXPECT_EQ(condStatus(st, "PodsReady"), "False") << reason;
    EXPECT_EQ(condReason(st, "PodsReady"), reason);
    const std::string want = "worker pod j-worker-1 cannot start: " + reason + ": " + message;
    EXPECT_EQ(condMessage(st, "PodsReady"), want);
    EXPECT_EQ(st.value("message", ""), want);  // the MESSAGE column of kubectl get ej
    ASSERT_NE(event(p, reason), nullptr) << reason;
    EXPECT_EQ(event(p, reason)->type, "Warning");
    EXPECT_EQ(st["phase"], "Created");  // no timeout set: it waits
  }
  // The kubelet alternates ErrImagePull and ImagePullBackOff: one problem, one event.
  PlanInput first = startingJob();
  first.pods[1].startReason = "ErrImagePull";
  const Plan a = planReconcile(first);
  PlanInput next = startingJob();
  next.status = js(a.status);
  next.pods[1].startReason = "ImagePullBackOff";
  EXPECT_TRUE(planReconcile(next).events.empty());
  // Started: PodsReady turns True.
  PlanInput up = startingJob();
  up.status = js(a.status);
  up.pods[1].phase = "Running";
  const Plan r = planReconcile(up);
  EXPECT_EQ(condStatus(js(r.status), "PodsReady"), "True");
  EXPECT_EQ(js(r.status)["phase"], "Running");
}

TEST(ClusterDay, ARefusedCreateIsNamed) {
  PlanInput in = input({}, {{"phase", "Created"}, {"restarts", 0}});
  in.pods = {pod(0, "Running")};
  in.createError = "Error creating pod j-worker-1: pods \"j-worker-1\" is forbidden: exceeded quota: q";
  const Plan p = planReconcile(in);
  EXPECT_EQ(condReason(js(p.status), "PodsReady"), "FailedCreate");
  EXPECT_EQ(condMessage(js(p.status), "PodsReady"), in.createError);
}

TEST(ClusterDay, ScheduleTimeoutFailsTheJobWithThePodsReason) {
  PlanInput in = startingJob({{"runPolicy", {{"scheduleTimeoutSeconds", 60}}}});
  in.pods[1].startReason = "Unschedulable";
  in.pods[1].startMessage = "0/1 nodes are available: pod has unbound immediate PersistentVolumeClaims.";
  const Plan early = planReconcile(in);  // 40 s of 60
  EXPECT_EQ(js(early.status)["phase"], "Created");
  EXPECT_EQ(early.requeueAfterSeconds, 20);
  in.now = kNow + 21;
  const Plan p = planReconcile(in);
  const json st = js(p.status);
  EXPECT_EQ(st["phase"], "Failed");
  EXPECT_EQ(condReason(st, "Failed"), "Unschedulable");
  EXPECT_NE(condMessage(st, "Failed").find("worker pod j-worker-1 did not start within "
                                           "runPolicy.scheduleTimeoutSeconds=60; worker pod j-worker-1 cannot start: "
                                           "Unschedulable: 0/1 nodes are available: pod has unbound"),
            std::string::npos)
      << condMessage(st, "Failed");
  EXPECT_NE(std::find(p.podsToDelete.begin(), p.podsToDelete.end(), "j-worker-0"), p.podsToDelete.end());
}

TEST(ClusterDay, ObservedPodSaysWhyItDoesNotStart) {
  const json waiting = {{"metadata", {{"name", "p"}, {"creationTimestamp", "2027-01-15T08:00:00Z"}}},
                        {"status",
                         {{"phase", "Pending"},
                          {"conditions", json::array({{{"type", "PodScheduled"}, {"status", "True"}}})},
                          {"containerStatuses",
                           json::array({{{"name", "worker"},
                                         {"state", {{"waiting", {{"reason", "ImagePullBackOff"}, {"message", "m"}}}}}}})}}}};
  ObservedPod o = observePod(waiting);
  EXPECT_EQ(o.startReason, "ImagePullBackOff");
  EXPECT_EQ(o.startMessage, "m");
  EXPECT_EQ(o.created, "2027-01-15T08:00:00Z");
  json creating = waiting;
  creating["status"]["containerStatuses"][0]["state"]["waiting"]["reason"] = "ContainerCreating";
  EXPECT_EQ(observePod(creating).startReason, "");  // on its way
  const json gated = {{"metadata", {{"name", "p"}}},
                      {"status",
                       {{"phase", "Pending"},
                        {"conditions", json::array({{{"type", "PodScheduled"},
                                                     {"status", "False"},
                                                     {"reason", "SchedulingGated"},
                                                     {"message", "gates"}}})}}}};
  EXPECT_EQ(observePod(gated).startReason, "SchedulingGated");
}

// ---- a full checkpoint volume ----------------------------------------------------------------

TEST(ClusterDay, ExitFourIsCheckpointStorageFull) {
  PlanInput in = input({{"checkpoint", {{"pvc", "ckpt"}}}}, kRunning);
  in.pods = {pod(0, "Failed", 0, 4), pod(1, "Failed", 0, 4)};
  in.pods[0].message = "checkpoint step 400: No space left on device";
  const Plan p = planReconcile(in);
  const json st = js(p.status);
  EXPECT_EQ(st["phase"], "Failed");
  EXPECT_EQ(condReason(st, "Failed"), "CheckpointStorageFull");
  const std::string msg = condMessage(st, "Failed");
  EXPECT_NE(msg.find("j-worker-0 failed with exit code 4"), std::string::npos) << msg;
  EXPECT_NE(msg.find("No space left on device"), std::string::npos) << msg;
  EXPECT_NE(msg.find("free space in checkpoint.dir (/checkpoints/j)"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("PermanentError"), std::string::npos);
  EXPECT_FALSE(p.gangRestarted);
}

// ---- a gang that resumes behind where it stopped ------------------------------------------------

TEST(ClusterDay, AGangThatResumesBehindItsStopSaysSo) {
  json st = kRunning;
  st["progress"] = {{"step", 30}, {"totalSteps", 64}};
  PlanInput in = input({}, st);  // every pod gone (a drain): the gang is created again
  const Plan stop = planReconcile(in);
  EXPECT_EQ(stop.ranksToCreate.size(), 2u);
  EXPECT_EQ(js(stop.status)["stoppedAtStep"], 30);
  EXPECT_TRUE(stop.resetTelemetry);
  // That reconcile still sees the stopped gang's telemetry: no verdict from it.
  PlanInput stopSeen = input({}, st);
  stopSeen.telemetry.present = true;
  stopSeen.telemetry.lowestStep = 1;
  stopSeen.telemetry.progress.step = 30;
  const Plan stop2 = planReconcile(stopSeen);
  EXPECT_EQ(js(stop2.status)["stoppedAtStep"], 30);
  EXPECT_EQ(event(stop2, "ResumedFromOlderCheckpoint"), nullptr);
  // A gang restart keeps it too.
  PlanInput crash = input({{"runPolicy", {{"replicaRecovery", "GangRestart"}}}}, st);
  crash.pods = {pod(0, "Failed", 0, 1), pod(1, "Running")};
  const Plan restart = planReconcile(crash);
  EXPECT_TRUE(restart.gangRestarted);
  EXPECT_EQ(js(restart.status)["stoppedAtStep"], 30);

  // The new gang's first report was step 9 (it resumed from the checkpoint of step 8); the
  // reconcile that sees it may come several steps later (progress 14).
  PlanInput resumed = input({}, js(stop.status));
  resumed.status["phase"] = "Running";
  resumed.pods = {pod(0, "Running"), pod(1, "Running")};
  resumed.telemetry.present = true;
  resumed.telemetry.lowestStep = 9;
  resumed.telemetry.progress.step = 14;
  const Plan r = planReconcile(resumed);
  const PlannedEvent* e = event(r, "ResumedFromOlderCheckpoint");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->type, "Warning");
  EXPECT_NE(e->message.find("resumed at step 8, 22 steps before step 30"), std::string::npos) << e->message;
  EXPECT_NE(e->message.find("terminationGracePeriodSeconds, 31 s"), std::string::npos) << e->message;
  EXPECT_FALSE(js(r.status).contains("stoppedAtStep"));

  // Resumed from the checkpoint written on SIGTERM: nothing to say.
  resumed.telemetry.lowestStep = 31;
  resumed.telemetry.progress.step = 33;
  EXPECT_EQ(event(planReconcile(resumed), "ResumedFromOlderCheckpoint"), nullptr);
}

// ---- the grace period, periodic checkpoints, the pods' service account token ---------------

JobRef jobRef(json specExtra) {
  PlanInput in = input(std::move(specExtra));
  return JobRef{in.meta, *in.spec};
}

TEST(ClusterDay, GracePeriodFollowsWhatACheckpointCosts) {
  EXPECT_EQ(terminationGraceSeconds(jobRef({{"model", {{"preset", "tiny"}}}})), 31);
  // llama-350m: about 0.37e9 parameters, 24 bytes each in the local modes, over 2 shards.
  const long big = terminationGraceSeconds(jobRef({{"model", {{"preset", "llama-350m"}}}, {"shardsPerReplica", 2}}));
  EXPECT_GT(big, 100);
  EXPECT_LT(big, 130);
  EXPECT_LT(terminationGraceSeconds(jobRef({{"model", {{"preset", "llama-350m"}}}, {"shardsPerReplica", 8}})), big);
  EXPECT_EQ(terminationGraceSeconds(jobRef({{"terminationGracePeriodSeconds", 5}})), 5);

  const json pod = desiredPod(jobRef({{"terminationGracePeriodSeconds", 90}}), 0, 0, {});
  EXPECT_EQ(pod["spec"]["terminationGracePeriodSeconds"], 90);
  EXPECT_EQ(pod["spec"]["automountServiceAccountToken"], false);
}

TEST(ClusterDay, PeriodicCheckpointsByDefault) {
  EXPECT_NE(workerConfigYaml(jobRef({{"checkpoint", {{"dir", "/c"}}}})).find("everySteps: 500"), std::string::npos);
  EXPECT_NE(workerConfigYaml(jobRef({{"checkpoint", {{"dir", "/c"}, {"everySteps", 0}}}})).find("everySteps: 0"),
            std::string::npos);
}

// ---- what a job may not set in spec.env ------------------------------------------------------

TEST(ClusterDay, ReservedWorkerVariablesAreRefusedNamingTheEntry) {
  for (const char* name : {"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "EDIT_JOIN", "EDIT_TELEMETRY_TOKEN",
                           "EDIT_STORE_SECRET", "EDIT_BIND_ADDR", "POD_IP", "LOCAL_RANK"}) {
    try {
      input({{"env", json::array({{{"name", "OK"}, {"value", "1"}}, {{"name", name}, {"value", "0"}}})}});
      ADD_FAILURE() << name << " accepted";
    } catch (const api::SpecError& e) {
      EXPECT_EQ(e.field(), "spec.env[1].name");
      EXPECT_NE(std::string(e.what()).find(std::string(name) + " is set by the operator"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("remove it from spec.env"), std::string::npos);
    }
  }
  EXPECT_NO_THROW(input({{"env", json::array({{{"name", "EDIT_TELEMETRY_CA_FILE"}, {"value", "/ca"}}})}}));
}

// One list: every variable the operator puts on a worker (with TLS on, joining, scaling)
// is one a job may not set, except the two CA settings a job may point elsewhere.
TEST(ClusterDay, EveryVariableTheOperatorSetsIsReserved) {
  OperatorSettings tls{"op:9090", "ca-secret", "op.example"};
  for (PodJoin join : {PodJoin::Start, PodJoin::Replace, PodJoin::Scale}) {
    const json pod = desiredPod(jobRef({}), 1, 0, tls, {}, join);
    for (const auto& e : pod["spec"]["containers"][0]["env"]) {
      const std::string name = e["name"];
      if (name == "EDIT_TELEMETRY_CA_FILE" || name == "EDIT_TELEMETRY_SERVER_NAME") continue;
      EXPECT_NE(api::reservedWorkerEnv(name), nullptr) << name << " is set by the operator but not reserved";
    }
  }
}

// ---- a status someone else wrote meanwhile ---------------------------------------------------

TEST(ClusterDay, StatusConflictsMergeOrPlanAgain) {
  const json base = {{"phase", "Running"}, {"restarts", 0},
                     {"conditions", json::array({{{"type", "Running"}, {"status", "True"}}})}};
  json ours = base;
  ours["progress"] = {{"step", 10}};
  ours["conditions"].push_back({{"type", "StragglerDetected"}, {"status", "True"}});
  json theirs = base;
  theirs["replicas"] = 3;
  theirs["conditions"].push_back({{"type", "Scaling"}, {"status", "True"}});
  auto merged = mergeStatus(base, ours, theirs);
  ASSERT_TRUE(merged);
  EXPECT_EQ((*merged)["replicas"], 3);  // theirs kept
  EXPECT_EQ((*merged)["progress"]["step"], 10);  // ours applied
  std::set<std::string> types;
  for (const auto& c : (*merged)["conditions"]) types.insert(c["type"]);
  EXPECT_EQ(types, (std::set<std::string>{"Running", "StragglerDetected", "Scaling"}));
  // Both changed the same field to different values (another operator restarted the
  // gang): no merge, the reconcile plans again.
  json restarted = base;
  restarted["restarts"] = 1;
  json also = base;
  also["restarts"] = 1;
  also["phase"] = "Restarting";
  json mine = base;
  mine["phase"] = "Failed";
  EXPECT_FALSE(mergeStatus(base, mine, also));
  EXPECT_TRUE(mergeStatus(base, also, restarted));  // the same value: no conflict
}

}  // namespace
