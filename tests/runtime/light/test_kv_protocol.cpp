// The job store's protocol pieces without a server (runtime/src/dist/kv_auth.*,
// kv_session.*; docs/job-store.md): the HMAC and the key derivation, and the session the
// fuzzer drives, fed garbage and the fuzzer's seeds. The server's defences:
// test_kv_store_limits.cpp.
#include <gtest/gtest.h>

#include <array>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "../../fuzz/target_kv_frame.h"
#include "dist/kv_store.h"

using edit::Bytes;
using edit::KvAuth;
using edit::KvLimits;
using edit::KvSession;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

const KvAuth kJob = KvAuth::make("team/demo", "s3cret-token");

std::string hex(const std::array<uint8_t, 32>& d) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (uint8_t c : d) out += {digits[c >> 4], digits[c & 15]};
  return out;
}

// ---- the secret -------------------------------------------------------------------------

TEST(KvAuthTest, HmacSha256MatchesRfc4231) {
  auto mac = [](const std::string& key, const std::string& msg) {
    return hex(edit::hmacSha256(reinterpret_cast<const uint8_t*>(key.data()), key.size(),
                                reinterpret_cast<const uint8_t*>(msg.data()), msg.size()));
  };
  EXPECT_EQ(mac(std::string(20, '\x0b'), "Hi There"),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  EXPECT_EQ(mac("Jefe", "what do ya want for nothing?"),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  // A key longer than the block is hashed first (test case 6).
  EXPECT_EQ(mac(std::string(131, '\xaa'), "Test Using Larger Than Block-Size Key - Hash Key First"),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
  // Messages crossing the 56-byte padding boundary (test case 7's 152-byte message).
  EXPECT_EQ(mac(std::string(131, '\xaa'),
                "This is a test using a larger than block-size key and a larger than block-size data. The key "
                "needs to be hashed before being used by the HMAC algorithm."),
            "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2");
}

TEST(KvAuthTest, KeyIsDerivedNotTheRawSecret) {
  const KvAuth a = KvAuth::make("ns/j", "token");
  EXPECT_TRUE(a.hasSecret);
  // HMAC(secret, label): the store and the telemetry never share a raw key.
  const std::string label = "edit job store v1";
  EXPECT_EQ(a.key, edit::hmacSha256(reinterpret_cast<const uint8_t*>("token"), 5,
                                    reinterpret_cast<const uint8_t*>(label.data()), label.size()));
  EXPECT_NE(a.key, KvAuth::make("ns/j", "token2").key);
  EXPECT_FALSE(KvAuth::make("ns/j", "").hasSecret);
  // edit-run's per-run secret wins over the job's telemetry token; the identity comes from
  // EDIT_NAMESPACE/EDIT_JOB.
  ::setenv("EDIT_TELEMETRY_TOKEN", "telemetry", 1);
  ::setenv("EDIT_NAMESPACE", "team", 1);
  ::setenv("EDIT_JOB", "demo", 1);
  ::unsetenv("EDIT_STORE_SECRET");
  EXPECT_EQ(KvAuth::fromEnvironment().key, KvAuth::make("team/demo", "telemetry").key);
  EXPECT_EQ(KvAuth::fromEnvironment().job, "team/demo");
  ::setenv("EDIT_STORE_SECRET", "per-run", 1);
  EXPECT_EQ(KvAuth::fromEnvironment().key, KvAuth::make("team/demo", "per-run").key);
  for (const char* v : {"EDIT_TELEMETRY_TOKEN", "EDIT_NAMESPACE", "EDIT_JOB", "EDIT_STORE_SECRET"}) ::unsetenv(v);
  EXPECT_EQ(KvAuth::fromEnvironment().job, "default/local");
}

// ---- the session alone (what the fuzzer drives) --------------------------------------

TEST(KvSessionTest, EveryReplyIsAFrameAndGarbageNeverThrows) {
  edit::KvTable table;
  const auto now = Clock::now();
  for (int seed = 0; seed < 200; ++seed) {
    auto session = KvSession::authenticated(table, kJob, KvLimits{}, now);
    std::srand(static_cast<unsigned>(seed));
    Bytes junk(static_cast<size_t>(std::rand() % 200));
    for (auto& x : junk) x = static_cast<uint8_t>(std::rand());
    if (junk.size() >= 4) junk[3] = 0;  // lengths small enough to be parsed
    session.received(junk.data(), junk.size(), now);
    session.pump(now + 1h);  // every deadline passed
    Bytes out(session.output(), session.output() + session.outputSize());
    for (size_t at = 0; at < out.size();) {
      ASSERT_LE(at + 5, out.size());
      const uint32_t n = out[at] | out[at + 1] << 8 | out[at + 2] << 16 | uint32_t(out[at + 3]) << 24;
      ASSERT_GE(n, 1u);
      ASSERT_LE(at + 4 + n, out.size());
      ASSERT_LE(out[at + 4], 3);
      at += 4 + n;
    }
  }
}

// The fuzzer's seeds (tests/fuzz/corpus/kv_frame) through the fuzz target: nothing throws,
// every bad_* seed gets an error or a refusal, every ok_* seed only ok answers.
TEST(KvSessionTest, FuzzSeedsReplay) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(EDIT_SOURCE_DIR) / "tests/fuzz/corpus/kv_frame";
  int seen = 0;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    SCOPED_TRACE(name);
    std::ifstream in(entry.path(), std::ios::binary);
    const Bytes data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    Bytes out;
    ASSERT_NO_THROW(out = edit::fuzz::fuzzKvFrameOne(data.data(), data.size()));
    int ok = 0, bad = 0;
    for (size_t at = 0; at + 5 <= out.size();) {
      const uint32_t n = out[at] | out[at + 1] << 8 | out[at + 2] << 16 | uint32_t(out[at + 3]) << 24;
      (out[at + 4] == KvSession::kOk ? ok : bad) += 1;
      at += 4 + n;
    }
    if (name.rfind("bad_", 0) == 0) EXPECT_GE(bad, 1);
    if (name.rfind("ok_", 0) == 0) {
      EXPECT_EQ(bad, name.find("bogus_proof") != std::string::npos ? 1 : 0);
      EXPECT_GE(ok, 1);
    }
    ++seen;
  }
  EXPECT_GE(seen, 10);
}

}  // namespace
