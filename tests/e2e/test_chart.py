"""The operator as the Helm chart installs it, on the API stand-in.

`helm template` renders the chart; every object but the Deployment is applied as it is
(ServiceAccount, ClusterRole/Role and bindings, the metrics and telemetry Services); the
test then does what the Deployment's ReplicaSet would do and creates operator pods from
the rendered pod template, which the stand-in's kubelet runs. The pods keep the
rendered args except the port numbers, moved to free ones in the same ':PORT' form
(pods share one network here, and a Service's named targetPort follows them; the chart
is rendered with free Service ports too, and its args are checked against the render
with the chart's own ports). Two things are added: the command (the image's ENTRYPOINT)
and KUBECONFIG, a kubeconfig with the ServiceAccount's token from `kubectl create token`,
mounted from a Secret as a real cluster mounts credentials (never a host path: the test's
folder is under /tmp, where the pod has its emptyDir), because the stand-in serves plain
HTTP where the in-cluster config expects HTTPS. Every request of the operator is then
authorized by the rendered RBAC (tests/apiserver/auth.py) and readiness is the rendered
readinessProbe.

  ChartOperator.test_default_values        one replica: up, /healthz /readyz /metrics,
                                           a job Succeeded in a restricted namespace
  ChartOperator.test_namespaced_install    namespaces=[ns]: RoleBindings only, one namespace
  ChartOperator.test_rolling_update        replicaCount=2: followers are Ready, the
                                           leader is replaced, telemetry reaches the new one
  ChartOperator.test_rbac_rules_all_used   the lifecycle under RBAC: no 403, and every
                                           rendered rule used by some request

Run one:  PYTHONPATH=tests/pylib python3 tests/e2e/test_chart.py -v ChartOperator.test_rolling_update
"""
import calendar
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
import unittest
import urllib.error
import urllib.parse
import urllib.request

from edit_testing.cluster import GROUP, Cluster, Failure, job_manifest, unique
from edit_testing.data import make_data
from edit_testing.net import free_port
from edit_testing.paths import CRD, OPERATOR, ROOT, RUNTIME_DIR, find_kubectl
from edit_testing.unittest_main import main

CHART = os.path.join(ROOT, "charts", "edit-operator")
RELEASE, RELEASE_NS = "t", "edit-system"
# The operator pods' credentials: a Secret the test makes, mounted where a token would be.
KUBECONFIG_SECRET, KUBECONFIG_MOUNT = "t-test-kubeconfig", "/var/run/secrets/edit-test"
# The label the leader puts on its own pod, as the operator's code names it.
LEADER_LABEL = re.search(r'kLeaderLabel = "([^"]+)"', open(os.path.join(
    ROOT, "operator", "src", "leader", "lease.h")).read()).group(1)
ADDR_FLAGS = {"--metrics-addr": "metrics", "--health-addr": "health", "--grpc-addr": "telemetry"}
GANG_CRDS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "podgroup-crds.yaml")
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def find_helm():
    for cand in (os.environ.get("HELM"), os.path.join(ROOT, ".tools", "bin", "helm"), shutil.which("helm")):
        if cand and os.access(cand, os.X_OK):
            return cand
    return None


