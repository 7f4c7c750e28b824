#include "telemetry/server.h"

#include <algorithm>
#include <cmath>

#include <grpcpp/grpcpp.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <stdexcept>

#include "util/log.h"

namespace edit::op::telemetry {

namespace pb = edit::v1alpha1;

double unixNow() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

TelemetryHub::TelemetryHub(metrics::Metrics* metrics) : metrics_(metrics) {
  if (metrics_) metrics_->setBeforeScrape([this] { publishJobMetrics(); });
}

TelemetryHub::~TelemetryHub() {
  if (metrics_) metrics_->setBeforeScrape(nullptr);
}

void TelemetryHub::registerJob(const std::string& ns, const std::string& job, const std::string& token,
                               const StragglerSettings& settings, int restartGeneration) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& j = jobs_[{ns, job}];
  j.token = token;
  j.state.setSettings(settings);
  if (restartGeneration > j.restartGeneration) {
    j.restartGeneration = restartGeneration;
    j.state.reset();
  }
}

void TelemetryHub::forgetJob(const std::string& ns, const std::string& job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    jobs_.erase({ns, job});
  }
  if (metrics_) metrics_->removeJob(ns, job);
}

void TelemetryHub::resetJob(const std::string& ns, const std::string& job, int restartGeneration) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = jobs_.find({ns, job});
  if (it == jobs_.end()) return;
  it->second.restartGeneration = restartGeneration;
  it->second.state.reset();
  it->second.pending.clear();
  it->second.pendingAll.clear();
  it->second.allDelivered.clear();
  it->second.leftPods.clear();
}

void TelemetryHub::resetRank(const std::string& ns, const std::string& job, int rank) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = jobs_.find({ns, job});
  if (it != jobs_.end()) it->second.state.resetRank(rank);
}

void TelemetryHub::removeRank(const std::string& ns, const std::string& job, int rank) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = jobs_.find({ns, job});
    if (it == jobs_.end()) return;
    auto& state = it->second.state;
    // A report the leaver sent on its way out must not bring it back.
    if (auto r = state.ranks().find(rank); r != state.ranks().end() && !r->second.last.podUid.empty())
      it->second.leftPods.insert(r->second.last.podUid);
    state.removeRank(rank);
    it->second.pending.erase(rank);
  }
  if (metrics_) metrics_->removeWorker(ns, job, rank);
}

std::optional<TelemetryHub::Snapshot> TelemetryHub::snapshot(const std::string& ns, const std::string& job) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = jobs_.find({ns, job});
  if (it == jobs_.end()) return std::nullopt;
  Snapshot s;
  const auto& st = it->second.state;
  s.progress = st.progress();
  s.scores = st.scores();
  for (const auto& w : s.scores)
    if (JobTelemetry::isStraggler(w, st.settings().threshold)) s.stragglers.push_back(w);
  s.lastReportUnix = st.lastReportTime();
  s.hasReports = st.hasReports();
  for (const auto& [rank, rs] : st.ranks()) s.ranks[rank] = {rs.last.podUid, rs.last.step, rs.lastSeen, rs.last.replicas, rs.last.local};
  return s;
}

bool TelemetryHub::hung(const std::string& ns, const std::string& job, double timeoutSeconds) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = jobs_.find({ns, job});
  return it != jobs_.end() && it->second.state.hung(unixNow(), timeoutSeconds);
}

void TelemetryHub::sendCommand(const std::string& ns, const std::string& job, int rank, pb::Command::Kind kind,
                               const std::string& reason) {
  pb::Command c;
  c.set_kind(kind);
  c.set_reason(reason);
  std::lock_guard<std::mutex> lock(mu_);
  auto& j = jobs_[{ns, job}];
  if (rank < 0)
    j.pendingAll.push_back(c);
  else
    j.pending[rank].push_back(c);
}

void TelemetryHub::sendScale(const std::string& ns, const std::string& job, int rank, int replicas,
                             const std::string& reason) {
  pb::Command c;
  c.set_kind(pb::Command::SCALE);
  c.set_replicas(replicas);
  c.set_reason(reason);
  std::lock_guard<std::mutex> lock(mu_);
  auto& queue = jobs_[{ns, job}].pending[rank];
  queue.erase(std::remove_if(queue.begin(), queue.end(), [](const pb::Command& q) { return q.kind() == pb::Command::SCALE; }),
              queue.end());
  queue.push_back(c);
}

