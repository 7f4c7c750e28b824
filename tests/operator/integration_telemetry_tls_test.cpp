// Telemetry over real TLS: a throwaway CA and server certificate (openssl, SAN
// 127.0.0.1/localhost) made at test time; the operator's TelemetryServer with them and
// the worker's TelemetryClient (runtime/src/telemetry/telemetry.h) or raw gRPC stubs against it.
// Also the startup errors of the operator's TLS flags.
#include <gtest/gtest.h>
#include <grpcpp/grpcpp.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "edit/v1alpha1/telemetry.grpc.pb.h"
#include "telemetry/server.h"
#ifdef EDIT_WITH_WORKER_CLIENT
#include "worker_config.h"     // the worker config (runtime/src)
#include "telemetry/telemetry.h"  // the worker client (runtime/src)
#endif

namespace edit::op::testing {
namespace {

namespace fs = std::filesystem;
namespace pb = edit::v1alpha1;
using namespace std::chrono_literals;

const char* kToken = "tls-test-token";

// Runs a command; its exit status and output (stdout and stderr).
std::pair<int, std::string> runCommand(const std::string& cmd) {
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return {-1, "popen failed"};
  std::string out;
  char buf[512];
  while (fgets(buf, sizeof buf, p)) out += buf;
  int rc = pclose(p);
  return {WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, out};
}

void writeFile(const fs::path& p, const std::string& text) { std::ofstream(p) << text; }

std::string readFile(const fs::path& p) {
  std::ifstream in(p);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Two CAs (the right one and a stranger) and a server certificate signed by the first.
class Pki {
 public:
  Pki() {
    char tmpl[] = "/tmp/edit-tls-XXXXXX";
    dir_ = mkdtemp(tmpl);
    writeFile(dir_ / "ca.cnf",
              "[req]\ndistinguished_name = dn\nprompt = no\n[dn]\nCN = edit-test-ca\n"
              "[v3_ca]\nbasicConstraints = critical,CA:TRUE\nkeyUsage = critical,keyCertSign,cRLSign\n"
              "subjectKeyIdentifier = hash\n");
    writeFile(dir_ / "server.ext",
              "basicConstraints = CA:FALSE\nkeyUsage = critical,digitalSignature,keyEncipherment\n"
              "extendedKeyUsage = serverAuth\nsubjectAltName = IP:127.0.0.1,DNS:localhost\n");
    makeCa("ca");
    makeCa("other-ca");
    const std::string d = dir_.string();
    run("req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj /CN=localhost -keyout " + d +
        "/server.key -out " + d + "/server.csr");
    run("x509 -req -days 2 -in " + d + "/server.csr -CA " + d + "/ca.crt -CAkey " + d + "/ca.key -set_serial 2" +
        " -extfile " + d + "/server.ext -out " + d + "/server.crt");
  }
  ~Pki() {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  std::string error() const { return error_; }

 private:
  void makeCa(const std::string& name) {
    const std::string d = dir_.string();
    run("req -x509 -days 2 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -config " + d +
        "/ca.cnf -extensions v3_ca -keyout " + d + "/" + name + ".key -out " + d + "/" + name + ".crt");
  }
  void run(const std::string& args) {
    if (!error_.empty()) return;
    auto [rc, out] = runCommand(std::string(OPENSSL_BIN) + " " + args);
    if (rc != 0) error_ = "openssl " + args + ": " + out;
  }
  fs::path dir_;
  std::string error_;
};

pb::WorkerReport report(const std::string& token, int64_t step) {
  pb::WorkerReport r;
  r.set_namespace_("default");
  r.set_job("tls-job");
  r.set_token(token);
  r.set_rank(0);
  r.set_pod("tls-job-worker-0");
  r.set_step(step);
  r.set_total_steps(100);
  r.set_step_seconds(0.1);
  return r;
}

// Sends one report on one stream and returns the final status.
grpc::Status streamOnce(const std::string& addr, std::shared_ptr<grpc::ChannelCredentials> creds,
                        const pb::WorkerReport& r) {
  auto stub = pb::Telemetry::NewStub(grpc::CreateChannel(addr, creds));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + 5s);
  auto s = stub->Stream(&ctx);
  s->Write(r);
  s->WritesDone();
  pb::Command c;
  while (s->Read(&c)) {
  }
  return s->Finish();
}

class TelemetryTls : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(pki_.error().empty()) << pki_.error();
    hub_.registerJob("default", "tls-job", kToken, {}, 0);
    auto tls = telemetry::loadServerTls(pki_.path("server.crt"), pki_.path("server.key"));
    ASSERT_TRUE(tls.enabled());
    server_ = std::make_unique<telemetry::TelemetryServer>(hub_, "127.0.0.1:0", tls);
    addr_ = "127.0.0.1:" + std::to_string(server_->port());
  }
  bool hasReports() const {
    auto snap = hub_.snapshot("default", "tls-job");
    return snap && snap->hasReports;
  }
  std::shared_ptr<grpc::ChannelCredentials> caCredentials(const std::string& caFile) const {
    grpc::SslCredentialsOptions o;
    o.pem_root_certs = readFile(pki_.path(caFile));
    return grpc::SslCredentials(o);
  }

