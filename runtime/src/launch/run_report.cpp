#include "launch/run_report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>

#include "link_advice_json.h"

namespace edit {

using nlohmann::json;

namespace {

std::string human(double v) {
  char b[32];
  if (v >= 1e9) std::snprintf(b, sizeof(b), "%.2fG", v / 1e9);
  else if (v >= 1e6) std::snprintf(b, sizeof(b), "%.2fM", v / 1e6);
  else if (v >= 1e3) std::snprintf(b, sizeof(b), "%.1fk", v / 1e3);
  else std::snprintf(b, sizeof(b), "%.0f", v);
  return b;
}

// JSON has no NaN: a worker's non-finite loss arrives as null.
double num(const json& v) { return v.is_number() ? v.get<double>() : std::nan(""); }

// The outer step as the mode resolved it, and what the penalty did over the run (rank 0's
// view of its replica; the weights of every replica: smallest and largest).
void penaltyLine(const std::vector<Worker>& ws) {
  const json* first = nullptr;
  double wMin = 1, wMax = 0, cMin = 1;
  uint64_t rounds = 0, clipped = 0;
  int replicas = 0;
  for (const auto& w : ws) {
    if (w.summary.is_null() || !w.summary.contains("outer")) continue;
    if (!first) first = &w.summary;
    const json& p = w.summary["penalty"];
    if (!p.value("on", false) || p.value("unit_rounds", 0) == 0) continue;
    wMin = std::min(wMin, num(p["weight_min"]));
    wMax = std::max(wMax, num(p["weight_max"]));
    cMin = std::min(cMin, num(p["clip_factor_min"]));
    if (w.summary.value("shard", 0) == 0) {
      ++replicas;
      rounds += p.value("unit_rounds", uint64_t{0});
      clipped += p.value("units_clipped", uint64_t{0});
    }
  }
  if (!first || (*first)["outer"].is_null()) return;  // no outer optimizer (ddp, localsgd)
  const json& o = (*first)["outer"];
  std::printf("\nouter step: lr %g, momentum %g%s", num(o["lr"]), num(o["momentum"]),
              o.value("nesterov", false) ? ", Nesterov" : "");
  if (replicas > 0)
    std::printf("; penalty: replica weights %.3f-%.3f (uniform %.3f), %llu of %llu unit-rounds clipped "
                "(smallest factor %.3f)",
                wMin, wMax, 1.0 / replicas, static_cast<unsigned long long>(clipped),
                static_cast<unsigned long long>(rounds), cMin);
  std::printf("\n");
}

}  // namespace

void RunReport::progress(const std::vector<Worker>& ws) {
  // Loss averaged over replicas (shard 0 of each); tokens/s summed over all workers.
  double loss = 0, tps = 0, wait = 0, stepSec = 0;
  int nLoss = 0;
  int64_t step = -1, total = 0;
  uint64_t anomalies = 0, syncs = 0;
  std::string phase;
  for (const auto& w : ws) {
    if (!w.started || (w.exited && w.code == 0)) continue;  // not joined yet, or left at a scale
    if (w.last.is_null()) return;
    const auto& j = w.last;
    if (j["shard"] == 0) {
      loss += num(j["loss"]);
      ++nLoss;
      anomalies += j["anomalies"].get<uint64_t>();
    }
    tps += num(j["tps"]);
    wait = std::max(wait, num(j["comm_wait"]));
    stepSec = std::max(stepSec, num(j["step_seconds"]));
    const int64_t s = j["step"].get<int64_t>();
    step = step < 0 ? s : std::min(step, s);
    total = j["total"].get<int64_t>();
    syncs = std::max<uint64_t>(syncs, j["sync_rounds"].get<uint64_t>());
    if (w.rank == 0) phase = j["phase"].get<std::string>();
  }
  // Workers report at different moments; print once per step the slowest one reached.
  if (step <= lastPrinted_) return;
  lastPrinted_ = step;
  char line[256];
  std::snprintf(line, sizeof(line),
                "step %5lld/%-5lld  loss %.4f  %s tok/s  sync rounds %llu  anomalies %llu  [%s]",
                static_cast<long long>(step), static_cast<long long>(total), loss / std::max(1, nLoss),
                human(tps).c_str(), static_cast<unsigned long long>(syncs),
                static_cast<unsigned long long>(anomalies), phase.c_str());
  std::cout << line << std::endl;
}

void RunReport::summary(const std::vector<Worker>& ws, double wall) {
  std::printf("\n%-5s %-7s %-5s %7s %9s %10s %6s %9s %10s %9s\n", "rank", "replica", "shard", "steps",
              "loss", "tok/s", "syncs", "anomalies", "comm wait", "peak RSS");
  double tps = 0, trainTps = 0, startup = 0, val = -1;
  uint64_t tokens = 0;
  for (const auto& w : ws) {
    if (!w.started) continue;
    const auto& s = w.summary;
    if (s.is_null()) {
      std::printf("%-5d (no summary: exit code %d)\n", w.rank, w.code);
      continue;
    }
    const double secs = s["seconds"].get<double>();
    char loss[32] = "-";  // null: no step in this run
    if (s["loss"].is_number()) std::snprintf(loss, sizeof(loss), "%.4f", num(s["loss"]));
    std::printf("%-5d %-7d %-5d %7lld %9s %10s %6llu %9llu %9.1f%% %8sB\n", w.rank,
                s["replica"].get<int>(), s["shard"].get<int>(),
                static_cast<long long>(s["steps"].get<int64_t>()), loss,
                human(s["tps"].get<double>()).c_str(),
                static_cast<unsigned long long>(s["sync_rounds"].get<uint64_t>()),
                static_cast<unsigned long long>(s["anomalies"].get<uint64_t>()),
                100.0 * s["comm_wait"].get<double>() / std::max(1e-9, secs),
                human(s.value("peak_rss_bytes", 0.0)).c_str());
    tps += s["tps"].get<double>();
    trainTps += s.value("train_tps", 0.0);
    startup = std::max(startup, s.value("startup_seconds", 0.0));
    tokens += s["tokens"].get<uint64_t>();
    if (w.rank == 0) val = s["val_loss"].is_number() ? s["val_loss"].get<double>() : -1;
  }
  // CUDA builds: the caching allocator's peaks of the rank that used the most.
  double gpuAlloc = -1, gpuReserved = -1;
  for (const auto& w : ws) {
    if (w.summary.is_null() || !w.summary.contains("peak_gpu_allocated_bytes")) continue;
    gpuAlloc = std::max(gpuAlloc, w.summary.value("peak_gpu_allocated_bytes", 0.0));
    gpuReserved = std::max(gpuReserved, w.summary.value("peak_gpu_reserved_bytes", 0.0));
  }
  if (gpuAlloc >= 0)
    std::printf("\npeak GPU memory (largest rank): %sB allocated, %sB reserved\n", human(gpuAlloc).c_str(),
                human(gpuReserved).c_str());
  int replaced = 0, recoveries = 0;
  double recoverySecs = 0;
  int64_t rolledBack = 0;
  for (const auto& w : ws) {
    replaced += w.incarnation;
    if (w.summary.is_null() || w.summary.value("joined", false)) continue;
    recoveries = std::max(recoveries, w.summary.value("recoveries", 0));
    recoverySecs = std::max(recoverySecs, w.summary.value("recovery_seconds", 0.0));
    rolledBack = std::max<int64_t>(rolledBack, w.summary.value("steps_rolled_back", int64_t{0}));
  }
  if (replaced > 0)
    std::printf("\nrecovery: %d worker(s) replaced, %d in-place recovery(ies); survivors rolled back at most "
                "%lld step(s) and spent at most %.1f s recovering\n",
                replaced, recoveries, static_cast<long long>(rolledBack), recoverySecs);
  bool alreadyDone = !ws.empty();
  for (const auto& w : ws)
    alreadyDone = alreadyDone && (!w.started || (!w.summary.is_null() && w.summary["loss"].is_null() &&
                                                 w.summary.value("resumed_from", int64_t{-1}) >= 0));
  if (alreadyDone)
    std::printf("\nnothing to train: resumed from the final checkpoint (step %lld); remove checkpoint.dir "
                "or raise training.steps to train more\n",
                static_cast<long long>(ws[0].summary.value("resumed_from", int64_t{0})));
  penaltyLine(ws);
  std::printf("\ntotal: %s tokens in %.1f s, %s tok/s (training loop %s tok/s, start-up %.1f s)",
              human(tokens).c_str(), wall, human(tps).c_str(), human(trainTps).c_str(), startup);
  if (val >= 0) std::printf(", validation loss %.4f", val);
  std::printf("\n");
  // A slow replica link: which setting would keep the rounds under 20% of the local phase.
  std::vector<LinkMeasurement> links;
  for (const auto& w : ws)
    if (!w.summary.is_null() && w.summary.contains("link")) links.push_back(w.summary["link"].get<LinkMeasurement>());
  if (const LinkAdvice a = adviseLink(leastBlocked(links)); !a.text.empty()) std::printf("\nnote: %s\n", a.text.c_str());
  std::fflush(stdout);
}

}  // namespace edit
