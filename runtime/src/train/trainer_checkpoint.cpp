// Saving and resuming the full training state of one rank (see checkpoint.h).
#include <filesystem>

#include "train/checkpoint.h"
#include "train/trainer.h"

namespace edit {

static torch::Tensor scalar(double v) { return torch::full({1}, v, torch::kFloat64); }

void Trainer::saveCheckpoint(int64_t id) {
  // A checkpoint holds no round in flight: applying it first keeps the format and resume
  // as they are (the outer weights are then the start point of the current round).
  schedule_->drainOverlap();
  torch::NoGradGuard ng;
  const double t0 = nowSeconds();
  const std::string dir = stepDirName(cfg_.checkpoint.dir, id);
  std::filesystem::create_directories(dir);
  auto& units = engine_->units();
  auto& adam = engine_->adam();
  NamedTensors t;
  t["meta/step"] = scalar(static_cast<double>(progress_.step));
  t["meta/world"] = scalar(mesh_.world);
  t["meta/shards"] = scalar(mesh_.shards);
  t["meta/params"] = scalar(static_cast<double>(parameterCount(engine_->shape())));
  t["meta/tokens"] = scalar(static_cast<double>(progress_.tokens));
  t["meta/adamSteps"] = scalar(static_cast<double>(adam.stepCount()));
  t["meta/totalSteps"] = scalar(static_cast<double>(progress_.totalSteps));
  t["meta/budgetTokens"] = scalar(static_cast<double>(cfg_.training.tokens));
  for (size_t u = 0; u < units.size(); ++u) {
    const std::string k = "unit" + std::to_string(u) + "/";
    t[k + "theta"] = units[u].slice;
    t[k + "adam_m"] = adam.m()[u];
    t[k + "adam_v"] = adam.v()[u];
  }
  schedule_->save(t);  // the rounds' state: outer weights, momentum, detectors, counters
  const uint32_t crc = writeCheckpointFile(rankFileName(dir, mesh_.rank), t);

  // Gather every rank's CRC; only then is the checkpoint complete (the manifest).
  Comm& comm = *groups_.comm;
  const int W = comm.world();
  auto mine = scalar(static_cast<double>(crc));
  auto all = torch::empty({W, 1}, torch::kFloat64);
  std::vector<torch::Tensor> outs;
  for (int r = 0; r < W; ++r) outs.push_back(all[r]);
  comm.allgather(Group::World, mine, outs);
  if (mesh_.rank == 0) {
    Manifest m;
    m.step = id;
    m.world = W;
    for (int r = 0; r < W; ++r) m.crcs.push_back(static_cast<uint32_t>(all[r][0].item<double>()));
    m.configYaml = toYaml(cfg_);
    writeManifest(dir, m);
    pruneCheckpoints(cfg_.checkpoint.dir, cfg_.checkpoint.keep);
  }
  comm.barrier(Group::World);
  progress_.lastCheckpointId = id;
  log("checkpoint " + dir + " saved in " + std::to_string(nowSeconds() - t0) + " s");
}

namespace {

// One checkpoint this rank could resume from, as far as its own file tells.
struct ResumeCandidate {
  NamedTensors tensors;
  std::string why;      // empty: loadable here
  bool layout = false;  // another layout or model: the run is refused, not skipped
  int oldReplicas = 0;  // the replicas the checkpoint was written with
  int source = 0;       // the rank whose file this rank reads
};

// The checkpoint may have another number of replicas Mold than this run's M (a gang
// restarted after a scale, a suspended job resumed at another size), not another number
// of shards N or another model. Rank replica * N + shard reads the file of the same shard
// of replica (replica % Mold): the replicas the checkpoint has keep their own state, a new
// one continues from a copy of an existing replica's, and the replicas past M are dropped
// (with the local steps they made since their last sync round).
ResumeCandidate readCandidate(const std::string& dir, const MeshSpec& mesh, int64_t params) {
  const int N = mesh.shards, M = mesh.replicas;
  ResumeCandidate c;
  c.oldReplicas = M;
  c.source = mesh.rank;
  try {
    const Manifest m = readManifest(dir);
    const std::string thisRun = std::to_string(M) + " replicas x " + std::to_string(N) + " shards";
    const std::string rule = "; a resume can change the number of replicas, not the shards per replica";
    if (m.world % N != 0) {
      c.layout = true;
      throw CheckpointError(dir + ": written by " + std::to_string(m.world) + " ranks, not a whole number of " +
                            "replicas of " + std::to_string(N) + " shards (this run: " + thisRun + ")" + rule);
    }
    c.oldReplicas = m.world / N;
    c.source = (mesh.rank / N % c.oldReplicas) * N + mesh.rank % N;
    const std::string file = rankFileName(dir, c.source);
    if (verifyCheckpointFile(file) != m.crcs[c.source])
      throw CheckpointError(file + ": does not match the manifest's checksum");
    c.tensors = readCheckpointFile(file);
    const int fileShards = static_cast<int>(c.tensors.at("meta/shards").item<double>());
    const auto fileParams = static_cast<int64_t>(c.tensors.at("meta/params").item<double>());
    if (fileShards != N) {
      c.layout = true;
      throw CheckpointError(dir + ": written with " + std::to_string(m.world / std::max(1, fileShards)) +
                            " replicas x " + std::to_string(fileShards) + " shards, this run has " + thisRun + rule);
    }
    if (fileParams != params) {
      c.layout = true;
      throw CheckpointError(dir + ": written for a model of " + std::to_string(fileParams) +
                            " parameters, this run's model has " + std::to_string(params));
    }
  } catch (const std::exception& e) {
    c.why = e.what();
  }
  return c;
}

}  // namespace

bool Trainer::tryResume() {
  // Candidates newest first; all ranks must load the same one, so each verifies its own
  // file and the world agrees (MIN) before anyone loads.
  Comm& comm = *groups_.comm;
  const int64_t params = parameterCount(engine_->shape());
  const auto steps = completeCheckpointSteps(cfg_.checkpoint.dir);
  auto agreedCount = torch::full({1}, static_cast<double>(steps.size()), torch::kFloat64);
  comm.allreduce(Group::World, agreedCount, c10d::ReduceOp::MIN);
  const auto n = static_cast<size_t>(agreedCount.item<double>());
  for (size_t i = 0; i < n; ++i) {
    const std::string dir = stepDirName(cfg_.checkpoint.dir, steps[i]);
    const ResumeCandidate c = readCandidate(dir, mesh_, params);
    // 1: loadable here; 0: corrupt or incomplete here (try an older one); -1: of another
    // layout here (refuse the run). The world takes the worst.
    auto ok = torch::full({1}, c.why.empty() ? 1.0 : c.layout ? -1.0 : 0.0, torch::kFloat64);
    comm.allreduce(Group::World, ok, c10d::ReduceOp::MIN);
    if (ok.item<double>() < 0)
      throw CheckpointLayoutError(c.why.empty() || !c.layout ? dir + ": of another layout or model (on another rank)"
                                                             : c.why);
    if (ok.item<double>() == 0) {
      log("skipping checkpoint " + dir + (c.why.empty() ? " (bad on another rank)" : ": " + c.why));
      continue;
    }
    resumeFrom(c.tensors, dir, c.oldReplicas, c.source);
    progress_.lastCheckpointId = steps[i];
    progress_.controlId = steps[i];
    log("resumed from " + dir + " at step " + std::to_string(progress_.step));
    return true;
  }
  return false;
}

void Trainer::resumeFrom(const NamedTensors& t, const std::string& dir, int oldReplicas, int source) {
  const int N = mesh_.shards, M = mesh_.replicas;
  const bool newReplica = mesh_.rank / N >= oldReplicas;
  if (oldReplicas != M)
    log("checkpoint " + dir + " was written with " + std::to_string(oldReplicas) + " replicas; resuming it with " +
        std::to_string(M) +
        (newReplica ? ": this new replica continues from a copy of replica " + std::to_string(source / N) + "'s state"
                    : ""));
  torch::NoGradGuard ng;
  progress_.step = static_cast<int64_t>(t.at("meta/step").item<double>());
  // A new replica counts only what it trains itself, as after an in-place scale-up.
  progress_.tokens = newReplica ? 0 : static_cast<uint64_t>(t.at("meta/tokens").item<double>());
  auto& adam = engine_->adam();
  adam.setStepCount(static_cast<int64_t>(t.at("meta/adamSteps").item<double>()));
  // training.tokens fixed the job's step count for the world it started with; it stays
  // when the job continues at another size, as at an in-place scale (docs/elastic.md).
  if (cfg_.training.tokens > 0 && t.count("meta/totalSteps") && t.count("meta/budgetTokens") &&
      static_cast<int64_t>(t.at("meta/budgetTokens").item<double>()) == cfg_.training.tokens)
    progress_.totalSteps = static_cast<int64_t>(t.at("meta/totalSteps").item<double>());
  // Non-local chunks of the gathered buffers are refreshed by the next all-gather; with
  // one shard the slice is the whole buffer.
  auto& units = engine_->units();
  for (size_t u = 0; u < units.size(); ++u) {
    const std::string k = "unit" + std::to_string(u) + "/";
    units[u].slice.copy_(t.at(k + "theta"));
    adam.m()[u].copy_(t.at(k + "adam_m"));
    adam.v()[u].copy_(t.at(k + "adam_v"));
  }
  schedule_->load(t, newReplica, oldReplicas == M, dir);
  // A-EDiT's learning rate divides the job's replica-steps by M: count them again with
  // this run's replicas (a new one's steps are its source's).
  if (oldReplicas != M) schedule_->agreeJobSteps(progress_.step);
}

}  // namespace edit
