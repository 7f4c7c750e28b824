// edit-run: the local launcher (like torchrun). Starts N edit-train workers on this
// machine over loopback and supervises them (launch/launcher.h): one progress line,
// a dead worker replaced while the others recover in place (docs/replica-recovery.md),
// Ctrl-C/SIGTERM forwarded (workers checkpoint, then exit), a summary at the end.
//
//   edit-run --nproc 4 [--shards 2] --config examples/local/tiny.yaml [--set k=v]...
#include <signal.h>
#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "launch/blas_env.h"
#include "launch/launcher.h"
#include "scale_points.h"

namespace {

edit::LauncherSignals gSignals;
void onSignal(int s) { gSignals.stop = s; }
// SIGUSR1 / SIGUSR2 to edit-run: one replica more / fewer, forwarded to rank 0.
void onScaleSignal(int s) { (s == SIGUSR1 ? gSignals.scaleUp : gSignals.scaleDown).fetch_add(1); }

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

// 32 random bytes, hex.
std::string storeSecret() {
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

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  const std::string coreType = edit::blasCoreType();
  // The job store's secret (docs/job-store.md): a fresh one per run, inherited by every
  // worker, so a worker of another run on this port is refused instead of joining.
  ::setenv("EDIT_STORE_SECRET", storeSecret().c_str(), 1);
  edit::LauncherOptions lo;
  lo.nproc = o.nproc;
  lo.shards = o.shards;
  lo.maxRecoveries = o.maxRecoveries;
  lo.logDir = o.logDir;
  lo.quiet = o.quiet;
  edit::WorkerLaunch wl;
  wl.binary = edit::workerBinary();
  if (!o.config.empty()) wl.args.insert(wl.args.end(), {"--config", o.config});
  for (const auto& s : o.sets) wl.args.insert(wl.args.end(), {"--set", s});
  wl.shards = o.shards;
  wl.masterPort = o.masterPort > 0 ? o.masterPort : edit::freeLoopbackPort();
  wl.coreType = coreType;
  wl.scaleAt = o.scaleAtText;
  wl.metricsPort = o.metricsPort;
  // One slot per rank of the largest world the job reaches (--scale-at).
  int maxReplicas = o.nproc / o.shards;
  for (const auto& p : o.scaleAt) maxReplicas = std::max(maxReplicas, p.replicas);
  wl.localWorld = maxReplicas * o.shards;

  struct sigaction sa {};
  sa.sa_handler = onSignal;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  struct sigaction su {};
  su.sa_handler = onScaleSignal;
  sigaction(SIGUSR1, &su, nullptr);
  sigaction(SIGUSR2, &su, nullptr);
  signal(SIGPIPE, SIG_IGN);

  std::cout << "edit-run: " << o.nproc << " workers (" << o.nproc / o.shards << " replicas x " << o.shards
            << " shards), rendezvous 127.0.0.1:" << wl.masterPort
            << (coreType.empty() ? "" : ", OPENBLAS_CORETYPE=" + coreType)
            << (o.scaleAtText.empty() ? "" : ", scaling at " + o.scaleAtText) << std::endl;
  return edit::Launcher(lo, wl, gSignals).run();
}
