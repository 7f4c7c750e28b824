// Garbage on the operator's gRPC telemetry endpoint (bad input and security): an
// in-process TelemetryServer, exactly what edit-operator runs (operator/src/main.cpp),
// fed reports that are unauthenticated, for another job, truncated, oversized or not
// protobuf at all, and raw bytes that are not HTTP/2. Each is answered with an error
// status, none reaches the job's state or metrics, the server keeps serving, and neither
// the logs (stderr) nor /metrics ever contain the job's token.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <prometheus/text_serializer.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <limits>
#include <string>

#include "edit/v1alpha1/telemetry.grpc.pb.h"
#include "metrics/metrics.h"
#include "telemetry/server.h"

using namespace edit::op;
namespace pb = edit::v1alpha1;

namespace {

const char* kToken = "tok-7f3a9c1e5b2d4f60a8e6c4b2d0f1e3a5";  // what the Secret would hold

// Redirects fd 2 into a file for the object's lifetime; text() reads what was written.
class CaptureStderr {
 public:
  CaptureStderr() {
    char tmpl[] = "/tmp/edit-telemetry-garbage-XXXXXX";
    int fd = ::mkstemp(tmpl);
    path_ = tmpl;
    std::fflush(stderr);
    saved_ = ::dup(2);
    ::dup2(fd, 2);
    ::close(fd);
  }
  ~CaptureStderr() {
    restore();
    ::unlink(path_.c_str());
  }
  void restore() {
    if (saved_ < 0) return;
    std::fflush(stderr);
    ::dup2(saved_, 2);
    ::close(saved_);
    saved_ = -1;
  }
  std::string text() const {
    std::fflush(stderr);
    std::ifstream in(path_, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }

 private:
  std::string path_;
  int saved_ = -1;
};

struct Fixture : ::testing::Test {
  metrics::Metrics metrics;
  telemetry::TelemetryHub hub{&metrics};
  std::unique_ptr<telemetry::TelemetryServer> server;
  std::shared_ptr<grpc::Channel> channel;

  void SetUp() override {
    hub.registerJob("ns", "job", kToken, {}, 0);
    hub.registerJob("ns", "other", "a-different-token", {}, 0);
    server = std::make_unique<telemetry::TelemetryServer>(hub, "127.0.0.1:0");
    grpc::ChannelArguments args;
    args.SetMaxSendMessageSize(64 << 20);
    channel = grpc::CreateCustomChannel("127.0.0.1:" + std::to_string(server->port()),
                                        grpc::InsecureChannelCredentials(), args);
  }

  static pb::WorkerReport valid(int rank = 0, int64_t step = 1) {
    pb::WorkerReport r;
    r.set_namespace_("ns");
    r.set_job("job");
    r.set_token(kToken);
    r.set_rank(rank);
    r.set_pod("job-worker-" + std::to_string(rank));
    r.set_step(step);
    r.set_total_steps(100);
    r.set_loss(2.5);
    r.set_tokens(1024);
    r.set_step_seconds(0.1);
    return r;
  }

  // One stream, one report; the stream's final status.
  grpc::Status send(const pb::WorkerReport& r) {
    auto stub = pb::Telemetry::NewStub(channel);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    auto stream = stub->Stream(&ctx);
    stream->Write(r);
    stream->WritesDone();
    pb::Command c;
    while (stream->Read(&c)) {
    }
    return stream->Finish();
  }

  // Raw bytes as the request message of the Stream method (not a protobuf).
  grpc::Status sendRaw(const std::string& bytes) {
    grpc::GenericStub stub(channel);
    grpc::CompletionQueue cq;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    grpc::Slice slice(bytes);
    grpc::ByteBuffer req(&slice, 1), resp;
    auto call = stub.PrepareUnaryCall(&ctx, "/edit.v1alpha1.Telemetry/Stream", req, &cq);
    call->StartCall();
    grpc::Status st;
    call->Finish(&resp, &st, reinterpret_cast<void*>(1));
    void* tag;
    bool ok;
    cq.Next(&tag, &ok);
    cq.Shutdown();
    while (cq.Next(&tag, &ok)) {
    }
    return st;
  }

