// Job lifecycle against the stand-in: gang creation, Running -> Succeeded, the failure
// policy (restart, backoffLimit, permanent exit codes), suspend/resume, TTL, deadline,
// garbage collection and invalid specs.
#include <thread>

#include "integration_fixture.h"

namespace edit::op::testing {
namespace {

namespace res = kube::resources;

TEST_F(OperatorIntegration, RunsToSucceededWithChildren) {
  client->create(res::EDiTJobs, "default", shellJob("ok", 2, 2, "sleep 3; exit 0"));
  ASSERT_TRUE(waitPhase("ok", "Running")) << job("ok").dump(2);
  json ps = pods("ok");
  ASSERT_EQ(ps.size(), 4u);
  for (const auto& p : ps) {
    EXPECT_EQ(p["metadata"]["ownerReferences"][0]["kind"], "EDiTJob");
    EXPECT_EQ(p["spec"]["subdomain"], "ok");
  }
  auto svc = client->get(res::Services, "default", "ok");
  EXPECT_EQ(svc["spec"]["clusterIP"], "None");
  auto cm = client->get(res::ConfigMaps, "default", "ok-config");
  EXPECT_NE(cm["data"]["config.yaml"].get<std::string>().find("steps: 10"), std::string::npos);
  auto secret = client->get(res::Secrets, "default", "ok-telemetry");
  EXPECT_EQ(kube::base64Decode(secret["data"]["token"]).size(), 64u);

  ASSERT_TRUE(waitPhase("ok", "Succeeded")) << job("ok").dump(2);
  json j = job("ok");
  EXPECT_EQ(conditionStatus(j, "Succeeded"), "True");
  EXPECT_EQ(conditionStatus(j, "Running"), "False");
  EXPECT_EQ(conditionStatus(j, "Created"), "True");
  EXPECT_EQ(j["status"]["workers"]["succeeded"], 4);
  EXPECT_TRUE(j["status"].contains("startTime"));
  EXPECT_TRUE(j["status"].contains("completionTime"));
  EXPECT_EQ(j["status"]["observedGeneration"], j["metadata"]["generation"]);
  auto events = client->list(res::Events, "default")["items"];
  std::set<std::string> reasons;
  for (const auto& e : events)
    if (e["involvedObject"].value("name", "") == "ok") reasons.insert(e.value("reason", ""));
  EXPECT_TRUE(reasons.count("Created") && reasons.count("Running") && reasons.count("Succeeded"));
}

TEST_F(OperatorIntegration, FailedWorkerRestartsGangUntilBackoffLimit) {
  // GangRestart: with in-place recovery, rank 1 failing a moment before rank 0 would be replaced alone.
  client->create(res::EDiTJobs, "default",
                 shellJob("flaky", 2, 1, "sleep 1; exit 1", {{"backoffLimit", 2}, {"replicaRecovery", "GangRestart"}}));
  ASSERT_TRUE(waitPhase("flaky", "Failed", 60)) << job("flaky").dump(2);
  json j = job("flaky");
  EXPECT_EQ(j["status"]["restarts"], 2);
  EXPECT_EQ(j["status"]["restartGeneration"], 2);
  EXPECT_EQ(conditionReason(j, "Failed"), "BackoffLimitExceeded");
  // Never more than one gang at a time.
  for (const auto& p : pods("flaky")) EXPECT_EQ(p["metadata"]["labels"]["edit.io/restart-generation"], "2");
}

TEST_F(OperatorIntegration, FailedWorkerIsReplacedInPlace) {
  // Rank 1 fails once; its replacement (EDIT_JOIN=1, same generation) and rank 0 finish.
  client->create(res::EDiTJobs, "default",
                 shellJob("heal", 2, 1,
                          "if [ \"$RANK\" = 1 ] && [ \"${EDIT_JOIN:-0}\" != 1 ]; then sleep 2; exit 137; fi; sleep 8; exit 0"));
  ASSERT_TRUE(waitPhase("heal", "Succeeded", 60)) << job("heal").dump(2);
  json j = job("heal");
  EXPECT_EQ(j["status"].value("restarts", 0), 0);
  EXPECT_EQ(j["status"].value("replicaRecoveries", 0), 1);
  EXPECT_FALSE(j["status"].contains("recovery"));
  EXPECT_EQ(conditionReason(j, "Recovering"), "Recovered");
  for (const auto& p : pods("heal")) {
    EXPECT_EQ(p["metadata"]["labels"]["edit.io/restart-generation"], "0");
    bool joins = false;
    for (const auto& e : p["spec"]["containers"][0]["env"]) joins |= e.value("name", "") == "EDIT_JOIN";
    EXPECT_EQ(joins, p["metadata"]["name"] == "heal-worker-1") << p["metadata"]["name"];
  }
  const json events = client->list(res::Events, "default");
  std::set<std::string> reasons;
  for (const auto& e : events["items"])
    if (e["involvedObject"].value("name", "") == "heal") reasons.insert(e.value("reason", ""));
  EXPECT_TRUE(reasons.count("RecoveringReplica") && reasons.count("ReplicaRecovered")) << ::testing::PrintToString(reasons);
  EXPECT_FALSE(reasons.count("Restarting"));
}

TEST_F(OperatorIntegration, PermanentExitCodeFailsWithoutRestart) {
  client->create(res::EDiTJobs, "default", shellJob("bad", 2, 1, "exit 2"));
  ASSERT_TRUE(waitPhase("bad", "Failed")) << job("bad").dump(2);
  json j = job("bad");
  EXPECT_EQ(conditionReason(j, "Failed"), "PermanentError");
  EXPECT_EQ(j["status"].value("restarts", 0), 0);
}

TEST_F(OperatorIntegration, SuspendAndResume) {
  client->create(res::EDiTJobs, "default", shellJob("pause", 2, 1, "sleep 120"));
  ASSERT_TRUE(waitPhase("pause", "Running"));
  client->mergePatch(res::EDiTJobs, "default", "pause", {{"spec", {{"runPolicy", {{"suspend", true}}}}}});
  ASSERT_TRUE(waitPhase("pause", "Suspended"));
  ASSERT_TRUE(waitFor([&] { return pods("pause").empty(); }, std::chrono::seconds(30)));
  EXPECT_EQ(conditionStatus(job("pause"), "Suspended"), "True");
  client->mergePatch(res::EDiTJobs, "default", "pause", {{"spec", {{"runPolicy", {{"suspend", false}}}}}});
  ASSERT_TRUE(waitPhase("pause", "Running")) << job("pause").dump(2);
  EXPECT_EQ(pods("pause").size(), 2u);
  EXPECT_EQ(conditionStatus(job("pause"), "Suspended"), "False");
}

TEST_F(OperatorIntegration, TtlDeletesFinishedJob) {
  client->create(res::EDiTJobs, "default", shellJob("short", 1, 1, "exit 0", {{"ttlSecondsAfterFinished", 2}}));
  ASSERT_TRUE(waitPhase("short", "Succeeded"));
  EXPECT_TRUE(waitFor([&] { return !client->tryGet(res::EDiTJobs, "default", "short"); }, std::chrono::seconds(20)));
}

TEST_F(OperatorIntegration, ActiveDeadlineFailsJob) {
  client->create(res::EDiTJobs, "default", shellJob("slow", 1, 1, "sleep 120", {{"activeDeadlineSeconds", 3}}));
  ASSERT_TRUE(waitPhase("slow", "Failed", 30)) << job("slow").dump(2);
  EXPECT_EQ(conditionReason(job("slow"), "Failed"), "DeadlineExceeded");
  EXPECT_TRUE(waitFor([&] { return pods("slow").empty(); }, std::chrono::seconds(30)));
}

TEST_F(OperatorIntegration, DeletingJobDeletesItsPods) {
  client->create(res::EDiTJobs, "default", shellJob("gone", 2, 1, "sleep 120"));
  ASSERT_TRUE(waitPhase("gone", "Running"));
  client->remove(res::EDiTJobs, "default", "gone", "Background");
  EXPECT_TRUE(waitFor([&] { return pods("gone").empty(); }, std::chrono::seconds(40)));
  EXPECT_TRUE(waitFor([&] { return !client->tryGet(res::Services, "default", "gone"); }, std::chrono::seconds(20)));
}

TEST_F(OperatorIntegration, InvalidSpecFailsWithoutCreatingAnything) {
  std::string name(58, 'x');  // pod hostnames would exceed 63 characters
  client->create(res::EDiTJobs, "default", shellJob(name, 2, 1, "exit 0"));
  ASSERT_TRUE(waitPhase(name, "Failed")) << job(name).dump(2);
  json j = job(name);
  EXPECT_EQ(conditionReason(j, "Failed"), "InvalidSpec");
  EXPECT_NE(j["status"]["message"].get<std::string>().find("metadata.name"), std::string::npos);
  EXPECT_TRUE(pods(name).empty());
  EXPECT_FALSE(client->tryGet(res::Services, "default", name).has_value());
}

// The CRD admits it (no CEL rule can see a preset's dim), a worker would exit 2: the
// operator runs the runtime's parser first and fails the job with its message.
TEST_F(OperatorIntegration, WorkerConfigTheRuntimeRefusesFailsBeforeAnyPod) {
  json j = shellJob("badheads", 2, 1, "exit 0");
  j["spec"]["model"] = {{"preset", "llama-1b"}, {"heads", 3}};
  client->create(res::EDiTJobs, "default", j);
  ASSERT_TRUE(waitPhase("badheads", "Failed")) << job("badheads").dump(2);
  json got = job("badheads");
  EXPECT_EQ(conditionReason(got, "Failed"), "InvalidSpec");
  const std::string msg = got["status"]["message"];
  EXPECT_EQ(msg.rfind("spec.model.heads: must divide model.dim", 0), 0u) << msg;
  EXPECT_TRUE(pods("badheads").empty());
  EXPECT_FALSE(client->tryGet(res::ConfigMaps, "default", "badheads-config").has_value());
}

// A node drain evicts a worker (Eviction API: DisruptionTarget, then SIGTERM). Like
// edit-train when SIGTERM reaches it and not the whole gang, the worker leaves (exit 76)
// and its pod goes; the operator replaces that rank in place (EDIT_JOIN=1) while the other
// keeps running. The disruption is free: backoffLimit 0 is not spent. A crash of its own
// afterwards fails the job.
TEST_F(OperatorIntegration, EvictionReplacesTheWorkerInPlaceWithoutSpendingBackoffLimit) {
  const std::string done = "$STANDIN_POD_DIR/../done-$EDIT_JOB";
  client->create(res::EDiTJobs, "default",
                 shellJob("drained", 2, 1,
                          "trap 'exit 76' TERM; while [ ! -e " + done + " ]; do sleep 0.2; done; exit 0",
                          {{"backoffLimit", 0}}));
  ASSERT_TRUE(waitPhase("drained", "Running")) << job("drained").dump(2);
  const std::string survivorUid = client->get(res::Pods, "default", "drained-worker-1")["metadata"]["uid"];
  auto [code, body] = httpPost(standin->url() + "/api/v1/namespaces/default/pods/drained-worker-0/eviction",
                               {{"apiVersion", "policy/v1"}, {"kind", "Eviction"},
                                {"metadata", {{"name", "drained-worker-0"}}},
                                {"deleteOptions", {{"gracePeriodSeconds", 5}}}});
  ASSERT_EQ(code, 201) << body;
  ASSERT_TRUE(waitFor([&] { return job("drained")["status"].value("replicaRecoveries", 0) == 1; },
                      std::chrono::seconds(40)))
      << job("drained").dump(2);
  // The replacement joins the running gang; the survivor was never restarted.
  ASSERT_TRUE(waitFor([&] {
    auto p = client->tryGet(res::Pods, "default", "drained-worker-0");
    return p && p->dump().find("EDIT_JOIN") != std::string::npos && (*p)["status"].value("phase", "") == "Running";
  }, std::chrono::seconds(40))) << job("drained").dump(2);
  EXPECT_EQ(client->get(res::Pods, "default", "drained-worker-1")["metadata"]["uid"], survivorUid);
  json j = job("drained");
  EXPECT_EQ(j["status"].value("restarts", 0), 0);
  EXPECT_EQ(j["status"]["phase"], "Running");
  EXPECT_EQ(j["status"]["disruptions"], 1);
  EXPECT_EQ(conditionStatus(j, "Disrupted"), "False");
  auto events = client->list(res::Events, "default")["items"];
  bool disruptedEvent = false;
  for (const auto& e : events)
    if (e["involvedObject"].value("name", "") == "drained" && e.value("reason", "") == "Disrupted") disruptedEvent = true;
  EXPECT_TRUE(disruptedEvent);

  // A failure of its own (SIGKILL: 137) is charged: the budget of 0 is spent.
  auto [kcode, kbody] = httpPost(standin->url() + "/standin/kill?namespace=default&pod=drained-worker-1&signal=KILL", json::object());
  ASSERT_EQ(kcode, 200) << kbody;
  ASSERT_TRUE(waitPhase("drained", "Failed")) << job("drained").dump(2);
  EXPECT_EQ(conditionReason(job("drained"), "Failed"), "BackoffLimitExceeded");
}

// A pod the API refuses (here Pod Security) is a Warning event FailedCreate on the job
// with the API's message, not only a line in the operator's log.
TEST_F(OperatorIntegration, RefusedPodIsAFailedCreateEvent) {
  runShell(std::string(KUBECTL) + " --kubeconfig " + standin->kubeconfig() +
           " label namespace default pod-security.kubernetes.io/enforce=restricted --overwrite > /dev/null");
  json jobObj = shellJob("rooted", 1, 1, "sleep 60");
  jobObj["spec"]["podTemplate"] = {{"spec", {{"containerSecurityContext", {{"privileged", true}}}}}};
  client->create(res::EDiTJobs, "default", jobObj);
  client->create(res::EDiTJobs, "default", shellJob("fine", 1, 1, "exit 0"));  // restricted by default
  json ev;
  ASSERT_TRUE(waitFor([&] {
    const json events = client->list(res::Events, "default")["items"];  // not a temporary's member
    for (const auto& e : events)
      if (e["involvedObject"].value("name", "") == "rooted" && e.value("reason", "") == "FailedCreate") {
        ev = e;
        return true;
      }
    return false;
  }, std::chrono::seconds(30)));
  EXPECT_EQ(ev["type"], "Warning");
  const std::string msg = ev["message"];
  EXPECT_NE(msg.find("Error creating pod rooted-worker-0: pods \"rooted-worker-0\" is forbidden: violates PodSecurity"),
            std::string::npos) << msg;
  EXPECT_NE(msg.find("privileged"), std::string::npos) << msg;
  EXPECT_TRUE(pods("rooted").empty());
  ASSERT_TRUE(waitPhase("fine", "Succeeded")) << job("fine").dump(2);
  // Retries that fail the same way do not add an event each.
  std::this_thread::sleep_for(std::chrono::seconds(3));
  int n = 0;
  json seen = json::array();
  const json events = client->list(res::Events, "default")["items"];
  for (const auto& e : events)
    if (e["involvedObject"].value("name", "") == "rooted" && e.value("reason", "") == "FailedCreate") {
      n++;
      seen.push_back(e);
    }
  EXPECT_EQ(n, 1) << seen.dump(2);
}

// The chart passes ':PORT' (every IPv4 address); bad addresses stop the operator at
// once with the flag named (exit 2).
TEST_F(OperatorIntegration, ListenAddressForms) {
  OperatorProcess colon(dir + "/operator-colon.log");
  colon.start(standin->kubeconfig(), {"--metrics-addr=:0", "--health-addr=:0", "--grpc-addr=:0"});
  EXPECT_EQ(colon.metricsAddr.rfind("0.0.0.0:", 0), 0u) << colon.metricsAddr;
  const std::string port = colon.metricsAddr.substr(colon.metricsAddr.rfind(':') + 1);
  EXPECT_NE(httpGet("http://127.0.0.1:" + port + "/metrics").second.find("edit_operator_leader"), std::string::npos);
  const std::string hport = colon.healthAddr.substr(colon.healthAddr.rfind(':') + 1);
  EXPECT_EQ(httpGet("http://127.0.0.1:" + hport + "/readyz").first, 200);
  colon.signal(SIGTERM);
  EXPECT_EQ(colon.wait(std::chrono::seconds(10)), 0);

  for (const auto& [flag, value] : std::vector<std::pair<std::string, std::string>>{
           {"--metrics-addr", "8080"}, {"--grpc-addr", ":99999"}, {"--health-addr", "host:port"}}) {
    Process p;
    const std::string log = dir + "/bad" + flag + ".log";
    p.start({EDIT_OPERATOR_BIN, "--kubeconfig", standin->kubeconfig(), flag + "=" + value}, log);
    EXPECT_EQ(p.wait(std::chrono::seconds(10)), 2) << flag;
    const std::string text = readFile(log);
    EXPECT_NE(text.find(flag + ": "), std::string::npos) << text;
    EXPECT_NE(text.find(":PORT"), std::string::npos) << text;
  }
}

TEST_F(OperatorIntegration, HealthAndMetricsEndpoints) {
  EXPECT_TRUE(waitFor([&] { return httpGet("http://" + op->healthAddr + "/readyz").first == 200; }, std::chrono::seconds(10)));
  EXPECT_EQ(httpGet("http://" + op->healthAddr + "/healthz").first, 200);
  client->create(res::EDiTJobs, "default", shellJob("m", 1, 1, "exit 0"));
  ASSERT_TRUE(waitPhase("m", "Succeeded"));
  ASSERT_TRUE(waitFor([&] {
    return httpGet("http://" + op->metricsAddr + "/metrics").second.find("edit_operator_jobs_succeeded_total 1") != std::string::npos;
  }, std::chrono::seconds(10)));
  auto body = httpGet("http://" + op->metricsAddr + "/metrics").second;
  EXPECT_NE(body.find("edit_job_phase{job=\"m\",namespace=\"default\",phase=\"Succeeded\"} 1"), std::string::npos) << body;
  EXPECT_NE(body.find("edit_operator_reconcile_total{result=\"success\"}"), std::string::npos);
  // Deleting the job removes its series.
  client->remove(res::EDiTJobs, "default", "m", "Background");
  EXPECT_TRUE(waitFor([&] {
    return httpGet("http://" + op->metricsAddr + "/metrics").second.find("job=\"m\"") == std::string::npos;
  }, std::chrono::seconds(20)));
}

}  // namespace
}  // namespace edit::op::testing
