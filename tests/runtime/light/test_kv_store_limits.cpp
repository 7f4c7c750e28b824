// The job store's defences (runtime/src/dist/kv_store.*, docs/job-store.md): the handshake
// (job identity, HMAC secret), the limits on frames, keys and connections, the deadlines
// on slow clients, and what happens to a client that leaves mid-wait. Raw sockets play
// the malformed, truncated, oversized, slow, flooding and disconnecting clients. The HMAC
// and the session alone: test_kv_protocol.cpp.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "dist/kv_session.h"
#include "dist/kv_store.h"

using edit::Bytes;
using edit::KvAuth;
using edit::KvClient;
using edit::KvError;
using edit::KvLimits;
using edit::KvRefused;
using edit::KvServer;
using edit::KvSession;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

Bytes b(const std::string& s) { return Bytes(s.begin(), s.end()); }
std::string s(const Bytes& v) { return std::string(v.begin(), v.end()); }
double secondsSince(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

int threadsNow() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("Threads:", 0) == 0) return std::atoi(line.c_str() + 8);
  return -1;
}

// Wire helpers, written from docs/job-store.md rather than shared with the store.
struct W {
  Bytes b;
  W& u8(uint8_t v) { b.push_back(v); return *this; }
  W& u32(uint32_t v) {
    for (int i = 0; i < 4; ++i) b.push_back(static_cast<uint8_t>(v >> (8 * i)));
    return *this;
  }
  W& i64(int64_t v) {
    for (int i = 0; i < 8; ++i) b.push_back(static_cast<uint8_t>(static_cast<uint64_t>(v) >> (8 * i)));
    return *this;
  }
  W& raw(const void* p, size_t n) {
    auto* c = static_cast<const uint8_t*>(p);
    b.insert(b.end(), c, c + n);
    return *this;
  }
  W& str(const std::string& v) { return u32(static_cast<uint32_t>(v.size())).raw(v.data(), v.size()); }
};

Bytes framed(const Bytes& body) {
  W w;
  w.u32(static_cast<uint32_t>(body.size())).raw(body.data(), body.size());
  return w.b;
}

