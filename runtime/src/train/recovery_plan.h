// What the ranks of an in-place recovery agree on (docs/replica-recovery.md): the sync round
// every rank continues from, how far into it each shard's outer state got, the replica each
// shard's outer state is copied from, and who takes it. A pure function of the table the
// ranks exchange, so every rank decides alike and the rules are testable without
// processes. No LibTorch.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace edit {

// One rank's row of the exchanged table. Rounds are counted like syncRounds (-1: none).
struct RecoveryOffer {
  bool joiner = false;   // a replacement (or a survivor whose copy failed): holds nothing
  int64_t cur = -1;      // the newest round complete here
  int64_t curStep = -1;  // the step it was applied at
  int64_t next = -1;     // the round in progress here and not complete (-1: none)
  int64_t nextStep = -1;
  int64_t unitsDone = 0;  // units of `next` whose outer update is applied here: 0 .. unitsDone-1
  int64_t stepNow = -1;   // the step this rank is at
};

struct RecoveryPlan {
  // Every rank continues from the outer state of `round`. For shard index s, units
  // 0 .. unitsApplied[s]-1 hold that round's update and the others keep the previous
  // round's, as when a round skips a unit (docs/replica-recovery.md, "Rolling forward").
  int64_t round = -1;
  std::vector<int64_t> unitsApplied;  // per shard index
  std::vector<int> source;            // per shard index: the replica the sync group copies from
  std::vector<bool> receives;         // per rank: takes its outer state from its source
  std::vector<int> stepFrom;          // per rank: whose step (and AdamW step count) it takes
  std::vector<int64_t> step;          // per rank: the step it continues at
  std::string why;                    // not empty: in-place recovery is impossible, and why
};

// offers[r] for r in [0, replicas * shards); rank r is replica r / shards, shard r % shards;
// the model has `units` units, synchronized in order. stepClocked: every replica syncs at
// the same step (all modes but A-EDiT).
RecoveryPlan planRecovery(const std::vector<RecoveryOffer>& offers, int replicas, int shards, int64_t units,
                          bool stepClocked);

}  // namespace edit
