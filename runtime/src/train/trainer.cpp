#include "train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <filesystem>
#include <sstream>
#include <thread>

#include "train/checkpoint.h"

#ifdef EDIT_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#endif

namespace edit {

std::atomic<bool> gTerminateRequested{false};
std::atomic<int> gScaleRequest{0};
std::atomic<int> gScaleTarget{0};

Trainer::Trainer(Config cfg, MeshSpec mesh, TrainerHooks hooks)
    : cfg_(std::move(cfg)), mode_(modeTraits(cfg_.algorithm.mode)), mesh_(std::move(mesh)), hooks_(std::move(hooks)) {}

Trainer::~Trainer() {
  // A round still in flight (an error ended the run) finishes or fails; none starts.
  if (roundStream_) roundStream_->abort();
}

void Trainer::log(const std::string& s) {
  if (hooks_.log) hooks_.log(s);
}

void Trainer::selectDevice() {
  // runtime.backend auto: NCCL on a GPU when this is a CUDA build and a GPU is visible.
  const std::string b = cfg_.runtime.backend;
  bool cuda = false;
#ifdef EDIT_WITH_CUDA
  cuda = b != "gloo" && torch::cuda::is_available();
#endif
  if (b == "nccl" && !cuda)
    throw ConfigError("runtime.backend: nccl needs a CUDA build (-DEDIT_WITH_CUDA=ON) and a visible GPU");
  mesh_.backend = cuda ? "nccl" : "gloo";
  if (cuda) {
    const char* lr = std::getenv("LOCAL_RANK");
    const int count = static_cast<int>(torch::cuda::device_count());
    mesh_.device = lr ? std::atoi(lr) % count : mesh_.rank % count;
    device_ = torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(mesh_.device));
#ifdef EDIT_WITH_CUDA
    c10::cuda::set_device(static_cast<c10::DeviceIndex>(mesh_.device));
#endif
  }
}

bool Trainer::isLocalMode() const { return mode_.clock != SyncClock::EveryStep; }

const char* Trainer::whyNotScalable() const {
  return !isLocalMode() ? "a local mode (edit, a-edit, diloco or localsgd): ddp has no sync rounds"
         : cfg_.runtime.recovery != "inPlace"
             ? "runtime.recovery inPlace (a scale re-forms the world like an in-place recovery)"
         : overlap_                ? "algorithm.overlapSteps 0"
         : mesh_.backend == "nccl" ? "the Gloo backend (the NCCL path of a re-formed world has not run)"
                                   : nullptr;
}

bool Trainer::synchronousAt(int64_t t) const {
  return !isLocalMode() || t < cfg_.algorithm.warmupSteps;
}

