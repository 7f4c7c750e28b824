// Recovery generations on the job's store (runtime/src/dist/rendezvous.*), on threads over
// loopback: the survivors of a lost peer meet its replacement in one generation, also when
// the lost peer is rank 0, which hosts the store, and when that happens twice.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <thread>

#include "dist/rendezvous.h"
#include "test_util.h"

using namespace edit;
using namespace std::chrono_literals;

namespace {

constexpr int kWorld = 3;
constexpr double kTimeout = 8;
const std::atomic<bool> kNoCancel{false};

MeshSpec spec(int rank, int port, bool join = false) {
  MeshSpec m = test::meshFor(rank, 1, kWorld, port);
  m.join = join;
  return m;
}

// The job as started: every rank connected, the generation formed, the clients' connections
// closed as the trainer closes them once its process groups exist.
std::vector<std::unique_ptr<Rendezvous>> startJob(int port) {
  std::vector<std::unique_ptr<Rendezvous>> r;
  for (int k = 0; k < kWorld; ++k) r.push_back(std::make_unique<Rendezvous>(spec(k, port)));
  for (auto& x : r) x->formed(false);
  return r;
}

// Rank 0 is lost while the survivors rejoin; rank 0's replacement hosts a fresh store and
// joins. When: the survivors start `survivorsAfter` after the test starts, rank 0 leaves
// `leaveAfter`, its replacement comes `replaceAfter` later. Returns the generation each
// rank ended in (index 0: the replacement).
std::vector<int64_t> loseRankZero(std::vector<std::unique_ptr<Rendezvous>>& r, int port,
                                  std::chrono::milliseconds survivorsAfter, std::chrono::milliseconds leaveAfter,
                                  std::chrono::milliseconds replaceAfter) {
  std::vector<int64_t> gen(kWorld, -1);
  std::vector<std::thread> ts;
  const auto t0 = std::chrono::steady_clock::now();
  for (int k = 1; k < kWorld; ++k)
    ts.emplace_back([&, k] {
      std::this_thread::sleep_until(t0 + survivorsAfter);
      try {
        r[k]->rejoin(kTimeout, kNoCancel);
        gen[k] = r[k]->generation();
      } catch (const PeerLost& e) {
        ADD_FAILURE() << "rank " << k << ": " << e.what();
      }
    });
  std::this_thread::sleep_until(t0 + leaveAfter);
  r[0].reset();  // its store goes with it
  std::this_thread::sleep_until(t0 + leaveAfter + replaceAfter);
  r[0] = std::make_unique<Rendezvous>(spec(0, port, /*join=*/true));
  try {
    r[0]->join(kTimeout, kNoCancel);
    gen[0] = r[0]->generation();
  } catch (const PeerLost& e) {
    ADD_FAILURE() << "rank 0's replacement: " << e.what();
  }
  for (auto& t : ts) t.join();
  if (gen == std::vector<int64_t>(kWorld, 1))
    for (auto& x : r) x->formed(false);
  return gen;
}

// Rank 2 is lost and replaced: rank 0's store stays; the survivors move the counter to 1.
void loseRankTwo(std::vector<std::unique_ptr<Rendezvous>>& r, int port) {
  std::vector<std::thread> ts;
  for (int k = 0; k < 2; ++k) ts.emplace_back([&, k] { r[k]->rejoin(kTimeout, kNoCancel); });
  std::this_thread::sleep_for(200ms);
  r[2] = std::make_unique<Rendezvous>(spec(2, port, /*join=*/true));
  r[2]->join(kTimeout, kNoCancel);
  for (auto& t : ts) t.join();
  for (auto& x : r) x->formed(false);
}

}  // namespace

TEST(Rendezvous, SurvivorsMeetAnyReplacementInTheNextGeneration) {
  const int port = test::freePort();
  auto r = startJob(port);
  loseRankTwo(r, port);
  for (auto& x : r) EXPECT_EQ(x->generation(), 1);
}

TEST(Rendezvous, SurvivorsMeetRankZerosReplacementOnItsFreshStore) {
  // The survivors notice after rank 0 is gone, before its replacement listens.
  const int port = test::freePort();
  auto r = startJob(port);
  auto gen = loseRankZero(r, port, 100ms, 0ms, 500ms);
  for (int k = 0; k < kWorld; ++k) EXPECT_EQ(gen[k], 1) << "rank " << k;
}

