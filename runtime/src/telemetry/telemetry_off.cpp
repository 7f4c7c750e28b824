// telemetry.h for builds with -DEDIT_MINIMAL=ON (LibTorch, yaml-cpp and nlohmann-json
// only, e.g. a GPU machine with nothing but PyTorch; docs/gpu.md): there is no
// prometheus-cpp and no gRPC, so asking for /metrics or for the operator's report stream
// is a startup error that says why, instead of a worker that silently reports nothing.
#include "telemetry/telemetry.h"

#include <stdexcept>

namespace edit {

struct WorkerMetrics::Impl {};
struct TelemetryClient::Impl {};

WorkerMetrics::WorkerMetrics(const std::string&, int, const std::string&, int, int, int) {
  throw std::runtime_error(
      "metrics.port: this edit-train was built with -DEDIT_MINIMAL=ON (no prometheus-cpp): "
      "no /metrics; leave metrics.port at -1");
}
WorkerMetrics::~WorkerMetrics() = default;
void WorkerMetrics::update(const StepReport&) {}
int WorkerMetrics::port() const { return -1; }

TelemetryClient::TelemetryClient(const std::string&, const std::string&, const TelemetryIdentity&,
                                 const TelemetryTls&, double) {
  throw std::runtime_error(
      "telemetry.addr: this edit-train was built with -DEDIT_MINIMAL=ON (no gRPC): "
      "it cannot report to the operator; leave telemetry.addr empty");
}
TelemetryClient::~TelemetryClient() = default;
void TelemetryClient::send(const StepReport&) {}
OperatorCommand TelemetryClient::takeCommand() { return OperatorCommand::None; }
int TelemetryClient::takeScaleTarget() { return 0; }
int TelemetryClient::peekScaleTarget() const { return 0; }
bool TelemetryClient::connected() const { return false; }

}  // namespace edit
