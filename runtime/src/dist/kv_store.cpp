#include "dist/kv_store.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <system_error>
#include <unordered_map>

namespace edit {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// A frame is a 4-byte length and a body. A request's body is an Op and its fields; a
// reply's is a status (KvSession::Status) and the result, or a message when not ok.
// Integers are little-endian, strings and byte arrays a 4-byte length and their bytes.
// A connection opens with a hello, the server's challenge and the client's proof
// (docs/job-store.md).
enum class Op : uint8_t { Set = 1, Get, Add, CompareSet, Check, Delete, NumKeys, Wait };
constexpr char kMagic[4] = {'E', 'D', 'K', 'V'};
constexpr uint8_t kVersion = 1;
constexpr size_t kNonceBytes = 32;
constexpr uint32_t kMaxJobBytes = 512;            // namespace (63) + "/" + name (253), with room
constexpr uint32_t kMaxHandshakeReply = 4096;     // a challenge, or a refusal's message
constexpr size_t kOutHighWater = 64u << 10;       // replies queued before a session stops reading
constexpr int kMaxBusySessions = 64;              // "busy" answers in flight beyond maxConnections
constexpr int kLoggedRefusals = 10;
const char kKeyLabel[] = "edit job store v1";
const char kServerProofLabel[] = "edit job store server proof";
const char kClientProofLabel[] = "edit job store client proof";

// ---- SHA-256 and HMAC (FIPS 180-4, RFC 2104) --------------------------------------------

class Sha256 {
 public:
  Sha256() { std::memcpy(h_, kInit, sizeof(h_)); }
  void update(const uint8_t* p, size_t n) {
    len_ += n;
    while (n > 0) {
      const size_t take = std::min(n, sizeof(buf_) - used_);
      std::memcpy(buf_ + used_, p, take);
      used_ += take;
      p += take;
      n -= take;
      if (used_ == sizeof(buf_)) {
        block(buf_);
        used_ = 0;
      }
    }
  }
  std::array<uint8_t, 32> finish() {
    const uint64_t bits = len_ * 8;
    const uint8_t one = 0x80, zero = 0;
    update(&one, 1);
    while (used_ != 56) update(&zero, 1);
    uint8_t lenBytes[8];
    for (int i = 0; i < 8; ++i) lenBytes[i] = static_cast<uint8_t>(bits >> (56 - 8 * i));
    update(lenBytes, 8);
    std::array<uint8_t, 32> out{};
    for (int i = 0; i < 8; ++i)
      for (int j = 0; j < 4; ++j) out[4 * i + j] = static_cast<uint8_t>(h_[i] >> (24 - 8 * j));
    return out;
  }

 private:
  static constexpr uint32_t kInit[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                        0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  static constexpr uint32_t kK[64] = {
      0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
      0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
      0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
      0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
      0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
      0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
      0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
      0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};
  static uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }
  void block(const uint8_t* p) {
    uint32_t w[64];
    for (int i = 0; i < 16; ++i)
      w[i] = (uint32_t{p[4 * i]} << 24) | (uint32_t{p[4 * i + 1]} << 16) | (uint32_t{p[4 * i + 2]} << 8) | p[4 * i + 3];
    for (int i = 16; i < 64; ++i) {
      const uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
      const uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
      w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = h_[0], b = h_[1], c = h_[2], d = h_[3], e = h_[4], f = h_[5], g = h_[6], h = h_[7];
    for (int i = 0; i < 64; ++i) {
      const uint32_t t1 = h + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + kK[i] + w[i];
      const uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
      h = g;
      g = f;
      f = e;
      e = d + t1;
      d = c;
      c = b;
      b = a;
      a = t1 + t2;
    }
    h_[0] += a, h_[1] += b, h_[2] += c, h_[3] += d, h_[4] += e, h_[5] += f, h_[6] += g, h_[7] += h;
  }
  uint32_t h_[8];
  uint8_t buf_[64];
  size_t used_ = 0;
  uint64_t len_ = 0;
};

// Equal in time independent of where they differ.
bool sameBytes(const uint8_t* a, const uint8_t* b, size_t n) {
  uint8_t diff = 0;
  for (size_t i = 0; i < n; ++i) diff = static_cast<uint8_t>(diff | (a[i] ^ b[i]));
  return diff == 0;
}

void randomBytes(uint8_t* out, size_t n) {
  size_t got = 0;
  while (got < n) {
    const ssize_t r = ::getrandom(out + got, n - got, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) throw KvError(std::string("store: no random bytes from the kernel: ") + std::strerror(errno));
    got += static_cast<size_t>(r);
  }
}

// ---- the wire -----------------------------------------------------------------------------

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

uint32_t le32(const uint8_t* p) {
  return uint32_t{p[0]} | (uint32_t{p[1]} << 8) | (uint32_t{p[2]} << 16) | (uint32_t{p[3]} << 24);
}

Bytes frame(const Bytes& body) {
  Writer w;
  w.u32(static_cast<uint32_t>(body.size()));
  w.b.insert(w.b.end(), body.begin(), body.end());
  return w.b;
}

// Names from a client go into messages and logs: printable ASCII only, and not too long.
std::string printable(const std::string& s, size_t max = 128) {
  std::string out;
  for (size_t i = 0; i < s.size() && i < max; ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      static const char* hex = "0123456789abcdef";
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  if (s.size() > max) out += "...(" + std::to_string(s.size()) + " bytes)";
  return out;
}

std::string keyList(const std::vector<std::string>& keys) {
  std::string s;
  for (size_t i = 0; i < keys.size() && i < 8; ++i) s += (i ? ", " : "") + printable(keys[i]);
  if (keys.size() > 8) s += ", and " + std::to_string(keys.size() - 8) + " more";
  return "[" + s + "]";
}

// 0 (c10d's kNoTimeout) or less: no limit; so is anything beyond a year (the sum would
// overflow the clock's nanoseconds).
Clock::time_point deadlineAfter(int64_t ms, Clock::time_point now) {
  constexpr int64_t kYear = int64_t{365} * 24 * 3600 * 1000;
  return ms <= 0 || ms > kYear ? Clock::time_point::max() : now + milliseconds(ms);
}

Bytes proofTranscript(const char* label, const std::string& job, const std::array<uint8_t, 32>& clientNonce,
                      const std::array<uint8_t, 32>& serverNonce) {
  Writer w;
  w.raw(reinterpret_cast<const uint8_t*>(label), std::strlen(label));
  w.u8(0).str(job).raw(clientNonce.data(), clientNonce.size()).raw(serverNonce.data(), serverNonce.size());
  return w.b;
}

std::array<uint8_t, 32> proof(const KvAuth& auth, const char* label, const std::array<uint8_t, 32>& clientNonce,
                              const std::array<uint8_t, 32>& serverNonce) {
  const Bytes t = proofTranscript(label, auth.job, clientNonce, serverNonce);
  return hmacSha256(auth.key.data(), auth.key.size(), t.data(), t.size());
}

// Sends all of data; false when the peer is gone (never SIGPIPE).
bool sendAll(int fd, const Bytes& data) {
  size_t off = 0;
  while (off < data.size()) {
    const ssize_t n = ::send(fd, data.data() + off, data.size() - off, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    off += static_cast<size_t>(n);
  }
  return true;
}

enum class Read { Ok, Closed, TimedOut, TooLarge };

// Reads exactly n bytes. deadline == time_point::max(): no limit.
Read readExact(int fd, uint8_t* out, size_t n, Clock::time_point deadline) {
  size_t off = 0;
  while (off < n) {
    if (deadline != Clock::time_point::max()) {
      const auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count();
      if (left <= 0) return Read::TimedOut;
      pollfd p{fd, POLLIN, 0};
      const int r = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 1 << 30)));
      if (r < 0 && errno == EINTR) continue;
      if (r == 0) continue;  // the loop's deadline check ends it
      if (r < 0) return Read::Closed;
    }
    const ssize_t got = ::recv(fd, out + off, n - off, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return Read::Closed;
    off += static_cast<size_t>(got);
  }
  return Read::Ok;
}

// A reply; its length is checked against `max` before anything is allocated for it.
Read readFrame(int fd, Bytes& body, Clock::time_point deadline, uint32_t max) {
  uint8_t len[4];
  Read r = readExact(fd, len, 4, deadline);
  if (r != Read::Ok) return r;
  const uint32_t n = le32(len);
  if (n > max) return Read::TooLarge;
  body.resize(n);
  return readExact(fd, body.data(), n, deadline);
}

void setNoDelay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

// A client whose host vanished (no FIN, no RST: a node lost) is noticed within about a
// minute, and its pending wait ends with it.
void setKeepAlive(int fd) {
  int one = 1, idle = 30, interval = 10, count = 3;
  ::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof(interval));
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof(count));
}

