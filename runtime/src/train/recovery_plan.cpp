#include "train/recovery_plan.h"

#include <algorithm>

namespace edit {

RecoveryPlan planRecovery(const std::vector<RecoveryOffer>& offers, int replicas, int shards, int64_t units,
                          bool stepClocked) {
  RecoveryPlan p;
  const int W = static_cast<int>(offers.size()), N = shards;
  auto survivor = [&](int r) { return !offers[r].joiner; };

  // The newest round every survivor has complete. Rounds are fenced by a world-wide
  // control exchange, so a survivor is at most one round further (complete or in progress).
  int64_t low = -1;
  bool first = true;
  for (int r = 0; r < W; ++r) {
    if (!survivor(r)) continue;
    low = first ? offers[r].cur : std::min(low, offers[r].cur);
    first = false;
  }
  if (first || low < 0) {
    p.why = "no survivor holds an outer state yet";
    return p;
  }
  for (int r = 0; r < W; ++r) {
    if (!survivor(r)) continue;
    const auto& o = offers[r];
    if (o.cur > low + 1 || (o.next >= 0 && o.next != o.cur + 1)) {
      p.why = "rank " + std::to_string(r) + " is at sync round " + std::to_string(std::max(o.cur, o.next)) +
              ", more than one round past round " + std::to_string(low) + " of another survivor";
      return p;
    }
  }
  // Units of round R whose outer update rank r holds (a prefix: units sync in order).
  auto applied = [&](int r, int64_t R) -> int64_t {
    const auto& o = offers[r];
    return o.cur >= R ? units : o.next == R ? std::min(o.unitsDone, units) : 0;
  };
  // Roll forward: the newer round, if any survivor applied any unit of it. A unit's update
  // on one rank of a sync group is the group's (every replica contributed to it), so the
  // others copy it; units nobody got to keep the previous round's state, as if the round
  // had skipped them.
  p.round = low;
  for (int r = 0; r < W; ++r)
    if (survivor(r) && applied(r, low + 1) > 0) p.round = low + 1;
  const int64_t R = p.round;

  // Source of each shard index: its surviving replica that got furthest (the lowest of
  // those).
  p.source.assign(N, -1);
  p.unitsApplied.assign(N, 0);
  for (int s = 0; s < N; ++s) {
    for (int m = 0; m < replicas; ++m) {
      const int r = m * N + s;
      if (survivor(r) && (p.source[s] < 0 || applied(r, R) > p.unitsApplied[s])) {
        p.source[s] = m;
        p.unitsApplied[s] = applied(r, R);
      }
    }
    if (p.source[s] < 0) {
      p.why = "every replica's rank with shard " + std::to_string(s) + " was lost";
      return p;
    }
  }
  p.receives.assign(W, false);
  for (int r = 0; r < W; ++r) p.receives[r] = !survivor(r) || applied(r, R) < p.unitsApplied[r % N];

  // The step: the one round R was applied at by the rank's own replica (its shard groups
  // step in lockstep). Step-clocked rounds come at the same step on every replica. An
  // A-EDiT replica none of whose survivors entered the round continues at its own step.
  auto roundStep = [&](int r) -> int64_t {
    const auto& o = offers[r];
    return o.cur == R ? o.curStep : o.next == R ? o.nextStep : -1;
  };
  p.stepFrom.assign(W, -1);
  p.step.assign(W, -1);
  for (int r = 0; r < W; ++r) {
    const int replica = r / N, shard = r % N;
    int from = survivor(r) && roundStep(r) >= 0 ? r : -1;
    for (int s = 0; s < N && from < 0; ++s)
      if (survivor(replica * N + s) && roundStep(replica * N + s) >= 0) from = replica * N + s;
    int64_t step = from >= 0 ? roundStep(from) : -1;
    for (int s = 0; s < N && from < 0 && !stepClocked; ++s)
      if (survivor(replica * N + s)) {
        from = replica * N + s;
        step = offers[from].stepNow;
      }
    if (from < 0) {
      from = p.source[shard] * N + shard;
      for (int q = 0; q < W && roundStep(from) < 0; ++q)
        if (survivor(q) && roundStep(q) >= 0) from = q;
      step = roundStep(from);
    }
    p.stepFrom[r] = from;
    p.step[r] = step;
  }
  return p;
}

}  // namespace edit
