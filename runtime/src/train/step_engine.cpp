#include "train/step_engine.h"

#include <algorithm>
#include <cmath>

#include "sync/outer_sync.h"

#ifdef EDIT_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#endif

namespace edit {

torch::Device selectDevice(const RuntimeConfig& rt, MeshSpec& mesh) {
  const Backend b = rt.backend;
  bool cuda = false;
#ifdef EDIT_WITH_CUDA
  cuda = b != Backend::Gloo && torch::cuda::is_available();
#endif
  if (b == Backend::Nccl && !cuda)
    throw ConfigError("runtime.backend: nccl needs a CUDA build (-DEDIT_WITH_CUDA=ON) and a visible GPU");
  mesh.backend = cuda ? "nccl" : "gloo";
  if (!cuda) return torch::kCPU;
  const char* lr = std::getenv("LOCAL_RANK");
  const int count = static_cast<int>(torch::cuda::device_count());
  mesh.device = lr ? std::atoi(lr) % count : mesh.rank % count;
#ifdef EDIT_WITH_CUDA
  c10::cuda::set_device(static_cast<c10::DeviceIndex>(mesh.device));
#endif
  return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(mesh.device));
}

StepEngine::StepEngine(const Config& cfg, const MeshSpec& mesh, Groups& groups, torch::Device device,
                       bool localPhases, bool overlap, Log log)
    : cfg_(cfg), groups_(groups), log_(std::move(log)), shape_(shapeOf(cfg.model)), device_(device) {
  units_ = buildUnits(shape_, comm().shards(), comm().shard(), cfg_.training.seed, device_);
  prefetchDepth_ = cfg_.algorithm.prefetch ? 1 : 0;
  reshardAfterForward_ = cfg_.runtime.reshardAfterForward;
  // Enough cached buffers per size for the units in flight at once (the one computing,
  // those prefetched, and a gradient being reduced), so a step allocates nothing.
  buffers_ = std::make_unique<BufferCache>(
      torch::TensorOptions().dtype(torch::kFloat32).device(device_), prefetchDepth_ + 2);
  memoryPlan_ = planMemory(shape_, comm().shards(), localPhases, reshardAfterForward_, prefetchDepth_, overlap);
  if (mesh.rank == 0) {
    auto mb = [](int64_t b) { return std::to_string((b + 500000) / 1000000) + " MB"; };
    const auto& m = memoryPlan_;
    log_("memory per rank (docs/memory.md): state " + mb(m.state()) + " (parameters " + mb(m.parameters) +
         ", gradients " + mb(m.gradients) + ", AdamW " + mb(m.optimizer) + ", outer " + mb(m.outer) +
         ", overlapped round " + mb(m.overlap) + "), full-size buffers at most " + mb(m.buffers) +
         ", plus activations");
  }
  adam_ = std::make_unique<ShardedAdamW>(cfg_.training, units_);
  rope_ = makeRope(shape_, cfg_.data.seqLen).to(device_);
  if (!mesh.join) checkSameInitialWeights();
  openData(mesh);
}

void StepEngine::checkSameInitialWeights() {
  // Every replica must start from the same weights (a classic bug of Local-SGD ports):
  // compare a fingerprint of this rank's slices across the sync group.
  torch::NoGradGuard ng;
  double fp = 0;
  for (auto& u : units_) fp += u.slice.sum(torch::kFloat64).item<double>();
  auto hi = torch::full({1}, fp, torch::kFloat64), lo = torch::full({1}, -fp, torch::kFloat64);
  comm().allreduce(Group::Sync, hi, c10d::ReduceOp::MAX);
  comm().allreduce(Group::Sync, lo, c10d::ReduceOp::MAX);
  if (hi.item<double>() != -lo.item<double>())
    throw std::runtime_error("replicas start from different weights (check training.seed)");
}

void StepEngine::openData(const MeshSpec& mesh) {
  const auto& d = cfg_.data;
  train_.emplace(data::TokenFile::open(d.train));
  if (train_->maxToken() >= static_cast<uint32_t>(shape_.vocab))
    throw data::DataError(d.train + ": token id " + std::to_string(train_->maxToken()) +
                          " does not fit model.vocabSize " + std::to_string(shape_.vocab) +
                          " (raise model.vocabSize)");
  trainSampler_ = std::make_unique<data::BatchSampler>(*train_, d.seqLen, d.batchSize, cfg_.training.seed, mesh.rank);
  if (!d.val.empty()) {
    val_.emplace(data::TokenFile::open(d.val));
    if (val_->maxToken() >= static_cast<uint32_t>(shape_.vocab))
      throw data::DataError(d.val + ": token ids do not fit model.vocabSize");
    valSampler_ = std::make_unique<data::BatchSampler>(*val_, d.seqLen, d.batchSize, cfg_.training.seed ^ 0x5eed,
                                                       mesh.rank);
  }
  inputs_.resize(d.batchSize * d.seqLen);
  targets_.resize(inputs_.size());
}