// A report that passed the token check still comes from outside: its values become
// status fields and metric labels, so keep them in sane ranges.
static std::string invalidReport(const pb::WorkerReport& r) {
  constexpr int64_t kMaxSteps = int64_t{1} << 48;
  if (r.rank() < 0 || r.rank() >= 65536 || r.replica() < 0 || r.shard() < 0) return "rank/replica/shard out of range";
  if (r.replicas() < 0 || r.replicas() > 4096) return "replicas out of range";
  if (r.step() < 0 || r.step() > kMaxSteps || r.total_steps() < 0 || r.total_steps() > kMaxSteps)
    return "step/total_steps out of range";
  if (r.local_phase().steps() < 0 || r.local_phase().steps() > kMaxSteps || r.local_phase().rounds() > uint64_t(kMaxSteps))
    return "local_phase steps/rounds out of range";
  if (r.pod().size() > 253 || r.node().size() > 253 || r.phase().size() > 32 || r.pod_uid().size() > 128)
    return "pod/pod_uid/node/phase too long";
  for (double v : {r.step_seconds(), r.compute_seconds(), r.comm_wait_seconds(), r.sync_seconds(), r.unix_time(),
                   r.local_phase().compute_seconds(), r.local_phase().blocked_seconds()})
    if (!std::isfinite(v) || v < 0) return "timings must be finite and >= 0";
  if (r.comm_size() > 64) return "too many comm counters";
  for (const auto& c : r.comm())
    if (c.op().size() > 32 || c.group().size() > 32 || !std::isfinite(c.wait_seconds()) || c.wait_seconds() < 0)
      return "bad comm counter";
  return "";
}

grpc::Status TelemetryHub::accept(const pb::WorkerReport& r, std::vector<pb::Command>* commands) {
  const double now = unixNow();
  Report rep;
  metrics::WorkerSample ws;
  if (!serving_)
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "this edit-operator replica is not the leader; retry");
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = jobs_.find({r.namespace_(), r.job()});
    // Same answer for unknown job and wrong token: do not reveal which jobs exist.
    if (it == jobs_.end() || it->second.token.empty() || !constantTimeEquals(it->second.token, r.token()))
      return grpc::Status(grpc::StatusCode::PERMISSION_DENIED, "invalid telemetry token for this job");
    Job& job = it->second;
    if (r.restart_generation() < job.restartGeneration) return grpc::Status::OK;  // a leftover of an old gang
    if (!r.pod_uid().empty() && job.leftPods.count(r.pod_uid())) return grpc::Status::OK;  // left at a scale-down
    if (std::string why = invalidReport(r); !why.empty())
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "malformed report: " + why);
    rep.rank = r.rank();
    rep.replica = r.replica();
    rep.shard = r.shard();
    rep.pod = r.pod();
    rep.podUid = r.pod_uid();
    rep.node = r.node();
    rep.step = r.step();
    rep.totalSteps = r.total_steps();
    rep.loss = r.loss();
    rep.tokens = r.tokens();
    rep.syncRounds = r.sync_rounds();
    rep.anomalies = r.anomalies();
    rep.stepSeconds = r.step_seconds();
    rep.commWaitSeconds = r.comm_wait_seconds();
    rep.lastSyncDurationSeconds = r.sync_seconds();
    rep.restartGeneration = r.restart_generation();
    rep.replicas = r.replicas();
    rep.heartbeat = r.heartbeat();
    rep.local.localSteps = r.local_phase().steps();
    rep.local.computeSeconds = r.local_phase().compute_seconds();
    rep.local.blockedSeconds = r.local_phase().blocked_seconds();
    rep.local.rounds = static_cast<int64_t>(r.local_phase().rounds());
    for (const auto& c : r.comm()) rep.comm.push_back({c.op(), c.group(), c.bytes(), c.wait_seconds()});
    job.state.add(rep, now);
    auto pend = job.pending.find(rep.rank);
    if (pend != job.pending.end()) {
      *commands = std::move(pend->second);
      job.pending.erase(pend);
    }
    size_t& delivered = job.allDelivered[rep.rank];
    for (; delivered < job.pendingAll.size(); ++delivered) commands->push_back(job.pendingAll[delivered]);
  }
  if (metrics_) {
    ws.ns = r.namespace_();
    ws.job = r.job();
    ws.rank = rep.rank;
    ws.replica = rep.replica;
    ws.shard = rep.shard;
    ws.pod = rep.pod;
    ws.node = rep.node;
    ws.stepSeconds = rep.stepSeconds;
    ws.commWaitSeconds = rep.commWaitSeconds;
    ws.lastReportUnix = now;
    metrics_->setWorker(ws);
    for (const auto& c : rep.comm) metrics_->addCommBytes(ws, c.op, c.group, static_cast<double>(c.bytes));
    // Every rank's straggler score and the job's series change with every report, and
    // computing them takes a pass over the job: they are set when /metrics is read
    // (publishJobMetrics), so that a report costs the same at 8 workers and at 4096.
  }
  if (onReport_) onReport_(r.namespace_(), r.job());
  return grpc::Status::OK;
}

