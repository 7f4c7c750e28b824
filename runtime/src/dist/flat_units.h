// Flat, sharded parameter storage: ZeRO-3 inside a replica.
//
// Each unit's parameters are one flat float vector, padded to a multiple of N. Rank s of
// the shard group owns chunk s, and that 1/N slice is all it keeps between steps: the
// parameter slice, its reduced gradient, and (elsewhere) the AdamW moments and the outer
// state. The full parameters of a unit exist only while the unit computes:
//
//   gather(u)   all-gather the slices into a full-size buffer and attach it to `full`
//   release(u)  detach the buffer from `full` (it goes back to the BufferCache)
//
// The module parameters are leaf views of `full` made once, so autograd's saved tensors
// (weights kept for the backward) point into `full`'s storage. Attaching swaps the
// storage's memory under those views, the way PyTorch FSDP frees and refills a flat
// parameter's storage: the forward can release a unit and the backward gathers it again
// into another buffer without rebuilding the graph.
//
// Gradients: with N > 1 a full-size gradient buffer exists only during the unit's
// backward; it is reduce-scattered into `gradSlice` and returned to the cache. With N = 1
// nothing is sharded, `slice` is `full` and the parameters' gradients are views of
// `gradSlice`. docs/memory.md has the memory per rank as a formula.
#pragma once

#include <torch/torch.h>

#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "model/model.h"

namespace edit {

struct FlatUnit {
  UnitLayout layout;
  int index = 0;
  int64_t padded = 0, chunk = 0;
  int shards = 1, shard = 0;
  torch::Tensor slice;      // [chunk] this rank's master slice (own memory when N > 1)
  torch::Tensor gradSlice;  // [chunk] this rank's reduced gradient, a view of gradArena
  // Every unit's gradSlice lives in one flat buffer, in unit order, so neighbouring units'
  // gradients can be all-reduced as one bucket and whole-model reductions are one op.
  torch::Tensor gradArena;
  int64_t gradOffset = 0;   // of gradSlice in gradArena
  // [start, length) ranges inside the slice that get weight decay (matrices, not gains).
  std::vector<std::pair<int64_t, int64_t>> decayRanges;
  torch::Tensor full;       // [padded] gathered parameters; memory attached only while gathered
  torch::Tensor fullBuffer; // the memory attached to `full` (undefined when released; N > 1)
  std::vector<torch::Tensor> params;  // leaf views of full, requires_grad

  bool sharded() const { return shards > 1; }
  bool gathered() const { return !sharded() || fullBuffer.defined(); }
  // Points the parameters' .grad at views of `flat` ([padded]); autograd accumulates there.
  void bindGrads(const torch::Tensor& flat);
  void unbindGrads();
};

// Full-size buffers (gathered parameters, a unit's gradient during its backward) reused
// across steps, so a step neither allocates nor page-faults large blocks. Keeps at most
// `keepPerSize` free buffers of each size; everything else is freed. Thread-safe (the
// communication thread takes, the training thread gives back).
class BufferCache {
 public:
  BufferCache(torch::TensorOptions opts, int keepPerSize) : opts_(opts), keep_(keepPerSize) {}
  torch::Tensor take(int64_t numel);  // uninitialised
  void give(torch::Tensor t);
  int64_t cachedBytes() const;
  int64_t liveBytes() const;  // taken and not given back
  int64_t peakLiveBytes() const;

 private:
  torch::TensorOptions opts_;
  int keep_;
  mutable std::mutex mu_;
  std::map<int64_t, std::vector<torch::Tensor>> free_;
  int64_t live_ = 0, peak_ = 0;
};

// What ZeRO-3 leaves on one rank, in bytes (docs/memory.md). P_u is unit u's padded size,
// N the shards, d the prefetch depth:
//   state      = 4 * sum_u P_u/N * (2 + 2 + outer)  parameter and gradient slices, AdamW m
//                and v, and in local modes outer weights + momentum (2)
//   buffers    N > 1, reshardAfterForward: <= 2 (d+1) * 4 * max_u P_u (d+1 gathered units
//                and d+1 gradients being reduced);  ZeRO-2: 4 * sum_u P_u + (d+1) * 4 * max_u P_u
// Activations, LibTorch and the communication library come on top (the bench measures).
struct MemoryPlan {
  int64_t parameters = 0, gradients = 0, optimizer = 0, outer = 0;
  int64_t overlap = 0;  // algorithm.overlapSteps: the round in flight's start point and pseudo-gradient
  int64_t buffers = 0;  // bound on the full-size buffers alive at once
  int64_t state() const { return parameters + gradients + optimizer + outer + overlap; }
  int64_t total() const { return state() + buffers; }
};
MemoryPlan planMemory(const ModelShape& s, int shards, bool localMode, bool reshardAfterForward,
                      int prefetchDepth, bool overlap = false);

// Builds the units of the model for shard `shard` of `shards`, initialized
// deterministically from `seed` (identical on every rank). With shards > 1 the units
// start released.
std::vector<FlatUnit> buildUnits(const ModelShape& s, int shards, int shard, uint64_t seed,
                                 torch::Device device = torch::kCPU);

// Attaches `buffer` ([padded], holding the gathered parameters) as `full`'s memory.
void attachFull(FlatUnit& u, torch::Tensor buffer);
// Detaches and returns the buffer (undefined when nothing was attached, or N = 1).
torch::Tensor detachFull(FlatUnit& u);

}  // namespace edit
