// One fuzz input through the job store's connection protocol (runtime/src/dist/kv_session.h,
// KvSession: framing, the handshake, the request parser, deadlines), without sockets.
//
// Byte 0 chooses: bit 0 a session past its handshake (the request parser) or a fresh one
// (the hello/proof parser); bits 1-2 how the rest arrives (1, 7, 64 bytes at a time, or
// at once); bit 3 whether time jumps past every deadline between chunks; bit 4 whether
// the replies are drained as they come (a reading client) or left queued.
// Contract checked: nothing throws; the output is whole reply frames with a known status,
// none longer than the largest reply; a fresh session never authenticates (no input can
// forge the HMAC proof); a closing session produces no more replies.
#pragma once

#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "dist/kv_session.h"

namespace edit::fuzz {

// Returns the reply bytes (the replay test reads their statuses).
inline Bytes fuzzKvFrameOne(const uint8_t* data, size_t size) {
  if (size == 0) return {};
  using Clock = KvSession::Clock;
  const uint8_t mode = data[0];
  ++data;
  --size;
  KvLimits limits;  // small, so that the limits' edges are within reach
  limits.maxKeyBytes = 64;
  limits.maxValueBytes = 256;
  limits.maxKeysPerRequest = 16;
  limits.maxFrameBytes = 1024;
  limits.maxHelloBytes = 128;
  limits.frameTimeout = std::chrono::milliseconds(100);
  limits.handshakeTimeout = std::chrono::milliseconds(100);
  KvTable table(limits);
  table.set("present", Bytes{'4', '2'});
  const KvAuth auth = KvAuth::make("fuzz/job", "secret");
  auto now = Clock::time_point() + std::chrono::hours(1);
  const bool authenticated = mode & 1;
  KvSession s = authenticated ? KvSession::authenticated(table, auth, limits, now) : KvSession(table, auth, limits, now);
  const size_t chunk = (mode >> 1 & 3) == 0 ? 1 : (mode >> 1 & 3) == 1 ? 7 : (mode >> 1 & 3) == 2 ? 64 : size + 1;
  const bool jump = mode & 8, drain = mode & 16;

  Bytes out;
  auto collect = [&] {  // a reading client: what was sent leaves the session
    for (int i = 0; i < 1000 && s.outputSize() > 0; ++i) {
      out.insert(out.end(), s.output(), s.output() + s.outputSize());
      s.consumed(s.outputSize(), now);
    }
  };
  for (size_t at = 0; at < size || at == 0; at += chunk) {
    const size_t n = std::min(chunk, size - std::min(size, at));
    const bool wasClosing = s.closing();
    const size_t before = s.outputSize();
    s.received(data + std::min(at, size), n, now);
    if (wasClosing && s.outputSize() != before) throw std::logic_error("a closing session replied again");
    now += jump ? std::chrono::seconds(1) : std::chrono::milliseconds(1);
    s.pump(now);
    if (drain) collect();
    if (!authenticated && s.isAuthenticated()) throw std::logic_error("authenticated without the secret");
    if (size == 0) break;
  }
  if (drain)
    collect();
  else
    out.assign(s.output(), s.output() + s.outputSize());
  // Whole frames with a status and, for anything but ok, a message.
  for (size_t at = 0; at < out.size();) {
    if (out.size() - at < 5) throw std::logic_error("a partial reply frame");
    const uint32_t n = out[at] | out[at + 1] << 8 | out[at + 2] << 16 | uint32_t(out[at + 3]) << 24;
    if (n < 1 || n > limits.maxValueBytes + 64 || out.size() - at - 4 < n)
      throw std::logic_error("a reply frame of a bad length");
    const uint8_t status = out[at + 4];
    if (status > KvSession::kBusy) throw std::logic_error("an unknown reply status");
    if (status != KvSession::kOk) {
      if (n < 5) throw std::logic_error("an error without its message");
      const uint32_t m = out[at + 5] | out[at + 6] << 8 | out[at + 7] << 16 | uint32_t(out[at + 8]) << 24;
      if (m != n - 5) throw std::logic_error("an error message of a bad length");
    }
    at += 4 + n;
  }
  return out;
}

}  // namespace edit::fuzz
