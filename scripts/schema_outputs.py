#!/usr/bin/env python3
"""Files made from the runtime's one schema of the worker configuration: the CRD's worker
sections and the config fuzzer's dictionary.

An EDiTJob's spec.model, data, training, algorithm, checkpoint, debug and runtime (less
runtime.recovery, which runPolicy.replicaRecovery sets) are copied by the operator into the
workers' config file. Their OpenAPI schema (types, ranges, enums,
defaults, descriptions, cross-field CEL rules) is not written by hand: it is what
`edit-train --print-schema` prints (common/src/config_table.cpp's field table), plus the
fields only the operator reads (the PVCs). tests/fuzz/dict/config.dict holds every key,
every `--set` path and every enum value of the same schema. This script

    python3 scripts/schema_outputs.py --write    # rewrite crds/editjob.yaml's worker
                                                 # sections, the chart's copy, the dictionary
    python3 scripts/schema_outputs.py            # check: exit 1 listing every difference

(ctest packaging.crd_worker_schema runs the check).
Options: --edit-train BIN (default build/runtime/edit-train), --schema FILE (the JSON).
"""
import argparse
import json
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
CRD = ROOT / "crds" / "editjob.yaml"
CHART_CRD = ROOT / "charts" / "edit-operator" / "crds" / "editjob.yaml"
FUZZ_DICT = ROOT / "tests" / "fuzz" / "dict" / "config.dict"
# What the dictionary adds to the schema's names: YAML values and syntax worth trying.
FUZZ_SYNTAX = ["true", "false", "yes", "off", "null", "~", ".nan", ".inf", "-.inf", "1e6", "0x10",
               "&a", "*a", "<<:", "!!str", "!!int", "{", "}", "[", "]", "- ", "\\x0a  ", ": ", "---"]
# spec sections the operator copies into the workers' config (same names as the runtime's).
MIRRORED = ["model", "data", "training", "algorithm", "checkpoint", "debug", "runtime"]
# Runtime fields the operator sets from another spec field: not in the CRD's section (the
# API rejects them as unknown fields; operator/src/api/editjob.cpp names where they go).
OPERATOR_OWNED = {"runtime": ["recovery"]}
# Fields the CRD adds to a mirrored section: the operator resolves them (volume claims
# become paths), the runtime never sees them. Taken over from the CRD as they are.
CRD_ONLY = {"data": ["pvc"], "checkpoint": ["pvc"]}
KEY_ORDER = ["type", "format", "minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum",
             "minLength", "maxLength", "enum", "default", "description", "x-kubernetes-validations",
             "properties"]


def load_schema(edit_train=None, schema_file=None):
    if schema_file:
        return json.loads(Path(schema_file).read_text())
    binary = Path(edit_train or ROOT / "build" / "runtime" / "edit-train")
    if not binary.exists():
        sys.exit(f"schema_outputs: {binary} not built (cmake --build build --target edit-train)")
    out = subprocess.run([str(binary), "--print-schema"], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def spec_of(crd):
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]


def with_defaults(node, default):
    """Sections default to {} so that the API server fills the runtime's defaults in when a
    section is left out; the debug tree does not (it stays out of jobs that do not use it)."""
    node = dict(node)
    if node.get("type") == "object" and "properties" in node:
        if default:
            node["default"] = {}
        node["properties"] = {k: with_defaults(v, default) for k, v in node["properties"].items()}
    return node


def wanted_section(schema, crd, name):
    """The node spec.<name> must be: the runtime's section, defaulted to {} so that the
    runtime's defaults apply when the section is left out, plus the CRD-only fields."""
    node = with_defaults(schema["properties"][name], name != "debug")
    props = {k: v for k, v in node["properties"].items() if k not in OPERATOR_OWNED.get(name, [])}
    current = (spec_of(crd)["properties"].get(name) or {}).get("properties", {})
    for extra in CRD_ONLY.get(name, []):
        if extra in current:
            props[extra] = current[extra]
    node["properties"] = props
    return node


