// Helpers for the in-process multi-rank tests: W ranks as W threads, each with its own
// connection to the job's store and Gloo process groups over loopback.
#pragma once

#include <cstdlib>
#include <exception>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "../../common/test_files.h"
#include "../free_port.h"
#include "dist/comm.h"
#include "dist/flat_units.h"
#include "worker_config.h"
#include "data/data.h"

namespace edit::test {

inline MeshSpec meshFor(int rank, int M, int N, int port) {
  MeshSpec m;
  m.rank = rank;
  m.world = M * N;
  m.replicas = M;
  m.shards = N;
  m.masterAddr = "127.0.0.1";
  m.masterPort = port;
  m.bindAddr = "127.0.0.1";
  m.timeoutSeconds = 60;
  return m;
}

// Runs fn(rank) on W threads; rethrows the first exception.
inline void runRanks(int W, const std::function<void(int)>& fn) {
  std::vector<std::thread> ts;
  std::vector<std::exception_ptr> errs(W);
  for (int r = 0; r < W; ++r)
    ts.emplace_back([&, r] {
      try {
        fn(r);
      } catch (...) {
        errs[r] = std::current_exception();
      }
    });
  for (auto& t : ts) t.join();
  for (auto& e : errs)
    if (e) std::rethrow_exception(e);
}

// One unit of `padded` parameters as shard `shard` of `shards` holds it: its slice and
// gradient slice (contents unset), for tests that drive syncUnit directly.
inline FlatUnit sliceUnit(int shards, int shard, int64_t padded) {
  FlatUnit unit;
  unit.shards = shards;
  unit.shard = shard;
  unit.chunk = padded / shards;
  unit.padded = padded;
  unit.slice = torch::empty({unit.chunk});
  unit.gradSlice = torch::empty({unit.chunk});
  return unit;
}

// A token file with learnable structure: repeated short random "words".
inline std::string makeTokenFile(const std::string& dir, int64_t vocab, size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::vector<uint32_t>> words(32);
  for (auto& w : words) {
    w.resize(2 + rng() % 5);
    for (auto& t : w) t = static_cast<uint32_t>(rng() % vocab);
  }
  std::vector<uint32_t> toks;
  while (toks.size() < n) {
    const auto& w = words[rng() % words.size()];
    toks.insert(toks.end(), w.begin(), w.end());
  }
  toks.resize(n);
  const std::string path = dir + "/tokens.bin";
  data::writeTokenFile(path, toks, data::TokenFormat::LlmcU16);
  return path;
}

// A very small model and run, fast enough for unit tests.
inline Config smallConfig(const std::string& dataPath) {
  Config c;
  c.model.preset = "custom";
  c.model.vocabSize = 64;
  c.model.dim = 32;
  c.model.layers = 2;
  c.model.heads = 2;
  c.model.ffnDim = 64;
  // The weights' scale the tests' tolerances (int8 rounding flips, penalty norms) were set
  // at; custom's default would be 1/sqrt(2 dim) = 0.125 for this width.
  c.model.initStd = 0.02;
  c.data.train = dataPath;
  c.data.val = "";
  c.data.seqLen = 16;
  c.data.batchSize = 2;
  c.training.steps = 12;
  c.training.lr = 1e-2;
  c.training.minLr = 1e-3;
  c.training.lrWarmupSteps = 2;
  c.training.logEvery = 1000;
  c.algorithm.warmupSteps = 3;
  c.algorithm.syncInterval = 3;
  c.algorithm.penalty.anomalyWarmup = 2;
  c.runtime.collectiveTimeoutSeconds = 60;
  return c;
}

}  // namespace edit::test
