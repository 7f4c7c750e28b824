#include "metrics/health.h"

namespace edit::op::metrics {

HealthServer::HealthServer(const std::string& addr, std::function<bool()> ready) {
  auto [host, port] = splitHostPort(addr);
  server_ = std::make_unique<http::PlainServer>(host, port, [ready = std::move(ready)](const std::string& path) {
    if (path == "/healthz") return http::Response{200, "text/plain; charset=utf-8", "ok\n"};
    if (path == "/readyz") {
      const bool ok = !ready || ready();
      return http::Response{ok ? 200 : 503, "text/plain; charset=utf-8", ok ? "ok\n" : "not ready\n"};
    }
    return http::Response{404, "text/plain; charset=utf-8", "not found\n"};
  });
}

}  // namespace edit::op::metrics
