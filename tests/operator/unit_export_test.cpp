// spec.export: its validation (api/editjob.cpp), the export pod (controller/export_pod.cpp)
// and the decision when to run it and what its outcome means (controller/export_policy.cpp).
#include <gtest/gtest.h>

#include "controller/export_pod.h"
#include "controller/pod_spec.h"
#include "controller/export_policy.h"
#include "plan_fixtures.h"
#include "util/log.h"

using namespace edit::op;
using namespace edit::op::controller;
using namespace edit::op::controller::plantest;
using nlohmann::json;

namespace {

json jobObj(const json& specExtra) {
  json spec = {{"image", "img:1"}, {"replicas", 2}, {"shardsPerReplica", 2}, {"checkpoint", {{"pvc", "ckpt"}}},
               {"export", {{"path", "hf"}}}};
  if (specExtra.is_object()) spec.update(specExtra);
  return {{"metadata", {{"name", "j"}, {"namespace", "ns"}, {"uid", "u"}, {"generation", 1}}}, {"spec", spec}};
}

JobRef jobRef(const json& specExtra = json::object()) {
  json o = jobObj(specExtra);
  return {api::parseMeta(o), api::parseSpec(o)};
}

// The SpecError's message for a spec, "" when it parses.
std::string specError(const json& specExtra) {
  try {
    JobRef j = jobRef(specExtra);
    checkExport(j);
  } catch (const api::SpecError& e) {
    return e.what();
  }
  return "";
}

ExportInput exportInput(const json& status, std::vector<ExportPod> pods = {}, const json& specExtra = json::object()) {
  JobRef j = jobRef(specExtra);
  return {j.spec.exportModel,      exportOutDir(j), j.spec.runPolicy.cleanPodPolicy, api::EDiTJobStatus::fromJson(status),
          1, std::move(pods), kNow};
}

json succeededStatus(json extra = json::object()) {
  json st = {{"phase", "Succeeded"}, {"completionTime", log::rfc3339(kNow - 1)}};
  st.update(extra);
  return st;
}

ExportPod exportPod(int attempt, const std::string& phase, std::optional<int> exit = std::nullopt,
                    const std::string& message = "") {
  ExportPod p;
  p.name = exportPodName("j", attempt);
  p.attempt = attempt;
  p.phase = phase;
  p.exitCode = exit;
  p.message = message;
  if (exit && *exit != 0) p.reason = "Error";
  return p;
}

const std::string kReport =
    R"({"out":"/checkpoints/hf","model":"/checkpoints/hf/model.safetensors","config":"/checkpoints/hf/config.json",)"
    R"("bytes":1234567,"dtype":"bf16","checkpoint":"/checkpoints/j/step-00000040","step":"40","weights":"outer",)"
    R"("replica":"0","mesh":"2x2","params":300000})";

}  // namespace

TEST(ApiExport, DefaultsAndAbsent) {
  auto s = api::parseSpec(jobObj({}));
  ASSERT_TRUE(s.exportModel);
  EXPECT_EQ(s.exportModel->path, "hf");
  EXPECT_EQ(s.exportModel->dtype, "f32");
  EXPECT_EQ(s.exportModel->weights, "auto");
  json none = jobObj({});
  none["spec"].erase("export");
  EXPECT_FALSE(api::parseSpec(none).exportModel);
}

