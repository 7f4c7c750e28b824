#include "trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <filesystem>
#include <sstream>
#include <thread>

#include "checkpoint.h"

#ifdef EDIT_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#endif

namespace edit {

std::atomic<bool> gTerminateRequested{false};

struct Trainer::StepOutcome {
  double loss = 0;
  bool synced = false;
  double syncWork = 0;  // seconds of sync work on the communication stream
  double pseudoGradNormSq = 0;
  uint64_t anomalies = 0;
};

Trainer::Trainer(Config cfg, MeshSpec mesh, TrainerHooks hooks)
    : cfg_(std::move(cfg)), mesh_(std::move(mesh)), hooks_(std::move(hooks)) {}

Trainer::~Trainer() = default;

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

bool Trainer::isLocalMode() const { return cfg_.algorithm.mode != "ddp"; }

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
    log("joining the running job as a replacement for rank " + std::to_string(mesh_.rank));
    rendezvous_->join(cfg_.runtime.rendezvousTimeoutSeconds, gTerminateRequested);
  }
  comm_ = std::make_unique<Comm>(mesh_, rendezvous_->store(), rendezvous_->prefix());
  stream_ = std::make_unique<CommStream>(*comm_, mesh_.device);
  units_ = buildUnits(shape_, comm_->shards(), comm_->shard(), cfg_.training.seed, device_);
  detectors_.assign(units_.size(), EwmaDetector{});
  adam_ = std::make_unique<ShardedAdamW>(cfg_.training, units_);
  sync_ = syncSettingsFor(cfg_.algorithm);
  rope_ = makeRope(shape_, cfg_.data.seqLen);
  rope_ = {rope_.cos.to(device_), rope_.sin.to(device_)};

  // Every replica must start from the same weights (a classic bug of Local-SGD ports):
  // compare a fingerprint of this rank's slices across the sync group. (A replacement's
  // weights come from its peers instead.)
  if (!mesh_.join) {
    torch::NoGradGuard ng;
    double fp = 0;
    for (auto& u : units_) fp += u.shardView.to(torch::kFloat64).sum().item<double>();
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
    auto outer = offload ? u.shardView.to(torch::kCPU).pin_memory() : u.shardView.clone();
    outer_.push_back({outer, torch::zeros_like(outer)});
  }
  outerReady_ = true;
  lastSyncTime_ = nowSeconds();
  stepsSinceSync_ = 0;
  roundStep_ = step_;
  inRound_ = false;
}

bool Trainer::syncDue(int64_t t) {
  const auto& a = cfg_.algorithm;
  if (!isLocalMode() || t <= a.warmupSteps || t == skipSyncAt_) return false;
  if (a.mode != "a-edit") return (t - a.warmupSteps) % a.syncInterval == 0;
  // A-EDiT: time-based, but every rank of a replica must decide alike: agree on the
  // largest elapsed time in the shard group (its ranks step in lockstep anyway).
  auto elapsed = torch::full({1}, nowSeconds() - lastSyncTime_, torch::kFloat64);
  comm_->allreduce(Group::Shard, elapsed, c10d::ReduceOp::MAX);
  if (a.maxStepsPerSync > 0 && stepsSinceSync_ >= a.maxStepsPerSync) return true;
  return elapsed.item<double>() >= a.syncSeconds && stepsSinceSync_ >= a.minStepsPerSync;
}

Trainer::Control Trainer::exchangeControl(int64_t t) {
  // One tiny world all-gather at points every rank reaches in the same order: each step
  // of a synchronous phase, or each sync round of a local phase.
  Control c;
  const bool stop = stopRequested_ || gTerminateRequested;
  auto mine = torch::tensor({stop ? 1.0 : 0.0, checkpointRequested_ ? 1.0 : 0.0,
                             static_cast<double>(t)}, torch::kFloat64);
  const int W = comm_->world();
  auto all = torch::empty({W, 3}, torch::kFloat64);
  std::vector<torch::Tensor> outs;
  for (int r = 0; r < W; ++r) outs.push_back(all[r]);
  comm_->allgather(Group::World, mine, outs);
  auto acc = all.accessor<double, 2>();
  for (int r = 0; r < W; ++r) {
    c.stop = c.stop || acc[r][0] > 0;
    c.checkpoint = c.checkpoint || acc[r][1] > 0;
    if (r % comm_->shards() == 0) c.replicaSteps += static_cast<int64_t>(acc[r][2]);
  }
  checkpointRequested_ = false;
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
  if (c.replica != comm_->replica() || static_cast<int64_t>(syncRounds_) + 1 != c.atSync) return;
  torch::NoGradGuard ng;
  auto gen = at::detail::createCPUGenerator(cfg_.training.seed + 977 * mesh_.rank);
  for (auto& u : units_) {
    if (c.nan) {
      u.shardView[0] = std::numeric_limits<float>::quiet_NaN();
      continue;
    }
    const double rms = u.shardView.pow(2).mean().sqrt().item<double>();
    u.shardView.add_((torch::randn({u.chunk}, gen) * (c.scale * rms)).to(device_));
  }
  log("debug.corruptReplica: corrupted replica " + std::to_string(c.replica) +
      " before sync round " + std::to_string(c.atSync));
}