def same(a, b):
    """Equal as JSON values: 1 == 1.0, but true is not 1."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    return a == b


def differences(want, have, path):
    """Every difference between two schema nodes, one line each."""
    out = []
    if not isinstance(have, dict):
        return [f"{path}: missing"]
    for key in sorted(set(want) | set(have)):
        w, h = want.get(key), have.get(key)
        if key == "properties":
            for name in sorted(set(w or {}) | set(h or {})):
                sub = f"{path}.{name}"
                if name not in (h or {}):
                    out.append(f"{sub}: missing (the runtime has it)")
                elif name not in (w or {}):
                    out.append(f"{sub}: not a runtime key")
                else:
                    out += differences(w[name], h[name], sub)
        elif not same(w, h):
            if key not in want:
                out.append(f"{path}: {key} {h!r} is not in the runtime's schema")
            elif key not in have:
                out.append(f"{path}: {key} missing (the runtime's: {w!r})")
            else:
                out.append(f"{path}: {key} {h!r}, the runtime's is {w!r}")
    return out


def check(schema, crd):
    spec = spec_of(crd)
    out = []
    for name in MIRRORED:
        out += differences(wanted_section(schema, crd, name), spec["properties"].get(name), f"spec.{name}")
    return out


def fuzz_dict(schema):
    """libFuzzer dictionary: 'key:' for every name, 'path=' for every leaf, enum values."""
    names, paths, values = [], [], []

    def walk(node, path):
        for name, sub in node.get("properties", {}).items():
            p = f"{path}.{name}" if path else name
            if name not in names:
                names.append(name)
            if "properties" in sub:
                walk(sub, p)
            else:
                paths.append(p)
                values.extend(v for v in sub.get("enum", []) if v not in values)
    walk(schema, "")
    lines = ["# libFuzzer dictionary for fuzz_config, made by scripts/schema_outputs.py from",
             "# edit-train --print-schema: every key, every --set path, every enum value; YAML syntax."]
    lines += [f'"{n}:"' for n in sorted(names)] + [f'"{p}="' for p in paths]
    lines += [f'"{v}"' for v in values] + [f'"{t}"' for t in FUZZ_SYNTAX]
    return "\n".join(lines) + "\n"


# ---- writing -------------------------------------------------------------------------
def scalar(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if v.is_integer() and abs(v) < 1e15:
            return str(int(v))
        s = repr(v)
        if "e" in s and "." not in s.split("e")[0]:  # YAML 1.1 floats need the dot
            s = s.replace("e", ".0e")
        return s
    if v == "":
        return '""'
    try:
        plain_ok = yaml.safe_load(f"k: {v}") == {"k": v}
    except yaml.YAMLError:
        plain_ok = False
    return v if plain_ok and "#" not in v else json.dumps(v)


def folded(text, indent, width=100):
    words, lines, cur = text.split(" "), [], ""
    for w in words:
        if cur and len(cur) + 1 + len(w) > width - indent:
            lines.append(cur)
            cur = w
        else:
            cur = f"{cur} {w}" if cur else w
    lines.append(cur)
    return [" " * indent + line for line in lines]


def emit(node, indent):
    """YAML lines of a schema node in the CRD's style."""
    pad, out = " " * indent, []
    keys = [k for k in KEY_ORDER if k in node] + sorted(k for k in node if k not in KEY_ORDER)
    for k in keys:
        v = node[k]
        if k == "properties":
            out.append(f"{pad}properties:")
            for name, sub in v.items():
                out.append(f"{pad}  {name}:")
                out += emit(sub, indent + 4)
        elif k == "x-kubernetes-validations":
            out.append(f"{pad}x-kubernetes-validations:")
            for r in v:
                out.append(f"{pad}  - rule: {scalar(r['rule'])}")
                for rk, rv in r.items():
                    if rk != "rule":
                        out.append(f"{pad}    {rk}: {scalar(rv)}")
        elif k == "enum":
            items = [scalar(x) for x in v]
            out.append(f"{pad}enum: [{', '.join(items)}]")
        elif k == "default" and v == {}:
            out.append(f"{pad}default: {{}}")
        elif k == "description" and len(pad) + len("description: ") + len(v) > 100 and "\n" not in v:
            out.append(f"{pad}description: >-")
            out += folded(v, indent + 2)
        elif isinstance(v, (dict, list)):
            dumped = yaml.safe_dump(v, default_flow_style=False, sort_keys=False).rstrip("\n").split("\n")
            out.append(f"{pad}{k}:")
            out += [f"{pad}  {line}" for line in dumped]
        else:
            out.append(f"{pad}{k}: {scalar(v)}")
    return out


def rewrite(text, crd, schema):
    """The CRD's text with each mirrored section's block replaced; the rest untouched."""
    lines = text.split("\n")
    for name in MIRRORED:
        node = wanted_section(schema, crd, name)
        # The section's key line: under spec.properties (the first 'name:' line indented
        # like the spec's other fields, after 'spec:').
        spec_at = next(i for i, l in enumerate(lines) if l.strip() == "spec:" and "openAPIV3Schema" not in l and i > next(j for j, x in enumerate(lines) if "openAPIV3Schema" in x))
        spec_indent = len(lines[spec_at]) - len(lines[spec_at].lstrip())
        field_indent = spec_indent + 4
        start = next(i for i in range(spec_at + 1, len(lines))
                     if lines[i] == " " * field_indent + f"{name}:")
        end = start + 1
        while end < len(lines) and (not lines[end].strip() or len(lines[end]) - len(lines[end].lstrip()) > field_indent):
            end += 1
        lines[start + 1:end] = emit(node, field_indent + 2)
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--write", action="store_true", help="rewrite the CRD (and the chart's copy)")
    ap.add_argument("--edit-train", help="the edit-train binary (default build/runtime/edit-train)")
    ap.add_argument("--schema", help="the schema JSON instead of running edit-train")
    ap.add_argument("--crd", default=str(CRD))
    a = ap.parse_args()
    schema = load_schema(a.edit_train, a.schema)
    crd_path = Path(a.crd)
    text = crd_path.read_text()
    crd = yaml.safe_load(text)
    if a.write:
        new = rewrite(text, crd, schema)
        left = check(schema, yaml.safe_load(new))
        if left:
            sys.exit("schema_outputs: the rewrite still differs:\n  " + "\n  ".join(left))
        crd_path.write_text(new)
        if crd_path == CRD:
            CHART_CRD.write_text(new)
        FUZZ_DICT.write_text(fuzz_dict(schema))
        print(f"schema_outputs: wrote {crd_path}" + (f", {CHART_CRD}" if crd_path == CRD else "") + f" and {FUZZ_DICT}")
        return
    problems = check(schema, crd)
    if FUZZ_DICT.read_text() != fuzz_dict(schema):
        problems.append(f"{FUZZ_DICT.relative_to(ROOT)}: not what the schema gives")
    if problems:
        print("files made from `edit-train --print-schema` differ from it "
              "(fix: python3 scripts/schema_outputs.py --write, then review the diff):")
        for p in problems:
            print("  " + p)
        sys.exit(1)
    print(f"schema_outputs: {', '.join(MIRRORED)} match the runtime's schema")


if __name__ == "__main__":
    main()
