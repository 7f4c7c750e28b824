// The parts of the CRD's spec schema (crds/editjob.yaml) that are made, not written: the
// worker sections from the workers' config table (common/src/config_table.cpp, less
// runtime.recovery, which runPolicy.replicaRecovery sets) and the operator's own fields,
// sections and rules from its table (api/spec_table.h). `edit-operator --print-schema`
// prints it; scripts/schema_outputs.py --write puts it into the CRD, and the operator's
// unit test CrdSchema.* fails on any difference.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace edit::op::api {

// {"properties": {name: node, ...}, "x-kubernetes-validations": [the spec-level rules]}:
// each property is the whole node spec.<name> must be; the rules must be among spec's.
// Ordered as the tables list them (the CRD's order).
nlohmann::ordered_json crdSpecSchema();

// The spec sections the operator copies into the workers' config file.
const std::vector<std::string>& workerSections();

}  // namespace edit::op::api
