#include "controller/export_policy.h"

#include <algorithm>

#include "controller/export_pod.h"
#include "util/log.h"

namespace edit::op::controller {
namespace {

using api::CondStatus;
namespace reason = api::reason;

constexpr size_t kMaxMessage = 1024;

std::string cut(const std::string& s) { return s.size() > kMaxMessage ? s.substr(0, kMaxMessage) + "..." : s; }

// The termination message as edit-export's report, or null (a log tail, or nothing).
json report(const ExportPod& p) {
  json j = json::parse(p.message, nullptr, false);
  return j.is_object() ? j : json();
}

// Why an attempt failed, in edit-export's words where there are any.
std::string failure(const ExportPod& p) {
  std::string s = "export pod " + p.name;
  if (p.phase != podphase::Failed) s += p.phase.empty() ? " is gone" : " is being deleted";
  else if (p.exitCode) s += " exited with code " + std::to_string(*p.exitCode);
  else s += " failed";
  if (!p.reason.empty() && p.reason != "Error") s += " (" + p.reason + ")";
  const json r = report(p);
  std::string why = r.is_object() && r.contains("error") && r["error"].is_string() ? r["error"].get<std::string>() : p.message;
  while (!why.empty() && (why.back() == '\n' || why.back() == ' ')) why.pop_back();
  if (!why.empty()) s += ": " + why;
  return cut(s);
}

long asLong(const json& v) {
  if (v.is_number_integer()) return v.get<long>();
  if (v.is_string()) {
    try {
      return std::stol(v.get<std::string>());
    } catch (...) {
    }
  }
  return 0;
}

// status.export and the Exported condition after a successful attempt, from edit-export's report.
std::string recordSuccess(const ExportPod& p, const std::string& outDir, const std::string& specDtype,
                          api::ExportStatus& ex) {
  const json r = report(p);
  api::ExportStatus out;
  out.attempts = ex.attempts.value_or(0);
  out.path = r.is_object() && r.contains("out") && r["out"].is_string() ? r["out"].get<std::string>() : outDir;
  std::string msg = "exported to " + *out.path;
  if (r.is_object()) {
    if (r.contains("step")) out.step = asLong(r["step"]);
    if (r.contains("weights") && r["weights"].is_string()) out.weights = r["weights"].get<std::string>();
    if (r.contains("dtype") && r["dtype"].is_string()) out.dtype = r["dtype"].get<std::string>();
    if (r.contains("bytes")) out.bytes = asLong(r["bytes"]);
    msg = "wrote " + r.value("model", *out.path + "/model.safetensors") + " and config.json";
    if (out.step) msg += " from the checkpoint of step " + std::to_string(*out.step);
    msg += " (" + out.weights.value_or("?") + " weights, " + out.dtype.value_or(specDtype) + ", " +
           std::to_string(out.bytes.value_or(0)) + " bytes)";
  } else {
    msg += " (" + p.name + " left no report)";
  }
  ex = out;
  return msg;
}

class ExportPlanner {
 public:
  explicit ExportPlanner(const ExportInput& in) : in_(in) {
    out_.status = in.status;
    now_ = log::rfc3339(in.now);
    ex_ = out_.status.exportStatus.value_or(api::ExportStatus{});
  }

  ExportPlan run() {
    if (!in_.spec) return out_;
    const api::Phase phase = out_.status.phase;
    const api::Condition* c = out_.status.condition(api::condition::Exported);
    if (phase == api::Phase::Failed && !c) {
      cond(CondStatus::False, reason::JobFailed, "the job failed; spec.export runs only after it succeeds");
      return out_;
    }
    if (phase != api::Phase::Succeeded) return out_;
    if (c && c->status != CondStatus::Unknown) {
      if (in_.cleanPodPolicy == "All")
        for (const auto& p : in_.pods)
          if (!p.deleting) out_.podsToDelete.push_back(p.name);
      return out_;
    }
    out_.inProgress = true;
    const int attempts = ex_.attempts.value_or(0);
    if (attempts < 1) return start(1);

    const ExportPod* cur = nullptr;
    for (const auto& p : in_.pods)
      if (p.attempt == attempts && (!cur || cur->deleting)) cur = &p;
    if (!cur) {
      // Not created yet (the operator stopped after storing the attempt) or deleted by
      // someone: create it (again). The name makes a second create a no-op.
      out_.createAttempt = attempts;
      return out_;
    }
    if (cur->phase == podphase::Succeeded) {
      finish(CondStatus::True, reason::Exported, recordSuccess(*cur, in_.outDir, in_.spec->dtype, ex_), api::kNormal);
      return out_;
    }
    if (cur->phase != podphase::Failed) {
      if (cur->deleting) out_.requeueAfterSeconds = 1;  // gone soon: then it is recreated
      return out_;
    }
    const std::string why = failure(*cur);
    if (cur->exitCode && *cur->exitCode == 2) {
      finish(CondStatus::False, reason::ExportRefused, why + " (edit-export refused: not retried)", api::kWarning);
      return out_;
    }
    if (attempts >= kExportAttempts) {
      finish(CondStatus::False, reason::ExportFailed,
             "attempt " + std::to_string(attempts) + " of " + std::to_string(kExportAttempts) + " failed: " + why,
             api::kWarning);
      return out_;
    }
    return retry(attempts, why);
  }

