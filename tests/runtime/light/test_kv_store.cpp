// The job's key-value store (runtime/src/dist/kv_store.*): TCPStore's semantics, over the
// wire and on the host's own table alike, and what a client sees when the host goes away:
// an error from the call, never an abort (the reason it replaced c10d's TCPStore).
#include <gtest/gtest.h>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include "../free_port.h"
#include "dist/kv_store.h"

using edit::Bytes;
using edit::KvClient;
using edit::KvError;
using edit::KvOps;
using edit::KvServer;
using edit::test::freePort;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

Bytes b(const std::string& s) { return Bytes(s.begin(), s.end()); }
std::string s(const Bytes& v) { return std::string(v.begin(), v.end()); }

std::unique_ptr<KvClient> client(int port, std::chrono::milliseconds connect = 2s) {
  return std::make_unique<KvClient>("localhost", port, connect, 5s);
}

double secondsSince(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// The same checks on the host's table (rank 0 calls it directly) and through a client.
class KvSemantics : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    server_ = std::make_unique<KvServer>(0, 1s);
    if (GetParam()) client_ = client(server_->port());
  }
  KvOps& ops() { return GetParam() ? static_cast<KvOps&>(*client_) : server_->table(); }
  std::unique_ptr<KvServer> server_;
  std::unique_ptr<KvClient> client_;
};

TEST_P(KvSemantics, SetGetCheckDeleteCount) {
  auto& kv = ops();
  EXPECT_FALSE(kv.check({"a"}));
  kv.set("a", b("one"));
  kv.set("empty", {});
  EXPECT_EQ(s(kv.get("a", 1s)), "one");
  EXPECT_TRUE(kv.get("empty", 1s).empty());
  kv.set("a", b("two"));  // overwrites
  EXPECT_EQ(s(kv.get("a", 1s)), "two");
  EXPECT_TRUE(kv.check({"a", "empty"}));
  EXPECT_FALSE(kv.check({"a", "missing"}));
  EXPECT_EQ(kv.numKeys(), 2);
  EXPECT_TRUE(kv.deleteKey("a"));
  EXPECT_FALSE(kv.deleteKey("a"));
  EXPECT_EQ(kv.numKeys(), 1);
  // Binary values come back byte for byte.
  Bytes all;
  for (int i = 0; i < 256; ++i) all.push_back(static_cast<uint8_t>(i));
  kv.set("bin", all);
  EXPECT_EQ(kv.get("bin", 1s), all);
}

TEST_P(KvSemantics, AddCountsInDecimalText) {
  auto& kv = ops();
  EXPECT_EQ(kv.add("n", 1), 1);  // absent counts as 0
  EXPECT_EQ(kv.add("n", 5), 6);
  EXPECT_EQ(kv.add("n", 0), 6);
  EXPECT_EQ(kv.add("n", -10), -4);
  EXPECT_EQ(s(kv.get("n", 1s)), "-4");  // what Gloo and the rendezvous read back
  kv.set("text", b("x"));
  EXPECT_THROW(kv.add("text", 1), KvError);
}

TEST_P(KvSemantics, CompareSetEveryBranch) {
  auto& kv = ops();
  // Absent, expected empty: sets.
  EXPECT_EQ(s(kv.compareSet("g", {}, b("0"))), "0");
  // Holds the expected value: sets and returns the new one.
  EXPECT_EQ(s(kv.compareSet("g", b("0"), b("1"))), "1");
  // Holds another value: unchanged, returns what it holds (the rendezvous's "someone
  // moved the generation first").
  EXPECT_EQ(s(kv.compareSet("g", b("0"), b("1"))), "1");
  EXPECT_EQ(s(kv.get("g", 1s)), "1");
  // Absent, expected not empty: unchanged, returns expected.
  EXPECT_EQ(s(kv.compareSet("h", b("5"), b("6"))), "5");
  EXPECT_FALSE(kv.check({"h"}));
}

TEST_P(KvSemantics, GetAndWaitTimeOutNamingTheKey) {
  auto& kv = ops();
  const auto t0 = Clock::now();
  try {
    kv.get("never", 200ms);
    FAIL() << "get of a missing key returned";
  } catch (const KvError& e) {
    EXPECT_NE(std::string(e.what()).find("never"), std::string::npos) << e.what();
  }
  EXPECT_GE(secondsSince(t0), 0.19);
  EXPECT_LT(secondsSince(t0), 3.0);
  EXPECT_THROW(kv.wait({"x", "y"}, 100ms), KvError);
}

INSTANTIATE_TEST_SUITE_P(HostAndClient, KvSemantics, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "Client" : "Host"; });

