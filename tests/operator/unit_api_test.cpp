// EDiTJob spec parsing: defaults and field-named validation errors.
#include <gtest/gtest.h>

#include "api/editjob.h"

using edit::op::api::parseSpec;
using edit::op::api::SpecError;
using nlohmann::json;

namespace {

json job(json spec) { return {{"metadata", {{"name", "j"}, {"namespace", "ns"}}}, {"spec", spec}}; }

std::string errorField(const json& spec) {
  try {
    parseSpec(job(spec));
  } catch (const SpecError& e) {
    EXPECT_NE(std::string(e.what()).find(e.field()), std::string::npos);
    return e.field();
  }
  return "";
}

}  // namespace

TEST(ApiSpec, DefaultsMatchTheCrd) {
  auto s = parseSpec(job({{"image", "img"}}));
  EXPECT_EQ(s.replicas, 1);
  EXPECT_EQ(s.shardsPerReplica, 1);
  EXPECT_EQ(s.masterPort, 29500);
  EXPECT_EQ(s.hangTimeoutSeconds, 300);
  EXPECT_EQ(s.command, std::vector<std::string>{"edit-train"});
  EXPECT_EQ(s.runPolicy.backoffLimit, 3);
  EXPECT_EQ(s.runPolicy.cleanPodPolicy, "Running");
  EXPECT_EQ(s.runPolicy.replicaRecovery, "InPlace");
  EXPECT_TRUE(s.inPlaceRecovery());
  EXPECT_FALSE(s.runPolicy.activeDeadlineSeconds.has_value());
  EXPECT_DOUBLE_EQ(s.stragglerPolicy.threshold, 1.5);
  EXPECT_EQ(s.stragglerPolicy.windowSteps, 20);
  EXPECT_EQ(s.stragglerPolicy.action, "Report");
  EXPECT_EQ(s.stragglerPolicy.minReports, 5);
}

TEST(ApiSpec, ParsesEveryField) {
  auto s = parseSpec(job({{"image", "img"}, {"replicas", 4}, {"shardsPerReplica", 2}, {"gpusPerWorker", 1},
                          {"command", {"sh", "-c", "true"}}, {"masterPort", 1234},
                          {"runPolicy", {{"backoffLimit", 0}, {"activeDeadlineSeconds", 60}, {"ttlSecondsAfterFinished", 0},
                                         {"cleanPodPolicy", "All"}, {"suspend", true}, {"replicaRecovery", "GangRestart"}}},
                          {"stragglerPolicy", {{"threshold", 2.0}, {"windowSteps", 4}, {"action", "Replace"}, {"minReports", 2}}}}));
  EXPECT_EQ(s.worldSize(), 8);
  EXPECT_EQ(s.command.size(), 3u);
  EXPECT_EQ(*s.runPolicy.activeDeadlineSeconds, 60);
  EXPECT_EQ(*s.runPolicy.ttlSecondsAfterFinished, 0);
  EXPECT_TRUE(s.runPolicy.suspend);
  EXPECT_EQ(s.stragglerPolicy.action, "Replace");
  EXPECT_EQ(s.runPolicy.replicaRecovery, "GangRestart");
  EXPECT_FALSE(s.inPlaceRecovery());
}

TEST(ApiSpec, ReplicaRecovery) {
  // ddp synchronizes every step: never in place, whatever runPolicy says.
  EXPECT_FALSE(parseSpec(job({{"image", "i"}, {"algorithm", {{"mode", "ddp"}}}})).inPlaceRecovery());
  EXPECT_TRUE(parseSpec(job({{"image", "i"}, {"algorithm", {{"mode", "a-edit"}, {"syncSeconds", 1}}}})).inPlaceRecovery());
  try {
    parseSpec(job({{"image", "i"}, {"runPolicy", {{"replicaRecovery", "Restart"}}}}));
    FAIL();
  } catch (const SpecError& e) {
    EXPECT_EQ(e.field(), "spec.runPolicy.replicaRecovery");
    EXPECT_NE(std::string(e.what()).find("InPlace, GangRestart"), std::string::npos) << e.what();
  }
  EXPECT_EQ(errorField({{"image", "i"}, {"runPolicy", {{"replicaRecovery", 1}}}}), "spec.runPolicy.replicaRecovery");
}