void Trainer::setup() {
  shape_ = shapeOf(cfg_.model);
  selectDevice();
  rendezvous_ = std::make_unique<Rendezvous>(mesh_);
  // A replacement meets the survivors in the next recovery generation; everyone else
  // forms generation 0.
  if (mesh_.join) {
    log(mesh_.scaleJoin ? "joining the running job as rank " + std::to_string(mesh_.rank) + " of a new replica"
                        : "joining the running job as a replacement for rank " + std::to_string(mesh_.rank));
    rendezvous_->join(cfg_.runtime.rendezvousTimeoutSeconds, gTerminateRequested);
    takeGenerationSize();
  }
  comm_ = std::make_unique<Comm>(mesh_, rendezvous_->store(), rendezvous_->prefix());
  overlap_ = cfg_.algorithm.overlapSteps > 0 && isLocalMode();
  if (overlap_) {
    if (mesh_.backend == "nccl")
      throw ConfigError("algorithm.overlapSteps: runs on Gloo only (its NCCL path has not run yet); set it to "
                        "0 or use runtime.backend gloo");
    // The rounds in flight get process groups and a thread of their own, so their
    // collectives never interleave with the step's all-gathers on the shard group.
    roundComm_ = std::make_unique<Comm>(mesh_, rendezvous_->store(), rendezvous_->prefix() + "overlap/");
    roundStream_ = std::make_unique<CommStream>(*roundComm_, mesh_.device);
  }
  if (const char* needs = whyNotScalable(); needs && !mesh_.scaleAt.empty())
    throw ConfigError(std::string("EDIT_SCALE_AT (edit-run --scale-at) needs ") + needs);
  rendezvous_->formed(postsArrivals());  // the groups are formed (dist/rendezvous.h)
  stream_ = std::make_unique<CommStream>(*comm_, mesh_.device);
  units_ = buildUnits(shape_, comm_->shards(), comm_->shard(), cfg_.training.seed, device_);
  prefetchDepth_ = cfg_.algorithm.prefetch ? 1 : 0;
  reshardAfterForward_ = cfg_.runtime.reshardAfterForward;
  // Enough cached buffers per size for the units in flight at once (the one computing,
  // those prefetched, and a gradient being reduced), so a step allocates nothing.
  buffers_ = std::make_unique<BufferCache>(
      torch::TensorOptions().dtype(torch::kFloat32).device(device_), prefetchDepth_ + 2);
  memoryPlan_ = planMemory(shape_, comm_->shards(), isLocalMode(), reshardAfterForward_, prefetchDepth_, overlap_);
  if (mesh_.rank == 0) {
    auto mb = [](int64_t b) { return std::to_string((b + 500000) / 1000000) + " MB"; };
    const auto& m = memoryPlan_;
    log("memory per rank (docs/memory.md): state " + mb(m.state()) + " (parameters " + mb(m.parameters) +
        ", gradients " + mb(m.gradients) + ", AdamW " + mb(m.optimizer) + ", outer " + mb(m.outer) +
        ", overlapped round " + mb(m.overlap) +
        "), full-size buffers at most " + mb(m.buffers) + ", plus activations");
  }
  detectors_.assign(units_.size(), EwmaDetector{});
  adam_ = std::make_unique<ShardedAdamW>(cfg_.training, units_);
  sync_ = syncSettingsFor(cfg_.algorithm);
  rope_ = makeRope(shape_, cfg_.data.seqLen).to(device_);

  // Every replica must start from the same weights (a classic bug of Local-SGD ports):
  // compare a fingerprint of this rank's slices across the sync group. (A replacement's
  // weights come from its peers instead.)
  if (!mesh_.join) {
    torch::NoGradGuard ng;
    double fp = 0;
    for (auto& u : units_) fp += u.slice.sum(torch::kFloat64).item<double>();
    auto hi = torch::full({1}, fp, torch::kFloat64), lo = torch::full({1}, -fp, torch::kFloat64);
    comm_->allreduce(Group::Sync, hi, c10d::ReduceOp::MAX);
    comm_->allreduce(Group::Sync, lo, c10d::ReduceOp::MAX);
    if (hi.item<double>() != -lo.item<double>())
      throw std::runtime_error("replicas start from different weights (check training.seed)");
  }

  train_.emplace(data::TokenFile::open(cfg_.data.train));
  if (train_->maxToken() >= static_cast<uint32_t>(shape_.vocab))
    throw data::DataError(cfg_.data.train + ": token id " + std::to_string(train_->maxToken()) +
                          " does not fit model.vocabSize " + std::to_string(shape_.vocab) +
                          " (raise model.vocabSize)");
  trainSampler_ = std::make_unique<data::BatchSampler>(*train_, cfg_.data.seqLen, cfg_.data.batchSize,
                                                       cfg_.training.seed, mesh_.rank);
  if (!cfg_.data.val.empty()) {
    val_.emplace(data::TokenFile::open(cfg_.data.val));
    if (val_->maxToken() >= static_cast<uint32_t>(shape_.vocab))
      throw data::DataError(cfg_.data.val + ": token ids do not fit model.vocabSize");
    valSampler_ = std::make_unique<data::BatchSampler>(*val_, cfg_.data.seqLen, cfg_.data.batchSize,
                                                       cfg_.training.seed ^ 0x5eed, mesh_.rank);
  }
  inputs_.resize(cfg_.data.batchSize * cfg_.data.seqLen);
  targets_.resize(inputs_.size());

  totalSteps_ = cfg_.training.steps;
  if (cfg_.training.tokens > 0) {
    const int64_t perStep = static_cast<int64_t>(mesh_.world) * cfg_.data.batchSize * cfg_.data.seqLen;
    totalSteps_ = std::max<int64_t>(1, (cfg_.training.tokens + perStep - 1) / perStep);
  }
}

