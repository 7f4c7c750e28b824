// The planner's link policy: is the sync group's link the job's bottleneck, and which
// setting would fix it? Every worker reports its local phase so far (compute seconds,
// seconds blocked in collectives, sync rounds). The rank that waited least per round
// waited for the exchange alone, not for a straggler (common/src/link_advice.h), so its
// numbers give one round's cost R and one local step's compute c. The blocked share
// R / (tau c + R) over 20% sets the condition LinkBound with the tau (a-edit: syncSeconds),
// codec or overlapSteps that would bring it under, the same advice edit-run prints after a
// local run (docs/algorithm.md, "Choosing tau and overlapSteps for a slow link").
// status.link shows the measurement itself from 3 rounds on, over the target or not.
#include <cctype>
#include <cmath>

#include "controller/desired.h"
#include "controller/plan_context.h"
#include "link_advice.h"
#include "modes.h"
#include "worker_config.h"

namespace edit::op::controller {

using api::CondStatus;
namespace condition = api::condition;
namespace reason = api::reason;

void planLink(PlanContext& c) {
  const auto& t = c.in.telemetry;
  if (!t.present || !c.spec || !edit::hasLocalPhases(c.spec->mode())) return;
  // Ranks with fewer than 3 rounds (adviseLink's own floor) say too little: a replacement
  // that joined by in-place recovery, a new replica, starts its count at zero.
  std::vector<LinkMeasurement> ranks;
  for (const auto& [rank, r] : t.ranks)
    if (r.local.rounds >= 3) ranks.push_back(r.local);
  LinkMeasurement m = leastBlocked(ranks);
  if (m.rounds < 3) return;
  int measured = 0;
  for (const auto& [rank, r] : t.ranks)
    if (r.local.blockedSeconds == m.blockedSeconds && r.local.rounds == m.rounds) measured = rank;
  m.mode = std::string(c.spec->mode());
  LinkAdvice a = adviseLink(m);
  if (!a.text.empty()) {
    // The settings the workers run with, defaults included (their own config file), for
    // the advice's wording. Parsed only for a job over the target: it costs 8x the rest
    // of a reconcile's planning.
    const edit::Config cfg = edit::parseConfig(workerConfigYaml(JobRef{c.in.meta, c.running}));
    m.syncInterval = cfg.algorithm.syncInterval;
    m.syncSeconds = cfg.algorithm.syncSeconds;
    m.compression = edit::nameOf(cfg.algorithm.syncCompression);
    m.overlapSteps = cfg.algorithm.overlapSteps;
    m.overlapAllowed = c.spec->gpusPerWorker == 0;  // NCCL refuses overlapSteps
    a = adviseLink(m);
  }
  auto round4 = [](double v) { return std::round(v * 1e4) / 1e4; };
  c.st.link = api::LinkStatus{measured,   round4(a.blockedShare), round4(a.roundSeconds), round4(a.stepSeconds),
                              m.rounds,   m.localSteps};
  if (!a.text.empty()) {
    const bool fresh = !c.st.conditionTrue(condition::LinkBound);
    std::string msg = a.text;
    msg[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(msg[0])));
    c.cond(condition::LinkBound, CondStatus::True, reason::SyncRoundsBlockTraining, msg);
    if (fresh) c.event(api::kWarning, reason::LinkBound, msg);
  } else {
    c.endCondition(condition::LinkBound, reason::LinkKeepsUp,
                   "the sync rounds blocked training " + std::to_string(static_cast<int>(100 * a.blockedShare + 0.5)) +
                       "% of the local phase, under 20%");
  }
}

}  // namespace edit::op::controller
