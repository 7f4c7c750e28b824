// Records core/v1 Events about an object (best effort: failures are logged, not thrown).
#pragma once

#include <string>

#include "kube/client.h"

namespace edit::op::kube {

class EventRecorder {
 public:
  EventRecorder(Client* client, std::string component) : client_(client), component_(std::move(component)) {}
  // type: "Normal" or "Warning". `obj` is the involved object (needs metadata, kind).
  void record(const json& obj, const std::string& type, const std::string& reason, const std::string& message);

 private:
  Client* client_;
  std::string component_;
};

}  // namespace edit::op::kube
