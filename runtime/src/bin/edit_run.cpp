// edit-run: the local launcher (like torchrun). Starts N edit-train workers on this
// machine over loopback, streams one progress line, replaces a worker that dies (the
// others recover in place, docs/replica-recovery.md) or stops everyone when that cannot
// help, forwards Ctrl-C/SIGTERM (workers checkpoint, then exit), and ends with a summary.
//
//   edit-run --nproc 4 [--shards 2] --config examples/local/tiny.yaml [--set k=v]...
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "train/link_advice_json.h"

#include "bin/blas_env.h"
#include "exit_codes.h"
#include "scale_points.h"

using nlohmann::json;
using edit::LinkAdvice;
using edit::LinkMeasurement;
using edit::adviseLink;
using edit::leastBlocked;

namespace {

volatile sig_atomic_t gSignal = 0;
void onSignal(int s) { gSignal = s; }
// SIGUSR1 / SIGUSR2 to edit-run: one replica more / fewer, forwarded to rank 0.
std::atomic<int> gScaleUp{0}, gScaleDown{0};  // lock-free: safe in a signal handler
void onScaleSignal(int s) { (s == SIGUSR1 ? gScaleUp : gScaleDown).fetch_add(1); }

struct Options {
  int nproc = 4, shards = 1, masterPort = 0, metricsPort = -1, maxRecoveries = 3;
  std::string config, logDir;
  std::vector<std::string> sets;
  bool quiet = false;
  std::string scaleAtText;                // EDIT_SCALE_AT for every worker
  std::vector<edit::ScalePoint> scaleAt;  // --scale-at, parsed
};

[[noreturn]] void usage(int code) {
  std::cerr <<
      "usage: edit-run [--nproc N] [--shards S] [--config FILE] [--set key=value]...\n"
      "                [--master-port P] [--metrics-port P] [--log-dir DIR]\n"
      "                [--max-recoveries K] [--scale-at STEP:M]... [--quiet]\n"
      "  Starts N workers (N = replicas x shards) of edit-train on this machine.\n"
      "  --nproc N         workers (default 4)\n"
      "  --shards S        shards per replica (ZeRO-3 group size); replicas = N / S\n"
      "  --config FILE     run configuration (YAML); default: built-in defaults\n"
      "  --set k=v         override a configuration key, e.g. --set algorithm.mode=ddp\n"
      "  --master-port P   rendezvous port (default: a free port)\n"
      "  --metrics-port P  serve worker r's /metrics on port P+r (default: off)\n"
      "  --log-dir DIR     also write each worker's full output to DIR/rank-R.log\n"
      "  --max-recoveries K  replace a dead worker at most K times; the\n"
      "                    others recover in place (default 3; 0: stop everyone)\n"
      "  --scale-at STEP:M change to M replicas at the first sync round at or after\n"
      "                    STEP (repeatable; local modes): new replicas join from\n"
      "                    their peers, leaving ones exit; no checkpoint is read\n"
      "  --quiet           no progress lines, only the summary\n"
      "  kill -USR1 / -USR2 <edit-run's pid>: one replica more / fewer at the next\n"
      "                    sync round (local modes), like --scale-at\n";
  std::exit(code);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::cerr << "edit-run: " << a << " needs a value\n";
        usage(2);
      }
      return argv[++i];
    };
    auto num = [&](const std::string& v) {
      try {
        size_t p = 0;
        int n = std::stoi(v, &p);
        if (p == v.size()) return n;
      } catch (...) {
      }
      std::cerr << "edit-run: " << a << " must be an integer (got \"" << v << "\")\n";
      usage(2);
    };
    if (a == "--nproc") o.nproc = num(next());
    else if (a == "--shards") o.shards = num(next());
    else if (a == "--config") o.config = next();
    else if (a == "--set") o.sets.push_back(next());
    else if (a == "--master-port") o.masterPort = num(next());
    else if (a == "--metrics-port") o.metricsPort = num(next());
    else if (a == "--log-dir") o.logDir = next();
    else if (a == "--max-recoveries") o.maxRecoveries = num(next());
    else if (a == "--scale-at") o.scaleAtText += (o.scaleAtText.empty() ? "" : ",") + next();
    else if (a == "--quiet") o.quiet = true;
    else if (a == "-h" || a == "--help") usage(0);
    else {
      std::cerr << "edit-run: unknown argument \"" << a << "\"\n";
      usage(2);
    }
  }
  if (o.nproc < 1 || o.shards < 1 || o.nproc % o.shards != 0) {
    std::cerr << "edit-run: --nproc must be a positive multiple of --shards (got " << o.nproc
              << " and " << o.shards << ")\n";
    std::exit(2);
  }
  try {
    o.scaleAt = edit::parseScalePoints(o.scaleAtText, "--scale-at");
  } catch (const std::exception& e) {
    std::cerr << "edit-run: " << e.what() << "\n";
    std::exit(2);
  }
  return o;
}

