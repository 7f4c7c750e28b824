// A real cluster's first day, against the stand-in made to behave like one: children of a
// deleted job that the garbage collector removes seconds later, pods that never start,
// the number of status writes a busy job costs, and a leader paused past its lease.
// EDIT_OPERATOR_UNDER_TEST=<an older edit-operator> runs them against another build.
#include <grpcpp/grpcpp.h>
#include <signal.h>

#include <atomic>
#include <fstream>
#include <thread>

#include "edit/v1alpha1/telemetry.grpc.pb.h"
#include "integration_fixture.h"

namespace edit::op::testing {
namespace {

namespace res = kube::resources;
namespace pb = edit::v1alpha1;
using namespace std::chrono_literals;

std::string ownerUid(const json& obj) {
  for (const auto& r : obj["metadata"].value("ownerReferences", json::array()))
    if (r.value("controller", false)) return r.value("uid", "");
  return "";
}

// ---- delete and apply again at once ----------------------------------------------------------

class LaggingCollector : public OperatorIntegration {
 protected:
  LaggingCollector() { standinArgs = {"--gc-delay", "4"}; }
};

// kubectl delete returns before the garbage collector removed the job's children; an
// apply right after it creates a job of the same name that finds them all there.
TEST_F(LaggingCollector, DeleteAndCreateAgainAtOnceRunsToSucceeded) {
  // Each incarnation checks the token it got is its job's (the Secret's data), then ends.
  const std::string script = "test -n \"$EDIT_TELEMETRY_TOKEN\" && sleep 4 && exit 0";
  client->create(res::EDiTJobs, "default", shellJob("again", 2, 1, script));
  ASSERT_TRUE(waitPhase("again", "Running")) << job("again").dump(2);
  const std::string firstUid = job("again")["metadata"]["uid"];
  client->remove(res::EDiTJobs, "default", "again");
  client->create(res::EDiTJobs, "default", shellJob("again", 2, 1, script));
  const std::string uid = job("again")["metadata"]["uid"];
  ASSERT_NE(uid, firstUid);
  EXPECT_TRUE(waitPhase("again", "Succeeded", 90)) << job("again").dump(2);
  // Everything it runs on is its own: nothing of the first job was adopted.
  EXPECT_EQ(ownerUid(client->get(res::Secrets, "default", "again-telemetry")), uid);
  EXPECT_EQ(ownerUid(client->get(res::ConfigMaps, "default", "again-config")), uid);
  for (const auto& p : pods("again")) EXPECT_EQ(ownerUid(p), uid) << p["metadata"]["name"];
  EXPECT_EQ(job("again")["status"].value("restarts", 0), 0);
}

// ---- pods that never start -------------------------------------------------------------------

class NeverStarting : public OperatorIntegration {
 protected:
  NeverStarting() { standinArgs = {"--node-capacity", "cpu=2,memory=8Gi", "--kueue-gate"}; }

  // The job's PodsReady condition once it is False with a reason, and status.message then.
  std::pair<json, std::string> waitNotStarting(const std::string& name, int seconds = 30) {
    json cond;
    std::string message;
    waitFor(
        [&] {
          json j = job(name);
          for (const auto& c : j["status"].value("conditions", json::array()))
            if (c.value("type", "") == "PodsReady" && c.value("status", "") == "False") cond = c;
          message = j["status"].value("message", "");
          return !cond.is_null();
        },
        std::chrono::seconds(seconds));
    return {cond, message};
  }