Pending StepEngine::prepareUnit(size_t u, const UnitTask& before) {
  // The buffer is taken here, on the training thread: on a GPU the task's stream waits for
  // the training stream's work queued so far, which includes every use of a buffer given
  // back before this point.
  torch::Tensor buffer;
  if (units_[u].sharded()) buffer = buffers_->take(units_[u].padded);
  return stream().enqueue([this, u, before, buffer]() mutable {
    if (before) before(u);
    if (buffer.defined()) {
      comm().allgatherInto(Group::Shard, units_[u].slice, buffer);
      attachFull(units_[u], std::move(buffer));
    }
  });
}

void StepEngine::releaseUnit(size_t u) { buffers_->give(detachFull(units_[u])); }

void StepEngine::releaseAll() {
  for (size_t u = 0; u < units_.size(); ++u) {
    releaseUnit(u);
    if (units_[u].sharded()) units_[u].unbindGrads();
  }
}

void StepEngine::forward(int64_t t, const UnitTask& beforeGather) {
  // Unit by unit: wait for unit u's preparation (a layer-wise round's work for it, then
  // the all-gather), keep `depth` units prepared ahead, and release unit u's parameters
  // once its forward is done (ZeRO-3; not the last unit, whose backward comes next).
  const size_t U = units_.size(), depth = static_cast<size_t>(prefetchDepth_);
  const bool sharded = comm().shards() > 1, prepare = beforeGather || sharded;
  trainSampler_->fill(static_cast<uint64_t>(t), inputs_.data(), targets_.data());
  const auto opts = torch::TensorOptions().dtype(torch::kInt64);
  auto tokens = torch::from_blob(inputs_.data(), {cfg_.data.batchSize, cfg_.data.seqLen}, opts).to(device_);
  auto targets = torch::from_blob(targets_.data(), {cfg_.data.batchSize, cfg_.data.seqLen}, opts).to(device_);
  std::vector<Pending> ready(U);
  const Group prepGroup = beforeGather ? Group::Sync : Group::Shard;
  const CommOp prepOp = beforeGather ? CommOp::Sync : CommOp::AllGather;
  ins_.assign(U, {});
  outs_.assign(U, {});
  for (size_t u = 0; u < U; ++u) {
    if (prepare) {
      for (size_t k = u; k <= u + depth && k < U; ++k)
        if (!ready[k].valid()) ready[k] = prepareUnit(k, beforeGather);
      stream().wait(ready[u], prepGroup, prepOp);
    }
    const auto& p = units_[u].params;
    if (u == 0) {
      outs_[u] = embedForward(p, tokens);
    } else {
      ins_[u] = outs_[u - 1].detach().requires_grad_(true);
      if (u + 1 < U) {
        outs_[u] = blockForward(p, ins_[u], rope_, shape_);
      } else {
        loss_ = headLoss(p, ins_[u], targets, shape_);
      }
    }
    if (sharded && reshardAfterForward_ && u + 1 < U) releaseUnit(u);
  }
}

std::vector<size_t> StepEngine::replicaBuckets(const ReplicaAverage& average) const {
  // Across replicas the gradient slices are all-reduced in buckets of neighbouring units
  // (runtime.bucketMB): a bucket goes once its lowest unit is reduced inside the replica,
  // so small units share one collective and large ones still overlap the backward.
  // Compressed, each unit is its own bucket.
  const size_t U = units_.size();
  std::vector<size_t> end(U, 0);
  if (!average.on) return end;
  const int64_t limit = average.codec ? 1 : std::max<int64_t>(1, cfg_.runtime.bucketMB << 20) / 4;
  size_t hi = U;
  int64_t size = 0;
  for (size_t u = U; u-- > 0;) {
    size += units_[u].chunk;
    if (size >= limit || u == 0) {
      end[u] = hi;
      hi = u;
      size = 0;
    }
  }
  return end;
}

Pending StepEngine::reduceGradient(size_t u, torch::Tensor grad, const ReplicaAverage& average, size_t bucketEnd) {
  return stream().enqueue([this, u, grad, average, bucketEnd]() mutable {
    auto& unit = units_[u];
    if (grad.defined()) {
      comm().reduceScatterSum(Group::Shard, grad);
      unit.gradSlice.copy_(grad.narrow(0, unit.shard * unit.chunk, unit.chunk)).div_(comm().shards());
      waitForDeviceWork(grad);  // before the buffer can be reused by the training stream
      buffers_->give(std::move(grad));
    }
    if (average.on && bucketEnd > u) {
      const auto& last = units_[bucketEnd - 1];
      auto bucket = unit.gradArena.narrow(0, unit.gradOffset, last.gradOffset + last.chunk - unit.gradOffset);
      if (average.codec) {
        compressedMean(comm(), bucket, *average.codec, average.block);
      } else {
        comm().allreduce(Group::Sync, bucket);
        bucket.div_(comm().replicas());
      }
    }
  });
}