int freePort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof(a);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    ::close(fd);
    return 29500;
  }
  const int port = ntohs(a.sin_port);
  ::close(fd);
  return port;
}

std::string workerBinary() {
  char buf[4096];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n > 0) {
    buf[n] = 0;
    std::string dir(buf);
    dir = dir.substr(0, dir.rfind('/'));
    if (::access((dir + "/edit-train").c_str(), X_OK) == 0) return dir + "/edit-train";
  }
  return "edit-train";  // from PATH
}

struct Worker {
  int rank = 0;
  int incarnation = 0;  // 0: started with the job; k: k-th replacement
  pid_t pid = -1;
  int out = -1, err = -1;
  std::string outBuf, errBuf;
  bool started = false;  // a slot of a replica that joins at a scale-up starts unused
  bool joining = false;  // started for a scale-up and not joined yet
  bool excused = false;  // its exit code is not the job's: a failed scale-up, a replica that left
  bool exited = true;
  int code = 0;
  json last, summary;
  std::ofstream log;
};

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

void progressLine(const std::vector<Worker>& ws) {
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
  static int64_t lastPrinted = -1;
  if (step <= lastPrinted) return;
  lastPrinted = step;
  char line[256];
  std::snprintf(line, sizeof(line),
                "step %5lld/%-5lld  loss %.4f  %s tok/s  sync rounds %llu  anomalies %llu  [%s]",
                static_cast<long long>(step), static_cast<long long>(total), loss / std::max(1, nLoss),
                human(tps).c_str(), static_cast<unsigned long long>(syncs),
                static_cast<unsigned long long>(anomalies), phase.c_str());
  std::cout << line << std::endl;
}

