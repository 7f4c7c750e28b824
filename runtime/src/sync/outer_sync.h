// EDiT's synchronization of one unit (docs/algorithm.md, "One sync round"), also used for
// the DiLoCo and post-local-SGD baselines with the penalty switched off.
//
// Runs on the communication stream, in forward order, before the unit's all-gather, so
// the sync of unit l+1 overlaps the forward of unit l. Every vector here is this rank's
// slice of the unit; norms are completed over the shard group, averages over the sync
// group. All ranks of a sync group compute the same weights and the same averaged
// pseudo-gradient, so their outer weights stay bit-identical.
#pragma once

#include <torch/torch.h>

#include "dist/comm.h"
#include "modes.h"
#include "worker_config.h"
#include "dist/flat_units.h"
#include "sync/compression.h"
#include "sync/penalty.h"

namespace edit {

struct OuterUnit {
  torch::Tensor outer;     // [chunk] outer (global) weights
  torch::Tensor momentum;  // [chunk] Nesterov buffer
  // [chunk] error feedback of algorithm.syncCompression int8/int4: what quantization has not
  // sent yet of this rank's pseudo-gradient (undefined without compression). Per rank,
  // not shared by the sync group like the two above.
  torch::Tensor residual;
  // [part] error feedback of the averaged pseudo-gradient of the part of the slice this
  // rank owns in the compressed reduce-scatter (SlicePartition part rankIn(Sync)): what
  // requantizing the average for the all-gather has not sent yet. Also per rank.
  torch::Tensor averageResidual;
  // With algorithm.offloadOuterState on a GPU all live in pinned host memory and visit
  // the device only while their unit synchronizes.
};

struct SyncSettings {
  PenaltyConfig penalty;   // anomaly/weighted/clip switches and their parameters
  double lr = 0.7, momentum = 0.8;
  bool nesterov = true;
  bool stepShare = false;  // A-EDiT: blend the replicas' share of steps into the weights
  Codec codec;             // algorithm.syncCompression (on: the OuterUnit residuals are defined)
  int64_t block = 256;     // algorithm.compressionBlock
  // Any part of the penalty on. Off (the baselines): a plain average, no norms computed,
  // so none of the penalty's collectives run; NaN/Inf is then not caught either.
  bool penaltyOn() const { return penalty.anomaly || penalty.weighted || penalty.clip || stepShare; }
};

// The settings a mode runs with: the baselines switch the penalty off and use their own
// published outer optimizer (diloco: momentum 0.9 unless set; localsgd: plain averaging).
SyncSettings syncSettingsFor(const AlgorithmConfig& a);

struct UnitSyncResult {
  bool anomaly = false;     // this replica's pseudo-gradient was eliminated
  bool skipped = false;     // every replica anomalous: no outer step
  double norm = 0;          // g: this replica's pseudo-gradient norm (whole unit; 0 without penalty)
  double averagedNorm = 0;  // norm of the averaged pseudo-gradient before clipping (penalty on)
  double sliceSq = 0;       // this rank's part of its square (always; the trainer completes it)
  double clipFactor = 1;
  double weight = 0;        // this replica's weight
  bool done = false;        // a round ran (an overlapped round's first call applies none)
};

// One round of a unit: its pseudo-gradient from the local slice, the outer step, and the
// slice reset to the new outer weights.
UnitSyncResult syncUnit(Comm& comm, FlatUnit& unit, OuterUnit& outer, EwmaDetector& detector,
                        const SyncSettings& s, double stepsSinceSync);

// The round's exchange and outer step for a given pseudo-gradient D (this rank's slice,
// overwritten: scratch): the penalty, the average over the sync group and the outer step
// update `outer` in place; no local weights are touched (algorithm.overlapSteps runs this
// on its own thread and groups while the next round's local steps go on).
UnitSyncResult syncPseudoGradient(Comm& comm, torch::Tensor& D, OuterUnit& outer, EwmaDetector& detector,
                                  const SyncSettings& s, double stepsSinceSync);

// algorithm.syncCompression int8/int4: the length of the part of a slice of n elements that
// sync rank `rank` of M owns (averages and all-gathers), i.e. of its averageResidual.
int64_t ownedPartLength(int64_t n, int64_t block, int M, int rank);

// x (float32, this rank's copy) := the mean of x over the sync group, exchanged compressed
// like a sync round's pseudo-gradient (a quantized reduce-scatter, the owner's fp32 mean
// requantized and all-gathered), without error feedback: the synchronous warm-up's
// gradient average under algorithm.syncCompression. Every rank gets the same bits; a NaN
// or Inf anywhere in a part makes that part NaN everywhere, as the fp32 all-reduce would.
void compressedMean(Comm& comm, torch::Tensor& x, const Codec& codec, int64_t block);

// The outer optimizer step alone: SGD with (Nesterov) momentum, dampening 0, like
// torch.optim.SGD. Exposed for tests.
// Overwrites `grad` (scratch).
void outerStep(torch::Tensor& outer, torch::Tensor& momentum, torch::Tensor& grad,
               double lr, double mu, bool nesterov);

// out := where outerStep would take `outer` for pseudo-gradient D, leaving outer and
// momentum as they are (algorithm.overlapSteps's local start point: the round's step as if
// every replica's pseudo-gradient were this one).
void previewOuterStep(torch::Tensor& out, const torch::Tensor& outer, const torch::Tensor& momentum,
                      const torch::Tensor& D, double lr, double mu, bool nesterov);

}  // namespace edit
