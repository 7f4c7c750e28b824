// The supervision loop of a launcher (edit-run): starts the workers, streams their
// output, replaces one that dies while the others recover in place
// (docs/replica-recovery.md) or stops everyone when that cannot help, starts and lets go
// of replicas at a scale (docs/elastic.md), forwards Ctrl-C/SIGTERM (the workers
// checkpoint, then exit) and ends with the summary table.
#pragma once

#include <atomic>
#include <chrono>
#include <csignal>
#include <string>
#include <vector>

#include "launch/run_report.h"
#include "launch/worker_process.h"

namespace edit {

// Set by the launcher's signal handlers (lock-free), read by its loop.
struct LauncherSignals {
  volatile sig_atomic_t stop = 0;          // SIGINT / SIGTERM: its number
  std::atomic<int> scaleUp{0}, scaleDown{0};  // SIGUSR1 / SIGUSR2: one replica more / fewer
};

struct LauncherOptions {
  int nproc = 4, shards = 1, maxRecoveries = 3;
  std::string logDir;
  bool quiet = false;
};

class Launcher {
 public:
  Launcher(LauncherOptions options, WorkerLaunch launch, LauncherSignals& signals);
  // Runs the job to its end; returns the launcher's exit code (the failed worker's, 128 +
  // a signal, or 0).
  int run();

 private:
  bool start(Worker& w, const char* join);
  void pollOutput();
  void onLine(Worker& w, const std::string& line, bool isErr);
  void closeIfDone(Worker& w, bool isErr, bool open);
  void forwardScaleSignals();
  bool startScaledReplicas();  // false: a worker could not be started
  bool reapExited();           // false: a replacement could not be started
  bool onExit(Worker& w);
  void stopAll(int sig);
  void beginStop(const std::string& why, std::chrono::seconds grace);
  int exitCode() const;

  LauncherOptions o_;
  WorkerLaunch launch_;
  LauncherSignals& signals_;
  RunReport report_;
  std::vector<Worker> ws_;
  int replicas_ = 0;    // the replicas of the world the workers are in now
  int scaleFrom_ = 0;   // the replicas before the latest scale (a failed scale-up returns to it)
  // Rank 0's "scaling from M to M2 replicas" (Membership::scale), read from its log: the
  // ranks of a new replica start now, while the others wait for them in the next
  // rendezvous generation.
  std::vector<int> scaleTargets_;
  int failedCode_ = 0, failedRank_ = -1, recoveries_ = 0;
  bool stopping_ = false;
  std::chrono::steady_clock::time_point stopDeadline_ = std::chrono::steady_clock::time_point::max();
};

}  // namespace edit