void TelemetryHub::publishJobMetrics() {
  if (!metrics_) return;
  // Under the hub's lock: a job forgotten meanwhile must not get its series back.
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [key, job] : jobs_) {
    if (!job.state.hasReports()) continue;
    const Progress p = job.state.progress();
    metrics::JobSample js;
    for (const auto& w : job.state.scores()) {
      metrics_->setStragglerScore(key.first, key.second, w.rank, w.score);
      if (JobTelemetry::isStraggler(w, job.state.settings().threshold)) js.stragglers += 1;
    }
    js.tokensPerSecond = p.tokensPerSecond;
    js.loss = p.loss;
    js.step = static_cast<double>(p.step);
    js.lastSyncDurationSeconds = p.lastSyncDurationSeconds;
    metrics_->setJob(key.first, key.second, js);
  }
}

void TelemetryHub::refreshMetrics() {
  if (metrics_) metrics_->refreshAges(unixNow());
}

class TelemetryServer::Service final : public pb::Telemetry::Service {
 public:
  explicit Service(TelemetryHub& hub) : hub_(hub) {}
  grpc::Status Stream(grpc::ServerContext*, grpc::ServerReaderWriter<pb::Command, pb::WorkerReport>* stream) override {
    pb::WorkerReport report;
    while (stream->Read(&report)) {
      std::vector<pb::Command> commands;
      grpc::Status st = hub_.accept(report, &commands);
      if (!st.ok()) {
        // Never log the token; name the job and rank only.
        log::warn("telemetry rejected", {{"namespace", report.namespace_()}, {"job", report.job()},
                                         {"rank", report.rank()}, {"reason", st.error_message()}});
        return st;
      }
      for (const auto& c : commands)
        if (!stream->Write(c)) return grpc::Status::OK;
    }
    return grpc::Status::OK;
  }

 private:
  TelemetryHub& hub_;
};

namespace {

std::string readPemFile(const std::string& flag, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::invalid_argument(flag + ": cannot read " + path + ": " + std::strerror(errno));
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

using Bio = std::unique_ptr<BIO, decltype(&BIO_free)>;
Bio memBio(const std::string& pem) { return Bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())), BIO_free); }

// An encrypted key must fail instead of prompting for a passphrase on the terminal.
int noPassphrase(char*, int, int, void*) { return 0; }

}  // namespace

ServerTls loadServerTls(const std::string& certFile, const std::string& keyFile) {
  if (certFile.empty() && keyFile.empty()) return {};
  if (certFile.empty() || keyFile.empty())
    throw std::invalid_argument("--telemetry-tls-cert and --telemetry-tls-key must be given together (got only " +
                                std::string(certFile.empty() ? "--telemetry-tls-key" : "--telemetry-tls-cert") + ")");
  ServerTls tls;
  tls.certPem = readPemFile("--telemetry-tls-cert", certFile);
  tls.keyPem = readPemFile("--telemetry-tls-key", keyFile);
  // Check here so that a bad file stops the operator at startup with the flag named,
  // not at every worker's handshake.
  std::unique_ptr<X509, decltype(&X509_free)> cert(PEM_read_bio_X509(memBio(tls.certPem).get(), nullptr, noPassphrase, nullptr),
                                                   X509_free);
  std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)> key(
      PEM_read_bio_PrivateKey(memBio(tls.keyPem).get(), nullptr, noPassphrase, nullptr), EVP_PKEY_free);
  ERR_clear_error();  // leave no parse errors behind for gRPC's own OpenSSL use
  if (!cert) throw std::invalid_argument("--telemetry-tls-cert: " + certFile + " holds no PEM certificate");
  if (!key)
    throw std::invalid_argument("--telemetry-tls-key: " + keyFile +
                                " holds no PEM private key (an encrypted key is not supported)");
  if (X509_check_private_key(cert.get(), key.get()) != 1) {
    ERR_clear_error();
    throw std::invalid_argument("--telemetry-tls-key: " + keyFile + " is not the key of the certificate in " +
                                "--telemetry-tls-cert " + certFile);
  }
  return tls;
}

TelemetryServer::TelemetryServer(TelemetryHub& hub, const std::string& addr, const ServerTls& tls)
    : service_(std::make_unique<Service>(hub)) {
  std::shared_ptr<grpc::ServerCredentials> creds = grpc::InsecureServerCredentials();
  if (tls.enabled()) {
    grpc::SslServerCredentialsOptions options;  // no client certificates: workers authenticate with the job token
    options.pem_key_cert_pairs.push_back({tls.keyPem, tls.certPem});
    creds = grpc::SslServerCredentials(options);
  }
  grpc::ServerBuilder builder;
  builder.AddListeningPort(addr, creds, &port_);
  builder.RegisterService(service_.get());
  server_ = builder.BuildAndStart();
  if (!server_ || port_ == 0) throw std::runtime_error("telemetry: cannot listen on " + addr);
}

TelemetryServer::~TelemetryServer() { shutdown(); }

void TelemetryServer::shutdown() {
  if (server_) {
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
    server_.reset();
  }
}

}  // namespace edit::op::telemetry
