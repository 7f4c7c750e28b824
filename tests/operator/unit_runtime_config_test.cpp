// The ConfigMap's config.yaml is accepted by the runtime's own parser (common/src/worker_config.h).
#include <gtest/gtest.h>

#include "worker_config.h"
#include "controller/desired.h"

using namespace edit::op;
using nlohmann::json;

namespace {
controller::JobRef makeJob(const json& spec) {
  json obj = {{"metadata", {{"name", "demo"}, {"namespace", "ns"}, {"uid", "u"}}}, {"spec", spec}};
  return {api::parseMeta(obj), api::parseSpec(obj)};
}
}  // namespace

TEST(RuntimeConfig, FullSpecParsesInTheRuntime) {
  json spec = {{"image", "i"}, {"replicas", 2}, {"shardsPerReplica", 2},
               {"model", {{"preset", "tiny"}, {"dim", 64}}},
               {"data", {{"train", "tok/train.bin"}, {"val", ""}, {"seqLen", 32}, {"batchSize", 4}, {"pvc", "corpus"}}},
               {"training", {{"steps", 50}, {"lr", 0.003}, {"seed", 7}}},
               {"algorithm", {{"mode", "a-edit"}, {"syncSeconds", 2.5}, {"outer", {{"lr", 0.7}, {"nesterov", true}}},
                              {"penalty", {{"anomaly", false}, {"zThreshold", 3.0}}}}},
               {"checkpoint", {{"pvc", "ckpt"}, {"everySteps", 10}, {"keep", 2}, {"resume", true}}},
               {"debug", {{"injectStepDelay", {{"rank", 1}, {"seconds", 0.5}}}}}};
  edit::Config c = edit::parseConfig(controller::workerConfigYaml(makeJob(spec)));
  EXPECT_NO_THROW(edit::validate(c));
  EXPECT_DOUBLE_EQ(c.training.lr, 0.003);
  EXPECT_EQ(c.training.steps, 50);
  EXPECT_EQ(c.algorithm.mode, edit::Mode::AEdit);
  EXPECT_DOUBLE_EQ(c.algorithm.syncSeconds, 2.5);
  EXPECT_FALSE(c.algorithm.penalty.anomaly);
  EXPECT_EQ(c.checkpoint.dir, "/checkpoints/demo");
  EXPECT_EQ(c.checkpoint.everySteps, 10);
  EXPECT_EQ(c.data.train, "/data/tok/train.bin");
  EXPECT_EQ(c.debug.injectStepDelay.rank, 1);
}

TEST(RuntimeConfig, ReplicaRecoveryBecomesRuntimeRecovery) {
  auto recovery = [](json runPolicy) {
    return edit::parseConfig(controller::workerConfigYaml(makeJob({{"image", "i"}, {"runPolicy", runPolicy}}))).runtime.recovery;
  };
  EXPECT_EQ(recovery(json::object()), edit::RecoveryMode::InPlace);
  EXPECT_EQ(recovery({{"replicaRecovery", "GangRestart"}}), edit::RecoveryMode::Exit);
}

TEST(RuntimeConfig, RuntimeSectionReachesTheWorkerWithRecoveryFromRunPolicy) {
  json spec = {{"image", "i"},
               {"runPolicy", {{"replicaRecovery", "GangRestart"}}},
               {"runtime", {{"bucketMB", 8}, {"reshardAfterForward", false}, {"backend", "gloo"},
                            {"rendezvousTimeoutSeconds", 120}, {"threads", 3}}}};
  edit::Config c = edit::parseConfig(controller::workerConfigYaml(makeJob(spec)));
  EXPECT_EQ(c.runtime.bucketMB, 8);
  EXPECT_FALSE(c.runtime.reshardAfterForward);
  EXPECT_EQ(c.runtime.backend, edit::Backend::Gloo);  // the default is auto
  EXPECT_DOUBLE_EQ(c.runtime.rendezvousTimeoutSeconds, 120);
  EXPECT_EQ(c.runtime.threads, 3);
  EXPECT_EQ(c.runtime.recovery, edit::RecoveryMode::Exit);
  // Left out, the runtime's defaults apply.
  edit::Config d = edit::parseConfig(controller::workerConfigYaml(makeJob({{"image", "i"}})));
  EXPECT_EQ(d.runtime.bucketMB, edit::Config{}.runtime.bucketMB);
  EXPECT_EQ(d.runtime.recovery, edit::RecoveryMode::InPlace);
}

TEST(RuntimeConfig, EmptySectionsParse) {
  EXPECT_NO_THROW(edit::parseConfig(controller::workerConfigYaml(makeJob({{"image", "i"}, {"model", json::object()}}))));
}

namespace {
// The field of checkWorkerConfig's SpecError ("" when the runtime accepts the job).
std::string refusedField(const json& spec, std::string* message = nullptr) {
  try {
    controller::checkWorkerConfig(makeJob(spec));
  } catch (const api::SpecError& e) {
    if (message) *message = e.what();
    return e.field();
  }
  return "";
}
}  // namespace

TEST(RuntimeConfig, TheOperatorRefusesWhatAWorkerWouldWithTheRuntimesMessage) {
  std::string msg;
  EXPECT_EQ(refusedField({{"image", "i"}, {"algorithm", {{"syncSeconds", 100000}}}}, &msg), "spec.algorithm.syncSeconds");
  EXPECT_NE(msg.find("[0, 86400]"), std::string::npos) << msg;
  EXPECT_EQ(refusedField({{"image", "i"}, {"algorithm", {{"mode", "sgd"}}}}, &msg), "spec.algorithm.mode");
  EXPECT_NE(msg.find("one of edit, a-edit, diloco, localsgd, ddp"), std::string::npos) << msg;
  EXPECT_EQ(refusedField({{"image", "i"}, {"training", {{"steps", 0}}}}), "spec.training.steps");
  EXPECT_EQ(refusedField({{"image", "i"}, {"algorithm", {{"mode", "a-edit"}}}}), "spec.algorithm.syncSeconds");
  EXPECT_EQ(refusedField({{"image", "i"}, {"model", {{"preset", "llama-1b"}, {"heads", 3}}}}), "spec.model.heads");
  EXPECT_EQ(refusedField({{"image", "i"}, {"debug", {{"injectStepDelay", {{"seconds", 7200}}}}}}),
            "spec.debug.injectStepDelay.seconds");
  EXPECT_EQ(refusedField({{"image", "i"}, {"runtime", {{"bucketMB", -1}}}}), "spec.runtime.bucketMB");
  EXPECT_EQ(refusedField({{"image", "i"}, {"runtime", {{"backend", "mpi"}}}}), "spec.runtime.backend");
  EXPECT_EQ(refusedField({{"image", "i"}, {"runtime", {{"bucketSize", 4}}}}), "spec.runtime.bucketSize");
  EXPECT_EQ(refusedField({{"image", "i"}, {"algorithm", {{"mode", "a-edit"}, {"syncSeconds", 2}}}}), "");
  EXPECT_EQ(refusedField({{"image", "i"}}), "");
}