std::string peerName(const sockaddr_storage& a) {
  char host[INET6_ADDRSTRLEN] = "?";
  int port = 0;
  if (a.ss_family == AF_INET6) {
    const auto* s = reinterpret_cast<const sockaddr_in6*>(&a);
    ::inet_ntop(AF_INET6, &s->sin6_addr, host, sizeof(host));
    port = ntohs(s->sin6_port);
    return std::string("[") + host + "]:" + std::to_string(port);
  }
  if (a.ss_family == AF_INET) {
    const auto* s = reinterpret_cast<const sockaddr_in*>(&a);
    ::inet_ntop(AF_INET, &s->sin_addr, host, sizeof(host));
    port = ntohs(s->sin_port);
  }
  return std::string(host) + ":" + std::to_string(port);
}

}  // namespace

std::array<uint8_t, 32> hmacSha256(const uint8_t* key, size_t keyLen, const uint8_t* msg, size_t msgLen) {
  uint8_t k[64] = {};
  if (keyLen > sizeof(k)) {
    Sha256 h;
    h.update(key, keyLen);
    const auto d = h.finish();
    std::memcpy(k, d.data(), d.size());
  } else if (keyLen > 0) {
    std::memcpy(k, key, keyLen);
  }
  uint8_t pad[64];
  for (int i = 0; i < 64; ++i) pad[i] = static_cast<uint8_t>(k[i] ^ 0x36);
  Sha256 inner;
  inner.update(pad, sizeof(pad));
  inner.update(msg, msgLen);
  const auto innerDigest = inner.finish();
  for (int i = 0; i < 64; ++i) pad[i] = static_cast<uint8_t>(k[i] ^ 0x5c);
  Sha256 outer;
  outer.update(pad, sizeof(pad));
  outer.update(innerDigest.data(), innerDigest.size());
  return outer.finish();
}

KvAuth KvAuth::make(const std::string& job, const std::string& secret) {
  KvAuth a;
  a.job = job;
  a.hasSecret = !secret.empty();
  a.key = hmacSha256(reinterpret_cast<const uint8_t*>(secret.data()), secret.size(),
                     reinterpret_cast<const uint8_t*>(kKeyLabel), sizeof(kKeyLabel) - 1);
  return a;
}

KvAuth KvAuth::fromEnvironment() {
  auto env = [](const char* k, const char* dflt) {
    const char* v = std::getenv(k);
    return std::string(v && *v ? v : dflt);
  };
  std::string secret = env("EDIT_STORE_SECRET", "");
  if (secret.empty()) secret = env("EDIT_TELEMETRY_TOKEN", "");
  return make(env("EDIT_NAMESPACE", "default") + "/" + env("EDIT_JOB", "local"), secret);
}

// ---- the table ------------------------------------------------------------------------

bool KvTable::allPresent(const std::vector<std::string>& keys) const {
  return std::all_of(keys.begin(), keys.end(), [&](const std::string& k) { return data_.count(k) > 0; });
}

void KvTable::setOnChange(std::function<void(const std::string&)> f) {
  std::lock_guard<std::mutex> lock(hookMu_);
  onChange_ = std::move(f);
}

void KvTable::changed(const std::string& key) {
  changed_.notify_all();
  std::lock_guard<std::mutex> lock(hookMu_);
  if (onChange_) onChange_(key);
}

void KvTable::checkValue(const std::string& key, const Bytes& value) const {
  if (value.size() > limits_.maxValueBytes)
    throw KvError("store: a value of " + std::to_string(value.size()) + " bytes for key " + printable(key) +
                  " is over the limit of " + std::to_string(limits_.maxValueBytes) + " bytes");
}

void KvTable::set(const std::string& key, const Bytes& value) {
  checkValue(key, value);
  {
    std::lock_guard<std::mutex> lock(mu_);
    data_[key] = value;
  }
  changed(key);
}

void KvTable::wait(const std::vector<std::string>& keys, milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  const auto deadline = deadlineAfter(timeout.count(), Clock::now());
  while (!allPresent(keys)) {
    if (stopped_) throw KvError("store: the store is shutting down");
    if (deadline == Clock::time_point::max()) {
      changed_.wait(lock);
    } else if (changed_.wait_until(lock, deadline) == std::cv_status::timeout && !allPresent(keys)) {
      throw KvError("store: timed out after " + std::to_string(timeout.count()) + " ms waiting for " +
                    keyList(keys));
    }
  }
}

