// The telemetry server's limits (operator/src/telemetry/server.*, docs/job-store.md,
// "Telemetry limits"): what a report may say (ranks within the world, finite values,
// known comm labels, bounded label values), what a stream may do (one rank, one token),
// and what clients cost (no thread per stream, a stream cap, keepalive, handshake and
// message-size limits).
#include <gtest/gtest.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <memory>
#include <mutex>
#include <regex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "comm_labels.h"
#include "edit/v1alpha1/telemetry.grpc.pb.h"
#include "telemetry/server.h"

using namespace edit::op;
namespace pb = edit::v1alpha1;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

pb::WorkerReport report(int rank, int64_t step = 1, const std::string& token = "t") {
  pb::WorkerReport r;
  r.set_namespace_("ns");
  r.set_job("j");
  r.set_token(token);
  r.set_rank(rank);
  r.set_pod("j-worker-" + std::to_string(rank));
  r.set_node("node-a");
  r.set_phase("local");
  r.set_step(step);
  r.set_total_steps(100);
  r.set_loss(2.5);
  r.set_step_seconds(0.1);
  auto* c = r.add_comm();
  c->set_op("allgather");
  c->set_group("shard");
  c->set_bytes(10);
  return r;
}

grpc::Status accept(telemetry::TelemetryHub& hub, const pb::WorkerReport& r) {
  std::vector<pb::Command> cmds;
  return hub.accept(r, &cmds);
}

int threadsNow() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("Threads:", 0) == 0) return std::atoi(line.c_str() + 8);
  return -1;
}

bool eventually(const std::function<bool()>& f, std::chrono::milliseconds within = 5s) {
  const auto until = Clock::now() + within;
  while (Clock::now() < until) {
    if (f()) return true;
    std::this_thread::sleep_for(10ms);
  }
  return f();
}

// ---- what a report may say --------------------------------------------------------------

