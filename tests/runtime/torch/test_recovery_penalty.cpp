// In-place recovery and the penalty, in one process: a 2 x 2 EDiT job on threads loses
// rank 3 (replica 1, shard 1) in a local phase; a replacement joins, everyone rolls back
// to the last sync round and training goes on. Every sync round, before and after the
// recovery, must equal the independent reference (penalty_reference.h) computed from the
// inner weights the ranks held, and the replacement must carry its own replica's anomaly
// statistics (its shard peer's), not the other replica's.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <mutex>

#include "penalty_reference.h"
#include "test_util.h"
#include "train/trainer.h"

using namespace edit;

namespace {

struct Killed {};  // thrown from a hook: the rank "dies" (its process groups close)

struct Record {
  int incarnation = 0;
  int64_t step = 0;  // steps completed
  bool synced = false;
  std::vector<std::vector<double>> slice, outer, momentum;  // [unit]
  std::vector<EwmaDetector> det;
};

std::vector<double> toVec(const torch::Tensor& t) {
  auto c = t.to(torch::kFloat64).contiguous();
  return std::vector<double>(c.data_ptr<double>(), c.data_ptr<double>() + c.numel());
}

TEST(RecoveryPenalty, RoundsAfterAnInPlaceRecoveryMatchTheReference) {
  at::set_num_threads(1);
  const int M = 2, N = 2, W = 4, victim = 3;
  const int64_t killAfter = 14;  // rounds at steps 6, 9, 12, 15, ...: 14 is a local step
  const auto dir = test::tempDir("edit-recovery-penalty");
  auto c = test::smallConfig(test::makeTokenFile(dir, 64, 20000, 11));
  c.training.steps = 27;
  c.algorithm.mode = Mode::Edit;
  c.algorithm.penalty.anomalyWarmup = 2;
  c.algorithm.penalty.clipNorm = 0.5;  // clipping active in some rounds too
  c.runtime.rendezvousTimeoutSeconds = 60;
  const int port = test::freePort();

  std::mutex mu;
  std::vector<std::vector<Record>> recs(W);
  std::vector<int> recovered(W, 0);
  test::runRanks(W, [&](int r) {
    auto attempt = [&](int incarnation) {
      auto mesh = test::meshFor(r, M, N, port);
      mesh.join = incarnation > 0;
      Trainer* self = nullptr;
      TrainerHooks hooks;
      hooks.onStep = [&, incarnation](const StepReport& rep) {
        Record rec;
        rec.incarnation = incarnation;
        rec.step = rep.step;
        rec.synced = rep.synced;
        for (auto& u : self->units()) rec.slice.push_back(toVec(u.slice));
        for (auto& o : self->outer()) {
          rec.outer.push_back(toVec(o.outer));
          rec.momentum.push_back(toVec(o.momentum));
        }
        rec.det = self->detectors();
        {
          std::lock_guard<std::mutex> lock(mu);
          recs[r].push_back(std::move(rec));
        }
        if (r == victim && incarnation == 0 && rep.step == killAfter) throw Killed{};
      };
      Trainer tr(c, mesh, hooks);
      self = &tr;
      const auto res = tr.run();
      recovered[r] = res.recoveries;
    };
    try {
      attempt(0);
    } catch (const Killed&) {
      attempt(1);  // the replacement, after the first incarnation's groups are gone
    }
  });
  for (int r = 0; r < W; ++r)
    if (r != victim) EXPECT_EQ(recovered[r], 1) << "rank " << r << " did not recover in place";

  // The replacement's statistics right after it joined: those of its shard peer (same
  // replica), which differ from the other replica's.
  const Record* firstNew = nullptr;
  for (auto& rec : recs[victim])
    if (rec.incarnation == 1) {
      firstNew = &rec;
      break;
    }
  ASSERT_NE(firstNew, nullptr);
  const Record* peer = nullptr;
  for (auto& rec : recs[2])
    if (rec.step == firstNew->step) peer = &rec;  // the last one: after the rollback
  ASSERT_NE(peer, nullptr);
  bool differsFromReplica0 = false;
  for (size_t u = 0; u < firstNew->det.size(); ++u) {
    EXPECT_EQ(firstNew->det[u].mean, peer->det[u].mean) << "unit " << u;
    EXPECT_EQ(firstNew->det[u].var, peer->det[u].var) << "unit " << u;
    EXPECT_EQ(firstNew->det[u].count, peer->det[u].count) << "unit " << u;
    for (auto& rec : recs[1])
      if (rec.step == firstNew->step) differsFromReplica0 |= rec.det[u].mean != firstNew->det[u].mean;
  }
  EXPECT_TRUE(differsFromReplica0) << "the test cannot tell the replicas' statistics apart";

  // Rounds: a record with synced=true follows the record of the step before (the inner
  // weights the round saw) in the same rank's history.
  std::map<int64_t, std::vector<std::pair<const Record*, const Record*>>> rounds;  // step -> per rank
  for (int r = 0; r < W; ++r)
    for (size_t i = 1; i < recs[r].size(); ++i) {
      const auto& post = recs[r][i];
      const auto& pre = recs[r][i - 1];
      if (!post.synced || pre.step + 1 != post.step || pre.incarnation != post.incarnation) continue;
      auto& v = rounds[post.step];
      v.resize(W);
      v[r] = {&pre, &post};
    }
  ASSERT_GE(rounds.size(), 6u);

  ref::Params p;
  p.warmup = c.algorithm.penalty.anomalyWarmup;
  p.clipNorm = c.algorithm.penalty.clipNorm;
  const size_t U = recs[0][0].slice.size();
  std::vector<std::vector<ref::Stats>> stats(U, std::vector<ref::Stats>(M));
  std::vector<std::vector<double>> momentum(U);
  int afterRecovery = 0, clipped = 0;
  for (auto& [step, perRank] : rounds) {
    for (int r = 0; r < W; ++r) ASSERT_NE(perRank[r].first, nullptr) << "rank " << r << " has no round at " << step;
    afterRecovery += perRank[victim].second->incarnation == 1;
    for (size_t u = 0; u < U; ++u) {
      auto cat = [&](int replica, auto field) {
        std::vector<double> v;
        for (int s = 0; s < N; ++s) {
          const auto& part = (perRank[replica * N + s].first->*field)[u];
          v.insert(v.end(), part.begin(), part.end());
        }
        return v;
      };
      auto outer = cat(0, &Record::outer);
      if (momentum[u].empty()) momentum[u].assign(outer.size(), 0.0);
      std::vector<std::vector<double>> D(M);
      for (int m = 0; m < M; ++m) {
        auto inner = cat(m, &Record::slice);
        D[m].resize(inner.size());
        for (size_t i = 0; i < inner.size(); ++i)
          D[m][i] = static_cast<float>(static_cast<float>(outer[i]) - static_cast<float>(inner[i]));
      }
      const auto rr = ref::round(D, stats[u], outer, momentum[u], p);
      clipped += rr.clipFactor < 1;
      for (int r = 0; r < W; ++r) {
        const int m = r / N, s = r % N;
        const auto& post = *perRank[r].second;
        const std::string at = "round at step " + std::to_string(step) + " unit " + std::to_string(u) +
                               " rank " + std::to_string(r) + (post.incarnation ? " (replacement)" : "");
        EXPECT_NEAR(post.det[u].mean, stats[u][m].mean, 1e-6 * (1 + stats[u][m].mean)) << at;
        EXPECT_NEAR(post.det[u].var, stats[u][m].var, 1e-4 * stats[u][m].var + 1e-12) << at;
        EXPECT_EQ(post.det[u].count, stats[u][m].n) << at;
        const auto& got = post.outer[u];
        const size_t chunk = got.size();
        for (size_t i = 0; i < chunk; ++i) {
          const double want = outer[s * chunk + i];
          if (std::fabs(got[i] - want) > 1e-5 * (1 + std::fabs(want))) {
            ADD_FAILURE() << at << " element " << i << ": outer " << got[i] << ", reference " << want;
            break;
          }
        }
      }
    }
  }
  EXPECT_GE(afterRecovery, 3) << "too few rounds after the recovery to check";
  EXPECT_GT(clipped, 0) << "no round clipped";
  std::filesystem::remove_all(dir);
}

}  // namespace