TEST(Rendezvous, SurvivorsThatReachedTheLeavingStoreMoveToTheFreshOne) {
  // They open generation 1 on rank 0's store while it still answers; then it goes.
  const int port = test::freePort();
  auto r = startJob(port);
  auto gen = loseRankZero(r, port, 0ms, 500ms, 300ms);
  for (int k = 0; k < kWorld; ++k) EXPECT_EQ(gen[k], 1) << "rank " << k;
}

TEST(Rendezvous, RankZeroLostAfterAnotherRecovery) {
  // The survivors' counter (1) is ahead of the fresh store's, which opens generation 1:
  // they must meet the replacement where it waits, not open a generation of their own,
  // whenever they notice: late (the replacement already waits), early, or on the old store.
  const int port = test::freePort();
  auto r = startJob(port);
  loseRankTwo(r, port);
  ASSERT_EQ(r[1]->generation(), 1);
  const std::chrono::milliseconds when[][3] = {{800ms, 0ms, 100ms}, {100ms, 0ms, 500ms}, {0ms, 500ms, 300ms}};
  for (const auto& w : when) {
    auto gen = loseRankZero(r, port, w[0], w[1], w[2]);
    for (int k = 0; k < kWorld; ++k) EXPECT_EQ(gen[k], 1) << "rank " << k << ", survivors after " << w[0].count();
  }
}

TEST(Rendezvous, SurvivorsGiveUpAtTheDeadlineWhenRankZeroNeverReturns) {
  const int port = test::freePort();
  auto r = startJob(port);
  r[0].reset();
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_THROW(r[1]->rejoin(1.5, kNoCancel), PeerLost);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_GE(s, 1.4);
  EXPECT_LT(s, 10);
}

TEST(Rendezvous, NewReplicaOfAScaleUpWaitsPastARecoveryOfTheOldSize) {
  // A 2-rank job grows to 3 (docs/elastic.md). The new rank starts waiting early; a
  // recovery of the old size happens first: the new rank must not arrive in it (it would
  // be a third arrival in a 2-rank generation), and meets the others in the scale's.
  const int port = test::freePort();
  auto at = [&](int rank, int world, bool join) {
    MeshSpec m = test::meshFor(rank, world, 1, port);  // `world` replicas of one shard
    m.join = join;
    return std::make_unique<Rendezvous>(m);
  };
  std::vector<std::unique_ptr<Rendezvous>> r;
  r.push_back(at(0, 2, false));
  r.push_back(at(1, 2, false));
  for (auto& x : r) x->formed(false);
  auto joiner = at(2, 3, true);
  int64_t joinedGen = -1;
  std::thread waiting([&] {
    try {
      joiner->join(kTimeout, kNoCancel);
      joinedGen = joiner->generation();
    } catch (const PeerLost& e) {
      ADD_FAILURE() << "new rank: " << e.what();
    }
  });
  std::this_thread::sleep_for(300ms);
  // The recovery: both ranks rejoin at size 2 and form generation 1 without the new rank.
  {
    std::vector<std::thread> ts;
    for (int k = 0; k < 2; ++k) ts.emplace_back([&, k] { r[k]->rejoin(kTimeout, kNoCancel); });
    for (auto& t : ts) t.join();
    for (auto& x : r) EXPECT_EQ(x->generation(), 1);
    EXPECT_EQ(joinedGen, -1) << "the new rank arrived in a generation of the old size";
    for (auto& x : r) x->formed(false);
  }
  std::this_thread::sleep_for(300ms);
  EXPECT_EQ(joinedGen, -1);
  // The scale: both move to size 3 and meet the new rank in generation 2.
  std::vector<std::thread> ts;
  for (int k = 0; k < 2; ++k)
    ts.emplace_back([&, k] {
      r[k]->setWorld(3);
      r[k]->rejoin(kTimeout, kNoCancel);
    });
  for (auto& t : ts) t.join();
  waiting.join();
  for (auto& x : r) EXPECT_EQ(x->generation(), 2);
  EXPECT_EQ(joinedGen, 2);
}
