// The rate-limited work queue: dedup, no concurrent processing of a key, delays, backoff.
#include <gtest/gtest.h>

#include <thread>

#include "kube/workqueue.h"

using edit::op::kube::WorkQueue;
using namespace std::chrono_literals;

TEST(WorkQueue, DeduplicatesKeys) {
  WorkQueue q;
  q.add("a");
  q.add("a");
  q.add("b");
  EXPECT_EQ(q.length(), 2u);
  EXPECT_EQ(*q.get(), "a");
  EXPECT_EQ(*q.get(), "b");
}

TEST(WorkQueue, KeyAddedWhileProcessingIsRequeuedOnDone) {
  WorkQueue q;
  q.add("a");
  auto k = q.get();
  q.add("a");
  EXPECT_EQ(q.length(), 0u);  // not handed out twice at once
  q.done(*k);
  EXPECT_EQ(q.length(), 1u);
  EXPECT_EQ(*q.get(), "a");
}

TEST(WorkQueue, AddAfterWaitsAndKeepsTheEarliest) {
  WorkQueue q;
  auto t0 = std::chrono::steady_clock::now();
  q.addAfter("a", 300ms);
  q.addAfter("a", 80ms);
  auto k = q.get();
  auto waited = std::chrono::steady_clock::now() - t0;
  EXPECT_EQ(*k, "a");
  EXPECT_GE(waited, 70ms);
  EXPECT_LT(waited, 280ms);
}

TEST(WorkQueue, PerKeyExponentialBackoffAndForget) {
  WorkQueue::Options o;
  o.baseDelay = 10ms;
  o.maxDelay = 100ms;
  o.qps = 1e6;
  WorkQueue q(o);
  EXPECT_EQ(q.nextBackoff("a").count(), 10);
  EXPECT_EQ(q.nextBackoff("a").count(), 20);
  EXPECT_EQ(q.nextBackoff("a").count(), 40);
  EXPECT_EQ(q.nextBackoff("a").count(), 80);
  EXPECT_EQ(q.nextBackoff("a").count(), 100);  // capped
  EXPECT_EQ(q.nextBackoff("b").count(), 10);   // per key
  EXPECT_EQ(q.numRequeues("a"), 5);
  q.forget("a");
  EXPECT_EQ(q.numRequeues("a"), 0);
  EXPECT_EQ(q.nextBackoff("a").count(), 10);
}

TEST(WorkQueue, GlobalTokenBucketLimitsBursts) {
  WorkQueue::Options o;
  o.baseDelay = 1ms;
  o.qps = 10;
  o.burst = 2;
  WorkQueue q(o);
  EXPECT_LE(q.nextBackoff("a").count(), 1);
  EXPECT_LE(q.nextBackoff("b").count(), 1);
  EXPECT_GE(q.nextBackoff("c").count(), 90);  // the bucket is empty: ~100 ms per token
}

TEST(WorkQueue, ShutdownWakesWaiters) {
  WorkQueue q;
  std::thread t([&] { EXPECT_FALSE(q.get().has_value()); });
  std::this_thread::sleep_for(50ms);
  q.shutdown();
  t.join();
}
