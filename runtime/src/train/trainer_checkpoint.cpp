// Saving and resuming the full training state of one rank (see checkpoint.h): a save that
// fails on any rank fails on all of them together and leaves nothing behind; every rank
// resumes from the same step, agreed over the world.
#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <functional>
#include <limits>
#include <set>

#include "train/checkpoint.h"
#include "train/trainer.h"

namespace edit {

static torch::Tensor scalar(double v) { return torch::full({1}, v, torch::kFloat64); }

namespace {

// Every rank's value of x, in rank order.
std::vector<double> gatherWorld(Comm& comm, double x) {
  const int W = comm.world();
  auto mine = scalar(x);
  auto all = torch::empty({W, 1}, torch::kFloat64);
  std::vector<torch::Tensor> outs;
  for (int r = 0; r < W; ++r) outs.push_back(all[r]);
  comm.allgather(Group::World, mine, outs);
  std::vector<double> v;
  for (int r = 0; r < W; ++r) v.push_back(all[r][0].item<double>());
  return v;
}

// "ranks 1, 3" (or "rank 1") for the ranks where `pick` holds.
template <typename Pick>
std::string ranksWhere(size_t n, Pick pick) {
  std::string s;
  int count = 0;
  for (size_t r = 0; r < n; ++r)
    if (pick(r)) s += (count++ ? ", " : "") + std::to_string(r);
  return (count > 1 ? "ranks " : "rank ") + s;
}

// A checkpoint some rank could not write: each rank removes what it wrote, rank 0 the
// step's directory, and all throw the same error naming the ranks and their errors.
// errors[r]: rank r's errno, 0 where it wrote its part.
[[noreturn]] void abandonCheckpoint(const std::string& root, const std::string& dir, const std::string& file,
                                    const std::vector<int>& errors, int rank, const std::string& mine,
                                    int64_t previous) {
  std::error_code ec;
  std::filesystem::remove(file, ec);
  if (rank == 0) std::filesystem::remove_all(dir, ec);
  std::filesystem::remove(dir, ec);  // empty where every rank has its own checkpoint.dir
  bool noSpace = false;
  std::string what;
  for (int err : std::set<int>(errors.begin(), errors.end())) {
    if (err == 0) continue;
    noSpace = noSpace || err == ENOSPC || err == EDQUOT;
    what += (what.empty() ? "" : "; ") + describeErrno(err) + " on " +
            ranksWhere(errors.size(), [&](size_t r) { return errors[r] == err; });
  }
  throw CheckpointNotSaved(
      "checkpoint " + dir + " was not saved: " + what + (mine.empty() ? "" : " (here: " + mine + ")") +
          "; its files are removed and " +
          (previous >= 0 ? "the previous checkpoint, " + stepDirName(root, previous) + ", is intact"
                         : "there is no earlier checkpoint of this run") +
          (noSpace ? ". Free space in " + root + " (or lower checkpoint.keep), then run the job again: it resumes "
                     "from the newest complete checkpoint"
                   : ""),
      noSpace);
}

}  // namespace

void Trainer::saveCheckpoint(int64_t id) {
  // A checkpoint holds no round in flight: applying it first keeps the format and resume
  // as they are (the outer weights are then the start point of the current round).
  schedule_->drainOverlap();
  torch::NoGradGuard ng;
  const double t0 = nowSeconds();
  const std::string dir = stepDirName(cfg_.checkpoint.dir, id);
  const std::string file = rankFileName(dir, mesh_.rank);
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
  // A rank that cannot write (a full disk) says so in the exchange of CRCs, as -errno:
  // its peers must not wait for it until their collective timeout, nor take a lost
  // peer's path (an in-place recovery that would fail the same way at the next checkpoint).
  double written = 0;
  std::string why;
  try {
    written = writeCheckpointFile(file, t);
  } catch (const CheckpointWriteError& e) {
    written = -std::max(1, e.error);
    why = e.what();
  }
  Comm& comm = *groups_.comm;
  const auto all = gatherWorld(comm, written);
  std::vector<int> errors;
  for (double w : all) errors.push_back(w < 0 ? static_cast<int>(-w) : 0);
  const bool allWritten = std::all_of(errors.begin(), errors.end(), [](int e) { return e == 0; });
  // Only with every rank's file is the checkpoint complete: then rank 0 writes the manifest.
  int manifestError = 0;
  if (mesh_.rank == 0 && allWritten) {
    Manifest m;
    m.step = id;
    m.world = comm.world();
    for (double c : all) m.crcs.push_back(static_cast<uint32_t>(c));
    m.configYaml = toYaml(cfg_);
    try {
      writeManifest(dir, m);
      pruneCheckpoints(cfg_.checkpoint.dir, cfg_.checkpoint.keep);
    } catch (const CheckpointWriteError& e) {
      manifestError = std::max(1, e.error);
      why = e.what();
    }
  }
  // Where a barrier would do: every rank also learns whether the manifest was written.
  auto manifest = scalar(manifestError);
  comm.allreduce(Group::World, manifest, c10d::ReduceOp::MAX);
  if (allWritten && manifest.item<double>() > 0) errors[0] = static_cast<int>(manifest.item<double>());
  if (!allWritten || manifest.item<double>() > 0)
    abandonCheckpoint(cfg_.checkpoint.dir, dir, file, errors, mesh_.rank, why, progress_.lastCheckpointId);
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

// The step every rank resumes from. Each rank's listing of checkpoint.dir may differ (an
// NFS client's cached listing can lack the newest step for a while), so the world agrees
// on each candidate, newest first: the newest step any rank lists below the last one
// tried. Every rank reads that step's directory by name; all load it only if all can,
// else the next one. A step no rank lists is never tried.
struct ResumeChoice {
  int64_t step = -1;  // -1: none
  ResumeCandidate candidate;
};

ResumeChoice agreeOnResumeStep(Comm& comm, const std::string& root, const MeshSpec& mesh, int64_t params,
                               const std::function<void(const std::string&)>& log) {
  const auto steps = completeCheckpointSteps(root);  // newest first
  int64_t below = std::numeric_limits<int64_t>::max();
  int64_t newest = -1;
  std::string newestUnreadable;  // who could not read the newest, and why here
  for (;;) {
    const auto next = std::find_if(steps.begin(), steps.end(), [&](int64_t s) { return s < below; });
    auto step = scalar(next == steps.end() ? -1.0 : static_cast<double>(*next));
    comm.allreduce(Group::World, step, c10d::ReduceOp::MAX);
    below = static_cast<int64_t>(step.item<double>());
    if (below < 0) break;
    if (newest < 0) newest = below;
    const std::string dir = stepDirName(root, below);
    ResumeCandidate c = readCandidate(dir, mesh, params);
    // 1: loadable here; 0: missing, incomplete or corrupt here (try an older one); -1: of
    // another layout here (refuse the run).
    const auto ok = gatherWorld(comm, c.why.empty() ? 1.0 : c.layout ? -1.0 : 0.0);
    if (std::any_of(ok.begin(), ok.end(), [](double o) { return o < 0; }))
      throw CheckpointLayoutError(c.layout ? c.why : dir + ": of another layout or model (on another rank)");
    if (std::all_of(ok.begin(), ok.end(), [](double o) { return o > 0; })) return {below, std::move(c)};
    const std::string who = ranksWhere(ok.size(), [&](size_t r) { return ok[r] == 0; });
    if (below == newest) newestUnreadable = who + (c.why.empty() ? "" : " (here: " + c.why + ")");
    log("checkpoint " + dir + " is not readable on " + who + (c.why.empty() ? "" : " (here: " + c.why + ")") +
        "; trying an older one");
  }
  if (newest >= 0)
    throw CheckpointLayoutError(
        "no checkpoint in " + root + " is readable on every rank: the newest, step " + std::to_string(newest) +
        ", is not readable on " + newestUnreadable +
        ". Every worker must see the same checkpoint.dir (one shared volume); a listing that lags on one "
        "node clears within its NFS attribute cache time. checkpoint.resume=false starts over instead");
  return {};
}

}  // namespace

bool Trainer::tryResume() {
  const ResumeChoice c = agreeOnResumeStep(*groups_.comm, cfg_.checkpoint.dir, mesh_,
                                           parameterCount(engine_->shape()), logger());
  if (c.step < 0) return false;
  const std::string dir = stepDirName(cfg_.checkpoint.dir, c.step);
  resumeFrom(c.candidate.tensors, dir, c.candidate.oldReplicas, c.candidate.source);
  progress_.lastCheckpointId = c.step;
  progress_.controlId = c.step;
  log("resumed from " + dir + " at step " + std::to_string(progress_.step));
  return true;
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
