// Worker telemetry: the gRPC service edit.v1alpha1.Telemetry (bidi Stream) and the hub
// that keeps per-job state, checks tokens, feeds the metrics and queues commands.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "edit/v1alpha1/telemetry.grpc.pb.h"
#include "metrics/metrics.h"
#include "telemetry/job_state.h"

namespace edit::op::telemetry {

double unixNow();

class TelemetryHub {
 public:
  explicit TelemetryHub(metrics::Metrics* metrics);
  ~TelemetryHub();
  TelemetryHub(const TelemetryHub&) = delete;
  TelemetryHub& operator=(const TelemetryHub&) = delete;

  // --- controller side ---
  // Accept reports for this job with this token; updates settings if already known.
  // worldSize bounds the ranks a report may name (the larger of the spec's and the
  // running world while a scale is under way); 0: only the absolute bound (65536).
  // uid: the job object's; a job of the same name with another uid (deleted and created
  // again) starts from nothing, as a new job.
  void registerJob(const std::string& ns, const std::string& job, const std::string& token,
                   const StragglerSettings& settings, int restartGeneration, int worldSize = 0,
                   const std::string& uid = "");
  void forgetJob(const std::string& ns, const std::string& job);
  // Called on a gang restart: the old generation's reports no longer count.
  void resetJob(const std::string& ns, const std::string& job, int restartGeneration);
  void resetRank(const std::string& ns, const std::string& job, int rank);
  // A rank that left at a scale-down: its reports and worker metrics go.
  void removeRank(const std::string& ns, const std::string& job, int rank);

  struct RankReport {
    std::string podUid;  // of the pod that sent the rank's newest report
    int64_t step = 0;
    double lastSeenUnix = 0;  // when it arrived (heartbeats included)
    int replicas = 0;         // the replicas its world had (0: not said)
    LinkMeasurement local;    // its local phase so far (measured fields only)
  };
  struct Snapshot {
    Progress progress;
    std::map<int, RankReport> ranks;
    std::vector<WorkerScore> scores;
    std::vector<WorkerScore> stragglers;
    double lastReportUnix = 0;
    bool hasReports = false;
    int64_t lowestStep = 0;  // the lowest step reported since the job's last reset (0: none)
  };
  std::optional<Snapshot> snapshot(const std::string& ns, const std::string& job) const;
  bool hung(const std::string& ns, const std::string& job, double timeoutSeconds) const;

  // Queues a command for a rank (-1: every rank); it goes out on that worker's stream
  // with the answer to its next report.
  void sendCommand(const std::string& ns, const std::string& job, int rank, edit::v1alpha1::Command::Kind kind,
                   const std::string& reason);
  // Asks a rank to scale the job to `replicas`; replaces a SCALE of that rank not yet
  // delivered (the target is absolute, so only the newest matters).
  void sendScale(const std::string& ns, const std::string& job, int rank, int replicas, const std::string& reason);

  // Called (outside locks) after each accepted report, e.g. to enqueue the job.
  void setOnReport(std::function<void(const std::string& ns, const std::string& job)> cb) { onReport_ = std::move(cb); }

  // Only the leader takes reports (it alone reconciles and knows the tokens); a replica
  // that does not lead answers UNAVAILABLE, and workers retry with backoff.
  void setServing(bool serving) { serving_ = serving; }

  // --- server side ---
  // UNAVAILABLE while not serving; PERMISSION_DENIED for an unknown job or a wrong token;
  // fills commands to send back.
  grpc::Status accept(const edit::v1alpha1::WorkerReport& r, std::vector<edit::v1alpha1::Command>* commands);

  // Refreshes edit_worker_last_report_age_seconds.
  void refreshMetrics();
  // Sets the series computed over a job's ranks: every rank's straggler score and the
  // job's stragglers, tokens/s, loss, step and sync duration. The hub asks the metrics to
  // call it before each scrape (Metrics::setBeforeScrape), so a report does not pay for it.
  void publishJobMetrics();

 private:
  struct Job {
    std::string uid;
    std::string token;
    int restartGeneration = 0;
    int worldSize = 0;  // 0: unknown
    JobTelemetry state{};  // braces: its constructor is explicit, and Job{} must still compile
    std::map<int, std::vector<edit::v1alpha1::Command>> pending;  // rank -> commands
    std::vector<edit::v1alpha1::Command> pendingAll;
    std::map<int, size_t> allDelivered;  // rank -> how many of pendingAll it got
    std::set<std::string> leftPods;      // uids of pods that left at a scale-down, or of a stopped gang
    int64_t lowestStep = 0;              // lowest step reported since the last reset: where a new gang resumed
  };
  using Key = std::pair<std::string, std::string>;

  metrics::Metrics* metrics_;
  std::atomic<bool> serving_{true};
  mutable std::mutex mu_;
  std::map<Key, Job> jobs_;
  std::function<void(const std::string&, const std::string&)> onReport_;
};

// PEM material of a TLS telemetry server (--telemetry-tls-cert/--telemetry-tls-key).
// Empty: plaintext. Token auth applies either way. Never logged.
struct ServerTls {
  std::string certPem;  // certificate chain, leaf first
  std::string keyPem;   // private key of the leaf
  bool enabled() const { return !certPem.empty(); }
};

// Reads and checks the two files: both or neither must be given, each must hold PEM, and
// the key must belong to the certificate. Errors (std::invalid_argument) name the flag
// and the file, never the content. Both empty: a disabled ServerTls.
ServerTls loadServerTls(const std::string& certFile, const std::string& keyFile);

// What the telemetry server holds for its clients (docs/job-store.md, "Telemetry limits").
struct ServerLimits {
  // Open worker streams (one per worker); more are refused with RESOURCE_EXHAUSTED, and
  // the worker retries with backoff. Streams cost no thread each (callback API).
  int maxStreams = 16384;
  // Streams one connection may open (a worker opens one at a time).
  int maxStreamsPerConnection = 8;
  // A report is a few hundred bytes; gRPC's default would be 4 MiB.
  int maxReportBytes = 64 << 10;
  // The server pings a connection silent this long, and drops it when the ping is not
  // answered within keepaliveTimeout (a worker whose node vanished).
  std::chrono::milliseconds keepaliveTime{60000};
  std::chrono::milliseconds keepaliveTimeout{20000};
  // The most often a client may ping (more often: GOAWAY, as gRPC's servers do).
  std::chrono::milliseconds minClientPingInterval{10000};
  // From TCP connect to a finished HTTP/2 (and TLS) handshake; gRPC's default is 120 s.
  std::chrono::milliseconds handshakeTimeout{10000};
};

// The gRPC server around a hub. addr "host:port" (port 0: any free port).
class TelemetryServer {
 public:
  TelemetryServer(TelemetryHub& hub, const std::string& addr, const ServerTls& tls = {},
                  const ServerLimits& limits = {});
  ~TelemetryServer();
  int port() const { return port_; }
  // Streams open now (tests, the bench).
  int streams() const;
  void shutdown();

 private:
  class Service;
  std::unique_ptr<Service> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

}  // namespace edit::op::telemetry
