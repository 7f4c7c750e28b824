// The work loop around the reconciler: informer events to queue keys (status-only
// changes dropped, so the operator's own writes do not re-trigger it), a periodic
// resync, and the workers that reconcile one key at a time.
#include <algorithm>
#include <thread>

#include "controller/reconciler.h"
#include "util/log.h"

namespace edit::op::controller {

Controller::Controller(Reconciler& reconciler, kube::Informer& jobs, kube::Informer& pods, metrics::Metrics& metrics,
                       int workers, int resyncSeconds)
    : reconciler_(reconciler), jobs_(jobs), pods_(pods), metrics_(metrics), workers_(std::max(1, workers)),
      resyncSeconds_(resyncSeconds) {
  jobs_.addHandler([this](const std::string& type, const json& obj) {
    if (changedBeyondStatus(type, obj)) queue_.add(kube::objectKey(obj));
  });
  pods_.addHandler([this](const std::string&, const json& obj) {
    const json labels = obj["metadata"].value("labels", json::object());
    if (labels.contains(api::kLabelJob))
      queue_.add(obj["metadata"].value("namespace", "") + "/" + labels[api::kLabelJob].get<std::string>());
  });
}

Controller::~Controller() { stop(); }

bool Controller::changedBeyondStatus(const std::string& type, const json& obj) {
  const std::string key = kube::objectKey(obj);
  const json& md = obj["metadata"];
  // What a reconcile acts on besides the status: the spec (generation), the labels (Kueue's
  // queue), annotations, deletion and finalizers, and which object it is.
  const std::string seen = json{{"uid", md.value("uid", "")},
                                {"generation", md.value("generation", 0L)},
                                {"labels", md.value("labels", json::object())},
                                {"annotations", md.value("annotations", json::object())},
                                {"deletionTimestamp", md.value("deletionTimestamp", json())},
                                {"finalizers", md.value("finalizers", json::array())}}
                               .dump();
  std::lock_guard<std::mutex> lock(seenMu_);
  if (type == "DELETED") {
    seen_.erase(key);
    return true;
  }
  auto [it, fresh] = seen_.try_emplace(key, seen);
  if (fresh || type == "ADDED") {
    it->second = seen;
    return true;
  }
  if (it->second == seen) return false;
  it->second = seen;
  return true;
}

void Controller::start() {
  for (int i = 0; i < workers_; ++i) threads_.emplace_back([this] { work(); });
  if (resyncSeconds_ > 0)
    threads_.emplace_back([this] {
      auto next = std::chrono::steady_clock::now() + std::chrono::seconds(resyncSeconds_);
      while (!stop_) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        if (std::chrono::steady_clock::now() < next) continue;
        next += std::chrono::seconds(resyncSeconds_);
        for (const auto& key : jobs_.keys()) queue_.add(key);
      }
    });
}

void Controller::stop() {
  if (stop_.exchange(true)) return;
  queue_.shutdown();
  for (auto& t : threads_)
    if (t.joinable()) t.join();
}

void Controller::work() {
  while (auto key = queue_.get()) {
    auto t0 = std::chrono::steady_clock::now();
    auto slash = key->find('/');
    std::string ns = key->substr(0, slash), name = key->substr(slash + 1);
    std::string result = "success";
    try {
      auto requeue = reconciler_.reconcile(ns, name);
      queue_.forget(*key);
      if (requeue) {
        queue_.addAfter(*key, *requeue);
        result = "requeue";
      }
    } catch (const std::exception& e) {
      result = "error";
      log::warn("reconcile failed", {{"namespace", ns}, {"job", name}, {"error", e.what()}});
      queue_.addRateLimited(*key);
    }
    metrics_.reconcileDone(result, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    queue_.done(*key);
  }
}

}  // namespace edit::op::controller
