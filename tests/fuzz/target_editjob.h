// One fuzz input (JSON text) through the operator's EDiTJob parser/validator
// (operator/src/api/editjob.h): parseSpec and validateName.
// Contract checked: they throw nothing but api::SpecError, naming a field under spec. or
// metadata.; an accepted spec is inside the documented ranges, and every integer field
// holds exactly the integer that was written (no silent truncation).
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>

#include "api/editjob.h"
#include "fuzz_util.h"

namespace edit::fuzz {


namespace detail {
// The integer as written in the manifest, if it is one (integral floats included).
inline bool writtenInt(const nlohmann::json& obj, const char* key, long double* out) {
  if (!obj.is_object()) return false;
  auto it = obj.find(key);
  if (it == obj.end() || !it->is_number()) return false;
  *out = it->is_number_unsigned() ? static_cast<long double>(it->get<uint64_t>())
         : it->is_number_integer() ? static_cast<long double>(it->get<int64_t>())
                                   : static_cast<long double>(it->get<double>());
  return true;
}
inline void checkSame(const nlohmann::json& obj, const char* key, long double parsed, const std::string& path) {
  long double w;
  if (writtenInt(obj, key, &w) && w != parsed)
    throw std::logic_error(path + " was written as " + std::to_string(static_cast<double>(w)) +
                           " but parsed as " + std::to_string(static_cast<double>(parsed)));
}
inline void check(bool ok, const std::string& what) {
  if (!ok) throw std::logic_error("accepted spec violates: " + what);
}
}  // namespace detail

inline void fuzzEditJobJson(const nlohmann::json& obj) {
  namespace api = edit::op::api;
  api::EDiTJobSpec s;
  try {
    s = api::parseSpec(obj);
  } catch (const api::SpecError& e) {
    if (e.field().rfind("spec", 0) != 0) throw std::logic_error("SpecError field not under spec: " + e.field());
    return;
  }
  using detail::check;
  check(s.replicas >= 1 && s.replicas <= 4096, "spec.replicas in [1, 4096]");
  check(s.shardsPerReplica >= 1 && s.shardsPerReplica <= 1024, "spec.shardsPerReplica in [1, 1024]");
  check(s.worldSize() >= 1 && s.worldSize() <= 16384, "world size in [1, 16384]");
  check(s.gpusPerWorker >= 0 && s.gpusPerWorker <= 64, "spec.gpusPerWorker in [0, 64]");
  check(!s.image.empty() && !s.command.empty(), "image and command present");
  check(s.masterPort >= 1 && s.masterPort <= 65535, "spec.masterPort in [1, 65535]");
  check(s.hangTimeoutSeconds >= 0, "spec.hangTimeoutSeconds >= 0");
  check(s.runPolicy.backoffLimit >= 0, "backoffLimit >= 0");
  check(s.stragglerPolicy.windowSteps >= 1 && s.stragglerPolicy.windowSteps <= 10000, "windowSteps");
  check(s.stragglerPolicy.minReports >= 1, "minReports >= 1");
  check(s.stragglerPolicy.threshold >= 1 && s.stragglerPolicy.threshold <= 100, "threshold in [1, 100]");
  const auto& spec = obj["spec"];
  detail::checkSame(spec, "replicas", s.replicas, "spec.replicas");
  detail::checkSame(spec, "shardsPerReplica", s.shardsPerReplica, "spec.shardsPerReplica");
  detail::checkSame(spec, "gpusPerWorker", s.gpusPerWorker, "spec.gpusPerWorker");
  detail::checkSame(spec, "masterPort", s.masterPort, "spec.masterPort");
  detail::checkSame(spec, "hangTimeoutSeconds", s.hangTimeoutSeconds, "spec.hangTimeoutSeconds");
  if (spec.contains("runPolicy"))
    detail::checkSame(spec["runPolicy"], "backoffLimit", s.runPolicy.backoffLimit, "spec.runPolicy.backoffLimit");
  if (spec.contains("stragglerPolicy")) {
    detail::checkSame(spec["stragglerPolicy"], "windowSteps", s.stragglerPolicy.windowSteps,
                      "spec.stragglerPolicy.windowSteps");
    detail::checkSame(spec["stragglerPolicy"], "minReports", s.stragglerPolicy.minReports,
                      "spec.stragglerPolicy.minReports");
  }
  // The name check the reconciler runs next to parseSpec.
  std::string name = "fuzz";
  if (obj.contains("metadata") && obj["metadata"].is_object() && obj["metadata"].contains("name") &&
      obj["metadata"]["name"].is_string())
    name = obj["metadata"]["name"].get<std::string>();
  try {
    api::validateName(name, s.worldSize());
  } catch (const api::SpecError& e) {
    if (e.field() != "metadata.name") throw std::logic_error("validateName blamed " + e.field());
  }
}

inline void fuzzEditJobOne(const uint8_t* data, size_t size) {
  // The operator gets objects as JSON from the API server; text that is not JSON never
  // reaches the parser.
  auto obj = nlohmann::json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
  if (obj.is_discarded()) return;
  fuzzEditJobJson(obj);
}

}  // namespace edit::fuzz
