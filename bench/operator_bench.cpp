// The operator's hot paths against the size of a job (operator/README.md, "Cost per report"):
//
//   telemetry  TelemetryHub::accept, what every worker report costs the operator (the
//              per-job state, the straggler scores, the Prometheus series), with W workers
//              reporting in turn; and one scrape of /metrics at that size;
//   reconcile  one reconcile's work that grows with W: the hub's snapshot, and
//              planReconcile (the pure planner) on W running pods with W ranks reporting.
//
// Workers report every step by default (telemetry.everySteps 1), so a job of W workers at
// s steps per second sends W x s reports per second: reports_per_second / W is the step
// rate per worker the operator keeps up with. One JSON line per (kind, workers).
//
//   streams    what W open worker streams cost the telemetry server (threads, RSS): the
//              server in a child process (what edit-operator runs, or with --server sync the
//              synchronous server it replaced: one thread per stream), W streams from
//              this process, each on its own connection, each sending a few reports.
//
//   edit-operator-bench [--workers 16,256,1024,4096] [--min-seconds 0.5]
//   edit-operator-bench --streams 4096 [--server callback|sync] [--reports 3]
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <fstream>
#include <memory>
#include <mutex>
#include <thread>
#include <grpcpp/grpcpp.h>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "controller/plan.h"
#include "metrics/metrics.h"
#include "telemetry/server.h"
#include "util/log.h"

namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;
namespace pb = edit::v1alpha1;
namespace ctl = edit::op::controller;
namespace tel = edit::op::telemetry;

constexpr int kShards = 8;  // workers per replica in the synthetic job

double seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

pb::WorkerReport report(int rank, int64_t step) {
  pb::WorkerReport r;
  r.set_namespace_("bench");
  r.set_job("j");
  r.set_token("t");
  r.set_rank(rank);
  r.set_replica(rank / kShards);
  r.set_shard(rank % kShards);
  r.set_pod("j-worker-" + std::to_string(rank));
  r.set_pod_uid("uid-" + std::to_string(rank));
  r.set_node("node-" + std::to_string(rank / 8));
  r.set_step(step);
  r.set_total_steps(1000000);
  r.set_loss(2.5);
  r.set_tokens(static_cast<uint64_t>(step) * 4096);
  r.set_step_seconds(1.0 + 0.001 * (rank % 7));
  r.set_replicas(0);
  // The counters a worker sends: the shard group's gathers and reductions, the sync group's
  // rounds, the world's control exchange.
  const char* ops[][2] = {{"allgather", "shard"}, {"reduce_scatter", "shard"}, {"allreduce", "sync"}, {"allgather", "world"}};
  for (auto& o : ops) {
    auto* c = r.add_comm();
    c->set_op(o[0]);
    c->set_group(o[1]);
    c->set_bytes(static_cast<uint64_t>(step) * 1000000);
    c->set_wait_seconds(0.01 * static_cast<double>(step));
  }
  return r;
}

// µs per accepted report, with every rank of a W-worker job reporting in turn.
json benchTelemetry(int W, double minSeconds) {
  edit::op::metrics::Metrics metrics;
  tel::TelemetryHub hub(&metrics);
  hub.registerJob("bench", "j", "t", tel::StragglerSettings{}, 0, W);
  std::vector<pb::WorkerReport> reports;
  for (int r = 0; r < W; ++r) reports.push_back(report(r, 1));
  std::vector<pb::Command> commands;
  int64_t step = 1;
  auto round = [&] {  // one report per rank, as after one step of the job
    ++step;
    for (auto& r : reports) {
      r.set_step(step);
      r.set_tokens(static_cast<uint64_t>(step) * 4096);
      commands.clear();
      if (!hub.accept(r, &commands).ok()) {
        std::cerr << "report refused\n";
        std::exit(1);
      }
    }
  };
  for (int i = 0; i < 6; ++i) round();  // every rank scored (minReports 5), series created
  int64_t n = 0;
  const auto t0 = Clock::now();
  double took = 0;
  while (took < minSeconds) {
    round();
    n += W;
    took = seconds(t0, Clock::now());
  }
  const double per = took / static_cast<double>(n);
  // What /metrics costs at this size (the series of W workers, and whatever the scrape
  // computes first).
  int scrapes = 0;
  size_t bytes = 0;
  const auto s0 = Clock::now();
  while (scrapes < 3 || seconds(s0, Clock::now()) < minSeconds / 4) {
    bytes = metrics.scrape().size();
    ++scrapes;
  }
  const double perScrape = seconds(s0, Clock::now()) / scrapes;
  return {{"kind", "telemetry"}, {"workers", W}, {"reports", n}, {"us_per_report", per * 1e6},
          {"reports_per_second", 1 / per}, {"steps_per_second_per_worker", 1 / per / W},
          {"ms_per_scrape", perScrape * 1e3}, {"scrape_bytes", bytes}};
}

