// /metrics exporter (prometheus-cpp) and the gRPC report stream to the operator.
#include "telemetry/telemetry.h"

#include <grpcpp/grpcpp.h>
#include <prometheus/counter.h>
#include <prometheus/text_serializer.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "edit/v1alpha1/telemetry.grpc.pb.h"
#include "http_server.h"

namespace edit {

// ---------------------------------------------------------------------------- metrics

namespace {

// Step and sync times range from ~1 ms (tiny models) to a minute (large syncs).
const prometheus::Histogram::BucketBoundaries kSecondsBuckets = {
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60};

// Advances a counter to a cumulative value; a value that went down (a restarted source)
// only moves the baseline, since a counter never decreases.
template <typename T>
void advance(prometheus::Counter& c, T& last, T now) {
  if (now > last) c.Increment(static_cast<double>(now - last));
  last = now;
}

}  // namespace

struct WorkerMetrics::Impl {
  std::shared_ptr<prometheus::Registry> registry = std::make_shared<prometheus::Registry>();
  std::unique_ptr<http::PlainServer> server;  // not Exposer: see http_server.h
  std::mutex mu;

  prometheus::Histogram* stepSeconds = nullptr;
  prometheus::Gauge* loss = nullptr;
  prometheus::Counter* tokens = nullptr;
  prometheus::Counter* syncRounds = nullptr;
  prometheus::Histogram* syncDuration = nullptr;
  prometheus::Family<prometheus::Counter>* commBytes = nullptr;
  prometheus::Family<prometheus::Counter>* commWait = nullptr;
  prometheus::Gauge* pseudoGradNorm = nullptr;
  prometheus::Counter* anomalies = nullptr;
  prometheus::Counter* outerSkips = nullptr;
  prometheus::Gauge* skipStreak = nullptr;
  prometheus::Gauge* weightMin = nullptr;
  prometheus::Gauge* weightMax = nullptr;
  prometheus::Gauge* clipFactorMin = nullptr;
  prometheus::Counter* unitsClipped = nullptr;

