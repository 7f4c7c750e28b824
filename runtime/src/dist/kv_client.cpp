// The store's client: one connection, no thread; each call one request and one reply
// on the caller's thread, bounded by the client's timeout (docs/replica-recovery.md).
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

#include "dist/kv_session.h"
#include "dist/kv_wire.h"

namespace edit {

using namespace kv;
using std::chrono::milliseconds;

namespace {

constexpr uint32_t kMaxHandshakeReply = 4096;  // a challenge, or a refusal's message

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

}  // namespace

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
