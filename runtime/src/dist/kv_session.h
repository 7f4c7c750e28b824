// One connection's side of the job store's protocol (framing, the handshake, requests,
// deadlines) as a state machine without sockets: the server's epoll loop drives one per
// connection (kv_server.cpp), the fuzzer (tests/fuzz/fuzz_kv_frame.cpp) drives it directly.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "dist/kv_store.h"

namespace edit {

// One client connection's side of the protocol, without sockets: bytes in, reply bytes
// out, and the time. The server's loop drives one per connection; the fuzzer drives it
// directly. Never throws for anything a client sends.
class KvSession {
 public:
  using Clock = std::chrono::steady_clock;
  // Frame statuses (the first byte of a reply's body).
  enum Status : uint8_t { kOk = 0, kError = 1, kRefused = 2, kBusy = 3 };

  KvSession(KvTable& table, const KvAuth& auth, const KvLimits& limits, Clock::time_point now);
  // For the fuzzer: a session past its handshake.
  static KvSession authenticated(KvTable& table, const KvAuth& auth, const KvLimits& limits, Clock::time_point now);
  // A session that only says "busy" and closes (the server is at maxConnections).
  static KvSession busy(KvTable& table, const KvLimits& limits, int connections, Clock::time_point now);

  // Bytes the client sent; answers what it can.
  void received(const uint8_t* data, size_t n, Clock::time_point now);
  // The table changed, output drained or time passed: goes on where it stopped.
  void pump(Clock::time_point now);
  // Reply bytes not sent yet; the server calls consumed() with what it sent.
  const uint8_t* output() const { return out_.data() + outOff_; }
  size_t outputSize() const { return out_.size() - outOff_; }
  void consumed(size_t n, Clock::time_point now);

  // More input is useful now (false while a complete request waits for its turn).
  bool wantsRead() const;
  // Send what is left, then close; closeReason() says why.
  bool closing() const { return closing_; }
  const std::string& closeReason() const { return closeReason_; }
  bool isAuthenticated() const { return state_ == State::Ready; }
  // A get/wait that waits for keys (empty: none pending), and the key it waits for now
  // (the server wakes the session when that key is written).
  const std::vector<std::string>& waitingFor() const { return waitKeys_; }
  const std::string& waitKey() const;
  // When pump() must run next at the latest (time_point::max(): no deadline).
  Clock::time_point deadline() const;

 private:
  enum class State { Hello, Proof, Ready };
  void handleFrame(const uint8_t* body, size_t n, Clock::time_point now);
  void handleHello(const uint8_t* body, size_t n);
  void handleProof(const uint8_t* body, size_t n);
  void handleRequest(const uint8_t* body, size_t n, Clock::time_point now);
  bool finishWait(Clock::time_point now);  // true when the pending wait ended
  void reply(Status status, const Bytes& payload);
  void replyText(Status status, const std::string& message);
  void refuse(const std::string& message);  // refused reply, then close
  void close(const std::string& reason);

  KvTable* table_;
  KvAuth auth_;
  KvLimits limits_;
  State state_ = State::Hello;
  Bytes in_;
  size_t inOff_ = 0;
  Bytes out_;
  size_t outOff_ = 0;
  bool closing_ = false;
  std::string closeReason_;
  std::array<uint8_t, 32> clientNonce_{}, serverNonce_{};
  Clock::time_point handshakeDeadline_, frameDeadline_, sendDeadline_;
  // A pending get (waitIsGet_) or wait.
  std::vector<std::string> waitKeys_;
  bool waitIsGet_ = false;
  size_t waitNext_ = 0;  // waitKeys_ before it were present
  int64_t waitMs_ = 0;
  Clock::time_point waitDeadline_;
  Clock::time_point now_;
};

}  // namespace edit
