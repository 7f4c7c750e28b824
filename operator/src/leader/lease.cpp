#include "leader/lease.h"

#include <unistd.h>

#include <cstdio>
#include <thread>

#include "util/log.h"

namespace edit::op::leader {

namespace {
std::string microTimeNow() {
  auto now = std::chrono::system_clock::now();
  auto us = std::chrono::duration_cast<std::chrono::microseconds>(now.time_since_epoch()).count();
  std::string s = log::rfc3339(static_cast<std::time_t>(us / 1000000));
  char frac[16];
  std::snprintf(frac, sizeof frac, ".%06lldZ", static_cast<long long>(us % 1000000));
  s.pop_back();
  return s + frac;
}
}  // namespace

std::string defaultIdentity() {
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  return std::string(host) + "_" + std::to_string(getpid());
}

bool LeaderElector::mayWrite() const {
  const int64_t now = std::chrono::steady_clock::now().time_since_epoch().count();
  return leader_ && now - renewedAt_.load() < std::chrono::nanoseconds(s_.renewDeadline).count();
}

void LeaderElector::observe(const std::string& holder, const std::string& renew) {
  observedHolder_ = holder;
  observedRenew_ = renew;
  observedAt_ = std::chrono::steady_clock::now();
}

bool LeaderElector::tryAcquireOrRenew() {
  namespace res = kube::resources;
  const std::string now = microTimeNow();
  const long duration = static_cast<long>(s_.leaseDuration.count());
  auto lease = client_.tryGet(res::Leases, s_.ns, s_.name);
  if (!lease) {
    kube::json obj = {{"apiVersion", "coordination.k8s.io/v1"},
                      {"kind", "Lease"},
                      {"metadata", {{"name", s_.name}, {"namespace", s_.ns}}},
                      {"spec",
                       {{"holderIdentity", s_.identity}, {"leaseDurationSeconds", duration}, {"acquireTime", now},
                        {"renewTime", now}, {"leaseTransitions", 0}}}};
    try {
      client_.create(res::Leases, s_.ns, obj);
    } catch (const kube::ApiError& e) {
      if (e.conflict()) return false;
      throw;
    }
    observe(s_.identity, now);
    return true;
  }
  kube::json spec = lease->value("spec", kube::json::object());
  std::string holder = spec.value("holderIdentity", "");
  std::string renew = spec.value("renewTime", "");
  long holderDuration = spec.value("leaseDurationSeconds", duration);
  if (holder != observedHolder_ || renew != observedRenew_) observe(holder, renew);
  bool mine = holder == s_.identity;
  bool expired = holder.empty() ||
                 std::chrono::steady_clock::now() - observedAt_ > std::chrono::seconds(holderDuration);
  if (!mine && !expired) return false;
  spec["holderIdentity"] = s_.identity;
  spec["leaseDurationSeconds"] = duration;
  spec["renewTime"] = now;
  if (!mine) {
    spec["acquireTime"] = now;
    spec["leaseTransitions"] = spec.value("leaseTransitions", 0) + 1;
  }
  (*lease)["spec"] = spec;
  try {
    client_.update(res::Leases, s_.ns, *lease);  // carries resourceVersion: 409 if someone else won
  } catch (const kube::ApiError& e) {
    if (e.conflict()) return false;
    throw;
  }
  observe(s_.identity, now);
  return true;
}

void LeaderElector::release() {
  if (!leader_) return;
  if (beforeRelease_) beforeRelease_();
  leader_ = false;
  try {
    auto lease = client_.tryGet(kube::resources::Leases, s_.ns, s_.name);
    if (!lease || (*lease)["spec"].value("holderIdentity", "") != s_.identity) return;
    (*lease)["spec"]["holderIdentity"] = "";
    (*lease)["spec"]["leaseDurationSeconds"] = 1;
    (*lease)["spec"]["renewTime"] = microTimeNow();
    client_.update(kube::resources::Leases, s_.ns, *lease);
    log::info("released leader lease", {{"lease", s_.ns + "/" + s_.name}});
  } catch (const std::exception& e) {
    log::warn("could not release lease", {{"error", e.what()}});
  }
}

bool LeaderElector::run(const std::function<void()>& onStarted, const std::atomic<bool>& stop) {
  auto sleepFor = [&stop](std::chrono::milliseconds d) {
    auto until = std::chrono::steady_clock::now() + d;
    while (!stop && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  };
  log::info("waiting for leader lease", {{"lease", s_.ns + "/" + s_.name}, {"identity", s_.identity}});
  while (!stop) {
    bool ok = false;
    try {
      ok = tryAcquireOrRenew();
    } catch (const std::exception& e) {
      log::warn("lease acquire failed", {{"error", e.what()}});
    }
    if (ok) break;
    sleepFor(s_.retryPeriod);
  }
  if (stop) return true;
  renewedAt_ = std::chrono::steady_clock::now().time_since_epoch().count();
  leader_ = true;
  log::info("became leader", {{"lease", s_.ns + "/" + s_.name}, {"identity", s_.identity}});
  onStarted();
  auto lastRenew = std::chrono::steady_clock::now();
  while (!stop) {
    sleepFor(s_.retryPeriod);
    if (stop) break;
    bool ok = false;
    try {
      ok = tryAcquireOrRenew();
    } catch (const std::exception& e) {
      log::warn("lease renew failed", {{"error", e.what()}});
    }
    if (ok) {
      lastRenew = std::chrono::steady_clock::now();
      renewedAt_ = lastRenew.time_since_epoch().count();
    } else if (std::chrono::steady_clock::now() - lastRenew > s_.renewDeadline) {
      leader_ = false;
      log::error("lost leader lease", {{"lease", s_.ns + "/" + s_.name}, {"identity", s_.identity}});
      return false;
    }
  }
  release();
  return true;
}

bool setLeaderLabel(kube::Client& client, const OwnPod& pod, bool leader) {
  if (!pod.known()) return true;
  const kube::json value = leader ? kube::json("true") : kube::json(nullptr);
  try {
    client.mergePatch(kube::resources::Pods, pod.ns, pod.name, {{"metadata", {{"labels", {{kLeaderLabel, value}}}}}});
    log::info(leader ? "labelled own pod as the leader" : "own pod not labelled as the leader",
              {{"pod", pod.ns + "/" + pod.name}, {"label", kLeaderLabel}});
    return true;
  } catch (const std::exception& e) {
    log::warn("could not label own pod (workers reach the telemetry Service only on the leader's pod)",
              {{"pod", pod.ns + "/" + pod.name}, {"label", kLeaderLabel}, {"error", e.what()}});
    return false;
  }
}

}  // namespace edit::op::leader
