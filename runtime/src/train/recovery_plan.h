// What the ranks of an in-place recovery agree on (docs/replica-recovery.md): the sync round
// every rank continues from, the replica each shard's outer state is copied from, and who
// takes it. A pure function of the table the ranks exchange, so every rank decides alike
// and the rules are testable without processes. No LibTorch.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace edit {

// One rank's row of the exchanged table. Rounds are counted like syncRounds (-1: none).
struct RecoveryOffer {
  bool joiner = false;  // a replacement: holds nothing yet
  int64_t cur = -1;     // the newest round complete here (-1 while a round is half applied)
  int64_t snap = -1;    // the round of the snapshot taken entering the round in progress
  int64_t next = -1;    // the round in progress here and not complete (-1: none)
  int64_t curStep = -1, snapStep = -1, nextStep = -1;  // the step each of them was applied at
};

struct RecoveryPlan {
  int64_t round = -1;              // every rank continues from the outer state of this round
  std::vector<int> source;         // per shard index: the replica the sync group copies from
  std::vector<bool> receives;      // per rank: takes the outer state of `round` from its source
  std::vector<bool> fromSnapshot;  // per rank: goes back to its own snapshot
  std::vector<int> stepFrom;       // per rank: whose step (and AdamW step count) it takes
  std::vector<int64_t> step;       // per rank: the step it continues at
  std::string why;                 // not empty: in-place recovery is impossible, and why
};

// offers[r] for r in [0, replicas * shards); rank r is replica r / shards, shard r % shards.
RecoveryPlan planRecovery(const std::vector<RecoveryOffer>& offers, int replicas, int shards);

}  // namespace edit
