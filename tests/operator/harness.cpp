#include "harness.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cpprest/http_client.h>

#include <cstdlib>
#include <fstream>
#include <regex>
#include <sstream>
#include <stdexcept>
#include <thread>

namespace edit::op::testing {

Process::~Process() {
  if (pid_ > 0 && status_ < 0) {
    ::kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
}

void Process::start(const std::vector<std::string>& argv, const std::string& logPath) {
  status_ = -1;
  pid_ = fork();
  if (pid_ < 0) throw std::runtime_error("fork failed");
  if (pid_ == 0) {
    int fd = open(logPath.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
      close(fd);
    }
    setpgid(0, 0);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execvp(args[0], args.data());
    _exit(127);
  }
}

void Process::signal(int sig) {
  if (pid_ > 0 && status_ < 0) ::kill(pid_, sig);
}

int Process::wait(std::chrono::milliseconds timeout) {
  if (status_ >= 0) return status_;
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    int st = 0;
    if (waitpid(pid_, &st, WNOHANG) == pid_) {
      status_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      return status_;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return -1;
}

bool Process::alive() { return pid_ > 0 && wait(std::chrono::milliseconds(0)) < 0; }

std::string makeTempDir() {
  std::string tmpl = "/tmp/edit-operator-it-XXXXXX";
  if (!mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
  return tmpl;
}

std::string readFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool waitFor(const std::function<bool()>& pred, std::chrono::milliseconds timeout, std::chrono::milliseconds every) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    try {
      if (pred()) return true;
    } catch (const std::exception&) {
    }
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(every);
  }
}

std::pair<int, std::string> httpGet(const std::string& url) {
  try {
    web::http::client::http_client_config cfg;
    cfg.set_timeout(std::chrono::seconds(5));
    web::http::client::http_client client(url, cfg);
    auto resp = client.request(web::http::methods::GET).get();
    return {resp.status_code(), resp.extract_utf8string(true).get()};
  } catch (const std::exception& e) {
    return {0, e.what()};
  }
}

std::pair<int, std::string> httpPost(const std::string& url, const json& body) {
  try {
    web::http::client::http_client_config cfg;
    cfg.set_timeout(std::chrono::seconds(10));
    web::http::client::http_client client(url, cfg);
    web::http::http_request req(web::http::methods::POST);
    req.set_body(body.dump(), "application/json");
    auto resp = client.request(req).get();
    return {resp.status_code(), resp.extract_utf8string(true).get()};
  } catch (const std::exception& e) {
    return {0, e.what()};
  }
}

int runShell(const std::string& command) {
  int st = std::system(command.c_str());
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

void StandIn::start(bool kubelet, int port, const std::string& state) {
  std::string ready = dir_ + "/ready";
  unlink(ready.c_str());
  std::vector<std::string> argv = {"python3", std::string(EDIT_SOURCE_ROOT) + "/tests/apiserver/standin.py",
                                   "--listen", "127.0.0.1:" + std::to_string(port), "--ready-file", ready,
                                   "--kubeconfig-out", kubeconfig(), "--bookmark-interval", "1"};
  if (kubelet) {
    argv.push_back("--kubelet");
    argv.push_back("--kubelet-workdir");
    argv.push_back(dir_ + "/kubelet");
  }
  if (!state.empty()) {
    argv.push_back("--state");
    argv.push_back(state);
  }
  argv.insert(argv.end(), extraArgs.begin(), extraArgs.end());
  proc_.start(argv, dir_ + "/standin.log");
  if (!waitFor([&] { return !readFile(ready).empty(); }, std::chrono::seconds(30), std::chrono::milliseconds(50)))
    throw std::runtime_error("stand-in did not start:\n" + logs());
  url_ = readFile(ready);
  while (!url_.empty() && (url_.back() == '\n' || url_.back() == ' ')) url_.pop_back();
  port_ = std::stoi(url_.substr(url_.rfind(':') + 1));
}

void StandIn::stop() {
  proc_.signal(SIGTERM);
  if (proc_.wait(std::chrono::seconds(10)) < 0) {
    proc_.signal(SIGKILL);
    proc_.wait(std::chrono::seconds(5));
  }
}

void StandIn::applyCrd() {
  std::string cmd = std::string(KUBECTL) + " --kubeconfig " + kubeconfig() + " apply -f " +
                    EDIT_SOURCE_ROOT + "/crds/editjob.yaml >> " + dir_ + "/kubectl.log 2>&1";
  if (runShell(cmd) != 0) throw std::runtime_error("kubectl apply of the CRD failed: " + readFile(dir_ + "/kubectl.log"));
  // The resource is served once the CRD is established.
  kube::Client c(kube::loadKubeconfig(kubeconfig()));
  if (!waitFor([&] { c.list(kube::resources::EDiTJobs, "default"); return true; }, std::chrono::seconds(10)))
    throw std::runtime_error("editjobs not served after applying the CRD");
}

void OperatorProcess::start(const std::string& kubeconfig, const std::vector<std::string>& extraArgs) {
  // EDIT_OPERATOR_UNDER_TEST: another build of the operator (e.g. an older one, to see a
  // test fail without a fix).
  const char* other = std::getenv("EDIT_OPERATOR_UNDER_TEST");
  std::vector<std::string> argv = {other && *other ? other : EDIT_OPERATOR_BIN, "--kubeconfig", kubeconfig,
                                   "--metrics-addr", "127.0.0.1:0", "--health-addr", "127.0.0.1:0",
                                   "--grpc-addr", "127.0.0.1:0", "--resync-seconds", "5", "--log-level", "debug"};
  argv.insert(argv.end(), extraArgs.begin(), extraArgs.end());
  auto before = readFile(log_).size();
  proc_.start(argv, log_);
  bool ok = waitFor(
      [&] {
        std::string text = readFile(log_).substr(before);
        std::istringstream lines(text);
        std::string line;
        while (std::getline(lines, line)) {
          if (line.find("edit-operator listening") == std::string::npos) continue;
          json j = json::parse(line);
          metricsAddr = j["metricsAddr"];
          healthAddr = j["healthAddr"];
          grpcAddr = j["grpcAddr"];
          return true;
        }
        return false;
      },
      std::chrono::seconds(20), std::chrono::milliseconds(50));
  if (!ok) throw std::runtime_error("edit-operator did not start:\n" + logs());
  identityPid = std::to_string(proc_.pid());
}

json shellJob(const std::string& name, int replicas, int shards, const std::string& script, json runPolicy) {
  json spec = {{"replicas", replicas},
               {"shardsPerReplica", shards},
               {"image", "edit:test"},
               {"command", {"sh", "-c", script}},
               {"hangTimeoutSeconds", 0},
               {"training", {{"steps", 10}}}};
  if (!runPolicy.empty()) spec["runPolicy"] = runPolicy;
  return {{"apiVersion", "edit.io/v1alpha1"},
          {"kind", "EDiTJob"},
          {"metadata", {{"name", name}, {"namespace", "default"}}},
          {"spec", spec}};
}

std::string jobPhase(kube::Client& c, const std::string& name, const std::string& ns) {
  auto j = c.tryGet(kube::resources::EDiTJobs, ns, name);
  if (!j || !j->contains("status")) return "";
  return (*j)["status"].value("phase", "");
}

static const json* findCond(const json& job, const std::string& type) {
  if (!job.contains("status") || !job["status"].contains("conditions")) return nullptr;
  for (const auto& c : job["status"]["conditions"])
    if (c.value("type", "") == type) return &c;
  return nullptr;
}

std::string conditionReason(const json& job, const std::string& type) {
  const json* c = findCond(job, type);
  return c ? c->value("reason", "") : "";
}

std::string conditionStatus(const json& job, const std::string& type) {
  const json* c = findCond(job, type);
  return c ? c->value("status", "") : "";
}

}  // namespace edit::op::testing
