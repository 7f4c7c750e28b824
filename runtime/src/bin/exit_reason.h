// What edit-train exits with when its run threw: the code (common/src/exit_codes.h) and
// the reason it prints and writes where the operator reads it. Apart from edit_train.cpp
// so that a unit test can put each kind of failure through it.
#pragma once

#include <exception>
#include <string>

#include "data/data.h"
#include "exit_codes.h"
#include "train/checkpoint.h"
#include "train/trainer.h"
#include "worker_config.h"

namespace edit {

struct ExitReason {
  int code = kExitFailure;
  std::string text;             // for stderr
  bool terminationLog = true;   // also the pod's termination message (not for a rank that left)
};

inline ExitReason exitReasonOf(std::exception_ptr failure) {
  try {
    std::rethrow_exception(failure);
  } catch (const TrainingStalled& e) {
    return {kExitStalled, e.what()};
  } catch (const ConfigError& e) {
    return {kExitInvalidInput, std::string("invalid configuration: ") + e.what()};
  } catch (const CheckpointLayoutError& e) {
    return {kExitInvalidInput, std::string("invalid checkpoint: ") + e.what()};
  } catch (const CheckpointNotSaved& e) {
    // Every rank throws it at the same checkpoint, so no rank is replaced alone: a full
    // disk stops the job, another write error restarts the gang from the previous one.
    return {e.noSpace ? kExitNoSpace : kExitPeerLost, e.what()};
  } catch (const data::DataError& e) {
    return {kExitInvalidInput, std::string("invalid data: ") + e.what()};
  } catch (const LeftAlone& e) {
    return {kExitLeft, std::string("left the job: ") + e.what(), false};
  } catch (const PeerLost& e) {
    // A collective failed or timed out (Comm turns each of their errors into PeerLost) and
    // no in-place recovery was possible. The operator's condition shows the reason (the
    // log's tail before it is step reports).
    return {kExitPeerLost, std::string("peer lost: ") + e.what()};
  } catch (const c10::Error& e) {
    // Not a collective's (those are PeerLost): this worker's own failure, not a lost peer.
    return {kExitTorchError, std::string("LibTorch error: ") + e.what_without_backtrace()};
  } catch (const std::exception& e) {
    return {kExitFailure, std::string("error: ") + e.what()};
  }
}

}  // namespace edit
