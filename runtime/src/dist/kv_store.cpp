#include "dist/kv_store.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace edit {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// A frame is a 4-byte length and a body. A request's body is an Op and its fields; a
// reply's is a status (0 ok, 1 error with a message) and the result. Integers are
// little-endian, strings and byte arrays a 4-byte length and their bytes.
enum class Op : uint8_t { Set = 1, Get, Add, CompareSet, Check, Delete, NumKeys, Wait };
constexpr uint32_t kMaxFrame = 64u << 20;  // store values are addresses and ids, not tensors

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
  Writer& bytes(const Bytes& v) {
    u32(static_cast<uint32_t>(v.size()));
    b.insert(b.end(), v.begin(), v.end());
    return *this;
  }
  Writer& str(const std::string& s) { return bytes(Bytes(s.begin(), s.end())); }
  Writer& strs(const std::vector<std::string>& v) {
    u32(static_cast<uint32_t>(v.size()));
    for (const auto& s : v) str(s);
    return *this;
  }
};

struct Reader {
  const Bytes& b;
  size_t at = 0;
  void need(size_t n) const {
    if (b.size() - at < n) throw KvError("store: malformed message");
  }
  uint8_t u8() { need(1); return b[at++]; }
  uint32_t u32() {
    need(4);
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(b[at++]) << (8 * i);
    return v;
  }
  int64_t i64() {
    need(8);
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(b[at++]) << (8 * i);
    return static_cast<int64_t>(v);
  }
  Bytes bytes() {
    const uint32_t n = u32();
    need(n);
    Bytes v(b.begin() + at, b.begin() + at + n);
    at += n;
    return v;
  }
  std::string str() {
    const Bytes v = bytes();
    return std::string(v.begin(), v.end());
  }
  std::vector<std::string> strs() {
    const uint32_t n = u32();
    std::vector<std::string> v;
    for (uint32_t i = 0; i < n; ++i) v.push_back(str());
    return v;
  }
};

Bytes frame(const Bytes& body) {
  Writer w;
  w.u32(static_cast<uint32_t>(body.size()));
  w.b.insert(w.b.end(), body.begin(), body.end());
  return w.b;
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

enum class Read { Ok, Closed, TimedOut };

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

Read readFrame(int fd, Bytes& body, Clock::time_point deadline) {
  uint8_t len[4];
  Read r = readExact(fd, len, 4, deadline);
  if (r != Read::Ok) return r;
  const uint32_t n = len[0] | (len[1] << 8) | (len[2] << 16) | (static_cast<uint32_t>(len[3]) << 24);
  if (n > kMaxFrame) return Read::Closed;
  body.resize(n);
  return readExact(fd, body.data(), n, deadline);
}

// 0 (c10d's kNoTimeout) or less: wait without limit.
Clock::time_point deadlineAfter(milliseconds t) {
  return t.count() <= 0 ? Clock::time_point::max() : Clock::now() + t;
}

std::string keyList(const std::vector<std::string>& keys) {
  std::string s;
  for (const auto& k : keys) s += (s.empty() ? "" : ", ") + k;
  return "[" + s + "]";
}

void setNoDelay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

}  // namespace

// ---- the table ------------------------------------------------------------------------

bool KvTable::allPresent(const std::vector<std::string>& keys) const {
  return std::all_of(keys.begin(), keys.end(), [&](const std::string& k) { return data_.count(k) > 0; });
}

void KvTable::set(const std::string& key, const Bytes& value) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    data_[key] = value;
  }
  changed_.notify_all();
}

void KvTable::wait(const std::vector<std::string>& keys, milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  const auto deadline = deadlineAfter(timeout);
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

int64_t KvTable::add(const std::string& key, int64_t delta) {
  int64_t sum = delta;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = data_.find(key);
    if (it != data_.end()) {
      const std::string cur(it->second.begin(), it->second.end());
      try {
        sum += std::stoll(cur);
      } catch (const std::exception&) {
        throw KvError("store: add on key " + key + ", which holds \"" + cur + "\", not an integer");
      }
    }
    const std::string s = std::to_string(sum);
    data_[key] = Bytes(s.begin(), s.end());
  }
  changed_.notify_all();
  return sum;
}

