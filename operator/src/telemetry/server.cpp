#include "telemetry/server.h"

#include <algorithm>
#include <cctype>
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
                               const StragglerSettings& settings, int restartGeneration, int worldSize,
                               const std::string& uid) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& j = jobs_[{ns, job}];
  if (!uid.empty() && j.uid != uid) {
    if (!j.uid.empty()) j = Job{};  // the earlier job of this name: its generation and ranks are not ours
    j.uid = uid;
  }
  j.token = token;
  j.worldSize = worldSize;
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
  // Reports the stopped gang's pods still send (one killed a moment later, or in flight)
  // must not count as the new gang's: its first steps tell where it resumed.
  std::set<std::string> stopped;
  for (const auto& [rank, r] : it->second.state.ranks())
    if (!r.last.podUid.empty()) stopped.insert(r.last.podUid);
  it->second.restartGeneration = restartGeneration;
  it->second.state.reset();
  it->second.pending.clear();
  it->second.pendingAll.clear();
  it->second.allDelivered.clear();
  it->second.leftPods = std::move(stopped);
  it->second.lowestStep = 0;
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
  s.lowestStep = it->second.lowestStep;
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

namespace {

// A value from a report, for a message: printable, and not megabytes of it.
std::string shown(const std::string& v) {
  std::string out;
  for (size_t i = 0; i < v.size() && i < 40; ++i) {
    const unsigned char c = static_cast<unsigned char>(v[i]);
    out += c >= 0x20 && c < 0x7f && c != '"' ? static_cast<char>(c) : '?';
  }
  return "\"" + out + (v.size() > 40 ? "...\" (" + std::to_string(v.size()) + " bytes)" : "\"");
}

// Kubernetes names and what edit-run uses for them (a host name): label values that need no
// escaping and cannot smuggle anything into the exposition format.
bool nameLike(const std::string& v, size_t max) {
  return v.size() <= max && std::all_of(v.begin(), v.end(), [](char c) {
           return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.' || c == '_';
         });
}

}  // namespace

// A report that passed the token check still comes from outside: its values become
// status fields and metric labels, so keep them in sane ranges. worldSize 0: unknown.
static std::string invalidReport(const pb::WorkerReport& r, int worldSize) {
  constexpr int64_t kMaxSteps = int64_t{1} << 48;
  const int maxRanks = worldSize > 0 ? worldSize : 65536;
  if (r.rank() < 0 || r.rank() >= maxRanks)
    return "rank " + std::to_string(r.rank()) + " is not in [0, " + std::to_string(maxRanks) + ")" +
           (worldSize > 0 ? " (the job's world size)" : "");
  if (r.replica() < 0 || r.shard() < 0 || r.replica() >= maxRanks || r.shard() >= maxRanks)
    return "rank/replica/shard out of range";
  if (r.replicas() < 0 || r.replicas() > 4096) return "replicas out of range";
  if (r.step() < 0 || r.step() > kMaxSteps || r.total_steps() < 0 || r.total_steps() > kMaxSteps)
    return "step/total_steps out of range";
  if (r.local_phase().steps() < 0 || r.local_phase().steps() > kMaxSteps || r.local_phase().rounds() > uint64_t(kMaxSteps))
    return "local_phase steps/rounds out of range";
  if (r.pod().size() > 253 || r.node().size() > 253 || r.phase().size() > 32 || r.pod_uid().size() > 128)
    return "pod/pod_uid/node/phase too long";
  if (!nameLike(r.pod(), 253) || !nameLike(r.node(), 253) || !nameLike(r.pod_uid(), 128) || !nameLike(r.phase(), 32))
    return "pod/pod_uid/node/phase may hold only letters, digits, '-', '.' and '_'";
  for (double v : {r.step_seconds(), r.compute_seconds(), r.comm_wait_seconds(), r.sync_seconds(), r.unix_time(),
                   r.local_phase().compute_seconds(), r.local_phase().blocked_seconds()})
    if (!std::isfinite(v) || v < 0) return "timings must be finite and >= 0";
  if (!std::isfinite(r.loss())) return "loss is not finite (the worker's training diverged?)";
  if (!std::isfinite(r.pseudo_grad_norm())) return "pseudo_grad_norm is not finite";
  if (r.comm_size() > 64) return "too many comm counters";
  for (const auto& c : r.comm()) {
    if (!knownCommOp(c.op())) return "comm op " + shown(c.op()) + " is not one of " + knownCommOps();
    if (!knownCommGroup(c.group())) return "comm group " + shown(c.group()) + " is not one of " + knownCommGroups();
    if (!std::isfinite(c.wait_seconds()) || c.wait_seconds() < 0) return "bad comm counter";
  }
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
    if (std::string why = invalidReport(r, job.worldSize); !why.empty())
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
    if (!rep.heartbeat && rep.step > 0 && (job.lowestStep == 0 || rep.step < job.lowestStep)) job.lowestStep = rep.step;
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

namespace {

// One worker's stream, served by callbacks on gRPC's own threads: no thread waits on a
// stream, so 4096 workers need no more threads than 8. The stream belongs to the first
// rank it reports for (namespace, job, rank and token); every report's token is checked
// again by the hub.
class StreamReactor final : public grpc::ServerBidiReactor<pb::WorkerReport, pb::Command> {
 public:
  StreamReactor(TelemetryHub& hub, std::atomic<int>& open) : hub_(hub), open_(open) { StartRead(&report_); }

  void OnReadDone(bool ok) override {
    if (!ok) {  // the worker closed its side, or the stream broke
      Finish(grpc::Status::OK);
      return;
    }
    grpc::Status st = checkBinding();
    commands_.clear();
    if (st.ok()) st = hub_.accept(report_, &commands_);
    if (!st.ok()) {
      // Never log the token; name the job and rank only.
      log::warn("telemetry rejected", {{"namespace", report_.namespace_().substr(0, 63)},
                                       {"job", report_.job().substr(0, 253)},
                                       {"rank", report_.rank()},
                                       {"reason", st.error_message()}});
      Finish(st);
      return;
    }
    if (!bound_) {
      bound_ = true;
      ns_ = report_.namespace_();
      job_ = report_.job();
      token_ = report_.token();
      rank_ = report_.rank();
    }
    next_ = 0;
    writeNext();
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status::OK);
      return;
    }
    writeNext();
  }

  void OnDone() override {
    open_.fetch_sub(1);
    delete this;
  }

 private:
  grpc::Status checkBinding() const {
    if (!bound_) return grpc::Status::OK;
    if (report_.namespace_() != ns_ || report_.job() != job_ || report_.rank() != rank_ ||
        !constantTimeEquals(report_.token(), token_))
      return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                          "this stream reports for rank " + std::to_string(rank_) + " of " + ns_ + "/" + job_ +
                              ": a worker opens a stream of its own");
    return grpc::Status::OK;
  }

  void writeNext() {
    if (next_ < commands_.size())
      StartWrite(&commands_[next_++]);
    else
      StartRead(&report_);
  }

  TelemetryHub& hub_;
  std::atomic<int>& open_;
  pb::WorkerReport report_;
  std::vector<pb::Command> commands_;
  size_t next_ = 0;
  bool bound_ = false;
  std::string ns_, job_, token_;
  int rank_ = -1;
};

