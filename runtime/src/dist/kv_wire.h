// The job store's wire format and the pieces its session, server and client share: the
// ops, the frame and field codecs, names made safe for messages, the handshake's proofs.
// Internal to dist/kv_*.cpp (the public API is dist/kv_store.h; the protocol, byte by
// byte: docs/job-store.md). No LibTorch.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "dist/kv_store.h"

namespace edit::kv {

using Clock = std::chrono::steady_clock;

// A frame is a 4-byte length and a body. A request's body is an Op and its fields; a
// reply's is a status (KvSession::Status) and the result, or a message when not ok.
// Integers are little-endian, strings and byte arrays a 4-byte length and their bytes.
// A connection opens with a hello, the server's challenge and the client's proof.
enum class Op : uint8_t { Set = 1, Get, Add, CompareSet, Check, Delete, NumKeys, Wait };
inline constexpr char kMagic[4] = {'E', 'D', 'K', 'V'};
inline constexpr uint8_t kVersion = 1;
inline constexpr size_t kNonceBytes = 32;
inline constexpr char kServerProofLabel[] = "edit job store server proof";
inline constexpr char kClientProofLabel[] = "edit job store client proof";

struct Writer {
  Bytes b;
  Writer& u8(uint8_t v) { b.push_back(v); return *this; }
  Writer& u32(uint32_t v) {
    for (int i = 0; i < 4; ++i) b.push_back(static_cast<uint8_t>(v >> (8 * i)));
    return *this;
  }
  Writer& i64(int64_t v) {
    for (int i = 0; i < 8; ++i) b.push_back(static_cast<uint8_t>(static_cast<uint64_t>(v) >> (8 * i)));
    return *this;
  }
  Writer& raw(const uint8_t* p, size_t n) {
    b.insert(b.end(), p, p + n);
    return *this;
  }
  Writer& bytes(const uint8_t* p, size_t n) {
    u32(static_cast<uint32_t>(n));
    return raw(p, n);
  }
  Writer& bytes(const Bytes& v) { return bytes(v.data(), v.size()); }
  Writer& str(const std::string& s) { return bytes(reinterpret_cast<const uint8_t*>(s.data()), s.size()); }
  Writer& strs(const std::vector<std::string>& v) {
    u32(static_cast<uint32_t>(v.size()));
    for (const auto& s : v) str(s);
    return *this;
  }
};

// Reads a body; every length is checked against what is left before anything is copied.
struct Reader {
  const uint8_t* p;
  size_t n;
  const char* kind = "request";  // what the frame is, for messages
  size_t at = 0;
  void need(size_t k, const char* what) const {
    if (n - at < k)
      throw KvError("store: malformed " + std::string(kind) + ": " + std::string(what) + " of " + std::to_string(k) +
                    " bytes at offset " + std::to_string(at) + " overruns the " + std::to_string(n) + "-byte frame");
  }
  uint8_t u8() {
    need(1, "a byte");
    return p[at++];
  }
  uint32_t u32(const char* what = "a length") {
    need(4, what);
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(p[at++]) << (8 * i);
    return v;
  }
  int64_t i64() {
    need(8, "an integer");
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(p[at++]) << (8 * i);
    return static_cast<int64_t>(v);
  }
  Bytes bytes(const char* what, uint32_t max) {
    const uint32_t k = u32();
    if (k > max)
      throw KvError("store: " + std::string(what) + " of " + std::to_string(k) + " bytes is over the limit of " +
                    std::to_string(max));
    need(k, what);
    Bytes v(p + at, p + at + k);
    at += k;
    return v;
  }
  std::string str(const char* what, uint32_t max) {
    const Bytes v = bytes(what, max);
    return std::string(v.begin(), v.end());
  }
  std::vector<std::string> strs(uint32_t maxCount, uint32_t maxKey) {
    const uint32_t count = u32("a key count");
    if (count > maxCount)
      throw KvError("store: a request with " + std::to_string(count) + " keys is over the limit of " +
                    std::to_string(maxCount) + " keys per request");
    // Each key takes at least its 4-byte length: a count the frame cannot hold is refused
    // before the vector is sized for it.
    if (count > (n - at) / 4) need(size_t{count} * 4, "the keys");
    std::vector<std::string> v;
    v.reserve(count);
    for (uint32_t i = 0; i < count; ++i) v.push_back(str("a key", maxKey));
    return v;
  }
  void end(const char* what) const {
    if (at != n)
      throw KvError("store: malformed " + std::string(what) + ": " + std::to_string(n - at) +
                    " bytes after its last field");
  }
};

inline uint32_t le32(const uint8_t* p) {
  return uint32_t{p[0]} | (uint32_t{p[1]} << 8) | (uint32_t{p[2]} << 16) | (uint32_t{p[3]} << 24);
}

// The body with its length in front.
Bytes frame(const Bytes& body);

// Names from a client go into messages and logs: printable ASCII only, and not too long.
std::string printable(const std::string& s, size_t max = 128);
// At most 8 keys, printable, then how many more.
std::string keyList(const std::vector<std::string>& keys);

// 0 (c10d's kNoTimeout) or less: no limit; so is anything beyond a year (the sum would
// overflow the clock's nanoseconds).
Clock::time_point deadlineAfter(int64_t ms, Clock::time_point now);

// The handshake (kv_auth.cpp): HMAC-SHA256 under the job's key over a label, the job and
// both nonces; compared in constant time.
std::array<uint8_t, 32> proof(const KvAuth& auth, const char* label, const std::array<uint8_t, 32>& clientNonce,
                              const std::array<uint8_t, 32>& serverNonce);
bool sameBytes(const uint8_t* a, const uint8_t* b, size_t n);
void randomBytes(uint8_t* out, size_t n);  // getrandom; KvError when the kernel has none

void setNoDelay(int fd);

}  // namespace edit::kv
