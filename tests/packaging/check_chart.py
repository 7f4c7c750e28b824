#!/usr/bin/env python3
"""Renders the Helm chart with default and non-default values and checks the objects:
valid YAML, the Deployment's flags, probes and security settings, least-privilege RBAC
(no wildcards, exactly the rules the operator needs: tests/e2e/test_chart.py proves each is
used under the stand-in's RBAC), Services, the optional Prometheus Operator resources, the
dashboards ConfigMap, NOTES.txt, the telemetry TLS wiring, and the chart as a dependency
of another chart (global values, name overrides)."""
import json
import tempfile
from pathlib import Path

from common import (ALERTS, CHART, FULL_VALUES, ROOT, dashboard_files, fail, helm_template, load_json,
                    load_yaml, load_yaml_docs, run, tool)

JOB_RULES = {
    ("edit.io", "editjobs"): {"get", "list", "watch", "delete"},
    ("edit.io", "editjobs/status"): {"update"},
    ("edit.io", "editjobs/finalizers"): {"update"},
    ("", "pods"): {"list", "watch", "create", "delete", "patch"},
    ("", "services"): {"create", "get"},
    ("", "configmaps"): {"create", "get"},
    ("", "events"): {"create"},
}
PODGROUP_RULES = {
    ("scheduling.volcano.sh", "podgroups"): {"create", "get", "patch"},
    ("scheduling.x-k8s.io", "podgroups"): {"create", "get", "patch"},
}
NETWORKPOLICY_RULES = {("networking.k8s.io", "networkpolicies"): {"create", "get"}}
# The telemetry tokens: only where jobs run (a Role per watched namespace).
SECRET_RULES = {("", "secrets"): {"get", "create"}}
# In the release namespace: the Lease, and the leader's label on its own pod.
LEASE_RULES = {("coordination.k8s.io", "leases"): {"get", "create", "update"}, ("", "pods"): {"patch"}}
def leader_label():
    """The label the leader puts on its pod, as the operator's code names it (one source)."""
    import re
    m = re.search(r'kLeaderLabel = "([^"]+)"', (ROOT / "operator" / "src" / "leader" / "lease.h").read_text())
    return m.group(1)


LEADER_LABEL = leader_label()
MONITORING_KINDS = {"ServiceMonitor", "PodMonitor", "PrometheusRule"}


def by_kind(docs, kind):
    return [d for d in docs if d["kind"] == kind]


def flatten_rules(role):
    out = {}
    for r in role.get("rules", []):
        for g in r.get("apiGroups", []):
            for res in r.get("resources", []):
                out.setdefault((g, res), set()).update(r.get("verbs", []))
    return out