TEST(ApiExport, ErrorsNameTheFieldAndTheFix) {
  const std::string abs = specError({{"export", {{"path", "/data/hf"}}}});
  EXPECT_NE(abs.find("spec.export.path: must be relative to the checkpoint volume"), std::string::npos) << abs;
  const std::string up = specError({{"export", {{"path", "a/../../etc"}}}});
  EXPECT_NE(up.find("spec.export.path: must stay inside the checkpoint volume - remove '..'"), std::string::npos) << up;
  EXPECT_NE(specError({{"export", {{"path", ".."}}}}).find("remove '..'"), std::string::npos);
  EXPECT_NE(specError({{"export", json::object()}}).find("spec.export.path: is required"), std::string::npos);
  EXPECT_NE(specError({{"export", {{"path", "./"}}}}).find("spec.export.path: must name a directory"), std::string::npos);
  // A name that merely contains dots is a name.
  EXPECT_EQ(specError({{"export", {{"path", "a..b/..c"}}}}), "");

  const std::string dtype = specError({{"export", {{"path", "hf"}, {"dtype", "fp16"}}}});
  EXPECT_NE(dtype.find("spec.export.dtype: must be one of f32, bf16, got 'fp16'"), std::string::npos) << dtype;
  const std::string weights = specError({{"export", {{"path", "hf"}, {"weights", "best"}}}});
  EXPECT_NE(weights.find("spec.export.weights: must be one of auto, outer, replica"), std::string::npos) << weights;
  const std::string ddp = specError({{"algorithm", {{"mode", "ddp"}}}, {"export", {{"path", "hf"}, {"weights", "outer"}}}});
  EXPECT_NE(ddp.find("spec.export.weights: outer - algorithm.mode ddp keeps no outer weights; use auto or replica"),
            std::string::npos)
      << ddp;
  EXPECT_EQ(specError({{"algorithm", {{"mode", "ddp"}}}, {"export", {{"path", "hf"}, {"weights", "replica"}}}}), "");
  const std::string noCkpt = specError({{"checkpoint", json::object()}});
  EXPECT_NE(noCkpt.find("spec.export: needs a checkpoint to read - set spec.checkpoint.pvc or spec.checkpoint.dir"),
            std::string::npos)
      << noCkpt;
}

TEST(ExportPod, OutputIsRelativeToTheCheckpointVolume) {
  // The claim's mount; the workers' checkpoints are in /checkpoints/j.
  EXPECT_EQ(exportOutDir(jobRef()), "/checkpoints/hf");
  EXPECT_EQ(exportOutDir(jobRef({{"export", {{"path", "./models//hf/"}}}})), "/checkpoints/models/hf");
  // checkpoint.dir on a volume of the job's own: that volume's mount.
  const json own = {{"checkpoint", {{"dir", "/mnt/store/runs/j"}}},
                    {"volumes", {{{"name", "store"}, {"hostPath", {{"path", "/srv"}}}}}},
                    {"volumeMounts", {{{"name", "store"}, {"mountPath", "/mnt/store"}}, {{"name", "x"}, {"mountPath", "/mnt"}}}}};
  EXPECT_EQ(exportOutDir(jobRef(own)), "/mnt/store/hf");
  // No volume holds it (a host directory): beside it.
  EXPECT_EQ(exportOutDir(jobRef({{"checkpoint", {{"dir", "/tmp/run/ckpt"}}}})), "/tmp/run/hf");
}

TEST(ExportPod, RefusesAPathThatHoldsTheCheckpoint) {
  // With the claim the checkpoints are in /checkpoints/<job name>.
  const std::string e = specError({{"export", {{"path", "j"}}}});
  EXPECT_NE(e.find("spec.export.path: 'j' resolves to /checkpoints/j, which holds the checkpoint (/checkpoints/j); "
                   "choose a directory beside it"),
            std::string::npos)
      << e;
  EXPECT_NE(specError({{"checkpoint", {{"pvc", "c"}, {"dir", "/checkpoints/a/b"}}}, {"export", {{"path", "a"}}}}), "");
  // Inside the checkpoint directory is allowed (edit-export refuses only the other way).
  EXPECT_EQ(specError({{"export", {{"path", "j/hf"}}}}), "");
}

