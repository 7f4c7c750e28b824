// What a launcher prints of its workers: one progress line per step the slowest worker
// reached (from their "@edit" lines), and the summary table at the end (from their
// "@edit-summary" lines), with the link note when the rounds blocked too long.
#pragma once

#include <cstdint>
#include <vector>

#include "launch/worker_process.h"

namespace edit {

class RunReport {
 public:
  void progress(const std::vector<Worker>& ws);
  void summary(const std::vector<Worker>& ws, double wallSeconds);

 private:
  int64_t lastPrinted_ = -1;
};

}  // namespace edit
