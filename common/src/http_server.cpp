#include "http_server.h"

#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <vector>
#include <cstring>
#include <stdexcept>

namespace edit::http {

std::pair<std::string, int> splitHostPort(const std::string& addr) {
  const auto colon = addr.rfind(':');
  if (colon == std::string::npos)
    throw std::invalid_argument("address '" + addr + "' must be host:port");
  std::string host = addr.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  if (host.empty()) host = "0.0.0.0";
  int port = -1;
  try {
    size_t used = 0;
    port = std::stoi(addr.substr(colon + 1), &used);
    if (used != addr.size() - colon - 1) port = -1;
  } catch (const std::exception&) {
  }
  if (port < 0 || port > 65535) throw std::invalid_argument("port out of range in '" + addr + "'");
  return {host, port};
}

PlainServer::PlainServer(const std::string& host, int port, Handler handler)
    : host_(host.empty() ? "0.0.0.0" : host), handler_(std::move(handler)) {
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  const std::string where = host_ + ":" + std::to_string(port);
  if (getaddrinfo(host_.c_str(), std::to_string(port).c_str(), &hints, &res) != 0 || !res)
    throw std::runtime_error("http: cannot resolve " + where);
  fd_ = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  int one = 1;
  if (fd_ >= 0) setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (fd_ < 0 || bind(fd_, res->ai_addr, res->ai_addrlen) != 0 || listen(fd_, 64) != 0) {
    const std::string err = std::strerror(errno);
    freeaddrinfo(res);
    if (fd_ >= 0) close(fd_);
    throw std::runtime_error("http: cannot listen on " + where + ": " + err);
  }
  freeaddrinfo(res);
  sockaddr_storage bound{};
  socklen_t len = sizeof bound;
  getsockname(fd_, reinterpret_cast<sockaddr*>(&bound), &len);
  port_ = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                            : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  thread_ = std::thread([this] { serve(); });
}

PlainServer::~PlainServer() { stop(); }

void PlainServer::stop() {
  if (stop_.exchange(true)) return;
  if (thread_.joinable()) thread_.join();
  if (fd_ >= 0) close(fd_);
}

static const char* reason(int status) {
  switch (status) {
    case 200: return "OK";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 431: return "Request Header Fields Too Large";
    case 503: return "Service Unavailable";
    default: return "Error";
  }
}

namespace {

using Clock = std::chrono::steady_clock;

struct Conn {
  int fd = -1;
  std::string in;
  std::string out;
  size_t sent = 0;
  bool responding = false;
  bool done = false;
  Clock::time_point deadline;
  Clock::time_point accepted;
};

// The request is in: its headers ended, or the client closed after the request line.
bool requestComplete(const std::string& in, bool eof) {
  if (in.find("\r\n\r\n") != std::string::npos || in.find("\n\n") != std::string::npos) return true;
  return eof && in.find('\n') != std::string::npos;
}

// Turns the request read so far into the response to send.
void respond(Conn& c, const Handler& handler, Clock::time_point now) {
  Response r{404, "text/plain; charset=utf-8", "not found\n"};
  const std::string& req = c.in;
  if (req.size() > PlainServer::kMaxRequestBytes) {
    r = {431, "text/plain; charset=utf-8", "request too large\n"};
  } else if (req.rfind("GET ", 0) == 0) {
    const auto end = req.find_first_of(" ?\r\n", 4);
    try {
      r = handler(req.substr(4, end == std::string::npos ? std::string::npos : end - 4));
    } catch (const std::exception& e) {
      r = {500, "text/plain; charset=utf-8", std::string("error: ") + e.what() + "\n"};
    }
  } else if (!req.empty()) {
    r = {405, "text/plain; charset=utf-8", "only GET\n"};
  }
  c.out = "HTTP/1.0 " + std::to_string(r.status) + " " + reason(r.status) + "\r\nContent-Type: " + r.contentType +
          "\r\nContent-Length: " + std::to_string(r.body.size()) + "\r\nConnection: close\r\n\r\n" + r.body;
  c.in.clear();
  c.responding = true;
  c.deadline = now + std::chrono::milliseconds(PlainServer::kResponseTimeoutMs);
}

// Sends what the socket takes; done once all went (or the client left).
void flush(Conn& c) {
  while (c.sent < c.out.size()) {
    const ssize_t n = send(c.fd, c.out.data() + c.sent, c.out.size() - c.sent, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      c.sent += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
    c.done = true;  // the client left
    return;
  }
  shutdown(c.fd, SHUT_WR);
  c.done = true;
}

// One connection's turn after poll: read the request or send the response.
void step(Conn& c, short ev, const Handler& handler, Clock::time_point now) {
  if (c.responding) {
    if (ev & (POLLOUT | POLLERR | POLLHUP)) flush(c);
  } else if (ev & (POLLIN | POLLERR | POLLHUP)) {
    char buf[4096];
    const ssize_t n = recv(c.fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n > 0) c.in.append(buf, static_cast<size_t>(n));
    const bool eof = n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
    if (requestComplete(c.in, eof) || c.in.size() > PlainServer::kMaxRequestBytes) {
      respond(c, handler, now);
      flush(c);
    } else if (eof) {
      c.done = true;
    }
  }
  if (!c.done && now >= c.deadline) c.done = true;  // too slow to ask, or to read the answer
}

// New connections; when full, the oldest connection still being read goes (a probe is a
// new one).
void acceptNew(int listenFd, std::vector<Conn>& conns, Clock::time_point now) {
  for (int k = 0; k < 16; ++k) {
    const int fd = accept4(listenFd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) break;
    if (conns.size() >= static_cast<size_t>(PlainServer::kMaxConnections)) {
      auto oldest = conns.end();
      for (auto it = conns.begin(); it != conns.end(); ++it)
        if (!it->done && !it->responding && (oldest == conns.end() || it->accepted < oldest->accepted)) oldest = it;
      if (oldest == conns.end()) {
        close(fd);
        continue;
      }
      oldest->done = true;
    }
    Conn c;
    c.fd = fd;
    c.accepted = now;
    c.deadline = now + std::chrono::milliseconds(PlainServer::kRequestTimeoutMs);
    conns.push_back(std::move(c));
  }
}

}  // namespace

void PlainServer::serve() {
  std::vector<Conn> conns;
  std::vector<pollfd> fds;
  while (!stop_) {
    auto now = Clock::now();
    int timeout = 200;  // stop() is noticed within this
    fds.assign(1, pollfd{fd_, POLLIN, 0});
    for (const auto& c : conns) {
      fds.push_back({c.fd, static_cast<short>(c.responding ? POLLOUT : POLLIN), 0});
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(c.deadline - now).count();
      timeout = static_cast<int>(std::max<int64_t>(0, std::min<int64_t>(timeout, left + 1)));
    }
    if (poll(fds.data(), fds.size(), timeout) < 0 && errno != EINTR) continue;
    now = Clock::now();
    for (size_t i = 0; i < conns.size(); ++i) step(conns[i], fds[i + 1].revents, handler_, now);
    if (fds[0].revents & POLLIN) acceptNew(fd_, conns, now);
    for (auto it = conns.begin(); it != conns.end();) {
      if (it->done) {
        close(it->fd);
        it = conns.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& c : conns) close(c.fd);
}

}  // namespace edit::http