  Pki pki_;
  telemetry::TelemetryHub hub_{nullptr};
  std::unique_ptr<telemetry::TelemetryServer> server_;
  std::string addr_;
};

TEST_F(TelemetryTls, ReportWithRightCaAndTokenIsAccepted) {
  EXPECT_TRUE(streamOnce(addr_, caCredentials("ca.crt"), report(kToken, 3)).ok());
  EXPECT_TRUE(hasReports());
}

TEST_F(TelemetryTls, WrongTokenIsStillDeniedUnderTls) {
  grpc::Status st = streamOnce(addr_, caCredentials("ca.crt"), report("not-the-token", 3));
  EXPECT_EQ(st.error_code(), grpc::StatusCode::PERMISSION_DENIED) << st.error_message();
  EXPECT_FALSE(hasReports());
}

TEST_F(TelemetryTls, PlaintextClientCannotTalkToTlsServer) {
  grpc::Status st = streamOnce(addr_, grpc::InsecureChannelCredentials(), report(kToken, 3));
  EXPECT_FALSE(st.ok());
  EXPECT_FALSE(hasReports());
}

TEST_F(TelemetryTls, ClientWithWrongCaCannotConnect) {
  grpc::Status st = streamOnce(addr_, caCredentials("other-ca.crt"), report(kToken, 3));
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAVAILABLE) << st.error_message();
  EXPECT_FALSE(hasReports());
}

