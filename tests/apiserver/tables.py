"""meta.k8s.io/v1 Table rendering (what `kubectl get` prints) and the small
JSONPath subset used by additionalPrinterColumns."""
import datetime
import re

_SEG = re.compile(r"\.([A-Za-z0-9_-]+)|\[(\d+|\*)\]|\[\?\(@\.([A-Za-z0-9_.-]+)\s*==\s*"
                  r"['\"]([^'\"]*)['\"]\)\]|\['([^']+)'\]")


def jsonpath(obj, expr):
    """First value of a simple JSONPath (.a.b, [0], [*], [?(@.k=="v")], ['a.b'])."""
    expr = expr.strip()
    if expr.startswith("{") and expr.endswith("}"):
        expr = expr[1:-1]
    if expr.startswith("$"):
        expr = expr[1:]
    values, pos = [obj], 0
    while pos < len(expr):
        m = _SEG.match(expr, pos)
        if not m:
            return None
        pos = m.end()
        field, index, fkey, fval, quoted = m.groups()
        nxt = []
        for v in values:
            if (field or quoted) and isinstance(v, dict) and (field or quoted) in v:
                nxt.append(v[field or quoted])
            elif index is not None and isinstance(v, list):
                if index == "*":
                    nxt.extend(v)
                elif int(index) < len(v):
                    nxt.append(v[int(index)])
            elif fkey and isinstance(v, list):
                for item in v:
                    if isinstance(item, dict) and str(_dig(item, fkey)) == fval:
                        nxt.append(item)
        values = nxt
    return values[0] if values else None


def _dig(obj, dotted):
    for part in dotted.split("."):
        obj = obj.get(part) if isinstance(obj, dict) else None
    return obj


def parse_time(ts):
    try:
        return datetime.datetime.strptime(ts, "%Y-%m-%dT%H:%M:%SZ").replace(
            tzinfo=datetime.timezone.utc)
    except (TypeError, ValueError):
        return None


