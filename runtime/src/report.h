// What a worker knows about its last step: the one struct that the Prometheus exporter,
// the gRPC telemetry client and the progress line are all fed from.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>

namespace edit {

struct CommCount {
  uint64_t bytes = 0;        // bytes this rank sent, cumulative
  double waitSeconds = 0;    // training thread blocked on it, cumulative
  uint64_t calls = 0;
};

// (op, group) -> cumulative counters, e.g. ("allgather", "shard").
using CommCounts = std::map<std::pair<std::string, std::string>, CommCount>;

struct StepReport {
  int rank = 0, replica = 0, shard = 0, worldSize = 1;
  int64_t step = 0;            // steps completed
  int64_t totalSteps = 0;
  double loss = 0;
  uint64_t tokens = 0;         // cumulative tokens of this rank
  double stepSeconds = 0;      // wall time of the last step
  double computeSeconds = 0;   // of which not blocked in collectives
  double commWaitSeconds = 0;  // cumulative blocked time, all groups
  double syncSeconds = 0;      // duration of the last sync round (0 if none this step)
  bool synced = false;         // a sync round happened in this step
  uint64_t syncRounds = 0;     // cumulative
  uint64_t anomalies = 0;      // cumulative
  uint64_t outerSkips = 0;     // cumulative: units whose outer step a round skipped
  int64_t skipStreak = 0;      // longest current run of rounds a unit's outer step was skipped
  double pseudoGradNorm = 0;   // of the last averaged pseudo-gradient (whole model)
  double lr = 0;
  std::string phase;           // warmup | local | sync | checkpoint | done
  CommCounts comm;
};

}  // namespace edit