// Answers a stream with a status at once (over the stream cap).
class RefusedStream final : public grpc::ServerBidiReactor<pb::WorkerReport, pb::Command> {
 public:
  explicit RefusedStream(const grpc::Status& st) { Finish(st); }
  void OnDone() override { delete this; }
};

}  // namespace

class TelemetryServer::Service final : public pb::Telemetry::CallbackService {
 public:
  Service(TelemetryHub& hub, int maxStreams) : hub_(hub), maxStreams_(maxStreams) {}

  grpc::ServerBidiReactor<pb::WorkerReport, pb::Command>* Stream(grpc::CallbackServerContext*) override {
    if (open_.fetch_add(1) >= maxStreams_) {
      open_.fetch_sub(1);
      if (!warned_.exchange(true))
        log::warn("telemetry stream refused", {{"reason", "at the stream limit"}, {"maxStreams", maxStreams_}});
      return new RefusedStream(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                                            "the operator serves at most " + std::to_string(maxStreams_) +
                                                " telemetry streams; retry later"));
    }
    return new StreamReactor(hub_, open_);
  }

  int open() const { return open_.load(); }

 private:
  TelemetryHub& hub_;
  const int maxStreams_;
  std::atomic<int> open_{0};
  std::atomic<bool> warned_{false};
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

TelemetryServer::TelemetryServer(TelemetryHub& hub, const std::string& addr, const ServerTls& tls,
                                 const ServerLimits& limits)
    : service_(std::make_unique<Service>(hub, limits.maxStreams)) {
  std::shared_ptr<grpc::ServerCredentials> creds = grpc::InsecureServerCredentials();
  if (tls.enabled()) {
    grpc::SslServerCredentialsOptions options;  // no client certificates: workers authenticate with the job token
    options.pem_key_cert_pairs.push_back({tls.keyPem, tls.certPem});
    creds = grpc::SslServerCredentials(options);
  }
  grpc::ServerBuilder builder;
  builder.AddListeningPort(addr, creds, &port_);
  builder.SetMaxReceiveMessageSize(limits.maxReportBytes);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, limits.maxStreamsPerConnection);
  // Keepalive as gRPC's and etcd's servers do it: ping a silent connection, drop it when
  // the ping goes unanswered, and refuse clients that ping too often.
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, static_cast<int>(limits.keepaliveTime.count()));
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, static_cast<int>(limits.keepaliveTimeout.count()));
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
                             static_cast<int>(limits.minClientPingInterval.count()));
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 0);
  builder.AddChannelArgument(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS, static_cast<int>(limits.handshakeTimeout.count()));
  builder.RegisterService(service_.get());
  server_ = builder.BuildAndStart();
  if (!server_ || port_ == 0) throw std::runtime_error("telemetry: cannot listen on " + addr);
}

TelemetryServer::~TelemetryServer() { shutdown(); }

int TelemetryServer::streams() const { return service_->open(); }

void TelemetryServer::shutdown() {
  if (server_) {
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
    server_.reset();
  }
}

}  // namespace edit::op::telemetry
