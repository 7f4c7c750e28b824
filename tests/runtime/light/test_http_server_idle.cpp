// common/src/http_server.*: /healthz answers while other clients hold connections open
// and say nothing, or trickle a request, or flood the server with connections.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "http_server.h"

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

namespace {

int connectTo(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// GET path; the whole response, "" if none came within `within`.
std::string get(int port, const std::string& path, std::chrono::milliseconds within = 2s) {
  const int fd = connectTo(port);
  if (fd < 0) return "";
  const std::string req = "GET " + path + " HTTP/1.0\r\nHost: x\r\n\r\n";
  ::send(fd, req.data(), req.size(), MSG_NOSIGNAL);
  std::string out;
  const auto until = Clock::now() + within;
  char buf[4096];
  while (Clock::now() < until) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 20) <= 0) continue;
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

TEST(HttpServer, HealthzAnswersWhileIdleConnectionsAreOpen) {
  edit::http::PlainServer server("127.0.0.1", 0, [](const std::string& path) {
    return edit::http::Response{path == "/healthz" ? 200 : 404, "text/plain", "ok\n"};
  });
  std::vector<int> idle;
  for (int i = 0; i < 20; ++i) idle.push_back(connectTo(server.port()));  // say nothing
  const int partial = connectTo(server.port());
  ::send(partial, "GET /healthz HTTP/1.0\r\nHo", 25, MSG_NOSIGNAL);  // and a slow one
  const auto t0 = Clock::now();
  const std::string r = get(server.port(), "/healthz");
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 1.0);
  EXPECT_EQ(r.rfind("HTTP/1.0 200 OK\r\n", 0), 0u) << r;
  EXPECT_NE(r.find("\r\n\r\nok\n"), std::string::npos) << r;
  for (int fd : idle) ::close(fd);
  ::close(partial);
}

TEST(HttpServer, MoreIdleConnectionsThanItsCapStillLeaveRoomForAProbe) {
  edit::http::PlainServer server("127.0.0.1", 0, [](const std::string&) {
    return edit::http::Response{200, "text/plain", "ok\n"};
  });
  std::vector<int> idle;
  for (int i = 0; i < edit::http::PlainServer::kMaxConnections + 20; ++i) idle.push_back(connectTo(server.port()));
  std::this_thread::sleep_for(100ms);  // accepted, all of them
  const auto t0 = Clock::now();
  const std::string r = get(server.port(), "/healthz");
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 1.0);
  EXPECT_EQ(r.rfind("HTTP/1.0 200 OK\r\n", 0), 0u) << r;
  for (int fd : idle) ::close(fd);
}

TEST(HttpServer, OversizedAndNonGetRequestsAreAnswered) {
  edit::http::PlainServer server("127.0.0.1", 0, [](const std::string&) {
    return edit::http::Response{200, "text/plain", "ok\n"};
  });
  const int fd = connectTo(server.port());
  const std::string big = "GET /" + std::string(20000, 'a');
  ::send(fd, big.data(), big.size(), MSG_NOSIGNAL);
  std::string out;
  char buf[4096];
  for (int i = 0; i < 100; ++i) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 20) <= 0) continue;
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  EXPECT_EQ(out.rfind("HTTP/1.0 431", 0), 0u) << out.substr(0, 80);
  const int post = connectTo(server.port());
  ::send(post, "POST / HTTP/1.0\r\n\r\n", 19, MSG_NOSIGNAL);
  out.clear();
  for (int i = 0; i < 100; ++i) {
    pollfd p{post, POLLIN, 0};
    if (::poll(&p, 1, 20) <= 0) continue;
    const ssize_t n = ::recv(post, buf, sizeof buf, 0);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(post);
  EXPECT_EQ(out.rfind("HTTP/1.0 405", 0), 0u) << out;
}

}  // namespace