  uint64_t lastTokens = 0, lastSyncRounds = 0, lastAnomalies = 0, lastOuterSkips = 0, lastUnitsClipped = 0;
  int64_t lastStep = -1;
  std::map<std::pair<std::string, std::string>, uint64_t> lastBytes;
  std::map<std::string, double> lastWait;
};

WorkerMetrics::WorkerMetrics(const std::string& host, int port, const std::string& job, int rank,
                             int replica, int shard)
    : impl_(std::make_unique<Impl>()) {
  using namespace prometheus;
  const Labels constant = {{"job", job},
                           {"rank", std::to_string(rank)},
                           {"replica", std::to_string(replica)},
                           {"shard", std::to_string(shard)}};
  auto& r = *impl_->registry;
  impl_->stepSeconds = &BuildHistogram()
                            .Name("edit_train_step_seconds")
                            .Help("Wall time of one training step")
                            .Labels(constant)
                            .Register(r)
                            .Add({}, kSecondsBuckets);
  impl_->loss = &BuildGauge().Name("edit_train_loss").Help("Training loss of the last step").Labels(constant).Register(r).Add({});
  impl_->tokens = &BuildCounter()
                       .Name("edit_train_tokens_total")
                       .Help("Tokens processed by this rank")
                       .Labels(constant)
                       .Register(r)
                       .Add({});
  impl_->syncRounds = &BuildCounter()
                           .Name("edit_sync_rounds_total")
                           .Help("Outer synchronization rounds completed")
                           .Labels(constant)
                           .Register(r)
                           .Add({});
  impl_->syncDuration = &BuildHistogram()
                            .Name("edit_sync_seconds")
                            .Help("Duration of one synchronization round")
                            .Labels(constant)
                            .Register(r)
                            .Add({}, kSecondsBuckets);
  impl_->commBytes = &BuildCounter()
                          .Name("edit_comm_bytes_total")
                          .Help("Bytes sent by this rank, per collective and process group")
                          .Labels(constant)
                          .Register(r);
  impl_->commWait = &BuildCounter()
                         .Name("edit_comm_wait_seconds_total")
                         .Help("Time the training thread was blocked in collectives, per process group")
                         .Labels(constant)
                         .Register(r);
  impl_->pseudoGradNorm = &BuildGauge()
                               .Name("edit_pseudo_grad_norm")
                               .Help("Norm of the last averaged pseudo-gradient")
                               .Labels(constant)
                               .Register(r)
                               .Add({});
  impl_->anomalies = &BuildCounter()
                          .Name("edit_pseudo_grad_anomalies_total")
                          .Help("Pseudo-gradient anomalies detected and eliminated")
                          .Labels(constant)
                          .Register(r)
                          .Add({});
  impl_->outerSkips = &BuildCounter()
                           .Name("edit_outer_steps_skipped_total")
                           .Help("Units whose outer step a sync round skipped because every replica was anomalous")
                           .Labels(constant)
                           .Register(r)
                           .Add({});
  impl_->skipStreak = &BuildGauge()
                           .Name("edit_outer_step_skip_streak")
                           .Help("Sync rounds in a row a unit's outer step was skipped (the job fails at "
                                 "algorithm.penalty.maxSkippedRounds)")
                           .Labels(constant)
                           .Register(r)
                           .Add({});

  // The penalty at the last round: this replica's weight in the average (uniform 1/M; one
  // replica near 1 and the others near 0 means the softmax's scale does not fit the norms)
  // and the clip factor (1: not clipped; below 1 every round: clipNorm is too small).
  auto gauge = [&](const char* name, const char* help) {
    return &BuildGauge().Name(name).Help(help).Labels(constant).Register(r).Add({});
  };
  impl_->weightMin = gauge("edit_sync_replica_weight_min",
                           "This replica's smallest weight over the units at the last sync round (uniform: 1/M)");
  impl_->weightMax = gauge("edit_sync_replica_weight_max",
                           "This replica's largest weight over the units at the last sync round (uniform: 1/M)");
  impl_->clipFactorMin = gauge("edit_sync_clip_factor_min",
                               "Smallest clip factor of an averaged pseudo-gradient at the last sync round (1: none clipped)");
  impl_->unitsClipped = &BuildCounter()
                             .Name("edit_sync_units_clipped_total")
                             .Help("Units whose averaged pseudo-gradient a sync round clipped")
                             .Labels(constant)
                             .Register(r)
                             .Add({});

  // Serialize under the update lock so a scrape never sees half of a step's update.
  Impl* impl = impl_.get();
  try {
    impl_->server = std::make_unique<http::PlainServer>(host, port, [impl](const std::string& path) {
      if (path != "/metrics") return http::Response{404, "text/plain; charset=utf-8", "not found\n"};
      std::lock_guard<std::mutex> lock(impl->mu);
      return http::Response{200, "text/plain; version=0.0.4; charset=utf-8",
                            prometheus::TextSerializer().Serialize(impl->registry->Collect())};
    });
  } catch (const std::exception& e) {
    throw std::runtime_error("metrics: " + std::string(e.what()));
  }
}

WorkerMetrics::~WorkerMetrics() = default;

int WorkerMetrics::port() const {
  return impl_->server->port();
}

void WorkerMetrics::update(const StepReport& r) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  auto& m = *impl_;
  if (r.step != m.lastStep) {  // one observation per step, however often update() is called
    m.stepSeconds->Observe(r.stepSeconds);
    if (r.synced) m.syncDuration->Observe(r.lastSyncDurationSeconds);
    m.lastStep = r.step;
  }
  m.loss->Set(r.loss);
  m.pseudoGradNorm->Set(r.pseudoGradNorm);
  advance(*m.tokens, m.lastTokens, r.tokens);
  advance(*m.syncRounds, m.lastSyncRounds, r.syncRounds);
  advance(*m.anomalies, m.lastAnomalies, r.anomalies);
  advance(*m.outerSkips, m.lastOuterSkips, r.outerSkips);
  m.skipStreak->Set(static_cast<double>(r.skipStreak));
  m.weightMin->Set(r.replicaWeightMin);
  m.weightMax->Set(r.replicaWeightMax);
  m.clipFactorMin->Set(r.clipFactorMin);
  advance(*m.unitsClipped, m.lastUnitsClipped, r.unitsClipped);

  std::map<std::string, double> waitByGroup;
  for (const auto& [key, c] : r.comm) {
    auto& counter = m.commBytes->Add({{"op", key.first}, {"group", key.second}});
    advance(counter, m.lastBytes[key], c.bytes);
    waitByGroup[key.second] += c.waitSeconds;
  }
  for (const auto& [group, wait] : waitByGroup)
    advance(m.commWait->Add({{"group", group}}), m.lastWait[group], wait);
}

// ---------------------------------------------------------------------------- telemetry

namespace pb = ::edit::v1alpha1;