// A client that sends whatever the test says.
class Raw {
 public:
  explicit Raw(int port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(port));
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) throw std::runtime_error("connect failed");
  }
  ~Raw() {
    if (fd_ >= 0) ::close(fd_);
  }
  void close() {
    ::close(fd_);
    fd_ = -1;
  }
  bool send(const Bytes& data) { return ::send(fd_, data.data(), data.size(), MSG_NOSIGNAL) == ssize_t(data.size()); }
  bool sendFrame(const Bytes& body) { return send(framed(body)); }
  // One reply frame: status and the rest; false when the connection closed or nothing came.
  bool reply(uint8_t* status, Bytes* rest, std::chrono::milliseconds timeout = 3s) {
    Bytes head;
    if (!readN(4, &head, timeout)) return false;
    const uint32_t n = head[0] | head[1] << 8 | head[2] << 16 | uint32_t(head[3]) << 24;
    Bytes body;
    if (n == 0 || n > (32u << 20) || !readN(n, &body, timeout)) return false;
    *status = body[0];
    rest->assign(body.begin() + 1, body.end());
    return true;
  }
  // The message of an error or refusal reply.
  std::string message(uint8_t* status, std::chrono::milliseconds timeout = 3s) {
    Bytes rest;
    if (!reply(status, &rest, timeout)) return "<no reply>";
    if (rest.size() < 4) return "<short>";
    return std::string(rest.begin() + 4, rest.end());
  }
  // The peer closed (EOF or reset) within timeout.
  bool closedWithin(std::chrono::milliseconds timeout) {
    const auto until = Clock::now() + timeout;
    uint8_t buf[4096];
    while (Clock::now() < until) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      const ssize_t n = ::recv(fd_, buf, sizeof(buf), 0);
      if (n <= 0) return true;
    }
    return false;
  }
  // The store's handshake, by the book.
  void handshake(const KvAuth& auth) {
    std::array<uint8_t, 32> cn{};
    for (size_t i = 0; i < cn.size(); ++i) cn[i] = static_cast<uint8_t>(i * 7 + 1);
    W hello;
    hello.raw("EDKV", 4).u8(1).str(auth.job).u32(32).raw(cn.data(), 32);
    ASSERT_TRUE(sendFrame(hello.b));
    uint8_t st = 9;
    Bytes challenge;
    ASSERT_TRUE(reply(&st, &challenge));
    ASSERT_EQ(st, 0) << s(challenge);
    ASSERT_EQ(challenge.size(), 4u + 32 + 4 + 32);
    std::array<uint8_t, 32> sn{};
    std::copy(challenge.begin() + 4, challenge.begin() + 36, sn.begin());
    auto transcript = [&](const char* label) {
      W t;
      t.raw(label, std::strlen(label)).u8(0).str(auth.job).raw(cn.data(), 32).raw(sn.data(), 32);
      return edit::hmacSha256(auth.key.data(), auth.key.size(), t.b.data(), t.b.size());
    };
    const auto serverProof = transcript("edit job store server proof");
    EXPECT_TRUE(std::equal(serverProof.begin(), serverProof.end(), challenge.begin() + 40));
    const auto mine = transcript("edit job store client proof");
    ASSERT_TRUE(sendFrame(W().u32(32).raw(mine.data(), 32).b));
    Bytes ok;
    ASSERT_TRUE(reply(&st, &ok));
    ASSERT_EQ(st, 0);
  }

 private:
  bool readN(size_t n, Bytes* out, std::chrono::milliseconds timeout) {
    out->resize(n);
    size_t got = 0;
    const auto until = Clock::now() + timeout;
    while (got < n) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now()).count();
      if (left <= 0) return false;
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left)) <= 0) continue;
      const ssize_t r = ::recv(fd_, out->data() + got, n - got, 0);
      if (r <= 0) return false;
      got += static_cast<size_t>(r);
    }
    return true;
  }
  int fd_ = -1;
};

const KvAuth kJob = KvAuth::make("team/demo", "s3cret-token");

std::unique_ptr<KvServer> serve(const KvLimits& limits = {}, const KvAuth& auth = kJob) {
  KvServer::Options o;
  o.bindHost = "127.0.0.1";
  o.auth = auth;
  o.limits = limits;
  return std::make_unique<KvServer>(0, 1s, o);
}

bool eventually(const std::function<bool()>& f, std::chrono::milliseconds within = 3s) {
  const auto until = Clock::now() + within;
  while (Clock::now() < until) {
    if (f()) return true;
    std::this_thread::sleep_for(10ms);
  }
  return f();
}

// ---- the secret and the handshake ------------------------------------------------------

TEST(KvHandshake, RightJobAndSecretGetIn) {
  auto server = serve();
  KvClient c("127.0.0.1", server->port(), 1s, 2s, kJob);
  c.set("k", b("v"));
  EXPECT_EQ(s(server->table().get("k", 1s)), "v");
  EXPECT_EQ(server->refusals(), 0);
}

TEST(KvHandshake, WrongSecretIsRefusedAtOnceNamingTheCause) {
  auto server = serve();
  const auto t0 = Clock::now();
  try {
    KvClient c("127.0.0.1", server->port(), 5s, 2s, KvAuth::make("team/demo", "other"));
    FAIL() << "a wrong secret got in";
  } catch (const KvRefused& e) {
    EXPECT_NE(std::string(e.what()).find("wrong secret"), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).find("s3cret"), std::string::npos) << "the secret is echoed: " << e.what();
  }
  EXPECT_LT(secondsSince(t0), 2.0) << "retried a refusal until the connect timeout";
  EXPECT_TRUE(eventually([&] { return server->refusals() == 1; }));
  // No secret at all is a wrong secret too.
  EXPECT_THROW(KvClient("127.0.0.1", server->port(), 5s, 2s, KvAuth::make("team/demo", "")), KvRefused);
}