  bool jobHasReports(const std::string& job = "job") const {
    auto s = hub.snapshot("ns", job);
    return s && s->hasReports;
  }

  std::string scrape() { return metrics.scrape(); }
};

// Raw TCP: connects, writes bytes, closes.
void sendTcp(int port, const std::string& bytes) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  (void)!::write(fd, bytes.data(), bytes.size());
  char buf[256];
  timeval tv{1, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  (void)!::read(fd, buf, sizeof buf);
  ::close(fd);
}

}  // namespace

TEST_F(Fixture, GarbageIsRejectedAndNeverReachesTheJob) {
  CaptureStderr err;
  const std::string huge(32 << 10, 'x');  // 32 KiB: under the server's 64 KiB report limit
  struct Case {
    const char* what;
    pb::WorkerReport r;
    grpc::StatusCode want;
  };
  std::vector<Case> cases;
  cases.push_back({"empty report (every field missing)", pb::WorkerReport{}, grpc::StatusCode::PERMISSION_DENIED});
  {
    auto r = valid();
    r.clear_token();
    cases.push_back({"no token", r, grpc::StatusCode::PERMISSION_DENIED});
  }
  {
    auto r = valid();
    r.set_token("wrong");
    cases.push_back({"wrong token", r, grpc::StatusCode::PERMISSION_DENIED});
  }
  {
    auto r = valid();
    r.set_token(std::string(kToken).substr(0, 10));
    cases.push_back({"token prefix", r, grpc::StatusCode::PERMISSION_DENIED});
  }
  {
    auto r = valid();
    r.set_token(std::string(kToken) + "x");
    cases.push_back({"token plus a byte", r, grpc::StatusCode::PERMISSION_DENIED});
  }
  {
    auto r = valid();
    r.set_job("other");  // this job's token, another job
    cases.push_back({"wrong job", r, grpc::StatusCode::PERMISSION_DENIED});
  }
  {
    auto r = valid();
    r.set_namespace_("elsewhere");
    cases.push_back({"wrong namespace", r, grpc::StatusCode::PERMISSION_DENIED});
  }
  {
    auto r = valid();
    r.set_job("nope");
    cases.push_back({"unknown job", r, grpc::StatusCode::PERMISSION_DENIED});
  }
  {
    auto r = valid();
    r.set_token(huge);
    cases.push_back({"32 KiB token", r, grpc::StatusCode::PERMISSION_DENIED});
  }
  {
    auto r = valid();
    r.set_token("bad");
    r.set_job(huge);
    r.set_rank(-7);
    r.set_loss(std::numeric_limits<double>::quiet_NaN());
    cases.push_back({"32 KiB job name, negative rank, NaN loss, bad token", r, grpc::StatusCode::PERMISSION_DENIED});
  }
  {
    auto r = valid();
    r.set_pod(std::string(5 << 20, 'p'));  // over the 64 KiB report limit (and gRPC's 4 MiB default)
    cases.push_back({"5 MiB report", r, grpc::StatusCode::RESOURCE_EXHAUSTED});
  }
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    const grpc::Status st = send(c.r);
    EXPECT_EQ(st.error_code(), c.want) << st.error_message();
  }
  EXPECT_FALSE(jobHasReports());
  EXPECT_FALSE(jobHasReports("other"));

