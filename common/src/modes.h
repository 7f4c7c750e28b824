// The training algorithms (algorithm.mode), one row each: everything the runtime, the
// operator and the CRD need to know about a mode is a trait here, so that adding a mode
// is one row plus its sync function (docs/architecture.md, "Adding a mode"). Header-only: the operator
// and the runtime's config library use it without linking anything.
#pragma once

#include <array>
#include <string>
#include <string_view>
#include <vector>

namespace edit {

enum class Mode { Edit, AEdit, DiLoCo, LocalSgd, Ddp };

// How a mode synchronizes.
enum class SyncClock {
  EveryStep,  // gradients averaged every step (no local phase, no outer optimizer)
  Steps,      // every algorithm.syncInterval local steps
  Seconds,    // every algorithm.syncSeconds of wall time (steps per window differ by replica)
};

struct ModeTraits {
  Mode mode;
  const char* name;       // the config and CRD value
  SyncClock clock;
  bool layerwise;         // units synchronized one by one inside the next forward pass
                          // (false: the whole model at the step boundary)
  bool penalty;           // anomaly elimination, weighted averaging and clipping apply
  bool outerOptimizer;    // Nesterov SGD on the pseudo-gradient (false: plain averaging)
  // Its default (algorithm.outer.momentum = -1): diloco the DiLoCo paper's 0.9; edit and
  // a-edit 0.5, measured best at tau 8 and 16 (docs/algorithm.md, "Outer optimizer").
  double outerMomentum;
  bool stepShareWeights;  // replicas' step counts differ: weights blend in their step share
  const char* summary;
};

inline constexpr std::array<ModeTraits, 5> kModeTable = {{
    {Mode::Edit, "edit", SyncClock::Steps, true, true, true, 0.5, false,
     "layer-wise Local SGD with the pseudo-gradient penalty, synced every syncInterval steps"},
    {Mode::AEdit, "a-edit", SyncClock::Seconds, true, true, true, 0.5, true,
     "EDiT on a time window (syncSeconds): fast replicas make more local steps"},
    {Mode::DiLoCo, "diloco", SyncClock::Steps, false, false, true, 0.9, false,
     "whole-model outer Nesterov step on the averaged pseudo-gradient, no penalty"},
    {Mode::LocalSgd, "localsgd", SyncClock::Steps, false, false, false, 0.0, false,
     "post-local SGD: the replicas' weights averaged every syncInterval steps"},
    {Mode::Ddp, "ddp", SyncClock::EveryStep, false, false, false, 0.0, false,
     "synchronous data parallel: gradients averaged every step"},
}};

// The row of a mode name; nullptr for an unknown one (the config parser has refused it).
inline const ModeTraits* findMode(std::string_view name) {
  for (const auto& m : kModeTable)
    if (name == m.name) return &m;
  return nullptr;
}

// The row of a valid mode name; the default mode's row for an unknown one.
inline const ModeTraits& modeTraits(std::string_view name) {
  const ModeTraits* m = findMode(name);
  return m ? *m : kModeTable[0];
}

// The row of a mode (the table is in enumerator order: checked below).
inline const ModeTraits& modeTraits(Mode m) { return kModeTable[static_cast<size_t>(m)]; }
constexpr bool tableInEnumOrder() {
  for (size_t i = 0; i < kModeTable.size(); ++i)
    if (kModeTable[i].mode != static_cast<Mode>(i)) return false;
  return true;
}
static_assert(tableInEnumOrder(), "kModeTable's rows must follow enum class Mode's order");

inline bool hasLocalPhases(std::string_view name) { return modeTraits(name).clock != SyncClock::EveryStep; }
inline bool hasLocalPhases(Mode m) { return modeTraits(m).clock != SyncClock::EveryStep; }

inline std::vector<std::string> modeNames() {
  std::vector<std::string> out;
  for (const auto& m : kModeTable) out.emplace_back(m.name);
  return out;
}

}  // namespace edit
