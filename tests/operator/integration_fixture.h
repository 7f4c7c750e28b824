// A stand-in API server with kubelet, the EDiTJob CRD applied with kubectl, and one
// edit-operator process; logs are printed when a test fails.
#pragma once

#include <gtest/gtest.h>
#include <signal.h>

#include <memory>

#include "harness.h"

namespace edit::op::testing {

class OperatorIntegration : public ::testing::Test {
 protected:
  void SetUp() override {
    dir = makeTempDir();
    standin = std::make_unique<StandIn>(dir);
    standin->extraArgs = standinArgs;
    standin->start(true, 0, withState ? dir + "/state.json" : "");
    standin->applyCrd();
    client = std::make_unique<kube::Client>(kube::loadKubeconfig(standin->kubeconfig()));
    if (startOperator) {
      op = std::make_unique<OperatorProcess>(dir + "/operator.log");
      op->start(standin->kubeconfig());
    }
  }

  void TearDown() override {
    if (HasFailure()) {
      if (op) std::cerr << "---- operator log ----\n" << tail(op->logs()) << "\n";
      std::cerr << "---- stand-in log ----\n" << tail(standin->logs()) << "\n";
      std::cerr << "(test files kept in " << dir << ")\n";
    }
    if (op) {
      op->signal(SIGTERM);
      op->wait(std::chrono::seconds(10));
    }
    op.reset();
    client.reset();
    standin->stop();
    if (!HasFailure()) runShell("rm -rf " + dir);
  }

  static std::string tail(const std::string& s, size_t n = 6000) { return s.size() > n ? s.substr(s.size() - n) : s; }

  json job(const std::string& name) { return client->get(kube::resources::EDiTJobs, "default", name); }
  json pods(const std::string& jobName) {
    return client->list(kube::resources::Pods, "default", {"edit.io/job-name=" + jobName, "", ""})["items"];
  }
  bool waitPhase(const std::string& name, const std::string& phase, int seconds = 40) {
    return waitFor([&] { return jobPhase(*client, name) == phase; }, std::chrono::seconds(seconds));
  }

  bool withState = false;
  std::vector<std::string> standinArgs;  // set in the constructor
  bool startOperator = true;
  std::string dir;
  std::unique_ptr<StandIn> standin;
  std::unique_ptr<kube::Client> client;
  std::unique_ptr<OperatorProcess> op;
};

}  // namespace edit::op::testing
