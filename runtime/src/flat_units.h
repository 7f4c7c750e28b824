// Flat, sharded parameter storage (ZeRO-3 inside a replica).
//
// Each unit's parameters are one flat float vector, padded to a multiple of N. Rank s of
// the shard group owns chunk s. The module parameters are leaf views into `full`, and
// their .grad are views into `grad`, so the forward/backward read and write the flat
// buffers directly: nothing is copied per step. `shard` is a view of chunk s of `full`:
// the optimizer and EDiT update it in place, and the next all-gather fills the rest.
//
// Unlike PyTorch FSDP's default, the gathered `full` buffer is kept between steps (like
// FSDP's SHARD_GRAD_OP / ZeRO-2 for parameters) because on CPU memory is not what
// limits; the communication volume is that of ZeRO-3.
#pragma once

#include <torch/torch.h>

#include <vector>

#include "model.h"

namespace edit {

struct FlatUnit {
  UnitLayout layout;
  int index = 0;
  int64_t padded = 0, chunk = 0;
  int shards = 1, shard = 0;
  torch::Tensor full;       // [padded] gathered parameters
  torch::Tensor grad;       // [padded] gradients of this rank's batch (then reduced)
  torch::Tensor shardView;  // [chunk] view of full: this rank's master slice
  torch::Tensor gradShard;  // [chunk] view of grad
  torch::Tensor decayMask;  // [chunk] 1 where weight decay applies
  std::vector<torch::Tensor> params;  // leaf views of full, requires_grad

  // Chunk views of `full`, one per shard (all-gather outputs).
  std::vector<torch::Tensor> fullChunks() const;
  void zeroGrad() { grad.zero_(); }
};

// Builds the units of the model for shard `shard` of `shards`, initialized
// deterministically from `seed` (identical on every rank).
std::vector<FlatUnit> buildUnits(const ModelShape& s, int shards, int shard, uint64_t seed,
                                 torch::Device device = torch::kCPU);

}  // namespace edit
