// The summary's "link" object (edit-train writes it, edit-run reads it): one definition of
// its keys for both.
#pragma once

#include <nlohmann/json.hpp>

#include "link_advice.h"

namespace edit {

inline void to_json(nlohmann::json& j, const LinkMeasurement& m) {
  j = {{"mode", m.mode},
       {"sync_interval", m.syncInterval},
       {"sync_seconds", m.syncSeconds},
       {"compression", m.compression},
       {"overlap_steps", m.overlapSteps},
       {"overlap_allowed", m.overlapAllowed},
       {"local_steps", m.localSteps},
       {"compute_seconds", m.computeSeconds},
       {"blocked_seconds", m.blockedSeconds},
       {"rounds", m.rounds}};
}

// Missing keys keep the defaults (a summary of an older worker has no "link").
inline void from_json(const nlohmann::json& j, LinkMeasurement& m) {
  m.mode = j.value("mode", m.mode);
  m.syncInterval = j.value("sync_interval", m.syncInterval);
  m.syncSeconds = j.value("sync_seconds", m.syncSeconds);
  m.compression = j.value("compression", m.compression);
  m.overlapSteps = j.value("overlap_steps", m.overlapSteps);
  m.overlapAllowed = j.value("overlap_allowed", m.overlapAllowed);
  m.localSteps = j.value("local_steps", m.localSteps);
  m.computeSeconds = j.value("compute_seconds", m.computeSeconds);
  m.blockedSeconds = j.value("blocked_seconds", m.blockedSeconds);
  m.rounds = j.value("rounds", m.rounds);
}

}  // namespace edit
