#!/usr/bin/env python3
"""crds/editjob.yaml: names, printer columns, a structural schema with a description on
every field, valid defaults, CEL rules that name existing fields, transition rules that
keep every spec field but replicas, runPolicy and stragglerPolicy immutable, a scale
subresource whose paths name fields of the right types, and every EDiTJob under examples/
valid against the schema. The nodes made from the operator's and the workers' tables are
checked against them by the operator's unit test CrdSchema.* and scripts/schema_outputs.py
(ctest packaging.crd_schema)."""
import re

from common import CRD, ROOT, fail, load_yaml, load_yaml_docs
from openapi_schema import resolve, validate, walk

COLUMNS = {"Phase": ".status.phase", "Step": ".status.progress.step", "Loss": ".status.progress.loss",
           "Tokens/s": ".status.progress.tokensPerSecond", "Stragglers": ".status.stragglerCount",
           "Age": ".metadata.creationTimestamp", "Restarts": ".status.restarts", "Message": ".status.message",
           "Replicas": ".status.replicas"}
# kubectl get -o wide only (priority 1).
WIDE_COLUMNS = {"Restarts", "Mode", "Replicas", "Shards"}
# spec fields that may change on a running job (the operator applies them at the next
# reconcile; replicas by scaling in place); every other field has a transition rule.
# runPolicy.replicaRecovery does not (the workers' config is made from it).
MUTABLE = {"replicas", "runPolicy", "stragglerPolicy"}
IMMUTABLE_INSIDE = {"runPolicy": ["replicaRecovery"]}
CEL_REQUIRED = {  # schema node -> a word its rules must mention
    "spec": "4096", "spec.algorithm": "syncSeconds", "spec.model": "heads"}
# scale subresource (kubectl scale, HPA): path -> (the field it must name, its type).
SCALE = {"specReplicasPath": (".spec.replicas", "integer"),
         "statusReplicasPath": (".status.replicas", "integer"),
         "labelSelectorPath": (".status.selector", "string")}


def check_structure(schema, problems):
    for path, node in walk(schema):
        where = path or "<root>"
        if not node.get("description"):
            problems.append(f"{where}: no description")
        free = node.get("x-kubernetes-preserve-unknown-fields") or node.get("x-kubernetes-int-or-string")
        t = node.get("type")
        if not t and not free:
            problems.append(f"{where}: no type")
        if t == "string" and path not in (".apiVersion", ".kind") and not ({"maxLength", "enum", "format"} & set(node)):
            problems.append(f"{where}: string without maxLength, enum or format")
        if t == "array" and ("maxItems" not in node or "items" not in node):
            problems.append(f"{where}: array without items or maxItems")
        if t == "object" and not free and path != ".metadata" and not (
                node.get("properties") or "additionalProperties" in node):
            problems.append(f"{where}: object without properties")
        for req in node.get("required", []):
            if req not in (node.get("properties") or {}):
                problems.append(f"{where}: required field {req} is not a property")
        if "default" in node:
            problems += [f"default of {p}" for p in validate(node, node["default"], where)]
        for rule in node.get("x-kubernetes-validations", []):
            if not rule.get("message"):
                problems.append(f"{where}: CEL rule without message: {rule.get('rule')}")
            for ref, call in re.findall(r"(?<!\w)(?:self|oldSelf)((?:\.\w+)+)(\()?", rule.get("rule", "")):
                if call:  # self.all(...), self.x.startsWith(...): the last name is a method
                    ref = ref.rsplit(".", 1)[0]
                if ref and resolve(node, ref[1:]) is None:
                    problems.append(f"{where}: CEL rule names a missing field self{ref}")


def transition_rules(node):
    """{field: rule} of the node's rules that compare a field with its old value."""
    out = {}
    for r in node.get("x-kubernetes-validations", []):
        if "oldSelf" in r.get("rule", "") and r.get("fieldPath", "").startswith("."):
            out[r["fieldPath"][1:]] = r
    return out


def check_immutable(spec, problems):
    """Each immutable field: a rule on its parent (present on every update, so adding or
    removing an optional field counts too) comparing it with oldSelf, with fieldPath and a
    message naming it; no rule on the mutable ones."""
    def check(node, fields, prefix):
        rules = transition_rules(node)
        for f in fields:
            r = rules.get(f)
            want = f"has(self.{f}) == has(oldSelf.{f}) && (!has(self.{f}) || self.{f} == oldSelf.{f})"
            if r is None:
                problems.append(f"{prefix}.{f}: no transition rule (every field but {sorted(MUTABLE)} is immutable)")
            elif r["rule"] != want or f"{prefix}.{f}" not in r.get("message", "") or \
                    r.get("reason") != "FieldValueForbidden":
                problems.append(f"{prefix}.{f}: transition rule must be '{want}', reason FieldValueForbidden, "
                                f"message naming {prefix}.{f}: {r}")
        for extra in sorted(set(rules) - set(fields)):
            problems.append(f"{prefix}.{extra}: has a transition rule but is meant to be mutable")

    props = spec.get("properties") or {}
    check(spec, [f for f in props if f not in MUTABLE], "spec")
    for parent, fields in IMMUTABLE_INSIDE.items():
        check(props[parent], fields, f"spec.{parent}")
    for f in MUTABLE - set(IMMUTABLE_INSIDE):
        if transition_rules(props.get(f, {})):
            problems.append(f"spec.{f}: mutable, but has transition rules")


