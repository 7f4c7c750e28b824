// The store's server: one thread with an epoll loop for every connection, each a
// KvSession; accepting within the connection cap, waking the sessions that wait on a key,
// the deadlines' sweep; listening on the pod's own address (docs/job-store.md).
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <iostream>
#include <system_error>
#include <unordered_map>

#include "dist/kv_session.h"
#include "dist/kv_wire.h"

namespace edit {

using namespace kv;
using std::chrono::milliseconds;

namespace {

constexpr int kMaxBusySessions = 64;  // "busy" answers in flight beyond maxConnections
constexpr int kLoggedRefusals = 10;

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

}  // namespace edit
