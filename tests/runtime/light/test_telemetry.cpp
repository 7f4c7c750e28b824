// /metrics over a real socket, and the gRPC report stream against an in-process server.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "edit/v1alpha1/telemetry.grpc.pb.h"
#include "telemetry/telemetry.h"

namespace pb = edit::v1alpha1;
using namespace std::chrono_literals;

namespace {

std::string httpGet(int port, const std::string& path) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    close(fd);
    return "";
  }
  const std::string req = "GET " + path + " HTTP/1.0\r\nHost: localhost\r\n\r\n";
  if (write(fd, req.data(), req.size()) != static_cast<ssize_t>(req.size())) {
    close(fd);
    return "";
  }
  std::string resp;
  char buf[4096];
  ssize_t n;
  while ((n = read(fd, buf, sizeof buf)) > 0) resp.append(buf, static_cast<size_t>(n));
  close(fd);
  return resp;
}

// One sample of the text exposition format: name, labels, value.
struct Sample {
  std::string name;
  std::map<std::string, std::string> labels;
  double value;
};

std::vector<Sample> parseSamples(const std::string& body) {
  std::vector<Sample> out;
  size_t pos = 0;
  while (pos < body.size()) {
    size_t eol = body.find('\n', pos);
    std::string line = body.substr(pos, eol == std::string::npos ? std::string::npos : eol - pos);
    pos = eol == std::string::npos ? body.size() : eol + 1;
    if (line.empty() || line[0] == '#') continue;
    Sample s;
    size_t brace = line.find('{'), space;
    if (brace != std::string::npos) {
      s.name = line.substr(0, brace);
      size_t close = line.find('}', brace);
      std::string inner = line.substr(brace + 1, close - brace - 1);
      size_t p = 0;
      while (p < inner.size()) {
        size_t eq = inner.find('=', p);
        size_t q2 = inner.find('"', eq + 2);
        s.labels[inner.substr(p, eq - p)] = inner.substr(eq + 2, q2 - eq - 2);
        p = q2 + 2;  // skip '",'
      }
      space = close + 1;
    } else {
      space = line.find(' ');
      s.name = line.substr(0, space);
    }
    s.value = std::stod(line.substr(space + 1));
    out.push_back(s);
  }
  return out;
}

const Sample* find(const std::vector<Sample>& all, const std::string& name,
                   const std::map<std::string, std::string>& extra = {}) {
  for (const auto& s : all) {
    if (s.name != name) continue;
    bool ok = true;
    for (const auto& [k, v] : extra) ok = ok && s.labels.count(k) && s.labels.at(k) == v;
    if (ok) return &s;
  }
  return nullptr;
}

edit::StepReport sampleReport() {
  edit::StepReport r;
  r.rank = 3;
  r.replica = 1;
  r.shard = 1;
  r.worldSize = 4;
  r.replicas = 2;
  r.step = 12;
  r.totalSteps = 100;
  r.loss = 2.75;
  r.tokens = 4096;
  r.stepSeconds = 0.125;
  r.computeSeconds = 0.1;
  r.commWaitSeconds = 0.5;
  r.lastSyncDurationSeconds = 0.25;
  r.synced = true;
  r.syncRounds = 2;
  r.anomalies = 1;
  r.outerSkips = 2;
  r.skipStreak = 2;
  r.pseudoGradNorm = 1.5;
  r.lr = 1e-3;
  r.phase = "sync";
  r.comm[{"allgather", "shard"}] = {1000, 0.2, 10};
  r.comm[{"allreduce", "sync"}] = {500, 0.3, 2};
  return r;
}

}  // namespace

