#include "kube/workqueue.h"

#include <algorithm>
#include <cmath>

namespace edit::op::kube {

WorkQueue::WorkQueue() : WorkQueue(Options{}) {}

WorkQueue::WorkQueue(Options opts) : opts_(opts), tokens_(opts.burst), lastRefill_(Clock::now()) {}

void WorkQueue::addLocked(const std::string& key) {
  if (shutdown_ || dirty_.count(key)) return;
  dirty_.insert(key);
  if (processing_.count(key)) return;  // re-queued by done()
  queue_.push_back(key);
  cv_.notify_one();
}

void WorkQueue::add(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  addLocked(key);
}

void WorkQueue::addAfter(const std::string& key, std::chrono::milliseconds delay) {
  if (delay.count() <= 0) return add(key);
  std::lock_guard<std::mutex> lock(mu_);
  if (shutdown_) return;
  auto when = Clock::now() + delay;
  // Keep only the earliest pending time per key.
  for (auto it = waiting_.begin(); it != waiting_.end(); ++it) {
    if (it->second != key) continue;
    if (it->first <= when) return;
    waiting_.erase(it);
    break;
  }
  waiting_.emplace(when, key);
  cv_.notify_all();
}

std::chrono::milliseconds WorkQueue::nextBackoff(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  int n = failures_[key]++;
  double perKey = static_cast<double>(opts_.baseDelay.count()) * std::pow(2.0, std::min(n, 30));
  perKey = std::min(perKey, static_cast<double>(opts_.maxDelay.count()));
  auto now = Clock::now();
  double elapsed = std::chrono::duration<double>(now - lastRefill_).count();
  lastRefill_ = now;
  tokens_ = std::min<double>(opts_.burst, tokens_ + elapsed * opts_.qps);
  tokens_ -= 1;  // reservation: may go negative, the debt is the wait
  double bucketMs = tokens_ >= 0 ? 0 : (-tokens_ / opts_.qps) * 1000.0;
  return std::chrono::milliseconds(static_cast<long>(std::max(perKey, bucketMs)));
}

void WorkQueue::addRateLimited(const std::string& key) { addAfter(key, nextBackoff(key)); }

void WorkQueue::forget(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  failures_.erase(key);
}

int WorkQueue::numRequeues(const std::string& key) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = failures_.find(key);
  return it == failures_.end() ? 0 : it->second;
}

void WorkQueue::promoteReadyLocked(Clock::time_point now) {
  while (!waiting_.empty() && waiting_.begin()->first <= now) {
    std::string key = waiting_.begin()->second;
    waiting_.erase(waiting_.begin());
    addLocked(key);
  }
}

std::optional<std::string> WorkQueue::get() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    if (shutdown_) return std::nullopt;
    promoteReadyLocked(Clock::now());
    if (!queue_.empty()) break;
    if (waiting_.empty())
      cv_.wait(lock);
    else
      cv_.wait_until(lock, waiting_.begin()->first);
  }
  std::string key = queue_.front();
  queue_.pop_front();
  dirty_.erase(key);
  processing_.insert(key);
  return key;
}

void WorkQueue::done(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  processing_.erase(key);
  if (dirty_.count(key) && !shutdown_) {
    queue_.push_back(key);
    cv_.notify_one();
  }
}

void WorkQueue::shutdown() {
  std::lock_guard<std::mutex> lock(mu_);
  shutdown_ = true;
  cv_.notify_all();
}

size_t WorkQueue::length() const {
  std::lock_guard<std::mutex> lock(mu_);
  return queue_.size();
}

}  // namespace edit::op::kube
