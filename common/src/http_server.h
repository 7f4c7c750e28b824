// A minimal HTTP/1.0 server on plain sockets for /metrics, /healthz and /readyz.
//
// Why not prometheus-cpp's Exposer (civetweb)? civetweb starts its threads with a fixed
// 100 KiB stack, and a process that links LibTorch + OpenBLAS has more thread-local
// storage than that, so pthread_create fails ("null context when constructing
// CivetServer"). One std::thread with the default stack is all a scrape or a probe needs;
// it polls every connection, so a client that connects and says nothing (or says it
// slowly) cannot keep /healthz from answering: each request has kRequestTimeout to
// arrive, and at kMaxConnections the oldest connection still being read makes room.
#pragma once

#include <atomic>
#include <functional>
#include <string>
#include <thread>
#include <utility>

namespace edit::http {

struct Response {
  int status = 200;
  std::string contentType = "text/plain; charset=utf-8";
  std::string body;
};

// Called with the request path (e.g. "/metrics") of every GET; on the server's thread.
using Handler = std::function<Response(const std::string& path)>;

class PlainServer {
 public:
  static constexpr int kMaxConnections = 64;
  static constexpr int kRequestTimeoutMs = 5000;   // connect to the end of the headers
  static constexpr int kResponseTimeoutMs = 10000; // for the response to leave
  static constexpr size_t kMaxRequestBytes = 8192;

  // host "" or "0.0.0.0" = all interfaces; port 0 picks a free port (see port()).
  PlainServer(const std::string& host, int port, Handler handler);
  ~PlainServer();
  PlainServer(const PlainServer&) = delete;
  PlainServer& operator=(const PlainServer&) = delete;
  int port() const { return port_; }
  const std::string& host() const { return host_; }
  void stop();

 private:
  void serve();
  std::string host_;
  int port_ = 0;
  int fd_ = -1;
  Handler handler_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// Splits "host:port" (IPv6 "[::1]:80"); throws std::invalid_argument naming the address.
std::pair<std::string, int> splitHostPort(const std::string& addr);

}  // namespace edit::http