  bool warningEvent(const std::string& name, const std::string& reasonPrefix) {
    const json events = client->list(res::Events, "default")["items"];
    for (const auto& e : events)
      if (e["involvedObject"].value("name", "") == name && e.value("type", "") == "Warning" &&
          e.value("reason", "").rfind(reasonPrefix, 0) == 0)
        return true;
    return false;
  }
};

TEST_F(NeverStarting, EachReasonIsNamedWithinThirtySeconds) {
  auto t0 = std::chrono::steady_clock::now();
  json image = shellJob("pull", 1, 1, "sleep 60");
  image["spec"]["image"] = "registry.example.invalid/edit-runtime:1";
  client->create(res::EDiTJobs, "default", image);
  json big = shellJob("big", 1, 1, "sleep 60");
  big["spec"]["resources"] = {{"requests", {{"cpu", "4"}}}};
  client->create(res::EDiTJobs, "default", big);
  client->create(kube::ResourceType{"", "v1", "persistentvolumeclaims", "PersistentVolumeClaim"}, "default",
                 {{"apiVersion", "v1"},
                  {"kind", "PersistentVolumeClaim"},
                  {"metadata", {{"name", "slow-nfs"}}},
                  {"spec",
                   {{"storageClassName", "nfs-client"},
                    {"accessModes", {"ReadWriteMany"}},
                    {"resources", {{"requests", {{"storage", "1Gi"}}}}}}}});
  json claim = shellJob("claim", 1, 1, "sleep 60");
  claim["spec"]["checkpoint"] = {{"pvc", "slow-nfs"}};
  client->create(res::EDiTJobs, "default", claim);
  json queued = shellJob("queued", 1, 1, "sleep 60");
  queued["metadata"]["labels"] = {{"kueue.x-k8s.io/queue-name", "team"}};
  client->create(res::EDiTJobs, "default", queued);
  json config = shellJob("config", 1, 1, "sleep 60");
  config["spec"]["env"] = {{{"name", "WANDB_KEY"}, {"valueFrom", {{"secretKeyRef", {{"name", "wandb"}, {"key", "key"}}}}}}};
  client->create(res::EDiTJobs, "default", config);

  const std::vector<std::tuple<std::string, std::string, std::string>> want = {
      {"pull", "ImagePull", "lookup registry.example.invalid: no such host"},
      {"big", "Unschedulable", "Insufficient cpu"},
      {"claim", "Unschedulable", "pod has unbound immediate PersistentVolumeClaims"},
      {"queued", "SchedulingGated", "scheduling gates"},
      {"config", "CreateContainerConfigError", "secret \"wandb\" not found"}};
  for (const auto& [name, reason, detail] : want) {
    auto [cond, message] = waitNotStarting(name);
    ASSERT_FALSE(cond.is_null()) << name << ": no PodsReady False\n" << job(name).dump(2);
    EXPECT_NE(cond.value("reason", "").find(reason == "ImagePull" ? "Image" : reason), std::string::npos) << cond;
    EXPECT_NE(message.find("worker pod " + name + "-worker-0 cannot start"), std::string::npos) << message;
    EXPECT_NE(message.find(detail), std::string::npos) << message;
    EXPECT_TRUE(waitFor(
        [&, name = name, reason = reason] {
          return warningEvent(name, reason == "ImagePull" ? "ErrImagePull" : reason) ||
                 warningEvent(name, reason == "ImagePull" ? "ImagePullBackOff" : reason);
        },
        10s))
        << name;
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 30s + 5s);
  // kubectl get ej shows it in the MESSAGE column.
  const std::string out = dir + "/get.txt";
  runShell(std::string(KUBECTL) + " --kubeconfig " + standin->kubeconfig() + " get ej big > " + out + " 2>&1");
  EXPECT_NE(readFile(out).find("cannot start: Unschedulable"), std::string::npos) << readFile(out);
}

TEST_F(NeverStarting, QuotaRefusedCreateIsNamed) {
  client->create(kube::ResourceType{"", "v1", "resourcequotas", "ResourceQuota"}, "default",
                 {{"apiVersion", "v1"}, {"kind", "ResourceQuota"}, {"metadata", {{"name", "two-pods"}}},
                  {"spec", {{"hard", {{"pods", "1"}}}}}});
  client->create(res::EDiTJobs, "default", shellJob("quota", 2, 1, "sleep 60"));
  auto [cond, message] = waitNotStarting("quota");
  ASSERT_FALSE(cond.is_null()) << job("quota").dump(2);
  EXPECT_EQ(cond.value("reason", ""), "FailedCreate");
  EXPECT_NE(message.find("exceeded quota: two-pods"), std::string::npos) << message;
}

TEST_F(NeverStarting, ScheduleTimeoutFailsTheJob) {
  json j = shellJob("late", 1, 1, "sleep 60", {{"scheduleTimeoutSeconds", 6}});
  j["spec"]["resources"] = {{"requests", {{"cpu", "3"}}}};
  client->create(res::EDiTJobs, "default", j);
  ASSERT_TRUE(waitPhase("late", "Failed", 30)) << job("late").dump(2);
  EXPECT_EQ(conditionReason(job("late"), "Failed"), "Unschedulable");
  EXPECT_TRUE(pods("late").empty() || pods("late")[0]["metadata"].contains("deletionTimestamp"));
}

// ---- status writes of a busy job ---------------------------------------------------------------

// 16 fake workers of a 4 x 4 job, each reporting a step every 100 ms (one stream each).
class FakeWorkers {
 public:
  FakeWorkers(const std::string& addr, const std::string& job, const std::string& token, int ranks) {
    for (int r = 0; r < ranks; ++r)
      threads_.emplace_back([=] {
        auto stub = pb::Telemetry::NewStub(grpc::CreateChannel(addr, grpc::InsecureChannelCredentials()));
        grpc::ClientContext ctx;
        auto s = stub->Stream(&ctx);
        for (int64_t step = 1; !stop_; ++step) {
          pb::WorkerReport w;
          w.set_namespace_("default");
          w.set_job(job);
          w.set_token(token);
          w.set_rank(r);
          w.set_replica(r / 4);
          w.set_shard(r % 4);
          w.set_pod(job + "-worker-" + std::to_string(r));
          w.set_step(step);
          w.set_total_steps(1000000);
          w.set_loss(5.0 - 0.001 * static_cast<double>(step));
          w.set_tokens(static_cast<uint64_t>(step) * 512);
          w.set_step_seconds(0.1 + 0.001 * (r % 3));
          if (!s->Write(w)) break;
          std::this_thread::sleep_for(100ms);
        }
        s->WritesDone();
        ctx.TryCancel();
      });
  }
  ~FakeWorkers() {
    stop_ = true;
    for (auto& t : threads_) t.join();
  }

