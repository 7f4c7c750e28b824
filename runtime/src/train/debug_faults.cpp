#include "train/debug_faults.h"

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <thread>
#include <unistd.h>

#include "data/data.h"

namespace edit {

std::unique_ptr<FaultInjector> FaultInjector::make(const Config& cfg, const MeshSpec& mesh, Log log) {
  const auto& d = cfg.debug;
  const char* drop = std::getenv("EDIT_TEST_DROP_COPY_RANK");
  const int dropRank = drop && *drop ? std::atoi(drop) : -1;
  const bool any = d.killAtStep.rank >= 0 || d.injectStepDelay.seconds > 0 || d.corruptReplica.replica >= 0 ||
                   dropRank >= 0;
  if (!any) return nullptr;
  return std::unique_ptr<FaultInjector>(new FaultInjector(cfg, mesh, std::move(log), dropRank));
}

void FaultInjector::killIfAsked(int64_t t, int unit) const {
  const auto& k = debug_.killAtStep;
  if (k.rank != mesh_.rank || k.step != t || k.unit != unit || mesh_.join) return;
  log_("debug.killAtStep: killing this worker (SIGKILL) at step " + std::to_string(t) +
       (unit >= 0 ? " before unit " + std::to_string(unit) + "'s sync" : ""));
  std::fflush(nullptr);
  ::kill(::getpid(), SIGKILL);
}

void FaultInjector::delayAfterStep(int64_t t, int world) const {
  const auto& d = debug_.injectStepDelay;
  if (d.seconds <= 0) return;
  int slow = d.rank;
  if (d.random) slow = static_cast<int>(data::mix64(seed_ ^ data::mix64(t)) % world);
  if (slow == mesh_.rank) std::this_thread::sleep_for(std::chrono::duration<double>(d.seconds));
}

void FaultInjector::corruptBeforeRound(int64_t round, int replica, std::vector<FlatUnit>& units,
                                       const std::function<torch::Tensor(size_t)>& startPoint) const {
  const auto& c = debug_.corruptReplica;
  if (c.replica != replica || round < c.atSync || (round - c.atSync) % c.every != 0 ||
      (round - c.atSync) / c.every >= c.rounds)
    return;
  torch::NoGradGuard ng;
  auto gen = at::detail::createCPUGenerator(seed_ + 977 * mesh_.rank + round);
  for (size_t i = 0; i < units.size(); ++i) {
    auto& u = units[i];
    if (c.nan) {
      u.slice[0] = std::numeric_limits<float>::quiet_NaN();
    } else if (c.kind == CorruptKind::PseudoGradient) {
      // theta := start - scale (start - theta): the replica's pseudo-gradient times scale.
      auto start = startPoint(i);
      u.slice.sub_(start).mul_(c.scale).add_(start);
    } else {
      const double rms = u.slice.pow(2).mean().sqrt().item<double>();
      u.slice.add_((torch::randn({u.chunk}, gen) * (c.scale * rms)).to(u.slice.device()));
    }
  }
  log_("debug.corruptReplica: corrupted replica " + std::to_string(c.replica) + " (" +
       (c.nan ? std::string("nan") : nameOf(c.kind) + " x" + std::to_string(c.scale)) + ") before sync round " +
       std::to_string(round));
}

bool FaultInjector::dropThisCopy() {
  if (dropped_ || dropCopyRank_ != mesh_.rank) return false;
  dropped_ = true;
  return true;
}

}  // namespace edit
