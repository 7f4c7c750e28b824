#include "link_advice.h"

#include <cmath>

#include "modes.h"
#include <cstdio>

namespace edit {

LinkMeasurement leastBlocked(const std::vector<LinkMeasurement>& ranks) {
  // Per round, not in total: a rank that left at a scale-down, or joined late, took part
  // in fewer rounds.
  auto perRound = [](const LinkMeasurement& m) { return m.blockedSeconds / static_cast<double>(m.rounds); };
  const LinkMeasurement* best = nullptr;
  for (const auto& m : ranks)
    if (m.localSteps > 0 && m.rounds > 0 && (!best || perRound(m) < perRound(*best))) best = &m;
  return best ? *best : LinkMeasurement{};
}

LinkAdvice adviseLink(const LinkMeasurement& m, double target) {
  LinkAdvice a;
  const SyncClock clock = modeTraits(m.mode).clock;  // the measurement names its mode
  if (clock == SyncClock::EveryStep || m.rounds < 3 || m.localSteps <= 0 || m.computeSeconds <= 0) return a;
  a.roundSeconds = m.blockedSeconds / static_cast<double>(m.rounds);
  a.stepSeconds = m.computeSeconds / static_cast<double>(m.localSteps);
  a.blockedShare = m.blockedSeconds / (m.blockedSeconds + m.computeSeconds);
  if (a.blockedShare <= target) return a;
  // share = R / (tau c + R) <= b  <=>  tau >= (1/b - 1) R / c
  const double k = 1.0 / target - 1.0;
  a.syncInterval = static_cast<int64_t>(std::ceil(k * a.roundSeconds / a.stepSeconds));
  a.syncSeconds = std::ceil(10.0 * k * a.roundSeconds) / 10.0;
  a.overlapSteps = m.overlapSteps + static_cast<int64_t>(std::ceil(a.roundSeconds / a.stepSeconds));

  char head[320];
  std::snprintf(head, sizeof(head),
                "the sync rounds blocked training %.0f%% of the local phase (%.2f s per round, against "
                "%.3f s of compute per local step). To keep it under %.0f%%: ",
                100.0 * a.blockedShare, a.roundSeconds, a.stepSeconds, 100.0 * target);
  std::string t = head;
  char opt[160];
  if (clock == SyncClock::Seconds)
    std::snprintf(opt, sizeof(opt), "algorithm.syncSeconds >= %.1f (now %.1f)", a.syncSeconds, m.syncSeconds);
  else
    std::snprintf(opt, sizeof(opt), "algorithm.syncInterval >= %lld (now %lld)",
                  static_cast<long long>(a.syncInterval), static_cast<long long>(m.syncInterval));
  t += opt;
  if (m.compression == "none" || m.compression.empty())
    t += "; or algorithm.syncCompression=int8 (about 4x fewer bytes per round)";
  else if (m.compression == "int8")
    t += "; or algorithm.syncCompression=int4 (half of int8's bytes)";
  if (m.overlapAllowed) {
    std::snprintf(opt, sizeof(opt),
                  "; or algorithm.overlapSteps >= %lld (each outer step then lands that many steps late)",
                  static_cast<long long>(a.overlapSteps));
    t += opt;
  }
  t += ". docs/algorithm.md, \"Choosing tau and overlapSteps for a slow link\", has the arithmetic.";
  a.text = std::move(t);
  return a;
}

}  // namespace edit
