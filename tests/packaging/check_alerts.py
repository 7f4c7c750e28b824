#!/usr/bin/env python3
"""The alert rules: every alert the project promises exists with a severity label and
summary/description annotations, and the promtool unit tests have a firing and a
not-firing case for each. Counters (names ending in _total) appear in rules only under
rate()/increase()/irate(), and the tests feed them rising series: a counter held flat
made a rule dividing a cumulative value look right. (promtool check/test rules run as
their own tests.)"""
import re

from common import ALERT_TESTS, ALERTS, fail, load_yaml, metric_names_in

COUNTER_FUNCS = ("rate", "increase", "irate")


def expand(values):
    """promtool's series notation ('1+2x3 _ 4 stale') -> the list of numbers it stands for."""
    out = []
    for tok in str(values).split():
        if tok in ("_", "stale") or re.fullmatch(r"_x[0-9]+", tok):
            continue
        # 'a', 'a+bxn', 'a-bxn' and 'axn' (a repeated: n + 1 values).
        m = re.fullmatch(r"(-?[0-9.e]+)(?:([+-])([0-9.e]+))?(?:x([0-9]+))?", tok)
        if not m:
            raise ValueError(f"cannot read series value {tok!r}")
        start = float(m.group(1))
        if m.group(4):
            step = float(m.group(3) or 0) * (1 if m.group(2) != "-" else -1)
            out += [start + step * i for i in range(int(m.group(4)) + 1)]
        else:
            out.append(start)
    return out


def bare_counters(expr):
    """Counters an expression selects outside rate()/increase()/irate()."""
    stripped = expr
    for fn in COUNTER_FUNCS:
        # Drop each counter function call with its (non-nested) argument.
        stripped = re.sub(r"\b%s\s*\([^()]*\)" % fn, " ", stripped)
    return sorted(n for n in metric_names_in(stripped) if n.endswith("_total"))

ALERTS_WANTED = {"EDiTWorkerStraggler", "EDiTJobHung", "EDiTJobTelemetryLost", "EDiTHighCommWait", "EDiTJobRestartLoop",
                 "EDiTJobFailed", "EDiTJobLinkBound", "EDiTOperatorReconcileErrors", "EDiTOperatorDown", "EDiTNoLeader"}
SEVERITIES = {"info", "warning", "critical"}


def main():
    problems = []
    rules = [r for g in load_yaml(ALERTS)["groups"] for r in g["rules"] if "alert" in r]
    names = {r["alert"] for r in rules}
    if names != ALERTS_WANTED:
        problems.append(f"alerts {sorted(names)}, want {sorted(ALERTS_WANTED)}")
    for r in rules:
        if r.get("labels", {}).get("severity") not in SEVERITIES:
            problems.append(f"{r['alert']}: severity label must be one of {sorted(SEVERITIES)}")
        for a in ("summary", "description"):
            if not r.get("annotations", {}).get(a):
                problems.append(f"{r['alert']}: no {a} annotation")

        for n in bare_counters(r["expr"]):
            problems.append(f"{r['alert']}: counter {n} is used without rate()/increase()/irate()")

    tests = load_yaml(ALERT_TESTS)
    if tests.get("rule_files") != [ALERTS.name]:
        problems.append(f"{ALERT_TESTS.name} must test {ALERTS.name}, tests {tests.get('rule_files')}")
    firing, quiet = set(), set()
    for t in tests.get("tests", []):
        for case in t.get("alert_rule_test", []):
            (firing if case.get("exp_alerts") else quiet).add(case["alertname"])
    for t in tests.get("tests", []):
        for series in t.get("input_series", []):
            name = series["series"].split("{", 1)[0]
            vals = expand(series["values"])
            if name.endswith("_total") and not any(b > a for a, b in zip(vals, vals[1:])):
                problems.append(f"test input {series['series']}: a counter that never rises ({series['values']})")
    for a in sorted(names):
        if a not in firing:
            problems.append(f"{a}: no unit test where it fires")
        if a not in quiet:
            problems.append(f"{a}: no unit test where it must not fire")
    fail(problems, "alerts")


if __name__ == "__main__":
    main()