void Trainer::initOuter() {
  torch::NoGradGuard ng;
  outer_.clear();
  const bool offload = cfg_.algorithm.offloadOuterState && device_.is_cuda();
  for (auto& u : units_) {
    auto outer = offload ? u.slice.to(torch::kCPU).pin_memory() : u.slice.clone();
    outer_.push_back({outer, torch::zeros_like(outer)});
    if (sync_.codec.on()) {
      outer_.back().residual = torch::zeros_like(outer);
      outer_.back().averageResidual = torch::zeros({ownedPart(outer.numel())}, outer.options());
    }
  }
  outerReady_ = true;
  lastSyncTime_ = nowSeconds();
  stepsSinceSync_ = 0;
  roundStep_ = step_;
  inRound_ = false;
}

void Trainer::takeGenerationSize() {
  const int world = rendezvous_->world();
  if (world == mesh_.world) return;
  log("the running job has " + std::to_string(world / mesh_.shards) + " replicas, not the " +
      std::to_string(mesh_.replicas) + " of this worker's environment (a scale ended meanwhile): joining at " +
      std::to_string(world / mesh_.shards));
  mesh_.world = world;
  mesh_.replicas = world / mesh_.shards;
}

bool Trainer::syncDue(int64_t t) {
  const auto& a = cfg_.algorithm;
  if (!isLocalMode() || t <= a.warmupSteps || t == skipSyncAt_) return false;
  // No local step since the last round (a run resumed from its final checkpoint, which
  // ended on a round): nothing to synchronize. A round of zero pseudo-gradients would
  // still feed its zero norms to the anomaly statistics and reset the stall count.
  if (mode_.clock == SyncClock::Steps) return stepsSinceSync_ > 0 && (t - a.warmupSteps) % a.syncInterval == 0;
  // A-EDiT: time-based, in two parts (docs/algorithm.md, "A-EDiT's rounds").
  // Arrival: the window is over at the step boundary nearest the deadline: now, unless the
  // next one (a step away, by this replica's recent local steps) is nearer. The replica
  // then posts its arrival on the job's store.
  // Start: the round starts once every replica has arrived. Until then an arrived replica
  // keeps making local steps instead of waiting in the round's first collective for a
  // slower one, so a straggler costs the others at most part of one of their own steps.
  // Every rank of a replica must decide alike: the shard group agrees on the largest
  // elapsed time, step time and arrival count (its ranks step in lockstep anyway).
  const std::string counter = "arrive/" + std::to_string(syncRounds_ + 1);
  const std::string key = rendezvous_->prefix() + counter;
  const bool arrived = arrivedKey_ == key;
  const double mine = arrived && comm_->shard() == 0 ? static_cast<double>(comm_->addCounter(counter, 0)) : 0.0;
  auto v = torch::tensor({nowSeconds() - lastSyncTime_, localStepSeconds_, mine}, torch::kFloat64);
  comm_->allreduce(Group::Shard, v, c10d::ReduceOp::MAX);
  const double elapsed = v[0].item<double>(), step = v[1].item<double>();
  int64_t here = static_cast<int64_t>(v[2].item<double>());
  const bool capped = a.maxStepsPerSync > 0 && stepsSinceSync_ >= a.maxStepsPerSync;
  if (!arrived) {
    if (!capped && (elapsed + 0.5 * step < a.syncSeconds || stepsSinceSync_ < a.minStepsPerSync)) return false;
    arrivedKey_ = key;
    auto n = torch::full({1}, comm_->shard() == 0 ? static_cast<double>(comm_->addCounter(counter, 1)) : 0.0,
                         torch::kFloat64);
    comm_->allreduce(Group::Shard, n, c10d::ReduceOp::MAX);
    here = static_cast<int64_t>(n.item<double>());
  }
  // Wait in the round's collectives instead once the step cap is reached, or after one
  // more window: a replica that never arrives (dead, or hung) is then found by the
  // collectives' timeout, as in every other mode.
  if (here >= comm_->replicas() || capped || elapsed >= 2 * a.syncSeconds) return true;
  ++stepsAwaitingRound_;
  return false;
}

