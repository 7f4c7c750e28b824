// One fuzz input (JSON text) through the operator's EDiTJob parser/validator
// (operator/src/api/editjob.h): parseSpec and validateName.
// Contract checked: they throw nothing but api::SpecError, naming a field under spec. or
// metadata.; an accepted spec obeys every rule of the operator's spec table
// (operator/src/api/spec_table.h, which the CRD is made from): each field's range, type
// and choices, each cross-field rule, the world size; and every integer field holds
// exactly the integer that was written (no silent truncation).
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>

#include "api/editjob.h"
#include "api/spec_table.h"
#include "fuzz_util.h"

namespace edit::fuzz {


namespace detail {
// The value at a dotted path under obj, if it is a number.
inline const nlohmann::json* writtenAt(const nlohmann::json& obj, const std::string& path) {
  const nlohmann::json* cur = &obj;
  for (size_t start = 0;;) {
    const size_t dot = path.find('.', start);
    const std::string key = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (!cur->is_object() || !cur->contains(key)) return nullptr;
    cur = &(*cur)[key];
    if (dot == std::string::npos) return cur->is_number() ? cur : nullptr;
    start = dot + 1;
  }
}
// The integer as written in the manifest (integral floats included).
inline long double writtenInt(const nlohmann::json& v) {
  return v.is_number_unsigned() ? static_cast<long double>(v.get<uint64_t>())
         : v.is_number_integer() ? static_cast<long double>(v.get<int64_t>())
                                 : static_cast<long double>(v.get<double>());
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
  check(s.worldSize() >= 1 && s.worldSize() <= api::kMaxWorldSize, "world size in [1, kMaxWorldSize]");
  check(!s.image.empty() && !s.command.empty(), "image and command present");
  for (const auto& f : api::specFields(s)) {
    check(f.allowed(), "spec." + f.path + " must be " + f.describe() + ", holds " + f.value().dump());
    const nlohmann::json* w = f.isInteger() ? detail::writtenAt(obj["spec"], f.path) : nullptr;
    if (w && f.isSet() && detail::writtenInt(*w) != static_cast<long double>(f.value().get<int64_t>()))
      throw std::logic_error("spec." + f.path + " was written as " + w->dump() + " but parsed as " + f.value().dump());
  }
  for (const auto& r : api::specRules())
    if (r.holds) check(r.holds(s), r.message);
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
