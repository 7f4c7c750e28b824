// Saving and resuming the full training state of one rank (see checkpoint.h).
#include <filesystem>

#include "train/checkpoint.h"
#include "train/trainer.h"

namespace edit {

static torch::Tensor scalar(double v) { return torch::full({1}, v, torch::kFloat64); }

void Trainer::saveCheckpoint(int64_t id) {
  // A checkpoint holds no round in flight: applying it first keeps the format and resume
  // as they are (the outer weights are then the start point of the current round).
  drainOverlap();
  torch::NoGradGuard ng;
  const double t0 = nowSeconds();
  const std::string dir = stepDirName(cfg_.checkpoint.dir, id);
  std::filesystem::create_directories(dir);
  NamedTensors t;
  t["meta/step"] = scalar(static_cast<double>(step_));
  t["meta/world"] = scalar(mesh_.world);
  t["meta/shards"] = scalar(mesh_.shards);
  t["meta/params"] = scalar(static_cast<double>(parameterCount(shape_)));
  t["meta/stepsSinceSync"] = scalar(static_cast<double>(stepsSinceSync_));
  t["meta/syncRounds"] = scalar(static_cast<double>(syncRounds_));
  t["meta/anomalies"] = scalar(static_cast<double>(anomalies_));
  t["meta/tokens"] = scalar(static_cast<double>(tokens_));
  t["meta/adamSteps"] = scalar(static_cast<double>(adam_->stepCount()));
  t["meta/outerReady"] = scalar(outerReady_ ? 1 : 0);
  t["meta/jobSteps"] = scalar(static_cast<double>(jobSteps_));
  t["meta/jobStepsAt"] = scalar(static_cast<double>(jobStepsAt_));
  for (size_t u = 0; u < units_.size(); ++u) {
    const std::string k = "unit" + std::to_string(u) + "/";
    t[k + "theta"] = units_[u].slice;
    t[k + "adam_m"] = adam_->m()[u];
    t[k + "adam_v"] = adam_->v()[u];
    t[k + "ewma"] = torch::tensor({detectors_[u].mean, detectors_[u].var,
                                   static_cast<double>(detectors_[u].count)}, torch::kFloat64);
    if (outerReady_) {
      t[k + "outer"] = outer_[u].outer;
      t[k + "momentum"] = outer_[u].momentum;
      if (outer_[u].residual.defined()) t[k + "residual"] = outer_[u].residual;
      if (outer_[u].averageResidual.defined()) t[k + "averageResidual"] = outer_[u].averageResidual;
    }
  }
  const uint32_t crc = writeCheckpointFile(rankFileName(dir, mesh_.rank), t);

  // Gather every rank's CRC; only then is the checkpoint complete (the manifest).
  const int W = comm_->world();
  auto mine = scalar(static_cast<double>(crc));
  auto all = torch::empty({W, 1}, torch::kFloat64);
  std::vector<torch::Tensor> outs;
  for (int r = 0; r < W; ++r) outs.push_back(all[r]);
  comm_->allgather(Group::World, mine, outs);
  if (mesh_.rank == 0) {
    Manifest m;
    m.step = id;
    m.world = W;
    for (int r = 0; r < W; ++r) m.crcs.push_back(static_cast<uint32_t>(all[r][0].item<double>()));
    m.configYaml = toYaml(cfg_);
    writeManifest(dir, m);
    pruneCheckpoints(cfg_.checkpoint.dir, cfg_.checkpoint.keep);
  }
  comm_->barrier(Group::World);
  lastCheckpointId_ = id;
  log("checkpoint " + dir + " saved in " + std::to_string(nowSeconds() - t0) + " s");
}

bool Trainer::tryResume() {
  // Candidates newest first; all ranks must load the same one, so each verifies its own
  // file and the world agrees (MIN) before anyone loads.
  const auto steps = completeCheckpointSteps(cfg_.checkpoint.dir);
  auto agreedCount = torch::full({1}, static_cast<double>(steps.size()), torch::kFloat64);
  comm_->allreduce(Group::World, agreedCount, c10d::ReduceOp::MIN);
  const auto n = static_cast<size_t>(agreedCount.item<double>());
  for (size_t i = 0; i < n; ++i) {
    const std::string dir = stepDirName(cfg_.checkpoint.dir, steps[i]);
    NamedTensors t;
    std::string why;
    try {
      const Manifest m = readManifest(dir);
      if (m.world != mesh_.world)
        throw CheckpointError(dir + ": written by " + std::to_string(m.world) +
                              " ranks, this run has " + std::to_string(mesh_.world));
      const std::string file = rankFileName(dir, mesh_.rank);
      if (verifyCheckpointFile(file) != m.crcs[mesh_.rank])
        throw CheckpointError(file + ": does not match the manifest's checksum");
      t = readCheckpointFile(file);
      if (t.at("meta/shards").item<double>() != mesh_.shards ||
          t.at("meta/params").item<double>() != static_cast<double>(parameterCount(shape_)))
        throw CheckpointError(dir + ": model or sharding differs from this run's configuration");
    } catch (const std::exception& e) {
      why = e.what();
    }
    auto ok = torch::full({1}, why.empty() ? 1.0 : 0.0, torch::kFloat64);
    comm_->allreduce(Group::World, ok, c10d::ReduceOp::MIN);
    if (ok.item<double>() == 0) {
      log("skipping checkpoint " + dir + (why.empty() ? " (bad on another rank)" : ": " + why));
      continue;
    }
    torch::NoGradGuard ng;
    step_ = static_cast<int64_t>(t.at("meta/step").item<double>());
    stepsSinceSync_ = static_cast<int64_t>(t.at("meta/stepsSinceSync").item<double>());
    syncRounds_ = static_cast<uint64_t>(t.at("meta/syncRounds").item<double>());
    anomalies_ = static_cast<uint64_t>(t.at("meta/anomalies").item<double>());
    tokens_ = static_cast<uint64_t>(t.at("meta/tokens").item<double>());
    adam_->setStepCount(static_cast<int64_t>(t.at("meta/adamSteps").item<double>()));
    outerReady_ = t.at("meta/outerReady").item<double>() > 0;
    // Older checkpoints lack the job's progress: as if every replica were at this step.
    jobSteps_ = t.count("meta/jobSteps") ? static_cast<int64_t>(t.at("meta/jobSteps").item<double>())
                                         : step_ * mesh_.replicas;
    jobStepsAt_ = t.count("meta/jobStepsAt") ? static_cast<int64_t>(t.at("meta/jobStepsAt").item<double>()) : step_;
    outer_.clear();
    size_t residualsFound = 0;
    for (size_t u = 0; u < units_.size(); ++u) {
      const std::string k = "unit" + std::to_string(u) + "/";
      units_[u].slice.copy_(t.at(k + "theta"));
      adam_->m()[u].copy_(t.at(k + "adam_m"));
      adam_->v()[u].copy_(t.at(k + "adam_v"));
      auto e = t.at(k + "ewma");
      detectors_[u] = {e[0].item<double>(), e[1].item<double>(), static_cast<int64_t>(e[2].item<double>())};
      if (outerReady_) outer_.push_back({t.at(k + "outer").clone(), t.at(k + "momentum").clone()});
      // The error feedback of int8/int4 compression. Without one in the file (compression
      // switched on at this resume) it starts at zero, as at the first compressed round;
      // one in the file that this run does not compress with is dropped.
      if (outerReady_ && sync_.codec.on()) {
        const bool has = t.count(k + "residual") > 0;
        residualsFound += has;
        outer_.back().residual = has ? t.at(k + "residual").clone() : torch::zeros_like(outer_.back().outer);
        // The owned part's residual, when the file has one of this run's part size (the
        // parts follow the number of replicas and the block); otherwise from zero.
        const int64_t own = ownedPart(outer_.back().outer.numel());
        const bool hasAvg = t.count(k + "averageResidual") && t.at(k + "averageResidual").numel() == own;
        outer_.back().averageResidual =
            hasAvg ? t.at(k + "averageResidual").clone() : torch::zeros({own}, outer_.back().outer.options());
      }
    }
    if (outerReady_ && sync_.codec.on() && residualsFound == 0)
      log("checkpoint " + dir + " has no compression residual (written with algorithm.syncCompression none): starting from zero");
    if (outerReady_ && !sync_.codec.on() && t.count("unit0/residual"))
      log("checkpoint " + dir + " holds a compression residual; algorithm.syncCompression is none: dropped");
    // Non-local chunks of the gathered buffers are refreshed by the next all-gather;
    // with one shard the slice is the whole buffer.
    lastSyncTime_ = nowSeconds();
    lastCheckpointId_ = steps[i];
    controlId_ = steps[i];
    log("resumed from " + dir + " at step " + std::to_string(step_));
    return true;
  }
  return false;
}

}  // namespace edit
