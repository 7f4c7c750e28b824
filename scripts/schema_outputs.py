#!/usr/bin/env python3
"""Files made from the operator's and the runtime's tables: the CRD's spec schema where it
is not hand-written, and the config fuzzer's dictionary.

`edit-operator --print-schema` prints every node of crds/editjob.yaml's spec that is made,
not written (operator/src/api/crd_schema.h): the worker sections (model, data, training,
algorithm, checkpoint, debug, runtime: common/src/config_table.cpp's field table, less
runtime.recovery, which runPolicy.replicaRecovery sets, plus the volume claims the operator
mounts) and the operator's own fields, sections and cross-field CEL rules
(operator/src/api/spec_table.cpp). tests/fuzz/dict/config.dict holds every key, every
`--set` path and every enum value of the workers' schema (`edit-config-schema`, which needs
no LibTorch). This script

    python3 scripts/schema_outputs.py --write    # rewrite those CRD nodes and the dictionary
    python3 scripts/schema_outputs.py            # check: exit 1 listing every difference

The operator's unit test CrdSchema.* makes the same check of the CRD in every build with the
operator; ctest packaging.crd_schema runs this script's (the dictionary too).
Options: --operator BIN (default build/operator/edit-operator), --config-schema BIN
(default build/common/edit-config-schema), --crd FILE.
"""
import argparse
import json
import subprocess
import sys
from pathlib import Path

try:
    import yaml
except ImportError:  # python3-yaml; ctest reports the check as skipped
    print("schema_outputs: needs PyYAML (Debian package python3-yaml)")
    sys.exit(77)

ROOT = Path(__file__).resolve().parents[1]
CRD = ROOT / "crds" / "editjob.yaml"
FUZZ_DICT = ROOT / "tests" / "fuzz" / "dict" / "config.dict"
# What the dictionary adds to the schema's names: YAML values and syntax worth trying.
FUZZ_SYNTAX = ["true", "false", "yes", "off", "null", "~", ".nan", ".inf", "-.inf", "1e6", "0x10",
               "&a", "*a", "<<:", "!!str", "!!int", "{", "}", "[", "]", "- ", "\\x0a  ", ": ", "---"]
KEY_ORDER = ["type", "format", "minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum",
             "minLength", "maxLength", "enum", "default", "description", "required", "x-kubernetes-validations",
             "properties"]


def run_json(binary, args, target):
    if not Path(binary).exists():
        sys.exit(f"schema_outputs: {binary} not built (cmake --build build --target {target})")
    out = subprocess.run([str(binary)] + args, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def spec_of(crd):
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]


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
                    out.append(f"{sub}: missing (the table has it)")
                elif name not in (w or {}):
                    out.append(f"{sub}: not in the table")
                else:
                    out += differences(w[name], h[name], sub)
        elif not same(w, h):
            if key not in want:
                out.append(f"{path}: {key} {h!r} is not in the table")
            elif key not in have:
                out.append(f"{path}: {key} missing (the table's: {w!r})")
            else:
                out.append(f"{path}: {key} {h!r}, the table's is {w!r}")
    return out


def check(made, crd):
    """Every made node equals the CRD's; every made spec-level rule is among the CRD's."""
    spec = spec_of(crd)
    out = []
    for name, node in made["properties"].items():
        out += differences(node, spec["properties"].get(name), f"spec.{name}")
    have = spec.get("x-kubernetes-validations", [])
    for rule in made["x-kubernetes-validations"]:
        if not any(all(same(rule[k], h.get(k)) for k in rule) and set(rule) == set(h) for h in have):
            out.append(f"spec: CEL rule missing or different: {rule}")
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
             "# edit-config-schema: every key, every --set path, every enum value; YAML syntax."]
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
        elif k in ("enum", "required"):
            items = [scalar(x) for x in v]
            out.append(f"{pad}{k}: [{', '.join(items)}]")
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


def rewrite(text, made):
    """The CRD's text with each made node's block replaced; the rest untouched. The
    spec-level rules are hand-placed among the transition rules: check() finds them."""
    lines = text.split("\n")
    schema_at = next(j for j, x in enumerate(lines) if "openAPIV3Schema" in x)
    spec_at = next(i for i, l in enumerate(lines) if l.strip() == "spec:" and i > schema_at)
    field_indent = len(lines[spec_at]) - len(lines[spec_at].lstrip()) + 4
    for name, node in made["properties"].items():
        # The node's key line: under spec.properties, indented like the spec's other fields.
        start = next(i for i in range(spec_at + 1, len(lines)) if lines[i] == " " * field_indent + f"{name}:")
        end = start + 1
        while end < len(lines) and (not lines[end].strip() or len(lines[end]) - len(lines[end].lstrip()) > field_indent):
            end += 1
        lines[start + 1:end] = emit(node, field_indent + 2)
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--write", action="store_true", help="rewrite the CRD's made nodes and the dictionary")
    ap.add_argument("--operator", default=str(ROOT / "build" / "operator" / "edit-operator"),
                    help="the edit-operator binary (prints the CRD's made nodes)")
    ap.add_argument("--config-schema", default=str(ROOT / "build" / "common" / "edit-config-schema"),
                    help="the edit-config-schema binary (prints the workers' schema)")
    ap.add_argument("--crd", default=str(CRD))
    a = ap.parse_args()
    made = run_json(a.operator, ["--print-schema"], "edit-operator")
    worker = run_json(a.config_schema, [], "edit-config-schema")
    crd_path = Path(a.crd)
    text = crd_path.read_text()
    if a.write:
        new = rewrite(text, made)
        left = check(made, yaml.safe_load(new))
        crd_path.write_text(new)
        FUZZ_DICT.write_text(fuzz_dict(worker))
        print(f"schema_outputs: wrote {crd_path} and {FUZZ_DICT}")
        if left:
            sys.exit("schema_outputs: edit by hand:\n  " + "\n  ".join(left))
        return
    problems = check(made, yaml.safe_load(text))
    if FUZZ_DICT.read_text() != fuzz_dict(worker):
        problems.append(f"{FUZZ_DICT.relative_to(ROOT)}: not what the schema gives")
    if problems:
        print("files made from `edit-operator --print-schema` and `edit-config-schema` differ from them "
              "(fix: python3 scripts/schema_outputs.py --write, then review the diff):")
        for p in problems:
            print("  " + p)
        sys.exit(1)
    print(f"schema_outputs: {', '.join(made['properties'])} and the spec's rules match the tables")


if __name__ == "__main__":
    main()