Bytes KvTable::get(const std::string& key, milliseconds timeout) {
  wait({key}, timeout);
  std::lock_guard<std::mutex> lock(mu_);
  return data_.at(key);
}

bool KvTable::tryGet(const std::string& key, Bytes* value) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = data_.find(key);
  if (it == data_.end()) return false;
  *value = it->second;
  return true;
}

int64_t KvTable::add(const std::string& key, int64_t delta) {
  int64_t sum = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    int64_t cur = 0;
    auto it = data_.find(key);
    if (it != data_.end()) {
      const std::string text(it->second.begin(), it->second.end());
      try {
        size_t used = 0;
        cur = std::stoll(text, &used);
        if (used != text.size()) throw std::invalid_argument(text);
      } catch (const std::exception&) {
        throw KvError("store: add on key " + printable(key) + ", which holds \"" + printable(text, 64) +
                      "\", not an integer");
      }
    }
    if (__builtin_add_overflow(cur, delta, &sum))
      throw KvError("store: add of " + std::to_string(delta) + " to key " + printable(key) + " (" +
                    std::to_string(cur) + ") overflows 64 bits");
    const std::string s = std::to_string(sum);
    data_[key] = Bytes(s.begin(), s.end());
  }
  changed(key);
  return sum;
}

Bytes KvTable::compareSet(const std::string& key, const Bytes& expected, const Bytes& desired) {
  checkValue(key, desired);
  Bytes result;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = data_.find(key);
    if (it == data_.end()) {
      if (!expected.empty()) return expected;
      data_[key] = desired;
      result = desired;
    } else if (it->second == expected) {
      it->second = desired;
      result = desired;
    } else {
      return it->second;
    }
  }
  changed(key);
  return result;
}

bool KvTable::check(const std::vector<std::string>& keys) {
  std::lock_guard<std::mutex> lock(mu_);
  return allPresent(keys);
}

bool KvTable::deleteKey(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  return data_.erase(key) > 0;
}

int64_t KvTable::numKeys() {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(data_.size());
}

void KvTable::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopped_ = true;
  }
  changed_.notify_all();
}

// ---- one connection's protocol ------------------------------------------------------------

KvSession::KvSession(KvTable& table, const KvAuth& auth, const KvLimits& limits, Clock::time_point now)
    : table_(&table),
      auth_(auth),
      limits_(limits),
      handshakeDeadline_(now + limits.handshakeTimeout),
      frameDeadline_(Clock::time_point::max()),
      sendDeadline_(Clock::time_point::max()),
      waitDeadline_(Clock::time_point::max()) {
  now_ = now;
}

KvSession KvSession::authenticated(KvTable& table, const KvAuth& auth, const KvLimits& limits, Clock::time_point now) {
  KvSession s(table, auth, limits, now);
  s.state_ = State::Ready;
  s.handshakeDeadline_ = Clock::time_point::max();
  return s;
}

KvSession KvSession::busy(KvTable& table, const KvLimits& limits, int connections, Clock::time_point now) {
  KvSession s(table, KvAuth::make("", ""), limits, now);
  s.replyText(kBusy, "store: busy: " + std::to_string(connections) + " connections are open, the limit " +
                         "(KvLimits::maxConnections); retrying");
  s.close("busy");
  return s;
}

void KvSession::reply(Status status, const Bytes& payload) {
  if (outputSize() == 0) sendDeadline_ = now_ + limits_.frameTimeout;
  Writer w;
  w.u32(static_cast<uint32_t>(payload.size() + 1)).u8(status);
  out_.insert(out_.end(), w.b.begin(), w.b.end());
  out_.insert(out_.end(), payload.begin(), payload.end());
}

void KvSession::replyText(Status status, const std::string& message) { reply(status, Writer().str(message).b); }

void KvSession::close(const std::string& reason) {
  closing_ = true;
  if (closeReason_.empty()) closeReason_ = reason;
  waitKeys_.clear();
  frameDeadline_ = waitDeadline_ = Clock::time_point::max();
}

void KvSession::refuse(const std::string& message) {
  replyText(kRefused, message);
  close(message);
}

void KvSession::consumed(size_t n, Clock::time_point now) {
  outOff_ = std::min(out_.size(), outOff_ + n);
  if (outOff_ == out_.size()) {
    out_.clear();
    outOff_ = 0;
    sendDeadline_ = Clock::time_point::max();
  }
  pump(now);
}

bool KvSession::wantsRead() const {
  const uint32_t limit = state_ == State::Ready ? limits_.maxFrameBytes : limits_.maxHelloBytes;
  return !closing_ && in_.size() - inOff_ < size_t{limit} + 4;
}

KvSession::Clock::time_point KvSession::deadline() const {
  auto d = std::min(frameDeadline_, outputSize() > 0 ? sendDeadline_ : Clock::time_point::max());
  if (state_ != State::Ready) d = std::min(d, handshakeDeadline_);
  if (!waitKeys_.empty()) d = std::min(d, waitDeadline_);
  return closing_ ? (outputSize() > 0 ? sendDeadline_ : Clock::time_point::max()) : d;
}

void KvSession::received(const uint8_t* data, size_t n, Clock::time_point now) {
  if (closing_ || n == 0) return;  // a closing session only sends what is left
  in_.insert(in_.end(), data, data + n);
  pump(now);
}

