#include "train/recovery_plan.h"

#include <algorithm>

namespace edit {

RecoveryPlan planRecovery(const std::vector<RecoveryOffer>& offers, int replicas, int shards) {
  RecoveryPlan p;
  const int W = static_cast<int>(offers.size()), N = shards;
  auto survivor = [&](int r) { return !offers[r].joiner; };
  auto holds = [&](int r, int64_t k) { return k >= 0 && (offers[r].cur == k || offers[r].snap == k); };

  // The newest round every survivor holds. Rounds are fenced by a world-wide control
  // exchange, so survivors are at most one round apart and the older one is always held.
  int64_t low = -1;
  bool first = true;
  for (int r = 0; r < W; ++r) {
    if (!survivor(r)) continue;
    const int64_t best = std::max(offers[r].cur, offers[r].snap);
    low = first ? best : std::min(low, best);
    first = false;
  }
  if (first || low < 0) {
    p.why = "no survivor holds an outer state yet";
    return p;
  }
  for (int r = 0; r < W; ++r)
    if (survivor(r) && !holds(r, low)) {
      p.why = "rank " + std::to_string(r) + " no longer holds sync round " + std::to_string(low);
      return p;
    }
  // One round newer, when a peer died in the middle of its last unit of that round: its
  // shard-group peer could not finish the unit (the averaged norm is a shard-group
  // collective) while their sync-group peers did. If for every shard index some survivor
  // completed the round and every other survivor is inside it (it took part in each
  // unit's sync-group exchange, so its sync peers' result is the round's outer state),
  // those take the round's outer state from their sync group instead of every replica
  // going back a second interval.
  p.round = low;
  const int64_t k = low + 1;
  bool newer = true;
  for (int s = 0; s < N && newer; ++s) {
    bool held = false;
    for (int m = 0; m < replicas; ++m) held |= survivor(m * N + s) && holds(m * N + s, k);
    newer = held;
  }
  for (int r = 0; r < W && newer; ++r)
    if (survivor(r) && !holds(r, k) && offers[r].next != k) newer = false;
  if (newer) p.round = k;

  // Source of each shard index: its lowest surviving replica that holds the round.
  p.source.assign(N, -1);
  for (int s = 0; s < N; ++s) {
    for (int m = 0; m < replicas && p.source[s] < 0; ++m)
      if (survivor(m * N + s) && holds(m * N + s, p.round)) p.source[s] = m;
    if (p.source[s] < 0) {
      p.why = "every replica's rank with shard " + std::to_string(s) + " was lost";
      return p;
    }
  }
  auto stepAt = [&](int r) {
    const auto& o = offers[r];
    return o.cur == p.round ? o.curStep : o.snap == p.round ? o.snapStep : o.nextStep;
  };
  p.receives.assign(W, false);
  p.fromSnapshot.assign(W, false);
  p.stepFrom.assign(W, -1);
  p.step.assign(W, -1);
  for (int r = 0; r < W; ++r) {
    p.receives[r] = !survivor(r) || !holds(r, p.round);
    p.fromSnapshot[r] = survivor(r) && offers[r].cur != p.round && offers[r].snap == p.round;
    // The step: a replica's own (shard groups step in lockstep), taken from a survivor of
    // the replica, else from the rank its shard is copied from.
    const int replica = r / N, shard = r % N;
    int from = p.source[shard] * N + shard;
    if (survivor(r)) {
      from = r;
    } else {
      for (int s = 0; s < N; ++s)
        if (survivor(replica * N + s)) {
          from = replica * N + s;
          break;
        }
    }
    p.stepFrom[r] = from;
    p.step[r] = stepAt(from);
  }
  return p;
}

}  // namespace edit