Trainer::Control Trainer::exchangeControl(int64_t t) {
  // One tiny world all-gather at points every rank reaches in the same order: each step
  // of a synchronous phase, or each sync round of a local phase.
  Control c;
  // A scale asked of rank 0: the operator's target (telemetry SCALE), else a step from
  // SIGUSR1/SIGUSR2 (edit-run sends them to rank 0 only). A target the job has already
  // (or will have after the scale agreed before) asks nothing: the operator may resend it
  // until the reports show it done.
  double replicas = 0;
  if (mesh_.rank == 0) {
    const int delta = gScaleRequest.exchange(0), target = gScaleTarget.exchange(0);
    if (target > 0) {
      if (target != (pendingReplicas_ > 0 ? pendingReplicas_ : comm_->replicas())) replicas = target;
    } else if (delta != 0) {
      replicas = std::max(1, comm_->replicas() + delta);
    }
  }
  auto mine = torch::tensor({stopRequested_ ? 1.0 : 0.0, checkpointRequested_ ? 1.0 : 0.0,
                             static_cast<double>(t), gTerminateRequested ? 1.0 : 0.0, replicas}, torch::kFloat64);
  const int W = comm_->world();
  auto all = torch::empty({W, 5}, torch::kFloat64);
  std::vector<torch::Tensor> outs;
  for (int r = 0; r < W; ++r) outs.push_back(all[r]);
  comm_->allgather(Group::World, mine, outs);
  auto acc = all.accessor<double, 2>();
  int terminated = 0;
  for (int r = 0; r < W; ++r) {
    c.stop = c.stop || acc[r][0] > 0;
    c.checkpoint = c.checkpoint || acc[r][1] > 0;
    if (r % comm_->shards() == 0) c.replicaSteps += static_cast<int64_t>(acc[r][2]);
    terminated += acc[r][3] > 0 ? 1 : 0;
    c.replicas = std::max(c.replicas, static_cast<int>(acc[r][4]));
  }
  checkpointRequested_ = false;
  if (c.replicas > 0) {
    // Every rank decides alike: the scale runs right after this step's round (or the first
    // round, in the synchronous warm-up), or not at all.
    if (const char* needs = whyNotScalable()) {
      if (c.replicas != ignoredReplicas_)  // once: the operator resends its target
        log("scale to " + std::to_string(c.replicas) + " replicas asked: ignored, it needs " + needs);
      ignoredReplicas_ = c.replicas;
    } else if (c.replicas == comm_->replicas()) {
      // Back to this size before the agreed scale ran (or -USR2 at one replica).
      log("scale to " + std::to_string(c.replicas) + " replicas asked: the job has " + std::to_string(c.replicas) +
          (pendingReplicas_ > 0 ? ", the scale to " + std::to_string(pendingReplicas_) + " is cancelled" : " already"));
      pendingReplicas_ = 0;
    } else {
      if (c.replicas != pendingReplicas_)
        log("scale to " + std::to_string(c.replicas) + " replicas asked: after the next sync round");
      pendingReplicas_ = c.replicas;
    }
  }
  // SIGTERM on every rank (Ctrl-C, a suspended or deleted job) stops the gang after a
  // checkpoint. On some ranks only (their pods were deleted or evicted) those ranks leave
  // and the others recover in place around their replacements, where that is possible;
  // but only once the same holds at a second exchange, because a whole gang's signals
  // arrive spread out and one exchange can fall between them.
  const bool inPlace = cfg_.runtime.recovery == "inPlace" && isLocalMode() && !synchronousAt(t) && outerReady_ &&
                       mesh_.backend != "nccl";
  if (terminated == W || (terminated > 0 && !inPlace)) {
    c.stop = true;
  } else if (terminated > 0 && !c.stop) {
    if (++partialTermExchanges_ >= 2 && acc[mesh_.rank][3] > 0)
      throw LeftAlone("SIGTERM reached " + std::to_string(terminated) + " of " + std::to_string(W) +
                      " workers: leaving alone, the others recover in place");
  } else {
    partialTermExchanges_ = 0;
  }
  return c;
}

void Trainer::injectDelay(int64_t t) {
  const auto& d = cfg_.debug.injectStepDelay;
  if (d.seconds <= 0) return;
  int slow = d.rank;
  if (d.random) slow = static_cast<int>(data::mix64(cfg_.training.seed ^ data::mix64(t)) % mesh_.world);
  if (slow == mesh_.rank)
    std::this_thread::sleep_for(std::chrono::duration<double>(d.seconds));
}

