// The faults a test or a demonstration asks for (debug.* in the config, and the test hook
// EDIT_TEST_DROP_COPY_RANK): a straggler, a corrupted replica, a worker killed at a given
// point, a state copy that fails. Made only when one is asked for; the production path
// holds a null pointer and calls nothing here.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "worker_config.h"

#include "dist/comm.h"
#include "dist/flat_units.h"

namespace edit {

class FaultInjector {
 public:
  using Log = std::function<void(const std::string&)>;
  // nullptr when the config and the environment ask for no fault.
  static std::unique_ptr<FaultInjector> make(const Config& cfg, const MeshSpec& mesh, Log log);

  // debug.killAtStep: SIGKILL at the start of step t (unit -1), or in step t's sync round
  // just before unit `unit` synchronizes. Never in a replacement.
  void killIfAsked(int64_t t, int unit = -1) const;
  // debug.injectStepDelay: the straggler's extra time, after the step's compute (so it
  // delays the step but not a synchronization its replica already entered).
  // A random straggler is one of the `world` ranks the job has now.
  void delayAfterStep(int64_t t, int world) const;
  // debug.corruptReplica, before sync round `round` (1-based) of replica `replica`:
  // startPoint(u) is where unit u's round started (its pseudo-gradient's reference).
  void corruptBeforeRound(int64_t round, int replica, std::vector<FlatUnit>& units,
                          const std::function<torch::Tensor(size_t)>& startPoint) const;
  // EDIT_TEST_DROP_COPY_RANK=r: rank r's first state copy of a recovery fails as if a
  // connection were lost (tests/runtime/integration/test_recovery.py).
  bool dropThisCopy();

 private:
  FaultInjector(const Config& cfg, const MeshSpec& mesh, Log log, int dropCopyRank)
      : debug_(cfg.debug), seed_(cfg.training.seed), mesh_(mesh), log_(std::move(log)), dropCopyRank_(dropCopyRank) {}
  DebugConfig debug_;
  uint64_t seed_;
  MeshSpec mesh_;  // rank and world as started (join: a replacement)
  Log log_;
  int dropCopyRank_;
  bool dropped_ = false;
};

}  // namespace edit
