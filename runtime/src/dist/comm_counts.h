// What each collective has cost this rank so far, by operation and process group. Kept
// by Comm (dist/comm.h), read into every StepReport (telemetry/report.h).
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

// into += more, counter by counter.
inline void addCounts(CommCounts& into, const CommCounts& more) {
  for (const auto& [k, c] : more) {
    auto& a = into[k];
    a.bytes += c.bytes;
    a.waitSeconds += c.waitSeconds;
    a.calls += c.calls;
  }
}

}  // namespace edit