void KvSession::pump(Clock::time_point now) {
  now_ = now;
  if (outputSize() > 0 && now >= sendDeadline_) {
    // The client does not read its replies: nothing more can reach it.
    closing_ = true;
    out_.clear();
    outOff_ = 0;
    close("a reply was not read within " + std::to_string(limits_.frameTimeout.count()) + " ms");
    return;
  }
  if (closing_) return;
  if (state_ != State::Ready && now >= handshakeDeadline_) {
    refuse("store: no handshake within " + std::to_string(limits_.handshakeTimeout.count()) +
           " ms of connecting (not a store client, or a stalled one)");
    return;
  }
  if (frameDeadline_ != Clock::time_point::max() && now >= frameDeadline_) {
    const std::string m = "store: a frame did not arrive in full within " +
                          std::to_string(limits_.frameTimeout.count()) + " ms (a stalled or slow client)";
    if (state_ == State::Ready) {
      replyText(kError, m);
      close(m);
    } else {
      refuse(m);
    }
    return;
  }
  if (!waitKeys_.empty() && !finishWait(now)) return;
  bool partial = false;
  while (!closing_ && waitKeys_.empty() && outputSize() < kOutHighWater) {
    const size_t avail = in_.size() - inOff_;
    if (avail == 0) break;
    if (avail < 4) {
      partial = true;
      break;
    }
    const uint32_t len = le32(in_.data() + inOff_);
    if (state_ == State::Ready && len > limits_.maxFrameBytes) {
      const std::string m = "store: a frame of " + std::to_string(len) + " bytes is over the limit of " +
                            std::to_string(limits_.maxFrameBytes) + " bytes (a value over " +
                            std::to_string(limits_.maxValueBytes) + " bytes?)";
      replyText(kError, m);
      close(m);
      break;
    }
    if (state_ != State::Ready && len > limits_.maxHelloBytes) {
      refuse("store: a first frame of " + std::to_string(len) + " bytes, but a store client's hello is at most " +
             std::to_string(limits_.maxHelloBytes) + " (something other than a job's worker on this port?)");
      break;
    }
    if (avail - 4 < len) {
      partial = true;
      break;
    }
    const size_t at = inOff_ + 4;
    inOff_ = at + len;
    frameDeadline_ = Clock::time_point::max();
    handleFrame(in_.data() + at, len, now);
  }
  if (partial) {
    if (frameDeadline_ == Clock::time_point::max()) frameDeadline_ = now + limits_.frameTimeout;
  } else {
    frameDeadline_ = Clock::time_point::max();
  }
  if (inOff_ == in_.size()) {
    in_.clear();
    inOff_ = 0;
  } else if (inOff_ > (64u << 10) && inOff_ > in_.size() / 2) {
    in_.erase(in_.begin(), in_.begin() + static_cast<std::ptrdiff_t>(inOff_));
    inOff_ = 0;
  }
}

void KvSession::handleFrame(const uint8_t* body, size_t n, Clock::time_point now) {
  switch (state_) {
    case State::Hello: handleHello(body, n); break;
    case State::Proof: handleProof(body, n); break;
    case State::Ready: handleRequest(body, n, now); break;
  }
}

void KvSession::handleHello(const uint8_t* body, size_t n) {
  std::string job;
  Bytes nonce;
  try {
    Reader in{body, n, "hello"};
    if (n < 4 || std::memcmp(body, kMagic, 4) != 0) {
      refuse("store: the first frame is not a store hello (another protocol on this port?)");
      return;
    }
    in.at = 4;
    const uint8_t version = in.u8();
    if (version != kVersion) {
      refuse("store: protocol version " + std::to_string(version) + ", but this store speaks version " +
             std::to_string(kVersion) + " (workers of different builds in one job?)");
      return;
    }
    job = in.str("the job name", kMaxJobBytes);
    nonce = in.bytes("the nonce", kNonceBytes);
    in.end("hello");
    if (nonce.size() != kNonceBytes) throw KvError("store: malformed hello: its nonce must be 32 bytes");
  } catch (const KvError& e) {
    refuse(e.what());
    return;
  }
  if (job != auth_.job) {
    refuse("store: this store belongs to job " + printable(auth_.job) + ", not " + printable(job) +
           " (two jobs on one MASTER_ADDR:MASTER_PORT?)");
    return;
  }
  std::copy(nonce.begin(), nonce.end(), clientNonce_.begin());
  try {
    randomBytes(serverNonce_.data(), serverNonce_.size());
  } catch (const KvError& e) {
    refuse(e.what());
    return;
  }
  const auto p = proof(auth_, kServerProofLabel, clientNonce_, serverNonce_);
  reply(kOk, Writer().bytes(serverNonce_.data(), serverNonce_.size()).bytes(p.data(), p.size()).b);
  state_ = State::Proof;
}

void KvSession::handleProof(const uint8_t* body, size_t n) {
  Bytes got;
  try {
    Reader in{body, n, "proof"};
    got = in.bytes("the proof", 32);
    in.end("proof");
  } catch (const KvError& e) {
    refuse(e.what());
    return;
  }
  const auto want = proof(auth_, kClientProofLabel, clientNonce_, serverNonce_);
  if (got.size() != want.size() || !sameBytes(got.data(), want.data(), want.size())) {
    refuse("store: wrong secret for job " + printable(auth_.job) +
           " (the worker's EDIT_STORE_SECRET or EDIT_TELEMETRY_TOKEN differs from rank 0's)");
    return;
  }
  reply(kOk, {});
  state_ = State::Ready;
  handshakeDeadline_ = Clock::time_point::max();
}

void KvSession::handleRequest(const uint8_t* body, size_t n, Clock::time_point now) {
  const uint32_t maxKey = limits_.maxKeyBytes, maxValue = limits_.maxValueBytes;
  try {
    Reader in{body, n};
    Writer out;
    const uint8_t op = in.u8();
    switch (static_cast<Op>(op)) {
      case Op::Set: {
        const std::string k = in.str("a key", maxKey);
        const Bytes v = in.bytes("a value", maxValue);
        in.end("set");
        table_->set(k, v);
        break;
      }
      case Op::Get:
      case Op::Wait: {
        std::vector<std::string> keys;
        if (static_cast<Op>(op) == Op::Get)
          keys.push_back(in.str("a key", maxKey));
        else
          keys = in.strs(limits_.maxKeysPerRequest, maxKey);
        const int64_t ms = in.i64();
        in.end(static_cast<Op>(op) == Op::Get ? "get" : "wait");
        waitKeys_ = std::move(keys);
        waitIsGet_ = static_cast<Op>(op) == Op::Get;
        waitMs_ = ms;
        waitNext_ = 0;
        waitDeadline_ = deadlineAfter(ms, now);
        finishWait(now);
        return;
      }
      case Op::Add: {
        const std::string k = in.str("a key", maxKey);
        const int64_t delta = in.i64();
        in.end("add");
        out.i64(table_->add(k, delta));
        break;
      }
      case Op::CompareSet: {
        const std::string k = in.str("a key", maxKey);
        const Bytes expected = in.bytes("an expected value", maxValue);
        const Bytes desired = in.bytes("a value", maxValue);
        in.end("compare-set");
        out.bytes(table_->compareSet(k, expected, desired));
        break;
      }
      case Op::Check: {
        const auto keys = in.strs(limits_.maxKeysPerRequest, maxKey);
        in.end("check");
        out.u8(table_->check(keys) ? 1 : 0);
        break;
      }
      case Op::Delete: {
        const std::string k = in.str("a key", maxKey);
        in.end("delete");
        out.u8(table_->deleteKey(k) ? 1 : 0);
        break;
      }
      case Op::NumKeys:
        in.end("num-keys");
        out.i64(table_->numKeys());
        break;
      default:
        throw KvError("store: unknown request op " + std::to_string(op) + " (a client of another build?)");
    }
    reply(kOk, out.b);
  } catch (const std::exception& e) {
    replyText(kError, e.what());
  }
}

