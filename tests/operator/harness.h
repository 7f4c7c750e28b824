// Integration-test harness: the API stand-in and edit-operator as real processes on
// free ports, plus small helpers (waiting, HTTP GET, kubectl).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kube/client.h"

namespace edit::op::testing {

using nlohmann::json;

class Process {
 public:
  Process() = default;
  ~Process();
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;
  void start(const std::vector<std::string>& argv, const std::string& logPath);
  void signal(int sig);
  int wait(std::chrono::milliseconds timeout);  // exit status; -1 on timeout
  bool alive();
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
  int status_ = -1;
};

std::string makeTempDir();
std::string readFile(const std::string& path);
bool waitFor(const std::function<bool()>& pred, std::chrono::milliseconds timeout,
             std::chrono::milliseconds every = std::chrono::milliseconds(100));
// GET http://host:port/path; returns {status, body} ({0, error} on transport failure).
std::pair<int, std::string> httpGet(const std::string& url);
// POST a JSON body; returns {status, body} ({0, error} on transport failure).
std::pair<int, std::string> httpPost(const std::string& url, const json& body);
int runShell(const std::string& command);

class StandIn {
 public:
  explicit StandIn(std::string dir) : dir_(std::move(dir)) {}
  // More stand-in flags (--gc-delay, --node-capacity, ...), for the next start().
  std::vector<std::string> extraArgs;
  // port 0: any free port; state: keep objects in this file across restarts.
  void start(bool kubelet = true, int port = 0, const std::string& state = "");
  void stop();
  const std::string& url() const { return url_; }
  int port() const { return port_; }
  std::string kubeconfig() const { return dir_ + "/kubeconfig"; }
  // kubectl apply -f crds/editjob.yaml
  void applyCrd();
  std::string logs() const { return readFile(dir_ + "/standin.log"); }

 private:
  std::string dir_, url_;
  int port_ = 0;
  Process proc_;
};

class OperatorProcess {
 public:
  explicit OperatorProcess(std::string logPath) : log_(std::move(logPath)) {}
  void start(const std::string& kubeconfig, const std::vector<std::string>& extraArgs = {});
  void signal(int sig) { proc_.signal(sig); }
  int wait(std::chrono::milliseconds t) { return proc_.wait(t); }
  bool alive() { return proc_.alive(); }
  std::string logs() const { return readFile(log_); }
  std::string metricsAddr, healthAddr, grpcAddr, identityPid;

 private:
  std::string log_;
  Process proc_;
};

// A minimal EDiTJob whose pods run `script` with sh instead of edit-train.
json shellJob(const std::string& name, int replicas, int shards, const std::string& script,
              json runPolicy = json::object());

// Reads a job's field (e.g. status.phase) or "" if absent.
std::string jobPhase(kube::Client& c, const std::string& name, const std::string& ns = "default");
std::string conditionReason(const json& job, const std::string& type);
std::string conditionStatus(const json& job, const std::string& type);

}  // namespace edit::op::testing