TEST(ApiSpec, ErrorsNameTheField) {
  EXPECT_EQ(errorField({{"replicas", 1}}), "spec.image");
  EXPECT_EQ(errorField({{"image", "i"}, {"replicas", 0}}), "spec.replicas");
  EXPECT_EQ(errorField({{"image", "i"}, {"replicas", "two"}}), "spec.replicas");
  EXPECT_EQ(errorField({{"image", "i"}, {"shardsPerReplica", -1}}), "spec.shardsPerReplica");
  EXPECT_EQ(errorField({{"image", "i"}, {"masterPort", 70000}}), "spec.masterPort");
  EXPECT_EQ(errorField({{"image", "i"}, {"command", json::array()}}), "spec.command");
  EXPECT_EQ(errorField({{"image", "i"}, {"command", {"a", 3}}}), "spec.command[1]");
  EXPECT_EQ(errorField({{"image", "i"}, {"runPolicy", {{"backoffLimit", -1}}}}), "spec.runPolicy.backoffLimit");
  EXPECT_EQ(errorField({{"image", "i"}, {"runPolicy", {{"cleanPodPolicy", "Some"}}}}), "spec.runPolicy.cleanPodPolicy");
  EXPECT_EQ(errorField({{"image", "i"}, {"stragglerPolicy", {{"action", "Kill"}}}}), "spec.stragglerPolicy.action");
  EXPECT_EQ(errorField({{"image", "i"}, {"stragglerPolicy", {{"threshold", 0.5}}}}), "spec.stragglerPolicy.threshold");
  EXPECT_EQ(errorField({{"image", "i"}, {"env", {{{"value", "x"}}}}}), "spec.env[0].name");
  EXPECT_EQ(errorField({{"image", "i"}, {"model", "tiny"}}), "spec.model");
  EXPECT_EQ(errorField({{"image", "i"}}), "");
}

TEST(ApiSpec, RuntimeSectionLeavesRecoveryToRunPolicyAndNcclToGpus) {
  EXPECT_EQ(errorField({{"image", "i"}, {"runtime", "fast"}}), "spec.runtime");
  // One place decides what survivors do: runPolicy.replicaRecovery.
  EXPECT_EQ(errorField({{"image", "i"}, {"runtime", {{"recovery", "exit"}}}}), "spec.runtime.recovery");
  try {
    parseSpec(job({{"image", "i"}, {"runtime", {{"recovery", "exit"}}}}));
  } catch (const SpecError& e) {
    EXPECT_NE(std::string(e.what()).find("spec.runPolicy.replicaRecovery"), std::string::npos) << e.what();
  }
  EXPECT_EQ(errorField({{"image", "i"}, {"runtime", {{"backend", "nccl"}}}}), "spec.runtime.backend");
  EXPECT_EQ(errorField({{"image", "i"}, {"gpusPerWorker", 1}, {"runtime", {{"backend", "nccl"}}}}), "");
  EXPECT_EQ(errorField({{"image", "i"}, {"runtime", {{"bucketMB", 4}, {"backend", "gloo"}}}}), "");
}

TEST(ApiSpec, PodTemplateOverride) {
  auto s = parseSpec(job({{"image", "i"},
                          {"podTemplate",
                           {{"metadata", {{"labels", {{"team", "ml"}}}, {"annotations", {{"sidecar.istio.io/inject", "false"}}}}},
                            {"spec",
                             {{"imagePullSecrets", {{{"name", "regcred"}}}},
                              {"securityContext", {{"runAsUser", 1000}}},
                              {"containerSecurityContext", {{"readOnlyRootFilesystem", true}}}}}}}}));
  EXPECT_EQ(s.podTemplate.labels["team"], "ml");
  EXPECT_EQ(s.podTemplate.annotations["sidecar.istio.io/inject"], "false");
  EXPECT_EQ(s.podTemplate.imagePullSecrets[0]["name"], "regcred");
  ASSERT_TRUE(s.podTemplate.securityContext);
  EXPECT_EQ((*s.podTemplate.securityContext)["runAsUser"], 1000);
  ASSERT_TRUE(s.podTemplate.containerSecurityContext);
  EXPECT_FALSE(parseSpec(job({{"image", "i"}})).podTemplate.securityContext);

  EXPECT_EQ(errorField({{"image", "i"}, {"podTemplate", {{"metadata", {{"labels", {{"edit.io/rank", "0"}}}}}}}}),
            "spec.podTemplate.metadata.labels[\"edit.io/rank\"]");
  EXPECT_EQ(errorField({{"image", "i"}, {"podTemplate", {{"metadata", {{"annotations", {{"a", 1}}}}}}}}),
            "spec.podTemplate.metadata.annotations[\"a\"]");
  EXPECT_EQ(errorField({{"image", "i"}, {"podTemplate", {{"spec", {{"imagePullSecrets", {json::object()}}}}}}}),
            "spec.podTemplate.spec.imagePullSecrets[0].name");
  EXPECT_EQ(errorField({{"image", "i"}, {"podTemplate", {{"spec", {{"securityContext", "root"}}}}}}),
            "spec.podTemplate.spec.securityContext");
}

TEST(ApiSpec, MissingSpecAndLongNames) {
  EXPECT_THROW(parseSpec(json{{"metadata", {{"name", "j"}}}}), SpecError);
  EXPECT_NO_THROW(edit::op::api::validateName("job-1", 16));
  try {
    edit::op::api::validateName(std::string(60, 'a'), 16);
    FAIL();
  } catch (const SpecError& e) {
    EXPECT_EQ(e.field(), "metadata.name");
  }
  EXPECT_THROW(edit::op::api::validateName("Upper", 1), SpecError);
}
