// The operator's own spec fields as one table, the way common/src/config_table.cpp holds
// the workers' config: each field's path under spec, type, rule, default (the
// EDiTJobSpec member's initial value) and description; each section's description; and
// the cross-field rules as CEL plus the C++ check that enforces the same rule.
//   parseSpec (editjob.cpp)          reads and checks the fields by it
//   crdSpecSchema (crd_schema.h)     the CRD's nodes for them (`edit-operator --print-schema`,
//                                    scripts/schema_outputs.py --write, the CRD schema test)
//   tests/fuzz/target_editjob.h      checks every accepted spec against it
// Fields whose schema is a Kubernetes type (env, tolerations, resources, volumes,
// podTemplate, ...) are not in the table: the CRD spells them out, editjob.cpp checks
// their shape.
#pragma once

#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "api/editjob.h"

namespace edit::op::api {

// replicas * shardsPerReplica. Bounds the status lists that hold ranks (recovery.ranks,
// stragglers: maxItems 4096) and is the largest job the telemetry hub was measured at.
inline constexpr int kMaxWorldSize = 4096;

// checkpoint.everySteps on a cluster when the job does not say: the CRD's default, and the
// operator's for a job stored without it. The worker's own default, 0, keeps only the
// checkpoints written on SIGTERM and at the end, so a pod killed before its SIGTERM
// checkpoint finished (a grace period too short, a node lost) would cost the whole run.
inline constexpr long kClusterCheckpointEverySteps = 500;

enum class FieldKind {
  I32,     // int
  I64,     // long
  OptI64,  // std::optional<long>: unset when absent
  F64,     // double
  Str,     // std::string
  Bool,    // bool
};

// What a value must be. Integers: [ilo, ihi]; numbers: [dlo, dhi], lo open if loOpen;
// strings: a length in [minLength, maxLength] (0: no cap), or one of `choices`.
struct FieldRule {
  int64_t ilo = std::numeric_limits<int64_t>::min(), ihi = std::numeric_limits<int64_t>::max();
  double dlo = -std::numeric_limits<double>::infinity(), dhi = std::numeric_limits<double>::infinity();
  bool loOpen = false;
  size_t minLength = 0, maxLength = 0;
  std::vector<std::string> choices;
};

struct SpecField {
  std::string path;  // under spec: "runPolicy.backoffLimit"
  FieldKind kind;
  void* ptr;         // the EDiTJobSpec member
  FieldRule rule;
  const char* doc;   // the CRD's description
  bool hasDefault;   // the member's initial value is the CRD's default
  bool required;     // "is required" when absent (the CRD lists it in required)

  std::string describe() const;  // "an integer in [1, 4096]", "one of All, Running, None"
  bool isInteger() const { return kind == FieldKind::I32 || kind == FieldKind::I64 || kind == FieldKind::OptI64; }
  bool isSet() const;            // false only for an unset OptI64
  // Reads a JSON value into the member; throws SpecError("spec.<path>", ...).
  void read(const nlohmann::json& v) const;
  // Whether the member's value obeys the rule (the fuzz contract; an unset optional does).
  bool allowed() const;
  nlohmann::json value() const;  // the member as JSON (null when unset)
  nlohmann::json schema() const; // the field's CRD node

 private:
  bool strAllowed(const std::string& s) const;
  bool numberAllowed(double d) const;
  bool intAllowed(int64_t i) const;
};

// Every field of the table, pointing into s. export.* only when s.exportModel is set.
std::vector<SpecField> specFields(EDiTJobSpec& s);

// A section of the spec the operator owns (runPolicy, stragglerPolicy, export).
struct SpecSection {
  const char* path;
  const char* doc;
  bool defaultEmpty;  // default {} so that the API server fills in the fields' defaults
};
const std::vector<SpecSection>& specSections();

// A rule over several fields, or one the field rule cannot say. `on`: the node that
// carries the CEL rule ("" is spec itself). holds: the operator's check of the same
// rule (nullptr: only the API server can check it, e.g. a transition rule).
struct SpecRule {
  const char* on;
  const char* field;      // what a SpecError names, e.g. "spec.runtime.backend"
  const char* cel;        // nullptr: checked by the operator only
  const char* message;    // as the API server reports it (the CRD's message)
  bool (*holds)(const EDiTJobSpec&);
  const char* fieldPath = nullptr;  // CEL fieldPath (relative to `on`)
  const char* reason = nullptr;     // CEL reason (FieldValueForbidden for transition rules)
  const char* messageExpression = nullptr;  // CEL messageExpression (names the offending value)
  std::string problem() const;     // the message less its leading field name: SpecError's
  nlohmann::json crdRule() const;   // {"rule", "message", ...} as the CRD holds it
};
const std::vector<SpecRule>& specRules();

// Why spec.env may not set this name ("" when it may): api/worker_env.h.
std::string reservedEnvProblem(const std::string& name);

}  // namespace edit::op::api