// µs per reconcile's W-dependent work: the hub's snapshot and the planner on W running pods.
json benchReconcile(int W, double minSeconds) {
  edit::op::metrics::Metrics metrics;
  tel::TelemetryHub hub(&metrics);
  hub.registerJob("bench", "j", "t", tel::StragglerSettings{}, 0, W);
  std::vector<pb::Command> commands;
  for (int64_t step = 1; step <= 6; ++step)
    for (int r = 0; r < W; ++r) {
      commands.clear();
      hub.accept(report(r, step), &commands);
    }
  json obj = {{"metadata", {{"name", "j"}, {"namespace", "bench"}, {"uid", "u"}, {"generation", 1}}},
              {"spec", {{"image", "i"}, {"replicas", W / kShards}, {"shardsPerReplica", kShards}}}};
  ctl::PlanInput in;
  in.meta = edit::op::api::parseMeta(obj);
  in.spec = edit::op::api::parseSpec(obj);
  in.status = {{"phase", "Running"}, {"restarts", 0}, {"restartGeneration", 0}, {"startTime", "2026-12-07T08:00:00Z"}};
  in.now = 1800000000;
  for (int r = 0; r < W; ++r) {
    ctl::ObservedPod p;
    p.name = "j-worker-" + std::to_string(r);
    p.uid = "uid-" + std::to_string(r);
    p.rank = r;
    p.phase = "Running";
    p.node = "node-" + std::to_string(r / 8);
    p.started = "2026-12-07T08:00:05Z";
    in.pods.push_back(p);
  }
  int64_t n = 0;
  double snapSeconds = 0, planSeconds = 0;
  const auto t0 = Clock::now();
  while (seconds(t0, Clock::now()) < minSeconds) {
    const auto a = Clock::now();
    auto snap = hub.snapshot("bench", "j");
    const auto b = Clock::now();
    in.telemetry = {};
    in.telemetry.present = true;
    for (const auto& [rank, r] : snap->ranks) in.telemetry.ranks[rank] = {r.podUid, static_cast<long>(r.step), 0.5, r.local};
    ctl::Plan plan = ctl::planReconcile(in);
    const auto c = Clock::now();
    if (!plan.ranksToCreate.empty() || !plan.podsToDelete.empty()) {
      std::cerr << "the synthetic running job should need no action\n";
      std::exit(1);
    }
    snapSeconds += seconds(a, b);
    planSeconds += seconds(b, c);
    ++n;
  }
  return {{"kind", "reconcile"}, {"workers", W}, {"reconciles", n}, {"us_snapshot", snapSeconds / n * 1e6},
          {"us_plan", planSeconds / n * 1e6}};
}

// ---- streams: the telemetry server under W open worker streams ---------------------------

// The server edit-operator ran before its callback server: gRPC's synchronous API, where
// each open stream holds one of the server's threads for as long as it is open.
class SyncService final : public pb::Telemetry::Service {
 public:
  explicit SyncService(tel::TelemetryHub& hub) : hub_(hub) {}
  grpc::Status Stream(grpc::ServerContext*, grpc::ServerReaderWriter<pb::Command, pb::WorkerReport>* stream) override {
    pb::WorkerReport report;
    while (stream->Read(&report)) {
      std::vector<pb::Command> commands;
      grpc::Status st = hub_.accept(report, &commands);
      if (!st.ok()) return st;
      for (const auto& c : commands)
        if (!stream->Write(c)) return grpc::Status::OK;
    }
    return grpc::Status::OK;
  }

 private:
  tel::TelemetryHub& hub_;
};

// Threads and memory of a process, from /proc.
json procStatus(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  json out;
  while (std::getline(in, line)) {
    auto field = [&](const char* name, const char* key, double scale) {
      if (line.rfind(name, 0) == 0) out[key] = std::atof(line.c_str() + std::strlen(name)) * scale;
    };
    field("Threads:", "threads", 1);
    field("VmRSS:", "rss_mb", 1.0 / 1024);
    field("VmHWM:", "hwm_mb", 1.0 / 1024);
  }
  return out;
}

