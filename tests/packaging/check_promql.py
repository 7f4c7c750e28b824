#!/usr/bin/env python3
"""Every PromQL expression of the dashboards and the alert rules parses (promtool) and
names only metrics listed in metrics.txt (what the code exports)."""
import re
import tempfile

import yaml

from common import (ALERTS, dashboard_files, dashboard_queries, fail, grafana_to_promql, load_json,
                    load_yaml, metric_names_in, rule_exprs, run, series_names, tool)


def main():
    queries = []
    for path in dashboard_files():
        queries += [(f"{path.name} {where}", grafana_to_promql(e)) for where, e in dashboard_queries(load_json(path))]
    queries += [(f"{ALERTS.name} {where}", e) for where, e in rule_exprs(load_yaml(ALERTS))]

    problems = []
    if len(queries) < 20:
        problems.append(f"only {len(queries)} expressions found: is the extraction broken?")
    allowed = series_names()
    used = set()
    for where, expr in queries:
        names = metric_names_in(expr)
        if not names:
            problems.append(f"{where}: selects no metric: {expr}")
        for n in sorted(names - allowed):
            problems.append(f"{where}: metric {n} is not in metrics.txt")
        used |= names

    # Each expression becomes a recording rule; promtool parses them all.
    rules = {"groups": [{"name": "parse-check", "rules": [
        {"record": f"check:expr_{i}", "expr": e} for i, (_, e) in enumerate(queries)]}]}
    with tempfile.NamedTemporaryFile("w", suffix=".rules.yaml") as f:
        yaml.safe_dump(rules, f)
        f.flush()
        try:
            run([tool("promtool"), "check", "rules", f.name])
        except RuntimeError as e:
            problems.append(str(e))
            for n in sorted({int(n) for n in re.findall(r"rule (\d+),", str(e))}):
                problems.append(f"rule {n} is {queries[n - 1][0]}: {queries[n - 1][1]}")
    print(f"{len(queries)} expressions, {len(used)} distinct series names")
    fail(problems, "promql")


if __name__ == "__main__":
    main()