void StepEngine::backward(const ReplicaAverage& average) {
  // In reverse. Sharded: gather unit u again (prefetched `depth` ahead, in reverse order),
  // accumulate its gradient in a full-size buffer, release its parameters, and
  // reduce-scatter the buffer into gradSlice on the communication stream while the
  // backward goes on. The last unit stays gathered from its forward; the embedding's
  // backward needs only the token ids.
  const size_t U = units_.size(), depth = static_cast<size_t>(prefetchDepth_);
  const bool sharded = comm().shards() > 1, reduce = sharded || average.on;
  auto regather = [&](size_t u) {
    return sharded && reshardAfterForward_ && u + 1 < U && backwardReadsParameters(units_[u].layout.kind);
  };
  std::vector<Pending> gathered(U), reduced;
  auto ensureBack = [&](size_t u) {
    if (regather(u) && !gathered[u].valid()) gathered[u] = prepareUnit(u, nullptr);
  };
  const std::vector<size_t> bucketEnd = replicaBuckets(average);
  // Unsharded, the parameters' .grad are views of gradSlice (a layer-wise round's scratch
  // during the forward).
  if (!sharded) units_[0].gradArena.zero_();
  for (size_t u = U; u-- > 0;) {
    if (u + 1 < U) {
      for (size_t k = 0; k <= depth && k <= u; ++k) ensureBack(u - k);
      if (regather(u)) stream().wait(gathered[u], Group::Shard, CommOp::AllGather);
    } else {
      for (size_t k = 1; k <= depth && k <= u; ++k) ensureBack(u - k);
    }
    torch::Tensor grad;
    if (sharded) {
      grad = buffers_->take(units_[u].padded).zero_();
      units_[u].bindGrads(grad);
    }
    if (u + 1 == U) {
      loss_.backward();
    } else {
      outs_[u].backward(ins_[u + 1].grad());
    }
    if (sharded) {
      units_[u].unbindGrads();
      releaseUnit(u);
    }
    if (reduce) reduced.push_back(reduceGradient(u, std::move(grad), average, bucketEnd[u]));
  }
  const CommOp op = !average.on ? CommOp::ReduceScatter : average.codec ? CommOp::CompressedMean : CommOp::AllReduce;
  for (auto& f : reduced) stream().wait(f, average.on ? Group::Sync : Group::Shard, op);
  ins_.clear();
  outs_.clear();
}

void StepEngine::innerStep(int64_t t, double lr) {
  // Clip the global gradient norm (over the whole model: slices summed over the shard
  // group), then AdamW.
  torch::NoGradGuard ng;
  auto& arena = units_[0].gradArena;  // every unit's slice; the padding is zero
  auto sqT = arena.dot(arena).to(torch::kFloat64).reshape({1});
  comm().allreduce(Group::Shard, sqT);
  const double gnorm = std::sqrt(sqT.item<double>());
  if (!std::isfinite(gnorm)) {
    log_("step " + std::to_string(t) + ": non-finite gradient norm, inner step skipped");
    return;
  }
  if (cfg_.training.gradClip > 0 && gnorm > cfg_.training.gradClip) arena.mul_(cfg_.training.gradClip / (gnorm + 1e-6));
  adam_->step(units_, lr);
}

double StepEngine::evaluate(int64_t batches, Group reduceOver) {
  if (!valSampler_) return -1;
  torch::NoGradGuard ng;
  // Unit by unit over a group of batches: each unit is gathered once per group (the next
  // one prefetched) and released after, so the whole model is never materialised on a
  // rank; only the group's activations ([group, B, T, dim]) are kept.
  constexpr int64_t kGroup = 16;
  const size_t U = units_.size();
  const bool sharded = comm().shards() > 1;
  const auto opts = torch::TensorOptions().dtype(torch::kInt64);
  const std::vector<int64_t> shape{cfg_.data.batchSize, cfg_.data.seqLen};
  std::vector<int64_t> in(inputs_.size()), tg(inputs_.size());
  double sum = 0;
  for (int64_t first = 0; first < batches; first += kGroup) {
    const int64_t n = std::min(kGroup, batches - first);
    std::vector<torch::Tensor> hs(n), ys(n);
    std::vector<Pending> ready(U);
    for (size_t u = 0; u < U; ++u) {
      if (sharded) {
        for (size_t k = u; k <= u + static_cast<size_t>(prefetchDepth_) && k < U; ++k)
          if (!ready[k].valid()) ready[k] = prepareUnit(k, nullptr);
        stream().wait(ready[u], Group::Shard, CommOp::AllGather);
      }
      const auto& p = units_[u].params;
      for (int64_t b = 0; b < n; ++b) {
        if (u == 0) {
          valSampler_->fill(static_cast<uint64_t>(first + b), in.data(), tg.data());
          ys[b] = torch::from_blob(tg.data(), shape, opts).to(device_, false, true);
          hs[b] = embedForward(p, torch::from_blob(in.data(), shape, opts).to(device_, false, true));
        } else if (u + 1 < U) {
          hs[b] = blockForward(p, hs[b], rope_, shape_);
        } else {
          sum += headLoss(p, hs[b], ys[b], shape_).item<double>();
        }
      }
      if (sharded) releaseUnit(u);
    }
  }
  auto mean = torch::full({1}, batches > 0 ? sum / static_cast<double>(batches) : 0.0, torch::kFloat64);
  comm().allreduce(reduceOver, mean);
  return mean.item<double>() / comm().size(reduceOver);
}

}  // namespace edit