TEST_F(TelemetryTls, ServerFlagsMustComeTogetherAndBeValid) {
  auto message = [](auto f) {
    try {
      f();
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_FALSE(telemetry::loadServerTls("", "").enabled());
  std::string m = message([&] { telemetry::loadServerTls(pki_.path("server.crt"), ""); });
  EXPECT_NE(m.find("--telemetry-tls-cert and --telemetry-tls-key must be given together"), std::string::npos) << m;
  m = message([&] { telemetry::loadServerTls("", pki_.path("server.key")); });
  EXPECT_NE(m.find("must be given together"), std::string::npos) << m;
  m = message([&] { telemetry::loadServerTls(pki_.path("missing.crt"), pki_.path("server.key")); });
  EXPECT_NE(m.find("--telemetry-tls-cert: cannot read " + pki_.path("missing.crt")), std::string::npos) << m;
  m = message([&] { telemetry::loadServerTls(pki_.path("server.crt"), pki_.path("server.ext")); });
  EXPECT_NE(m.find("--telemetry-tls-key: " + pki_.path("server.ext") + " holds no PEM private key"), std::string::npos)
      << m;
  m = message([&] { telemetry::loadServerTls(pki_.path("server.key"), pki_.path("server.key")); });
  EXPECT_NE(m.find("--telemetry-tls-cert: " + pki_.path("server.key") + " holds no PEM certificate"), std::string::npos)
      << m;
  // A key of another certificate: the pair does not match.
  m = message([&] { telemetry::loadServerTls(pki_.path("server.crt"), pki_.path("ca.key")); });
  EXPECT_NE(m.find("is not the key of the certificate"), std::string::npos) << m;
  // Errors never carry key material.
  EXPECT_EQ(m.find("PRIVATE KEY"), std::string::npos) << m;
}

// The operator binary refuses bad TLS flags at once (exit 2), before any API call.
TEST_F(TelemetryTls, OperatorRejectsBadTlsFlagsAtStartup) {
  const std::string bin = EDIT_OPERATOR_BIN;
  auto [rc, out] = runCommand(bin + " --telemetry-tls-cert " + pki_.path("server.crt"));
  EXPECT_EQ(rc, 2) << out;
  EXPECT_NE(out.find("--telemetry-tls-cert and --telemetry-tls-key must be given together"), std::string::npos) << out;

  std::tie(rc, out) = runCommand(bin + " --telemetry-tls-cert=" + pki_.path("server.crt") +
                                 " --telemetry-tls-key=" + pki_.path("nope.key"));
  EXPECT_EQ(rc, 2) << out;
  EXPECT_NE(out.find("--telemetry-tls-key: cannot read " + pki_.path("nope.key")), std::string::npos) << out;

  std::tie(rc, out) = runCommand(bin + " --telemetry-tls-ca-secret edit-telemetry-ca");
  EXPECT_EQ(rc, 2) << out;
  EXPECT_NE(out.find("need --telemetry-tls-cert and --telemetry-tls-key"), std::string::npos) << out;
}

#ifdef EDIT_WITH_WORKER_CLIENT

edit::StepReport stepReport(int64_t step) {
  edit::StepReport r;
  r.rank = 0;
  r.worldSize = 1;
  r.step = step;
  r.totalSteps = 100;
  r.stepSeconds = 0.1;
  r.phase = "local";
  return r;
}

template <typename F>
bool eventually(F f, std::chrono::milliseconds timeout) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < end) {
    if (f()) return true;
    std::this_thread::sleep_for(20ms);
  }
  return f();
}

TEST_F(TelemetryTls, WorkerClientWithRightCaDeliversReportsAndGetsCommands) {
  edit::TelemetryClient client(addr_, kToken, edit::TelemetryIdentity{"default", "tls-job", "tls-job-worker-0", "", "node-0"},
                               edit::TelemetryTls{pki_.path("ca.crt"), ""});
  client.send(stepReport(1));
  ASSERT_TRUE(eventually([&] { return hasReports(); }, 10000ms)) << "no report over TLS";
  EXPECT_TRUE(client.connected());
  // Commands come back over the same encrypted stream.
  hub_.sendCommand("default", "tls-job", 0, pb::Command::STOP, "test");
  client.send(stepReport(2));
  EXPECT_TRUE(eventually([&] { return client.takeCommand() == edit::OperatorCommand::Stop; }, 10000ms));
}

TEST_F(TelemetryTls, WorkerClientChecksTheOverriddenServerName) {
  // "localhost" is in the certificate although the address is an IP.
  {
    edit::TelemetryClient client(addr_, kToken, edit::TelemetryIdentity{"default", "tls-job", "p", "", "n"},
                                 edit::TelemetryTls{pki_.path("ca.crt"), "localhost"});
    client.send(stepReport(1));
    ASSERT_TRUE(eventually([&] { return hasReports(); }, 10000ms));
  }
  hub_.forgetJob("default", "tls-job");
  hub_.registerJob("default", "tls-job", kToken, {}, 0);
  // A name the certificate does not carry: the handshake fails.
  edit::TelemetryClient client(addr_, kToken, edit::TelemetryIdentity{"default", "tls-job", "p", "", "n"},
                               edit::TelemetryTls{pki_.path("ca.crt"), "operator.example.invalid"});
  client.send(stepReport(1));
  std::this_thread::sleep_for(1500ms);
  EXPECT_FALSE(client.connected());
  EXPECT_FALSE(hasReports());
}

