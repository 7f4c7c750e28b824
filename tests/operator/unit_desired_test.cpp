// Desired-state derivation: pods, env, labels, owner references, placement, service,
// config map (its YAML has the runtime's structure) and secret.
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include "controller/pod_spec.h"

using namespace edit::op;
using nlohmann::json;

namespace {

controller::JobRef makeJob(json extra = json::object()) {
  json spec = {{"image", "edit:1"}, {"replicas", 2}, {"shardsPerReplica", 2}, {"masterPort", 29501}};
  spec.update(extra);
  json obj = {{"metadata", {{"name", "demo"}, {"namespace", "team"}, {"uid", "uid-1"}, {"generation", 3}}}, {"spec", spec}};
  return {api::parseMeta(obj), api::parseSpec(obj)};
}

std::map<std::string, json> envOf(const json& pod) {
  std::map<std::string, json> out;
  for (const auto& e : pod["spec"]["containers"][0]["env"]) out[e["name"]] = e;
  return out;
}

}  // namespace

TEST(Desired, PodIdentityEnvAndLabels) {
  auto job = makeJob({{"env", {{{"name", "EXTRA"}, {"value", "1"}}}}});
  json pod = controller::desiredPod(job, 3, 2, {"10.0.0.1:9090"});
  EXPECT_EQ(pod["metadata"]["name"], "demo-worker-3");
  EXPECT_EQ(pod["metadata"]["namespace"], "team");
  EXPECT_EQ(pod["spec"]["hostname"], "demo-worker-3");
  EXPECT_EQ(pod["spec"]["subdomain"], "demo");
  EXPECT_EQ(pod["spec"]["restartPolicy"], "Never");
  // A worker that dies before writing its termination message leaves its log's tail there.
  EXPECT_EQ(pod["spec"]["containers"][0]["terminationMessagePolicy"], "FallbackToLogsOnError");
  // edit-train writes its reason where the container's terminationMessagePath says.
  bool named = false;
  for (const auto& e : pod["spec"]["containers"][0]["env"])
    named |= e["name"] == "EDIT_TERMINATION_LOG" && e["value"] == pod["spec"]["containers"][0]["terminationMessagePath"];
  EXPECT_TRUE(named) << pod["spec"]["containers"][0]["env"].dump();
  const json& l = pod["metadata"]["labels"];
  EXPECT_EQ(l["edit.io/job-name"], "demo");
  EXPECT_EQ(l["edit.io/rank"], "3");
  EXPECT_EQ(l["edit.io/replica"], "1");
  EXPECT_EQ(l["edit.io/shard"], "1");
  EXPECT_EQ(l["edit.io/restart-generation"], "2");
  auto env = envOf(pod);
  EXPECT_EQ(env["EDIT_JOB"]["value"], "demo");
  EXPECT_EQ(env["EDIT_NAMESPACE"]["value"], "team");
  EXPECT_EQ(env["RANK"]["value"], "3");
  EXPECT_EQ(env["WORLD_SIZE"]["value"], "4");
  // The pod's replica and shard are its labels; the runtime derives its own from RANK.
  EXPECT_EQ(env.count("EDIT_REPLICA"), 0u);
  EXPECT_EQ(env.count("EDIT_SHARD"), 0u);
  EXPECT_EQ(env["EDIT_REPLICAS"]["value"], "2");
  EXPECT_EQ(env["EDIT_SHARDS"]["value"], "2");
  EXPECT_EQ(env["MASTER_ADDR"]["value"], "demo-worker-0.demo.team.svc");
  EXPECT_EQ(env["MASTER_PORT"]["value"], "29501");
  EXPECT_EQ(env["EDIT_TELEMETRY_ADDR"]["value"], "10.0.0.1:9090");
  EXPECT_EQ(env["EDIT_RESTART_GENERATION"]["value"], "2");
  EXPECT_EQ(env["EDIT_CONFIG"]["valueFrom"]["configMapKeyRef"]["name"], "demo-config");
  EXPECT_EQ(env["EDIT_CONFIG"]["valueFrom"]["configMapKeyRef"]["key"], "config.yaml");
  EXPECT_EQ(env["EDIT_TELEMETRY_TOKEN"]["valueFrom"]["secretKeyRef"]["name"], "demo-telemetry");
  EXPECT_EQ(env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"], "metadata.name");
  EXPECT_EQ(env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"], "spec.nodeName");
  EXPECT_EQ(env["POD_UID"]["valueFrom"]["fieldRef"]["fieldPath"], "metadata.uid");
  EXPECT_EQ(env["EDIT_TELEMETRY_HEARTBEAT_SECONDS"]["value"], "10");  // hangTimeoutSeconds 300: capped
  EXPECT_EQ(env["EXTRA"]["value"], "1");
  // A fifth of the hang timeout within [1, 10] s (0 disables hang detection: the cap).
  for (const auto& [hang, beat] : std::vector<std::pair<int, std::string>>{{10, "2"}, {3, "1"}, {0, "10"}, {40, "8"}})
    EXPECT_EQ(envOf(controller::desiredPod(makeJob({{"hangTimeoutSeconds", hang}}), 0, 0, {"x:1"}))
                  ["EDIT_TELEMETRY_HEARTBEAT_SECONDS"]["value"], beat) << hang;
  EXPECT_EQ(pod["spec"]["containers"][0]["command"], json({"edit-train"}));
}

// Without overrides a worker pod meets the restricted Pod Security Standard: non-root, no
// privilege escalation, every capability dropped, the RuntimeDefault seccomp profile.
TEST(Desired, WorkersMeetTheRestrictedPodSecurityStandard) {
  json pod = controller::desiredPod(makeJob(), 0, 0, {"x:1"});
  const json& psc = pod["spec"]["securityContext"];
  EXPECT_EQ(psc["runAsNonRoot"], true);
  EXPECT_EQ(psc["seccompProfile"]["type"], "RuntimeDefault");
  EXPECT_EQ(psc["fsGroup"], 65532);
  const json& csc = pod["spec"]["containers"][0]["securityContext"];
  EXPECT_EQ(csc["allowPrivilegeEscalation"], false);
  EXPECT_EQ(csc["capabilities"]["drop"], json({"ALL"}));
  EXPECT_EQ(csc["runAsNonRoot"], true);
  EXPECT_FALSE(csc.contains("privileged"));
  EXPECT_FALSE(pod["spec"].contains("hostNetwork"));
}

TEST(Desired, PodTemplateOverridesLabelsAnnotationsSecretsAndSecurity) {
  auto job = makeJob({{"schedulerName", "volcano"},
                      {"podTemplate",
                       {{"metadata",
                         {{"labels", {{"team", "ml"}}},
                          {"annotations", {{"sidecar.istio.io/inject", "false"}, {"scheduling.k8s.io/group-name", "mine"}}}}},
                        {"spec",
                         {{"imagePullSecrets", {{{"name", "regcred"}}}},
                          {"securityContext", {{"runAsUser", 1000}, {"runAsNonRoot", true}}},
                          {"containerSecurityContext", {{"privileged", false}}}}}}}});
  json pod = controller::desiredPod(job, 1, 0, {"x:1"});
  const json& md = pod["metadata"];
  EXPECT_EQ(md["labels"]["team"], "ml");
  EXPECT_EQ(md["labels"]["edit.io/rank"], "1");
  EXPECT_EQ(md["annotations"]["sidecar.istio.io/inject"], "false");
  EXPECT_EQ(md["annotations"]["scheduling.k8s.io/group-name"], "demo");  // the operator's value wins
  EXPECT_EQ(pod["spec"]["imagePullSecrets"], json({{{"name", "regcred"}}}));
  // Replaced as a whole, not merged.
  EXPECT_EQ(pod["spec"]["securityContext"], json({{"runAsUser", 1000}, {"runAsNonRoot", true}}));
  EXPECT_EQ(pod["spec"]["containers"][0]["securityContext"], json({{"privileged", false}}));
  EXPECT_FALSE(controller::desiredPod(makeJob(), 0, 0, {"x:1"})["spec"].contains("imagePullSecrets"));
}

TEST(Desired, OwnerReferenceIsTheControllingJob) {
  json pod = controller::desiredPod(makeJob(), 0, 0, {});
  const json& ref = pod["metadata"]["ownerReferences"][0];
  EXPECT_EQ(ref["apiVersion"], "edit.io/v1alpha1");
  EXPECT_EQ(ref["kind"], "EDiTJob");
  EXPECT_EQ(ref["name"], "demo");
  EXPECT_EQ(ref["uid"], "uid-1");
  EXPECT_EQ(ref["controller"], true);
  EXPECT_EQ(ref["blockOwnerDeletion"], true);
}

TEST(Desired, PlacementPacksReplicasAndSpreadsThem) {
  json pod = controller::desiredPod(makeJob(), 2, 0, {});
  const json& term = pod["spec"]["affinity"]["podAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0];
  EXPECT_EQ(term["podAffinityTerm"]["topologyKey"], "kubernetes.io/hostname");
  EXPECT_EQ(term["podAffinityTerm"]["labelSelector"]["matchLabels"]["edit.io/replica"], "1");
  const json& spread = pod["spec"]["topologySpreadConstraints"][0];
  EXPECT_EQ(spread["maxSkew"], 2);
  EXPECT_EQ(spread["labelSelector"]["matchLabels"]["edit.io/job-name"], "demo");
  EXPECT_FALSE(pod["spec"]["affinity"].contains("nodeAffinity"));

  json moved = controller::desiredPod(makeJob(), 2, 0, {}, {"node-a"});
  const json& expr = moved["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
                          ["nodeSelectorTerms"][0]["matchExpressions"][0];
  EXPECT_EQ(expr["operator"], "NotIn");
  EXPECT_EQ(expr["values"], json({"node-a"}));
}

TEST(Desired, SchedulingFieldsAndGpus) {
  auto job = makeJob({{"gpusPerWorker", 2}, {"nodeSelector", {{"pool", "gpu"}}},
                      {"tolerations", {{{"key", "gpu"}, {"operator", "Exists"}}}}, {"priorityClassName", "high"},
                      {"schedulerName", "volcano"}, {"resources", {{"limits", {{"cpu", "4"}}}}}});
  json pod = controller::desiredPod(job, 0, 0, {});
  EXPECT_EQ(pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"], "2");
  EXPECT_EQ(pod["spec"]["containers"][0]["resources"]["limits"]["cpu"], "4");
  EXPECT_EQ(pod["spec"]["nodeSelector"]["pool"], "gpu");
  EXPECT_EQ(pod["spec"]["tolerations"][0]["key"], "gpu");
  EXPECT_EQ(pod["spec"]["priorityClassName"], "high");
  EXPECT_EQ(pod["spec"]["schedulerName"], "volcano");
  EXPECT_EQ(pod["metadata"]["annotations"]["scheduling.k8s.io/group-name"], "demo");
  json pg = controller::desiredPodGroup(job);
  EXPECT_EQ(pg["apiVersion"], "scheduling.volcano.sh/v1beta1");
  EXPECT_EQ(pg["spec"]["minMember"], 4);
  EXPECT_TRUE(controller::desiredPodGroup(makeJob()).empty());
  auto cosched = makeJob({{"schedulerName", "scheduler-plugins-scheduler"}});
  EXPECT_EQ(controller::desiredPodGroup(cosched)["apiVersion"], "scheduling.x-k8s.io/v1alpha1");
  EXPECT_EQ(controller::desiredPod(cosched, 0, 0, {})["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"], "demo");
}

TEST(Desired, HeadlessService) {
  json svc = controller::desiredService(makeJob());
  EXPECT_EQ(svc["metadata"]["name"], "demo");
  EXPECT_EQ(svc["spec"]["clusterIP"], "None");
  EXPECT_EQ(svc["spec"]["selector"]["edit.io/job-name"], "demo");
  EXPECT_EQ(svc["spec"]["ports"][0]["port"], 29501);
  EXPECT_EQ(svc["metadata"]["ownerReferences"][0]["uid"], "uid-1");
}

TEST(Desired, ConfigMapHoldsTheRuntimeYaml) {
  auto job = makeJob({{"model", {{"preset", "tiny"}, {"dim", 64}}},
                      {"data", {{"train", "tok/train.bin"}, {"seqLen", 32}, {"pvc", "corpus"}}},
                      {"training", {{"steps", 50}, {"lr", 0.003}}},
                      {"algorithm", {{"mode", "a-edit"}, {"syncSeconds", 2.5}, {"penalty", {{"anomaly", false}}}}},
                      {"checkpoint", {{"pvc", "ckpt"}, {"everySteps", 10}}},
                      {"debug", {{"injectStepDelay", {{"rank", 1}, {"seconds", 0.5}}}}}});
  json cm = controller::desiredConfigMap(job);
  EXPECT_EQ(cm["metadata"]["name"], "demo-config");
  YAML::Node y = YAML::Load(cm["data"]["config.yaml"].get<std::string>());
  EXPECT_EQ(y["model"]["preset"].as<std::string>(), "tiny");
  EXPECT_EQ(y["model"]["dim"].as<int>(), 64);
  EXPECT_EQ(y["data"]["train"].as<std::string>(), "/data/tok/train.bin");
  EXPECT_FALSE(y["data"]["pvc"]);  // the runtime rejects unknown keys
  EXPECT_EQ(y["data"]["seqLen"].as<int>(), 32);
  EXPECT_EQ(y["training"]["steps"].as<int>(), 50);
  EXPECT_DOUBLE_EQ(y["training"]["lr"].as<double>(), 0.003);
  EXPECT_EQ(y["algorithm"]["mode"].as<std::string>(), "a-edit");
  EXPECT_DOUBLE_EQ(y["algorithm"]["syncSeconds"].as<double>(), 2.5);
  EXPECT_FALSE(y["algorithm"]["penalty"]["anomaly"].as<bool>());
  EXPECT_EQ(y["checkpoint"]["dir"].as<std::string>(), "/checkpoints/demo");
  EXPECT_EQ(y["checkpoint"]["everySteps"].as<int>(), 10);
  EXPECT_FALSE(y["checkpoint"]["pvc"]);
  EXPECT_EQ(y["debug"]["injectStepDelay"]["rank"].as<int>(), 1);
  // Only sections of common/src/worker_config.h appear.
  for (auto it = y.begin(); it != y.end(); ++it) {
    std::string k = it->first.as<std::string>();
    EXPECT_TRUE(k == "model" || k == "data" || k == "training" || k == "algorithm" || k == "checkpoint" || k == "debug" ||
                k == "runtime")
        << k;
  }
  json pod = controller::desiredPod(job, 0, 0, {});
  EXPECT_EQ(pod["spec"]["volumes"].size(), 2u);
  EXPECT_EQ(pod["spec"]["containers"][0]["volumeMounts"][0]["mountPath"], "/checkpoints");
}

TEST(Desired, RecoveryModeFollowsReplicaRecoveryAndMode) {
  auto recovery = [](json extra) {
    YAML::Node y = YAML::Load(controller::workerConfigYaml(makeJob(extra)));
    return y["runtime"]["recovery"].as<std::string>();
  };
  EXPECT_EQ(recovery(json::object()), "inPlace");
  EXPECT_EQ(recovery({{"runPolicy", {{"replicaRecovery", "InPlace"}}}}), "inPlace");
  EXPECT_EQ(recovery({{"runPolicy", {{"replicaRecovery", "GangRestart"}}}}), "exit");
  // ddp synchronizes every step: survivors cannot wait for a replacement.
  EXPECT_EQ(recovery({{"algorithm", {{"mode", "ddp"}}}}), "exit");
  // spec.runtime's other fields go along.
  YAML::Node y = YAML::Load(controller::workerConfigYaml(makeJob({{"runtime", {{"bucketMB", 2}}}})));
  EXPECT_EQ(y["runtime"]["bucketMB"].as<int>(), 2);
  EXPECT_EQ(y["runtime"]["recovery"].as<std::string>(), "inPlace");
}

TEST(Desired, OnlyReplacementPodsJoinTheRunningJob) {
  auto job = makeJob();
  EXPECT_FALSE(envOf(controller::desiredPod(job, 1, 0, {})).count("EDIT_JOIN"));
  auto env = envOf(controller::desiredPod(job, 1, 0, {}, {}, controller::PodJoin::Replace));
  ASSERT_TRUE(env.count("EDIT_JOIN"));
  EXPECT_EQ(env["EDIT_JOIN"]["value"], "1");
}

TEST(Desired, ScaleUpPodsJoinAsANewReplicaOfTheLargerWorld) {
  auto job = makeJob();
  job.spec.replicas = 3;  // the world the pod enters: the scale's target
  auto env = envOf(controller::desiredPod(job, 5, 0, {}, {}, controller::PodJoin::Scale));
  EXPECT_EQ(env["EDIT_JOIN"]["value"], "scale");
  EXPECT_EQ(env["WORLD_SIZE"]["value"], "6");
  EXPECT_EQ(env["EDIT_REPLICAS"]["value"], "3");
  EXPECT_EQ(env["RANK"]["value"], "5");
}

// Kueue's plain-pod integration: a queued job's pods carry the queue and one group per
// gang (a new generation is a new group); a scale-up's pods are a group of their own.
TEST(Desired, KueueQueuedJobsPodsFormOneGroupPerGangAndPerScale) {
  json obj = {{"metadata", {{"name", "demo"}, {"namespace", "team"}, {"uid", "uid-1"}, {"generation", 3},
                            {"labels", {{"kueue.x-k8s.io/queue-name", "team-queue"}}}}},
              {"spec", {{"image", "edit:1"}, {"replicas", 2}, {"shardsPerReplica", 2}}}};
  controller::JobRef job{api::parseMeta(obj), api::parseSpec(obj)};
  EXPECT_EQ(job.spec.kueueQueue, "team-queue");
  json pod = controller::desiredPod(job, 3, 2, {});
  const json& labels = pod["metadata"]["labels"];
  const json& ann = pod["metadata"]["annotations"];
  EXPECT_EQ(labels["kueue.x-k8s.io/queue-name"], "team-queue");
  EXPECT_EQ(labels["kueue.x-k8s.io/pod-group-name"], "demo-g2");
  EXPECT_EQ(ann["kueue.x-k8s.io/pod-group-total-count"], "4");
  EXPECT_EQ(ann["kueue.x-k8s.io/retriable-in-group"], "false");

  auto larger = job;
  larger.spec.replicas = 3;
  const auto group = controller::scalePodGroup(larger, 2, 2, 3, 1800000000);
  EXPECT_EQ(group.name, "demo-g2-scale1800000000");
  EXPECT_EQ(group.total, 2);  // one replica of 2 shards
  json added = controller::desiredPod(larger, 4, 2, {}, {}, controller::PodJoin::Scale, group);
  EXPECT_EQ(added["metadata"]["labels"]["kueue.x-k8s.io/pod-group-name"], "demo-g2-scale1800000000");
  EXPECT_EQ(added["metadata"]["annotations"]["kueue.x-k8s.io/pod-group-total-count"], "2");

  // A long job name is cut so that the group name stays a valid label value.
  job.meta.name = std::string(50, 'a');
  const auto g = controller::scalePodGroup(job, 12, 2, 3, 1800000000);
  EXPECT_LE(g.name.size(), 63u);
  EXPECT_EQ(g.name.substr(g.name.size() - 20), "-g12-scale1800000000");

  // Not queued: none of Kueue's labels.
  json plain = controller::desiredPod(makeJob(), 0, 0, {});
  EXPECT_FALSE(plain["metadata"]["labels"].contains("kueue.x-k8s.io/queue-name"));
  EXPECT_FALSE(plain["metadata"].contains("annotations") &&
               plain["metadata"]["annotations"].contains("kueue.x-k8s.io/pod-group-total-count"));
}

TEST(Desired, TelemetryTlsMountsTheCaSecretIntoWorkers) {
  auto job = makeJob();
  json plain = controller::desiredPod(job, 0, 0, {"op:9090"});
  EXPECT_FALSE(envOf(plain).count("EDIT_TELEMETRY_CA_FILE"));
  EXPECT_FALSE(plain["spec"].contains("volumes"));

  json pod = controller::desiredPod(job, 0, 0, {"op.edit-system.svc:9090", "edit-telemetry-ca", "op.example"});
  auto env = envOf(pod);
  EXPECT_EQ(env["EDIT_TELEMETRY_CA_FILE"]["value"], "/etc/edit/telemetry-tls/ca.crt");
  EXPECT_EQ(env["EDIT_TELEMETRY_SERVER_NAME"]["value"], "op.example");
  ASSERT_EQ(pod["spec"]["volumes"].size(), 1u);
  const json& v = pod["spec"]["volumes"][0];
  EXPECT_EQ(v["name"], "edit-telemetry-ca");
  EXPECT_EQ(v["secret"]["secretName"], "edit-telemetry-ca");
  EXPECT_EQ(v["secret"]["items"], json::parse(R"([{"key": "ca.crt", "path": "ca.crt"}])"));  // only the CA
  const json& m = pod["spec"]["containers"][0]["volumeMounts"][0];
  EXPECT_EQ(m["name"], "edit-telemetry-ca");
  EXPECT_EQ(m["mountPath"], "/etc/edit/telemetry-tls");
  EXPECT_EQ(m["readOnly"], true);
  // Without a server name override the variable is not set at all.
  EXPECT_FALSE(envOf(controller::desiredPod(job, 0, 0, {"op:9090", "ca"})).count("EDIT_TELEMETRY_SERVER_NAME"));
}

TEST(Desired, SecretAndTokens) {
  std::string t1 = controller::randomToken(), t2 = controller::randomToken();
  EXPECT_EQ(t1.size(), 64u);
  EXPECT_NE(t1, t2);
  EXPECT_EQ(t1.find_first_not_of("0123456789abcdef"), std::string::npos);
  json s = controller::desiredSecret(makeJob(), "abc");
  EXPECT_EQ(s["metadata"]["name"], "demo-telemetry");
  EXPECT_EQ(s["data"]["token"], "YWJj");
}