struct TelemetryClient::Impl {
  std::string addr;
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  std::string serverNameOverride;  // empty: the address's host
  pb::WorkerReport identity;  // namespace, job, token, pod, pod uid, node, restart generation

  std::mutex mu;
  std::condition_variable cv;
  std::optional<pb::WorkerReport> pending;  // queue of one: the newest report wins
  std::optional<pb::WorkerReport> lastSent;  // what a heartbeat resends
  std::chrono::milliseconds heartbeat{0};    // 0: no heartbeats
  bool stop = false;
  bool streamBroken = false;
  grpc::ClientContext* active = nullptr;  // the live stream's context, for TryCancel

  std::atomic<int> command{static_cast<int>(OperatorCommand::None)};
  std::atomic<int> scaleTarget{0};  // SCALE's replica count; 0: none
  std::atomic<bool> connected{false};
  std::thread worker;

  void run();
  bool waitBackoff(std::chrono::milliseconds d);
  void noteCommand(const pb::Command& c);
};

void TelemetryClient::Impl::noteCommand(const pb::Command& c) {
  if (c.kind() == pb::Command::SCALE) {
    // A target, not a step: the newest one is what the operator wants now.
    if (c.replicas() > 0) scaleTarget = c.replicas();
    return;
  }
  OperatorCommand next = OperatorCommand::None;
  if (c.kind() == pb::Command::CHECKPOINT) next = OperatorCommand::Checkpoint;
  if (c.kind() == pb::Command::STOP) next = OperatorCommand::Stop;
  if (next == OperatorCommand::None) return;
  // Newest wins, except that an untaken Stop is never downgraded to a Checkpoint.
  int cur = command.load();
  while (!(cur == static_cast<int>(OperatorCommand::Stop) && next == OperatorCommand::Checkpoint) &&
         !command.compare_exchange_weak(cur, static_cast<int>(next))) {
  }
}

// Sleeps up to d; false when the client is being destroyed.
bool TelemetryClient::Impl::waitBackoff(std::chrono::milliseconds d) {
  std::unique_lock<std::mutex> lock(mu);
  cv.wait_for(lock, d, [&] { return stop; });
  return !stop;
}

void TelemetryClient::Impl::run() {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 5000);
  if (!serverNameOverride.empty()) args.SetSslTargetNameOverride(serverNameOverride);
  auto channel = grpc::CreateCustomChannel(addr, credentials, args);
  auto stub = pb::Telemetry::NewStub(channel);
  std::mt19937_64 rng(std::random_device{}());
  std::chrono::milliseconds backoff(100);
  const std::chrono::milliseconds cap(5000);

  for (;;) {
    grpc::ClientContext ctx;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (stop) return;
      active = &ctx;
      streamBroken = false;
    }
    auto stream = stub->Stream(&ctx);
    std::thread reader([&] {
      pb::Command c;
      while (stream->Read(&c)) {
        connected = true;  // a command proves the stream is up, even before our Write returns
        noteCommand(c);
      }
      std::lock_guard<std::mutex> lock(mu);
      streamBroken = true;
      cv.notify_all();
    });

    // Deliver reports until the stream breaks or the client is destroyed.
    for (;;) {
      pb::WorkerReport report;
      {
        std::unique_lock<std::mutex> lock(mu);
        auto ready = [&] { return stop || streamBroken || pending.has_value(); };
        if (heartbeat.count() > 0 && lastSent) {
          if (!cv.wait_for(lock, heartbeat, ready)) {
            // Nothing new for a heartbeat interval: say we are alive, with what we last said.
            lastSent->set_heartbeat(true);
            lastSent->set_unix_time(
                std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count());
            pending = *lastSent;
          }
        } else {
          cv.wait(lock, ready);
        }
        if (stop || streamBroken) break;
        report = std::move(*pending);
        pending.reset();
        lastSent = report;
      }
      if (!stream->Write(report)) {
        std::lock_guard<std::mutex> lock(mu);
        if (!pending) pending = std::move(report);  // retry it unless a newer one came
        break;
      }
      connected = true;
      backoff = std::chrono::milliseconds(100);
    }

    {
      std::lock_guard<std::mutex> lock(mu);
      active = nullptr;
    }
    ctx.TryCancel();  // unblocks the reader; Finish() then returns at once
    reader.join();
    stream->Finish();
    connected = false;

    // Exponential backoff with jitter, so restarted operators are not stampeded.
    std::uniform_real_distribution<double> jitter(0.5, 1.0);
    auto wait = std::chrono::milliseconds(static_cast<int64_t>(backoff.count() * jitter(rng)));
    backoff = std::min(cap, backoff * 2);
    if (!waitBackoff(wait)) return;
  }
}

