// Resilience: the informer re-lists after the API server restarts (410 Gone on the old
// resourceVersion), and leader election hands over without duplicate pods.
#include <fstream>

#include "integration_fixture.h"

namespace edit::op::testing {
namespace {

namespace res = kube::resources;

class RestartingApiServer : public OperatorIntegration {
 protected:
  RestartingApiServer() { withState = true; }
};

TEST_F(RestartingApiServer, InformerRelistsAfterRestart) {
  client->create(res::EDiTJobs, "default", shellJob("before", 2, 1, "sleep 120"));
  ASSERT_TRUE(waitPhase("before", "Running"));
  int port = standin->port();
  standin->stop();
  standin->start(true, port, dir + "/state.json");
  // The operator resumes its watches from the old resourceVersion, gets 410 Gone from the
  // restarted server (its watch history is gone) and re-lists.
  ASSERT_TRUE(waitFor([&] { return op->logs().find("410 Gone") != std::string::npos; }, std::chrono::seconds(30)));
  client = std::make_unique<kube::Client>(kube::loadKubeconfig(standin->kubeconfig()));  // fresh connections
  client->create(res::EDiTJobs, "default", shellJob("after", 1, 1, "sleep 2; exit 0"));
  ASSERT_TRUE(waitPhase("after", "Succeeded", 60)) << job("after").dump(2);
  EXPECT_EQ(pods("before").size(), 2u);  // nothing duplicated by the re-list
}

class LeaderElection : public OperatorIntegration {
 protected:
  LeaderElection() { startOperator = false; }
};

std::string leaseHolder(kube::Client& c) {
  auto lease = c.tryGet(res::Leases, "default", "edit-operator");
  return lease ? (*lease)["spec"].value("holderIdentity", "") : "";
}

TEST_F(LeaderElection, StandbyTakesOverWithoutDuplicates) {
  OperatorProcess a(dir + "/operator-a.log"), b(dir + "/operator-b.log");
  a.start(standin->kubeconfig(), {"--leader-elect", "--lease-namespace", "default"});
  ASSERT_TRUE(waitFor([&] { return !leaseHolder(*client).empty(); }, std::chrono::seconds(15)));
  b.start(standin->kubeconfig(), {"--leader-elect", "--lease-namespace", "default"});
  std::string first = leaseHolder(*client);
  EXPECT_NE(first.find("_" + a.identityPid), std::string::npos) << first;

  client->create(res::EDiTJobs, "default", shellJob("ha", 2, 1, "sleep 120"));
  ASSERT_TRUE(waitPhase("ha", "Running"));
  auto metricsOf = [](OperatorProcess& p) { return httpGet("http://" + p.metricsAddr + "/metrics").second; };
  EXPECT_NE(metricsOf(a).find("edit_operator_leader 1"), std::string::npos);
  EXPECT_NE(metricsOf(b).find("edit_operator_leader 0"), std::string::npos);
  EXPECT_EQ(b.logs().find("controller started"), std::string::npos);  // the standby does not reconcile
  // ...but it is Ready: readiness is not leadership (a rolling update needs the new pod Ready).
  EXPECT_EQ(httpGet("http://" + b.healthAddr + "/readyz").first, 200);

  a.signal(SIGKILL);  // no release: b must wait for the lease to expire
  ASSERT_TRUE(waitFor([&] { return leaseHolder(*client).find("_" + b.identityPid) != std::string::npos; },
                      std::chrono::seconds(40)));
  ASSERT_TRUE(waitFor([&] { return b.logs().find("controller started") != std::string::npos; }, std::chrono::seconds(10)));
  client->mergePatch(res::EDiTJobs, "default", "ha", {{"spec", {{"runPolicy", {{"suspend", true}}}}}});
  ASSERT_TRUE(waitPhase("ha", "Suspended")) << b.logs();
  client->mergePatch(res::EDiTJobs, "default", "ha", {{"spec", {{"runPolicy", {{"suspend", false}}}}}});
  ASSERT_TRUE(waitPhase("ha", "Running"));
  EXPECT_EQ(pods("ha").size(), 2u);

  // SIGTERM releases the lease at once.
  b.signal(SIGTERM);
  EXPECT_EQ(b.wait(std::chrono::seconds(15)), 0);
  EXPECT_TRUE(leaseHolder(*client).empty());
}

}  // namespace
}  // namespace edit::op::testing
