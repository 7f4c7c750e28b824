// The store's handshake keys and proofs: SHA-256 (FIPS 180-4) and HMAC (RFC 2104), here so
// the runtime needs no crypto library on a GPU machine or in an EDIT_MINIMAL build
// (KvAuthTest.HmacSha256MatchesRfc4231 checks RFC 4231's vectors); the job's identity and
// key from the environment (docs/job-store.md, "The handshake").
#include <sys/random.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "dist/kv_wire.h"

namespace edit {
namespace {

const char kKeyLabel[] = "edit job store v1";

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

namespace kv {

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

namespace {
Bytes proofTranscript(const char* label, const std::string& job, const std::array<uint8_t, 32>& clientNonce,
                      const std::array<uint8_t, 32>& serverNonce) {
  Writer w;
  w.raw(reinterpret_cast<const uint8_t*>(label), std::strlen(label));
  w.u8(0).str(job).raw(clientNonce.data(), clientNonce.size()).raw(serverNonce.data(), serverNonce.size());
  return w.b;
}
}  // namespace

std::array<uint8_t, 32> proof(const KvAuth& auth, const char* label, const std::array<uint8_t, 32>& clientNonce,
                              const std::array<uint8_t, 32>& serverNonce) {
  const Bytes t = proofTranscript(label, auth.job, clientNonce, serverNonce);
  return hmacSha256(auth.key.data(), auth.key.size(), t.data(), t.size());
}

}  // namespace kv
}  // namespace edit
