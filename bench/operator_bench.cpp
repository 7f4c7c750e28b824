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
//   edit-operator-bench [--workers 16,256,1024,4096] [--min-seconds 0.5]
#include <chrono>
#include <cstdio>
#include <cstdlib>
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
  const char* ops[][2] = {{"allgather", "shard"}, {"reducescatter", "shard"}, {"sync", "sync"}, {"allgather", "world"}};
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
  hub.registerJob("bench", "j", "t", tel::StragglerSettings{}, 0);
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
  hub.registerJob("bench", "j", "t", tel::StragglerSettings{}, 0);
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
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--workers" && i + 1 < argc) {
      workers = parseList(argv[++i]);
    } else if (a == "--min-seconds" && i + 1 < argc) {
      minSeconds = std::atof(argv[++i]);
    } else {
      std::cerr << "usage: edit-operator-bench [--workers 16,256,1024,4096] [--min-seconds 0.5]\n";
      return 2;
    }
  }
  edit::op::log::setLevel(edit::op::log::Level::Error);
  for (int W : workers) {
    std::cout << benchTelemetry(W, minSeconds).dump() << std::endl;
    std::cout << benchReconcile(W, minSeconds).dump() << std::endl;
  }
  return 0;
}
