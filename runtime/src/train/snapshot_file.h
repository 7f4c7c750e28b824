// The recovery snapshot on disk (runtime.recoverySnapshotDir): the outer weights and
// momentum of every unit when the sync round in progress began, in an unlinked file. The
// kernel may write its pages back and evict them, so the worker's resident memory does not
// hold 2P/N bytes for a copy that is read only when a peer is lost mid-round.
#pragma once

#include <torch/torch.h>

#include <string>
#include <vector>

#include "sync/outer_sync.h"

namespace edit {

class SnapshotFile {
 public:
  // Creates the file in `dir` and unlinks it at once: it disappears with the process.
  explicit SnapshotFile(const std::string& dir);
  ~SnapshotFile();
  SnapshotFile(const SnapshotFile&) = delete;
  SnapshotFile& operator=(const SnapshotFile&) = delete;

  // Every unit's outer and momentum, in unit order, from the start of the file.
  void save(const std::vector<OuterUnit>& outer);
  // Reads what save() wrote back into the same tensors (same shapes, any device).
  void load(std::vector<OuterUnit>& outer) const;

 private:
  int fd_ = -1;
  std::string dir_;
};

}  // namespace edit
