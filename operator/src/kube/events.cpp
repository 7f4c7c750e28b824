#include "kube/events.h"

#include <atomic>
#include <chrono>
#include <cstdio>

#include "util/log.h"

namespace edit::op::kube {

void EventRecorder::record(const json& obj, const std::string& type, const std::string& reason,
                           const std::string& message) {
  static std::atomic<unsigned> seq{0};
  const json& md = obj.at("metadata");
  std::string ns = md.value("namespace", "default");
  std::string name = md.value("name", "");
  auto nanos = std::chrono::duration_cast<std::chrono::nanoseconds>(
                   std::chrono::system_clock::now().time_since_epoch()).count();
  char suffix[40];
  std::snprintf(suffix, sizeof suffix, ".%llx%03x", static_cast<unsigned long long>(nanos), seq++ & 0xfff);
  std::string now = log::nowRfc3339();
  json ev = {
      {"apiVersion", "v1"},
      {"kind", "Event"},
      {"metadata", {{"name", name + suffix}, {"namespace", ns}}},
      {"involvedObject",
       {{"apiVersion", obj.value("apiVersion", "")},
        {"kind", obj.value("kind", "")},
        {"name", name},
        {"namespace", ns},
        {"uid", md.value("uid", "")},
        {"resourceVersion", md.value("resourceVersion", "")}}},
      {"reason", reason},
      {"message", message},
      {"type", type},
      {"source", {{"component", component_}}},
      {"reportingComponent", component_},
      {"firstTimestamp", now},
      {"lastTimestamp", now},
      {"count", 1}};
  log::info("event", {{"namespace", ns}, {"job", name}, {"reason", reason}, {"type", type}, {"message", message}});
  if (!client_) return;
  try {
    client_->create(resources::Events, ns, ev);
  } catch (const std::exception& e) {
    log::warn("could not record event", {{"namespace", ns}, {"reason", reason}, {"error", e.what()}});
  }
}

}  // namespace edit::op::kube