TEST(ExportPod, RunsEditExportWithTheWorkersVolumeAndSecurity) {
  JobRef j = jobRef({{"export", {{"path", "hf"}, {"dtype", "bf16"}, {"weights", "outer"}}},
                     {"serviceAccountName", "trainer"}, {"imagePullPolicy", "IfNotPresent"},
                     {"nodeSelector", {{"pool", "gpu"}}}, {"gpusPerWorker", 1}, {"schedulerName", "volcano"},
                     {"resources", {{"limits", {{"memory", "8Gi"}, {"nvidia.com/gpu", "1"}}}}},
                     {"podTemplate", {{"metadata", {{"labels", {{"team", "a"}}}}}}}});
  json pod = desiredExportPod(j, 2);
  EXPECT_EQ(pod["metadata"]["name"], "j-export-2");
  EXPECT_EQ(pod["metadata"]["labels"][api::kLabelJob], "j");  // the pod informer selects on it
  EXPECT_EQ(pod["metadata"]["labels"][api::kLabelComponent], "export");
  EXPECT_EQ(pod["metadata"]["labels"][api::kLabelExportAttempt], "2");
  EXPECT_EQ(pod["metadata"]["labels"]["team"], "a");
  EXPECT_EQ(pod["metadata"]["ownerReferences"][0]["uid"], "u");
  EXPECT_TRUE(pod["metadata"]["ownerReferences"][0]["controller"].get<bool>());
  EXPECT_TRUE(isExportPod(pod));
  EXPECT_FALSE(isExportPod(desiredPod(j, 0, 0, {})));

  const json& spec = pod["spec"];
  EXPECT_EQ(spec["restartPolicy"], "Never");
  EXPECT_EQ(spec["serviceAccountName"], "trainer");
  EXPECT_EQ(spec["nodeSelector"]["pool"], "gpu");
  EXPECT_FALSE(spec.contains("schedulerName"));
  EXPECT_FALSE(spec.contains("hostname"));
  const json worker = desiredPod(j, 0, 0, {});
  EXPECT_EQ(spec["securityContext"], worker["spec"]["securityContext"]);
  EXPECT_EQ(spec["volumes"], worker["spec"]["volumes"]);
  const json& c = spec["containers"][0];
  EXPECT_EQ(c["image"], "img:1");
  EXPECT_EQ(c["imagePullPolicy"], "IfNotPresent");
  EXPECT_EQ(c["securityContext"], worker["spec"]["containers"][0]["securityContext"]);
  EXPECT_EQ(c["volumeMounts"], json::array({{{"name", "edit-checkpoint"}, {"mountPath", "/checkpoints"}}}));
  EXPECT_EQ(c["terminationMessagePolicy"], "FallbackToLogsOnError");
  EXPECT_EQ(c["command"], json::array({"edit-export", "--checkpoint", "/checkpoints/j", "--out", "/checkpoints/hf",
                                       "--dtype", "bf16", "--weights", "outer", "--force", "--report",
                                       "/dev/termination-log"}));
  EXPECT_EQ(c["resources"], json({{"limits", {{"memory", "8Gi"}}}}));  // no GPU for the export
}

TEST(ExportPolicy, WaitsForSuccess) {
  for (const char* phase : {"", "Created", "Running", "Restarting", "Suspended"}) {
    ExportPlan p = planExport(exportInput({{"phase", phase}}));
    EXPECT_FALSE(p.createAttempt) << phase;
    EXPECT_FALSE(js(p.status).contains("export")) << phase;
    EXPECT_FALSE(findCondition(js(p.status), "Exported")) << phase;
  }
  ExportPlan failed = planExport(exportInput({{"phase", "Failed"}}));
  EXPECT_FALSE(failed.createAttempt);
  EXPECT_EQ(condStatus(js(failed.status), "Exported"), "False");
  EXPECT_EQ(condReason(js(failed.status), "Exported"), "JobFailed");
}

TEST(ExportPolicy, StartsOnceAfterSuccessAndARestartCreatesTheSameName) {
  ExportPlan p = planExport(exportInput(succeededStatus()));
  ASSERT_TRUE(p.createAttempt);
  EXPECT_EQ(*p.createAttempt, 1);
  EXPECT_TRUE(p.inProgress);
  EXPECT_EQ(js(p.status)["phase"], "Succeeded");
  EXPECT_EQ(js(p.status)["export"]["attempts"], 1);
  EXPECT_EQ(condStatus(js(p.status), "Exported"), "Unknown");
  EXPECT_EQ(condReason(js(p.status), "Exported"), "Exporting");
  ASSERT_EQ(p.events.size(), 1u);

  // The operator stopped after storing the attempt: the next run creates the same pod
  // (a second create is a 409), never attempt 2, and records no second event.
  ExportPlan again = planExport(exportInput(js(p.status)));
  ASSERT_TRUE(again.createAttempt);
  EXPECT_EQ(*again.createAttempt, 1);
  EXPECT_EQ(js(again.status), js(p.status));
  EXPECT_TRUE(again.events.empty());

  for (const char* phase : {"Pending", "Running"}) {
    ExportPlan running = planExport(exportInput(js(p.status), {exportPod(1, phase)}));
    EXPECT_FALSE(running.createAttempt) << phase;
    EXPECT_EQ(js(running.status), js(p.status)) << phase;
    EXPECT_TRUE(running.inProgress);
  }
}