TEST(KvHandshake, AnotherJobIsRefusedNamingBothJobs) {
  auto server = serve();
  const auto t0 = Clock::now();
  try {
    KvClient c("127.0.0.1", server->port(), 5s, 2s, KvAuth::make("team/other", "s3cret-token"));
    FAIL() << "a worker of another job got in";
  } catch (const KvRefused& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("team/demo"), std::string::npos) << m;
    EXPECT_NE(m.find("team/other"), std::string::npos) << m;
    EXPECT_NE(m.find("127.0.0.1:" + std::to_string(server->port())), std::string::npos) << m;
  }
  EXPECT_LT(secondsSince(t0), 2.0);
}

TEST(KvHandshake, NonStoreClientsAreRefusedWithAReason) {
  auto server = serve();
  {
    Raw http(server->port());  // an HTTP probe: its first 4 bytes read as a 542 MB length
    http.send(b("GET / HTTP/1.1\r\nHost: x\r\n\r\n"));
    uint8_t st = 0;
    EXPECT_NE(http.message(&st).find("hello is at most"), std::string::npos);
    EXPECT_EQ(st, KvSession::kRefused);
    EXPECT_TRUE(http.closedWithin(3s));
  }
  {
    Raw wrongMagic(server->port());
    wrongMagic.sendFrame(b("HELLO"));
    uint8_t st = 0;
    EXPECT_NE(wrongMagic.message(&st).find("not a store hello"), std::string::npos);
  }
  {
    Raw newer(server->port());
    newer.sendFrame(W().raw("EDKV", 4).u8(2).b);
    uint8_t st = 0;
    EXPECT_NE(newer.message(&st).find("protocol version 2"), std::string::npos);
  }
  {
    Raw truncated(server->port());  // the job name's length overruns the frame
    truncated.sendFrame(W().raw("EDKV", 4).u8(1).u32(400).raw("team", 4).b);
    uint8_t st = 0;
    EXPECT_NE(truncated.message(&st).find("malformed hello"), std::string::npos);
  }
  {
    Raw oldClient(server->port());  // a request before any hello (a build before the handshake)
    oldClient.sendFrame(W().u8(7).b);
    uint8_t st = 0;
    EXPECT_NE(oldClient.message(&st).find("not a store hello"), std::string::npos);
  }
  EXPECT_TRUE(eventually([&] { return server->refusals() == 5; }));
  KvClient ok("127.0.0.1", server->port(), 1s, 2s, kJob);  // still serving
  EXPECT_EQ(ok.numKeys(), 0);
}

// ---- malformed, truncated and oversized requests -------------------------------------

TEST(KvLimitsTest, MalformedRequestsGetAnErrorAndTheConnectionLives) {
  KvLimits limits;
  limits.maxKeyBytes = 64;
  limits.maxKeysPerRequest = 10;
  auto server = serve(limits);
  Raw c(server->port());
  c.handshake(kJob);
  struct Case {
    const char* what;
    Bytes body;
    const char* expect;
  };
  const std::vector<Case> cases = {
      {"empty frame", {}, "overruns"},
      {"unknown op", W().u8(77).b, "unknown request op 77"},
      {"truncated key", W().u8(1).u32(50).raw("abc", 3).b, "overruns"},
      {"missing value", W().u8(1).str("k").b, "overruns"},
      {"trailing bytes", W().u8(7).u8(0).u8(0).b, "2 bytes after its last field"},
      {"key over the limit", W().u8(1).str(std::string(65, 'k')).u32(0).b, "over the limit of 64"},
      {"too many keys", W().u8(5).u32(11).b, "11 keys is over the limit of 10"},
      {"a key count the frame cannot hold", W().u8(5).u32(9).u32(0).b, "overruns"},
      {"get without its timeout", W().u8(2).str("k").b, "overruns"},
      {"add on text", W().u8(3).str("t").i64(1).b, ""},  // prepared below
  };
  server->table().set("t", b("text"));
  for (const auto& tc : cases) {
    SCOPED_TRACE(tc.what);
    ASSERT_TRUE(c.sendFrame(tc.body));
    uint8_t st = 0;
    const std::string m = c.message(&st);
    EXPECT_EQ(st, KvSession::kError) << m;
    EXPECT_NE(m.find(tc.expect), std::string::npos) << m;
  }
  // The same connection still works.
  ASSERT_TRUE(c.sendFrame(W().u8(7).b));
  uint8_t st = 9;
  Bytes rest;
  ASSERT_TRUE(c.reply(&st, &rest));
  EXPECT_EQ(st, 0);
  EXPECT_EQ(rest.size(), 8u);
}