void Trainer::corruptIfAsked() {
  const auto& c = cfg_.debug.corruptReplica;
  const int64_t round = static_cast<int64_t>(syncRounds_) + 1;  // the round about to run
  if (c.replica != comm_->replica() || round < c.atSync || (round - c.atSync) % c.every != 0 ||
      (round - c.atSync) / c.every >= c.rounds)
    return;
  torch::NoGradGuard ng;
  auto gen = at::detail::createCPUGenerator(cfg_.training.seed + 977 * mesh_.rank + round);
  for (size_t i = 0; i < units_.size(); ++i) {
    auto& u = units_[i];
    if (c.nan) {
      u.slice[0] = std::numeric_limits<float>::quiet_NaN();
    } else if (c.kind == "pseudoGradient") {
      // theta := outer - scale (outer - theta): the replica's pseudo-gradient times scale.
      // Overlapped, the round started from base_ (outer_ may be changing on its thread).
      auto outer = overlap_ && inflight_[i].valid() ? base_[i] : outer_[i].outer.to(u.slice.device());
      u.slice.sub_(outer).mul_(c.scale).add_(outer);
    } else {
      const double rms = u.slice.pow(2).mean().sqrt().item<double>();
      u.slice.add_((torch::randn({u.chunk}, gen) * (c.scale * rms)).to(device_));
    }
  }
  log("debug.corruptReplica: corrupted replica " + std::to_string(c.replica) + " (" +
      (c.nan ? std::string("nan") : c.kind + " x" + std::to_string(c.scale)) + ") before sync round " +
      std::to_string(round));
}

void Trainer::syncWholeModel(StepOutcome& out, bool overlapped) {
  // DiLoCo / post-local SGD / the end of training: every unit at the step boundary.
  std::vector<Pending> fs;
  std::vector<UnitSyncResult> res(units_.size());
  const double t0 = nowSeconds();
  for (size_t u = 0; u < units_.size(); ++u)
    fs.push_back(stream_->enqueue([this, u, &res, overlapped] {
      killIfAsked(roundBeginStep_, static_cast<int>(u));
      res[u] = overlapped ? overlapRound(u)
                          : syncUnit(*comm_, units_[u], outer_[u], detectors_[u], sync_, stepsSinceSync_);
      ++roundUnitsSynced_;
    }));
  for (auto& f : fs) stream_->wait(f, Group::Sync, "sync");
  out.syncWork += nowSeconds() - t0;
  noteRound(res, out);
}

Pending Trainer::prepareUnit(size_t u, bool syncFirst, std::vector<UnitSyncResult>* res,
                             std::vector<double>* syncWork) {
  // The buffer is taken here, on the training thread: on a GPU the task's stream waits for
  // the training stream's work queued so far, which includes every use of a buffer given
  // back before this point.
  auto& unit = units_[u];
  torch::Tensor buffer;
  if (unit.sharded()) buffer = buffers_->take(unit.padded);
  return stream_->enqueue([this, u, syncFirst, res, syncWork, buffer]() mutable {
    auto& unit = units_[u];
    if (syncFirst) {
      killIfAsked(roundBeginStep_, static_cast<int>(u));
      const double t0 = nowSeconds();
      (*res)[u] = overlap_ ? overlapRound(u) : syncUnit(*comm_, unit, outer_[u], detectors_[u], sync_, stepsSinceSync_);
      ++roundUnitsSynced_;
      (*syncWork)[u] = nowSeconds() - t0;
    }
    if (buffer.defined()) {
      comm_->allgatherInto(Group::Shard, unit.slice, buffer);
      attachFull(unit, std::move(buffer));
    }
  });
}

void Trainer::releaseUnit(size_t u) { buffers_->give(detachFull(units_[u])); }

void Trainer::releaseAll() {
  for (size_t u = 0; u < units_.size(); ++u) {
    releaseUnit(u);
    if (units_[u].sharded()) units_[u].unbindGrads();
  }
}

