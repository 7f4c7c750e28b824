#include "penalty.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace edit {

EwmaDetector::Verdict EwmaDetector::observe(double g, const PenaltyConfig& cfg) {
  Verdict v;
  if (!std::isfinite(g)) {
    v.anomaly = true;
    v.z = std::numeric_limits<double>::infinity();
    return v;
  }
  const double sigma = std::sqrt(var);
  if (count > 0 && sigma > 0) v.z = (g - mean) / sigma;
  if (cfg.anomaly && count >= cfg.anomalyWarmup && sigma > 0 && v.z > cfg.zThreshold) {
    v.anomaly = true;  // one-sided: small norms are never anomalies
    return v;
  }
  if (count == 0) {
    mean = g;
    var = 0;
  } else {
    const double a = cfg.emaAlpha;
    const double d = g - mean;
    mean += a * d;
    var = (1 - a) * (var + a * d * (g - mean));
  }
  ++count;
  return v;
}

std::vector<double> replicaWeights(const std::vector<double>& norms,
                                   const std::vector<double>& stepsSinceSync,
                                   const PenaltyConfig& cfg, bool weighted, bool useStepShare) {
  const size_t M = norms.size();
  std::vector<double> w(M, 0.0);
  double gmin = std::numeric_limits<double>::infinity();
  for (double g : norms)
    if (std::isfinite(g)) gmin = std::min(gmin, g);
  if (!std::isfinite(gmin)) return w;  // every replica anomalous
  double sum = 0;
  for (size_t m = 0; m < M; ++m) {
    if (!std::isfinite(norms[m])) continue;
    // Shifting by the smallest norm keeps exp() in range; softmax is shift-invariant.
    w[m] = weighted ? std::exp(-(norms[m] - gmin) / cfg.temperature) : 1.0;
    sum += w[m];
  }
  for (auto& x : w) x /= sum;
  if (useStepShare && stepsSinceSync.size() == M) {
    double steps = 0;
    for (size_t m = 0; m < M; ++m)
      if (std::isfinite(norms[m])) steps += stepsSinceSync[m];
    if (steps > 0) {
      double total = 0;
      for (size_t m = 0; m < M; ++m) {
        if (!std::isfinite(norms[m])) continue;
        w[m] = (1 - cfg.stepShare) * w[m] + cfg.stepShare * stepsSinceSync[m] / steps;
        total += w[m];
      }
      if (total > 0)
        for (auto& x : w) x /= total;
    }
  }
  return w;
}

double clipScale(double norm, double phi) { return std::min(1.0, phi / (norm + 1e-6)); }

}  // namespace edit