bool KvSession::finishWait(Clock::time_point now) {
  if (waitIsGet_) {
    Bytes v;
    if (table_->tryGet(waitKeys_[0], &v)) {
      waitKeys_.clear();
      reply(kOk, Writer().bytes(v).b);
      return true;
    }
  } else {
    // Keys found stay found (a delete meanwhile is caught by the final check), so each
    // wake-up looks from the first key still missing.
    while (waitNext_ < waitKeys_.size() && table_->check({waitKeys_[waitNext_]})) ++waitNext_;
    if (waitNext_ == waitKeys_.size()) {
      if (table_->check(waitKeys_)) {
        waitKeys_.clear();
        reply(kOk, {});
        return true;
      }
      waitNext_ = 0;
    }
  }
  if (now >= waitDeadline_) {
    const std::string m = "store: timed out after " + std::to_string(waitMs_) + " ms waiting for " + keyList(waitKeys_);
    waitKeys_.clear();
    replyText(kError, m);
    return true;
  }
  return false;
}

const std::string& KvSession::waitKey() const {
  static const std::string none;
  if (waitKeys_.empty()) return none;
  return waitKeys_[std::min(waitNext_, waitKeys_.size() - 1)];
}

// ---- the server -----------------------------------------------------------------------

struct KvServer::Loop {
  struct Conn {
    Conn(int f, KvSession s, std::string p) : fd(f), session(std::move(s)), peer(std::move(p)) {}
    int fd = -1;
    KvSession session;
    std::string peer;
    bool busy = false;
    bool draining = false;  // the last reply went; reading what is left before closing
    Clock::time_point drainUntil;
    std::string waitKey;  // registered under this key in `waiters`
    bool registered = false;
    uint32_t events = 0;
  };

  KvTable& table;
  KvLimits limits;
  KvAuth auth;
  int listenFd = -1, epfd = -1, wakeFd = -1;
  std::unordered_map<int, std::unique_ptr<Conn>> conns;
  std::unordered_map<std::string, std::vector<int>> waiters;
  std::mutex changedMu;
  std::vector<std::string> changedKeys;
  std::atomic<bool> stop{false};
  std::atomic<int> open{0};
  std::atomic<int64_t> refused{0};
  int busyOpen = 0;
  Clock::time_point nextSweep = Clock::time_point::max();
  bool acceptPaused = false;
  Clock::time_point acceptResume;
  bool loggedAcceptError = false;

  Loop(KvTable& t, const KvLimits& l, const KvAuth& a) : table(t), limits(l), auth(a) {}
  ~Loop() {
    for (auto& [fd, c] : conns) ::close(fd);
    if (listenFd >= 0) ::close(listenFd);
    if (epfd >= 0) ::close(epfd);
    if (wakeFd >= 0) ::close(wakeFd);
  }

  void wake() {
    const uint64_t one = 1;
    (void)!::write(wakeFd, &one, sizeof(one));
  }

  void onChange(const std::string& key) {
    bool first;
    {
      std::lock_guard<std::mutex> lock(changedMu);
      first = changedKeys.empty();
      changedKeys.push_back(key);
    }
    if (first) wake();
  }

  void watch(Conn& c) {
    uint32_t ev = EPOLLRDHUP;
    if (c.draining || c.session.wantsRead()) ev |= EPOLLIN;
    if (!c.draining && c.session.outputSize() > 0) ev |= EPOLLOUT;
    if (ev == c.events) return;
    epoll_event e{};
    e.events = ev;
    e.data.fd = c.fd;
    ::epoll_ctl(epfd, EPOLL_CTL_MOD, c.fd, &e);
    c.events = ev;
  }

  void unregister(Conn& c) {
    if (!c.registered) return;
    auto it = waiters.find(c.waitKey);
    if (it != waiters.end()) {
      auto& v = it->second;
      v.erase(std::remove(v.begin(), v.end(), c.fd), v.end());
      if (v.empty()) waiters.erase(it);
    }
    c.registered = false;
  }

  void remove(Conn& c) {
    unregister(c);
    ::epoll_ctl(epfd, EPOLL_CTL_DEL, c.fd, nullptr);
    ::close(c.fd);
    if (c.busy)
      --busyOpen;
    else
      --open;
    const int fd = c.fd;  // not a reference into the element being erased
    conns.erase(fd);
  }

  void noteRefusal(const Conn& c) {
    if (c.busy || c.session.isAuthenticated()) return;
    const int64_t n = ++refused;
    if (n <= kLoggedRefusals)
      std::cerr << "store: refused a client at " << c.peer << ": " << c.session.closeReason()
                << (n == kLoggedRefusals ? " (further refusals are not logged)" : "") << std::endl;
  }

