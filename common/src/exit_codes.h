// edit-train's exit codes and what each means to whoever restarts workers: edit-run on
// one machine and the operator on a cluster read this one table (docs/reference.md, "Exit
// codes").
//
// A LibTorch error is one of two codes: a collective that failed or timed out (a peer
// died, hung, or the network between them was cut) is kExitPeerLost, and only after the
// worker could not recover in place; any other c10::Error (a bad shape, out of memory) is
// kExitTorchError, a failure of this worker that says nothing about its peers.
#pragma once

namespace edit {

enum ExitCode : int {
  kExitOk = 0,
  kExitFailure = 1,          // unexpected error: retryable
  kExitInvalidInput = 2,     // bad config, data or checkpoint layout: permanent
  kExitStalled = 3,          // training stalled (TrainingStalled): permanent, a restart replays it
  kExitNoSpace = 4,          // a checkpoint did not fit: checkpoint.dir is full (ENOSPC) or over its
                             // quota (EDQUOT). Every rank exits so together, the partial checkpoint
                             // removed and the previous one intact: permanent until space is freed
                             // (a restart would redo the steps and fail at the same checkpoint)
  kExitTorchError = 70,      // a LibTorch error outside any collective: retryable like 1
  kExitPeerLost = 75,        // the gang must restart from its newest checkpoint: a collective failed
                             // or timed out (a peer died or hung, or the link was cut) and no
                             // in-place recovery was possible, or a checkpoint could not be written
                             // for another reason than space (EIO): retryable
  kExitLeft = 76,            // SIGTERM reached this worker and not the whole gang: it left,
                             // its peers recover in place around its replacement
  kExitCannotExecute = 126,  // the shell found the command but cannot run it: permanent
  kExitNotFound = 127,       // the shell did not find the command: permanent
  kExitTerminated = 143,     // stopped by SIGTERM after saving a checkpoint (128 + 15)
};

// Running it again gives the same result: the job fails instead of restarting.
constexpr bool isPermanentExit(int code) {
  return code == kExitInvalidInput || code == kExitStalled || code == kExitNoSpace || code == kExitCannotExecute ||
         code == kExitNotFound;
}

// The worker stopped on purpose (a SIGTERM'd gang, or a worker that left alone): neither
// a failure of the job nor a reason to spend its backoff limit.
constexpr bool isStopExit(int code) { return code == kExitTerminated || code == kExitLeft; }

// A failure a replacement of this one rank can absorb while its peers wait (in-place
// recovery): a crash, a kill (128 + signal), or a worker that left alone. Not a success,
// a permanent failure, a survivor that gave up waiting (75) or a gang that stopped (143).
constexpr bool replaceableExit(int code) {
  return code != kExitOk && !isPermanentExit(code) && code != kExitPeerLost && code != kExitTerminated;
}

}  // namespace edit