// The child: serves until its control pipe closes; each byte asks how many ranks reported.
[[noreturn]] void serveStreams(const std::string& kind, int W, int control, int answers) {
  edit::op::metrics::Metrics metrics;
  tel::TelemetryHub hub(&metrics);
  hub.registerJob("bench", "j", "t", tel::StragglerSettings{}, 0, W);
  std::unique_ptr<tel::TelemetryServer> callback;
  std::unique_ptr<SyncService> sync;
  std::unique_ptr<grpc::Server> syncServer;
  int port = 0;
  if (kind == "sync") {
    sync = std::make_unique<SyncService>(hub);
    grpc::ServerBuilder b;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    b.RegisterService(sync.get());
    syncServer = b.BuildAndStart();
  } else {
    tel::ServerLimits limits;
    limits.maxStreams = W + 16;
    callback = std::make_unique<tel::TelemetryServer>(hub, "127.0.0.1:0", tel::ServerTls{}, limits);
    port = callback->port();
  }
  (void)!::write(answers, &port, sizeof(port));
  char c;
  while (::read(control, &c, 1) == 1) {
    auto snap = hub.snapshot("bench", "j");
    const int ranks = snap ? snap->progress.ranksReporting : 0;
    (void)!::write(answers, &ranks, sizeof(ranks));
  }
  ::_exit(0);  // the parent measured what it wanted; no teardown of W streams
}

class BenchStream : public grpc::ClientBidiReactor<pb::WorkerReport, pb::Command> {
 public:
  BenchStream(pb::Telemetry::Stub* stub, int rank, int reports) : rank_(rank), left_(reports) {
    stub->async()->Stream(&ctx_, this);
    StartRead(&cmd_);
    next();
    StartCall();
  }
  void OnWriteDone(bool ok) override {
    if (!ok) return done(false);
    next();
  }
  void OnReadDone(bool ok) override {
    if (ok) StartRead(&cmd_);
  }
  void OnDone(const grpc::Status& s) override {
    std::lock_guard<std::mutex> l(mu_);
    status_ = s;
    finished_ = true;
    if (!wrote_) written_ = false, wrote_ = true;
    cv_.notify_all();
  }
  // True once every report was written.
  bool waitWritten() {
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait_for(l, std::chrono::seconds(120), [&] { return wrote_; });
    return written_;
  }
  void close() {
    ctx_.TryCancel();
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait_for(l, std::chrono::seconds(60), [&] { return finished_; });
  }
  std::string error() {
    std::lock_guard<std::mutex> l(mu_);
    return status_.error_message();
  }

 private:
  void next() {
    if (left_ == 0) return done(true);
    report_ = report(rank_, ++step_);
    --left_;
    StartWrite(&report_);
  }
  void done(bool ok) {
    std::lock_guard<std::mutex> l(mu_);
    if (!wrote_) written_ = ok, wrote_ = true;
    cv_.notify_all();
  }
  grpc::ClientContext ctx_;
  pb::WorkerReport report_;
  pb::Command cmd_;
  int rank_, left_;
  int64_t step_ = 0;
  std::mutex mu_;
  std::condition_variable cv_;
  bool wrote_ = false, written_ = false, finished_ = false;
  grpc::Status status_;
};

