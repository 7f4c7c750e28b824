// The operator's spec table (spec_table.h): the fields, sections and cross-field rules,
// and how one field reads, checks and describes itself.
#include "api/spec_table.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "api/worker_env.h"
#include "modes.h"

namespace edit::op::api {
namespace {

using nlohmann::json;

constexpr int64_t kI32Max = std::numeric_limits<int32_t>::max();
constexpr int64_t kI32Min = std::numeric_limits<int32_t>::min();

FieldRule ints(int64_t lo, int64_t hi) {
  FieldRule r;
  r.ilo = lo;
  r.ihi = hi;
  return r;
}
FieldRule number(double lo, bool loOpen, double hi) {
  FieldRule r;
  r.dlo = lo;
  r.dhi = hi;
  r.loOpen = loOpen;
  return r;
}
FieldRule text(size_t minLength, size_t maxLength) {
  FieldRule r;
  r.minLength = minLength;
  r.maxLength = maxLength;
  return r;
}
FieldRule oneOf(std::vector<std::string> choices) {
  FieldRule r;
  r.choices = std::move(choices);
  return r;
}

std::string shown(const json& v) {
  std::string s = v.is_string() ? "'" + v.get<std::string>() + "'" : v.dump();
  return s.size() > 64 ? s.substr(0, 64) + "..." : s;
}

std::string fmt(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

// The export path's segments: no "..", and at least one that names a directory.
bool pathStaysInside(const std::string& path) {
  for (size_t start = 0; start <= path.size();) {
    size_t end = path.find('/', start);
    if (end == std::string::npos) end = path.size();
    if (path.compare(start, end - start, "..") == 0 && end - start == 2) return false;
    start = end + 1;
  }
  return true;
}
bool pathNamesADirectory(const std::string& path) {
  for (size_t start = 0; start <= path.size();) {
    size_t end = path.find('/', start);
    if (end == std::string::npos) end = path.size();
    const std::string seg = path.substr(start, end - start);
    if (!seg.empty() && seg != "." && seg != "..") return true;
    start = end + 1;
  }
  return false;
}

const json* member(const json& obj, const char* key) {
  if (!obj.is_object()) return nullptr;
  auto it = obj.find(key);
  return it == obj.end() || it->is_null() ? nullptr : &*it;
}

using K = FieldKind;

// Appends rows to the table; def: with a default (the member's initial value).
struct Rows {
  std::vector<SpecField>& f;
  void def(const char* p, K k, void* v, FieldRule r, const char* d) { f.push_back({p, k, v, r, d, true, false}); }
  void opt(const char* p, K k, void* v, FieldRule r, const char* d) { f.push_back({p, k, v, r, d, false, false}); }
};

void podRows(Rows& r, EDiTJobSpec& s) {
  r.def("replicas", K::I32, &s.replicas, ints(1, kMaxWorldSize),
      "Number of model replicas M: the size of each sync group. Replicas train independently and synchronize every "
      "syncInterval steps (or syncSeconds for A-EDiT). World size = replicas * shardsPerReplica. May change on a "
      "running job (kubectl scale ej/NAME --replicas=M): every mode but ddp scales in place at the next sync round - "
      "new replicas copy the state from their peers, leaving replicas stop at a round boundary; a ddp job applies it "
      "at its next (re)start. On a suspended or pending job it applies when the workers start. status.replicas says "
      "how many train now.");
  r.def("shardsPerReplica", K::I32, &s.shardsPerReplica, ints(1, 1024),
      "Number of shards N per replica: the ZeRO-3 shard group size. The pods of one replica talk every step and are "
      "packed together (same node where they fit); replicas are spread over nodes.");
  r.def("gpusPerWorker", K::I32, &s.gpusPerWorker, ints(0, 64),
      "GPUs per worker pod (nvidia.com/gpu). 0 runs on CPU with Gloo; more than 0 uses NCCL and needs a CUDA "
      "runtime image.");
  r.f.push_back({"image", K::Str, &s.image, text(1, 512),
               "Container image of the workers (the runtime image, which holds edit-train).", false, true});
  r.opt("imagePullPolicy", K::Str, &s.imagePullPolicy, oneOf({"Always", "IfNotPresent", "Never"}),
      "Pull policy of the worker image; unset uses the Kubernetes default.");
  r.opt("priorityClassName", K::Str, &s.priorityClassName, text(0, 253), "PriorityClass of the worker pods.");
  r.opt("schedulerName", K::Str, &s.schedulerName, text(0, 253),
      "Scheduler of the worker pods. \"volcano\" or the coscheduling plugin's scheduler makes the operator create a "
      "PodGroup (gang scheduling: all workers or none) when the operator is installed with gang scheduling.");
  r.opt("serviceAccountName", K::Str, &s.serviceAccountName, text(0, 253), "ServiceAccount of the worker pods.");
  r.def("masterPort", K::I32, &s.masterPort, ints(1, 65535), "TCP port of the rendezvous store on rank 0 (MASTER_PORT).");
  r.def("hangTimeoutSeconds", K::I64, &s.hangTimeoutSeconds, ints(0, 86400),
      "No training step on any worker for this long is a hang (condition Hung). Workers that fell silent while the "
      "others report (stopped, frozen) are killed and replaced in place, or the gang restarts from its newest "
      "checkpoint where that is not possible. While every worker still reports (a cut between replicas, a "
      "deadlock), the gang restarts only once the workers' own recovery had its time too: "
      "runtime.collectiveTimeoutSeconds plus, with in-place recovery, runtime.rendezvousTimeoutSeconds, plus 60 s. "
      "No report from any worker (the operator cut off or restarting) is the TelemetryLost condition, never a "
      "restart. 0 disables hang detection.");
  r.opt("terminationGracePeriodSeconds", K::OptI64, &s.terminationGracePeriodSeconds, ints(0, 86400),
      "Seconds a worker pod gets between SIGTERM (drain, preemption, suspend, a gang restart) and SIGKILL: the "
      "workers write a checkpoint on SIGTERM, and one killed before it finished resumes from the newest complete "
      "one (event ResumedFromOlderCheckpoint). Unset: 30 s plus the time a worker's share of the model, its "
      "optimizer and outer state takes at 50 MB/s (4 x 6 bytes per parameter / shardsPerReplica; 4 x 4 under "
      "ddp), e.g. 30 s for tiny.");
  // Volume claims in the worker sections: the operator mounts them, the workers see paths.
  r.opt("data.pvc", K::Str, &s.dataPvc, text(1, 253),
      "PersistentVolumeClaim holding the token files, mounted read-only at /data in every worker. Unset: the files "
      "must be in the image or a volume.");
  r.opt("checkpoint.pvc", K::Str, &s.checkpointPvc, text(1, 253),
      "PersistentVolumeClaim for checkpoints (ReadWriteMany), mounted at /checkpoints in every worker.");
}

void exportRows(Rows& r, ExportSpec& e) {
  r.f.push_back({"export.path", K::Str, &e.path, text(1, 1024),
               "Directory to write, relative to the checkpoint volume - the claim's mount (/checkpoints) with "
               "checkpoint.pvc, else the volumeMount that holds checkpoint.dir, else the directory that holds "
               "checkpoint.dir. Replaced when it exists; it must not hold the checkpoint.",
               false, true});
  r.def("export.dtype", K::Str, &e.dtype, oneOf({"f32", "bf16"}),
      "Tensor type of model.safetensors - f32 (exact) or bf16 (rounded to nearest even, half the size).");
  r.def("export.weights", K::Str, &e.weights, oneOf({"auto", "outer", "replica"}),
      "Which weights - auto (the outer, synchronized weights when the checkpoint has them, else replica 0's), outer "
      "(refused when the checkpoint has none - warm-up or ddp), or replica (replica 0's local weights). At the "
      "final checkpoint all three are the same model.");
}

void runPolicyRows(Rows& r, RunPolicy& rp) {
  r.def("runPolicy.backoffLimit", K::I32, &rp.backoffLimit, ints(0, 1000),
      "Gang restarts plus in-place replica recoveries allowed before the job is marked Failed. Those caused by a "
      "disruption (eviction, node drain, preemption) are not counted.");
  r.opt("runPolicy.activeDeadlineSeconds", K::OptI64, &rp.activeDeadlineSeconds,
      ints(1, std::numeric_limits<int64_t>::max()),
      "Seconds the job may run (from its start) before it is marked Failed.");
  r.opt("runPolicy.ttlSecondsAfterFinished", K::OptI64, &rp.ttlSecondsAfterFinished, ints(0, kI32Max),
      "Seconds after Succeeded or Failed before the job is deleted; unset keeps it.");
  r.opt("runPolicy.scheduleTimeoutSeconds", K::OptI64, &rp.scheduleTimeoutSeconds, ints(1, kI32Max),
      "Seconds a worker pod may wait to start (unschedulable, an image that cannot be pulled, a claim that does "
      "not bind, a missing Secret or ConfigMap key, a quota, a scheduling gate) before the job is marked Failed "
      "with the pod's reason; counted from the pod's creation. Unset waits for ever (the PodsReady condition and "
      "a Warning event still name the pod and why).");
  r.def("runPolicy.cleanPodPolicy", K::Str, &rp.cleanPodPolicy, oneOf({"All", "Running", "None"}),
      "Pods deleted when the job finishes - All, only those still Running, or None (keep every pod for "
      "inspection).");
  r.def("runPolicy.suspend", K::Bool, &rp.suspend, {},
      "true deletes the pods (after a checkpoint request) and keeps the job Suspended; false resumes it from the "
      "newest checkpoint.");
  r.def("runPolicy.replicaRecovery", K::Str, &rp.replicaRecovery, oneOf({"InPlace", "GangRestart"}),
      "What a failed worker costs. InPlace recreates only the failed pods, which rejoin the running job while the "
      "others wait (falls back to a gang restart for mode ddp and for workers that exit 75 or 143). GangRestart "
      "restarts every pod from the newest checkpoint. Both count against backoffLimit.");
}

void stragglerRows(Rows& r, StragglerPolicy& sp) {
  // Over 1: at 1 every rank slower than the median would be a straggler.
  r.def("stragglerPolicy.threshold", K::F64, &sp.threshold, number(1, true, 100),
      "A worker whose mean step time over the window is more than this times the job's median is a straggler (its "
      "straggler score).");
  r.def("stragglerPolicy.windowSteps", K::I32, &sp.windowSteps, ints(1, 10000), "Steps over which step times are averaged.");
  r.def("stragglerPolicy.action", K::Str, &sp.action, oneOf({"Report", "Replace"}),
      "Report only sets the StragglerDetected condition, events and metrics; Replace also recreates the worker away "
      "from its node (its replica rejoins at the next sync).");
  // No schema default: it follows windowSteps (parseSpec).
  r.opt("stragglerPolicy.minReports", K::I32, &sp.minReports, ints(1, 10000),
      "Reports a worker must have sent inside the window before it is scored (default 5, or windowSteps when that "
      "is smaller).");
}

}  // namespace

std::vector<SpecField> specFields(EDiTJobSpec& s) {
  std::vector<SpecField> f;
  Rows r{f};
  podRows(r, s);
  if (s.exportModel) exportRows(r, *s.exportModel);
  runPolicyRows(r, s.runPolicy);
  stragglerRows(r, s.stragglerPolicy);
  return f;
}

const std::vector<SpecSection>& specSections() {
  static const std::vector<SpecSection> k = {
      {"runPolicy", "Restarts, deadlines and clean-up (same meaning as in Kubeflow's jobs).", true},
      {"stragglerPolicy", "How slow workers are detected and handled.", true},
      {"export",
       "Export the trained model once the job has Succeeded - one pod (the job's image, the checkpoint volume mounted "
       "as in the workers) runs edit-export on the newest checkpoint and writes a Hugging Face Llama directory "
       "(model.safetensors, config.json). The result is in status.export and the Exported condition; the job stays "
       "Succeeded. docs/export.md.",
       false},
  };
  return k;
}

namespace {
// The CEL list of the reserved worker variables (api/worker_env.h).
const std::string& reservedEnvList() {
  static const std::string list = [] {
    std::string l;
    for (const auto& v : kReservedWorkerEnv) l += std::string(l.empty() ? "" : ", ") + "'" + v.name + "'";
    return "[" + l + "]";
  }();
  return list;
}
const std::string& reservedEnvRule() {
  static const std::string rule = "!has(self.env) || self.env.all(e, !(e.name in " + reservedEnvList() + "))";
  return rule;
}
const std::string& reservedEnvMessage() {
  static const std::string msg = "'spec.env: ' + self.env.filter(e, e.name in " + reservedEnvList() +
                                 ")[0].name + ' is set by the operator (RANK, WORLD_SIZE, MASTER_ADDR, EDIT_* and "
                                 "the rest of a worker identity); remove it from spec.env'";
  return msg;
}
}  // namespace

std::string reservedEnvProblem(const std::string& name) {
  const WorkerEnvVar* v = reservedWorkerEnv(name);
  return v ? name + " is set by the operator (" + v->what + "); remove it from spec.env" : "";
}

const std::vector<SpecRule>& specRules() {
  using S = const EDiTJobSpec&;
  static const std::vector<SpecRule> k = {
      // Checked by parseSpec too, naming the entry (spec.env[i].name).
      {"", "spec.env", reservedEnvRule().c_str(),
       "spec.env sets a variable the operator sets (RANK, WORLD_SIZE, MASTER_ADDR, EDIT_*, ...); remove it",
       nullptr, nullptr, nullptr, reservedEnvMessage().c_str()},
      {"", "spec.replicas", "self.replicas * self.shardsPerReplica <= 4096",
       "replicas * shardsPerReplica (the world size) must be at most 4096",
       [](S s) { return s.worldSize() <= kMaxWorldSize; }},
      {"", "spec.runtime.backend",
       "!has(self.runtime) || !has(self.runtime.backend) || self.runtime.backend != 'nccl' || "
       "(has(self.gpusPerWorker) && self.gpusPerWorker > 0)",
       "spec.runtime.backend: nccl needs GPUs - set spec.gpusPerWorker above 0, or backend auto or gloo",
       [](S s) {
         const json* b = member(s.runtime, "backend");
         return !(b && b->is_string() && *b == "nccl") || s.gpusPerWorker > 0;
       }},
      {"", "spec.export",
       "!has(self.export) || has(self.checkpoint.pvc) || (has(self.checkpoint.dir) && self.checkpoint.dir != '')",
       "spec.export needs a checkpoint to read - set spec.checkpoint.pvc or spec.checkpoint.dir",
       [](S s) {
         const json* dir = member(s.checkpoint, "dir");
         return !s.exportModel || !s.checkpointPvc.empty() ||
                (dir && dir->is_string() && !dir->get<std::string>().empty());
       }},
      // ddp synchronizes every step and keeps no outer weights: edit-export would refuse.
      {"", "spec.export.weights",
       "!has(self.export) || !has(self.export.weights) || self.export.weights != 'outer' || "
       "!has(self.algorithm.mode) || self.algorithm.mode != 'ddp'",
       "spec.export.weights: outer - algorithm.mode ddp keeps no outer weights; use auto or replica",
       [](S s) { return !s.exportModel || s.exportModel->weights != "outer" || s.mode() != "ddp"; }},
      {"runPolicy", "spec.runPolicy.replicaRecovery",
       "has(self.replicaRecovery) == has(oldSelf.replicaRecovery) && (!has(self.replicaRecovery) || "
       "self.replicaRecovery == oldSelf.replicaRecovery)",
       "spec.runPolicy.replicaRecovery cannot change once the job exists (the workers' config is made from it); "
       "delete and recreate the job to change it",
       nullptr, ".replicaRecovery", "FieldValueForbidden"},
      {"stragglerPolicy", "spec.stragglerPolicy.minReports", "!has(self.minReports) || self.minReports <= self.windowSteps",
       "minReports must not exceed windowSteps",
       [](S s) { return s.stragglerPolicy.minReports <= s.stragglerPolicy.windowSteps; }},
      {"export", "spec.export.path", "!self.path.startsWith('/')",
       "spec.export.path must be relative to the checkpoint volume (e.g. export), not absolute",
       [](S s) { return !s.exportModel || s.exportModel->path.empty() || s.exportModel->path[0] != '/'; },
       ".path"},
      {"export", "spec.export.path", "!self.path.matches('(^|/)[.][.](/|$)')",
       "spec.export.path must stay inside the checkpoint volume - remove '..'",
       [](S s) { return !s.exportModel || pathStaysInside(s.exportModel->path); }, ".path"},
      {"export", "spec.export.path", nullptr,
       "spec.export.path must name a directory inside the checkpoint volume (e.g. export)",
       [](S s) { return !s.exportModel || pathNamesADirectory(s.exportModel->path); }},
  };
  return k;
}

std::string SpecRule::problem() const {
  const std::string m = message, f = field;
  for (const std::string& prefix : {f + ": ", f + " "})
    if (m.rfind(prefix, 0) == 0) return m.substr(prefix.size());
  return m;
}

json SpecRule::crdRule() const {
  json r = {{"rule", cel}};
  if (fieldPath) r["fieldPath"] = fieldPath;
  if (reason) r["reason"] = reason;
  r["message"] = message;
  if (messageExpression) r["messageExpression"] = messageExpression;
  return r;
}

std::string SpecField::describe() const {
  switch (kind) {
    case FieldKind::Bool: return "true or false";
    case FieldKind::I32:
    case FieldKind::I64:
    case FieldKind::OptI64:
      if (rule.ihi == std::numeric_limits<int64_t>::max() || rule.ihi == kI32Max)
        return "an integer >= " + std::to_string(rule.ilo);
      return "an integer in [" + std::to_string(rule.ilo) + ", " + std::to_string(rule.ihi) + "]";
    case FieldKind::F64:
      return std::string("a number in ") + (rule.loOpen ? "(" : "[") + fmt(rule.dlo) + ", " + fmt(rule.dhi) + "]";
    case FieldKind::Str:
      if (!rule.choices.empty()) {
        std::string list;
        for (const auto& c : rule.choices) list += (list.empty() ? "" : ", ") + c;
        return "one of " + list;
      }
      return std::string(rule.minLength ? "a non-empty" : "a") + " string of at most " +
             std::to_string(rule.maxLength) + " characters";
  }
  return "";
}

bool SpecField::isSet() const {
  return kind != FieldKind::OptI64 || static_cast<const std::optional<long>*>(ptr)->has_value();
}

void SpecField::read(const json& v) const {
  auto bad = [&](const std::string& got) { throw SpecError("spec." + path, "must be " + describe() + ", got " + got); };
  switch (kind) {
    case FieldKind::Bool:
      if (!v.is_boolean()) bad(shown(v));
      *static_cast<bool*>(ptr) = v.get<bool>();
      return;
    case FieldKind::Str: {
      if (!v.is_string()) bad(shown(v));
      const std::string s = v.get<std::string>();
      if (!strAllowed(s)) bad(rule.choices.empty() ? std::to_string(s.size()) + " characters" : shown(v));
      *static_cast<std::string*>(ptr) = s;
      return;
    }
    case FieldKind::F64: {
      if (!v.is_number()) bad(shown(v));
      const double d = v.get<double>();
      if (!numberAllowed(d)) bad(shown(v));
      *static_cast<double*>(ptr) = d;
      return;
    }
    case FieldKind::I32:
    case FieldKind::I64:
    case FieldKind::OptI64: {
      // The range is checked before any cast, so that huge or fractional values cannot
      // wrap (4294967297 replicas is not 1 replica).
      int64_t i = 0;
      if (v.is_number_unsigned()) {
        const auto u = v.get<uint64_t>();
        if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) bad(shown(v));
        i = static_cast<int64_t>(u);
      } else if (v.is_number_integer()) {
        i = v.get<int64_t>();
      } else if (v.is_number_float()) {
        const double d = v.get<double>();
        if (!(d >= -9.2e18 && d <= 9.2e18) || d != std::floor(d)) bad(shown(v));
        i = static_cast<int64_t>(d);
      } else {
        bad(shown(v));
      }
      if (!intAllowed(i)) bad(shown(v));
      if (kind == FieldKind::I32) *static_cast<int*>(ptr) = static_cast<int>(i);
      else if (kind == FieldKind::I64) *static_cast<long*>(ptr) = static_cast<long>(i);
      else *static_cast<std::optional<long>*>(ptr) = static_cast<long>(i);
      return;
    }
  }
}

json SpecField::value() const {
  switch (kind) {
    case FieldKind::Bool: return *static_cast<const bool*>(ptr);
    case FieldKind::Str: return *static_cast<const std::string*>(ptr);
    case FieldKind::F64: return *static_cast<const double*>(ptr);
    case FieldKind::I32: return *static_cast<const int*>(ptr);
    case FieldKind::I64: return *static_cast<const long*>(ptr);
    case FieldKind::OptI64: {
      const auto& o = *static_cast<const std::optional<long>*>(ptr);
      return o ? json(*o) : json();
    }
  }
  return json();
}

bool SpecField::allowed() const {
  switch (kind) {
    case FieldKind::Bool: return true;
    case FieldKind::Str: {
      const auto& s = *static_cast<const std::string*>(ptr);
      if (s.empty() && !required && !hasDefault) return true;  // left unset
      return strAllowed(s);
    }
    case FieldKind::F64: return numberAllowed(*static_cast<const double*>(ptr));
    case FieldKind::I32: return intAllowed(*static_cast<const int*>(ptr));
    case FieldKind::I64: return intAllowed(*static_cast<const long*>(ptr));
    case FieldKind::OptI64: {
      const auto& o = *static_cast<const std::optional<long>*>(ptr);
      return !o || intAllowed(*o);
    }
  }
  return false;
}

bool SpecField::strAllowed(const std::string& s) const {
  if (!rule.choices.empty()) return std::find(rule.choices.begin(), rule.choices.end(), s) != rule.choices.end();
  return s.size() >= rule.minLength && (!rule.maxLength || s.size() <= rule.maxLength);
}
bool SpecField::numberAllowed(double d) const {
  return std::isfinite(d) && (rule.loOpen ? d > rule.dlo : d >= rule.dlo) && d <= rule.dhi;
}
bool SpecField::intAllowed(int64_t i) const { return i >= rule.ilo && i <= rule.ihi; }

json SpecField::schema() const {
  json n = json::object();
  switch (kind) {
    case FieldKind::Bool: n["type"] = "boolean"; break;
    case FieldKind::Str:
      n["type"] = "string";
      if (rule.minLength) n["minLength"] = rule.minLength;
      if (rule.maxLength) n["maxLength"] = rule.maxLength;
      if (!rule.choices.empty()) n["enum"] = rule.choices;
      break;
    case FieldKind::F64:
      n["type"] = "number";
      if (std::isfinite(rule.dlo)) n["minimum"] = rule.dlo;
      if (rule.loOpen) n["exclusiveMinimum"] = true;
      if (std::isfinite(rule.dhi)) n["maximum"] = rule.dhi;
      break;
    case FieldKind::I32:
    case FieldKind::I64:
    case FieldKind::OptI64: {
      // int32 where every allowed value fits; bounds that are the format's own go unsaid.
      const bool i32 = rule.ilo >= kI32Min && rule.ihi <= kI32Max;
      n["type"] = "integer";
      n["format"] = i32 ? "int32" : "int64";
      if (rule.ilo > (i32 ? kI32Min : std::numeric_limits<int64_t>::min())) n["minimum"] = rule.ilo;
      if (rule.ihi < (i32 ? kI32Max : std::numeric_limits<int64_t>::max())) n["maximum"] = rule.ihi;
      break;
    }
  }
  if (hasDefault) n["default"] = value();
  n["description"] = doc;
  return n;
}

}  // namespace edit::op::api