TEST(KvLimitsTest, OversizedFrameIsRefusedBeforeItsBodyArrives) {
  auto server = serve();
  Raw c(server->port());
  c.handshake(kJob);
  // Only the length goes: the server answers without waiting for (or allocating) 1 GiB.
  ASSERT_TRUE(c.send(W().u32(1u << 30).b));
  uint8_t st = 0;
  const std::string m = c.message(&st, 2s);
  EXPECT_EQ(st, KvSession::kError);
  EXPECT_NE(m.find("1073741824 bytes is over the limit"), std::string::npos) << m;
  EXPECT_TRUE(c.closedWithin(3s));
}

TEST(KvLimitsTest, ValuesOverTheLimitAreRefusedFromHostAndClient) {
  KvLimits limits;
  limits.maxValueBytes = 1000;
  limits.maxFrameBytes = 4096;
  auto server = serve(limits);
  EXPECT_THROW(server->table().set("big", Bytes(1001, 1)), KvError);
  EXPECT_THROW(server->table().compareSet("big", {}, Bytes(1001, 1)), KvError);
  server->table().set("fits", Bytes(1000, 1));
  KvClient c("127.0.0.1", server->port(), 1s, 2s, kJob, limits);
  try {
    c.set("big", Bytes(1001, 1));
    FAIL() << "a value over the limit was stored";
  } catch (const KvError& e) {
    EXPECT_NE(std::string(e.what()).find("over the limit of 1000"), std::string::npos) << e.what();
  }
  // Over the frame limit: refused by the client before it sends, the connection kept.
  EXPECT_THROW(c.set("huge", Bytes(5000, 1)), KvError);
  EXPECT_EQ(c.get("fits", 1s).size(), 1000u);
  EXPECT_FALSE(server->table().check({"big"}));
}

TEST(KvLimitsTest, HugeAndNegativeWaitTimeoutsAreSafe) {
  auto server = serve();
  Raw c(server->port());
  c.handshake(kJob);
  server->table().set("here", b("1"));
  for (int64_t ms : {INT64_MAX, INT64_MIN, int64_t{-1}}) {
    ASSERT_TRUE(c.sendFrame(W().u8(2).str("here").i64(ms).b));
    uint8_t st = 9;
    Bytes rest;
    ASSERT_TRUE(c.reply(&st, &rest));
    EXPECT_EQ(st, 0);
  }
  // Add that would overflow 64 bits: an error, not a wrap.
  server->table().set("n", b(std::to_string(INT64_MAX)));
  ASSERT_TRUE(c.sendFrame(W().u8(3).str("n").i64(1).b));
  uint8_t st = 0;
  EXPECT_NE(c.message(&st).find("overflows"), std::string::npos);
}

// ---- slow clients ----------------------------------------------------------------------