def http_get(url, timeout=5):
    try:
        with _NO_PROXY.open(url, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except OSError as e:
        return 0, str(e)


def render(*sets, free_ports=True):
    """helm template of the chart (release t in edit-system) as a list of objects. With
    free_ports the Services' ports are free ones (the stand-in's service proxy listens on
    them); the args keep their form (tests compare with the default render)."""
    import yaml
    cmd = [find_helm(), "template", RELEASE, CHART, "--namespace", RELEASE_NS]
    if free_ports:
        cmd += ["--set", ",".join("ports.%s=%d" % (role, free_port()) for role in ADDR_FLAGS.values())]
    for s in sets:
        cmd += ["--set", s]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise Failure("helm template failed: " + res.stderr)
    return [d for d in yaml.safe_load_all(res.stdout) if d]


def template_args(template):
    return template["spec"]["containers"][0]["args"]


def port_form(args):
    """The rendered args with each listen address's number replaced: what must stay equal
    when the test moves the ports."""
    flags = list(ADDR_FLAGS) + ["--telemetry-advertise-addr"]   # the last: the Service's port
    return [re.sub(r"^(%s)=(.*):\d+$" % "|".join(flags), r"\1=\2:PORT", a) for a in args]


class ChartOperator(unittest.TestCase):
    def setUp(self):
        missing = [what for what, ok in (
            ("helm (scripts/install-deps.sh)", find_helm()), ("kubectl", find_kubectl()),
            ("edit-operator (%s)" % OPERATOR, os.access(OPERATOR, os.X_OK)),
            ("edit-train", os.access(os.path.join(RUNTIME_DIR, "edit-train"), os.X_OK))) if not ok]
        try:
            import yaml  # noqa: F401
        except ImportError:
            missing.append("PyYAML (python3-yaml)")
        if missing:
            self.skipTest("missing: " + ", ".join(missing))
        # Under the system's temporary folder on purpose: the rendered pod mounts an
        # emptyDir at /tmp, and nothing the pod is given may be a host path that the
        # stand-in's kubelet would take for one inside that volume.
        self.c = Cluster(prefix="edit-chart-", tmp_dir=tempfile.gettempdir(),
                           path_prepend=[os.path.dirname(OPERATOR)])
        self.addCleanup(self.c.close)
        self.c.start_standin()
        self.c.kubectl("apply", "-f", CRD)
        self.c.kubectl("wait", "--for=condition=Established", "crd/editjobs.edit.io", "--timeout=30s")
        self.pods = {}          # operator pod name -> its ports
        self.serial = 0

    # ---- install ----------------------------------------------------------------------
    def install(self, docs, *sets):
        """Applies what the chart rendered with `sets` (but the Deployment) and prepares its
        pods. The args must be those of the same render with the chart's own ports."""
        self.docs = docs
        deps = [d for d in docs if d["kind"] == "Deployment"]
        self.assertEqual(len(deps), 1)
        self.deployment = deps[0]
        chart_ports = [d for d in render(*sets, free_ports=False) if d["kind"] == "Deployment"][0]
        self.assertEqual(port_form(template_args(self.deployment["spec"]["template"])),
                         port_form(template_args(chart_ports["spec"]["template"])))
        self.c.create_namespace(RELEASE_NS)
        rest = [d for d in docs if d["kind"] != "Deployment"]
        import yaml
        self.c.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(rest))
        sa = self.deployment["spec"]["template"]["spec"]["serviceAccountName"]
        token = self.c.kubectl("create", "token", sa, "-n", RELEASE_NS).stdout.strip()
        self.user = "system:serviceaccount:%s:%s" % (RELEASE_NS, sa)
        # The kubeconfig reaches the pod as a real cluster hands over credentials: a
        # Secret mounted read-only, never a path on the test's host.
        kubeconfig = ("apiVersion: v1\nkind: Config\ncurrent-context: c\n"
                      "clusters: [{name: c, cluster: {server: '%s'}}]\n"
                      "users: [{name: u, user: {token: '%s'}}]\n"
                      "contexts: [{name: c, context: {cluster: c, user: u, namespace: %s}}]\n"
                      % (self.c.url, token, RELEASE_NS))
        self.c.kubectl("create", "secret", "generic", KUBECONFIG_SECRET, "-n", RELEASE_NS,
                       "--from-literal=kubeconfig=" + kubeconfig)

    def start_operator_pod(self, revision="1"):
        """One pod of the Deployment's template (revision: a pod-template-hash stand-in)."""
        tmpl = json.loads(json.dumps(self.deployment["spec"]["template"]))
        self.serial += 1
        name = "%s-edit-operator-rev%s-%d" % (RELEASE, revision, self.serial)
        ports = {role: free_port() for role in ADDR_FLAGS.values()}
        c = tmpl["spec"]["containers"][0]
        c["command"] = ["edit-operator"]           # the image's ENTRYPOINT
        args = []
        for a in c["args"]:
            flag = a.split("=", 1)[0]
            if flag in ADDR_FLAGS:
                m = re.fullmatch(r"(.*=)(.*):(\d+)", a)
                self.assertIsNotNone(m, a)
                a = "%s%s:%d" % (m.group(1), m.group(2), ports[ADDR_FLAGS[flag]])
            args.append(a)
        self.assertEqual(port_form(args), port_form(c["args"]))
        c["args"] = args
        for p in c["ports"]:
            p["containerPort"] = ports[p["name"]]
        c["env"] = c.get("env", []) + [{"name": "KUBECONFIG", "value": KUBECONFIG_MOUNT + "/kubeconfig"}]
        c["volumeMounts"] = c.get("volumeMounts", []) + [
            {"name": "test-kubeconfig", "mountPath": KUBECONFIG_MOUNT, "readOnly": True}]
        tmpl["spec"]["volumes"] = tmpl["spec"].get("volumes", []) + [
            {"name": "test-kubeconfig", "secret": {"secretName": KUBECONFIG_SECRET}}]
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": dict(tmpl["metadata"], name=name, namespace=RELEASE_NS),
               "spec": tmpl["spec"]}
        pod["metadata"].setdefault("labels", {})["pod-template-hash"] = "rev" + revision
        self.c.kubectl("apply", "-f", "-", input=json.dumps(pod))
        self.pods[name] = ports
        return name

    def op_pod(self, name):
        code, body = self.c.api("GET", "/api/v1/namespaces/%s/pods/%s" % (RELEASE_NS, name))
        return body if code == 200 else None

    def pod_ip(self, name):
        return (self.op_pod(name) or {}).get("status", {}).get("podIP")

    def ready(self, name):
        pod = self.op_pod(name) or {}
        return any(c["type"] == "Ready" and c["status"] == "True" for c in pod.get("status", {}).get("conditions", []))

    def wait_ready(self, *names, timeout=60):
        self.c.wait_for(lambda: all(self.ready(n) for n in names), timeout, "operator pods %s Ready" % (names,))

    def endpoint(self, name, role, path):
        return "http://%s:%d%s" % (self.pod_ip(name), self.pods[name][role], path)

    def metrics(self, name):
        code, body = http_get(self.endpoint(name, "metrics", "/metrics"))
        return body if code == 200 else ""

    def leaders(self):
        """Operator pods that carry the leader label."""
        items = self.c.get("/api/v1/namespaces/%s/pods?labelSelector=%s" % (
            RELEASE_NS, urllib.parse.quote("%s=true" % LEADER_LABEL)))["items"]
        return sorted(p["metadata"]["name"] for p in items if not p["metadata"].get("deletionTimestamp"))

    def lease_holder_pod(self):
        """The operator pod whose process holds the Lease (identity hostname_pid)."""
        lease = self.c.get("/apis/coordination.k8s.io/v1/namespaces/%s/leases/%s-edit-operator" % (RELEASE_NS, RELEASE))
        holder = lease["spec"].get("holderIdentity") or ""
        pid = holder.rsplit("_", 1)[-1]
        procs = self.c.get("/standin/processes")
        for key, p in procs.items():
            ns, name = key.split("/", 1)
            if ns == RELEASE_NS and str(p["containers"].get("operator")) == pid:
                return name
        return None

    def wait_single_leader(self, among, timeout=60):
        def fn():
            holder = self.lease_holder_pod()
            labelled = self.leaders()
            if holder in among and labelled == [holder] and "edit_operator_leader 1" in self.metrics(holder):
                return holder
            return None
        return self.c.wait_for(fn, timeout, "one leader among %s (lease holder = labelled pod)" % (among,))

    def delete_pod(self, name):
        self.c.kubectl("delete", "pod", name, "-n", RELEASE_NS, "--wait=false")
        self.c.wait_for(lambda: self.op_pod(name) is None, 60, "operator pod %s gone" % name)
        self.pods.pop(name, None)

    def operator_logs(self):
        out = []
        for f in sorted(os.listdir(os.path.join(self.c.tmp, "kubelet", "pods"))):
            if f.startswith(RELEASE_NS + "_"):
                path = os.path.join(self.c.tmp, "kubelet", "pods", f, "operator.log")
                out.append("---- %s ----\n%s" % (f, Cluster.tail(path, 3000)))
        return "\n".join(out)

    def audit(self):
        return [e for e in self.c.get("/standin/audit") if e["user"] == self.user]

    def assert_no_forbidden(self):
        log = self.audit()
        self.assertGreater(len(log), 10, "the operator's requests did not go through RBAC")
        denied = [e for e in log if not e["allowed"]]
        self.assertEqual(denied, [], "requests of the operator outside its RBAC:\n%s" % self.operator_logs())

    # ---- jobs ---------------------------------------------------------------------------
    def training_job(self, ns, steps, name="tiny", debug=None):
        data = os.path.join(self.c.tmp, "data")
        if not os.path.isdir(data):
            os.makedirs(data)
            make_data(data)
        manifest = job_manifest(name, ns, data, os.path.join(self.c.tmp, "ckpt-" + name), free_port(),
                                  steps=steps, every=max(10, steps // 4), debug=debug)
        manifest["spec"]["training"]["logEvery"] = 5
        self.c.apply(manifest)
        return manifest

    # ---- the tests ----------------------------------------------------------------------
    def test_default_values(self):
        """Default values: the operator starts with the rendered args (':PORT' addresses),
        stays up, serves its endpoints and runs a job, whose pods meet the restricted Pod
        Security Standard, to Succeeded, without one request outside its RBAC."""
        self.install(render())
        args = template_args(self.deployment["spec"]["template"])
        for flag, role in ADDR_FLAGS.items():
            self.assertRegex(" ".join(args), r"%s=:\d+" % flag)
        op = self.start_operator_pod()
        self.wait_ready(op)
        for path, want in (("/healthz", "ok"), ("/readyz", "ok")):
            code, body = http_get(self.endpoint(op, "health", path))
            self.assertEqual((code, body.strip()), (200, want), path)
        self.assertEqual(self.wait_single_leader([op]), op)

        ns = unique("chart")
        self.c.create_namespace(ns)
        self.c.kubectl("label", "namespace", ns, "pod-security.kubernetes.io/enforce=restricted")
        self.training_job(ns, steps=40)
        job = self.c.wait_phase(ns, "tiny", ("Succeeded", "Failed"), 300)
        self.assertEqual(job["status"]["phase"], "Succeeded", "%s\n%s" % (job["status"], self.operator_logs()))
        self.assertEqual(job["status"]["progress"]["step"], 40, job["status"])   # telemetry came through the Service
        text = self.metrics(op)
        self.assertIn('edit_operator_jobs_succeeded_total 1', text)
        self.assertRegex(text, r'edit_worker_comm_wait_seconds_total\{[^}]*job="tiny"')
        pod = self.c.pods(ns, "tiny")[0]
        self.assertEqual(pod["spec"]["securityContext"]["seccompProfile"]["type"], "RuntimeDefault")
        self.assertEqual(self.op_pod(op)["status"]["containerStatuses"][0]["restartCount"], 0)
        self.assert_no_forbidden()

    def test_namespaced_install(self):
        """namespaces=[ns]: the ClusterRole is bound by a RoleBinding in that namespace only;
        the operator watches it alone, runs a job there without a refused request, and
        a job elsewhere stays untouched."""
        ns, other = unique("nsd"), unique("other")
        for n in (ns, other):
            self.c.create_namespace(n)
        self.install(render("namespaces={%s}" % ns), "namespaces={%s}" % ns)
        self.assertIn("--namespaces=" + ns, template_args(self.deployment["spec"]["template"]))
        op = self.start_operator_pod()
        self.wait_ready(op)
        self.wait_single_leader([op])
        for n in (ns, other):
            self.c.apply({"apiVersion": "edit.io/v1alpha1", "kind": "EDiTJob", "metadata": {"name": "short", "namespace": n},
                          "spec": {"replicas": 2, "image": "unused", "command": ["sh", "-c", "sleep 1"],
                                   "hangTimeoutSeconds": 0, "training": {"steps": 10}}})
        self.c.wait_phase(ns, "short", "Succeeded", 60)
        self.assertEqual(self.c.job(other, "short").get("status"), None)
        self.assertEqual(self.c.pods(other, "short"), [])
        scopes = {e["namespace"] for e in self.audit() if e["resource"] in ("editjobs", "pods") and e["verb"] == "watch"}
        self.assertEqual(scopes, {ns}, "the operator must watch only its namespace")
        self.assert_no_forbidden()

    def test_rolling_update(self):
        """replicaCount=2: both pods Ready though one leads; a rolling update replaces the
        leader first, a follower takes over and labels its pod, the workers' telemetry
        reaches it through the telemetry Service, and the job finishes."""
        self.install(render("replicaCount=2"), "replicaCount=2")
        a, b = self.start_operator_pod(), self.start_operator_pod()
        self.wait_ready(a, b)             # the follower too: readiness is not leadership
        first = self.wait_single_leader([a, b])
        ns = unique("roll")
        self.c.create_namespace(ns)
        # Paced (rank 0 sleeps 0.3 s a step, and the others wait for it at each sync) so
        # that the job outlives the hand-over however fast the runtime or slow the machine:
        # at least 144 s after step 20.
        self.training_job(ns, steps=500, debug={"injectStepDelay": {"rank": 0, "seconds": 0.3}})
        self.c.wait_step(ns, "tiny", 20, 240)

        # The Deployment's rolling update (maxSurge 1, maxUnavailable 0): a new pod, Ready,
        # then an old one goes; the leader first, so that leadership has to move.
        c = self.start_operator_pod(revision="2")
        self.wait_ready(c)
        self.assertEqual(self.leaders(), [first])
        old = [a, b]
        old.remove(first)
        handover = time.time()
        self.delete_pod(first)
        second = self.wait_single_leader([old[0], c], timeout=45)
        d = self.start_operator_pod(revision="2")
        self.wait_ready(d)
        if second == old[0]:              # still an old pod: it is replaced as well
            self.delete_pod(old[0])
            second = self.wait_single_leader([c, d], timeout=45)
        else:
            self.delete_pod(old[0])
        self.wait_ready(c, d)
        self.assertIn(second, (c, d))

        # Telemetry reaches the new leader: its own metrics have the job's workers, and the
        # job's progress moves on after the hand-over.
        def reported():
            st = self.c.job(ns, "tiny").get("status", {})
            t = st.get("lastReportTime", "")
            fresh = t and calendar.timegm(time.strptime(t, "%Y-%m-%dT%H:%M:%SZ")) > handover
            return st if fresh and re.search(r'edit_worker_step_seconds\{[^}]*job="tiny"', self.metrics(second)) else None
        st = self.c.wait_for(reported, 90, "reports of the job at the new leader %s" % second)
        job = self.c.wait_phase(ns, "tiny", ("Succeeded", "Failed"), 400)
        self.assertEqual(job["status"]["phase"], "Succeeded", "%s\n%s" % (job["status"], self.operator_logs()))
        self.assertEqual(job["status"]["progress"]["step"], 500, job["status"])
        self.assertEqual(job["status"].get("restarts", 0), 0, job["status"])
        self.assertEqual(self.leaders(), [second])
        self.assertTrue(self.ready(c) and self.ready(d))
        print("leader %s -> %s; last report after the hand-over: %s" % (first, second, st.get("lastReportTime")))
        self.assert_no_forbidden()

    def test_rbac_rules_all_used(self):
        """The operator's lifecycle under the chart's RBAC (gang scheduling and network
        policies on, so that their rules render): creation, in-place recovery, gang restart, suspend and
        resume, adoption of an orphan, a refused pod (FailedCreate), PodGroups, TTL
        deletion, events, the Lease and the leader label. No request is refused, and every
        (group, resource, verb) the rendered roles grant is used."""
        sets = ("replicaCount=2", "gangScheduling.volcano=true", "gangScheduling.coscheduling=true",
                "networkPolicy.enabled=true")
        self.install(render(*sets), *sets)
        self.c.kubectl("apply", "-f", GANG_CRDS)
        a, b = self.start_operator_pod(), self.start_operator_pod()
        self.wait_ready(a, b)
        self.wait_single_leader([a, b])
        ns = unique("rbac")
        self.c.create_namespace(ns)
        self.c.kubectl("label", "namespace", ns, "pod-security.kubernetes.io/enforce=restricted")

        def shell_job(name, script, replicas=2, **extra):
            spec = {"replicas": replicas, "image": "unused", "command": ["sh", "-c", script],
                    "hangTimeoutSeconds": 0, "training": {"steps": 10}}
            spec.update(extra)
            self.c.apply({"apiVersion": "edit.io/v1alpha1", "kind": "EDiTJob",
                          "metadata": {"name": name, "namespace": ns}, "spec": spec})

        # Recovery in place: rank 1's first incarnation fails once (its pod directory
        # holds no marker yet), its replacement runs.
        shell_job("life", "if [ $RANK = 1 ] && [ ! -e $STANDIN_POD_DIR/../marker-$EDIT_JOB ]; then "
                          "touch $STANDIN_POD_DIR/../marker-$EDIT_JOB; sleep 4; exit 1; fi; sleep 600")
        self.c.wait_for(lambda: self.c.job(ns, "life").get("status", {}).get("replicaRecoveries") == 1, 90,
                        "an in-place recovery")
        self.c.wait_phase(ns, "life", "Running", 90)
        # networkPolicy.enabled: the job's workers accept only each other and Prometheus.
        netpol = self.c.get("/apis/networking.k8s.io/v1/namespaces/%s/networkpolicies/life-workers" % ns)
        self.assertEqual(netpol["spec"]["podSelector"], {"matchLabels": {"edit.io/job-name": "life"}})
        self.assertEqual(netpol["spec"]["ingress"][1]["ports"], [{"port": 9400, "protocol": "TCP"}])
        # Adoption: a pod of the job loses its owner reference and is adopted again.
        pod = self.c.pods(ns, "life")[0]["metadata"]["name"]
        self.c.api("PATCH", "/api/v1/namespaces/%s/pods/%s" % (ns, pod), {"metadata": {"ownerReferences": None}},
                   ctype="application/merge-patch+json")
        self.c.wait_for(lambda: self.c.get("/api/v1/namespaces/%s/pods/%s" % (ns, pod))["metadata"].get(
            "ownerReferences"), 30, "orphan adopted")
        # Suspend and resume.
        for value, phase in ((True, "Suspended"), (False, "Running")):
            self.c.kubectl("patch", "ej", "life", "-n", ns, "--type=merge",
                           "-p", json.dumps({"spec": {"runPolicy": {"suspend": value}}}))
            self.c.wait_phase(ns, "life", phase, 90)
        # A gang restart.
        shell_job("gang", "if [ $EDIT_RESTART_GENERATION = 0 ] && [ $RANK = 0 ]; then sleep 2; exit 1; fi; sleep 600",
                  runPolicy={"replicaRecovery": "GangRestart"})
        self.c.wait_for(lambda: self.c.job(ns, "gang").get("status", {}).get("restarts") == 1, 90, "a gang restart")
        self.c.wait_phase(ns, "gang", "Running", 90)
        # A pod the namespace's Pod Security level refuses: a Warning event with the API's words.
        shell_job("root", "sleep 600", replicas=1, podTemplate={"spec": {"securityContext": {"runAsUser": 0}}})

        def failed_create():
            evs = self.c.get("/api/v1/namespaces/%s/events?fieldSelector=%s" % (
                ns, urllib.parse.quote("involvedObject.name=root")))["items"]
            return [e for e in evs if e["reason"] == "FailedCreate"]
        evs = self.c.wait_for(failed_create, 60, "a FailedCreate event")
        self.assertEqual(evs[0]["type"], "Warning")
        self.assertIn('violates PodSecurity "restricted:latest"', evs[0]["message"])
        self.assertIn("runAsUser=0", evs[0]["message"])
        # PodGroups for the gang schedulers (their pods stay Pending: no such scheduler here).
        shell_job("volcano", "sleep 600", replicas=1, schedulerName="volcano")
        shell_job("cosched", "sleep 600", replicas=1, schedulerName="scheduler-plugins-scheduler")
        for group, job in (("scheduling.volcano.sh/v1beta1", "volcano"), ("scheduling.x-k8s.io/v1alpha1", "cosched")):
            self.c.wait_for(lambda: self.c.api("GET", "/apis/%s/namespaces/%s/podgroups/%s" % (group, ns, job))[0] == 200,
                            60, "PodGroup %s/%s" % (group, job))
        # Resumed at another size: the group outlives the gang, and its minMember follows the
        # new world (a gang smaller than a stale minMember would wait forever).
        for group, job in (("scheduling.volcano.sh/v1beta1", "volcano"), ("scheduling.x-k8s.io/v1alpha1", "cosched")):
            path = "/apis/%s/namespaces/%s/podgroups/%s" % (group, ns, job)
            self.assertEqual(self.c.get(path)["spec"]["minMember"], 1)
            self.c.kubectl("patch", "ej", job, "-n", ns, "--type=merge",
                           "-p", json.dumps({"spec": {"runPolicy": {"suspend": True}}}))
            self.c.wait_phase(ns, job, "Suspended", 90)
            self.c.kubectl("patch", "ej", job, "-n", ns, "--type=merge",
                           "-p", json.dumps({"spec": {"replicas": 2, "runPolicy": {"suspend": False}}}))
            self.c.wait_for(lambda: self.c.get(path)["spec"].get("minMember") == 2, 90,
                            "PodGroup %s/%s minMember 2" % (group, job))
            self.c.wait_for(lambda: len(self.c.pods(ns, job)) == 2, 60, "2 pods of %s" % job)
        # TTL: a finished job deletes itself.
        shell_job("short", "exit 0", replicas=1, runPolicy={"ttlSecondsAfterFinished": 1})
        self.c.wait_for(lambda: self.c.api("GET", "%s/namespaces/%s/editjobs/short" % (GROUP, ns))[0] == 404,
                        90, "job short deleted after its TTL")
        self.delete_pod(a if self.leaders() == [a] else b)   # a clean hand-over: the Lease and the label move
        self.c.wait_for(lambda: len(self.leaders()) == 1, 60, "a new leader")

        self.assert_no_forbidden()
        used = {}
        for e in self.audit():
            for r in e["rules"]:
                used.setdefault((r["kind"], r["namespace"], r["name"], r["index"]), set()).add(
                    (e["group"], e["resource"], e["verb"]))
        unused = []
        for d in self.docs:
            if d["kind"] not in ("ClusterRole", "Role"):
                continue
            for i, rule in enumerate(d.get("rules", [])):
                key = (d["kind"], d["metadata"].get("namespace", ""), d["metadata"]["name"], i)
                for g in rule["apiGroups"]:
                    for res in rule["resources"]:
                        for verb in rule["verbs"]:
                            if (g, res, verb) not in used.get(key, set()):
                                unused.append("%s %s rule %d: %s %s/%s" % (d["kind"], d["metadata"]["name"], i,
                                                                          verb, g or "core", res))
        self.assertEqual(unused, [], "granted but never used (least privilege):\n  " + "\n  ".join(unused))
        print("%d authorized requests of %s; every rule used" % (len(self.audit()), self.user))


if __name__ == "__main__":
    main()