void summary(const std::vector<Worker>& ws, double wall) {
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

// Rank 0's "scaling from M to M2 replicas" (Membership::scale): the ranks of a new replica
// start now, while the others wait for them in the next rendezvous generation.
std::vector<int> gScaleTargets;

void handleLine(Worker& w, const std::string& line, bool isErr, std::vector<Worker>& ws,
                bool quiet) {
  if (w.log.is_open()) w.log << line << std::endl;  // flushed: tail -f and the tests read it live
  if (isErr) {
    std::cerr << line << "\n";
    if (w.joining && line.find("as a new replica") != std::string::npos) w.joining = false;
    int from = 0, to = 0;
    const size_t at = line.find("scaling from ");
    if (w.rank == 0 && at != std::string::npos &&
        std::sscanf(line.c_str() + at, "scaling from %d to %d replicas", &from, &to) == 2)
      gScaleTargets.push_back(to);
    return;
  }
  if (line.rfind("@edit-summary ", 0) == 0) {
    w.summary = json::parse(line.substr(14), nullptr, false);
  } else if (line.rfind("@edit ", 0) == 0) {
    w.last = json::parse(line.substr(6), nullptr, false);
    if (!quiet) progressLine(ws);
  } else {
    std::cout << "[rank " << w.rank << "] " << line << "\n";
  }
}

void drain(Worker& w, int fd, std::string& buf, bool isErr, std::vector<Worker>& ws, bool quiet,
           bool& open) {
  char tmp[65536];
  ssize_t n = ::read(fd, tmp, sizeof(tmp));
  if (n <= 0) {
    open = false;
    if (!buf.empty()) handleLine(w, buf, isErr, ws, quiet);
    buf.clear();
    return;
  }
  buf.append(tmp, static_cast<size_t>(n));
  size_t pos;
  while ((pos = buf.find('\n')) != std::string::npos) {
    handleLine(w, buf.substr(0, pos), isErr, ws, quiet);
    buf.erase(0, pos + 1);
  }
}

// Starts worker w.rank in a world of `replicas` replicas: with the job (join "0"), as a
// replacement ("1") or as a rank of a new replica at a scale-up ("scale").
bool spawn(Worker& w, const Options& o, const std::string& bin, int port, const std::string& coreType,
           const char* join, int replicas, int localWorld) {
  const int r = w.rank;
  int out[2], err[2];
  if (::pipe(out) != 0 || ::pipe(err) != 0) {
    std::perror("edit-run: pipe");
    return false;
  }
  const pid_t launcher = ::getpid();
  pid_t pid = ::fork();
  if (pid == 0) {
    // edit-run killed, even with SIGKILL: the workers get SIGTERM (checkpoint and exit)
    // instead of training on as orphans (the signal follows the forking thread: edit-run
    // spawns from its only thread). Checked again in case it died before the prctl.
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != launcher) ::_exit(1);
    ::dup2(out[1], 1);
    ::dup2(err[1], 2);
    ::close(out[0]);
    ::close(err[0]);
    ::setpgid(0, 0);  // Ctrl-C reaches edit-run only; it forwards SIGTERM
    auto set = [](const char* k, const std::string& v) { ::setenv(k, v.c_str(), 1); };
    set("RANK", std::to_string(r));
    set("WORLD_SIZE", std::to_string(replicas * o.shards));
    set("EDIT_REPLICAS", std::to_string(replicas));
    set("EDIT_SHARDS", std::to_string(o.shards));
    set("MASTER_ADDR", "127.0.0.1");
    set("MASTER_PORT", std::to_string(port));
    set("EDIT_BIND_ADDR", "127.0.0.1");
    set("EDIT_LOCAL_WORLD_SIZE", std::to_string(localWorld));
    set("LOCAL_RANK", std::to_string(r));  // GPU builds: worker r uses GPU r % count
    set("EDIT_JOIN", join);
    if (!o.scaleAtText.empty()) set("EDIT_SCALE_AT", o.scaleAtText);
    if (!coreType.empty()) set("OPENBLAS_CORETYPE", coreType);
    if (!edit::ompWaitPolicy().empty()) set("OMP_WAIT_POLICY", edit::ompWaitPolicy());
    if (o.metricsPort >= 0) set("EDIT_METRICS_PORT", std::to_string(o.metricsPort + r));
    std::vector<std::string> args{bin};
    if (!o.config.empty()) args.insert(args.end(), {"--config", o.config});
    for (const auto& s : o.sets) args.insert(args.end(), {"--set", s});
    std::vector<char*> cargs;
    for (auto& a : args) cargs.push_back(a.data());
    cargs.push_back(nullptr);
    ::execvp(cargs[0], cargs.data());
    std::perror("edit-run: exec edit-train");
    ::_exit(127);
  }
  ::close(out[1]);
  ::close(err[1]);
  w.pid = pid;
  w.out = out[0];
  w.err = err[0];
  w.started = true;
  w.exited = false;
  w.excused = false;
  w.code = 0;
  w.last = json();
  w.summary = json();
  return true;
}

}  // namespace

