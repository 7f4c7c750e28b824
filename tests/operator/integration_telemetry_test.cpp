// Telemetry over gRPC from fake workers: straggler score in /metrics and .status,
// wrong tokens rejected, hang detection, and promtool accepting the exposition.
#include <grpcpp/grpcpp.h>

#include <fstream>
#include <regex>

#include "edit/v1alpha1/telemetry.grpc.pb.h"
#include "integration_fixture.h"

namespace edit::op::testing {
namespace {

namespace res = kube::resources;
namespace pb = edit::v1alpha1;

json telemetryJob(const std::string& name, int replicas, json extra) {
  json j = shellJob(name, replicas, 1, "sleep 120");
  j["spec"].update(extra);
  return j;
}

pb::WorkerReport report(const std::string& job, const std::string& token, int rank, int64_t step, double stepSeconds) {
  pb::WorkerReport r;
  r.set_namespace_("default");
  r.set_job(job);
  r.set_token(token);
  r.set_rank(rank);
  r.set_replica(rank);
  r.set_shard(0);
  r.set_pod(job + "-worker-" + std::to_string(rank));
  r.set_node("node-0");
  r.set_step(step);
  r.set_total_steps(100);
  r.set_loss(2.0);
  r.set_tokens(static_cast<uint64_t>(step) * 1024);
  r.set_step_seconds(stepSeconds);
  r.set_comm_wait_seconds(0.01 * static_cast<double>(step));
  auto* c = r.add_comm();
  c->set_op("allreduce");
  c->set_group("sync");
  c->set_bytes(static_cast<uint64_t>(step) * 4096);
  return r;
}

// Streams `reports` on one stream and returns the final status.
grpc::Status stream(const std::string& addr, const std::vector<pb::WorkerReport>& reports) {
  auto channel = grpc::CreateChannel(addr, grpc::InsecureChannelCredentials());
  auto stub = pb::Telemetry::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  auto s = stub->Stream(&ctx);
  for (const auto& r : reports)
    if (!s->Write(r)) break;
  s->WritesDone();
  pb::Command cmd;
  while (s->Read(&cmd)) {
  }
  return s->Finish();
}

std::string token(kube::Client& c, const std::string& job) {
  auto secret = c.get(res::Secrets, "default", job + "-telemetry");
  return kube::base64Decode(secret["data"]["token"].get<std::string>());
}

std::map<std::string, double> scoresByRank(const std::string& metrics, const std::string& job) {
  std::map<std::string, double> out;
  std::regex line("edit_worker_straggler_score\\{([^}]*)\\} ([0-9.e+-]+)");
  std::regex rank("rank=\"([0-9]+)\"");
  for (std::sregex_iterator it(metrics.begin(), metrics.end(), line), end; it != end; ++it) {
    std::string labels = (*it)[1];
    if (labels.find("job=\"" + job + "\"") == std::string::npos) continue;
    std::smatch m;
    if (std::regex_search(labels, m, rank)) out[m[1]] = std::stod((*it)[2]);
  }
  return out;
}

TEST_F(OperatorIntegration, StragglerDetectedFromTelemetry) {
  client->create(res::EDiTJobs, "default",
                 telemetryJob("tele", 4, {{"stragglerPolicy", {{"threshold", 1.5}, {"windowSteps", 5}, {"minReports", 3}}}}));
  ASSERT_TRUE(waitPhase("tele", "Running"));
  std::string tok = token(*client, "tele");
  for (int rank = 0; rank < 4; ++rank) {
    std::vector<pb::WorkerReport> rs;
    for (int step = 1; step <= 8; ++step) rs.push_back(report("tele", tok, rank, step, rank == 2 ? 0.4 : 0.1));
    ASSERT_TRUE(stream(op->grpcAddr, rs).ok());
  }
  std::string body;
  ASSERT_TRUE(waitFor([&] {
    body = httpGet("http://" + op->metricsAddr + "/metrics").second;
    return scoresByRank(body, "tele").size() == 4;
  }, std::chrono::seconds(10)));
  auto scores = scoresByRank(body, "tele");
  EXPECT_GT(scores["2"], 1.5);
  for (const char* r : {"0", "1", "3"}) EXPECT_LT(scores[r], 1.5) << "rank " << r;
  EXPECT_NE(body.find("edit_job_stragglers{job=\"tele\",namespace=\"default\"} 1"), std::string::npos);
  EXPECT_NE(body.find("edit_worker_comm_bytes_total{"), std::string::npos);
  EXPECT_NE(body.find("edit_worker_last_report_age_seconds{"), std::string::npos);

  ASSERT_TRUE(waitFor([&] { return conditionStatus(job("tele"), "StragglerDetected") == "True"; }, std::chrono::seconds(15)));
  json st = job("tele")["status"];
  ASSERT_EQ(st["stragglers"].size(), 1u);
  EXPECT_EQ(st["stragglers"][0]["rank"], 2);
  EXPECT_EQ(st["stragglerCount"], 1);
  EXPECT_EQ(st["progress"]["step"], 8);
  EXPECT_EQ(st["progress"]["tokens"], 4 * 8 * 1024);
  EXPECT_TRUE(st.contains("lastReportTime"));

  // promtool accepts the exposition format.
  std::ofstream(dir + "/scrape.txt") << body;
  EXPECT_EQ(runShell(std::string(PROMTOOL) + " check metrics < " + dir + "/scrape.txt > " + dir + "/promtool.log 2>&1"), 0)
      << readFile(dir + "/promtool.log");
}

TEST_F(OperatorIntegration, ReplaceActionRecreatesStragglerAwayFromItsNode) {
  client->create(res::EDiTJobs, "default",
                 telemetryJob("repl", 3, {{"stragglerPolicy", {{"threshold", 1.5}, {"windowSteps", 5}, {"minReports", 3},
                                                               {"action", "Replace"}}}}));
  ASSERT_TRUE(waitPhase("repl", "Running"));
  json old = client->get(res::Pods, "default", "repl-worker-1");
  std::string oldUid = old["metadata"]["uid"], oldNode = old["spec"].value("nodeName", "");
  ASSERT_FALSE(oldNode.empty());
  std::string tok = token(*client, "repl");
  for (int rank = 0; rank < 3; ++rank) {
    std::vector<pb::WorkerReport> rs;
    for (int step = 1; step <= 6; ++step) rs.push_back(report("repl", tok, rank, step, rank == 1 ? 0.5 : 0.1));
    ASSERT_TRUE(stream(op->grpcAddr, rs).ok());
  }
  json fresh;
  ASSERT_TRUE(waitFor([&] {
    auto p = client->tryGet(res::Pods, "default", "repl-worker-1");
    if (!p || (*p)["metadata"]["uid"] == oldUid) return false;
    fresh = *p;
    return true;
  }, std::chrono::seconds(40))) << job("repl").dump(2);
  const json& expr = fresh["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
                          ["nodeSelectorTerms"][0]["matchExpressions"][0];
  EXPECT_EQ(expr["operator"], "NotIn");
  EXPECT_EQ(expr["values"], json::array({oldNode}));
  // Remembered in the status (an operator restart keeps it).
  EXPECT_EQ(job("repl")["status"]["avoidNodes"], json::array({{{"rank", 1}, {"node", oldNode}}}));
  // Only the straggler was replaced, in place: its new pod joins the running job.
  EXPECT_EQ(pods("repl").size(), 3u);
  EXPECT_EQ(job("repl")["status"].value("restarts", 0), 0);
  EXPECT_EQ(job("repl")["status"].value("replicaRecoveries", 0), 1);
  std::string join;
  for (const auto& e : fresh["spec"]["containers"][0]["env"])
    if (e.value("name", "") == "EDIT_JOIN") join = e.value("value", "");
  EXPECT_EQ(join, "1");
}

TEST_F(OperatorIntegration, WrongTokenIsRejected) {
  client->create(res::EDiTJobs, "default", telemetryJob("sec", 1, json::object()));
  ASSERT_TRUE(waitPhase("sec", "Running"));
  grpc::Status wrong = stream(op->grpcAddr, {report("sec", "not-the-token", 0, 1, 0.1)});
  EXPECT_EQ(wrong.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  grpc::Status unknown = stream(op->grpcAddr, {report("nosuchjob", token(*client, "sec"), 0, 1, 0.1)});
  EXPECT_EQ(unknown.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_TRUE(stream(op->grpcAddr, {report("sec", token(*client, "sec"), 0, 1, 0.1)}).ok());
  EXPECT_EQ(op->logs().find(token(*client, "sec")), std::string::npos);  // tokens are never logged
}

// A hang: rank 1 fell silent (stopped, frozen) while rank 0 keeps reporting the same step
// (it waits for rank 1 in a collective). Under GangRestart the gang restarts. (Every
// worker silent is TelemetryLost, never a restart: test_hang_faults.py.)
TEST_F(OperatorIntegration, HungJobRestartsGang) {
  json j0 = telemetryJob("hang", 2, {{"hangTimeoutSeconds", 2}});
  j0["spec"]["runPolicy"]["replicaRecovery"] = "GangRestart";
  client->create(res::EDiTJobs, "default", j0);
  ASSERT_TRUE(waitPhase("hang", "Running"));
  std::string tok = token(*client, "hang");
  for (int rank = 0; rank < 2; ++rank) ASSERT_TRUE(stream(op->grpcAddr, {report("hang", tok, rank, 3, 0.1)}).ok());
  ASSERT_TRUE(waitFor([&] {
    EXPECT_TRUE(stream(op->grpcAddr, {report("hang", tok, 0, 3, 0.1)}).ok());  // alive, no progress
    return job("hang")["status"].value("restarts", 0) >= 1;
  }, std::chrono::seconds(30))) << job("hang").dump(2);
  // A hung gang is deleted without a grace period, so the new one may already be running:
  // the Hung condition is then False/Recovered. Either way the restart was for the hang.
  json j = job("hang");
  const std::string hung = conditionStatus(j, "Hung");
  EXPECT_TRUE(hung == "True" || (hung == "False" && conditionReason(j, "Hung") == "Recovered")) << j.dump(2);
  ASSERT_TRUE(waitPhase("hang", "Running"));
}

}  // namespace
}  // namespace edit::op::testing
