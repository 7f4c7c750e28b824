// What the three parts of a worker share (train/trainer.h composes them): the run's
// progress, the requests that reach it from outside, and the process groups of the
// current rendezvous generation.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

#include "dist/comm.h"

namespace edit {

// Where the run is. The trainer's loop advances it; a resume moves it to a checkpoint's
// position and an in-place recovery back to a sync round's.
struct Progress {
  int64_t step = 0;               // steps completed by this rank
  uint64_t tokens = 0;            // tokens of this rank (those before a resume included)
  int64_t totalSteps = 0;         // the run's length in steps per replica
  int64_t lastCheckpointId = -1;  // the newest checkpoint this run wrote or resumed
  int64_t controlId = 0;          // the checkpoint id agreed at the last control exchange
};

// Asked from other threads and signal handlers (every member is lock-free), acted on at
// the next control exchange, where every rank can agree: every step in synchronous
// phases, every sync round in local ones.
struct ControlRequests {
  std::atomic<bool> stop{false};        // stop after a checkpoint (the operator's STOP)
  std::atomic<bool> checkpoint{false};  // a checkpoint at the next exchange
  std::atomic<bool> terminate{false};   // SIGTERM reached this process
  // Replicas to add (or remove, negative) at the next sync round: SIGUSR1 (+1) and
  // SIGUSR2 (-1), which edit-run forwards to rank 0. Read by rank 0 only (docs/elastic.md).
  std::atomic<int> scaleDelta{0};
  // The number of replicas the operator asks for (telemetry SCALE); 0: none. An absolute
  // target, so resending it is harmless; wins over a delta taken at the same exchange.
  std::atomic<int> scaleTarget{0};
};

// The process groups of the current generation; Membership forms them again after a lost
// peer or a scale. Declared after the engine and the schedule in their owner, so that
// the communication threads stop before the state their tasks touch goes away.
struct Groups {
  std::unique_ptr<Comm> comm;
  std::unique_ptr<CommStream> stream;
  // algorithm.overlapSteps: the rounds in flight get groups and a thread of their own, so
  // their collectives never interleave with a step's all-gathers. Never re-formed:
  // overlapped runs neither recover in place nor scale.
  std::unique_ptr<Comm> roundComm;
  std::unique_ptr<CommStream> roundStream;
  CommCounts carried;  // counters of the groups already torn down

  ~Groups() {
    // A round still in flight (an error ended the run) finishes or fails; none starts.
    if (roundStream) roundStream->abort();
  }

  // Every generation's counters, the current one's included.
  CommCounts counters() const {
    auto all = carried;
    if (comm) addCounts(all, comm->counters());
    if (roundComm) addCounts(all, roundComm->counters());
    return all;
  }

  // Pending tasks fail fast, the one in flight ends (its peer is gone or leaving too), and
  // destroying the groups closes their connections, which makes every rank still blocked
  // on this one notice now instead of at its timeout.
  void leave() {
    if (stream) stream->abort();
    stream.reset();
    if (comm) addCounts(carried, comm->counters());  // the run's totals outlive the groups
    comm.reset();
  }
};

}  // namespace edit
