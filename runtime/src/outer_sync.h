// EDiT's synchronization of one unit (EDIT_ALGORITHM.md steps 1-7), also used for the
// DiLoCo and post-local-SGD baselines with the penalty switched off.
//
// Runs on the communication stream, in forward order, before the unit's all-gather, so
// the sync of unit l+1 overlaps the forward of unit l. Every vector here is this rank's
// slice of the unit; norms are completed over the shard group, averages over the sync
// group. All ranks of a sync group compute the same weights and the same averaged
// pseudo-gradient, so their outer weights stay bit-identical.
#pragma once

#include <torch/torch.h>

#include "comm.h"
#include "config.h"
#include "flat_units.h"
#include "penalty.h"

namespace edit {

struct OuterUnit {
  torch::Tensor outer;     // [chunk] outer (global) weights
  torch::Tensor momentum;  // [chunk] Nesterov buffer
  // With algorithm.offloadOuterState on a GPU both live in pinned host memory and visit
  // the device only while their unit synchronizes.
};

struct SyncSettings {
  PenaltyConfig penalty;   // anomaly/weighted/clip switches and their parameters
  double lr = 0.7, momentum = 0.8;
  bool nesterov = true;
  bool stepShare = false;  // A-EDiT: blend the replicas' share of steps into the weights
};

SyncSettings syncSettingsFor(const AlgorithmConfig& a);

struct UnitSyncResult {
  bool anomaly = false;     // this replica's pseudo-gradient was eliminated
  bool skipped = false;     // every replica anomalous: no outer step
  double norm = 0;          // g: this replica's pseudo-gradient norm (whole unit)
  double averagedNorm = 0;  // norm of the averaged pseudo-gradient before clipping
  double clipFactor = 1;
  double weight = 0;        // this replica's weight
};

UnitSyncResult syncUnit(Comm& comm, FlatUnit& unit, OuterUnit& outer, EwmaDetector& detector,
                        const SyncSettings& s, double stepsSinceSync);

// The outer optimizer step alone: SGD with (Nesterov) momentum, dampening 0, like
// torch.optim.SGD. Exposed for tests.
// Overwrites `grad` (scratch).
void outerStep(torch::Tensor& outer, torch::Tensor& momentum, torch::Tensor& grad,
               double lr, double mu, bool nesterov);

}  // namespace edit