Bytes KvTable::compareSet(const std::string& key, const Bytes& expected, const Bytes& desired) {
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
  changed_.notify_all();
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

// ---- the server -----------------------------------------------------------------------

KvServer::KvServer(int port, milliseconds bindTimeout) {
  const auto deadline = Clock::now() + bindTimeout;
  for (;;) {
    // Dual-stack: one socket takes IPv6 and IPv4 clients; IPv4 alone where IPv6 is off.
    int fd = ::socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
    bool v6 = fd >= 0;
    if (!v6) fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) throw KvError(std::string("store: cannot open a socket: ") + std::strerror(errno));
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
    if (rc == 0 && ::listen(fd, 128) == 0) {
      listenFd_ = fd;
      break;
    }
    const int err = errno;
    ::close(fd);
    if (err != EADDRINUSE || Clock::now() >= deadline)
      throw KvError("store: cannot listen on port " + std::to_string(port) + ": " + std::strerror(err) +
                    (err == EADDRINUSE ? " (is another rank 0 of this job still running?)" : ""));
    std::this_thread::sleep_for(milliseconds(100));
  }
  sockaddr_storage a{};
  socklen_t len = sizeof(a);
  ::getsockname(listenFd_, reinterpret_cast<sockaddr*>(&a), &len);
  port_ = a.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&a)->sin6_port)
                                  : ntohs(reinterpret_cast<sockaddr_in*>(&a)->sin_port);
  if (::pipe2(wakeFd_, O_CLOEXEC) != 0) {
    ::close(listenFd_);
    throw KvError(std::string("store: pipe: ") + std::strerror(errno));
  }
  acceptor_ = std::thread([this] { acceptLoop(); });
}

KvServer::~KvServer() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    for (int fd : clients_) ::shutdown(fd, SHUT_RDWR);  // wakes their workers' recv
  }
  const char x = 0;
  (void)!::write(wakeFd_[1], &x, 1);
  acceptor_.join();
  table_.stop();  // wakes workers blocked in a get or wait
  std::vector<std::thread> workers;
  {
    std::lock_guard<std::mutex> lock(mu_);
    workers.swap(workers_);
  }
  for (auto& t : workers) t.join();
  ::close(listenFd_);
  ::close(wakeFd_[0]);
  ::close(wakeFd_[1]);
}

int KvServer::connections() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(clients_.size());
}

void KvServer::acceptLoop() {
  for (;;) {
    pollfd p[2] = {{listenFd_, POLLIN, 0}, {wakeFd_[0], POLLIN, 0}};
    if (::poll(p, 2, -1) < 0 && errno != EINTR) return;
    if (p[1].revents) return;
    if (!(p[0].revents & POLLIN)) continue;
    const int fd = ::accept4(listenFd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    setNoDelay(fd);
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) {
      ::close(fd);
      return;
    }
    clients_.push_back(fd);
    workers_.emplace_back([this, fd] { serve(fd); });
  }
}

void KvServer::serve(int fd) {
  Bytes req;
  while (readFrame(fd, req, Clock::time_point::max()) == Read::Ok) {
    Writer reply;
    try {
      Reader in{req};
      Writer out;
      switch (static_cast<Op>(in.u8())) {
        case Op::Set: {
          const std::string k = in.str();
          table_.set(k, in.bytes());
          break;
        }
        case Op::Get: {
          const std::string k = in.str();
          out.bytes(table_.get(k, milliseconds(in.i64())));
          break;
        }
        case Op::Add: {
          const std::string k = in.str();
          out.i64(table_.add(k, in.i64()));
          break;
        }
        case Op::CompareSet: {
          const std::string k = in.str();
          const Bytes expected = in.bytes();
          out.bytes(table_.compareSet(k, expected, in.bytes()));
          break;
        }
        case Op::Check: out.u8(table_.check(in.strs()) ? 1 : 0); break;
        case Op::Delete: out.u8(table_.deleteKey(in.str()) ? 1 : 0); break;
        case Op::NumKeys: out.i64(table_.numKeys()); break;
        case Op::Wait: {
          const auto keys = in.strs();
          table_.wait(keys, milliseconds(in.i64()));
          break;
        }
        default: throw KvError("store: unknown request");
      }
      reply.u8(0);
      reply.b.insert(reply.b.end(), out.b.begin(), out.b.end());
    } catch (const std::exception& e) {
      reply = Writer();
      reply.u8(1).str(e.what());
    }
    if (!sendAll(fd, frame(reply.b))) break;
  }
  std::lock_guard<std::mutex> lock(mu_);
  clients_.erase(std::remove(clients_.begin(), clients_.end(), fd), clients_.end());
  ::close(fd);
}

// ---- the client -----------------------------------------------------------------------