TEST(Telemetry, MetricsEndpointServesEveryMetric) {
  edit::WorkerMetrics m("127.0.0.1", 0, "job-a", 3, 1, 1);
  ASSERT_GT(m.port(), 0);
  edit::StepReport r = sampleReport();
  m.update(r);
  r.step = 13;
  r.tokens = 8192;
  r.comm[{"allgather", "shard"}].bytes = 1500;
  r.comm[{"allgather", "shard"}].waitSeconds = 0.4;
  r.synced = false;
  m.update(r);

  const std::string resp = httpGet(m.port(), "/metrics");
  ASSERT_NE(resp.find("200"), std::string::npos) << resp;
  const std::string body = resp.substr(resp.find("\r\n\r\n") + 4);
  const auto samples = parseSamples(body);
  const std::map<std::string, std::string> id = {{"job", "job-a"}, {"rank", "3"}, {"replica", "1"}, {"shard", "1"}};

  for (const char* name : {"edit_train_step_seconds_count", "edit_train_loss", "edit_train_tokens_total",
                           "edit_sync_rounds_total", "edit_sync_seconds_count", "edit_comm_bytes_total",
                           "edit_comm_wait_seconds_total", "edit_pseudo_grad_norm",
                           "edit_pseudo_grad_anomalies_total", "edit_outer_steps_skipped_total",
                           "edit_outer_step_skip_streak"}) {
    const Sample* s = find(samples, name);
    ASSERT_NE(s, nullptr) << name << " missing in\n" << body;
    for (const auto& [k, v] : id) EXPECT_EQ(s->labels.count(k) ? s->labels.at(k) : "", v) << name << " " << k;
  }
  EXPECT_DOUBLE_EQ(find(samples, "edit_train_step_seconds_count")->value, 2);
  EXPECT_DOUBLE_EQ(find(samples, "edit_train_step_seconds_sum")->value, 0.25);
  int buckets = 0;
  for (const auto& s : samples) buckets += s.name == "edit_train_step_seconds_bucket";
  EXPECT_EQ(buckets, 17);  // 1 ms .. 60 s plus +Inf
  EXPECT_NE(find(samples, "edit_train_step_seconds_bucket", {{"le", "+Inf"}}), nullptr);
  EXPECT_DOUBLE_EQ(find(samples, "edit_sync_seconds_count")->value, 1);  // synced once
  EXPECT_DOUBLE_EQ(find(samples, "edit_train_loss")->value, 2.75);
  EXPECT_DOUBLE_EQ(find(samples, "edit_train_tokens_total")->value, 8192);  // cumulative, not summed
  EXPECT_DOUBLE_EQ(find(samples, "edit_sync_rounds_total")->value, 2);
  EXPECT_DOUBLE_EQ(find(samples, "edit_pseudo_grad_norm")->value, 1.5);
  EXPECT_DOUBLE_EQ(find(samples, "edit_pseudo_grad_anomalies_total")->value, 1);
  EXPECT_DOUBLE_EQ(find(samples, "edit_outer_steps_skipped_total")->value, 2);  // cumulative, not summed
  EXPECT_DOUBLE_EQ(find(samples, "edit_outer_step_skip_streak")->value, 2);
  const Sample* ag = find(samples, "edit_comm_bytes_total", {{"op", "allgather"}, {"group", "shard"}});
  ASSERT_NE(ag, nullptr);
  EXPECT_DOUBLE_EQ(ag->value, 1500);
  const Sample* ar = find(samples, "edit_comm_bytes_total", {{"op", "allreduce"}, {"group", "sync"}});
  ASSERT_NE(ar, nullptr);
  EXPECT_DOUBLE_EQ(ar->value, 500);
  const Sample* ws = find(samples, "edit_comm_wait_seconds_total", {{"group", "shard"}});
  ASSERT_NE(ws, nullptr);
  EXPECT_DOUBLE_EQ(ws->value, 0.4);
  EXPECT_EQ(ws->labels.count("op"), 0u);
  EXPECT_NE(body.find("# TYPE edit_train_step_seconds histogram"), std::string::npos);
  EXPECT_NE(body.find("# TYPE edit_sync_seconds histogram"), std::string::npos);
  EXPECT_NE(body.find("# TYPE edit_train_tokens_total counter"), std::string::npos);
  EXPECT_NE(body.find("# TYPE edit_train_loss gauge"), std::string::npos);

  // Validate the exposition with Prometheus's own linter when it is installed.
  if (access("/usr/bin/promtool", X_OK) == 0) {
    char tmpl[] = "/tmp/edit-metrics-XXXXXX";
    int fd = mkstemp(tmpl);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(write(fd, body.data(), body.size()), static_cast<ssize_t>(body.size()));
    close(fd);
    const std::string cmd = std::string("/usr/bin/promtool check metrics < ") + tmpl + " 2>&1";
    FILE* p = popen(cmd.c_str(), "r");
    std::string out;
    char buf[512];
    while (fgets(buf, sizeof buf, p)) out += buf;
    const int rc = pclose(p);
    unlink(tmpl);
    EXPECT_EQ(rc, 0) << out;
  }
}

namespace {

pb::Command command(pb::Command::Kind kind, int replicas = 0) {
  pb::Command c;
  c.set_kind(kind);
  c.set_reason("test");
  c.set_replicas(replicas);
  return c;
}

// A minimal operator: records reports and answers the first one with `answers` (STOP
// unless a test says otherwise).
class FakeOperator final : public pb::Telemetry::Service {
 public:
  grpc::Status Stream(grpc::ServerContext*, grpc::ServerReaderWriter<pb::Command, pb::WorkerReport>* s) override {
    pb::WorkerReport r;
    bool answered = false;
    while (s->Read(&r)) {
      {
        std::lock_guard<std::mutex> lock(mu);
        reports.push_back(r);
      }
      cv.notify_all();
      if (!answered) {
        for (const auto& c : answers) s->Write(c);
        answered = true;
      }
    }
    return grpc::Status::OK;
  }
  std::vector<pb::Command> answers = {command(pb::Command::STOP)};
  bool waitForReports(size_t n, std::chrono::seconds timeout) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, timeout, [&] { return reports.size() >= n; });
  }
  std::mutex mu;
  std::condition_variable cv;
  std::vector<pb::WorkerReport> reports;
};

