#include "sync/penalty.h"

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
  // The variance starts at 0 and its EWMA has weight 1 - (1-a)^k after k updates: divide
  // by that (as Adam's moments), or a test armed after a few rounds sees a fraction of the
  // real spread and flags normal rounds (docs/design-decisions.md).
  const double weight = count >= 2 ? 1 - std::pow(1 - cfg.emaAlpha, static_cast<double>(count - 1)) : 1.0;
  const double sigma = std::sqrt(var / weight);
  if (count > 0 && sigma > 0) v.z = (g - mean) / sigma;
  // One-sided: small norms are never anomalies.
  v.anomaly = cfg.anomaly && count >= cfg.anomalyWarmup && sigma > 0 && v.z > cfg.zThreshold;
  // Every finite norm updates the statistics, an anomaly clamped to mean + z sigma: a
  // lasting shift moves them until it is normal (no lock-out), a spike moves them no
  // more than a borderline norm would (docs/design-decisions.md).
  const double x = v.anomaly ? mean + cfg.zThreshold * sigma : g;
  if (count == 0) {
    mean = x;
    var = 0;
  } else {
    const double a = cfg.emaAlpha;
    const double d = x - mean;
    mean += a * d;
    var = (1 - a) * (var + a * d * (x - mean));
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
  double T = cfg.temperature;
  if (weighted && cfg.weighting == Weighting::Median) {
    std::vector<double> finite;
    for (double g : norms)
      if (std::isfinite(g)) finite.push_back(g);
    std::sort(finite.begin(), finite.end());
    const size_t n = finite.size();
    const double med = n % 2 ? finite[n / 2] : 0.5 * (finite[n / 2 - 1] + finite[n / 2]);
    if (med > 0) T *= med;  // all-zero norms: any T gives uniform weights
  }
  double sum = 0;
  for (size_t m = 0; m < M; ++m) {
    if (!std::isfinite(norms[m])) continue;
    // Shifting by the smallest norm keeps exp() in range; softmax is shift-invariant.
    w[m] = weighted ? std::exp(-(norms[m] - gmin) / T) : 1.0;
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