TEST(ExportPolicy, ExitZeroCopiesTheReport) {
  json st = js(planExport(exportInput(succeededStatus())).status);
  ExportPlan p = planExport(exportInput(st, {exportPod(1, "Succeeded", 0, kReport)}));
  EXPECT_FALSE(p.createAttempt);
  EXPECT_FALSE(p.inProgress);
  EXPECT_EQ(js(p.status)["phase"], "Succeeded");
  EXPECT_EQ(js(p.status)["export"], json({{"path", "/checkpoints/hf"}, {"step", 40}, {"weights", "outer"},
                                      {"dtype", "bf16"}, {"bytes", 1234567}, {"attempts", 1}}));
  EXPECT_EQ(condStatus(js(p.status), "Exported"), "True");
  const auto c = findCondition(js(p.status), "Exported");
  EXPECT_EQ(c->value("message", ""),
            "wrote /checkpoints/hf/model.safetensors and config.json from the checkpoint of step 40 "
            "(outer weights, bf16, 1234567 bytes)");
  ASSERT_EQ(p.events.size(), 1u);
  EXPECT_EQ(p.events[0].reason, "Exported");

  // Done: nothing more, whatever happens to the pod; cleanPodPolicy All removes it.
  ExportPlan later = planExport(exportInput(js(p.status), {}));
  EXPECT_FALSE(later.createAttempt);
  EXPECT_EQ(js(later.status), js(p.status));
  EXPECT_TRUE(later.events.empty());
  EXPECT_TRUE(planExport(exportInput(js(p.status), {exportPod(1, "Succeeded", 0)})).podsToDelete.empty());
  ExportPlan all = planExport(exportInput(js(p.status), {exportPod(1, "Succeeded", 0)}, {{"runPolicy", {{"cleanPodPolicy", "All"}}}}));
  EXPECT_EQ(all.podsToDelete, std::vector<std::string>{"j-export-1"});
}

TEST(ExportPolicy, RefusalIsFinal) {
  json st = js(planExport(exportInput(succeededStatus())).status);
  const std::string report =
      R"js({"error":"refused: /c/step-00000008: holds no outer weights (saved during warm-up or in ddp mode)","exit_code":2})js";
  ExportPlan p = planExport(exportInput(st, {exportPod(1, "Failed", 2, report)}));
  EXPECT_FALSE(p.createAttempt);
  EXPECT_FALSE(p.inProgress);
  EXPECT_EQ(js(p.status)["phase"], "Succeeded");
  EXPECT_EQ(condStatus(js(p.status), "Exported"), "False");
  EXPECT_EQ(condReason(js(p.status), "Exported"), "ExportRefused");
  EXPECT_EQ(findCondition(js(p.status), "Exported")->value("message", ""),
            "export pod j-export-1 exited with code 2: refused: /c/step-00000008: holds no outer weights (saved during "
            "warm-up or in ddp mode) (edit-export refused: not retried)");
  EXPECT_EQ(js(p.status)["export"]["attempts"], 1);
  EXPECT_FALSE(planExport(exportInput(js(p.status), {exportPod(1, "Failed", 2, report)})).createAttempt);
}

