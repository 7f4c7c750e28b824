#include "kube/informer.h"

#include <random>
#include <set>

#include "util/log.h"

namespace edit::op::kube {

std::string objectKey(const json& obj) {
  const json& md = obj.at("metadata");
  return md.value("namespace", "") + "/" + md.value("name", "");
}

namespace {
std::string rvOf(const json& obj) {
  return obj.contains("metadata") ? obj["metadata"].value("resourceVersion", "") : "";
}
}  // namespace

Informer::Informer(Client& client, ResourceType rt, std::vector<std::string> namespaces, std::string labelSelector)
    : client_(client), rt_(std::move(rt)), namespaces_(std::move(namespaces)), labelSelector_(std::move(labelSelector)) {
  if (namespaces_.empty()) namespaces_.push_back("");  // all namespaces
}

Informer::~Informer() { stop(); }

void Informer::addHandler(Handler h) {
  std::lock_guard<std::mutex> lock(mu_);
  handlers_.push_back(std::move(h));
}

void Informer::start() {
  for (const auto& ns : namespaces_) threads_.emplace_back([this, ns] { run(ns); });
}

void Informer::stop() {
  if (stop_.exchange(true)) return;
  for (auto& t : threads_)
    if (t.joinable()) t.join();
}

bool Informer::hasSynced() const { return synced_.load() >= static_cast<int>(namespaces_.size()); }

std::optional<json> Informer::get(const std::string& ns, const std::string& name) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = cache_.find(ns + "/" + name);
  if (it == cache_.end()) return std::nullopt;
  return it->second;
}

std::vector<json> Informer::list(const std::string& ns, const std::map<std::string, std::string>& labels) const {
  std::vector<json> out;
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [key, obj] : cache_) {
    if (!ns.empty() && obj["metadata"].value("namespace", "") != ns) continue;
    const json lbl = obj["metadata"].value("labels", json::object());
    bool match = true;
    for (const auto& [k, v] : labels)
      if (!lbl.contains(k) || lbl[k] != v) match = false;
    if (match) out.push_back(obj);
  }
  return out;
}

std::vector<std::string> Informer::keys() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> out;
  for (const auto& kv : cache_) out.push_back(kv.first);
  return out;
}

void Informer::notify(const std::string& type, const json& obj) {
  std::vector<Handler> hs;
  {
    std::lock_guard<std::mutex> lock(mu_);
    hs = handlers_;
  }
  for (auto& h : hs) h(type, obj);
}

void Informer::apply(const std::string& type, const json& obj) {
  std::string key = objectKey(obj);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (type == "DELETED")
      cache_.erase(key);
    else
      cache_[key] = obj;
  }
  notify(type, obj);
}

// Replaces this namespace's part of the cache with a fresh list; returns its resourceVersion.
std::string Informer::relist(const std::string& ns) {
  json lst = client_.list(rt_, ns, ListOptions{labelSelector_, "", ""});
  std::vector<std::pair<std::string, json>> changes;
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::set<std::string> seen;
    for (auto item : lst.value("items", json::array())) {
      // List items carry no kind/apiVersion; handlers may want them.
      item["kind"] = rt_.kind;
      item["apiVersion"] = rt_.apiVersion();
      std::string key = objectKey(item);
      seen.insert(key);
      auto it = cache_.find(key);
      if (it == cache_.end()) {
        changes.emplace_back("ADDED", item);
      } else if (rvOf(it->second) != rvOf(item)) {
        changes.emplace_back("MODIFIED", item);
      }
      cache_[key] = item;
    }
    for (auto it = cache_.begin(); it != cache_.end();) {
      bool inNs = ns.empty() || it->second["metadata"].value("namespace", "") == ns;
      if (inNs && !seen.count(it->first)) {
        changes.emplace_back("DELETED", it->second);
        it = cache_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& [type, obj] : changes) notify(type, obj);
  return lst.contains("metadata") ? lst["metadata"].value("resourceVersion", "") : "";
}

void Informer::run(const std::string& ns) {
  std::mt19937 rng(std::random_device{}());
  double backoff = 0.2;
  bool syncedHere = false;
  auto sleepInterruptible = [this](double seconds) {
    auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    while (!stop_ && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
  };
  std::string rv;
  bool needList = true;
  int watchFailures = 0;
  while (!stop_) {
    if (needList) {
      try {
        rv = relist(ns);
        needList = false;
        watchFailures = 0;
        if (!syncedHere) {
          syncedHere = true;
          synced_++;
        }
        backoff = 0.2;
      } catch (const std::exception& e) {
        double wait = backoff * std::uniform_real_distribution<double>(1.0, 1.5)(rng);
        log::warn("list failed, backing off", {{"resource", rt_.plural}, {"namespace", ns}, {"error", e.what()},
                                               {"backoffSeconds", wait}});
        sleepInterruptible(wait);
        backoff = std::min(backoff * 2, 10.0);
        continue;
      }
    }
    // Watch from rv. A broken stream resumes from the last resourceVersion (the server
    // answers 410 Gone when it no longer has that history); 410 means re-list.
    try {
      while (!stop_) {
        int timeout = 60 + std::uniform_int_distribution<int>(0, 30)(rng);
        client_.watch(rt_, ns, ListOptions{labelSelector_, "", rv}, timeout,
                      [&](const json& ev) {
                        std::string type = ev.value("type", "");
                        const json& obj = ev.contains("object") ? ev["object"] : json::object();
                        if (type == "ERROR") {
                          int code = obj.value("code", 0);
                          throw ApiError(code, obj.value("reason", ""), obj.value("message", "watch error"));
                        }
                        watchFailures = 0;
                        backoff = 0.2;
                        std::string newRv = rvOf(obj);
                        if (!newRv.empty()) rv = newRv;
                        if (type == "ADDED" || type == "MODIFIED" || type == "DELETED") apply(type, obj);
                        return !stop_.load();
                      },
                      stop_);
      }
    } catch (const ApiError& e) {
      if (stop_) break;
      if (e.gone()) {
        log::info("watch history expired (410 Gone), re-listing", {{"resource", rt_.plural}, {"namespace", ns}});
        needList = true;
        continue;
      }
      // Resume from rv a few times; after repeated failures start over with a list.
      needList = ++watchFailures >= 5;
      double wait = backoff * std::uniform_real_distribution<double>(1.0, 1.5)(rng);
      log::warn(needList ? "watch broke, re-listing" : "watch broke, resuming from resourceVersion",
                {{"resource", rt_.plural}, {"namespace", ns}, {"error", e.what()}, {"backoffSeconds", wait},
                 {"resourceVersion", rv}});
      sleepInterruptible(wait);
      backoff = std::min(backoff * 2, 10.0);
    }
  }
}

}  // namespace edit::op::kube
