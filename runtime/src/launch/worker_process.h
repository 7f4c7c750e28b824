// One local worker process of a launcher (edit-run): how it is started, what it prints
// and how it ended. LibTorch-free, like the launcher.
#pragma once

#include <sys/types.h>

#include <nlohmann/json.hpp>

#include <fstream>
#include <functional>
#include <string>
#include <vector>

namespace edit {

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
  nlohmann::json last, summary;  // the newest "@edit" line and the "@edit-summary"
  std::ofstream log;
};

// What a worker process is started with (the environment contract of docs/reference.md).
struct WorkerLaunch {
  std::string binary;                 // edit-train
  std::vector<std::string> args;      // after the binary: --config, --set ...
  int shards = 1;
  int masterPort = 0;
  std::string coreType;               // OPENBLAS_CORETYPE ("" : OpenBLAS picks)
  std::string scaleAt;                // EDIT_SCALE_AT
  int metricsPort = -1;               // worker r serves /metrics on metricsPort + r
  int localWorld = 1;                 // EDIT_LOCAL_WORLD_SIZE: the cores are shared by this many
};

// Starts worker w.rank in a world of `replicas` replicas: with the job (join "0"), as a
// replacement ("1") or as a rank of a new replica at a scale-up ("scale"). Its stdout and
// stderr are pipes the launcher reads; it gets SIGTERM if the launcher dies.
bool spawnWorker(Worker& w, const WorkerLaunch& l, const char* join, int replicas);

// Reads what fd has (non-blocking after poll) and calls onLine for each whole line; at
// end of file the last partial line too, and `open` becomes false.
void drainLines(int fd, std::string& buf, bool& open, const std::function<void(const std::string&)>& onLine);

// The edit-train next to this executable, else the one on PATH.
std::string workerBinary();
// A free TCP port on loopback (29500 when none can be had).
int freeLoopbackPort();

}  // namespace edit
