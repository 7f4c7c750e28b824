#!/usr/bin/env python3
"""The Grafana dashboards: valid JSON, schemaVersion 39, the datasource / namespace / job
variables, every panel on the datasource variable, a sane grid, the panels each dashboard
promises, and every exported metric shown somewhere."""

from common import dashboard_files, dashboard_queries, exported_metrics, fail, load_json, metric_names_in

DS_UID = "${datasource}"

# Series each dashboard must query (what its panels promise), and panel types it must have.
REQUIRED = {
    "edit-jobs.json": {
        "series": ["edit_job_loss", "edit_job_tokens_per_second", "edit_job_step", "edit_job_phase",
                   "edit_job_restarts_total", "edit_job_sync_seconds", "edit_sync_seconds_bucket"],
        "types": ["timeseries", "stat", "state-timeline"],
    },
    "edit-workers.json": {
        "series": ["edit_worker_step_seconds", "edit_train_step_seconds_bucket", "edit_worker_straggler_score",
                   "edit_worker_last_report_age_seconds", "edit_comm_wait_seconds_total", "edit_comm_bytes_total",
                   "edit_pseudo_grad_anomalies_total", "edit_pseudo_grad_norm"],
        "types": ["timeseries", "heatmap"],
    },
    "edit-operator.json": {
        "series": ["edit_operator_reconcile_total", "edit_operator_reconcile_seconds_bucket",
                   "edit_operator_jobs_created_total", "edit_operator_jobs_succeeded_total",
                   "edit_operator_jobs_failed_total", "edit_operator_jobs_restarted_total", "edit_operator_leader"],
        "types": ["timeseries", "stat"],
    },
}


def leaf_panels(panels):
    for p in panels:
        if p.get("type") == "row":
            yield from leaf_panels(p.get("panels", []))
        else:
            yield p


def check_variables(name, d, problems):
    vars_ = {v.get("name"): v for v in d.get("templating", {}).get("list", [])}
    ds = vars_.get("datasource")
    if not ds or ds.get("type") != "datasource" or ds.get("query") != "prometheus":
        problems.append(f"{name}: needs a 'datasource' variable of type datasource, query prometheus")
    for v in ("namespace", "job"):
        var = vars_.get(v)
        if not var or var.get("type") != "query":
            problems.append(f"{name}: needs a '{v}' query variable")
        elif (var.get("datasource") or {}).get("uid") != DS_UID:
            problems.append(f"{name}: variable {v} must use the datasource variable")


def check_grid(name, panels, problems):
    cells = {}
    for p in panels:
        g = p.get("gridPos") or {}
        if not all(k in g for k in "xywh") or g["x"] < 0 or g["x"] + g["w"] > 24:
            problems.append(f"{name}: panel {p.get('id')} has a bad gridPos {g}")
            continue
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                if (x, y) in cells:
                    problems.append(f"{name}: panels {cells[(x, y)]} and {p.get('id')} overlap")
                    return
                cells[(x, y)] = p.get("id")


def check_dashboard(path, problems):
    name = path.name
    d = load_json(path)
    if d.get("schemaVersion") != 39:
        problems.append(f"{name}: schemaVersion must be 39, is {d.get('schemaVersion')}")
    for key in ("uid", "title"):
        if not d.get(key):
            problems.append(f"{name}: no {key}")
    check_variables(name, d, problems)
    all_panels = list(d.get("panels", []))
    for row in d.get("panels", []):
        all_panels += row.get("panels", [])
    ids = [p.get("id") for p in all_panels]
    if len(ids) != len(set(ids)):
        problems.append(f"{name}: duplicate panel ids")
    check_grid(name, all_panels, problems)
    panels = list(leaf_panels(d.get("panels", [])))
    for p in panels:
        where = f"{name}: panel {p.get('id')} '{p.get('title')}'"
        if (p.get("datasource") or {}).get("uid") != DS_UID:
            problems.append(f"{where}: datasource must be {DS_UID}")
        if not p.get("targets"):
            problems.append(f"{where}: no queries")
        for t in p.get("targets", []):
            if (t.get("datasource") or {}).get("uid", DS_UID) != DS_UID:
                problems.append(f"{where}: target {t.get('refId')} not on {DS_UID}")
        if not p.get("description"):
            problems.append(f"{where}: no description")
    series = set()
    for _, e in dashboard_queries(d):
        series |= metric_names_in(e)
    req = REQUIRED.get(name)
    if req is None:
        problems.append(f"{name}: unknown dashboard (add it to REQUIRED in {__file__})")
        return series
    for s in req["series"]:
        if s not in series:
            problems.append(f"{name}: no panel queries {s}")
    types = {p.get("type") for p in panels}
    for t in req["types"]:
        if t not in types:
            problems.append(f"{name}: no {t} panel")
    if name == "edit-workers.json":
        score = [p for p in panels if any("edit_worker_straggler_score" in t.get("expr", "") for t in p["targets"])]
        ok = any(
            any(s.get("value") is not None for s in p["fieldConfig"]["defaults"].get("thresholds", {}).get("steps", []))
            and p["fieldConfig"]["defaults"].get("custom", {}).get("thresholdsStyle", {}).get("mode", "off") != "off"
            for p in score)
        if not ok:
            problems.append(f"{name}: the straggler score panel must draw the threshold line")
    return series


def main():
    problems = []
    files = dashboard_files()
    if {p.name for p in files} != set(REQUIRED):
        problems.append(f"dashboards/ must hold {sorted(REQUIRED)}, holds {[p.name for p in files]}")
    shown = set()
    uids = []
    for path in files:
        try:
            shown |= check_dashboard(path, problems)
            uids.append(load_json(path).get("uid"))
        except ValueError as e:
            problems.append(f"{path.name}: not valid JSON: {e}")
    if len(uids) != len(set(uids)):
        problems.append("dashboard uids are not unique")
    names, histograms = exported_metrics()
    for m in sorted(names):
        variants = {m} | ({m + "_bucket", m + "_sum", m + "_count"} if m in histograms else set())
        if not variants & shown:
            problems.append(f"metric {m} is on no dashboard")
    fail(problems, "dashboards")


if __name__ == "__main__":
    main()
