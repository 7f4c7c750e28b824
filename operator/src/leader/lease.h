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

  // Runs just before a clean stop releases the Lease (while still leading).
  void setBeforeRelease(std::function<void()> fn) { beforeRelease_ = std::move(fn); }

  // Whether this process may write to the API now: it holds the lease and renewed it
  // within renewDeadline by its own clock (monotonic, so a process stopped with SIGSTOP or
  // on a frozen node finds on waking that its time ran out, before its lease is seen
  // lost). Every write of the controller asks it first (kube::Client::setWriteGuard).
  bool mayWrite() const;

  // One acquire-or-renew attempt (exposed for tests).
  bool tryAcquireOrRenew();
  void release();

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
  std::atomic<int64_t> renewedAt_{0};  // steady_clock nanoseconds of the last successful renew
  std::function<void()> beforeRelease_;
};

std::string defaultIdentity();

// Workers reach the leader through the chart's telemetry Service, which selects the pods
// carrying this label; the leader sets it on its own pod and removes it before it stops
// leading (and every replica removes it when it starts: a restarted container keeps its
// pod's labels).
inline constexpr const char* kLeaderLabel = "edit.io/operator-leader";

// The pod this process runs in (POD_NAMESPACE, POD_NAME); empty outside a pod.
struct OwnPod {
  std::string ns, name;
  bool known() const { return !ns.empty() && !name.empty(); }
};

// Sets (leader) or removes the label with a merge patch; a no-op outside a pod. Failures
// are logged (telemetry then does not reach this replica through the Service), not thrown.
bool setLeaderLabel(kube::Client& client, const OwnPod& pod, bool leader);

}  // namespace edit::op::leader