def check_deployment(docs, values, problems):
    deps = by_kind(docs, "Deployment")
    if len(deps) != 1:
        problems.append(f"{len(deps)} Deployments, want 1")
        return
    pod = deps[0]["spec"]["template"]["spec"]
    c = pod["containers"][0]
    psc, csc = pod.get("securityContext", {}), c.get("securityContext", {})
    if not (psc.get("runAsNonRoot") or csc.get("runAsNonRoot")):
        problems.append("Deployment: runAsNonRoot not set")
    if (csc.get("seccompProfile") or psc.get("seccompProfile") or {}).get("type") != "RuntimeDefault":
        problems.append("Deployment: seccompProfile RuntimeDefault not set")
    if csc.get("readOnlyRootFilesystem") is not True:
        problems.append("Deployment: readOnlyRootFilesystem not true")
    if csc.get("allowPrivilegeEscalation") is not False:
        problems.append("Deployment: allowPrivilegeEscalation not false")
    if "ALL" not in (csc.get("capabilities") or {}).get("drop", []):
        problems.append("Deployment: capabilities do not drop ALL")
    ports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
    if ports != {"metrics": 8080, "health": 8081, "telemetry": 9090}:
        problems.append(f"Deployment: container ports {ports}")
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        get = (c.get(probe) or {}).get("httpGet", {})
        if get.get("path") != path or get.get("port") not in ("health", 8081):
            problems.append(f"Deployment: {probe} must GET {path} on the health port, is {get}")
    args = c.get("args", [])
    for flag in ("--namespaces=" + ",".join(values.get("namespaces", [])), "--metrics-addr=:8080",
                 "--health-addr=:8081", "--grpc-addr=:9090", "--log-level=" + values.get("logLevel", "info"),
                 "--telemetry-advertise-addr=t-edit-operator-telemetry.edit-system.svc:9090"):
        if flag not in args:
            problems.append(f"Deployment: argument {flag} missing from {args}")
    # Always: a rolling update runs two pods at once even with replicaCount 1.
    for flag in ("--leader-elect", "--lease-namespace=edit-system"):
        if flag not in args:
            problems.append(f"Deployment: {flag} missing from {args}")
    env = {e["name"]: e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") for e in c.get("env", [])}
    if env.get("POD_NAME") != "metadata.name" or env.get("POD_NAMESPACE") != "metadata.namespace":
        problems.append(f"Deployment: POD_NAME/POD_NAMESPACE from the downward API are needed (the leader labels its pod): {env}")
    if not c.get("resources", {}).get("requests"):
        problems.append("Deployment: no resource requests")
    check_telemetry_tls(pod, c, args, values.get("telemetry", {}).get("tls", {}), problems)


TLS_DIR = "/etc/edit-operator/telemetry-tls"


def check_telemetry_tls(pod, c, args, tls, problems):
    """telemetry.tls.enabled: the cert/key Secret mounted read-only, the flags pointing into
    it, the workers' CA Secret passed on; disabled: none of it."""
    tls_args = sorted(a for a in args if a.startswith("--telemetry-tls-"))
    mounts = [m for m in c.get("volumeMounts", []) if m["name"] == "telemetry-tls"]
    volumes = [v for v in pod.get("volumes", []) if v["name"] == "telemetry-tls"]
    if not tls.get("enabled"):
        if tls_args or mounts or volumes:
            problems.append(f"Deployment: telemetry TLS is off but renders {tls_args}, {mounts}, {volumes}")
        return
    want = sorted([f"--telemetry-tls-cert={TLS_DIR}/tls.crt", f"--telemetry-tls-key={TLS_DIR}/tls.key",
                   f"--telemetry-tls-ca-secret={tls['workerCaSecret']}"])
    if tls_args != want:
        problems.append(f"Deployment: telemetry TLS arguments {tls_args}, want {want}")
    if mounts != [{"name": "telemetry-tls", "mountPath": TLS_DIR, "readOnly": True}]:
        problems.append(f"Deployment: telemetry TLS mount {mounts}")
    secret = (volumes[0].get("secret") or {}) if len(volumes) == 1 else {}
    if secret.get("secretName") != tls["secretName"] or sorted(i["key"] for i in secret.get("items", [])) != [
            "tls.crt", "tls.key"]:
        problems.append(f"Deployment: telemetry TLS volume {volumes}, want tls.crt/tls.key of {tls['secretName']}")


def check_tls_values_required(problems):
    """Turning TLS on without naming the Secrets fails rendering, naming the missing value."""
    for sets, missing in (("telemetry.tls.enabled=true,telemetry.tls.workerCaSecret=ca", "telemetry.tls.secretName"),
                          ("telemetry.tls.enabled=true,telemetry.tls.secretName=tls", "telemetry.tls.workerCaSecret")):
        try:
            helm_template(None, ["--set", sets])
            problems.append(f"--set {sets} rendered; it must fail naming {missing}")
        except RuntimeError as e:
            if f"{missing} is required" not in str(e):
                problems.append(f"--set {sets} failed without naming {missing}: {str(e)[-300:]}")


def check_rbac(docs, values, problems):
    for d in docs:
        if d["kind"] in ("ClusterRole", "Role"):
            for r in d.get("rules", []):
                for key in ("verbs", "resources", "apiGroups"):
                    if "*" in r.get(key, []):
                        problems.append(f"{d['kind']} {d['metadata']['name']}: wildcard in {key}")
    want = dict(JOB_RULES)
    gang = values.get("gangScheduling", {})
    if gang.get("volcano"):
        want[("scheduling.volcano.sh", "podgroups")] = PODGROUP_RULES[("scheduling.volcano.sh", "podgroups")]
    if gang.get("coscheduling"):
        want[("scheduling.x-k8s.io", "podgroups")] = PODGROUP_RULES[("scheduling.x-k8s.io", "podgroups")]
    if values.get("networkPolicy", {}).get("enabled"):
        want.update(NETWORKPOLICY_RULES)
    namespaces = values.get("namespaces", [])
    roles = {r["metadata"]["name"].rsplit("-", 1)[-1]: r for r in by_kind(docs, "ClusterRole")}
    if sorted(roles) != (["jobs"] if namespaces else ["jobs", "secrets"]) or flatten_rules(roles["jobs"]) != want:
        problems.append(f"ClusterRoles {sorted(roles)}: rules {[flatten_rules(r) for r in roles.values()]}, want "
                        f"{want}" + ("" if namespaces else f" and {SECRET_RULES}"))
    if not namespaces and "secrets" in roles and flatten_rules(roles["secrets"]) != SECRET_RULES:
        problems.append(f"Secrets ClusterRole {flatten_rules(roles['secrets'])}, want {SECRET_RULES}")
    leases = [r for r in by_kind(docs, "Role") if r["metadata"]["name"].endswith("-leader-election")]
    if len(leases) != 1 or flatten_rules(leases[0]) != LEASE_RULES or leases[0]["metadata"]["namespace"] != "edit-system":
        problems.append(f"leader election Role: {[flatten_rules(r) for r in leases]}, want {LEASE_RULES} in edit-system")
    secret_roles = [r for r in by_kind(docs, "Role") if r["metadata"]["name"].endswith("-secrets")]
    if sorted(r["metadata"]["namespace"] for r in secret_roles) != sorted(namespaces) or \
            any(flatten_rules(r) != SECRET_RULES for r in secret_roles):
        problems.append(f"Secrets Roles in {[r['metadata']['namespace'] for r in secret_roles]}, want {SECRET_RULES} "
                        f"in each of {namespaces} and nowhere else")
    crbs, rbs = by_kind(docs, "ClusterRoleBinding"), by_kind(docs, "RoleBinding")
    job_rbs = sorted(b["metadata"]["namespace"] for b in rbs if b["roleRef"]["kind"] == "ClusterRole")
    secret_rbs = sorted(b["metadata"]["namespace"] for b in rbs if b["roleRef"]["name"].endswith("-secrets"))
    if namespaces:
        if crbs or job_rbs != sorted(namespaces) or secret_rbs != sorted(namespaces):
            problems.append(f"with namespaces {namespaces}: job RoleBindings in {job_rbs}, Secrets RoleBindings in "
                            f"{secret_rbs}, ClusterRoleBindings {len(crbs)}")
    elif sorted(b["roleRef"]["name"].rsplit("-", 1)[-1] for b in crbs) != ["jobs", "secrets"] or job_rbs or secret_rbs:
        problems.append("without namespaces: ClusterRoleBindings for the jobs and the Secrets ClusterRoles and no "
                        "RoleBindings to them expected")
    sa = [d["metadata"]["name"] for d in by_kind(docs, "ServiceAccount")]
    for b in crbs + rbs:
        if [s["name"] for s in b["subjects"]] != sa:
            problems.append(f"{b['kind']} {b['metadata']['name']} binds {b['subjects']}, not the ServiceAccount {sa}")


def check_services(docs, problems):
    ports = sorted(p["port"] for s in by_kind(docs, "Service") for p in s["spec"]["ports"])
    if ports != [8080, 9090]:
        problems.append(f"Services expose ports {ports}, want metrics 8080 and telemetry 9090")
    pod_labels = by_kind(docs, "Deployment")[0]["spec"]["template"]["metadata"]["labels"]
    for svc in by_kind(docs, "Service"):
        sel = svc["spec"]["selector"]
        telemetry = svc["metadata"]["name"].endswith("-telemetry")
        # Telemetry goes to the leader only (it alone knows the jobs' tokens); metrics to every replica.
        if telemetry and sel.get(LEADER_LABEL) != "true":
            problems.append(f"Service {svc['metadata']['name']}: selector {sel} must require {LEADER_LABEL}=true")
        rest = {k: v for k, v in sel.items() if k != LEADER_LABEL}
        if not telemetry and LEADER_LABEL in sel:
            problems.append(f"Service {svc['metadata']['name']}: selects only the leader: {sel}")
        if any(pod_labels.get(k) != v for k, v in rest.items()):
            problems.append(f"Service {svc['metadata']['name']}: selector {sel} does not match the pods {pod_labels}")


def check_monitoring(docs, want, problems):
    kinds = {d["kind"] for d in docs} & MONITORING_KINDS
    if kinds != (MONITORING_KINDS if want else set()):
        problems.append(f"Prometheus Operator resources {sorted(kinds)}, expected {'all' if want else 'none'}")
    for rule in by_kind(docs, "PrometheusRule"):
        if rule["spec"] != load_yaml(ALERTS):
            problems.append("PrometheusRule groups differ from deploy/prometheus/edit-alerts.rules.yaml")
    for sm in by_kind(docs, "ServiceMonitor") + by_kind(docs, "PodMonitor"):
        eps = sm["spec"].get("endpoints") or sm["spec"].get("podMetricsEndpoints")
        if not all(e.get("honorLabels") for e in eps):
            problems.append(f"{sm['kind']}: honorLabels must be true (keep the job/namespace labels of the metrics)")


def check_dashboards(docs, problems):
    cms = [d for d in by_kind(docs, "ConfigMap") if d["metadata"]["name"].endswith("-dashboards")]
    if len(cms) != 1:
        problems.append(f"{len(cms)} dashboard ConfigMaps, want 1")
        return
    cm = cms[0]
    if cm["metadata"].get("labels", {}).get("grafana_dashboard") != "1":
        problems.append("dashboard ConfigMap lacks the label grafana_dashboard: \"1\"")
    files = {p.name: load_json(p) for p in dashboard_files()}
    got = {k: json.loads(v) for k, v in cm.get("data", {}).items()}
    if got != files:
        problems.append(f"dashboard ConfigMap holds {sorted(got)}, differing from dashboards/ {sorted(files)}")


def check_notes(values_file, problems):
    args = [tool("helm"), "install", "t", CHART, "--dry-run=client", "--namespace", "edit-system"]
    if values_file:
        args += ["-f", values_file]
    out = run(args)
    notes = out.split("NOTES:", 1)[1] if "NOTES:" in out else ""
    for want in ("kubectl apply -f examples/cluster/storage.yaml", "kubectl apply -f examples/cluster/prepare-data.yaml",
                 "kubectl apply -f examples/cluster/editjob-aedit.yaml", "kubectl get ej -w"):
        if want not in notes:
            problems.append(f"NOTES.txt does not say '{want}'")


def check_as_dependency(problems):
    """The chart as a dependency of another chart: Helm hands it the parent's global values
    (values.schema.json must accept them), and nameOverride/fullnameOverride rename it."""
    with tempfile.TemporaryDirectory() as d:
        parent = Path(d) / "parent"
        (parent / "charts").mkdir(parents=True)
        (parent / "Chart.yaml").write_text(
            "apiVersion: v2\nname: parent\nversion: 1.0.0\n"
            "dependencies:\n  - name: edit-operator\n    version: '>=0.0.0'\n")
        (parent / "values.yaml").write_text(
            "global:\n  imageRegistry: registry.example\n"
            "edit-operator:\n  nameOverride: trainer\n  fullnameOverride: ml-trainer\n")
        try:
            run([tool("helm"), "package", CHART, "--destination", parent / "charts"])
            docs = load_yaml_docs(run([tool("helm"), "template", "rel", parent, "--namespace", "ml"]))
        except RuntimeError as e:
            problems.append(f"as a dependency with global values: {str(e)[-500:]}")
            return
    deps = by_kind(docs, "Deployment")
    names = sorted(d["metadata"]["name"] for d in docs if d["kind"] in ("Deployment", "ServiceAccount", "ClusterRole"))
    if names != ["ml-trainer", "ml-trainer", "ml-trainer-jobs", "ml-trainer-secrets"]:
        problems.append(f"as a dependency: fullnameOverride ml-trainer not used: {names}")
    if deps and deps[0]["metadata"]["labels"].get("app.kubernetes.io/name") != "trainer":
        problems.append(f"as a dependency: nameOverride trainer not in the labels {deps[0]['metadata']['labels']}")


def check_docs(docs, problems):
    for d in docs:
        if not isinstance(d, dict) or not d.get("apiVersion") or not d.get("kind") or not d.get("metadata", {}).get("name"):
            problems.append(f"rendered document without apiVersion/kind/name: {str(d)[:100]}")


def main():
    problems = []
    full = load_yaml(FULL_VALUES)
    tls_only = {"telemetry": {"tls": {"enabled": True, "secretName": "op-tls", "workerCaSecret": "op-ca"}}}
    cases = [("default", None, {}, [], False),
             ("full", FULL_VALUES, full, [], True),
             ("telemetry TLS", None, tls_only,
              ["--set", "telemetry.tls.enabled=true,telemetry.tls.secretName=op-tls,telemetry.tls.workerCaSecret=op-ca"],
              False),
             ("default, cluster with Prometheus Operator", None, {}, ["--api-versions", "monitoring.coreos.com/v1"], True)]
    for name, values_file, values, extra, monitoring in cases:
        before = len(problems)
        docs = helm_template(values_file, extra)
        check_docs(docs, problems)
        check_deployment(docs, values, problems)
        check_rbac(docs, values, problems)
        check_services(docs, problems)
        check_monitoring(docs, monitoring, problems)
        check_dashboards(docs, problems)
        problems[before:] = [f"[{name}] {p}" for p in problems[before:]]
        print(f"[{name}] {len(docs)} objects: {sorted({d['kind'] for d in docs})}")
    docs = load_yaml_docs(run([tool("helm"), "template", "t", CHART, "--include-crds"]))
    crds = by_kind(docs, "CustomResourceDefinition")
    if [c["metadata"]["name"] for c in crds] != ["editjobs.edit.io"]:
        problems.append(f"--include-crds renders {[c['metadata']['name'] for c in crds]}")
    check_tls_values_required(problems)
    check_as_dependency(problems)
    check_notes(None, problems)
    check_notes(FULL_VALUES, problems)
    fail(problems, "chart")


if __name__ == "__main__":
    main()