// 32 random bytes, hex.
static std::string storeSecret() {
  unsigned char raw[32];
  size_t got = 0;
  while (got < sizeof(raw)) {
    const ssize_t n = ::getrandom(raw + got, sizeof(raw) - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      std::perror("edit-run: getrandom");
      std::exit(1);
    }
    got += static_cast<size_t>(n);
  }
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : raw) out += {digits[c >> 4], digits[c & 15]};
  return out;
}

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  const std::string bin = workerBinary();
  const std::string coreType = edit::blasCoreType();
  const int port = o.masterPort > 0 ? o.masterPort : freePort();
  // The job store's secret (docs/job-store.md): a fresh one per run, inherited by every
  // worker, so a worker of another run on this port is refused instead of joining.
  ::setenv("EDIT_STORE_SECRET", storeSecret().c_str(), 1);
  // One slot per rank of the largest world the job reaches (--scale-at).
  int maxReplicas = o.nproc / o.shards, replicas = o.nproc / o.shards;
  for (const auto& p : o.scaleAt) maxReplicas = std::max(maxReplicas, p.replicas);
  const int localWorld = maxReplicas * o.shards;
  int scaleFrom = replicas;  // the replicas before the latest scale (a failed scale-up returns to it)
  std::vector<Worker> ws(localWorld);
  for (int r = 0; r < localWorld; ++r) ws[r].rank = r;
  auto start = [&](Worker& w, const char* join) {
    if (!o.logDir.empty() && !w.log.is_open()) {
      ::mkdir(o.logDir.c_str(), 0755);
      w.log.open(o.logDir + "/rank-" + std::to_string(w.rank) + ".log");  // once per run: a reused slot appends
    }
    return spawn(w, o, bin, port, coreType, join, replicas, localWorld);
  };
  struct sigaction sa {};
  sa.sa_handler = onSignal;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  struct sigaction su {};
  su.sa_handler = onScaleSignal;
  sigaction(SIGUSR1, &su, nullptr);
  sigaction(SIGUSR2, &su, nullptr);
  signal(SIGPIPE, SIG_IGN);

  std::cout << "edit-run: " << o.nproc << " workers (" << o.nproc / o.shards << " replicas x "
            << o.shards << " shards), rendezvous 127.0.0.1:" << port
            << (coreType.empty() ? "" : ", OPENBLAS_CORETYPE=" + coreType)
            << (o.scaleAtText.empty() ? "" : ", scaling at " + o.scaleAtText) << std::endl;
  const auto t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < o.nproc; ++r)
    if (!start(ws[r], "0")) return 1;

  int failedCode = 0, failedRank = -1, recoveries = 0;
  bool stopping = false;
  auto stopAll = [&](int sig) {
    for (auto& w : ws)
      if (!w.exited) ::kill(w.pid, sig);
  };
  auto stopDeadline = std::chrono::steady_clock::time_point::max();
  for (;;) {
    std::vector<pollfd> fds;
    std::vector<std::pair<int, bool>> who;
    for (auto& w : ws) {
      if (w.out >= 0) { fds.push_back({w.out, POLLIN, 0}); who.push_back({w.rank, false}); }
      if (w.err >= 0) { fds.push_back({w.err, POLLIN, 0}); who.push_back({w.rank, true}); }
    }
    if (!fds.empty()) ::poll(fds.data(), fds.size(), 200);
    for (size_t i = 0; i < fds.size(); ++i) {
      if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      Worker& w = ws[who[i].first];
      bool open = true;
      if (who[i].second) {
        drain(w, w.err, w.errBuf, true, ws, o.quiet, open);
        if (!open) { ::close(w.err); w.err = -1; }
      } else {
        drain(w, w.out, w.outBuf, false, ws, o.quiet, open);
        if (!open) { ::close(w.out); w.out = -1; }
      }
    }
    // Asked by signal: rank 0 puts it to the others at the next sync round's control exchange.
    for (int up = gScaleUp.exchange(0), down = gScaleDown.exchange(0); up + down > 0;) {
      const bool more = up > 0;
      (more ? up : down)--;
      if (stopping || ws[0].exited) continue;
      std::cerr << "edit-run: " << (more ? "SIGUSR1: one replica more" : "SIGUSR2: one replica fewer")
                << " at the next sync round" << std::endl;
      ::kill(ws[0].pid, more ? SIGUSR1 : SIGUSR2);
    }
    // A scale the workers began (rank 0 said so): start the new replicas' ranks, or note
    // that the last ones leave (they exit 0 by themselves).
    for (const int target : gScaleTargets) {
      if (target * o.shards > static_cast<int>(ws.size())) {  // beyond --scale-at's largest: new slots
        const int from = static_cast<int>(ws.size());
        ws.resize(target * o.shards);
        for (int r = from; r < target * o.shards; ++r) ws[r].rank = r;
      }
      scaleFrom = replicas;
      if (stopping || target == replicas) continue;
      const int first = std::min(target, replicas) * o.shards, last = std::max(target, replicas) * o.shards;
      std::cerr << "edit-run: scaling from " << replicas << " to " << target << " replicas: workers " << first
                << ".." << last - 1 << (target > replicas ? " start" : " leave") << std::endl;
      const int before = replicas;
      replicas = target;
      if (target > before)
        for (int r = first; r < last; ++r) {
          if (!start(ws[r], "scale")) return 1;
          ws[r].joining = true;
        }
    }
    gScaleTargets.clear();
    int status;
    pid_t pid;
    while ((pid = ::waitpid(-1, &status, WNOHANG)) > 0) {
      for (auto& w : ws) {
        if (w.pid != pid) continue;
        w.exited = true;
        w.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        // A crashed or killed worker is replaced while the others wait for it
        // (common/src/exit_codes.h: not a permanent failure, a gang stop or a survivor
        // that gave up waiting).
        const bool replaceable = edit::replaceableExit(w.code);
        if (w.joining && w.code != 0) {
          // A new replica's rank died before it joined: the others give up on the scale-up
          // at their rendezvous deadline and go on with the replicas they had.
          w.joining = false;
          w.excused = true;
          if (replicas != scaleFrom)
            std::cerr << "edit-run: worker " << w.rank << " of a new replica exited with code " << w.code
                      << " before it joined; the job stays at " << scaleFrom << " replicas" << std::endl;
          replicas = scaleFrom;
          continue;
        }
        if (w.rank >= replicas * o.shards) {
          // A replica that left at a scale-down: the job goes on without it.
          if (w.code != 0)
            std::cerr << "edit-run: worker " << w.rank << " (a replica that left) exited with code " << w.code
                      << std::endl;
          w.excused = true;
          continue;
        }
        if (replaceable && !stopping && recoveries < o.maxRecoveries) {
          ++recoveries;
          std::cerr << "edit-run: worker " << w.rank << " exited with code " << w.code
                    << "; starting a replacement (recovery " << recoveries << " of " << o.maxRecoveries
                    << "), the other workers recover in place" << std::endl;
          // Keep what the dead worker printed, then reuse the slot.
          while (w.out >= 0 || w.err >= 0) {
            bool open = true;
            if (w.out >= 0) { drain(w, w.out, w.outBuf, false, ws, o.quiet, open); if (!open) { ::close(w.out); w.out = -1; } }
            open = true;
            if (w.err >= 0) { drain(w, w.err, w.errBuf, true, ws, o.quiet, open); if (!open) { ::close(w.err); w.err = -1; } }
          }
          w.incarnation++;
          if (!start(w, "1")) return 1;
          continue;
        }
        if (w.code != 0 && failedRank < 0 && !stopping) {
          failedRank = w.rank;
          failedCode = w.code;
          std::cerr << "edit-run: worker " << w.rank << " exited with code " << w.code
                    << "; stopping the other workers" << std::endl;
          stopping = true;
          stopAll(SIGTERM);
          stopDeadline = std::chrono::steady_clock::now() + std::chrono::seconds(15);
        }
      }
    }
    if (gSignal && !stopping) {
      std::cerr << "edit-run: signal " << gSignal
                << ": asking workers to checkpoint and stop" << std::endl;
      stopping = true;
      stopAll(SIGTERM);
      stopDeadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    }
    if (std::chrono::steady_clock::now() > stopDeadline) {
      stopAll(SIGKILL);
      stopDeadline = std::chrono::steady_clock::time_point::max();
    }
    bool all = std::all_of(ws.begin(), ws.end(),
                           [](const Worker& w) { return w.exited && w.out < 0 && w.err < 0; });
    if (all) break;
  }
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  summary(ws, wall);
  if (failedRank >= 0) {
    std::cerr << "edit-run: failed (worker " << failedRank << " exit code " << failedCode << ")\n";
    return failedCode;
  }
  if (gSignal) return 128 + gSignal;
  for (const auto& w : ws)
    if (w.code != 0 && !w.excused) return w.code;
  return 0;
}