std::unique_ptr<grpc::Server> startServer(FakeOperator& svc, const std::string& addr, int* port) {
  grpc::ServerBuilder b;
  b.AddListeningPort(addr, grpc::InsecureServerCredentials(), port);
  b.RegisterService(&svc);
  return b.BuildAndStart();
}

template <typename F>
bool eventually(F f, std::chrono::milliseconds timeout) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < end) {
    if (f()) return true;
    std::this_thread::sleep_for(10ms);
  }
  return f();
}

}  // namespace

TEST(Telemetry, ClientDeliversReportsAndReceivesStop) {
  FakeOperator svc;
  int port = 0;
  auto server = startServer(svc, "127.0.0.1:0", &port);
  ASSERT_TRUE(server);
  ASSERT_GT(port, 0);
  {
    edit::TelemetryClient client("127.0.0.1:" + std::to_string(port), "tok-123",
                                 edit::TelemetryIdentity{"ns-a", "job-a", "pod-3", "uid-3", "node-x", 2});
    client.send(sampleReport());
    ASSERT_TRUE(svc.waitForReports(1, 10s));
    ASSERT_TRUE(eventually([&] { return client.takeCommand() == edit::OperatorCommand::Stop; }, 10000ms));
    EXPECT_EQ(client.takeCommand(), edit::OperatorCommand::None);  // taken once
    EXPECT_TRUE(client.connected());

    pb::WorkerReport r;
    {
      std::lock_guard<std::mutex> lock(svc.mu);
      r = svc.reports.front();
    }
    EXPECT_EQ(r.namespace_(), "ns-a");
    EXPECT_EQ(r.job(), "job-a");
    EXPECT_EQ(r.token(), "tok-123");
    EXPECT_EQ(r.pod(), "pod-3");
    EXPECT_EQ(r.node(), "node-x");
    EXPECT_EQ(r.pod_uid(), "uid-3");
    EXPECT_EQ(r.restart_generation(), 2);  // the operator drops reports of older gangs
    EXPECT_EQ(r.rank(), 3);
    EXPECT_EQ(r.replica(), 1);
    EXPECT_EQ(r.shard(), 1);
    EXPECT_EQ(r.replicas(), 2);
    EXPECT_EQ(r.step(), 12);
    EXPECT_EQ(r.total_steps(), 100);
    EXPECT_DOUBLE_EQ(r.loss(), 2.75);
    EXPECT_EQ(r.tokens(), 4096u);
    EXPECT_EQ(r.sync_rounds(), 2u);
    EXPECT_EQ(r.anomalies(), 1u);
    EXPECT_DOUBLE_EQ(r.pseudo_grad_norm(), 1.5);
    EXPECT_DOUBLE_EQ(r.step_seconds(), 0.125);
    EXPECT_DOUBLE_EQ(r.compute_seconds(), 0.1);
    EXPECT_DOUBLE_EQ(r.comm_wait_seconds(), 0.5);
    EXPECT_DOUBLE_EQ(r.sync_seconds(), 0.25);
    EXPECT_EQ(r.phase(), "sync");
    EXPECT_GT(r.unix_time(), 1.6e9);
    ASSERT_EQ(r.comm_size(), 2);
    EXPECT_EQ(r.comm(0).op(), "allgather");
    EXPECT_EQ(r.comm(0).group(), "shard");
    EXPECT_EQ(r.comm(0).bytes(), 1000u);
    EXPECT_DOUBLE_EQ(r.comm(0).wait_seconds(), 0.2);
    EXPECT_EQ(r.comm(0).calls(), 10u);

    // Later reports go over the same stream.
    edit::StepReport next = sampleReport();
    next.step = 13;
    client.send(next);
    ASSERT_TRUE(svc.waitForReports(2, 10s));
  }
  server->Shutdown(std::chrono::system_clock::now() + 2s);
}