def human_age(ts):
    """Like apimachinery's duration.HumanDuration."""
    t = parse_time(ts)
    if t is None:
        return "<unknown>"
    s = int((datetime.datetime.now(datetime.timezone.utc) - t).total_seconds())
    if s < 0:
        s = 0
    if s < 120:
        return "%ds" % s
    m = s // 60
    if m < 10:
        return "%dm%ds" % (m, s % 60) if s % 60 else "%dm" % m
    if m < 180:
        return "%dm" % m
    h = m // 60
    if h < 8:
        return "%dh%dm" % (h, m % 60) if m % 60 else "%dh" % h
    if h < 48:
        return "%dh" % h
    d = h // 24
    if d < 8:
        return "%dd%dh" % (d, h % 24) if h % 24 else "%dd" % d
    return "%dd" % d if d < 730 else "%dy" % (d // 365)


def _col(name, ctype="string", desc="", priority=0, fmt=""):
    return {"name": name, "type": ctype, "format": fmt, "description": desc,
            "priority": priority}


NAME = _col("Name", fmt="name", desc="Name must be unique within a namespace.")
AGE = _col("Age", desc="CreationTimestamp is a timestamp representing the server time "
                       "when this object was created.")


def _pod_status(pod):
    st = pod.get("status") or {}
    reason = st.get("reason") or st.get("phase") or "Unknown"
    for cs in st.get("containerStatuses") or []:
        state = cs.get("state") or {}
        if "waiting" in state and state["waiting"].get("reason"):
            reason = state["waiting"]["reason"]
        elif "terminated" in state:
            t = state["terminated"]
            reason = t.get("reason") or ("Signal:%s" % t["signal"] if t.get("signal")
                                         else "ExitCode:%s" % t.get("exitCode"))
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        reason = "Terminating"
    return reason


def _pod_cells(pod):
    st = pod.get("status") or {}
    css = st.get("containerStatuses") or []
    total = len((pod.get("spec") or {}).get("containers") or [])
    ready = sum(1 for c in css if c.get("ready"))
    restarts = sum(c.get("restartCount", 0) for c in css)
    return ["%d/%d" % (ready, total), _pod_status(pod), restarts,
            human_age(pod["metadata"].get("creationTimestamp")),
            st.get("podIP") or "<none>", (pod.get("spec") or {}).get("nodeName") or "<none>",
            "<none>", "<none>"]


def _service_cells(svc):
    spec = svc.get("spec") or {}
    ports = ",".join("%s/%s" % (p.get("port"), p.get("protocol", "TCP"))
                     for p in spec.get("ports") or []) or "<none>"
    return [spec.get("type", "ClusterIP"), spec.get("clusterIP") or "<none>", "<none>", ports,
            human_age(svc["metadata"].get("creationTimestamp"))]


BUILTIN = {
    "/pods": ([_col("Ready"), _col("Status"), _col("Restarts", "integer"), AGE,
               _col("IP", priority=1), _col("Node", priority=1),
               _col("Nominated Node", priority=1), _col("Readiness Gates", priority=1)],
              _pod_cells),
    "/services": ([_col("Type"), _col("Cluster-IP"), _col("External-IP"), _col("Port(s)"),
                   AGE], _service_cells),
    "/namespaces": ([_col("Status"), AGE],
                    lambda o: [(o.get("status") or {}).get("phase", "Active"),
                               human_age(o["metadata"].get("creationTimestamp"))]),
    "/configmaps": ([_col("Data", "integer"), AGE],
                    lambda o: [len(o.get("data") or {}) + len(o.get("binaryData") or {}),
                               human_age(o["metadata"].get("creationTimestamp"))]),
    "/nodes": ([_col("Status"), _col("Roles"), AGE, _col("Version")],
               lambda o: ["Ready", "<none>", human_age(o["metadata"].get("creationTimestamp")),
                          ((o.get("status") or {}).get("nodeInfo") or {}).get(
                              "kubeletVersion", "")]),
}


def _format_cell(value, ctype):
    if value is None:
        return None
    if ctype == "date":
        return human_age(value) if isinstance(value, str) else value
    if ctype == "integer" and isinstance(value, float) and value.is_integer():
        return int(value)
    if ctype == "string" and not isinstance(value, str):
        return value if isinstance(value, (int, float, bool)) else str(value)
    return value


def _custom(rt):
    cols, paths = [], []
    for c in rt.printer_columns:
        cols.append(_col(c.get("name"), c.get("type", "string"), c.get("description", ""),
                         c.get("priority", 0), c.get("format", "")))
        paths.append((c.get("jsonPath", ""), c.get("type", "string")))
    if not any(c["name"] == "Age" for c in cols):
        cols.append(_col("Age", "date", AGE["description"]))
        paths.append((".metadata.creationTimestamp", "date"))

    def cells(obj):
        return [_format_cell(jsonpath(obj, p), t) for p, t in paths]
    return cols, cells


def columns_for(rt):
    if rt.crd_name:
        return _custom(rt)
    if rt.key in BUILTIN:
        return BUILTIN[rt.key]
    return [AGE], lambda o: [human_age(o["metadata"].get("creationTimestamp"))]


def row_object(obj, include):
    if include == "None":
        return None
    if include == "Object":
        return obj
    return {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
            "metadata": obj.get("metadata") or {}}


def table(rt, objs, include="Metadata", rv=None, cont=None):
    cols, cells = columns_for(rt)
    rows = []
    for obj in objs:
        row = {"cells": [obj["metadata"]["name"]] + cells(obj)}
        ro = row_object(obj, include)
        if ro is not None:
            row["object"] = ro
        rows.append(row)
    md = {}
    if rv:
        md["resourceVersion"] = rv
    if cont:
        md["continue"] = cont
    return {"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": md,
            "columnDefinitions": [NAME] + cols, "rows": rows}
