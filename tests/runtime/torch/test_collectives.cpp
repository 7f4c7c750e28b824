// Collectives of the mesh, on W threads over loopback Gloo.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <thread>

#include "dist/comm.h"
#include "dist/thread_slices.h"
#include "test_util.h"

using namespace edit;

TEST(Collectives, RingReduceScatterMatchesSum) {
  for (int N : {2, 3, 4}) {
    const int port = test::freePort();
    const int64_t chunk = 5;
    std::vector<torch::Tensor> inputs, outputs(N);
    for (int r = 0; r < N; ++r) inputs.push_back(torch::randn({N * chunk}));
    auto sum = torch::stack(inputs).sum(0);
    test::runRanks(N, [&](int r) {
      Comm comm(test::meshFor(r, 1, N, port));
      auto buf = inputs[r].clone();
      comm.reduceScatterSum(Group::Shard, buf);
      outputs[r] = buf.narrow(0, r * chunk, chunk).clone();
      auto c = comm.counters();
      EXPECT_EQ(c.at({"reduce_scatter", "shard"}).bytes, static_cast<uint64_t>((N - 1) * chunk * 4));
    });
    for (int r = 0; r < N; ++r)
      EXPECT_TRUE(torch::allclose(outputs[r], sum.narrow(0, r * chunk, chunk), 1e-5, 1e-6)) << N << " " << r;
  }
}

TEST(Collectives, AllToAllDeliversChunkIToRankIAsBytes) {
  // uint8 records (the int8 sync's): chunk i of rank r's buffer holds (r, i) and must land
  // in chunk r of rank i's; each rank sends the n-1 chunks that leave it.
  for (int N : {2, 3, 4}) {
    const int port = test::freePort();
    const int64_t chunk = 6;
    std::vector<torch::Tensor> got(N);
    test::runRanks(N, [&](int r) {
      Comm comm(test::meshFor(r, N, 1, port));
      auto send = torch::empty({N * chunk}, torch::kUInt8), recv = torch::zeros_like(send);
      for (int i = 0; i < N; ++i) send.narrow(0, i * chunk, chunk).fill_(16 * r + i);
      comm.alltoall(Group::Sync, send, recv);
      got[r] = recv;
      EXPECT_EQ(comm.counters().at({"alltoall", "sync"}).bytes, static_cast<uint64_t>((N - 1) * chunk));
    });
    for (int i = 0; i < N; ++i)
      for (int r = 0; r < N; ++r)
        EXPECT_TRUE(torch::equal(got[i].narrow(0, r * chunk, chunk), torch::full({chunk}, 16 * r + i, torch::kUInt8)))
            << N << " ranks: chunk " << r << " of rank " << i;
  }
}

TEST(Collectives, GroupsFollowTheMesh) {
  // M=2 replicas x N=2 shards: shard group = same replica, sync group = same shard.
  const int port = test::freePort();
  std::vector<double> shardSum(4), syncSum(4), worldSum(4);
  test::runRanks(4, [&](int r) {
    Comm comm(test::meshFor(r, 2, 2, port));
    EXPECT_EQ(comm.replica(), r / 2);
    EXPECT_EQ(comm.shard(), r % 2);
    auto a = torch::full({1}, static_cast<double>(r), torch::kFloat64), b = a.clone(), c = a.clone();
    comm.allreduce(Group::Shard, a);
    comm.allreduce(Group::Sync, b);
    comm.allreduce(Group::World, c);
    shardSum[r] = a.item<double>();
    syncSum[r] = b.item<double>();
    worldSum[r] = c.item<double>();
  });
  EXPECT_EQ(shardSum, (std::vector<double>{1, 1, 5, 5}));
  EXPECT_EQ(syncSum, (std::vector<double>{2, 4, 2, 4}));
  EXPECT_EQ(worldSum, (std::vector<double>{6, 6, 6, 6}));
}

TEST(Collectives, CommStreamRunsTasksInOrderAndCountsWaits) {
  const int port = test::freePort();
  test::runRanks(2, [&](int r) {
    Comm comm(test::meshFor(r, 1, 2, port));
    CommStream stream(comm);
    std::vector<int> order;
    std::vector<Pending> fs;
    for (int i = 0; i < 5; ++i)
      fs.push_back(stream.enqueue([&, i] {
        auto t = torch::ones({4});
        comm.allreduce(Group::Shard, t);
        EXPECT_EQ(t[0].item<float>(), 2.0f);
        order.push_back(i);
      }));
    for (auto& f : fs) stream.wait(f, Group::Shard, CommOp::AllReduce);
    EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3, 4}));
    EXPECT_EQ(comm.counters().at({"allreduce", "shard"}).calls, 5u);
  });
}

