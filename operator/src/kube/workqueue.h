// A rate-limited work queue with client-go's semantics: a key is queued at most once
// (dedup), never handed to two workers at once (a key added while processing is queued
// again on done()), per-key exponential backoff for failures and a global token bucket.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>

namespace edit::op::kube {

class WorkQueue {
 public:
  using Clock = std::chrono::steady_clock;

  struct Options {
    std::chrono::milliseconds baseDelay{50};   // first failure retry delay
    std::chrono::milliseconds maxDelay{60000}; // backoff cap
    double qps = 20;                           // global token bucket for rate-limited adds
    int burst = 100;
  };

  WorkQueue();
  explicit WorkQueue(Options opts);

  void add(const std::string& key);
  void addAfter(const std::string& key, std::chrono::milliseconds delay);
  // Backoff for a key whose processing failed: max(per-key exponential, token bucket).
  void addRateLimited(const std::string& key);
  void forget(const std::string& key);  // resets the key's failure count
  int numRequeues(const std::string& key) const;

  // Blocks until a key is ready; nullopt once shut down.
  std::optional<std::string> get();
  void done(const std::string& key);
  void shutdown();
  size_t length() const;

  // The delay addRateLimited would use now (exposed for tests); counts as a failure.
  std::chrono::milliseconds nextBackoff(const std::string& key);

 private:
  void addLocked(const std::string& key);
  void promoteReadyLocked(Clock::time_point now);

  Options opts_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::string> queue_;
  std::set<std::string> dirty_;
  std::set<std::string> processing_;
  std::multimap<Clock::time_point, std::string> waiting_;
  std::map<std::string, int> failures_;
  double tokens_;
  Clock::time_point lastRefill_;
  bool shutdown_ = false;
};

}  // namespace edit::op::kube
