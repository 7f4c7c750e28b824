#include "launch/launcher.h"

#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <utility>

#include "exit_codes.h"

namespace edit {

using nlohmann::json;

Launcher::Launcher(LauncherOptions options, WorkerLaunch launch, LauncherSignals& signals)
    : o_(std::move(options)), launch_(std::move(launch)), signals_(signals) {
  replicas_ = scaleFrom_ = o_.nproc / o_.shards;
  ws_.resize(static_cast<size_t>(launch_.localWorld));
  for (size_t r = 0; r < ws_.size(); ++r) ws_[r].rank = static_cast<int>(r);
}

bool Launcher::start(Worker& w, const char* join) {
  if (!o_.logDir.empty() && !w.log.is_open()) {
    ::mkdir(o_.logDir.c_str(), 0755);
    w.log.open(o_.logDir + "/rank-" + std::to_string(w.rank) + ".log");  // once per run: a reused slot appends
  }
  return spawnWorker(w, launch_, join, replicas_);
}

int Launcher::run() {
  const auto t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < o_.nproc; ++r)
    if (!start(ws_[r], "0")) return 1;
  for (;;) {
    pollOutput();
    forwardScaleSignals();
    if (!startScaledReplicas() || !reapExited()) return 1;
    if (signals_.stop && !stopping_)
      beginStop("signal " + std::to_string(signals_.stop) + ": asking workers to checkpoint and stop",
                std::chrono::seconds(60));
    if (std::chrono::steady_clock::now() > stopDeadline_) {
      stopAll(SIGKILL);
      stopDeadline_ = std::chrono::steady_clock::time_point::max();
    }
    if (std::all_of(ws_.begin(), ws_.end(), [](const Worker& w) { return w.exited && w.out < 0 && w.err < 0; }))
      break;
  }
  report_.summary(ws_, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return exitCode();
}

void Launcher::pollOutput() {
  std::vector<pollfd> fds;
  std::vector<std::pair<int, bool>> who;  // rank, stderr
  for (auto& w : ws_) {
    if (w.out >= 0) fds.push_back({w.out, POLLIN, 0}), who.push_back({w.rank, false});
    if (w.err >= 0) fds.push_back({w.err, POLLIN, 0}), who.push_back({w.rank, true});
  }
  if (!fds.empty()) ::poll(fds.data(), fds.size(), 200);
  for (size_t i = 0; i < fds.size(); ++i) {
    if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
    Worker& w = ws_[who[i].first];
    const bool isErr = who[i].second;
    bool open = true;
    drainLines(isErr ? w.err : w.out, isErr ? w.errBuf : w.outBuf, open,
               [&](const std::string& line) { onLine(w, line, isErr); });
    closeIfDone(w, isErr, open);
  }
}

void Launcher::closeIfDone(Worker& w, bool isErr, bool open) {
  if (open) return;
  int& fd = isErr ? w.err : w.out;
  ::close(fd);
  fd = -1;
}

void Launcher::onLine(Worker& w, const std::string& line, bool isErr) {
  if (w.log.is_open()) w.log << line << std::endl;  // flushed: tail -f and the tests read it live
  if (isErr) {
    std::cerr << line << "\n";
    if (w.joining && line.find("as a new replica") != std::string::npos) w.joining = false;
    int from = 0, to = 0;
    const size_t at = line.find("scaling from ");
    if (w.rank == 0 && at != std::string::npos &&
        std::sscanf(line.c_str() + at, "scaling from %d to %d replicas", &from, &to) == 2)
      scaleTargets_.push_back(to);
    return;
  }
  if (line.rfind("@edit-summary ", 0) == 0) {
    w.summary = json::parse(line.substr(14), nullptr, false);
  } else if (line.rfind("@edit ", 0) == 0) {
    w.last = json::parse(line.substr(6), nullptr, false);
    if (!o_.quiet) report_.progress(ws_);
  } else {
    std::cout << "[rank " << w.rank << "] " << line << "\n";
  }
}

void Launcher::forwardScaleSignals() {
  // Rank 0 puts it to the others at the next sync round's control exchange.
  for (int up = signals_.scaleUp.exchange(0), down = signals_.scaleDown.exchange(0); up + down > 0;) {
    const bool more = up > 0;
    (more ? up : down)--;
    if (stopping_ || ws_[0].exited) continue;
    std::cerr << "edit-run: " << (more ? "SIGUSR1: one replica more" : "SIGUSR2: one replica fewer")
              << " at the next sync round" << std::endl;
    ::kill(ws_[0].pid, more ? SIGUSR1 : SIGUSR2);
  }
}

bool Launcher::startScaledReplicas() {
  // A scale the workers began (rank 0 said so): start the new replicas' ranks, or note
  // that the last ones leave (they exit 0 by themselves).
  const int N = o_.shards;
  for (const int target : scaleTargets_) {
    if (target * N > static_cast<int>(ws_.size())) {  // beyond --scale-at's largest: new slots
      const int from = static_cast<int>(ws_.size());
      ws_.resize(static_cast<size_t>(target * N));
      for (int r = from; r < target * N; ++r) ws_[r].rank = r;
    }
    scaleFrom_ = replicas_;
    if (stopping_ || target == replicas_) continue;
    const int first = std::min(target, replicas_) * N, last = std::max(target, replicas_) * N;
    std::cerr << "edit-run: scaling from " << replicas_ << " to " << target << " replicas: workers " << first << ".."
              << last - 1 << (target > replicas_ ? " start" : " leave") << std::endl;
    const int before = replicas_;
    replicas_ = target;
    if (target > before)
      for (int r = first; r < last; ++r) {
        if (!start(ws_[r], "scale")) return false;
        ws_[r].joining = true;
      }
  }
  scaleTargets_.clear();
  return true;
}

bool Launcher::reapExited() {
  int status;
  pid_t pid;
  while ((pid = ::waitpid(-1, &status, WNOHANG)) > 0) {
    for (auto& w : ws_) {
      if (w.pid != pid) continue;
      w.exited = true;
      w.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      if (!onExit(w)) return false;
    }
  }
  return true;
}

bool Launcher::onExit(Worker& w) {
  if (w.joining && w.code != 0) {
    // A new replica's rank died before it joined: the others give up on the scale-up at
    // their rendezvous deadline and go on with the replicas they had.
    w.joining = false;
    w.excused = true;
    if (replicas_ != scaleFrom_)
      std::cerr << "edit-run: worker " << w.rank << " of a new replica exited with code " << w.code
                << " before it joined; the job stays at " << scaleFrom_ << " replicas" << std::endl;
    replicas_ = scaleFrom_;
    return true;
  }
  if (w.rank >= replicas_ * o_.shards) {
    // A replica that left at a scale-down: the job goes on without it.
    if (w.code != 0)
      std::cerr << "edit-run: worker " << w.rank << " (a replica that left) exited with code " << w.code << std::endl;
    w.excused = true;
    return true;
  }
  // A crashed or killed worker is replaced while the others wait for it
  // (common/src/exit_codes.h: not a permanent failure, a gang stop or a survivor that gave
  // up waiting).
  if (replaceableExit(w.code) && !stopping_ && recoveries_ < o_.maxRecoveries) {
    ++recoveries_;
    std::cerr << "edit-run: worker " << w.rank << " exited with code " << w.code << "; starting a replacement (recovery "
              << recoveries_ << " of " << o_.maxRecoveries << "), the other workers recover in place" << std::endl;
    // Keep what the dead worker printed, then reuse the slot.
    while (w.out >= 0 || w.err >= 0) {
      for (const bool isErr : {false, true}) {
        if ((isErr ? w.err : w.out) < 0) continue;
        bool open = true;
        drainLines(isErr ? w.err : w.out, isErr ? w.errBuf : w.outBuf, open,
                   [&](const std::string& line) { onLine(w, line, isErr); });
        closeIfDone(w, isErr, open);
      }
    }
    w.incarnation++;
    return start(w, "1");
  }
  if (w.code != 0 && failedRank_ < 0 && !stopping_) {
    failedRank_ = w.rank;
    failedCode_ = w.code;
    beginStop("worker " + std::to_string(w.rank) + " exited with code " + std::to_string(w.code) +
                  "; stopping the other workers",
              std::chrono::seconds(15));
  }
  return true;
}

void Launcher::stopAll(int sig) {
  for (auto& w : ws_)
    if (!w.exited) ::kill(w.pid, sig);
}

void Launcher::beginStop(const std::string& why, std::chrono::seconds grace) {
  std::cerr << "edit-run: " << why << std::endl;
  stopping_ = true;
  stopAll(SIGTERM);
  stopDeadline_ = std::chrono::steady_clock::now() + grace;
}

int Launcher::exitCode() const {
  if (failedRank_ >= 0) {
    std::cerr << "edit-run: failed (worker " << failedRank_ << " exit code " << failedCode_ << ")\n";
    return failedCode_;
  }
  if (signals_.stop) return 128 + signals_.stop;
  for (const auto& w : ws_)
    if (w.code != 0 && !w.excused) return w.code;
  return 0;
}

}  // namespace edit