TEST(TelemetryLimits, RankMustBeBelowTheJobsWorldSize) {
  telemetry::TelemetryHub hub(nullptr);
  hub.registerJob("ns", "j", "t", {}, 0, 8);
  EXPECT_TRUE(accept(hub, report(7)).ok());
  const grpc::Status st = accept(hub, report(8));
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(st.error_message().find("rank 8 is not in [0, 8) (the job's world size)"), std::string::npos)
      << st.error_message();
  auto wide = report(3);
  wide.set_replica(8);
  EXPECT_EQ(accept(hub, wide).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  // A scale to 16 ranks (the controller registers the larger world while it runs).
  hub.registerJob("ns", "j", "t", {}, 0, 16);
  EXPECT_TRUE(accept(hub, report(8)).ok());
  EXPECT_EQ(hub.snapshot("ns", "j")->progress.ranksReporting, 2);
}

TEST(TelemetryLimits, NonFiniteValuesAreRefusedNamingTheField) {
  telemetry::TelemetryHub hub(nullptr);
  hub.registerJob("ns", "j", "t", {}, 0, 4);
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  struct Case {
    const char* what;
    std::function<void(pb::WorkerReport&)> set;
    const char* field;
  };
  const std::vector<Case> cases = {
      {"NaN loss", [&](pb::WorkerReport& r) { r.set_loss(nan); }, "loss"},
      {"infinite loss", [&](pb::WorkerReport& r) { r.set_loss(-inf); }, "loss"},
      {"infinite pseudo-gradient norm", [&](pb::WorkerReport& r) { r.set_pseudo_grad_norm(inf); }, "pseudo_grad_norm"},
      {"NaN step time", [&](pb::WorkerReport& r) { r.set_step_seconds(nan); }, "timings"},
      {"NaN comm wait", [&](pb::WorkerReport& r) { r.mutable_comm(0)->set_wait_seconds(nan); }, "comm"},
      {"infinite sync time", [&](pb::WorkerReport& r) { r.set_sync_seconds(inf); }, "timings"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    auto r = report(1);
    c.set(r);
    const grpc::Status st = accept(hub, r);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_NE(st.error_message().find(c.field), std::string::npos) << st.error_message();
  }
  EXPECT_FALSE(hub.snapshot("ns", "j")->hasReports);
}

TEST(TelemetryLimits, UnknownCommLabelsAndOddLabelValuesAreRefused) {
  telemetry::TelemetryHub hub(nullptr);
  hub.registerJob("ns", "j", "t", {}, 0, 4);
  auto op = report(0);
  op.mutable_comm(0)->set_op("reducescatter");  // a typo of reduce_scatter
  grpc::Status st = accept(hub, op);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(st.error_message().find("comm op \"reducescatter\" is not one of"), std::string::npos) << st.error_message();
  auto group = report(0);
  group.mutable_comm(0)->set_group("everyone");
  st = accept(hub, group);
  EXPECT_NE(st.error_message().find("comm group \"everyone\""), std::string::npos) << st.error_message();
  auto huge = report(0);
  huge.mutable_comm(0)->set_op(std::string(1 << 20, 'x'));  // the message stays short
  st = accept(hub, huge);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_LT(st.error_message().size(), 300u);
  for (const std::string& pod :
       std::vector<std::string>{"j-worker-0\"} 1\nfake_metric{a=\"b", "pod with spaces", std::string(254, 'p')}) {
    auto r = report(0);
    r.set_pod(pod);
    EXPECT_EQ(accept(hub, r).error_code(), grpc::StatusCode::INVALID_ARGUMENT) << pod.substr(0, 20);
  }
  auto phase = report(0);
  phase.set_phase("local\n");
  EXPECT_EQ(accept(hub, phase).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_FALSE(hub.snapshot("ns", "j")->hasReports);
  // Every label the runtime sends is accepted, and a host name (edit-run's pod) too.
  auto ok = report(0);
  ok.set_pod("Build-Host_01.example");
  EXPECT_TRUE(accept(hub, ok).ok());
}

// The hub knows every label of the runtime's one list (common/src/comm_labels.h; the
// runtime's Schedule.EveryCommLabelOfARunIsInTheSharedList checks a real run against the
// same list), and nothing else.
TEST(TelemetryLimits, KnownCommLabelsAreTheRuntimesList) {
  for (const char* o : edit::kCommOpNames) EXPECT_TRUE(telemetry::knownCommOp(o)) << o;
  for (const char* g : edit::kCommGroupNames) EXPECT_TRUE(telemetry::knownCommGroup(g)) << g;
  EXPECT_FALSE(telemetry::knownCommOp("send"));
  EXPECT_FALSE(telemetry::knownCommGroup("node"));
  EXPECT_NE(telemetry::knownCommOps().find("compressed_mean"), std::string::npos);
}

// ---- what a stream may do ----------------------------------------------------------------

struct ServerFixture : ::testing::Test {
  telemetry::TelemetryHub hub{nullptr};
  std::unique_ptr<telemetry::TelemetryServer> server;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<pb::Telemetry::Stub> stub;

  // A channel of its own (a connection, as each worker has).
  std::unique_ptr<pb::Telemetry::Stub> ownStub(grpc::ChannelArguments args = {}) {
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    return pb::Telemetry::NewStub(grpc::CreateCustomChannel("127.0.0.1:" + std::to_string(server->port()),
                                                            grpc::InsecureChannelCredentials(), args));
  }

  void start(const telemetry::ServerLimits& limits = {}) {
    hub.registerJob("ns", "j", "t", {}, 0, 64);
    server = std::make_unique<telemetry::TelemetryServer>(hub, "127.0.0.1:0", telemetry::ServerTls{}, limits);
    grpc::ChannelArguments args;
    args.SetMaxSendMessageSize(16 << 20);
    channel = grpc::CreateCustomChannel("127.0.0.1:" + std::to_string(server->port()),
                                        grpc::InsecureChannelCredentials(), args);
    stub = pb::Telemetry::NewStub(channel);
  }

  // Reports on one stream, then its final status.
  grpc::Status send(const std::vector<pb::WorkerReport>& reports) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + 10s);
    auto stream = stub->Stream(&ctx);
    for (const auto& r : reports)
      if (!stream->Write(r)) break;
    stream->WritesDone();
    pb::Command c;
    while (stream->Read(&c)) {
    }
    return stream->Finish();
  }
};

TEST_F(ServerFixture, AStreamReportsForOneRankWithOneToken) {
  start();
  EXPECT_TRUE(send({report(1, 1), report(1, 2)}).ok());
  grpc::Status st = send({report(1, 3), report(2, 3)});
  EXPECT_EQ(st.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_NE(st.error_message().find("this stream reports for rank 1 of ns/j"), std::string::npos) << st.error_message();
  // Each message's token is checked, not only the first one's.
  st = send({report(1, 4), report(1, 5, "wrong")});
  EXPECT_EQ(st.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(hub.snapshot("ns", "j")->ranks.at(1).step, 4);
  EXPECT_EQ(hub.snapshot("ns", "j")->ranks.count(2), 0u);
}

TEST_F(ServerFixture, OversizedReportIsResourceExhausted) {
  telemetry::ServerLimits limits;
  limits.maxReportBytes = 4096;
  start(limits);
  auto r = report(0);
  r.set_node(std::string(8192, 'n'));
  EXPECT_EQ(send({r}).error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_TRUE(send({report(0)}).ok());
}

// A worker stream on gRPC's callback API: no client thread per stream either.
class ClientStream : public grpc::ClientBidiReactor<pb::WorkerReport, pb::Command> {
 public:
  ClientStream(pb::Telemetry::Stub* stub, const pb::WorkerReport& r) : report_(r) {
    stub->async()->Stream(&ctx_, this);
    StartRead(&cmd_);
    StartWrite(&report_);
    StartCall();
  }
  void OnWriteDone(bool ok) override {
    std::lock_guard<std::mutex> l(mu_);
    written_ = ok;
    wrote_ = true;
    cv_.notify_all();
  }
  void OnReadDone(bool ok) override {
    if (ok) StartRead(&cmd_);
  }
  void OnDone(const grpc::Status& s) override {
    std::lock_guard<std::mutex> l(mu_);
    status_ = s;
    done_ = true;
    cv_.notify_all();
  }
  bool waitWritten() {
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait_for(l, 10s, [&] { return wrote_ || done_; });
    return written_;
  }
  grpc::Status finish() {
    ctx_.TryCancel();
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait_for(l, 10s, [&] { return done_; });
    return status_;
  }
  grpc::Status waitDone(std::chrono::milliseconds within) {
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait_for(l, within, [&] { return done_; });
    return done_ ? status_ : grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "still open");
  }

 private:
  grpc::ClientContext ctx_;
  pb::WorkerReport report_;
  pb::Command cmd_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool wrote_ = false, written_ = false, done_ = false;
  grpc::Status status_;
};

TEST_F(ServerFixture, StreamsCostNoThreadEachAndAreCappedAndReaped) {
  telemetry::ServerLimits limits;
  limits.maxStreams = 48;
  start(limits);
  // Warm gRPC's pools up first: they start lazily.
  EXPECT_TRUE(send({report(0)}).ok());
  std::vector<std::unique_ptr<pb::Telemetry::Stub>> stubs;
  std::vector<std::unique_ptr<ClientStream>> open;
  stubs.push_back(ownStub());
  open.push_back(std::make_unique<ClientStream>(stubs.back().get(), report(0)));
  ASSERT_TRUE(open.back()->waitWritten());
  const int before = threadsNow();
  for (int rank = 1; rank < 48; ++rank) {
    stubs.push_back(ownStub());
    open.push_back(std::make_unique<ClientStream>(stubs.back().get(), report(rank)));
    ASSERT_TRUE(open.back()->waitWritten()) << rank;
  }
  ASSERT_TRUE(eventually([&] { return hub.snapshot("ns", "j")->progress.ranksReporting == 48; }));
  EXPECT_EQ(server->streams(), 48);
  // A thread-per-stream server would be 47 threads up here.
  EXPECT_LT(threadsNow() - before, 8) << "threads grew with the streams";
  // Over the cap: refused at once, the worker retries later.
  const grpc::Status over = send({report(48)});
  EXPECT_EQ(over.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(over.error_message().find("at most 48"), std::string::npos) << over.error_message();
  // Clients that leave free their streams.
  for (auto& s : open) s->finish();
  open.clear();
  EXPECT_TRUE(eventually([&] { return server->streams() == 0; })) << server->streams();
  EXPECT_TRUE(send({report(5, 2)}).ok());
}

// A client that pings more often than the server allows is sent away (GOAWAY), as
// gRPC's and etcd's servers do; its stream ends instead of holding the server busy.
TEST_F(ServerFixture, ClientPingingTooOftenIsDisconnected) {
  telemetry::ServerLimits limits;
  limits.minClientPingInterval = 10s;
  start(limits);
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 100);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 1000);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  auto pingerStub = ownStub(args);
  ClientStream s(pingerStub.get(), report(3));
  ASSERT_TRUE(s.waitWritten());
  const grpc::Status st = s.waitDone(8s);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAVAILABLE) << st.error_message();
  EXPECT_TRUE(eventually([&] { return server->streams() == 0; }));
}

// A TCP client that never starts HTTP/2 is dropped at the handshake timeout.
TEST_F(ServerFixture, SilentConnectionIsDroppedAtTheHandshakeTimeout) {
  telemetry::ServerLimits limits;
  limits.handshakeTimeout = 300ms;
  start(limits);
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(server->port()));
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  const auto t0 = Clock::now();
  bool closed = false;
  char buf[256];
  while (!closed && Clock::now() - t0 < 5s) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 50) <= 0) continue;
    closed = ::recv(fd, buf, sizeof buf, 0) <= 0;  // the server's SETTINGS first, then EOF
  }
  ::close(fd);
  EXPECT_TRUE(closed);
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 3.0);
}

}  // namespace