double Trainer::trainStep(int64_t t, bool sync, StepOutcome& out) {
  const bool layerwise = sync && mode_.layerwise;
  if (sync && !layerwise) syncWholeModel(out, overlap_);
  const size_t U = units_.size();
  const int N = comm_->shards();
  const bool sharded = N > 1;
  const size_t depth = static_cast<size_t>(prefetchDepth_);
  std::vector<UnitSyncResult> res(U);
  std::vector<double> syncWork(U, 0);

  trainSampler_->fill(static_cast<uint64_t>(t), inputs_.data(), targets_.data());
  const auto opts = torch::TensorOptions().dtype(torch::kInt64);
  auto tokens = torch::from_blob(inputs_.data(), {cfg_.data.batchSize, cfg_.data.seqLen}, opts).to(device_);
  auto targets = torch::from_blob(targets_.data(), {cfg_.data.batchSize, cfg_.data.seqLen}, opts).to(device_);

  // Forward, unit by unit: wait for unit u's preparation (layer-wise sync on a sync step,
  // then the all-gather), keep `depth` units prepared ahead, and release unit u's
  // parameters once its forward is done (ZeRO-3; not the last unit, whose backward comes
  // next). Each unit's input is a detached leaf so the backward can run unit by unit too.
  std::vector<Pending> ready(U);
  const bool prepare = layerwise || sharded;
  auto ensure = [&](size_t u) {
    if (prepare && u < U && !ready[u].valid()) ready[u] = prepareUnit(u, layerwise, &res, &syncWork);
  };
  std::vector<torch::Tensor> ins(U), outs(U);
  const std::string prepOp = layerwise ? "sync" : "allgather";
  const Group prepGroup = layerwise ? Group::Sync : Group::Shard;
  torch::Tensor loss;
  for (size_t u = 0; u < U; ++u) {
    if (prepare) {
      for (size_t k = u; k <= u + depth; ++k) ensure(k);
      stream_->wait(ready[u], prepGroup, prepOp);
    }
    const auto& p = units_[u].params;
    if (u == 0) {
      outs[u] = embedForward(p, tokens);
    } else {
      ins[u] = outs[u - 1].detach().requires_grad_(true);
      if (u + 1 < U) {
        outs[u] = blockForward(p, ins[u], rope_, shape_);
      } else {
        loss = headLoss(p, ins[u], targets, shape_);
      }
    }
    if (sharded && reshardAfterForward_ && u + 1 < U) releaseUnit(u);
  }

  // Backward in reverse. Sharded: gather unit u again (prefetched `depth` ahead, in
  // reverse order), accumulate its gradient in a full-size buffer, release its
  // parameters, and reduce-scatter the buffer into gradSlice on the communication stream
  // while the backward goes on. Across replicas (ddp, warm-up) the slices are averaged.
  const bool averageReplicas = synchronousAt(t) && comm_->replicas() > 1;
  // (The last unit stays gathered from its forward; the embedding's backward needs only
  // the token ids.)
  auto regather = [&](size_t u) {
    return sharded && reshardAfterForward_ && u + 1 < U && backwardReadsParameters(units_[u].layout.kind);
  };
  std::vector<Pending> gathered(U), reduced;
  auto ensureBack = [&](size_t u) {
    if (regather(u) && !gathered[u].valid()) gathered[u] = prepareUnit(u, false, nullptr, nullptr);
  };
  // Across replicas the gradient slices are all-reduced in buckets of neighbouring units
  // (runtime.bucketMB): a bucket goes once its lowest unit is reduced inside the replica,
  // so small units share one collective and large ones still overlap the backward.
  // At a bucket's lowest unit: one past its highest unit; elsewhere 0 (no collective yet).
  // Under algorithm.syncCompression the warm-up's average is compressed unit by unit
  // (compressedMean: the slow link between replicas is why compression is on), so each
  // unit is its own bucket.
  std::vector<size_t> bucketEnd(U, 0);
  const bool compressed = averageReplicas && isLocalMode() && sync_.codec.on();
  if (averageReplicas) {
    const int64_t limit = compressed ? 1 : std::max<int64_t>(1, cfg_.runtime.bucketMB << 20) / 4;
    size_t hi = U;
    int64_t size = 0;
    for (size_t u = U; u-- > 0;) {
      size += units_[u].chunk;
      if (size >= limit || u == 0) {
        bucketEnd[u] = hi;
        hi = u;
        size = 0;
      }
    }
  }
  auto reduceGrad = [this, N, averageReplicas, compressed, &bucketEnd](size_t u, torch::Tensor grad) {
    return stream_->enqueue([this, u, N, averageReplicas, compressed, grad, end = bucketEnd[u]]() mutable {
      auto& unit = units_[u];
      if (grad.defined()) {
        comm_->reduceScatterSum(Group::Shard, grad);
        unit.gradSlice.copy_(grad.narrow(0, unit.shard * unit.chunk, unit.chunk)).div_(N);
        waitForDeviceWork(grad);  // before the buffer can be reused by the training stream
        buffers_->give(std::move(grad));
      }
      if (averageReplicas && end > u) {
        const auto& last = units_[end - 1];
        auto bucket = unit.gradArena.narrow(0, unit.gradOffset, last.gradOffset + last.chunk - unit.gradOffset);
        if (compressed) {
          compressedMean(*comm_, bucket, sync_.codec, sync_.block);
        } else {
          comm_->allreduce(Group::Sync, bucket);
          bucket.div_(comm_->replicas());
        }
      }
    });
  };
  const bool reduce = sharded || averageReplicas;
  // Unsharded, the parameters' .grad are views of gradSlice; it was the sync's scratch
  // during the forward.
  if (!sharded) units_[0].gradArena.zero_();
  for (size_t u = U; u-- > 0;) {
    if (u + 1 < U) {
      for (size_t k = 0; k <= depth && k <= u; ++k) ensureBack(u - k);
      if (regather(u)) stream_->wait(gathered[u], Group::Shard, "allgather");
    } else {
      for (size_t k = 1; k <= depth && k <= u; ++k) ensureBack(u - k);
    }
    torch::Tensor grad;
    if (sharded) {
      grad = buffers_->take(units_[u].padded).zero_();
      units_[u].bindGrads(grad);
    }
    if (u + 1 == U) {
      loss.backward();
    } else {
      outs[u].backward(ins[u + 1].grad());
    }
    if (sharded) {
      units_[u].unbindGrads();
      releaseUnit(u);
    }
    if (reduce) reduced.push_back(reduceGrad(u, std::move(grad)));
  }
  const char* reduceOp = !averageReplicas ? "reduce_scatter" : compressed ? "compressed_mean" : "allreduce";
  for (auto& f : reduced) stream_->wait(f, averageReplicas ? Group::Sync : Group::Shard, reduceOp);

  if (layerwise) {
    for (size_t u = 0; u < U; ++u) out.syncWork += syncWork[u];
    noteRound(res, out);
  }

  // Clip the global gradient norm (over the whole model: slices summed over the shard
  // group), then the inner step. A non-finite norm skips the step instead of poisoning
  // the weights.
  torch::NoGradGuard ng;
  const auto& arena = units_[0].gradArena;  // every unit's slice; the padding is zero
  auto sqT = arena.dot(arena).to(torch::kFloat64).reshape({1});
  comm_->allreduce(Group::Shard, sqT);
  const double gnorm = std::sqrt(sqT.item<double>());
  if (!std::isfinite(gnorm)) {
    log("step " + std::to_string(t) + ": non-finite gradient norm, inner step skipped");
  } else {
    if (cfg_.training.gradClip > 0 && gnorm > cfg_.training.gradClip)
      units_[0].gradArena.mul_(cfg_.training.gradClip / (gnorm + 1e-6));
    adam_->step(units_, lrAt(t));
  }
  return loss.item<double>();
}

double Trainer::evaluate(int64_t batches, Group reduceOver) {
  if (!valSampler_) return -1;
  torch::NoGradGuard ng;
  // Unit by unit over a group of batches: each unit is gathered once per group (the next
  // one prefetched) and released after, so the whole model is never materialised on a
  // rank; only the group's activations ([group, B, T, dim]) are kept.
  constexpr int64_t kGroup = 16;
  const size_t U = units_.size();
  const bool sharded = comm_->shards() > 1;
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
          if (!ready[k].valid()) ready[k] = prepareUnit(k, false, nullptr, nullptr);
        stream_->wait(ready[u], Group::Shard, "allgather");
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
  comm_->allreduce(reduceOver, mean);
  return mean.item<double>() / comm_->size(reduceOver);
}

}  // namespace edit