TEST_F(TelemetryTls, WorkerClientWithWrongCaNeverDelivers) {
  edit::TelemetryClient client(addr_, kToken, edit::TelemetryIdentity{"default", "tls-job", "p", "", "n"},
                               edit::TelemetryTls{pki_.path("other-ca.crt"), ""});
  client.send(stepReport(1));
  std::this_thread::sleep_for(1500ms);
  EXPECT_FALSE(client.connected());
  EXPECT_FALSE(hasReports());
}

TEST_F(TelemetryTls, PlaintextWorkerClientNeverDelivers) {
  edit::TelemetryClient client(addr_, kToken, edit::TelemetryIdentity{"default", "tls-job", "p", "", "n"});
  client.send(stepReport(1));
  std::this_thread::sleep_for(1500ms);
  EXPECT_FALSE(client.connected());
  EXPECT_FALSE(hasReports());
}

TEST_F(TelemetryTls, WorkerClientRefusesAMissingOrBadCaFile) {
  auto message = [&](const std::string& caFile, const std::string& serverName) {
    try {
      edit::TelemetryClient c(addr_, kToken, edit::TelemetryIdentity{"default", "tls-job", "p", "", "n"}, edit::TelemetryTls{caFile, serverName});
    } catch (const std::runtime_error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  std::string m = message(pki_.path("missing.crt"), "");
  EXPECT_NE(m.find("telemetry.tlsCaFile: cannot read " + pki_.path("missing.crt")), std::string::npos) << m;
  m = message(pki_.path("server.ext"), "");
  EXPECT_NE(m.find("telemetry.tlsCaFile: " + pki_.path("server.ext") + " holds no PEM certificate"), std::string::npos)
      << m;
  m = message("", "localhost");
  EXPECT_NE(m.find("telemetry.tlsServerName: needs telemetry.tlsCaFile"), std::string::npos) << m;
}

// The worker's config keys and their environment variables.
TEST(TelemetryTlsConfig, KeysAndEnvironment) {
  edit::Config cfg = edit::parseConfig("telemetry: {addr: \"op:9090\", tlsCaFile: /etc/ca.crt, tlsServerName: op.example}\n");
  EXPECT_EQ(cfg.telemetry.tlsCaFile, "/etc/ca.crt");
  EXPECT_EQ(cfg.telemetry.tlsServerName, "op.example");

  edit::Config fromEnv;
  setenv("EDIT_TELEMETRY_CA_FILE", "/etc/edit/telemetry-tls/ca.crt", 1);
  setenv("EDIT_TELEMETRY_SERVER_NAME", "edit-operator-telemetry.edit-system.svc", 1);
  edit::applyEnvironment(fromEnv);
  unsetenv("EDIT_TELEMETRY_CA_FILE");
  unsetenv("EDIT_TELEMETRY_SERVER_NAME");
  EXPECT_EQ(fromEnv.telemetry.tlsCaFile, "/etc/edit/telemetry-tls/ca.crt");
  EXPECT_EQ(fromEnv.telemetry.tlsServerName, "edit-operator-telemetry.edit-system.svc");

  try {
    edit::parseConfig("telemetry: {tlsServerName: op.example}\n");
    ADD_FAILURE() << "a server name without a CA must be refused";
  } catch (const edit::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("telemetry.tlsServerName: needs telemetry.tlsCaFile"), std::string::npos)
        << e.what();
  }
}

#endif  // EDIT_WITH_WORKER_CLIENT

}  // namespace
}  // namespace edit::op::testing