  // Not protobuf, as the request message. gRPC's synchronous streaming API ends the
  // stream (Read() returns false) and the handler answers OK with no command: what
  // matters is that nothing reaches the hub (checked below) and the server lives on.
  for (const std::string& bytes : {std::string("\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff", 10),
                                   std::string("\x0a\x80\x80\x80\x80\x10", 6),  // length past the end
                                   std::string(1000, '\x00') + "garbage"}) {
    const grpc::Status st = sendRaw(bytes);
    EXPECT_TRUE(st.ok() || st.error_code() != grpc::StatusCode::UNAVAILABLE) << st.error_message();
  }
  // Not even HTTP/2.
  sendTcp(server->port(), "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
  sendTcp(server->port(), std::string("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n") + std::string(4096, '\xee'));
  sendTcp(server->port(), std::string(64 << 10, '\0'));
  EXPECT_FALSE(jobHasReports());

  // Still serving: a valid report is accepted and shows up.
  EXPECT_TRUE(send(valid(0, 5)).ok());
  ASSERT_TRUE(jobHasReports());
  EXPECT_EQ(hub.snapshot("ns", "job")->progress.step, 5);

  // The token is in neither the logs nor the metrics.
  const std::string logs = err.text();
  err.restore();
  EXPECT_NE(logs.find("telemetry rejected"), std::string::npos) << "rejections are logged";
  EXPECT_EQ(logs.find(kToken), std::string::npos) << "the token leaked into the log";
  EXPECT_EQ(logs.find(std::string(kToken).substr(0, 10)), std::string::npos);
  const std::string text = scrape();
  EXPECT_NE(text.find("job=\"job\""), std::string::npos);
  EXPECT_EQ(text.find(kToken), std::string::npos) << "the token leaked into /metrics";
  EXPECT_EQ(text.find("a-different-token"), std::string::npos);
}

// Odd but possible values with the right token are stored, not fatal: counters at their
// maximum stay serializable. Non-finite values (a diverged run's NaN loss included) and
// negative timings are refused with INVALID_ARGUMENT (docs/job-store.md, "Telemetry limits").
TEST_F(Fixture, ValidTokenOddValuesDoNotBreakTheServer) {
  CaptureStderr err;
  auto bad = valid(3, 1);
  bad.set_step_seconds(std::numeric_limits<double>::infinity());
  bad.set_comm_wait_seconds(-1);
  EXPECT_EQ(send(bad).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  auto r = valid(3, 2);
  r.set_loss(std::numeric_limits<double>::quiet_NaN());
  EXPECT_EQ(send(r).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  auto r2 = valid(1, 3);
  r2.set_tokens(std::numeric_limits<uint64_t>::max());
  auto* c = r2.add_comm();
  c->set_op("allgather");
  c->set_group("shard");
  c->set_bytes(std::numeric_limits<uint64_t>::max());
  EXPECT_TRUE(send(r2).ok());
  EXPECT_TRUE(send(valid(0, 4)).ok());
  auto snap = hub.snapshot("ns", "job");
  ASSERT_TRUE(snap);
  EXPECT_EQ(snap->progress.ranksReporting, 2);
  const std::string text = scrape();
  EXPECT_FALSE(text.empty());
  EXPECT_EQ(text.find(kToken), std::string::npos);
  EXPECT_EQ(err.text().find(kToken), std::string::npos);
}

// Was a gap (README.md, "Bugs found" 5, fixed): with the right token, TelemetryHub::accept
// took any values: negative ranks, a 3 MiB pod name (it becomes a metric label value and a
// status field), infinite/negative timings, steps near INT64_MIN/MAX (signed overflow in
// JobTelemetry::progress()). Now they are refused with INVALID_ARGUMENT.
TEST_F(Fixture, ValidTokenGarbageIsRefused) {
  auto neg = valid(-1, 1);
  EXPECT_EQ(send(neg).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  auto bigPod = valid(0, 1);
  bigPod.set_pod(std::string(32 << 10, 'p'));
  EXPECT_EQ(send(bigPod).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  auto nanTime = valid(0, 1);
  nanTime.set_step_seconds(std::numeric_limits<double>::quiet_NaN());
  EXPECT_EQ(send(nanTime).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  auto lo = valid(0, -2);
  lo.set_total_steps(std::numeric_limits<int64_t>::max());
  EXPECT_EQ(send(lo).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  auto lo2 = valid(0, -1);
  lo2.set_total_steps(std::numeric_limits<int64_t>::max());
  EXPECT_EQ(send(lo2).error_code(), grpc::StatusCode::INVALID_ARGUMENT);  // UBSan: progress() overflow
  EXPECT_FALSE(jobHasReports());
}