 private:
  std::atomic<bool> stop_{false};
  std::vector<std::thread> threads_;
};

TEST_F(OperatorIntegration, BusyJobWritesItsStatusAtMostSixTimesAMinute) {
  client->create(res::EDiTJobs, "default", shellJob("busy", 4, 4, "sleep 300"));
  ASSERT_TRUE(waitPhase("busy", "Running", 60)) << job("busy").dump(2);
  const std::string token = kube::base64Decode(client->get(res::Secrets, "default", "busy-telemetry")["data"]["token"]);
  FakeWorkers workers(op->grpcAddr, "busy", token, 16);
  ASSERT_TRUE(waitFor([&] { return job("busy")["status"].contains("progress"); }, 20s)) << job("busy").dump(2);
  std::this_thread::sleep_for(5s);  // steady state
  const double since = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  constexpr int kWindow = 40;
  std::this_thread::sleep_for(std::chrono::seconds(kWindow));
  auto [code, body] = httpGet(standin->url() + "/standin/writes?resource=editjobs&subresource=status&name=busy&since=" +
                              std::to_string(since));
  ASSERT_EQ(code, 200) << body;
  const size_t writes = json::parse(body).size();
  const double perMinute = 60.0 * static_cast<double>(writes) / kWindow;
  std::cout << "status writes of a 16-pod job reporting every 100 ms: " << writes << " in " << kWindow << " s = "
            << perMinute << " per minute\n";
  EXPECT_LE(perMinute, 6.0);
  // Progress still reaches the status.
  EXPECT_GT(job("busy")["status"]["progress"].value("step", 0), 100);
}

// ---- a leader paused past its lease -------------------------------------------------------------

class PausedLeader : public OperatorIntegration {
 protected:
  PausedLeader() { startOperator = false; }

  // A kubeconfig with a token of its own ServiceAccount (allowed everything): the API's
  // audit log then tells the two operators apart.
  std::string kubeconfigFor(const std::string& sa) {
    kube::ResourceType sas{"", "v1", "serviceaccounts", "ServiceAccount"};
    client->create(sas, "default", {{"apiVersion", "v1"}, {"kind", "ServiceAccount"}, {"metadata", {{"name", sa}}}});
    kube::ResourceType crb{"rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding", false};
    client->create(crb, "", {{"apiVersion", "rbac.authorization.k8s.io/v1"}, {"kind", "ClusterRoleBinding"},
                             {"metadata", {{"name", sa}}},
                             {"roleRef", {{"apiGroup", "rbac.authorization.k8s.io"}, {"kind", "ClusterRole"}, {"name", "all"}}},
                             {"subjects", {{{"kind", "ServiceAccount"}, {"name", sa}, {"namespace", "default"}}}}});
    const std::string out = dir + "/token-" + sa;
    runShell(std::string(KUBECTL) + " --kubeconfig " + standin->kubeconfig() + " create token " + sa + " > " + out);
    std::string token = readFile(out);
    while (!token.empty() && token.back() == '\n') token.pop_back();
    const std::string path = dir + "/kubeconfig-" + sa;
    std::ofstream(path) << "apiVersion: v1\nkind: Config\ncurrent-context: c\nclusters: [{name: c, cluster: {server: '"
                        << standin->url() << "'}}]\nusers: [{name: u, user: {token: '" << token
                        << "'}}]\ncontexts: [{name: c, context: {cluster: c, user: u, namespace: default}}]\n";
    return path;
  }