TEST(ExportPolicy, OtherFailuresRetryWithBackoffThenGiveUp) {
  json st = js(planExport(exportInput(succeededStatus())).status);
  // Exit 1 with no report: the log's tail (FallbackToLogsOnError) is the message.
  ExportPod crashed = exportPod(1, "Failed", 1, "edit-export: error: write /checkpoints/hf: No space left on device\n");
  ExportPlan wait = planExport(exportInput(st, {crashed}));
  EXPECT_FALSE(wait.createAttempt);
  EXPECT_TRUE(wait.inProgress);
  EXPECT_EQ(wait.requeueAfterSeconds, kExportBackoffSeconds);
  EXPECT_EQ(js(wait.status)["export"]["nextAttemptTime"], log::rfc3339(kNow + kExportBackoffSeconds));
  EXPECT_EQ(condStatus(js(wait.status), "Exported"), "Unknown");
  EXPECT_EQ(condReason(js(wait.status), "Exported"), "ExportRetrying");
  EXPECT_NE(findCondition(js(wait.status), "Exported")->value("message", "").find("No space left on device"), std::string::npos);

  // Later, but before it is due: the due time stays (no backoff restart per reconcile).
  ExportInput later = exportInput(js(wait.status), {crashed});
  later.now = kNow + 4;
  ExportPlan still = planExport(later);
  EXPECT_FALSE(still.createAttempt);
  EXPECT_EQ(still.requeueAfterSeconds, kExportBackoffSeconds - 4);
  EXPECT_EQ(js(still.status), js(wait.status));

  later.now = kNow + kExportBackoffSeconds;
  ExportPlan second = planExport(later);
  ASSERT_TRUE(second.createAttempt);
  EXPECT_EQ(*second.createAttempt, 2);
  EXPECT_EQ(js(second.status)["export"]["attempts"], 2);
  EXPECT_FALSE(js(second.status)["export"].contains("nextAttemptTime"));

  // Attempt 2 is evicted (no exit code): the wait doubles.
  ExportPod evicted = exportPod(2, "Failed");
  evicted.reason = "Evicted";
  ExportInput in2 = exportInput(js(second.status), {crashed, evicted});
  in2.now = kNow + 100;
  ExportPlan wait2 = planExport(in2);
  EXPECT_EQ(wait2.requeueAfterSeconds, 2 * kExportBackoffSeconds);
  in2.status = wait2.status;
  in2.now += 2 * kExportBackoffSeconds;
  ExportPlan third = planExport(in2);
  ASSERT_TRUE(third.createAttempt);
  EXPECT_EQ(*third.createAttempt, kExportAttempts);

  ExportInput in3 = exportInput(js(third.status), {crashed, evicted, exportPod(3, "Failed", 137)});
  ExportPlan out = planExport(in3);
  EXPECT_FALSE(out.createAttempt);
  EXPECT_FALSE(out.inProgress);
  EXPECT_EQ(js(out.status)["phase"], "Succeeded");
  EXPECT_EQ(condStatus(js(out.status), "Exported"), "False");
  EXPECT_EQ(condReason(js(out.status), "Exported"), "ExportFailed");
  EXPECT_EQ(findCondition(js(out.status), "Exported")->value("message", "").rfind("attempt 3 of 3 failed: export pod j-export-3 exited with code 137", 0), 0u);
}

TEST(ExportPolicy, TtlWaitsForTheExport) {
  PlanInput in = input({{"checkpoint", {{"dir", "/tmp/c"}}}, {"export", {{"path", "hf"}}},
                        {"runPolicy", {{"ttlSecondsAfterFinished", 0}}}},
                       {{"phase", "Succeeded"}, {"completionTime", log::rfc3339(kNow - 10)}});
  Plan plan = planReconcile(in);
  ASSERT_TRUE(plan.deleteJob);
  auto attempt = mergeExportPlan(plan, {in.spec->exportModel, "/tmp/hf", "Running", plan.status, 1, {}, kNow});
  EXPECT_EQ(attempt, 1);
  EXPECT_FALSE(plan.deleteJob);
  EXPECT_TRUE(plan.requeueAfterSeconds.has_value());
  EXPECT_EQ(js(plan.status)["phase"], "Succeeded");

  // Once exported, the TTL deletes the job.
  PlanInput done = in;
  done.status = js(plan.status);
  Plan p2 = planReconcile(done);
  ExportPod ok = exportPod(1, "Succeeded", 0, kReport);
  mergeExportPlan(p2, {in.spec->exportModel, "/tmp/hf", "Running", p2.status, 1, {ok}, kNow});
  EXPECT_TRUE(p2.deleteJob);
  EXPECT_EQ(condStatus(js(p2.status), "Exported"), "True");
}

TEST(ExportPolicy, ObservesAttemptAndReport) {
  JobRef j = jobRef();
  json pod = desiredExportPod(j, 3);
  pod["status"] = {{"phase", "Failed"},
                   {"containerStatuses",
                    {{{"name", "export"},
                      {"state", {{"terminated", {{"exitCode", 2}, {"reason", "Error"}, {"message", "{\"error\":\"x\"}"}}}}}}}}};
  ExportPod p = observeExportPod(pod);
  EXPECT_EQ(p.name, "j-export-3");
  EXPECT_EQ(p.attempt, 3);
  EXPECT_EQ(p.phase, "Failed");
  EXPECT_EQ(p.exitCode, 2);
  EXPECT_EQ(p.message, "{\"error\":\"x\"}");
}
