// Checkpoint files: one file per rank per checkpoint, plus a manifest written by rank 0
// once every rank's file is durable. A checkpoint without a manifest is incomplete and
// never loaded.
//
//   <dir>/step-00000120/rank-00003.ckpt   named tensors, CRC-32 over the whole payload
//   <dir>/step-00000120/MANIFEST          "edit-checkpoint v1", step, world, per-rank CRCs
//
// Every file is written to a temporary name, fsynced, renamed, and the directory fsynced:
// a crash leaves either the old state or the new, never a half-written file.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace edit {

struct CheckpointError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A complete checkpoint this run cannot continue from at all: written for another model or
// another number of shards per replica, or a checkpoint.dir some rank cannot read any of
// the world's checkpoints from (a corrupt one is skipped for an older one instead).
// Permanent: edit-train exits kExitInvalidInput.
struct CheckpointLayoutError : CheckpointError {
  using CheckpointError::CheckpointError;
};

// Writing a file of a checkpoint failed; the message names the file and the error, and
// `error` is its errno (ENOSPC: the disk is full). Nothing of the file is left behind.
struct CheckpointWriteError : CheckpointError {
  CheckpointWriteError(const std::string& what, int err) : CheckpointError(what), error(err) {}
  int error;
  // The disk is full or the quota spent: a restart would fail the same way.
  bool noSpace() const;
};

// A checkpoint the world did not save because a rank could not write its part (or rank 0
// the manifest): every rank throws it at the same point, with the ranks and the error
// named, once the partial checkpoint is removed. The previous checkpoint is untouched.
// noSpace: ENOSPC or EDQUOT on some rank (edit-train exits kExitNoSpace).
struct CheckpointNotSaved : CheckpointError {
  CheckpointNotSaved(const std::string& what, bool full) : CheckpointError(what), noSpace(full) {}
  bool noSpace;
};

// "ENOSPC (No space left on device)" for the errors a checkpoint write meets, else strerror.
std::string describeErrno(int err);

using NamedTensors = std::map<std::string, torch::Tensor>;

uint32_t crc32(const void* data, size_t n, uint32_t crc = 0);

// Writes atomically; returns the file's CRC-32.
uint32_t writeCheckpointFile(const std::string& path, const NamedTensors& tensors);
// Throws CheckpointError naming the file when it is truncated, corrupt or not ours.
NamedTensors readCheckpointFile(const std::string& path);
// CRC-32 of a file's payload as stored in it, after verifying it (throws like read).
uint32_t verifyCheckpointFile(const std::string& path);

// Writes `content` to `path` atomically (temp file in the same directory, fsync, rename,
// fsync of the directory).
void writeFileAtomic(const std::string& path, const std::string& content);

struct Manifest {
  int64_t step = 0;
  int world = 0;
  std::vector<uint32_t> crcs;  // per rank
  std::string configYaml;
};

std::string stepDirName(const std::string& root, int64_t step);
std::string rankFileName(const std::string& stepDir, int rank);
void writeManifest(const std::string& stepDir, const Manifest& m);
// Throws CheckpointError when missing or malformed.
Manifest readManifest(const std::string& stepDir);
// Steps that have a manifest, newest first.
std::vector<int64_t> completeCheckpointSteps(const std::string& root);
// Removes all but the newest `keep` complete checkpoints, and incomplete ones older
// than the newest complete one.
void pruneCheckpoints(const std::string& root, int64_t keep);

}  // namespace edit
