// What a worker knows about its last step: the one struct that the Prometheus exporter,
// the gRPC telemetry client and the progress line are all fed from.
#pragma once

#include <cstdint>
#include <string>

#include "dist/comm_counts.h"
#include "link_advice.h"

namespace edit {

struct StepReport {
  int rank = 0, replica = 0, shard = 0, worldSize = 1;
  int replicas = 1;            // replicas of the world at this step (M; changes at a scale)
  int64_t step = 0;            // steps completed
  int64_t totalSteps = 0;
  double loss = 0;
  uint64_t tokens = 0;         // cumulative tokens of this rank
  double stepSeconds = 0;      // wall time of the last step
  double computeSeconds = 0;   // of which not blocked in collectives
  double commWaitSeconds = 0;  // cumulative blocked time, all groups
  double lastSyncDurationSeconds = 0;  // of the last sync round (0 if none this step)
  bool synced = false;         // a sync round happened in this step
  uint64_t syncRounds = 0;     // cumulative
  uint64_t anomalies = 0;      // cumulative
  uint64_t outerSkips = 0;     // cumulative: units whose outer step a round skipped
  int64_t skipStreak = 0;      // longest current run of rounds a unit's outer step was skipped
  double pseudoGradNorm = 0;   // of the last averaged pseudo-gradient (whole model)
  // The penalty at the last round (penalty on): this replica's smallest and largest weight
  // over the units (uniform: 1/M) and the smallest clip factor (1: not clipped); units
  // clipped so far.
  double replicaWeightMin = 0, replicaWeightMax = 0, clipFactorMin = 1;
  uint64_t unitsClipped = 0;
  double lr = 0;
  std::string phase;           // warmup | local | sync | checkpoint | done
  CommCounts comm;
  // The local phase so far (the steps after a local mode's synchronous warm-up), for the
  // link advice of edit-run and the operator: only localSteps, computeSeconds,
  // blockedSeconds and rounds are filled. Cumulative for this process. Blocked = waits on
  // the groups that span replicas (sync, world); a replica's own shard-group collectives
  // come every step, so they count with its compute.
  LinkMeasurement local;
};

}  // namespace edit