TEST(KvLimitsTest, SlowFrameAndSilentConnectionHitTheirDeadlines) {
  KvLimits limits;
  limits.frameTimeout = 200ms;
  limits.handshakeTimeout = 300ms;
  auto server = serve(limits);
  {
    Raw silent(server->port());  // connects, never says hello
    const auto t0 = Clock::now();
    uint8_t st = 0;
    const std::string m = silent.message(&st, 3s);
    EXPECT_NE(m.find("no handshake within 300 ms"), std::string::npos) << m;
    EXPECT_GE(secondsSince(t0), 0.25);
    EXPECT_TRUE(silent.closedWithin(3s));
  }
  {
    Raw slow(server->port());
    slow.handshake(kJob);
    // Half a frame, then nothing: one stalled client must not hold its slot forever.
    slow.send(W().u32(20).u8(1).b);
    uint8_t st = 0;
    const std::string m = slow.message(&st, 3s);
    EXPECT_EQ(st, KvSession::kError);
    EXPECT_NE(m.find("did not arrive in full within 200 ms"), std::string::npos) << m;
    EXPECT_TRUE(slow.closedWithin(3s));
  }
  {
    Raw trickle(server->port());  // a whole frame, a byte at a time, within the deadline
    trickle.handshake(kJob);
    const Bytes f = framed(W().u8(7).b);
    for (uint8_t byte : f) {
      trickle.send({byte});
      std::this_thread::sleep_for(10ms);
    }
    uint8_t st = 9;
    Bytes rest;
    ASSERT_TRUE(trickle.reply(&st, &rest));
    EXPECT_EQ(st, 0);
  }
  EXPECT_TRUE(eventually([&] { return server->connections() == 0; }));
}

// A client blocked in a long get does not hold up the others: one thread serves all.
TEST(KvLimitsTest, OneWaitingClientDoesNotStallTheOthers) {
  auto server = serve();
  KvClient waiter("127.0.0.1", server->port(), 1s, 5s, kJob);
  std::atomic<bool> done{false};
  std::thread t([&] {
    EXPECT_EQ(s(waiter.get("late", 10s)), "now");
    done = true;
  });
  std::this_thread::sleep_for(100ms);
  KvClient other("127.0.0.1", server->port(), 1s, 2s, kJob);
  const auto t0 = Clock::now();
  for (int i = 0; i < 50; ++i) other.set("k" + std::to_string(i), b("v"));
  EXPECT_LT(secondsSince(t0), 2.0);
  EXPECT_FALSE(done);
  other.set("late", b("now"));
  t.join();
  EXPECT_TRUE(done);
}

// ---- flooding and disconnecting clients ------------------------------------------------

TEST(KvLimitsTest, ConnectionsOverTheCapAreToldBusyAndThreadsStayOne) {
  KvLimits limits;
  limits.maxConnections = 4;
  auto server = serve(limits);
  const int before = threadsNow();
  std::vector<std::unique_ptr<KvClient>> held;
  for (int i = 0; i < 4; ++i) held.push_back(std::make_unique<KvClient>("127.0.0.1", server->port(), 1s, 2s, kJob));
  const auto t0 = Clock::now();
  try {
    KvClient extra("127.0.0.1", server->port(), 400ms, 1s, kJob);
    FAIL() << "a fifth connection over a cap of 4";
  } catch (const KvRefused& e) {
    FAIL() << "busy is not a refusal: " << e.what();
  } catch (const KvError& e) {
    EXPECT_NE(std::string(e.what()).find("busy"), std::string::npos) << e.what();
  }
  EXPECT_GE(secondsSince(t0), 0.35) << "busy was not retried until the connect timeout";
  EXPECT_EQ(server->connections(), 4);
  held.pop_back();  // a slot frees: the next client gets in
  EXPECT_TRUE(eventually([&] { return server->connections() == 3; }));
  KvClient now("127.0.0.1", server->port(), 1s, 1s, kJob);
  EXPECT_EQ(now.numKeys(), 0);
  EXPECT_EQ(threadsNow(), before) << "the server started threads per connection";
}

