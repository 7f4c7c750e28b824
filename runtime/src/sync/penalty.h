// The pseudo-gradient penalty of EDiT (docs/algorithm.md, "The penalty"): anomaly
// elimination with an online EWMA z-test, softmax weighting over replicas, and clipping.
// Plain scalar math on what the collectives gathered, so it is identical on every rank
// and easy to test against hand-computed values.
#pragma once

#include <cstdint>
#include <vector>

#include "worker_config.h"

namespace edit {

// Per-unit EWMA of one replica's pseudo-gradient norm g.
struct EwmaDetector {
  double mean = 0, var = 0;
  int64_t count = 0;

  struct Verdict {
    bool anomaly = false;
    double z = 0;  // from the statistics before this observation
  };
  // Tests g against the statistics so far (once count >= anomalyWarmup; the variance
  // bias-corrected for its zero start), then updates them whatever the verdict, with an
  // anomaly clamped to mean + zThreshold sigma: a lasting shift of the norms becomes the new
  // normal instead of being flagged forever, and a spike barely moves them
  // (docs/design-decisions.md). Non-finite g is always an anomaly and leaves the
  // statistics alone. The first value sets the mean.
  Verdict observe(double g, const PenaltyConfig& cfg);
};

// Weights of the M replicas for one unit. norms[m] = +inf marks an anomalous replica
// (weight 0). weighted: softmax(-g/T) (weighting "median": softmax(-g/(T median g)));
// else uniform. stepShares (A-EDiT, may be empty): w := (1-r) w + r * steps_m / sum(steps).
// Returns weights that sum to 1, or all zeros when every replica is anomalous.
std::vector<double> replicaWeights(const std::vector<double>& norms,
                                   const std::vector<double>& stepsSinceSync,
                                   const PenaltyConfig& cfg, bool weighted, bool useStepShare);

// Factor that clips a vector of norm n to at most phi: min(1, phi / (n + 1e-6)).
double clipScale(double norm, double phi);

}  // namespace edit