void Trainer::syncWholeModel(StepOutcome& out) {
  // DiLoCo / post-local SGD / the end of training: every unit at the step boundary.
  std::vector<Pending> fs;
  std::vector<UnitSyncResult> res(units_.size());
  const double t0 = nowSeconds();
  for (size_t u = 0; u < units_.size(); ++u)
    fs.push_back(stream_->enqueue([this, u, &res] {
      res[u] = syncUnit(*comm_, units_[u], outer_[u], detectors_[u], sync_, stepsSinceSync_);
      ++roundUnitsSynced_;
    }));
  for (auto& f : fs) stream_->wait(f, Group::Sync, "sync");
  out.syncWork += nowSeconds() - t0;
  for (auto& r : res) {
    out.pseudoGradNormSq += r.averagedNorm * r.averagedNorm;
    out.anomalies += r.anomaly;
  }
  out.synced = true;
}

void Trainer::gatherAll() {
  if (comm_->shards() == 1) return;
  torch::NoGradGuard ng;
  for (auto& u : units_) {
    auto chunks = u.fullChunks();
    comm_->allgather(Group::Shard, u.shardView.clone(), chunks);
  }
}

double Trainer::trainStep(int64_t t, bool sync, StepOutcome& out) {
  const bool layerwise = sync && (cfg_.algorithm.mode == "edit" || cfg_.algorithm.mode == "a-edit");
  if (sync && !layerwise) syncWholeModel(out);
  const size_t U = units_.size();
  const int N = comm_->shards();
  const bool prepareNeeded = layerwise || N > 1;
  std::vector<UnitSyncResult> res(U);
  std::vector<double> syncWork(U, 0);

  auto prepare = [this, layerwise, N, &res, &syncWork](size_t u) {
    return stream_->enqueue([this, u, layerwise, N, &res, &syncWork] {
      if (layerwise) {
        const double t0 = nowSeconds();
        res[u] = syncUnit(*comm_, units_[u], outer_[u], detectors_[u], sync_, stepsSinceSync_);
        ++roundUnitsSynced_;
        syncWork[u] = nowSeconds() - t0;
      }
      if (N > 1) {
        auto chunks = units_[u].fullChunks();
        comm_->allgather(Group::Shard, units_[u].shardView.clone(), chunks);
      }
    });
  };

  trainSampler_->fill(static_cast<uint64_t>(t), inputs_.data(), targets_.data());
  const auto opts = torch::TensorOptions().dtype(torch::kInt64);
  auto tokens = torch::from_blob(inputs_.data(), {cfg_.data.batchSize, cfg_.data.seqLen}, opts).to(device_);
  auto targets = torch::from_blob(targets_.data(), {cfg_.data.batchSize, cfg_.data.seqLen}, opts).to(device_);

  for (auto& u : units_) u.zeroGrad();

  // Forward, unit by unit. Each unit's input is a detached leaf so that the backward can
  // run unit by unit too, and each unit's gradient reduction starts as soon as it is ready.
  std::vector<Pending> ready(U);
  std::vector<torch::Tensor> ins(U), outs(U);
  const std::string prepOp = layerwise ? "sync" : "allgather";
  const Group prepGroup = layerwise ? Group::Sync : Group::Shard;
  torch::Tensor loss;
  for (size_t u = 0; u < U; ++u) {
    if (prepareNeeded) {
      if (!ready[u].valid()) ready[u] = prepare(u);
      stream_->wait(ready[u], prepGroup, prepOp);
      if (cfg_.algorithm.prefetch && u + 1 < U) ready[u + 1] = prepare(u + 1);
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
  }

  // Backward in reverse; reduce each unit's gradient on the communication stream.
  const bool averageReplicas = synchronousAt(t) && comm_->replicas() > 1;
  const bool reduce = N > 1 || averageReplicas;
  std::vector<Pending> reduced;
  auto reduceGrad = [this, N, averageReplicas](size_t u) {
    return stream_->enqueue([this, u, N, averageReplicas] {
      auto& unit = units_[u];
      if (N > 1) {
        comm_->reduceScatterSum(Group::Shard, unit.grad);
        unit.gradShard.div_(N);
      }
      if (averageReplicas) {
        comm_->allreduce(Group::Sync, unit.gradShard);
        unit.gradShard.div_(comm_->replicas());
      }
    });
  };
  loss.backward();
  for (size_t u = U - 1; u-- > 0;) {
    if (reduce) reduced.push_back(reduceGrad(u + 1));
    outs[u].backward(ins[u + 1].grad());
  }
  if (reduce) reduced.push_back(reduceGrad(0));
  for (auto& f : reduced) stream_->wait(f, averageReplicas ? Group::Sync : Group::Shard,
                                        averageReplicas ? "allreduce" : "reduce_scatter");

  if (layerwise) {
    out.synced = true;
    for (size_t u = 0; u < U; ++u) {
      out.syncWork += syncWork[u];
      out.pseudoGradNormSq += res[u].averagedNorm * res[u].averagedNorm;
      out.anomalies += res[u].anomaly;
    }
  }

  // Clip the global gradient norm (over the whole model: slices summed over the shard
  // group), then the inner step. A non-finite norm skips the step instead of poisoning
  // the weights.
  torch::NoGradGuard ng;
  double sq = 0;
  for (auto& u : units_) sq += u.gradShard.pow(2).sum().item<double>();
  auto sqT = torch::full({1}, sq, torch::kFloat64);
  comm_->allreduce(Group::Shard, sqT);
  const double gnorm = std::sqrt(sqT.item<double>());
  if (!std::isfinite(gnorm)) {
    log("step " + std::to_string(t) + ": non-finite gradient norm, inner step skipped");
  } else {
    if (cfg_.training.gradClip > 0 && gnorm > cfg_.training.gradClip)
      for (auto& u : units_) u.gradShard.mul_(cfg_.training.gradClip / (gnorm + 1e-6));
    adam_->step(units_, learningRate(cfg_.training, t, totalSteps_));
  }
  return loss.item<double>();
}

double Trainer::evaluate(int64_t batches, Group reduceOver) {
  if (!valSampler_) return -1;
  torch::NoGradGuard ng;
  gatherAll();
  std::vector<int64_t> in(inputs_.size()), tg(inputs_.size());
  const auto opts = torch::TensorOptions().dtype(torch::kInt64);
  double sum = 0;
  for (int64_t b = 0; b < batches; ++b) {
    valSampler_->fill(static_cast<uint64_t>(b), in.data(), tg.data());
    auto x = torch::from_blob(in.data(), {cfg_.data.batchSize, cfg_.data.seqLen}, opts).to(device_);
    auto y = torch::from_blob(tg.data(), {cfg_.data.batchSize, cfg_.data.seqLen}, opts).to(device_);
    auto h = embedForward(units_[0].params, x);
    for (size_t u = 1; u + 1 < units_.size(); ++u) h = blockForward(units_[u].params, h, rope_, shape_);
    sum += headLoss(units_.back().params, h, y, shape_).item<double>();
  }
  auto mean = torch::full({1}, sum / static_cast<double>(batches), torch::kFloat64);
  comm_->allreduce(reduceOver, mean);
  return mean.item<double>() / comm_->size(reduceOver);
}

TrainResult Trainer::run() {
  const double start = nowSeconds();
  setup();
  TrainResult result;
  if (mesh_.join) {
    result.joined = true;
    restoreFromPeers(true, nullptr);
  } else if (!cfg_.checkpoint.dir.empty() && cfg_.checkpoint.resume && tryResume()) {
    result.resumedFrom = step_;
    roundStep_ = step_ - stepsSinceSync_;
  }
  if (isLocalMode() && step_ >= cfg_.algorithm.warmupSteps && !outerReady_) initOuter();
  const uint64_t tokensAtStart = tokens_;
  const auto& a = cfg_.algorithm;
  const bool aedit = a.mode == "a-edit";
  const int64_t budget = totalSteps_ * comm_->replicas();  // A-EDiT: replica-steps of the job
  double lastLoss = 0;

  for (;;) {
    try {
      const int64_t t = step_;
      if (!aedit && t >= totalSteps_) break;
      if (aedit && synchronousAt(t) && t >= totalSteps_) break;
      const double t0 = nowSeconds();
      const double wait0 = [&] {
        double w = 0;
        for (auto& [k, c] : comm_->counters()) w += c.waitSeconds;
        return w;
      }();
      if (isLocalMode() && t == a.warmupSteps && !outerReady_) initOuter();
      const bool sync = syncDue(t);
      bool finalRound = false;
      if (sync || synchronousAt(t)) {
        const Control c = exchangeControl(t);
        const int64_t id = aedit && !synchronousAt(t) ? c.replicaSteps / comm_->replicas() : t;
        controlId_ = id;
        if (c.stop) {
          log("stop requested: saving a checkpoint at step " + std::to_string(t));
          if (!cfg_.checkpoint.dir.empty()) saveCheckpoint(id);
          result.stopped = true;
          break;
        }
        const bool periodic = cfg_.checkpoint.everySteps > 0 && t > 0 &&
                              (aedit ? id / cfg_.checkpoint.everySteps >
                                           lastCheckpointId_ / cfg_.checkpoint.everySteps
                                     : t % cfg_.checkpoint.everySteps == 0);
        if (!cfg_.checkpoint.dir.empty() && (c.checkpoint || periodic) && id != lastCheckpointId_)
          saveCheckpoint(id);
        finalRound = aedit && sync && c.replicaSteps >= budget;
      } else if (!cfg_.checkpoint.dir.empty() && !aedit && cfg_.checkpoint.everySteps > 0 && t > 0 &&
                 t % cfg_.checkpoint.everySteps == 0 && t != lastCheckpointId_) {
        saveCheckpoint(t);
      }
      if (sync) beginRound(t);
      if (finalRound) {
        // A-EDiT's budget is spent: end on this synchronization, with no local step after it.
        StepOutcome out;
        syncWholeModel(out);
        ++syncRounds_;
        endRound(t);
        anomalies_ += out.anomalies;
        lastPseudoGradNorm_ = std::sqrt(out.pseudoGradNormSq);
        stepsSinceSync_ = 0;
        break;
      }
      killIfAsked(t);
      injectDelay(t);
      if (sync) corruptIfAsked();

      StepOutcome out;
      lastLoss = trainStep(t, sync, out);
      step_ = t + 1;
      tokens_ += static_cast<uint64_t>(cfg_.data.batchSize * cfg_.data.seqLen);
      if (out.synced) {
        ++syncRounds_;
        endRound(t);
        lastSyncTime_ = nowSeconds();
        stepsSinceSync_ = 0;
        lastPseudoGradNorm_ = std::sqrt(out.pseudoGradNormSq);
        anomalies_ += out.anomalies;
      }
      if (isLocalMode() && !synchronousAt(t)) ++stepsSinceSync_;

      if (cfg_.data.valEvery > 0 && step_ % cfg_.data.valEvery == 0 && !aedit)
        log("step " + std::to_string(step_) + " replica " + std::to_string(comm_->replica()) +
            " val_loss " + std::to_string(evaluate(cfg_.data.valBatches, Group::Shard)));

      if (hooks_.onStep) {
        StepReport r;
        r.rank = mesh_.rank;
        r.replica = comm_->replica();
        r.shard = comm_->shard();
        r.worldSize = mesh_.world;
        r.step = step_;
        r.totalSteps = totalSteps_;
        r.loss = lastLoss;
        r.tokens = tokens_;
        r.stepSeconds = nowSeconds() - t0;
        r.comm = comm_->counters();
        for (auto& [k, c] : r.comm) r.commWaitSeconds += c.waitSeconds;
        r.computeSeconds = std::max(0.0, r.stepSeconds - (r.commWaitSeconds - wait0));
        r.synced = out.synced;
        r.syncSeconds = out.syncWork;
        r.syncRounds = syncRounds_;
        r.anomalies = anomalies_;
        r.pseudoGradNorm = lastPseudoGradNorm_;
        r.lr = learningRate(cfg_.training, t, totalSteps_);
        r.phase = synchronousAt(t) ? "warmup" : (out.synced ? "sync" : "local");
        if (!isLocalMode()) r.phase = "sync";
        hooks_.onStep(r);
      }
    } catch (const PeerLost& e) {
      // A peer died or hung: in a local phase the survivors wait for its replacement and
      // continue from the last sync round; otherwise edit-train exits 75 (gang restart).
      if (!recoverInPlace(e, result)) throw;
    }
  }

  // Local modes end on synchronized weights: a last whole-model sync if local steps
  // were made since the previous one (A-EDiT's loop already ended on a sync).
  if (!result.stopped && isLocalMode() && outerReady_ && stepsSinceSync_ > 0 && !aedit) {
    StepOutcome out;
    syncWholeModel(out);
    ++syncRounds_;
    anomalies_ += out.anomalies;
    lastPseudoGradNorm_ = std::sqrt(out.pseudoGradNormSq);
  }
  if (!result.stopped) {
    result.valLoss = evaluate(cfg_.data.valBatches, Group::World);
    if (!cfg_.checkpoint.dir.empty()) {
      const int64_t id = aedit ? std::max(controlId_, lastCheckpointId_ + 1) : step_;
      if (id != lastCheckpointId_) saveCheckpoint(id);
    }
  }
  result.steps = step_;
  result.finalLoss = lastLoss;
  result.tokens = tokens_;
  result.tokensThisRun = tokens_ - tokensAtStart;
  result.seconds = nowSeconds() - start;
  result.syncRounds = syncRounds_;
  result.anomalies = anomalies_;
  result.comm = comm_->counters();
  return result;
}

}  // namespace edit
