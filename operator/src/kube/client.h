// A small Kubernetes REST client on cpprestsdk: CRUD, merge patch, the status
// subresource, delete with propagationPolicy and watch streams (one JSON event a line).
#pragma once

#include <nlohmann/json.hpp>

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>

#include "kube/config.h"

namespace edit::op::kube {

using nlohmann::json;

// A resource collection: core (group "") or a named API group.
struct ResourceType {
  std::string group;
  std::string version;
  std::string plural;
  std::string kind;
  bool namespaced = true;

  std::string apiVersion() const { return group.empty() ? version : group + "/" + version; }
  // /api/v1/namespaces/ns/pods[/name[/sub]]; ns empty: all namespaces (list/watch).
  std::string path(const std::string& ns, const std::string& name = "", const std::string& sub = "") const;
};

namespace resources {
extern const ResourceType Pods, Services, ConfigMaps, Secrets, Events, Leases, EDiTJobs, NetworkPolicies;
extern const ResourceType VolcanoPodGroups, CoschedulingPodGroups;
}  // namespace resources

// An error answer from the API server (or a transport failure: status 0).
class ApiError : public std::runtime_error {
 public:
  ApiError(int status, std::string reason, const std::string& message)
      : std::runtime_error(message), status_(status), reason_(std::move(reason)) {}
  int status() const { return status_; }
  const std::string& reason() const { return reason_; }
  bool notFound() const { return status_ == 404; }
  bool conflict() const { return status_ == 409; }  // stale resourceVersion or already exists
  bool gone() const { return status_ == 410; }

 private:
  int status_;
  std::string reason_;
};

struct ListOptions {
  std::string labelSelector;
  std::string fieldSelector;
  std::string resourceVersion;
};

class Client {
 public:
  explicit Client(KubeConfig cfg);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  const KubeConfig& config() const { return cfg_; }

  // The User-Agent of every request (default "edit-operator"): audit logs tell two
  // operators apart by it.
  void setUserAgent(std::string ua) { userAgent_ = std::move(ua); }
  // Asked before every write (any method but GET): "" lets it through, anything else is
  // why not, thrown as ApiError reason "NotLeader". An operator that lost its lease must
  // write nothing (leader/lease.h); its reconciles may still be running.
  void setWriteGuard(std::function<std::string()> guard) { writeGuard_ = std::move(guard); }

  json get(const ResourceType& rt, const std::string& ns, const std::string& name);
  std::optional<json> tryGet(const ResourceType& rt, const std::string& ns, const std::string& name);
  json list(const ResourceType& rt, const std::string& ns, const ListOptions& opts = {});
  json create(const ResourceType& rt, const std::string& ns, const json& obj);
  json update(const ResourceType& rt, const std::string& ns, const json& obj);
  json updateStatus(const ResourceType& rt, const std::string& ns, const json& obj);
  json mergePatch(const ResourceType& rt, const std::string& ns, const std::string& name, const json& patch,
                  const std::string& subresource = "");
  // Deletes; a missing object is not an error. Returns false when it was already gone, or
  // (uid set) when the object of that name is another one now (the UID precondition failed:
  // what was decided about the old object does not hold for its successor).
  // gracePeriodSeconds < 0: the object's own grace period.
  bool remove(const ResourceType& rt, const std::string& ns, const std::string& name,
              const std::string& propagationPolicy = "Background", long gracePeriodSeconds = -1,
              const std::string& uid = "");

  // Streams watch events to onEvent until the server closes the stream, onEvent returns
  // false, or stop becomes true. Throws ApiError (gone() for 410 answered up front).
  void watch(const ResourceType& rt, const std::string& ns, const ListOptions& opts, int timeoutSeconds,
             const std::function<bool(const json& event)>& onEvent, const std::atomic<bool>& stop);

  // Aborts running watches (shutdown).
  void cancelWatches();

 private:
  json request(const std::string& method, const std::string& pathAndQuery, const json* body,
               const std::string& contentType = "application/json");

  struct Impl;
  std::string userAgent_ = "edit-operator";
  std::function<std::string()> writeGuard_;
  KubeConfig cfg_;
  std::unique_ptr<Impl> impl_;
};

std::string urlEncode(const std::string& s);

}  // namespace edit::op::kube