  // Sends what the session has, lets it go on, and watches the socket for what it needs.
  void service(Conn& c, Clock::time_point now, bool peerGone) {
    for (int rounds = 0; rounds < 64 && c.session.outputSize() > 0; ++rounds) {
      const ssize_t n = ::send(c.fd, c.session.output(), c.session.outputSize(), MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) {
        c.session.consumed(static_cast<size_t>(n), now);
        continue;
      }
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) break;
      peerGone = true;
      break;
    }
    if (peerGone) {
      remove(c);  // a pending get or wait ends with its client
      return;
    }
    if (c.session.closing() && c.session.outputSize() == 0) {
      // The reply went: FIN, then read what the client still sends for a moment, so that
      // closing with unread input does not reset the connection before it reads the reply.
      noteRefusal(c);
      unregister(c);
      ::shutdown(c.fd, SHUT_WR);
      c.draining = true;
      c.drainUntil = now + std::min<milliseconds>(limits.frameTimeout, milliseconds(2000));
      nextSweep = std::min(nextSweep, c.drainUntil);
      watch(c);
      return;
    }
    const std::string& key = c.session.waitKey();
    if (key.empty() || !c.session.waitingFor().size()) {
      unregister(c);
    } else if (!c.registered || c.waitKey != key) {
      unregister(c);
      c.waitKey = key;
      waiters[key].push_back(c.fd);
      c.registered = true;
    }
    watch(c);
    nextSweep = std::min(nextSweep, c.session.deadline());
  }

  void readable(Conn& c, uint32_t events, Clock::time_point now) {
    bool peerGone = (events & (EPOLLHUP | EPOLLERR)) != 0;
    uint8_t buf[64 << 10];
    for (int rounds = 0; rounds < 16 && (c.draining || c.session.wantsRead()); ++rounds) {
      const ssize_t n = ::recv(c.fd, buf, sizeof(buf), MSG_DONTWAIT);
      if (n > 0) {
        if (!c.draining) c.session.received(buf, static_cast<size_t>(n), now);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) peerGone = true;
      break;
    }
    // Half-closed while a request waits its turn: our protocol has no half-close.
    if ((events & EPOLLRDHUP) && !c.draining && !c.session.wantsRead()) peerGone = true;
    if (c.draining) {
      if (peerGone || now >= c.drainUntil) remove(c);
      return;
    }
    service(c, now, peerGone);
  }

  void acceptSome(Clock::time_point now) {
    for (int i = 0; i < 64; ++i) {
      sockaddr_storage addr{};
      socklen_t len = sizeof(addr);
      const int fd = ::accept4(listenFd, reinterpret_cast<sockaddr*>(&addr), &len, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return;
        // Out of descriptors or memory: the listener would stay readable and spin the
        // loop. Stop accepting for a moment; waiting clients retry or time out.
        if (!loggedAcceptError)
          std::cerr << "store: cannot accept a connection: " << std::strerror(errno)
                    << " (RLIMIT_NOFILE?); pausing accepts for 100 ms" << std::endl;
        loggedAcceptError = true;
        acceptPaused = true;
        acceptResume = now + milliseconds(100);
        epoll_event e{};
        e.events = 0;
        e.data.fd = listenFd;
        ::epoll_ctl(epfd, EPOLL_CTL_MOD, listenFd, &e);
        return;
      }
      setNoDelay(fd);
      setKeepAlive(fd);
      const bool busy = open.load() >= limits.maxConnections;
      if (busy && busyOpen >= kMaxBusySessions) {
        ::close(fd);
        continue;
      }
      auto c = std::make_unique<Conn>(
          fd, busy ? KvSession::busy(table, limits, open.load(), now) : KvSession(table, auth, limits, now),
          peerName(addr));
      c->busy = busy;
      if (busy)
        ++busyOpen;
      else
        ++open;
      epoll_event e{};
      e.events = EPOLLIN | EPOLLRDHUP;
      e.data.fd = fd;
      c->events = e.events;
      if (::epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &e) != 0) {
        ::close(fd);
        if (busy)
          --busyOpen;
        else
          --open;
        continue;
      }
      Conn& ref = *c;
      conns.emplace(fd, std::move(c));
      service(ref, now, false);
    }
  }

  void drainChanged(Clock::time_point now) {
    std::vector<std::string> keys;
    {
      std::lock_guard<std::mutex> lock(changedMu);
      keys.swap(changedKeys);
    }
    for (const auto& k : keys) {
      auto it = waiters.find(k);
      if (it == waiters.end()) continue;
      std::vector<int> fds = std::move(it->second);
      waiters.erase(it);
      for (int fd : fds) {
        auto c = conns.find(fd);
        if (c == conns.end()) continue;
        c->second->registered = false;
        c->second->session.pump(now);
        service(*c->second, now, false);
      }
    }
  }

  // Deadlines: handshakes, frames, replies, waits, lingering closes.
  static Clock::time_point deadlineOf(const Conn& c) {
    return c.draining ? c.drainUntil : c.session.deadline();
  }

  void sweep(Clock::time_point now) {
    std::vector<int> due;
    for (auto& [fd, c] : conns)
      if (deadlineOf(*c) <= now) due.push_back(fd);
    for (int fd : due) {
      auto it = conns.find(fd);
      if (it == conns.end()) continue;
      Conn& c = *it->second;
      if (c.draining) {
        remove(c);
        continue;
      }
      c.session.pump(now);
      service(c, now, false);
    }
    // A pass over every connection: at most every 10 ms.
    auto next = Clock::time_point::max();
    for (auto& [fd, c] : conns) next = std::min(next, deadlineOf(*c));
    nextSweep = std::max(next, now + milliseconds(10));
  }

  void run() {
    epoll_event events[256];
    while (!stop.load()) {
      auto now = Clock::now();
      int timeout = 1000;
      auto until = nextSweep;
      if (acceptPaused) until = std::min(until, acceptResume);
      if (until != Clock::time_point::max())
        timeout = static_cast<int>(std::clamp<int64_t>(
            std::chrono::duration_cast<milliseconds>(until - now).count() + 1, 0, 1000));
      const int n = ::epoll_wait(epfd, events, 256, timeout);
      if (n < 0 && errno != EINTR) {
        std::cerr << "store: epoll_wait failed: " << std::strerror(errno) << std::endl;
        std::this_thread::sleep_for(milliseconds(10));
        continue;
      }
      now = Clock::now();
      for (int i = 0; i < n; ++i) {
        const int fd = events[i].data.fd;
        if (fd == wakeFd) {
          uint64_t v;
          (void)!::read(wakeFd, &v, sizeof(v));
        } else if (fd == listenFd) {
          acceptSome(now);
        } else if (auto it = conns.find(fd); it != conns.end()) {
          Conn& c = *it->second;
          if (events[i].events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR))
            readable(c, events[i].events, now);
          else
            service(c, now, false);
        }
      }
      drainChanged(now);
      if (acceptPaused && now >= acceptResume) {
        acceptPaused = false;
        epoll_event e{};
        e.events = EPOLLIN;
        e.data.fd = listenFd;
        ::epoll_ctl(epfd, EPOLL_CTL_MOD, listenFd, &e);
      }
      if (now >= nextSweep) sweep(now);
    }
  }
};

namespace {

// Binds and listens; -1 with errno set on failure.
int listenOn(const std::string& host, int port) {
  if (host.empty()) {
    // Dual-stack: one socket takes IPv6 and IPv4 clients; IPv4 alone where IPv6 is off.
    int fd = ::socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    const bool v6 = fd >= 0;
    if (!v6) fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return -1;
    int one = 1, zero = 0;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    int rc;
    if (v6) {
      ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
      sockaddr_in6 a{};
      a.sin6_family = AF_INET6;
      a.sin6_addr = in6addr_any;
      a.sin6_port = htons(static_cast<uint16_t>(port));
      rc = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
    } else {
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_addr.s_addr = htonl(INADDR_ANY);
      a.sin_port = htons(static_cast<uint16_t>(port));
      rc = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
    }
    // TCPStore's backlog: a whole job's ranks connect at once (the kernel caps it at
    // net.core.somaxconn).
    if (rc == 0 && ::listen(fd, 16384) == 0) return fd;
    const int err = errno;
    ::close(fd);
    errno = err;
    return -1;
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const int gai = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
  if (gai != 0 || !res) {
    errno = EADDRNOTAVAIL;
    return -1;
  }
  int err = EADDRNOTAVAIL;
  for (addrinfo* a = res; a; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) {
      err = errno;
      continue;
    }
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, 16384) == 0) {
      ::freeaddrinfo(res);
      return fd;
    }
    err = errno;
    ::close(fd);
  }
  ::freeaddrinfo(res);
  errno = err;
  return -1;
}

}  // namespace

