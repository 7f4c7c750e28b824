#include "http_server.h"

#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
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
  fd_ = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1;
  if (fd_ >= 0) setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (fd_ < 0 || bind(fd_, res->ai_addr, res->ai_addrlen) != 0 || listen(fd_, 16) != 0) {
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
    case 503: return "Service Unavailable";
    default: return "Error";
  }
}

void PlainServer::serve() {
  while (!stop_) {
    pollfd p{fd_, POLLIN, 0};
    if (poll(&p, 1, 200) <= 0) continue;
    const int c = accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (c < 0) continue;
    timeval tv{2, 0};
    setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    char buf[2048];
    const ssize_t n = recv(c, buf, sizeof buf - 1, 0);
    const std::string req(buf, n > 0 ? static_cast<size_t>(n) : 0);
    Response r{404, "text/plain; charset=utf-8", "not found\n"};
    if (req.rfind("GET ", 0) == 0) {
      const auto end = req.find_first_of(" ?\r\n", 4);
      try {
        r = handler_(req.substr(4, end == std::string::npos ? std::string::npos : end - 4));
      } catch (const std::exception& e) {
        r = {500, "text/plain; charset=utf-8", std::string("error: ") + e.what() + "\n"};
      }
    } else if (!req.empty()) {
      r = {405, "text/plain; charset=utf-8", "only GET\n"};
    }
    const std::string head = "HTTP/1.0 " + std::to_string(r.status) + " " + reason(r.status) +
                             "\r\nContent-Type: " + r.contentType +
                             "\r\nContent-Length: " + std::to_string(r.body.size()) +
                             "\r\nConnection: close\r\n\r\n";
    send(c, head.data(), head.size(), MSG_NOSIGNAL);
    send(c, r.body.data(), r.body.size(), MSG_NOSIGNAL);
    close(c);
  }
}

}  // namespace edit::http
