"""Shared helpers of the packaging checks: paths, tools, YAML, metric names and PromQL.

Every check is a script run by ctest (tests/packaging/CMakeLists.txt) with the source root
in EDIT_SOURCE_ROOT and the tools in HELM / PROMTOOL; each prints what it found wrong
and exits 1, or exits 0.
"""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(os.environ.get("EDIT_SOURCE_ROOT", Path(__file__).resolve().parents[2]))
HERE = Path(__file__).resolve().parent
CHART = ROOT / "charts" / "edit-operator"
CRD = ROOT / "crds" / "editjob.yaml"
DASHBOARDS = ROOT / "dashboards"
ALERTS = ROOT / "deploy" / "prometheus" / "edit-alerts.rules.yaml"
ALERT_TESTS = ROOT / "deploy" / "prometheus" / "edit-alerts.test.yaml"
METRICS_FILE = HERE / "metrics.txt"
FULL_VALUES = HERE / "values-full.yaml"

# Series Prometheus itself makes for every target; not exported by our code.
PROMETHEUS_BUILTINS = {"up"}


def tool(name):
    """Path of a tool from the environment (HELM, PROMTOOL), else from PATH."""
    return os.environ.get(name.upper(), name)


def run(args, **kw):
    """Runs a command, returns its stdout; raises with its stderr on failure."""
    proc = subprocess.run([str(a) for a in args], capture_output=True, text=True, **kw)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, args))} exited {proc.returncode}:\n{proc.stderr}{proc.stdout}")
    return proc.stdout


def load_yaml(path):
    with open(path) as f:
        return yaml.safe_load(f)


def load_yaml_docs(text):
    return [d for d in yaml.safe_load_all(text) if d is not None]


def load_json(path):
    with open(path) as f:
        return json.load(f)


def dashboard_files():
    return sorted(DASHBOARDS.glob("*.json"))


def helm_template(values=None, extra=()):
    """Renders the chart into a list of objects."""
    args = [tool("helm"), "template", "t", CHART, "--namespace", "edit-system", *extra]
    if values:
        args += ["-f", values]
    return load_yaml_docs(run(args))


# ---------------------------------------------------------------- metric names

def exported_metrics():
    """(names, histograms) from metrics.txt; a histogram's series are NAME_bucket/_sum/_count."""
    names, histograms = set(), set()
    for line in METRICS_FILE.read_text().splitlines():
        line = line.strip()
        if line.startswith("# histograms:"):
            histograms.update(line.split(":", 1)[1].split())
        elif line and not line.startswith("#"):
            names.add(line)
    return names, histograms


def series_names():
    """Every series name a query may use."""
    names, histograms = exported_metrics()
    allowed = set(names) | PROMETHEUS_BUILTINS
    for h in histograms:
        allowed |= {h + "_bucket", h + "_sum", h + "_count"}
    return allowed


# ---------------------------------------------------------------- PromQL

PROMQL_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool",
                   "and", "or", "unless", "offset", "atan2", "inf", "nan"}


def grafana_to_promql(expr):
    """Replaces Grafana's variables with valid PromQL ($__rate_interval -> 5m, $job -> x)."""
    expr = re.sub(r"\$__(rate_interval|interval|range)\b|\$\{__(rate_interval|interval|range)\}", "5m", expr)
    expr = re.sub(r"\$__range_s\b", "3600", expr)
    return re.sub(r"\$\{?[A-Za-z_][A-Za-z0-9_]*(:[a-z]+)?\}?", "placeholder", expr)


def metric_names_in(expr):
    """Metric names a PromQL expression selects (identifiers that are not functions,
    keywords, label names or durations)."""
    e = re.sub(r'"(\\.|[^"\\])*"', '""', expr)           # string literals
    e = re.sub(r"\{[^}]*\}", "", e)                         # label matchers
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", e)
    e = re.sub(r"\[[^\]]*\]", "", e)                        # range and subquery windows
    names = set()
    for m in re.finditer(r"(?<![\w.])([A-Za-z_:][A-Za-z0-9_:]*)(\s*\()?", e):
        word, call = m.group(1), m.group(2)
        if call or word.lower() in PROMQL_KEYWORDS or re.fullmatch(r"\d+[smhdwy]", word):
            continue
        names.add(word)
    return names


def dashboard_queries(dashboard):
    """(where, expr) of every panel target and every query variable of a dashboard."""
    out = []

    def walk(panels):
        for p in panels:
            for t in p.get("targets", []):
                if t.get("expr"):
                    out.append((f"panel {p.get('id')} '{p.get('title')}' {t.get('refId')}", t["expr"]))
            walk(p.get("panels", []))

    walk(dashboard.get("panels", []))
    for v in dashboard.get("templating", {}).get("list", []):
        if v.get("type") == "query":
            q = v["query"]["query"] if isinstance(v.get("query"), dict) else v.get("query", "")
            m = re.fullmatch(r"\s*label_values\((.*),\s*[A-Za-z_]\w*\s*\)\s*", q)
            out.append((f"variable {v['name']}", m.group(1) if m else q))
    return out


def rule_exprs(rules_doc):
    """(where, expr) of every rule of a Prometheus rules file."""
    return [(f"group {g['name']} {r.get('alert') or r.get('record')}", r["expr"])
            for g in rules_doc["groups"] for r in g["rules"]]


def fail(problems, what):
    """Prints the problems and exits 1, or reports success."""
    if problems:
        print(f"{what}: {len(problems)} problem(s)")
        for p in problems:
            print("  -", p)
        sys.exit(1)
    print(f"{what}: ok")
