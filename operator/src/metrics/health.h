// A minimal HTTP/1.0 server for /healthz and /readyz (kubelet probes). Plain sockets:
// probes need nothing more, and it keeps cpprest's listener out of the process.
#pragma once

#include <atomic>
#include <functional>
#include <string>
#include <thread>

namespace edit::op::metrics {

class HealthServer {
 public:
  // addr "host:port"; port 0 picks a free port (see port()).
  HealthServer(const std::string& addr, std::function<bool()> ready);
  ~HealthServer();
  int port() const { return port_; }
  std::string host() const { return host_; }
  void stop();

 private:
  void serve();
  std::string host_;
  int port_ = 0;
  int fd_ = -1;
  std::function<bool()> ready_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// Splits "host:port" (IPv6 "[::1]:80"); throws std::invalid_argument.
std::pair<std::string, int> splitHostPort(const std::string& addr);

}  // namespace edit::op::metrics