def check_scale(scale, schema, problems):
    """The paths name the fields the operator reads and writes, with the types the API
    server needs (it reads replicas as an integer, the selector as a string)."""
    if not isinstance(scale, dict):
        problems.append("scale subresource missing")
        return
    for key, (want, typ) in SCALE.items():
        path = scale.get(key)
        if path != want:
            problems.append(f"scale.{key}: {path!r}, want {want}")
            continue
        node = resolve(schema, path[1:])
        if node is None or node.get("type") != typ:
            problems.append(f"scale.{key}: {path} is not a field of type {typ} in the schema")


def check_crd(crd, problems):
    names = crd["spec"]["names"]
    expect = {"kind": "EDiTJob", "plural": "editjobs", "singular": "editjob", "shortNames": ["ej"],
              "categories": ["all", "edit"]}
    for k, v in expect.items():
        if names.get(k) != v:
            problems.append(f"names.{k}: {names.get(k)!r}, want {v!r}")
    if crd["metadata"]["name"] != "editjobs.edit.io" or crd["spec"]["group"] != "edit.io":
        problems.append("must be editjobs.edit.io in group edit.io")
    versions = crd["spec"]["versions"]
    if [v["name"] for v in versions] != ["v1alpha1"] or not versions[0].get("storage"):
        problems.append("one served storage version v1alpha1 expected")
    v = versions[0]
    if v.get("subresources", {}).get("status") != {}:
        problems.append("status subresource missing")
    schema = v["schema"]["openAPIV3Schema"]
    check_scale(v.get("subresources", {}).get("scale"), schema, problems)
    cols = {c["name"]: c["jsonPath"] for c in v.get("additionalPrinterColumns", [])}
    for name, jp in COLUMNS.items():
        if cols.get(name) != jp:
            problems.append(f"printer column {name}: {cols.get(name)!r}, want {jp}")
    for c in v.get("additionalPrinterColumns", []):
        if (c.get("priority", 0) == 1) != (c["name"] in WIDE_COLUMNS):
            problems.append(f"printer column {c['name']}: priority {c.get('priority', 0)}, "
                            f"want 1 exactly for {sorted(WIDE_COLUMNS)}")
    names = [c["name"] for c in v.get("additionalPrinterColumns", [])]
    if names and names[-1] != "Message":
        problems.append(f"printer columns {names}: Message must be last (it has spaces; it may be long)")
    for name, jp in cols.items():
        if not jp.startswith(".metadata.") and resolve(schema, jp[1:]) is None:
            problems.append(f"printer column {name}: {jp} is not in the schema")
    for node_path, word in CEL_REQUIRED.items():
        rules = " ".join(r["rule"] for r in resolve(schema, node_path).get("x-kubernetes-validations", []))
        if word not in rules:
            problems.append(f"{node_path}: no CEL rule about {word}")
    check_structure(schema, problems)
    check_immutable(schema["properties"]["spec"], problems)
    return schema


def check_examples(schema, problems):
    count = 0
    for path in sorted((ROOT / "examples").rglob("*.yaml")):
        for doc in load_yaml_docs(path.read_text()):
            if isinstance(doc, dict) and doc.get("kind") == "EDiTJob":
                count += 1
                problems += [f"{path.relative_to(ROOT)}: {p}" for p in validate(schema, doc, "")]
    print(f"{count} example EDiTJob(s) validated")


def condition_types():
    """The condition types the operator sets: its named constants (operator/src/api/status.h,
    namespace condition)."""
    text = (ROOT / "operator" / "src" / "api" / "status.h").read_text()
    block = re.search(r"namespace condition \{(.*?)\}  // namespace condition", text, re.S)
    return set(re.findall(r'inline constexpr const char\* \w+ = "([A-Z][A-Za-z]+)";', block.group(1) if block else ""))


def check_condition_types(crd, problems):
    """Every condition type the operator sets is named where users look it up: the CRD's
    status.conditions descriptions (kubectl explain) and operator/README.md."""
    types = condition_types()
    if len(types) < 10:
        problems.append(f"found only {sorted(types)} in operator/src/api/status.h: has namespace condition moved?")
    conds = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]["conditions"]
    places = {"CRD status.conditions description": conds["description"],
              "CRD status.conditions[].type description": conds["items"]["properties"]["type"]["description"],
              "operator/README.md": (ROOT / "operator" / "README.md").read_text()}
    for where, text in places.items():
        missing = sorted(t for t in types if not re.search(r"\b%s\b" % t, text))
        if missing:
            problems.append(f"{where} does not name the condition type(s) {missing}")


def main():
    problems = []
    crd = load_yaml(CRD)
    schema = check_crd(crd, problems)
    check_condition_types(crd, problems)
    check_examples(schema, problems)
    fail(problems, "crd")


if __name__ == "__main__":
    main()