TEST(KvLimitsTest, ManyClientsComeAndGoWithoutGrowingTheServer) {
  auto server = serve();
  const int before = threadsNow();
  for (int round = 0; round < 20; ++round) {
    ASSERT_TRUE(eventually([&] { return server->connections() == 0; })) << "round " << round;
    std::vector<std::unique_ptr<KvClient>> clients;
    for (int i = 0; i < 10; ++i) {
      clients.push_back(std::make_unique<KvClient>("127.0.0.1", server->port(), 1s, 2s, kJob));
      clients.back()->add("count", 1);
    }
    EXPECT_EQ(server->connections(), 10);
  }
  EXPECT_TRUE(eventually([&] { return server->connections() == 0; }));
  EXPECT_EQ(s(server->table().get("count", 1s)), "200");
  EXPECT_EQ(threadsNow(), before);
}

TEST(KvLimitsTest, PipelinedFloodIsAnsweredInOrder) {
  auto server = serve();
  Raw c(server->port());
  c.handshake(kJob);
  Bytes flood;
  for (int i = 0; i < 2000; ++i) {
    const Bytes f = framed(W().u8(3).str("n").i64(1).b);
    flood.insert(flood.end(), f.begin(), f.end());
  }
  std::thread sender([&] { c.send(flood); });
  for (int64_t i = 1; i <= 2000; ++i) {
    uint8_t st = 9;
    Bytes rest;
    ASSERT_TRUE(c.reply(&st, &rest)) << i;
    ASSERT_EQ(st, 0);
    int64_t v = 0;
    for (int k = 0; k < 8; ++k) v |= int64_t(rest[k]) << (8 * k);
    ASSERT_EQ(v, i);
  }
  sender.join();
}

// A wait whose client left ends with it: the connection is reaped at once (not at the
// wait's end, and not at the server's destructor).
TEST(KvLimitsTest, WaitEndsWhenItsClientDisconnects) {
  auto server = serve();
  for (int i = 0; i < 20; ++i) {
    Raw c(server->port());
    c.handshake(kJob);
    ASSERT_TRUE(c.sendFrame(W().u8(8).u32(1).str("never").i64(0).b));  // wait, no time limit
    ASSERT_TRUE(eventually([&] { return server->connections() == 1; }));
    c.close();
    ASSERT_TRUE(eventually([&] { return server->connections() == 0; }, 2s)) << "round " << i;
  }
  // The departed waiters are gone: writing the key they waited for wakes nobody.
  server->table().set("never", b("x"));
  KvClient c("127.0.0.1", server->port(), 1s, 1s, kJob);
  EXPECT_EQ(s(c.get("never", 1s)), "x");
}

TEST(KvLimitsTest, WaitTimesOutNamingItsKeys) {
  auto server = serve();
  KvClient c("127.0.0.1", server->port(), 1s, 2s, kJob);
  const auto t0 = Clock::now();
  try {
    c.wait({"a", "b"}, 150ms);
    FAIL();
  } catch (const KvError& e) {
    EXPECT_NE(std::string(e.what()).find("[a, b]"), std::string::npos) << e.what();
  }
  EXPECT_GE(secondsSince(t0), 0.14);
  EXPECT_LT(secondsSince(t0), 1.5);
  server->table().set("a", b("1"));
  std::thread t([&] {
    std::this_thread::sleep_for(100ms);
    server->table().set("b", b("2"));  // the host's own write wakes a client's wait
  });
  c.wait({"a", "b"}, 3s);
  t.join();
}

// ---- where it listens ------------------------------------------------------------------

TEST(KvBind, ListensOnlyOnTheGivenAddress) {
  auto server = serve();  // 127.0.0.1
  KvClient ok("127.0.0.1", server->port(), 1s, 1s, kJob);
  EXPECT_THROW(KvClient("127.0.0.2", server->port(), 300ms, 300ms, kJob), KvError);
  KvServer::Options o;
  o.bindHost = "192.0.2.1";  // TEST-NET-1: not this host's
  try {
    KvServer bad(0, 200ms, o);
    FAIL() << "bound to an address this host does not have";
  } catch (const KvError& e) {
    EXPECT_NE(std::string(e.what()).find("192.0.2.1"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("POD_IP"), std::string::npos) << e.what();
  }
}

}  // namespace
