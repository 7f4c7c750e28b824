// The ZeRO-3 step of one rank (docs/memory.md): its units' parameter slices, the
// full-size buffers they are gathered into, the inner AdamW and the token batches. A step
// is llm.c's four calls:
//
//   forward(t, beforeGather)   unit by unit; each unit all-gathered just before it runs,
//                              a layer-wise sync round's work for it done first when asked
//   backward(average)          in reverse; each unit's gradient reduce-scattered inside the
//                              replica while the backward goes on, and averaged across
//                              replicas in ddp and the synchronous warm-up
//   innerStep(t, lr)           global-norm clip and AdamW on this rank's slices
//   loss()                     the step's training loss
//
// The engine knows nothing of sync rounds: the schedule (train/sync_schedule.h) hands
// forward() the work to do before each all-gather.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "worker_config.h"

#include "data/data.h"
#include "dist/flat_units.h"
#include "model/model.h"
#include "sync/compression.h"
#include "sync/optim.h"
#include "train/run_state.h"

namespace edit {

// runtime.backend: NCCL on a GPU when this is a CUDA build and a GPU is visible (auto),
// else Gloo on the CPU. Sets mesh.backend and mesh.device; throws ConfigError for nccl
// without a GPU.
torch::Device selectDevice(const RuntimeConfig& rt, MeshSpec& mesh);

// How backward() averages the gradient slices across replicas.
struct ReplicaAverage {
  bool on = false;  // ddp, and local modes' synchronous warm-up
  // algorithm.syncCompression on a local mode's warm-up: exchanged compressed, unit by
  // unit (the slow link between replicas is why compression is on).
  const Codec* codec = nullptr;
  int64_t block = 0;
};

class StepEngine {
 public:
  using Log = std::function<void(const std::string&)>;
  // Runs on the communication thread just before unit u is all-gathered.
  using UnitTask = std::function<void(size_t u)>;

  // Builds this rank's units (the same initial weights on every replica: checked across
  // the sync group unless the rank joins a running job, whose weights come from its
  // peers), the buffers, AdamW and the token files. `localPhases` and `overlap` size the
  // memory plan.
  StepEngine(const Config& cfg, const MeshSpec& mesh, Groups& groups, torch::Device device, bool localPhases,
             bool overlap, Log log);

  void forward(int64_t t, const UnitTask& beforeGather);
  void backward(const ReplicaAverage& average);
  // A non-finite gradient norm skips the step instead of poisoning the weights.
  void innerStep(int64_t t, double lr);
  double loss() const { return loss_.item<double>(); }

  // Mean validation loss over `batches`, averaged over `reduceOver` (-1: no val data).
  double evaluate(int64_t batches, Group reduceOver);
  // After a failed step: no unit left gathered, no gradient buffer bound.
  void releaseAll();

  std::vector<FlatUnit>& units() { return units_; }
  const std::vector<FlatUnit>& units() const { return units_; }
  ShardedAdamW& adam() { return *adam_; }
  const BufferCache& buffers() const { return *buffers_; }
  const MemoryPlan& memoryPlan() const { return memoryPlan_; }
  const ModelShape& shape() const { return shape_; }
  torch::Device device() const { return device_; }
  int64_t tokensPerStep() const { return cfg_.data.batchSize * cfg_.data.seqLen; }

 private:
  Comm& comm() const { return *groups_.comm; }
  CommStream& stream() const { return *groups_.stream; }
  // Enqueues unit u's preparation on the communication stream: `before` (if any), then
  // its all-gather into a cached buffer (sharded units).
  Pending prepareUnit(size_t u, const UnitTask& before);
  void releaseUnit(size_t u);
  // Enqueues the reduction of unit u's gradient: reduce-scatter in the replica, then, at
  // a bucket's lowest unit, the bucket's average across replicas.
  Pending reduceGradient(size_t u, torch::Tensor grad, const ReplicaAverage& average, size_t bucketEnd);
  // At a bucket's lowest unit, one past its highest unit; elsewhere 0 (runtime.bucketMB).
  std::vector<size_t> replicaBuckets(const ReplicaAverage& average) const;
  void checkSameInitialWeights();
  void openData(const MeshSpec& mesh);

  const Config& cfg_;
  Groups& groups_;
  Log log_;
  ModelShape shape_{};
  torch::Device device_;
  std::vector<FlatUnit> units_;
  std::unique_ptr<BufferCache> buffers_;  // full-size buffers of gathered units and gradients
  int prefetchDepth_ = 1;                 // units prepared ahead of the one computing
  bool reshardAfterForward_ = true;
  MemoryPlan memoryPlan_;
  std::unique_ptr<ShardedAdamW> adam_;
  Rope rope_;
  std::optional<data::TokenFile> train_, val_;
  std::unique_ptr<data::BatchSampler> trainSampler_, valSampler_;
  std::vector<int64_t> inputs_, targets_;
  // Between forward() and backward(): each unit's input (a detached leaf, so the backward
  // runs unit by unit), its output, and the loss.
  std::vector<torch::Tensor> ins_, outs_;
  torch::Tensor loss_;
};

}  // namespace edit