KvServer::KvServer(int port, milliseconds bindTimeout, Options options)
    : table_(options.limits), loop_(std::make_unique<Loop>(table_, options.limits, options.auth)) {
  const auto deadline = Clock::now() + bindTimeout;
  const std::string where = (options.bindHost.empty() ? std::string("port ") : options.bindHost + " port ") +
                            std::to_string(port);
  for (;;) {
    loop_->listenFd = listenOn(options.bindHost, port);
    if (loop_->listenFd >= 0) break;
    const int err = errno;
    if (err != EADDRINUSE || Clock::now() >= deadline)
      throw KvError("store: cannot listen on " + where + ": " + std::strerror(err) +
                    (err == EADDRINUSE ? " (is another rank 0 of this job still running?)"
                     : err == EADDRNOTAVAIL ? " (EDIT_BIND_ADDR or POD_IP is not an address of this host?)"
                                            : ""));
    std::this_thread::sleep_for(milliseconds(100));
  }
  sockaddr_storage a{};
  socklen_t len = sizeof(a);
  ::getsockname(loop_->listenFd, reinterpret_cast<sockaddr*>(&a), &len);
  port_ = a.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&a)->sin6_port)
                                  : ntohs(reinterpret_cast<sockaddr_in*>(&a)->sin_port);
  loop_->epfd = ::epoll_create1(EPOLL_CLOEXEC);
  loop_->wakeFd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (loop_->epfd < 0 || loop_->wakeFd < 0)
    throw KvError(std::string("store: cannot create its event loop: ") + std::strerror(errno));
  for (int fd : {loop_->listenFd, loop_->wakeFd}) {
    epoll_event e{};
    e.events = EPOLLIN;
    e.data.fd = fd;
    ::epoll_ctl(loop_->epfd, EPOLL_CTL_ADD, fd, &e);
  }
  Loop* loop = loop_.get();
  table_.setOnChange([loop](const std::string& key) { loop->onChange(key); });
  try {
    thread_ = std::thread([loop] { loop->run(); });
  } catch (const std::system_error& e) {
    table_.setOnChange(nullptr);
    throw KvError(std::string("store: cannot start its thread: ") + e.what());
  }
}

KvServer::~KvServer() {
  table_.setOnChange(nullptr);
  loop_->stop = true;
  loop_->wake();
  thread_.join();
  table_.stop();  // wakes the host's own blocked gets and waits
  loop_.reset();  // closes every connection
}

int KvServer::connections() const { return loop_->open.load(); }

int64_t KvServer::refusals() const { return loop_->refused.load(); }

// ---- the client -----------------------------------------------------------------------

KvClient::KvClient(const std::string& host, int port, milliseconds connectTimeout, milliseconds timeout,
                   const KvAuth& auth, const KvLimits& limits)
    : host_(host), port_(port), timeout_(timeout), auth_(auth), limits_(limits) {
  const auto deadline = Clock::now() + connectTimeout;
  std::string last = "no attempt";
  for (;;) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    const int gai = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
    int fd = -1;
    if (gai != 0) {
      last = std::string("cannot resolve the name: ") + ::gai_strerror(gai);
    } else {
      for (addrinfo* a = res; a && fd < 0; a = a->ai_next) {
        const int s = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
        if (s < 0) continue;
        int rc = ::connect(s, a->ai_addr, a->ai_addrlen);
        if (rc != 0 && errno == EINPROGRESS) {
          // Bounded: a name that points nowhere must not hold the caller past its deadline.
          const auto left = std::max<int64_t>(
              1, std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count());
          pollfd p{s, POLLOUT, 0};
          int err = ETIMEDOUT;
          if (::poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 1000))) == 1) {
            socklen_t len = sizeof(err);
            ::getsockopt(s, SOL_SOCKET, SO_ERROR, &err, &len);
          }
          rc = err == 0 ? 0 : -1;
          errno = err;
        }
        if (rc == 0) {
          ::fcntl(s, F_SETFL, ::fcntl(s, F_GETFL) & ~O_NONBLOCK);
          setNoDelay(s);
          fd = s;
        } else {
          last = std::strerror(errno);
          ::close(s);
        }
      }
      ::freeaddrinfo(res);
    }
    if (fd >= 0) {
      try {
        handshake(fd);
        fd_ = fd;
        return;
      } catch (const KvRefused&) {
        ::close(fd);
        throw;
      } catch (const KvError& e) {
        ::close(fd);
        last = e.what();  // busy, or not answering yet: try again
      }
    }
    if (Clock::now() >= deadline)
      throw KvError("store: cannot connect to " + where() + " within " + std::to_string(connectTimeout.count()) +
                    " ms (" + last + ")");
    std::this_thread::sleep_for(milliseconds(100));
  }
}

