// Leader election on a coordination.k8s.io/v1 Lease, like client-go's leaderelection:
// acquire when the lease is free or its holder stopped renewing for leaseDuration
// (judged by our own clock since we last saw the record change, not the holder's
// timestamps), renew every retryPeriod, and give up when renewals fail for renewDeadline.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <string>

#include "kube/client.h"

namespace edit::op::leader {

struct LeaseSettings {
  std::string ns = "default";
  std::string name = "edit-operator";
  std::string identity;  // hostname_pid
  std::chrono::seconds leaseDuration{15};
  std::chrono::seconds renewDeadline{10};
  std::chrono::seconds retryPeriod{2};
};

class LeaderElector {
 public:
  LeaderElector(kube::Client& client, LeaseSettings s) : client_(client), s_(std::move(s)) {}

  // Blocks: waits to acquire, calls onStarted, renews until stop or loss. Returns true
  // when it stopped because `stop` was set (the lease is then released), false when the
  // lease was lost.
  bool run(const std::function<void()>& onStarted, const std::atomic<bool>& stop);

  // One acquire-or-renew attempt (exposed for tests).
  bool tryAcquireOrRenew();
  void release();
  bool isLeader() const { return leader_; }

 private:
  // Expiry is judged by our own clock from the moment the holder/renewTime last changed
  // (clocks of other instances are not trusted), as client-go does.
  void observe(const std::string& holder, const std::string& renew);
  kube::Client& client_;
  LeaseSettings s_;
  std::atomic<bool> leader_{false};
  std::string observedHolder_;
  std::string observedRenew_;
  std::chrono::steady_clock::time_point observedAt_{};
};

std::string defaultIdentity();

}  // namespace edit::op::leader