TEST(KvStore, GetBlocksUntilAnotherClientSets) {
  KvServer server(0, 1s);
  auto waiter = client(server.port()), setter = client(server.port());
  std::thread t([&] {
    std::this_thread::sleep_for(200ms);
    setter->set("ready", b("yes"));
  });
  const auto t0 = Clock::now();
  EXPECT_EQ(s(waiter->get("ready", 5s)), "yes");
  EXPECT_GE(secondsSince(t0), 0.15);
  waiter->wait({"ready"}, 1s);  // present: returns at once
  t.join();
}

TEST(KvStore, ServerCountsItsConnections) {
  KvServer server(0, 1s);
  EXPECT_EQ(server.connections(), 0);
  auto c1 = client(server.port()), c2 = client(server.port());
  c1->set("k", b("v"));
  c2->set("k", b("v"));  // both served: the server has accepted them
  EXPECT_EQ(server.connections(), 2);
  c1.reset();
  for (int i = 0; i < 100 && server.connections() != 1; ++i) std::this_thread::sleep_for(10ms);
  EXPECT_EQ(server.connections(), 1);
}

// The host leaving is an exception at the caller, idle or in the middle of a wait, and
// the process lives on (the TCPStore client aborted it here).
TEST(KvStore, HostGoneIsAnErrorNotAnAbort) {
  auto server = std::make_unique<KvServer>(0, 1s);
  const int port = server->port();
  auto idle = client(port), blocked = client(port);
  idle->set("k", b("v"));
  std::atomic<bool> threw{false};
  std::string message;
  std::thread t([&] {
    try {
      blocked->get("never", 30s);
    } catch (const KvError& e) {
      message = e.what();
      threw = true;
    }
  });
  std::this_thread::sleep_for(200ms);
  const auto t0 = Clock::now();
  server.reset();
  t.join();
  EXPECT_TRUE(threw);
  EXPECT_LT(secondsSince(t0), 5.0);
  EXPECT_NE(message.find("localhost:" + std::to_string(port)), std::string::npos) << message;
  EXPECT_THROW(idle->get("k", 1s), KvError);
  EXPECT_THROW(idle->set("k", b("v")), KvError);  // and stays an error
}

// Rank 0's replacement hosts a fresh store at the same port while clients of the old one
// retry: they connect once it listens.
TEST(KvStore, ClientConnectsOnceANewHostListensOnThePort) {
  auto old = std::make_unique<KvServer>(0, 1s);
  const int port = old->port();
  auto survivor = client(port);
  survivor->set("k", b("v"));
  old.reset();
  std::unique_ptr<KvServer> replacement;
  std::thread t([&] {
    std::this_thread::sleep_for(300ms);
    replacement = std::make_unique<KvServer>(port, 5s);
  });
  const auto t0 = Clock::now();
  auto again = client(port, 5s);
  EXPECT_GE(secondsSince(t0), 0.2);
  t.join();
  EXPECT_FALSE(again->check({"k"}));  // a fresh store
  again->set("k", b("w"));
  EXPECT_EQ(s(replacement->table().get("k", 1s)), "w");
}

TEST(KvStore, NobodyListeningIsAnErrorNamingTheAddress) {
  const int port = freePort();
  const auto t0 = Clock::now();
  try {
    KvClient c("localhost", port, 300ms, 1s);
    FAIL() << "connected to a port nobody listens on";
  } catch (const KvError& e) {
    EXPECT_NE(std::string(e.what()).find("localhost:" + std::to_string(port)), std::string::npos) << e.what();
  }
  EXPECT_LT(secondsSince(t0), 3.0);
  EXPECT_THROW(KvClient("no-such-host.invalid", port, 200ms, 1s), KvError);
}

// A host that accepts but never answers (a stopped rank 0): connecting ends at the
// connect timeout, naming the address (the kernel completes the TCP handshake; the
// store's own handshake gets no answer).
TEST(KvStore, SilentHostTimesOut) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  ASSERT_EQ(::listen(fd, 4), 0);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  const int port = ntohs(a.sin_port);
  const auto t0 = Clock::now();
  try {
    KvClient c("127.0.0.1", port, 500ms, 200ms);
    FAIL() << "a host that never answers the handshake was accepted";
  } catch (const KvError& e) {
    EXPECT_NE(std::string(e.what()).find("127.0.0.1:" + std::to_string(port)), std::string::npos) << e.what();
  }
  EXPECT_GE(secondsSince(t0), 0.45);
  EXPECT_LT(secondsSince(t0), 3.0);
  ::close(fd);
}

TEST(KvStore, PortInUseNamesThePortAfterTheBindTimeout) {
  KvServer first(0, 1s);
  try {
    KvServer second(first.port(), 200ms);
    FAIL() << "two servers on one port";
  } catch (const KvError& e) {
    EXPECT_NE(std::string(e.what()).find(std::to_string(first.port())), std::string::npos) << e.what();
  }
}

}  // namespace