void KvClient::handshake(int fd) {
  const auto deadline = Clock::now() + (timeout_.count() > 0 ? timeout_ : milliseconds(30000));
  std::array<uint8_t, 32> clientNonce{};
  randomBytes(clientNonce.data(), clientNonce.size());
  Writer hello;
  hello.raw(reinterpret_cast<const uint8_t*>(kMagic), 4).u8(kVersion).str(auth_.job).bytes(clientNonce.data(),
                                                                                          clientNonce.size());
  auto exchange = [&](const Bytes& request, const char* step) {
    if (!sendAll(fd, frame(request)))
      throw KvError("store: the connection to " + where() + " closed during the handshake");
    Bytes body;
    const Read r = readFrame(fd, body, deadline, kMaxHandshakeReply);
    if (r == Read::TimedOut)
      throw KvError("store: no answer to the handshake's " + std::string(step) + " from " + where() + " within " +
                    std::to_string((timeout_.count() > 0 ? timeout_ : milliseconds(30000)).count()) + " ms");
    if (r == Read::TooLarge)
      throw KvRefused("store: " + where() + " does not speak the store's protocol (an oversized answer to the hello)");
    if (r != Read::Ok || body.empty())
      throw KvError("store: the connection to " + where() + " closed during the handshake");
    Reader in{body.data(), body.size()};
    const uint8_t status = in.u8();
    if (status == KvSession::kOk) return Bytes(body.begin() + 1, body.end());
    std::string message;
    try {
      message = in.str("a message", kMaxHandshakeReply);
    } catch (const KvError&) {
      message = "store: an unreadable refusal";
    }
    if (status == KvSession::kRefused) throw KvRefused(message + " (store at " + where() + ")");
    throw KvError(message + " (store at " + where() + ")");
  };

  const Bytes challenge = exchange(hello.b, "hello");
  std::array<uint8_t, 32> serverNonce{};
  Bytes serverProof;
  try {
    Reader in{challenge.data(), challenge.size(), "challenge"};
    const Bytes n = in.bytes("the nonce", kNonceBytes);
    serverProof = in.bytes("the proof", 32);
    in.end("challenge");
    if (n.size() != kNonceBytes || serverProof.size() != 32) throw KvError("store: short nonce or proof");
    std::copy(n.begin(), n.end(), serverNonce.begin());
  } catch (const KvError& e) {
    throw KvRefused("store: " + where() + " answered the hello with a malformed challenge (" + e.what() + ")");
  }
  const auto want = proof(auth_, kServerProofLabel, clientNonce, serverNonce);
  const bool serverKnowsSecret = sameBytes(serverProof.data(), want.data(), want.size());
  // Sent either way: with a wrong secret the store refuses it and logs why, and its
  // refusal is what this client reports.
  const auto mine = proof(auth_, kClientProofLabel, clientNonce, serverNonce);
  exchange(Writer().bytes(mine.data(), mine.size()).b, "proof");
  if (!serverKnowsSecret)
    throw KvRefused("store: " + where() + " accepted this worker's proof but could not prove job " +
                    printable(auth_.job) + "'s secret itself (an impostor store on this address?)");
}

KvClient::~KvClient() {
  if (fd_ >= 0) ::close(fd_);
}

std::string KvClient::where() const { return host_ + ":" + std::to_string(port_); }

Bytes KvClient::call(const Bytes& request, milliseconds wait) {
  if (fd_ < 0) throw KvError("store: the connection to " + where() + " was lost earlier");
  if (request.size() > limits_.maxFrameBytes)
    throw KvError("store: a request of " + std::to_string(request.size()) + " bytes is over the store's limit of " +
                  std::to_string(limits_.maxFrameBytes) + " bytes per frame");
  if (!sendAll(fd_, frame(request))) {
    ::close(fd_);
    fd_ = -1;
    throw KvError("store: the connection to " + where() + " was lost (the rank hosting the store left?)");
  }
  // The reply may be held back by the server for a get's or wait's own timeout.
  const bool unbounded = wait.count() < 0 || timeout_.count() <= 0;
  const auto deadline = unbounded ? Clock::time_point::max() : Clock::now() + timeout_ + wait;
  Bytes body;
  // A reply holds at most one value and its framing.
  const Read r = readFrame(fd_, body, deadline, limits_.maxValueBytes + 64);
  if (r != Read::Ok || body.empty()) {
    ::close(fd_);  // a late reply would answer the next request
    fd_ = -1;
    throw KvError(r == Read::TimedOut
                      ? "store: no reply from " + where() + " within " +
                            std::to_string((timeout_ + wait).count()) + " ms (is the rank hosting it stopped?)"
                  : r == Read::TooLarge
                      ? "store: a reply from " + where() + " is over the store's limits (another protocol?)"
                      : "store: the connection to " + where() + " was lost (the rank hosting the store left?)");
  }
  Reader in{body.data(), body.size()};
  const uint8_t status = in.u8();
  if (status != KvSession::kOk) {
    std::string message;
    try {
      message = in.str("a message", limits_.maxValueBytes);
    } catch (const KvError&) {
      message = "store: an unreadable error";
    }
    throw KvError(message + " (store at " + where() + ")");
  }
  return Bytes(body.begin() + 1, body.end());
}

namespace {
// A reply's fields; a malformed reply is a KvError naming the store.
template <typename F>
auto parseReply(const Bytes& r, const std::string& where, F&& f) {
  try {
    Reader in{r.data(), r.size(), "reply"};
    auto v = f(in);
    in.end("reply");
    return v;
  } catch (const KvError& e) {
    throw KvError(std::string(e.what()) + " (a reply from the store at " + where + ")");
  }
}
}  // namespace

void KvClient::set(const std::string& key, const Bytes& value) {
  call(Writer().u8(static_cast<uint8_t>(Op::Set)).str(key).bytes(value).b);
}

Bytes KvClient::get(const std::string& key, milliseconds timeout) {
  const Bytes r = call(Writer().u8(static_cast<uint8_t>(Op::Get)).str(key).i64(timeout.count()).b,
                       timeout.count() <= 0 ? milliseconds(-1) : timeout);
  return parseReply(r, where(), [&](Reader& in) { return in.bytes("a value", limits_.maxValueBytes); });
}

int64_t KvClient::add(const std::string& key, int64_t delta) {
  const Bytes r = call(Writer().u8(static_cast<uint8_t>(Op::Add)).str(key).i64(delta).b);
  return parseReply(r, where(), [](Reader& in) { return in.i64(); });
}

Bytes KvClient::compareSet(const std::string& key, const Bytes& expected, const Bytes& desired) {
  const Bytes r = call(Writer().u8(static_cast<uint8_t>(Op::CompareSet)).str(key).bytes(expected).bytes(desired).b);
  return parseReply(r, where(), [&](Reader& in) { return in.bytes("a value", limits_.maxValueBytes); });
}

bool KvClient::check(const std::vector<std::string>& keys) {
  const Bytes r = call(Writer().u8(static_cast<uint8_t>(Op::Check)).strs(keys).b);
  return parseReply(r, where(), [](Reader& in) { return in.u8() != 0; });
}

bool KvClient::deleteKey(const std::string& key) {
  const Bytes r = call(Writer().u8(static_cast<uint8_t>(Op::Delete)).str(key).b);
  return parseReply(r, where(), [](Reader& in) { return in.u8() != 0; });
}

int64_t KvClient::numKeys() {
  const Bytes r = call(Writer().u8(static_cast<uint8_t>(Op::NumKeys)).b);
  return parseReply(r, where(), [](Reader& in) { return in.i64(); });
}

void KvClient::wait(const std::vector<std::string>& keys, milliseconds timeout) {
  call(Writer().u8(static_cast<uint8_t>(Op::Wait)).strs(keys).i64(timeout.count()).b,
       timeout.count() <= 0 ? milliseconds(-1) : timeout);
}

}  // namespace edit
