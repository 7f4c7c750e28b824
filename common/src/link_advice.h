// After a run of a local mode: was the sync group's link the bottleneck, and which setting
// would fix it? The arithmetic of docs/algorithm.md ("Choosing tau and overlapSteps for a
// slow link") applied to what the run measured, so a user on a slow link learns the tau
// that suits it from the run's own summary instead of from a benchmark of another CPU.
// A pure function; no LibTorch.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace edit {

struct LinkMeasurement {
  std::string mode;             // algorithm.mode
  int64_t syncInterval = 0;     // tau
  double syncSeconds = 0;       // a-edit's window
  std::string compression;      // algorithm.syncCompression
  int64_t overlapSteps = 0;
  bool overlapAllowed = true;   // false where the run refuses overlapSteps (NCCL)
  int64_t localSteps = 0;       // steps after the synchronous warm-up
  double computeSeconds = 0;    // of those steps, not blocked across replicas (a replica's
                                // own shard-group collectives count here: they come every step)
  double blockedSeconds = 0;    // of those steps, blocked on the groups that span replicas
  int64_t rounds = 0;           // sync rounds in those steps
};

struct LinkAdvice {
  double blockedShare = 0;      // blocked / (compute + blocked) of the local phase
  double roundSeconds = 0;      // R: blocked seconds per round
  double stepSeconds = 0;       // c: compute seconds per local step
  int64_t syncInterval = 0;     // the smallest tau that keeps the share under the target
  double syncSeconds = 0;       // a-edit: the smallest window that does
  int64_t overlapSteps = 0;     // the d that would hide one round
  std::string text;             // empty: nothing to say (the link is not the bottleneck)
};

// The rank that waited least per round: the last to arrive at each round waits for the
// exchange alone, the others also for it, so its blocked time is the link's cost without
// the ranks' skew (a straggler's sleep is not the link's). None with a round: a default
// measurement.
LinkMeasurement leastBlocked(const std::vector<LinkMeasurement>& ranks);

// Advice when the blocked share of the local phase is above `target` (0.2: the rounds may
// block at most a fifth of it). Nothing for ddp, for runs with fewer than 3 rounds (too few
// to measure), or when the share is under the target.
LinkAdvice adviseLink(const LinkMeasurement& m, double target = 0.2);

}  // namespace edit
