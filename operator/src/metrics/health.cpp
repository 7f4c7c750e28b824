#include "metrics/health.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <stdexcept>

namespace edit::op::metrics {

std::pair<std::string, int> splitHostPort(const std::string& addr) {
  auto colon = addr.rfind(':');
  if (colon == std::string::npos) throw std::invalid_argument("address '" + addr + "' must be host:port");
  std::string host = addr.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  if (host.empty()) host = "0.0.0.0";
  int port = std::stoi(addr.substr(colon + 1));
  if (port < 0 || port > 65535) throw std::invalid_argument("port out of range in '" + addr + "'");
  return {host, port};
}

HealthServer::HealthServer(const std::string& addr, std::function<bool()> ready) : ready_(std::move(ready)) {
  auto [host, port] = splitHostPort(addr);
  host_ = host;
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res) != 0 || !res)
    throw std::runtime_error("health server: cannot resolve " + addr);
  fd_ = socket(res->ai_family, SOCK_STREAM, 0);
  int one = 1;
  setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (fd_ < 0 || bind(fd_, res->ai_addr, res->ai_addrlen) != 0 || listen(fd_, 16) != 0) {
    freeaddrinfo(res);
    throw std::runtime_error("health server: cannot listen on " + addr + ": " + std::strerror(errno));
  }
  freeaddrinfo(res);
  sockaddr_storage bound{};
  socklen_t len = sizeof bound;
  getsockname(fd_, reinterpret_cast<sockaddr*>(&bound), &len);
  port_ = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                            : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  thread_ = std::thread([this] { serve(); });
}

HealthServer::~HealthServer() { stop(); }

void HealthServer::stop() {
  if (stop_.exchange(true)) return;
  if (thread_.joinable()) thread_.join();
  if (fd_ >= 0) close(fd_);
}

void HealthServer::serve() {
  while (!stop_) {
    pollfd p{fd_, POLLIN, 0};
    if (poll(&p, 1, 200) <= 0) continue;
    int c = accept(fd_, nullptr, nullptr);
    if (c < 0) continue;
    timeval tv{2, 0};
    setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    char buf[1024];
    ssize_t n = recv(c, buf, sizeof buf - 1, 0);
    std::string req(buf, n > 0 ? static_cast<size_t>(n) : 0);
    int code = 404;
    std::string body = "not found\n";
    if (req.rfind("GET /healthz", 0) == 0) {
      code = 200;
      body = "ok\n";
    } else if (req.rfind("GET /readyz", 0) == 0) {
      bool ok = !ready_ || ready_();
      code = ok ? 200 : 503;
      body = ok ? "ok\n" : "not ready\n";
    }
    std::string resp = "HTTP/1.0 " + std::to_string(code) + (code == 200 ? " OK" : code == 503 ? " Service Unavailable" : " Not Found") +
                       "\r\nContent-Type: text/plain\r\nContent-Length: " + std::to_string(body.size()) +
                       "\r\nConnection: close\r\n\r\n" + body;
    send(c, resp.data(), resp.size(), MSG_NOSIGNAL);
    close(c);
  }
}

}  // namespace edit::op::metrics
