// An independent reference of one EDiT sync round of one unit, written from
// docs/algorithm.md in plain loops over doubles. It calls no runtime code (no penalty.h,
// no outer_sync.h, no LibTorch optimizer), so a bug there cannot hide in the reference.
// Given each replica's whole pseudo-gradient and its anomaly statistics it computes the
// verdicts, the weights, the clipped average and the outer Nesterov step.
#pragma once

#include <algorithm>
#include <cmath>
#include <functional>
#include <cstdint>
#include <vector>

namespace edit::ref {

struct Params {
  bool anomaly = true, weighted = true, clip = true;
  double alpha = 0.02, z = 3.0, temperature = 1.0, clipNorm = 10.0;
  int64_t warmup = 120;
  bool medianTemperature = false;  // weighting "median"
  double stepShare = 0;            // A-EDiT blend (0: off)
  double lr = 0.7, momentum = 0.5;  // edit's defaults (docs/algorithm.md, "Outer optimizer")
  bool nesterov = true;
};

// Exponentially weighted mean and variance of one replica's norms of one unit.
struct Stats {
  double mean = 0, var = 0;
  int64_t n = 0;
  // (1-a)^k after k variance updates: the variance EWMA started at 0 and carries weight
  // 1 - decay, which the test divides out. Not stored by the runtime (it has n).
  double decay = 1;
};

struct Round {
  std::vector<double> norms;
  std::vector<bool> flagged;
  std::vector<double> weights;  // sum to 1 over the replicas kept
  bool skipped = false;         // every replica flagged: the outer state did not move
  double averagedNorm = 0, clipFactor = 1;
};

inline double l2(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x * x;
  return std::sqrt(s);
}

// One round: D[m] is replica m's pseudo-gradient (outer - inner) of the whole unit;
// stats[m], outer and momentum are updated in place. steps[m]: local steps since the
// last sync (only read with stepShare). `average`, when given, replaces the plain
// weighted average sum_m w_m D_m (compressed synchronization averages and sends it its way).
using AverageFn = std::function<std::vector<double>(const std::vector<std::vector<double>>& D,
                                                    const std::vector<double>& weights)>;
inline Round round(const std::vector<std::vector<double>>& D, std::vector<Stats>& stats,
                   std::vector<double>& outer, std::vector<double>& momentum, const Params& p,
                   const std::vector<double>& steps = {}, const AverageFn& average = {}) {
  const size_t M = D.size(), n = outer.size();
  Round r;
  r.norms.resize(M);
  r.flagged.assign(M, false);
  for (size_t m = 0; m < M; ++m) {
    const double g = l2(D[m]);
    r.norms[m] = g;
    Stats& s = stats[m];
    if (!std::isfinite(g)) {
      r.flagged[m] = true;  // NaN/Inf: always dropped, statistics untouched
      continue;
    }
    // z-score against the statistics before this round, once armed; one-sided.
    const double sd = s.n >= 2 ? std::sqrt(s.var / (1 - s.decay)) : 0.0;
    const double limit = s.mean + p.z * sd;
    if (p.anomaly && s.n >= p.warmup && sd > 0 && g > limit) r.flagged[m] = true;
    // The statistics take every finite norm, a flagged one as the limit it crossed (no
    // lock-out, and a spike moves them no more than a borderline norm).
    const double x = r.flagged[m] ? limit : g;
    if (s.n == 0) {
      s.mean = x;
      s.var = 0;
    } else {
      const double dev = x - s.mean;
      s.mean = (1 - p.alpha) * s.mean + p.alpha * x;
      s.var = (1 - p.alpha) * s.var + p.alpha * (1 - p.alpha) * (1 - p.alpha) * dev * dev;
      s.decay *= 1 - p.alpha;
    }
    s.n += 1;
  }

  std::vector<size_t> kept;
  for (size_t m = 0; m < M; ++m)
    if (!r.flagged[m]) kept.push_back(m);
  r.weights.assign(M, 0.0);
  if (kept.empty()) {
    r.skipped = true;
    return r;
  }
  double T = p.temperature;
  if (p.weighted && p.medianTemperature) {
    std::vector<double> g;
    for (size_t m : kept) g.push_back(r.norms[m]);
    std::sort(g.begin(), g.end());
    const double med = g.size() % 2 ? g[g.size() / 2] : (g[g.size() / 2 - 1] + g[g.size() / 2]) / 2;
    if (med > 0) T *= med;
  }
  for (size_t m : kept) {
    if (!p.weighted) {
      r.weights[m] = 1.0 / static_cast<double>(kept.size());
      continue;
    }
    // softmax(-g/T) written as 1 / sum_k exp((g_m - g_k)/T): no overflow for large norms.
    double denom = 0;
    for (size_t k : kept) denom += std::exp((r.norms[m] - r.norms[k]) / T);
    r.weights[m] = 1.0 / denom;
  }
  if (p.stepShare > 0 && steps.size() == M) {
    double total = 0;
    for (size_t m : kept) total += steps[m];
    if (total > 0) {
      double sum = 0;
      for (size_t m : kept) {
        r.weights[m] = (1 - p.stepShare) * r.weights[m] + p.stepShare * steps[m] / total;
        sum += r.weights[m];
      }
      for (size_t m : kept) r.weights[m] /= sum;
    }
  }

  std::vector<double> avg(n, 0.0);
  if (average) {
    avg = average(D, r.weights);
  } else {
    for (size_t m : kept)
      for (size_t i = 0; i < n; ++i) avg[i] += r.weights[m] * D[m][i];
  }
  r.averagedNorm = l2(avg);
  if (p.clip && r.averagedNorm > 0) r.clipFactor = std::min(1.0, p.clipNorm / (r.averagedNorm + 1e-6));
  for (double& x : avg) x *= r.clipFactor;

  // SGD with momentum (dampening 0), Nesterov: step along avg + mu * buffer.
  for (size_t i = 0; i < n; ++i) {
    if (p.momentum == 0) {
      outer[i] -= p.lr * avg[i];
      continue;
    }
    momentum[i] = p.momentum * momentum[i] + avg[i];
    outer[i] -= p.lr * (p.nesterov ? avg[i] + p.momentum * momentum[i] : momentum[i]);
  }
  return r;
}

}  // namespace edit::ref