 private:
  void cond(CondStatus s, const char* why, const std::string& msg) {
    out_.status.setCondition(api::condition::Exported, s, why, msg, now_, in_.generation);
  }
  void store() { out_.status.exportStatus = ex_; }

  ExportPlan start(int attempt) {
    ex_.attempts = attempt;
    ex_.nextAttemptTime.reset();
    store();
    const std::string msg = "exporting the checkpoint to " + in_.outDir + " (attempt " + std::to_string(attempt) +
                            " of " + std::to_string(kExportAttempts) + ")";
    cond(CondStatus::Unknown, reason::Exporting, msg);
    out_.events.push_back({api::kNormal, reason::Exporting, msg});
    out_.createAttempt = attempt;
    return out_;
  }

  // The first look at a failed attempt stores when the next one is due, so that the
  // backoff survives operator restarts and does not restart at every reconcile.
  ExportPlan retry(int attempts, const std::string& why) {
    std::time_t due = log::parseRfc3339(ex_.nextAttemptTime.value_or(""));
    if (!due) {
      due = in_.now + kExportBackoffSeconds * (1L << (attempts - 1));
      ex_.nextAttemptTime = log::rfc3339(due);
      store();
      const std::string msg = "attempt " + std::to_string(attempts) + " of " + std::to_string(kExportAttempts) +
                              " failed: " + why + "; retrying at " + log::rfc3339(due);
      cond(CondStatus::Unknown, reason::ExportRetrying, msg);
      out_.events.push_back({api::kWarning, reason::ExportRetrying, msg});
    }
    if (in_.now < due) {
      out_.requeueAfterSeconds = static_cast<long>(due - in_.now);
      return out_;
    }
    return start(attempts + 1);
  }

  void finish(CondStatus s, const char* why, const std::string& msg, const char* eventType) {
    ex_.nextAttemptTime.reset();
    store();
    cond(s, why, msg);
    out_.events.push_back({eventType, why, msg});
    out_.inProgress = false;
  }

  const ExportInput& in_;
  ExportPlan out_;
  api::ExportStatus ex_;  // status.export
  std::string now_;
};

}  // namespace

bool isExportPod(const json& pod) {
  const json labels = pod.value("metadata", json::object()).value("labels", json::object());
  return labels.value(api::kLabelComponent, "") == api::kComponentExport;
}

ExportPod observeExportPod(const json& pod) {
  const ObservedPod o = observePod(pod);
  ExportPod p;
  p.name = o.name;
  p.uid = o.uid;
  p.phase = o.phase;
  p.deleting = o.deleting;
  p.exitCode = o.exitCode;
  p.reason = o.reason;
  p.message = o.message;
  const json labels = pod.value("metadata", json::object()).value("labels", json::object());
  p.attempt = static_cast<int>(asLong(labels.value(api::kLabelExportAttempt, json("0"))));
  return p;
}

ExportPlan planExport(const ExportInput& in) { return ExportPlanner(in).run(); }

std::optional<int> mergeExportPlan(Plan& plan, const ExportInput& in) {
  ExportPlan e = planExport(in);
  plan.status = e.status;
  plan.events.insert(plan.events.end(), e.events.begin(), e.events.end());
  plan.podsToDelete.insert(plan.podsToDelete.end(), e.podsToDelete.begin(), e.podsToDelete.end());
  if (e.requeueAfterSeconds && (!plan.requeueAfterSeconds || *e.requeueAfterSeconds < *plan.requeueAfterSeconds))
    plan.requeueAfterSeconds = e.requeueAfterSeconds;
  // ttlSecondsAfterFinished waits for the export: deleting the job would take its pod.
  if (e.inProgress && plan.deleteJob) {
    plan.deleteJob = false;
    if (!plan.requeueAfterSeconds) plan.requeueAfterSeconds = 5;
  }
  return e.createAttempt;
}

}  // namespace edit::op::controller
