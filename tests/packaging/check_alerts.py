#!/usr/bin/env python3
"""The alert rules: every alert the project promises exists with a severity label and
summary/description annotations, and the promtool unit tests have a firing and a
not-firing case for each. (promtool check/test rules run as their own tests.)"""
from common import ALERT_TESTS, ALERTS, fail, load_yaml

ALERTS_WANTED = {"EDiTWorkerStraggler", "EDiTJobHung", "EDiTHighCommWait", "EDiTJobRestartLoop",
                 "EDiTOperatorReconcileErrors", "EDiTOperatorDown", "EDiTNoLeader"}
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

    tests = load_yaml(ALERT_TESTS)
    if tests.get("rule_files") != [ALERTS.name]:
        problems.append(f"{ALERT_TESTS.name} must test {ALERTS.name}, tests {tests.get('rule_files')}")
    firing, quiet = set(), set()
    for t in tests.get("tests", []):
        for case in t.get("alert_rule_test", []):
            (firing if case.get("exp_alerts") else quiet).add(case["alertname"])
    for a in sorted(names):
        if a not in firing:
            problems.append(f"{a}: no unit test where it fires")
        if a not in quiet:
            problems.append(f"{a}: no unit test where it must not fire")
    fail(problems, "alerts")


if __name__ == "__main__":
    main()
