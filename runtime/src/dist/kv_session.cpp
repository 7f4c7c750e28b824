// One connection's protocol: a frame at a time, bounded before it is buffered, each
// with its deadline; the hello and proof, then requests (docs/job-store.md).
#include "dist/kv_session.h"

#include <algorithm>
#include <cstring>

#include "dist/kv_wire.h"

namespace edit {

using namespace kv;

namespace {
constexpr uint32_t kMaxJobBytes = 512;       // namespace (63) + "/" + name (253), with room
constexpr size_t kOutHighWater = 64u << 10;  // replies queued before a session stops reading
}  // namespace

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

}  // namespace edit
