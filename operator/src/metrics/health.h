// /healthz and /readyz for the kubelet's probes, on the shared plain HTTP server.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "http_server.h"

namespace edit::op::metrics {

class HealthServer {
 public:
  // addr "host:port"; port 0 picks a free port (see port()).
  HealthServer(const std::string& addr, std::function<bool()> ready);
  int port() const { return server_->port(); }
  std::string host() const { return server_->host(); }
  void stop() { server_->stop(); }

 private:
  std::unique_ptr<http::PlainServer> server_;
};

using http::splitHostPort;

}  // namespace edit::op::metrics
