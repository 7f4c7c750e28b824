// An informer: list, then watch from the list's resourceVersion (with bookmarks);
// re-list on 410 Gone or a broken stream, with exponential backoff and jitter. Keeps a
// thread-safe cache and calls handlers (which should only enqueue keys) on each change.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "kube/client.h"

namespace edit::op::kube {

class Informer {
 public:
  // type: ADDED, MODIFIED or DELETED (also synthesized when a re-list finds differences).
  using Handler = std::function<void(const std::string& type, const json& obj)>;

  // namespaces empty: all namespaces (one cluster-wide list/watch).
  Informer(Client& client, ResourceType rt, std::vector<std::string> namespaces, std::string labelSelector = "");
  ~Informer();

  void addHandler(Handler h);
  void start();
  void stop();
  bool hasSynced() const;

  std::optional<json> get(const std::string& ns, const std::string& name) const;
  // Objects in ns (empty: all) whose labels contain every pair in `labels`.
  std::vector<json> list(const std::string& ns, const std::map<std::string, std::string>& labels = {}) const;
  std::vector<std::string> keys() const;

 private:
  void run(const std::string& ns);
  std::string relist(const std::string& ns);
  void apply(const std::string& type, const json& obj);
  void notify(const std::string& type, const json& obj);

  Client& client_;
  ResourceType rt_;
  std::vector<std::string> namespaces_;
  std::string labelSelector_;
  mutable std::mutex mu_;
  std::map<std::string, json> cache_;  // "ns/name" -> object
  std::vector<Handler> handlers_;
  std::vector<std::thread> threads_;
  std::atomic<bool> stop_{false};
  std::atomic<int> synced_{0};
};

std::string objectKey(const json& obj);  // "namespace/name"

}  // namespace edit::op::kube
