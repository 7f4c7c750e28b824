#include "api/status.h"

#include <algorithm>

namespace edit::op::api {
namespace {

using nlohmann::json;

const json* get(const json& o, const char* key) {
  if (!o.is_object()) return nullptr;
  auto it = o.find(key);
  return it == o.end() || it->is_null() ? nullptr : &*it;
}

template <class T>
std::optional<T> number(const json& o, const char* key) {
  const json* v = get(o, key);
  if (!v || !v->is_number()) return std::nullopt;
  if (std::is_integral_v<T> && !v->is_number_integer()) return std::nullopt;
  return v->get<T>();
}

std::optional<std::string> text(const json& o, const char* key) {
  const json* v = get(o, key);
  return v && v->is_string() ? std::optional<std::string>(v->get<std::string>()) : std::nullopt;
}

template <class T>
void put(json& o, const char* key, const std::optional<T>& v) {
  if (v) o[key] = *v;
}

Condition conditionFromJson(const json& c) {
  Condition out;
  out.type = text(c, "type").value_or("");
  const std::string s = text(c, "status").value_or("");
  out.status = s == "True" ? CondStatus::True : s == "False" ? CondStatus::False : CondStatus::Unknown;
  out.reason = text(c, "reason").value_or("");
  out.message = text(c, "message").value_or("");
  out.lastTransitionTime = text(c, "lastTransitionTime").value_or("");
  out.observedGeneration = number<long>(c, "observedGeneration").value_or(0);
  return out;
}

json conditionToJson(const Condition& c) {
  return {{"type", c.type},       {"status", condStatusName(c.status)},      {"reason", c.reason},
          {"message", c.message}, {"lastTransitionTime", c.lastTransitionTime}, {"observedGeneration", c.observedGeneration}};
}

std::optional<ScalingStatus> scalingFromJson(const json& j) {
  const json* o = get(j, "scaling");
  if (!o || !o->is_object()) return std::nullopt;
  ScalingStatus s;
  s.from = number<int>(*o, "from").value_or(0);
  s.to = number<int>(*o, "to").value_or(0);
  s.startTime = text(*o, "startTime").value_or("");
  s.requestTime = text(*o, "requestTime");
  return s;
}

std::optional<LastScale> lastScaleFromJson(const json& j) {
  const json* o = get(j, "lastScale");
  if (!o || !o->is_object()) return std::nullopt;
  LastScale s;
  s.from = number<int>(*o, "from").value_or(0);
  s.to = number<int>(*o, "to").value_or(0);
  s.result = text(*o, "result").value_or("");
  s.seconds = number<double>(*o, "seconds").value_or(0);
  s.message = text(*o, "message").value_or("");
  s.generation = number<long>(*o, "generation").value_or(0);
  return s;
}

std::optional<LinkStatus> linkFromJson(const json& j) {
  const json* o = get(j, "link");
  if (!o || !o->is_object()) return std::nullopt;
  LinkStatus l;
  l.rank = number<int>(*o, "rank").value_or(0);
  l.blockedShare = number<double>(*o, "blockedShare").value_or(0);
  l.roundSeconds = number<double>(*o, "roundSeconds").value_or(0);
  l.stepSeconds = number<double>(*o, "stepSeconds").value_or(0);
  l.rounds = number<long>(*o, "rounds").value_or(0);
  l.localSteps = number<long>(*o, "localSteps").value_or(0);
  return l;
}

std::optional<WorkerCounts> workersFromJson(const json& j) {
  const json* o = get(j, "workers");
  if (!o || !o->is_object()) return std::nullopt;
  WorkerCounts w;
  w.total = number<int>(*o, "total").value_or(0);
  w.pending = number<int>(*o, "pending").value_or(0);
  w.running = number<int>(*o, "running").value_or(0);
  w.succeeded = number<int>(*o, "succeeded").value_or(0);
  w.failed = number<int>(*o, "failed").value_or(0);
  return w;
}

// A record without ranks has nothing to resume.
std::optional<RecoveryStatus> recoveryFromJson(const json& j) {
  const json* o = get(j, "recovery");
  if (!o || !o->is_object()) return std::nullopt;
  RecoveryStatus r;
  for (const auto& v : o->value("ranks", json::array()))
    if (v.is_number_integer()) r.ranks.push_back(v.get<int>());
  for (const auto& v : o->value("failedPodUIDs", json::array()))
    if (v.is_string()) r.failedPodUIDs.push_back(v.get<std::string>());
  r.startTime = text(*o, "startTime").value_or("");
  if (r.ranks.empty()) return std::nullopt;
  return r;
}

std::optional<Progress> progressFromJson(const json& j) {
  const json* o = get(j, "progress");
  if (!o || !o->is_object()) return std::nullopt;
  Progress p;
  p.step = number<long>(*o, "step").value_or(0);
  p.totalSteps = number<long>(*o, "totalSteps").value_or(0);
  p.tokens = number<long>(*o, "tokens").value_or(0);
  p.loss = number<double>(*o, "loss").value_or(0);
  p.tokensPerSecond = number<double>(*o, "tokensPerSecond").value_or(0);
  p.syncRounds = number<long>(*o, "syncRounds").value_or(0);
  p.anomalies = number<long>(*o, "anomalies").value_or(0);
  p.etaSeconds = number<double>(*o, "etaSeconds");
  return p;
}

json progressToJson(const Progress& p) {
  json j = {{"step", p.step},
            {"totalSteps", p.totalSteps},
            {"tokens", p.tokens},
            {"loss", p.loss},
            {"tokensPerSecond", p.tokensPerSecond},
            {"syncRounds", p.syncRounds},
            {"anomalies", p.anomalies}};
  put(j, "etaSeconds", p.etaSeconds);
  return j;
}

std::optional<std::vector<StragglerStatus>> stragglersFromJson(const json& j) {
  const json* o = get(j, "stragglers");
  if (!o || !o->is_array()) return std::nullopt;
  std::vector<StragglerStatus> out;
  for (const auto& s : *o) {
    if (!s.is_object()) continue;
    out.push_back({number<int>(s, "rank").value_or(-1), text(s, "pod").value_or(""), text(s, "node").value_or(""),
                   number<double>(s, "score").value_or(0)});
  }
  return out;
}

std::vector<AvoidNode> avoidNodesFromJson(const json& j) {
  std::vector<AvoidNode> out;
  const json* o = get(j, "avoidNodes");
  if (!o || !o->is_array()) return out;
  for (const auto& e : *o) {
    auto rank = number<int>(e, "rank");
    auto node = text(e, "node");
    if (rank && node && !node->empty()) out.push_back({*rank, *node});
  }
  return out;
}

std::optional<ExportStatus> exportFromJson(const json& j) {
  const json* o = get(j, "export");
  if (!o || !o->is_object()) return std::nullopt;
  ExportStatus e;
  e.attempts = number<int>(*o, "attempts");
  e.nextAttemptTime = text(*o, "nextAttemptTime");
  e.path = text(*o, "path");
  e.weights = text(*o, "weights");
  e.dtype = text(*o, "dtype");
  e.step = number<long>(*o, "step");
  e.bytes = number<long>(*o, "bytes");
  return e;
}

json exportToJson(const ExportStatus& e) {
  json j = json::object();
  put(j, "attempts", e.attempts);
  put(j, "nextAttemptTime", e.nextAttemptTime);
  put(j, "path", e.path);
  put(j, "weights", e.weights);
  put(j, "dtype", e.dtype);
  put(j, "step", e.step);
  put(j, "bytes", e.bytes);
  return j;
}

}  // namespace

const char* phaseName(Phase p) {
  switch (p) {
    case Phase::Unset: return "";
    case Phase::Pending: return "Pending";
    case Phase::Created: return "Created";
    case Phase::Running: return "Running";
    case Phase::Restarting: return "Restarting";
    case Phase::Succeeded: return "Succeeded";
    case Phase::Failed: return "Failed";
    case Phase::Suspended: return "Suspended";
  }
  return "";
}

Phase parsePhase(const std::string& name) {
  for (Phase p : kPhases)
    if (name == phaseName(p)) return p;
  return Phase::Unset;
}

const char* condStatusName(CondStatus s) {
  switch (s) {
    case CondStatus::True: return "True";
    case CondStatus::False: return "False";
    case CondStatus::Unknown: return "Unknown";
  }
  return "Unknown";
}

bool RecoveryStatus::covers(int rank) const { return std::find(ranks.begin(), ranks.end(), rank) != ranks.end(); }

bool RecoveryStatus::hasFailedPod(const std::string& uid) const {
  return !uid.empty() && std::find(failedPodUIDs.begin(), failedPodUIDs.end(), uid) != failedPodUIDs.end();
}

void RecoveryStatus::add(int rank, const std::string& failedPodUid) {
  if (!covers(rank)) {
    ranks.push_back(rank);
    std::sort(ranks.begin(), ranks.end());
  }
  if (!failedPodUid.empty() && !hasFailedPod(failedPodUid)) failedPodUIDs.push_back(failedPodUid);
}

std::string RecoveryStatus::rankList() const {
  std::string s;
  for (int r : ranks) s += (s.empty() ? "" : ", ") + std::to_string(r);
  return s;
}

EDiTJobStatus EDiTJobStatus::fromJson(const json& j) {
  EDiTJobStatus s;
  s.phase = parsePhase(text(j, "phase").value_or(""));
  if (const json* c = get(j, "conditions"); c && c->is_array())
    for (const auto& e : *c)
      if (e.is_object() && text(e, "type")) s.conditions.push_back(conditionFromJson(e));
  s.observedGeneration = number<long>(j, "observedGeneration");
  s.replicas = number<int>(j, "replicas");
  s.selector = text(j, "selector");
  s.scaling = scalingFromJson(j);
  s.lastScale = lastScaleFromJson(j);
  s.link = linkFromJson(j);
  s.workers = workersFromJson(j);
  s.startTime = text(j, "startTime");
  s.completionTime = text(j, "completionTime");
  s.restarts = number<int>(j, "restarts");
  s.restartGeneration = number<int>(j, "restartGeneration");
  s.replicaRecoveries = number<int>(j, "replicaRecoveries");
  s.disruptions = number<int>(j, "disruptions");
  s.recovery = recoveryFromJson(j);
  s.progress = progressFromJson(j);
  s.stragglers = stragglersFromJson(j);
  s.avoidNodes = avoidNodesFromJson(j);
  s.exportStatus = exportFromJson(j);
  s.stragglerCount = number<int>(j, "stragglerCount");
  s.lastReportTime = text(j, "lastReportTime");
  s.stoppedAtStep = number<long>(j, "stoppedAtStep");
  s.message = text(j, "message");
  return s;
}

json EDiTJobStatus::toJson() const {
  json j = json::object();
  if (phase != Phase::Unset) j["phase"] = phaseName(phase);
  if (!conditions.empty()) {
    j["conditions"] = json::array();
    for (const auto& c : conditions) j["conditions"].push_back(conditionToJson(c));
  }
  put(j, "observedGeneration", observedGeneration);
  put(j, "replicas", replicas);
  put(j, "selector", selector);
  if (scaling) {
    j["scaling"] = {{"from", scaling->from}, {"to", scaling->to}, {"startTime", scaling->startTime}};
    put(j["scaling"], "requestTime", scaling->requestTime);
  }
  if (lastScale)
    j["lastScale"] = {{"from", lastScale->from},       {"to", lastScale->to},           {"result", lastScale->result},
                      {"seconds", lastScale->seconds}, {"message", lastScale->message}, {"generation", lastScale->generation}};
  if (link)
    j["link"] = {{"rank", link->rank},         {"blockedShare", link->blockedShare}, {"roundSeconds", link->roundSeconds},
                 {"stepSeconds", link->stepSeconds}, {"rounds", link->rounds},     {"localSteps", link->localSteps}};
  if (workers)
    j["workers"] = {{"total", workers->total},         {"pending", workers->pending}, {"running", workers->running},
                    {"succeeded", workers->succeeded}, {"failed", workers->failed}};
  put(j, "startTime", startTime);
  put(j, "completionTime", completionTime);
  put(j, "restarts", restarts);
  put(j, "restartGeneration", restartGeneration);
  put(j, "replicaRecoveries", replicaRecoveries);
  put(j, "disruptions", disruptions);
  if (recovery)
    j["recovery"] = {{"ranks", recovery->ranks}, {"startTime", recovery->startTime}, {"failedPodUIDs", recovery->failedPodUIDs}};
  if (progress) j["progress"] = progressToJson(*progress);
  if (stragglers) {
    j["stragglers"] = json::array();
    for (const auto& s : *stragglers)
      j["stragglers"].push_back({{"rank", s.rank}, {"pod", s.pod}, {"node", s.node}, {"score", s.score}});
  }
  if (!avoidNodes.empty()) {
    j["avoidNodes"] = json::array();
    for (const auto& a : avoidNodes) j["avoidNodes"].push_back({{"rank", a.rank}, {"node", a.node}});
  }
  if (exportStatus) j["export"] = exportToJson(*exportStatus);
  put(j, "stragglerCount", stragglerCount);
  put(j, "lastReportTime", lastReportTime);
  put(j, "stoppedAtStep", stoppedAtStep);
  put(j, "message", message);
  return j;
}

const Condition* EDiTJobStatus::condition(const std::string& type) const {
  for (const auto& c : conditions)
    if (c.type == type) return &c;
  return nullptr;
}

bool EDiTJobStatus::conditionTrue(const std::string& type) const {
  const Condition* c = condition(type);
  return c && c->status == CondStatus::True;
}

bool EDiTJobStatus::setCondition(const std::string& type, CondStatus status, const std::string& reason,
                                 const std::string& message, const std::string& now, long observedGeneration) {
  for (auto& c : conditions) {
    if (c.type != type) continue;
    if (c.status == status && c.reason == reason && c.message == message && c.observedGeneration == observedGeneration)
      return false;
    if (c.status != status) c.lastTransitionTime = now;
    c.status = status;
    c.reason = reason;
    c.message = message;
    c.observedGeneration = observedGeneration;
    return true;
  }
  conditions.push_back({type, status, reason, message, now, observedGeneration});
  return true;
}

}  // namespace edit::op::api