KvClient::KvClient(const std::string& host, int port, milliseconds connectTimeout, milliseconds timeout)
    : host_(host), port_(port), timeout_(timeout) {
  const auto deadline = Clock::now() + connectTimeout;
  std::string last = "no attempt";
  for (;;) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    const int gai = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
    if (gai != 0) {
      last = std::string("cannot resolve the name: ") + ::gai_strerror(gai);
    } else {
      for (addrinfo* a = res; a && fd_ < 0; a = a->ai_next) {
        const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
        if (fd < 0) continue;
        int rc = ::connect(fd, a->ai_addr, a->ai_addrlen);
        if (rc != 0 && errno == EINPROGRESS) {
          // Bounded: a name that points nowhere must not hold the caller past its deadline.
          const auto left = std::max<int64_t>(
              1, std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count());
          pollfd p{fd, POLLOUT, 0};
          int err = ETIMEDOUT;
          if (::poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 1000))) == 1) {
            socklen_t len = sizeof(err);
            ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
          }
          rc = err == 0 ? 0 : -1;
          errno = err;
        }
        if (rc == 0) {
          ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
          setNoDelay(fd);
          fd_ = fd;
        } else {
          last = std::strerror(errno);
          ::close(fd);
        }
      }
      ::freeaddrinfo(res);
    }
    if (fd_ >= 0) return;
    if (Clock::now() >= deadline)
      throw KvError("store: cannot connect to " + where() + " within " + std::to_string(connectTimeout.count()) +
                    " ms (" + last + ")");
    std::this_thread::sleep_for(milliseconds(100));
  }
}

KvClient::~KvClient() {
  if (fd_ >= 0) ::close(fd_);
}

std::string KvClient::where() const { return host_ + ":" + std::to_string(port_); }

Bytes KvClient::call(const Bytes& request, milliseconds wait) {
  if (fd_ < 0) throw KvError("store: the connection to " + where() + " was lost earlier");
  if (!sendAll(fd_, frame(request))) {
    ::close(fd_);
    fd_ = -1;
    throw KvError("store: the connection to " + where() + " was lost (the rank hosting the store left?)");
  }
  // The reply may be held back by the server for a get's or wait's own timeout.
  const bool unbounded = wait.count() < 0 || timeout_.count() <= 0;
  const auto deadline = unbounded ? Clock::time_point::max() : Clock::now() + timeout_ + wait;
  Bytes body;
  const Read r = readFrame(fd_, body, deadline);
  if (r != Read::Ok) {
    ::close(fd_);  // a late reply would answer the next request
    fd_ = -1;
    throw KvError(r == Read::TimedOut
                      ? "store: no reply from " + where() + " within " +
                            std::to_string((timeout_ + wait).count()) + " ms (is the rank hosting it stopped?)"
                      : "store: the connection to " + where() + " was lost (the rank hosting the store left?)");
  }
  Reader in{body};
  if (in.u8() != 0) throw KvError(in.str() + " (store at " + where() + ")");
  return Bytes(body.begin() + 1, body.end());
}

void KvClient::set(const std::string& key, const Bytes& value) {
  call(Writer().u8(static_cast<uint8_t>(Op::Set)).str(key).bytes(value).b);
}

Bytes KvClient::get(const std::string& key, milliseconds timeout) {
  const Bytes r = call(Writer().u8(static_cast<uint8_t>(Op::Get)).str(key).i64(timeout.count()).b,
                       timeout.count() <= 0 ? milliseconds(-1) : timeout);
  Reader in{r};
  return in.bytes();
}

int64_t KvClient::add(const std::string& key, int64_t delta) {
  const Bytes r = call(Writer().u8(static_cast<uint8_t>(Op::Add)).str(key).i64(delta).b);
  Reader in{r};
  return in.i64();
}

Bytes KvClient::compareSet(const std::string& key, const Bytes& expected, const Bytes& desired) {
  const Bytes r = call(Writer().u8(static_cast<uint8_t>(Op::CompareSet)).str(key).bytes(expected).bytes(desired).b);
  Reader in{r};
  return in.bytes();
}

bool KvClient::check(const std::vector<std::string>& keys) {
  const Bytes r = call(Writer().u8(static_cast<uint8_t>(Op::Check)).strs(keys).b);
  Reader in{r};
  return in.u8() != 0;
}

bool KvClient::deleteKey(const std::string& key) {
  const Bytes r = call(Writer().u8(static_cast<uint8_t>(Op::Delete)).str(key).b);
  Reader in{r};
  return in.u8() != 0;
}

int64_t KvClient::numKeys() {
  const Bytes r = call(Writer().u8(static_cast<uint8_t>(Op::NumKeys)).b);
  Reader in{r};
  return in.i64();
}

void KvClient::wait(const std::vector<std::string>& keys, milliseconds timeout) {
  call(Writer().u8(static_cast<uint8_t>(Op::Wait)).strs(keys).i64(timeout.count()).b,
       timeout.count() <= 0 ? milliseconds(-1) : timeout);
}

}  // namespace edit