json benchStreams(int W, const std::string& kind, int reports) {
  // Two descriptors per stream (a connection each side), and gRPC's own.
  rlimit lim{};
  ::getrlimit(RLIMIT_NOFILE, &lim);
  lim.rlim_cur = lim.rlim_max;
  ::setrlimit(RLIMIT_NOFILE, &lim);
  if (lim.rlim_cur < static_cast<rlim_t>(2 * W + 256)) {
    std::cerr << "--streams " << W << " needs " << 2 * W + 256 << " open files; RLIMIT_NOFILE allows " << lim.rlim_cur
              << " (ulimit -n)\n";
    std::exit(2);
  }
  int control[2], answers[2];
  if (::pipe(control) != 0 || ::pipe(answers) != 0) std::exit(1);
  const pid_t child = ::fork();  // before this process touches gRPC
  if (child == 0) {
    ::close(control[1]);
    ::close(answers[0]);
    serveStreams(kind, W, control[0], answers[1]);
  }
  ::close(control[0]);
  ::close(answers[1]);
  int port = 0;
  if (::read(answers[0], &port, sizeof(port)) != sizeof(port) || port == 0) {
    std::cerr << "the server did not start\n";
    std::exit(1);
  }
  auto ranksReporting = [&] {
    const char c = 'm';
    int ranks = -1;
    if (::write(control[1], &c, 1) != 1 || ::read(answers[0], &ranks, sizeof(ranks)) != sizeof(ranks)) return -1;
    return ranks;
  };
  ranksReporting();
  const json idle = procStatus(child);
  const auto t0 = Clock::now();
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  std::vector<std::unique_ptr<pb::Telemetry::Stub>> stubs;
  std::vector<std::unique_ptr<BenchStream>> streams;
  for (int r = 0; r < W; ++r) {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // a connection per worker, as in a job
    channels.push_back(grpc::CreateCustomChannel("127.0.0.1:" + std::to_string(port),
                                                 grpc::InsecureChannelCredentials(), args));
    stubs.push_back(pb::Telemetry::NewStub(channels.back()));
    streams.push_back(std::make_unique<BenchStream>(stubs.back().get(), r, reports));
  }
  int failed = 0;
  std::string firstError;
  for (auto& s : streams)
    if (!s->waitWritten()) {
      if (failed++ == 0) firstError = s->error();
    }
  int ranks = 0;
  for (int i = 0; i < 600 && (ranks = ranksReporting()) < W - failed; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const double openSeconds = seconds(t0, Clock::now());
  std::this_thread::sleep_for(std::chrono::seconds(2));  // settle
  const json loaded = procStatus(child);
  for (auto& s : streams) s->close();
  std::this_thread::sleep_for(std::chrono::seconds(2));
  const json closed = procStatus(child);
  ::close(control[1]);
  ::waitpid(child, nullptr, 0);
  json out = {{"kind", "streams"},
              {"server", kind},
              {"streams", W},
              {"reports_per_stream", reports},
              {"ranks_reporting", ranks},
              {"failed_streams", failed},
              {"seconds_to_open_and_report", openSeconds},
              {"threads_idle", idle.value("threads", 0.0)},
              {"threads", loaded.value("threads", 0.0)},
              {"threads_after_close", closed.value("threads", 0.0)},
              {"rss_mb_idle", idle.value("rss_mb", 0.0)},
              {"rss_mb", loaded.value("rss_mb", 0.0)},
              {"rss_mb_after_close", closed.value("rss_mb", 0.0)},
              {"hwm_mb", closed.value("hwm_mb", 0.0)}};
  if (failed) out["first_error"] = firstError;
  return out;
}

std::vector<int> parseList(const std::string& s) {
  std::vector<int> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) {
    const int w = std::atoi(item.c_str());
    if (w < kShards || w % kShards != 0 || w > 65536) {
      std::cerr << "--workers: " << item << " is not a multiple of " << kShards << " in [8, 65536]\n";
      std::exit(2);
    }
    out.push_back(w);
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> workers = {16, 256, 1024, 4096};
  double minSeconds = 0.5;
  int streams = 0, reports = 3;
  std::string server = "callback";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--workers" && i + 1 < argc) {
      workers = parseList(argv[++i]);
    } else if (a == "--min-seconds" && i + 1 < argc) {
      minSeconds = std::atof(argv[++i]);
    } else if (a == "--streams" && i + 1 < argc) {
      streams = std::atoi(argv[++i]);
    } else if (a == "--reports" && i + 1 < argc) {
      reports = std::atoi(argv[++i]);
    } else if (a == "--server" && i + 1 < argc) {
      server = argv[++i];
    } else {
      std::cerr << "usage: edit-operator-bench [--workers 16,256,1024,4096] [--min-seconds 0.5]\n"
                   "       edit-operator-bench --streams 4096 [--server callback|sync] [--reports 3]\n";
      return 2;
    }
  }
  edit::op::log::setLevel(edit::op::log::Level::Error);
  if (streams > 0) {
    if ((server != "callback" && server != "sync") || streams > 65536 || reports < 1) {
      std::cerr << "--server is callback or sync, --streams at most 65536, --reports at least 1\n";
      return 2;
    }
    std::cout << benchStreams(streams, server, reports).dump() << std::endl;
    return 0;
  }
  for (int W : workers) {
    std::cout << benchTelemetry(W, minSeconds).dump() << std::endl;
    std::cout << benchReconcile(W, minSeconds).dump() << std::endl;
  }
  return 0;
}