// SCALE carries a replica count (the operator's target) and has its own slot: a STOP and
// a CHECKPOINT sent around it still arrive, and of two targets the newer wins.
TEST(Telemetry, ClientReceivesScaleTargetBesideOtherCommands) {
  FakeOperator svc;
  // The CHECKPOINT last: once it is taken, the client has noted everything before it.
  svc.answers = {command(pb::Command::SCALE, 4), command(pb::Command::SCALE, 3),
                 command(pb::Command::SCALE, 0),  // no count: not a target, ignored
                 command(pb::Command::CHECKPOINT)};
  int port = 0;
  auto server = startServer(svc, "127.0.0.1:0", &port);
  ASSERT_TRUE(server);
  {
    edit::TelemetryClient client("127.0.0.1:" + std::to_string(port), "t",
                                 edit::TelemetryIdentity{"ns", "job", "pod", "uid", "node"});
    EXPECT_EQ(client.takeScaleTarget(), 0);  // nothing received yet
    edit::StepReport r = sampleReport();
    r.replicas = 3;
    client.send(r);
    ASSERT_TRUE(svc.waitForReports(1, 10s));
    ASSERT_TRUE(eventually([&] { return client.takeCommand() == edit::OperatorCommand::Checkpoint; }, 10000ms));
    EXPECT_EQ(client.takeScaleTarget(), 3);
    EXPECT_EQ(client.takeScaleTarget(), 0);  // taken once
    EXPECT_EQ(client.takeCommand(), edit::OperatorCommand::None);
    std::lock_guard<std::mutex> lock(svc.mu);
    EXPECT_EQ(svc.reports.front().replicas(), 3);
  }
  server->Shutdown(std::chrono::system_clock::now() + 2s);
}

// An idle worker (blocked in a collective, or between rare reports) resends its last
// report as a heartbeat; a busy one sends only its reports.
TEST(Telemetry, IdleClientSendsHeartbeats) {
  FakeOperator svc;
  int port = 0;
  auto server = startServer(svc, "127.0.0.1:0", &port);
  ASSERT_TRUE(server);
  {
    edit::TelemetryClient client("127.0.0.1:" + std::to_string(port), "t",
                                 edit::TelemetryIdentity{"ns", "job", "pod", "uid", "node"}, {}, 0.2);
    std::this_thread::sleep_for(500ms);
    {
      std::lock_guard<std::mutex> lock(svc.mu);
      EXPECT_TRUE(svc.reports.empty()) << "a heartbeat before any report says nothing";
    }
    client.send(sampleReport());
    ASSERT_TRUE(svc.waitForReports(3, 10s));
    std::lock_guard<std::mutex> lock(svc.mu);
    EXPECT_FALSE(svc.reports[0].heartbeat());
    for (size_t i = 1; i < svc.reports.size(); ++i) {
      EXPECT_TRUE(svc.reports[i].heartbeat()) << i;
      EXPECT_EQ(svc.reports[i].step(), svc.reports[0].step());
      EXPECT_GT(svc.reports[i].unix_time(), svc.reports[i - 1].unix_time());
    }
  }
  server->Shutdown(std::chrono::system_clock::now() + 2s);
}

TEST(Telemetry, ClientReconnectsAndClosesQuickly) {
  // Find a free port, then leave it closed: the client starts without an operator.
  int port = 0;
  {
    FakeOperator probe;
    auto s = startServer(probe, "127.0.0.1:0", &port);
    ASSERT_GT(port, 0);
    s->Shutdown();
  }
  const std::string addr = "127.0.0.1:" + std::to_string(port);
  FakeOperator svc;
  std::unique_ptr<grpc::Server> server;
  {
    auto client = std::make_unique<edit::TelemetryClient>(addr, "t", edit::TelemetryIdentity{"ns", "job", "pod", "", "node"});
    client->send(sampleReport());
    std::this_thread::sleep_for(300ms);
    EXPECT_FALSE(client->connected());
    int bound = 0;
    server = startServer(svc, addr, &bound);
    ASSERT_TRUE(server);
    ASSERT_EQ(bound, port);
    ASSERT_TRUE(svc.waitForReports(1, 15s)) << "no report after the operator came up";
    EXPECT_TRUE(eventually([&] { return client->connected(); }, 5000ms));

    // Closing a live stream and closing one that never connected are both quick.
    auto t0 = std::chrono::steady_clock::now();
    client.reset();
    EXPECT_LT(std::chrono::steady_clock::now() - t0, 3s) << "destructor must not hang";
    client = std::make_unique<edit::TelemetryClient>("127.0.0.1:1", "t", edit::TelemetryIdentity{"ns", "job", "pod", "", "node"});
    client->send(sampleReport());
    std::this_thread::sleep_for(200ms);
    t0 = std::chrono::steady_clock::now();
    client.reset();
    EXPECT_LT(std::chrono::steady_clock::now() - t0, 3s) << "destructor must not hang";
  }
  server->Shutdown(std::chrono::system_clock::now() + 2s);
}
