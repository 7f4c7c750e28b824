// Worker-side observability: the Prometheus /metrics endpoint of one worker and the gRPC
// stream of reports to the operator. Both are fed the same StepReport after each step.
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "worker_config.h"
#include "telemetry/report.h"

namespace edit {

// Serves /metrics with the worker metrics of DESIGN.md:
//   edit_train_step_seconds (histogram), edit_train_loss, edit_train_tokens_total,
//   edit_sync_rounds_total, edit_sync_seconds (histogram), edit_comm_bytes_total{op,group},
//   edit_comm_wait_seconds_total{group}, edit_pseudo_grad_norm,
//   edit_pseudo_grad_anomalies_total, edit_outer_steps_skipped_total, edit_outer_step_skip_streak
// with constant labels job, rank, replica, shard.
class WorkerMetrics {
 public:
  // port 0 picks a free port; port() tells which.
  WorkerMetrics(const std::string& host, int port, const std::string& job, int rank,
                int replica, int shard);
  ~WorkerMetrics();
  void update(const StepReport& r);
  int port() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Commands the operator can send back.
enum class OperatorCommand { None, Checkpoint, Stop };

// TLS for the report stream (config telemetry.tlsCaFile / telemetry.tlsServerName).
struct TelemetryTls {
  std::string caFile;      // PEM CA bundle that verifies the operator; empty: plaintext
  std::string serverName;  // name checked in the operator's certificate instead of the address's host
};

// Who is reporting: sent with every report.
struct TelemetryIdentity {
  std::string ns;
  std::string job;
  std::string pod;
  std::string podUid;  // empty outside Kubernetes; tells a replacement from its predecessor
  std::string node;
  int restartGeneration = 0;  // EDIT_RESTART_GENERATION: the operator drops reports of older gangs
};

// Streams reports to the operator (proto/edit/v1alpha1/telemetry.proto). Never blocks the
// training thread: send() queues the newest report and a background thread delivers it,
// reconnecting with backoff; a report overwritten before it was sent is dropped (the
// counters are cumulative). The token is never logged. With tls.caFile the stream is TLS
// and never falls back to plaintext; an unreadable CA file throws std::runtime_error
// naming telemetry.tlsCaFile (at construction, i.e. at worker startup). With
// heartbeatSeconds > 0 the last report is resent (heartbeat = true) whenever that long
// passes without a new one: a worker blocked in a collective stays visibly alive, a
// stopped or frozen one falls silent.
class TelemetryClient {
 public:
  TelemetryClient(const std::string& addr, const std::string& token, const TelemetryIdentity& who,
                  const TelemetryTls& tls = {}, double heartbeatSeconds = 0);
  ~TelemetryClient();
  void send(const StepReport& r);
  // The newest command received and not yet taken (None if none).
  OperatorCommand takeCommand();
  // The replica count of the newest SCALE command received and not yet taken (0 if
  // none). Kept apart from takeCommand's slot, so a SCALE and a Checkpoint/Stop sent
  // close together are both delivered.
  int takeScaleTarget();
  // The same without taking it (safe from any thread): what the operator asks for now.
  int peekScaleTarget() const;
  bool connected() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace edit