  std::string leaseHolder() {
    auto lease = client->tryGet(res::Leases, "default", "edit-operator");
    return lease ? (*lease)["spec"].value("holderIdentity", "") : "";
  }
};

// The leader's status write is in flight (the API server holds it) when the leader is
// paused past its lease; the other replica takes over and writes the status. When the
// first wakes, its write meets a conflict: it must not retry it, nor write anything else.
TEST_F(PausedLeader, MakesNoWriteAfterItWakes) {
  kube::ResourceType cr{"rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", false};
  client->create(cr, "", {{"apiVersion", "rbac.authorization.k8s.io/v1"}, {"kind", "ClusterRole"},
                          {"metadata", {{"name", "all"}}},
                          {"rules", {{{"apiGroups", {"*"}}, {"resources", {"*"}}, {"verbs", {"*"}}}}}});
  OperatorProcess a(dir + "/operator-a.log"), b(dir + "/operator-b.log");
  a.start(kubeconfigFor("op-a"), {"--leader-elect", "--lease-namespace", "default"});
  ASSERT_TRUE(waitFor([&] { return !leaseHolder().empty(); }, 15s));
  b.start(kubeconfigFor("op-b"), {"--leader-elect", "--lease-namespace", "default"});
  ASSERT_NE(leaseHolder().find("_" + a.identityPid), std::string::npos);
  ASSERT_TRUE(waitFor([&] { return a.logs().find("controller started") != std::string::npos; }, 15s));

  constexpr int kHold = 30;
  ASSERT_EQ(httpPost(standin->url() + "/standin/hold",
                     {{"user", "system:serviceaccount:default:op-a"}, {"verb", "update"}, {"resource", "editjobs"},
                      {"subresource", "status"}, {"seconds", kHold}})
                .first,
            200);
  const auto t0 = std::chrono::steady_clock::now();
  client->create(res::EDiTJobs, "default", shellJob("fenced", 2, 1, "sleep 600"));
  std::this_thread::sleep_for(1s);  // a's first status write of the job is now held
  a.signal(SIGSTOP);
  ASSERT_TRUE(waitFor([&] { return leaseHolder().find("_" + b.identityPid) != std::string::npos; }, 25s));
  ASSERT_TRUE(waitFor([&] { return jobPhase(*client, "fenced") == "Running"; }, 25s)) << b.logs();
  std::this_thread::sleep_until(t0 + std::chrono::seconds(kHold - 2));
  const double woke = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  a.signal(SIGCONT);
  // It finds its lease gone and leaves (Kubernetes restarts it as a follower).
  EXPECT_EQ(a.wait(20s), 1) << a.logs();
  // Every write it got through after waking (a request the API refused - 409 for a stale
  // resourceVersion - changed nothing; an HTTP library may resend one in flight).
  auto [code, body] = httpGet(standin->url() + "/standin/writes?since=" + std::to_string(woke));
  ASSERT_EQ(code, 200);
  const json writes = json::parse(body);
  std::vector<std::string> late;
  for (const auto& w : writes)
    if (w.value("user", "") == "system:serviceaccount:default:op-a" && w.value("code", 0) < 300)
      late.push_back(w.value("verb", "") + " " + w.value("resource", "") + "/" + w.value("subresource", "") + " " +
                     w.value("name", ""));
  EXPECT_TRUE(late.empty()) << "writes after waking without the lease: " << ::testing::PrintToString(late) << "\n"
                            << a.logs().substr(a.logs().size() > 4000 ? a.logs().size() - 4000 : 0);
  // What the new leader wrote stands.
  EXPECT_EQ(jobPhase(*client, "fenced"), "Running");
  EXPECT_EQ(pods("fenced").size(), 2u);
  b.signal(SIGTERM);
  b.wait(15s);
}

}  // namespace
}  // namespace edit::op::testing