namespace {

// The CA bundle of telemetry.tlsCaFile. Read once here so that a bad path stops the
// worker at startup instead of leaving the stream to fail handshakes forever.
std::string readCaBundle(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw std::runtime_error("telemetry.tlsCaFile: cannot read " + path + ": " + std::strerror(errno) +
                             " (EDIT_TELEMETRY_CA_FILE; the PEM CA bundle that verifies the operator)");
  std::ostringstream out;
  out << in.rdbuf();
  std::string pem = out.str();
  if (pem.find("-----BEGIN CERTIFICATE-----") == std::string::npos)
    throw std::runtime_error("telemetry.tlsCaFile: " + path + " holds no PEM certificate");
  return pem;
}

}  // namespace

TelemetryClient::TelemetryClient(const std::string& addr, const std::string& token,
                                 const TelemetryIdentity& who, const TelemetryTls& tls,
                                 double heartbeatSeconds)
    : impl_(std::make_unique<Impl>()) {
  if (!tls.serverName.empty() && tls.caFile.empty())
    throw std::runtime_error("telemetry.tlsServerName: needs telemetry.tlsCaFile (TLS is on only with a CA bundle)");
  if (tls.caFile.empty()) {
    impl_->credentials = grpc::InsecureChannelCredentials();
  } else {
    grpc::SslCredentialsOptions options;
    options.pem_root_certs = readCaBundle(tls.caFile);
    impl_->credentials = grpc::SslCredentials(options);
    impl_->serverNameOverride = tls.serverName;
  }
  impl_->addr = addr;
  if (heartbeatSeconds > 0)
    impl_->heartbeat = std::chrono::milliseconds(static_cast<int64_t>(heartbeatSeconds * 1000));
  impl_->identity.set_namespace_(who.ns);
  impl_->identity.set_job(who.job);
  impl_->identity.set_token(token);
  impl_->identity.set_pod(who.pod);
  impl_->identity.set_pod_uid(who.podUid);
  impl_->identity.set_node(who.node);
  impl_->identity.set_restart_generation(who.restartGeneration);
  impl_->worker = std::thread([this] { impl_->run(); });
}

TelemetryClient::~TelemetryClient() {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->stop = true;
    impl_->pending.reset();  // nothing more is sent
    if (impl_->active) impl_->active->TryCancel();
  }
  impl_->cv.notify_all();
  impl_->worker.join();
}

void TelemetryClient::send(const StepReport& r) {
  pb::WorkerReport m = impl_->identity;
  m.set_rank(r.rank);
  m.set_replica(r.replica);
  m.set_shard(r.shard);
  m.set_replicas(r.replicas);
  m.set_step(r.step);
  m.set_total_steps(r.totalSteps);
  m.set_loss(r.loss);
  m.set_tokens(r.tokens);
  m.set_sync_rounds(r.syncRounds);
  m.set_anomalies(r.anomalies);
  m.set_pseudo_grad_norm(r.pseudoGradNorm);
  m.set_step_seconds(r.stepSeconds);
  m.set_compute_seconds(r.computeSeconds);
  auto* local = m.mutable_local_phase();
  local->set_steps(r.local.localSteps);
  local->set_compute_seconds(r.local.computeSeconds);
  local->set_blocked_seconds(r.local.blockedSeconds);
  local->set_rounds(r.local.rounds);
  m.set_comm_wait_seconds(r.commWaitSeconds);
  m.set_sync_seconds(r.lastSyncDurationSeconds);
  for (const auto& [key, c] : r.comm) {
    auto* cc = m.add_comm();
    cc->set_op(key.first);
    cc->set_group(key.second);
    cc->set_bytes(c.bytes);
    cc->set_wait_seconds(c.waitSeconds);
    cc->set_calls(c.calls);
  }
  m.set_phase(r.phase);
  m.set_unix_time(std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count());
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    if (impl_->stop) return;
    impl_->pending = std::move(m);
  }
  impl_->cv.notify_all();
}

OperatorCommand TelemetryClient::takeCommand() {
  return static_cast<OperatorCommand>(impl_->command.exchange(static_cast<int>(OperatorCommand::None)));
}

int TelemetryClient::takeScaleTarget() { return impl_->scaleTarget.exchange(0); }
int TelemetryClient::peekScaleTarget() const { return impl_->scaleTarget.load(); }

bool TelemetryClient::connected() const { return impl_->connected.load(); }

}  // namespace edit