// A peer that is gone must surface as PeerLost (the trainer recovers from that) from
// every collective, also where Gloo fails while starting one: its send writes at once.
// A gloo::IoException escaping instead ended a survivor with exit 1 (fault suite).
TEST(Collectives, ALostPeerIsPeerLostWhereverTheCollectiveFails) {
  const int port = test::freePort();
  std::vector<std::string> caught(3);
  test::runRanks(3, [&](int r) {
    auto mesh = test::meshFor(r, 1, 3, port);
    mesh.timeoutSeconds = 20;
    auto comm = std::make_unique<Comm>(mesh);
    auto t = torch::ones({1});
    comm->allreduce(Group::Shard, t);  // all three connected
    if (r == 2) {
      comm.reset();  // leaves: its connections close
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    try {
      for (int i = 0; i < 50; ++i) {
        auto buf = torch::ones({3 * 4096});
        comm->reduceScatterSum(Group::Shard, buf);
      }
      caught[r] = "nothing";
    } catch (const PeerLost&) {
      caught[r] = "PeerLost";
    } catch (const std::exception& e) {
      caught[r] = std::string("another exception: ") + e.what();
    }
  });
  EXPECT_EQ(caught[0], "PeerLost");
  EXPECT_EQ(caught[1], "PeerLost");
}

TEST(Mesh, EnvironmentErrorsNameTheVariable) {
  ::setenv("RANK", "5", 1);
  ::setenv("WORLD_SIZE", "4", 1);
  EXPECT_THROW(
      {
        try {
          MeshSpec::fromEnvironment();
        } catch (const std::runtime_error& e) {
          EXPECT_NE(std::string(e.what()).find("RANK"), std::string::npos);
          throw;
        }
      },
      std::runtime_error);
  ::setenv("RANK", "1", 1);
  ::setenv("EDIT_SHARDS", "3", 1);
  EXPECT_THROW(MeshSpec::fromEnvironment(), std::runtime_error);
  ::unsetenv("RANK");
  ::unsetenv("WORLD_SIZE");
  ::unsetenv("EDIT_SHARDS");
}

TEST(Collectives, CommStreamRunsItsOpsOnOneThread) {
  at::set_num_threads(2);
  MeshSpec m = test::meshFor(0, 1, 1, test::freePort());
  Comm comm(m);
  CommStream stream(comm);
  int inside = 0;
  auto p = stream.enqueue([&] { inside = at::get_num_threads(); });
  stream.wait(p, Group::Shard, CommOp::Sync);
  EXPECT_EQ(inside, 1);
  EXPECT_EQ(at::get_num_threads(), 2);  // the training thread keeps its team
  at::set_num_threads(1);
}

TEST(Collectives, ThreadsThatCarryCollectivesGetShortSlicesAndTheTrainingThreadKeepsItsOwn) {
  // dist/thread_slices.h: the Gloo threads a Comm starts and the communication stream's
  // thread ask for 100 us slices (EDIT_COMM_SLICE_US's default); the thread that built
  // them (the training thread) is left alone. Two ranks on threads of this process.
  if (threadSliceNanos(currentThreadId()) == 0)
    GTEST_SKIP() << "this kernel reports no slice (Linux < 6.12, no custom slices): nothing to check";
  const int port = test::freePort();
  std::vector<int> streamTids(2);
  std::vector<uint64_t> ownBefore(2), ownAfter(2);
  std::vector<int> selves(2);
  test::runRanks(2, [&](int r) {
    selves[r] = currentThreadId();
    ownBefore[r] = threadSliceNanos(selves[r]);
    // The store first (rank 0's server starts a thread per client), both ranks connected,
    // then the threads as they were before the groups.
    const auto spec = test::meshFor(r, 1, 2, port);
    auto store = connectStore(spec);
    store->add("arrived", 1);
    while (store->add("arrived", 0) < 2) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    const auto before = processThreads();
    Comm comm(spec, store, "slices/");
    CommStream stream(comm);
    // A collective on the stream: once it returns, both ranks have built their groups
    // and both streams' threads run.
    stream.wait(stream.enqueue([&] {
                  streamTids[r] = currentThreadId();
                  auto t = torch::ones({1});
                  comm.allreduce(Group::Shard, t);
                }),
                Group::Shard, CommOp::Sync);
    ownAfter[r] = threadSliceNanos(selves[r]);
    EXPECT_EQ(threadSliceNanos(streamTids[r]), 100000u) << "rank " << r << ": the communication thread";
    int started = 0;
    for (int tid : processThreads())
      if (!before.count(tid) && tid != selves[0] && tid != selves[1]) {
        const uint64_t slice = threadSliceNanos(tid);
        if (slice == 0 && !processThreads().count(tid)) continue;  // a short-lived thread, gone since
        ++started;
        EXPECT_EQ(slice, 100000u) << "rank " << r << ": thread " << tid << ", started by a Comm";
      }
    EXPECT_GT(started, 2) << "the Comms started no Gloo thread besides the two streams' threads";
  });
  for (int r = 0; r < 2; ++r)
    EXPECT_EQ(ownAfter[r], ownBefore[r]) << "rank " << r << ": the training thread's slice changed";
}
