"""End-to-end tests: real kubectl -> the API stand-in -> edit-operator -> worker pods
(edit-train processes run by the stand-in's kubelet) -> Succeeded; invalid manifests
rejected by kubectl apply; a real Prometheus scraping the operator and the workers, and
every dashboard and alert-rule query evaluated against what it scraped.

Run one case:  python3 tests/e2e/test_e2e.py -v KubectlFlow.test_job_succeeds
(EDIT_BUILD_DIR selects the build; EDIT_KEEP_TMP=1 keeps the temp dirs for a look.)
"""
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.parse
import urllib.request

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as h  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
PROMETHEUS = os.environ.get("PROMETHEUS", shutil.which("prometheus") or "/usr/bin/prometheus")


def render_manifest(name, ns, data_dir, ckpt_dir, master_port, steps):
    """tests/e2e/editjob-e2e.yaml with its placeholders filled in."""
    with open(os.path.join(HERE, "editjob-e2e.yaml")) as f:
        text = f.read()
    for k, v in {"@NAME@": name, "@NAMESPACE@": ns, "@DATA@": data_dir, "@CKPT@": ckpt_dir,
                 "@MASTER_PORT@": str(master_port), "@STEPS@": str(steps)}.items():
        text = text.replace(k, v)
    return text


class Base(unittest.TestCase):
    def setUp(self):
        if not h.find_kubectl():
            self.skipTest("no kubectl (.tools/bin/kubectl; run scripts/install-deps.sh)")
        if not os.access(h.OPERATOR, os.X_OK):
            self.skipTest("edit-operator not built: %s" % h.OPERATOR)
        self.c = h.Cluster(prefix="edit-e2e-")
        self.addCleanup(self.c.close)
        self.c.start_standin()
        self.c.kubectl("apply", "-f", h.CRD)
        self.c.kubectl("wait", "--for=condition=Established", "crd/editjobs.edit.io", "--timeout=30s")

    def start_job(self, steps, with_operator=True, extra_spec="", corrupt_train=False):
        self.ns = h.unique("e2e")
        self.name = "tiny"
        self.c.create_namespace(self.ns)
        if with_operator:
            self.c.start_operator([self.ns])
        data = os.path.join(self.c.tmp, "data")
        os.makedirs(data)
        h.make_data(data)
        if corrupt_train:  # a file the CRD and the operator cannot know is bad: edit-train exits 2
            path = os.path.join(data, "train.bin")
            os.truncate(path, os.path.getsize(path) - 1)  # llm.c header: more tokens than the file holds
        self.ckpt = os.path.join(self.c.tmp, "ckpt")
        # extra_spec: more spec fields, indented by 2 (the template's spec ends the file).
        manifest = render_manifest(self.name, self.ns, data, self.ckpt, h.free_port(), steps) + extra_spec
        res = self.c.kubectl("apply", "-f", "-", input=manifest)
        self.assertIn("editjob.edit.io/%s created" % self.name, res.stdout)


class KubectlFlow(Base):
    def test_job_succeeds(self):
        t0 = time.monotonic()
        self.start_job(steps=60)
        # kubectl wait (a watch on the custom resource) is the way the test waits.
        w = self.c.kubectl("wait", "--for=condition=Succeeded", "ej/" + self.name, "-n", self.ns,
                           "--timeout=240s", check=False, timeout=260)
        self.assertEqual(w.returncode, 0, "kubectl wait failed: %s%s\n%s" % (w.stdout, w.stderr, self.c.diagnostics()))
        self.assertIn("condition met", w.stdout)
        job = self.c.job(self.ns, self.name)
        st = job["status"]
        self.assertEqual(st["phase"], "Succeeded", st)
        self.assertEqual(st["progress"]["step"], 60, st)

        # kubectl get ej: the CRD's printer columns carry step, loss and tokens/s.
        out = self.c.kubectl("get", "ej", "-n", self.ns).stdout
        lines = out.strip().splitlines()
        header = lines[0].split()
        for col in ("NAME", "PHASE", "STEP", "LOSS", "TOKENS/S", "STRAGGLERS", "AGE", "MESSAGE"):
            self.assertIn(col, header, out)
        self.assertNotIn("RESTARTS", header, out)       # -o wide only
        self.assertIn("all 4 workers succeeded", lines[1], out)
        row = dict(zip(header, lines[1].split()))
        self.assertEqual(row["NAME"], self.name, out)
        self.assertEqual(row["PHASE"], "Succeeded", out)
        self.assertEqual(int(row["STEP"]), 60, out)
        loss = float(row["LOSS"])
        self.assertTrue(0 < loss < 5.6, out)        # below ln(256) = 5.55: it learnt something
        self.assertGreater(float(row["TOKENS/S"]), 0, out)
        wide = self.c.kubectl("get", "ej", self.name, "-n", self.ns, "-o", "wide").stdout
        wl = wide.strip().splitlines()
        wrow = dict(zip(wl[0].split(), wl[1].split()))
        self.assertEqual((wrow.get("MODE"), wrow.get("RESTARTS")), ("edit", "0"), wide)

        # kubectl describe: the job's events (recorded by the operator) are listed.
        desc = self.c.kubectl("describe", "ej", self.name, "-n", self.ns).stdout
        self.assertIn("Events:", desc)
        events = desc.split("Events:", 1)[1]
        self.assertNotIn("<none>", events.splitlines()[0] if events.strip() else "<none>", desc)
        self.assertRegex(events, r"Normal\s+\S+", desc)
        self.assertIn("Succeeded", events, desc)

        # kubectl explain reads the CRD's schema descriptions through /openapi/v3.
        ex = self.c.kubectl("explain", "editjob.spec.algorithm").stdout
        self.assertIn("Training algorithm and its synchronization", ex)
        self.assertIn("syncInterval", ex)
        self.assertIn("Local steps between synchronizations", ex)
        ex2 = self.c.kubectl("explain", "editjob.spec.algorithm.mode").stdout
        self.assertIn("a-edit", ex2)

        # spec.runtime reached the workers' config, with recovery from runPolicy.
        cfg = yaml.safe_load(self.c.get("/api/v1/namespaces/%s/configmaps/%s-config" % (self.ns, self.name))
                             ["data"]["config.yaml"])
        self.assertEqual((cfg["runtime"]["threads"], cfg["runtime"]["bucketMB"], cfg["runtime"]["recovery"]),
                         (1, 2, "inPlace"), cfg)

        # The gang: exactly one generation of 4 pods, all Succeeded, nothing restarted.
        pods = self.c.pods(self.ns, self.name)
        self.assertEqual(sorted(p["metadata"]["name"] for p in pods),
                         ["%s-worker-%d" % (self.name, r) for r in range(4)])
        self.assertTrue(all(p["status"]["phase"] == "Succeeded" for p in pods))
        self.assertEqual(st.get("restarts", 0), 0)
        print("job succeeded in %.1fs, final loss %s" % (time.monotonic() - t0, loss))


class WorkerError(Base):
    def test_exit_2_puts_the_workers_error_into_the_failed_condition(self):
        # terminationMessagePolicy FallbackToLogsOnError: the kubelet gives the operator the
        # tail of the worker's log, and the operator puts edit-train's own words into the
        # Failed condition (exit 2 is permanent: no restart).
        self.start_job(steps=20, corrupt_train=True)
        w = self.c.kubectl("wait", "--for=condition=Failed", "ej/" + self.name, "-n", self.ns,
                           "--timeout=120s", check=False, timeout=140)
        self.assertEqual(w.returncode, 0, "kubectl wait failed: %s%s\n%s" % (w.stdout, w.stderr, self.c.diagnostics()))
        st = self.c.job(self.ns, self.name)["status"]
        failed = next(c for c in st["conditions"] if c["type"] == "Failed")
        self.assertIn("train.bin: header says", failed["message"], failed)
        self.assertIn("(truncated?)", failed["message"], failed)
        self.assertIn("exit code 2", failed["message"], failed)
        self.assertEqual(st.get("restarts", 0), 0, st)
        desc = self.c.kubectl("describe", "ej", self.name, "-n", self.ns).stdout
        self.assertIn("train.bin: header says", desc)


class ExportFlow(Base):
    """spec.export: once the job has Succeeded the operator runs edit-export in one pod
    (the kubelet runs build/runtime/edit-export), reads its report from the pod's
    termination message into status.export and sets the Exported condition."""

    def wait_exported(self, status):
        w = self.c.kubectl("wait", "--for=condition=Exported=%s" % status, "ej/" + self.name, "-n", self.ns,
                           "--timeout=240s", check=False, timeout=260)
        self.assertEqual(w.returncode, 0, "kubectl wait failed: %s%s\n%s" % (w.stdout, w.stderr, self.c.diagnostics()))
        job = json.loads(self.c.kubectl("get", "ej", self.name, "-n", self.ns, "-o", "json").stdout)
        cond = next(c for c in job["status"]["conditions"] if c["type"] == "Exported")
        return job["status"], cond

    def export_pods(self):
        return sorted((p["metadata"]["name"], p["status"].get("phase"))
                      for p in self.c.pods(self.ns, self.name) if "-export-" in p["metadata"]["name"])

    def test_export_succeeds(self):
        self.start_job(steps=16, extra_spec="  export:\n    path: hf\n    dtype: bf16\n")
        st, cond = self.wait_exported("True")
        self.assertEqual(st["phase"], "Succeeded", st)
        out = os.path.join(self.c.tmp, "hf")   # beside checkpoint.dir (no volume holds it)
        ex = st["export"]
        self.assertEqual((ex["path"], ex["step"], ex["weights"], ex["dtype"], ex["attempts"]),
                         (out, 16, "outer", "bf16", 1), st)
        self.assertEqual(cond["reason"], "Exported", cond)
        self.assertIn("from the checkpoint of step 16", cond["message"])

        model = os.path.join(out, "model.safetensors")
        self.assertEqual(os.path.getsize(model), ex["bytes"])
        with open(model, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(n))
        self.assertEqual(header["model.embed_tokens.weight"]["dtype"], "BF16")
        self.assertEqual(header["model.embed_tokens.weight"]["shape"], [256, 64])
        with open(os.path.join(out, "config.json")) as f:
            config = json.load(f)
        self.assertEqual((config["architectures"], config["hidden_size"], config["num_hidden_layers"]),
                         (["LlamaForCausalLM"], 64, 2))

        # One export pod beside the 4 workers; an operator restart does not export again.
        self.assertEqual(self.export_pods(), [("tiny-export-1", "Succeeded")])
        self.c.stop_operator()
        self.c.start_operator([self.ns])
        time.sleep(7)                           # past one resync (--resync-seconds 5)
        self.assertEqual(self.export_pods(), [("tiny-export-1", "Succeeded")])
        self.assertEqual(self.c.job(self.ns, self.name)["status"]["export"], ex)
        events = self.c.kubectl("describe", "ej", self.name, "-n", self.ns).stdout.split("Events:", 1)[1]
        self.assertRegex(events, r"Normal\s+Exported\s")
        print("status.export: %s; %s" % (json.dumps(ex, sort_keys=True), cond["message"]))

    def test_export_refused(self):
        # 6 steps end inside the warm-up (8): the checkpoint has no outer weights, and
        # edit-export refuses weights=outer (exit 2): final, no retry.
        self.start_job(steps=6, extra_spec="  export:\n    path: hf\n    weights: outer\n")
        st, cond = self.wait_exported("False")
        self.assertEqual(st["phase"], "Succeeded", st)
        self.assertEqual(cond["reason"], "ExportRefused", cond)
        self.assertIn("export pod tiny-export-1 exited with code 2: refused:", cond["message"])
        self.assertIn("holds no outer weights", cond["message"])
        self.assertEqual(st["export"], {"attempts": 1}, st)
        self.assertFalse(os.path.exists(os.path.join(self.c.tmp, "hf")))
        time.sleep(7)                           # past one resync: still one attempt
        self.assertEqual(self.export_pods(), [("tiny-export-1", "Failed")])
        events = self.c.kubectl("describe", "ej", self.name, "-n", self.ns).stdout.split("Events:", 1)[1]
        self.assertRegex(events, r"Warning\s+ExportRefused\s")


class InvalidManifests(Base):
    """tests/e2e/invalid/*.yaml: each is rejected by kubectl apply, the error naming the
    field (its first line says what the error must contain). No operator is needed: the
    CRD's schema (served by the stand-in) rejects them."""

    def test_invalid_manifests_rejected(self):
        ns = h.unique("e2e-bad")
        self.c.create_namespace(ns)
        files = sorted(glob.glob(os.path.join(HERE, "invalid", "*.yaml")))
        self.assertGreaterEqual(len(files), 10)
        for f in files:
            with open(f) as fh:
                first = fh.readline()
            m = re.match(r"#\s*expect:\s*(.+)", first)
            self.assertTrue(m, "%s: first line must be '# expect: <substring>'" % f)
            want = m.group(1).strip()
            with self.subTest(manifest=os.path.basename(f)):
                res = self.c.kubectl("apply", "-n", ns, "-f", f, check=False)
                self.assertNotEqual(res.returncode, 0, "%s was accepted:\n%s" % (f, res.stdout))
                self.assertIn(want, res.stderr, "%s: error does not name %r:\n%s" % (f, want, res.stderr))
        # Nothing got in.
        out = self.c.kubectl("get", "ej", "-n", ns, "-o", "json").stdout
        self.assertEqual(json.loads(out)["items"], [])


class SpecChanges(Base):
    """Fields that cannot change on a running job are rejected by kubectl apply (the CRD's
    transition rules), naming the field; a runPolicy change and a suspend/resume are
    accepted and acted on, and status.observedGeneration then says so."""

    def test_immutable_fields_rejected_runpolicy_accepted(self):
        ns = h.unique("e2e-spec")
        self.c.create_namespace(ns)
        self.c.start_operator([ns])
        job = {"apiVersion": "edit.io/v1alpha1", "kind": "EDiTJob", "metadata": {"name": "fixed", "namespace": ns},
               "spec": {"replicas": 2, "image": "unused.local/edit-runtime:test", "command": ["sh", "-c", "sleep 600"],
                        "hangTimeoutSeconds": 0, "training": {"steps": 10}, "runPolicy": {"backoffLimit": 3}}}
        self.c.apply(job)
        self.c.wait_phase(ns, "fixed", "Running", 60)

        def edited(path, value):
            j = json.loads(json.dumps(job))
            node = j["spec"]
            for k in path[:-1]:
                node = node.setdefault(k, {})
            node[path[-1]] = value
            return j
        for path, value in ((("replicas",), 3), (("image",), "other:2"), (("model", "preset"), "small"),
                            (("runtime", "bucketMB"), 8),
                            (("args",), ["--set", "training.lr=0.1"]), (("runPolicy", "replicaRecovery"), "GangRestart"),
                            (("podTemplate", "metadata", "labels"), {"team": "ml"})):
            field = "spec." + ".".join(path[:2] if path[0] in ("runPolicy",) else path[:1])
            with self.subTest(field=field):
                res = self.c.kubectl("apply", "-f", "-", input=json.dumps(edited(path, value)), check=False)
                self.assertNotEqual(res.returncode, 0, "%s change accepted:\n%s" % (field, res.stdout))
                self.assertIn('%s: Forbidden: %s cannot change once the job exists' % (field, field), res.stderr)
        st = self.c.job(ns, "fixed")
        self.assertEqual(st["spec"]["replicas"], 2)
        self.assertEqual(len(self.c.pods(ns, "fixed")), 2)

        # runPolicy changes go through and the operator acts on them.
        gen0 = st["metadata"]["generation"]
        self.c.apply(edited(("runPolicy", "backoffLimit"), 5))
        for suspend, phase in ((True, "Suspended"), (False, "Running")):
            j = edited(("runPolicy", "backoffLimit"), 5)
            j["spec"]["runPolicy"]["suspend"] = suspend
            self.c.apply(j)
            got = self.c.wait_phase(ns, "fixed", phase, 60)
            self.c.wait_for(lambda: self.c.job(ns, "fixed")["status"].get("observedGeneration") ==
                            self.c.job(ns, "fixed")["metadata"]["generation"], 20, "observedGeneration caught up")
        got = self.c.job(ns, "fixed")
        self.assertEqual(got["metadata"]["generation"], gen0 + 3)
        self.assertEqual(got["status"]["observedGeneration"], gen0 + 3)
        self.assertEqual(len(self.c.pods(ns, "fixed")), 2)


class ClusterExamples(Base):
    """examples/cluster/ as the README applies it: the API accepts every object (server-side
    dry run through kubectl: the CRD's schema and rules), and the operator turns the
    A-EDiT job into worker pods that mount the claims where the config expects them.
    (The stand-in provisions no volumes and runs no Job controller, so nothing trains.)"""

    def test_examples_apply_and_mount_the_claims(self):
        ns = h.unique("e2e-ex")
        self.c.create_namespace(ns)
        ex = os.path.join(h.ROOT, "examples", "cluster")
        res = self.c.kubectl("apply", "--dry-run=server", "-n", ns, "-f", ex)
        for f in ("persistentvolumeclaim/edit-data", "persistentvolumeclaim/edit-checkpoints",
                  "job.batch/edit-prepare-data", "editjob.edit.io/tiny-aedit", "editjob.edit.io/llama-350m-gpu"):
            self.assertIn(f, res.stdout)
        self.c.start_operator([ns])
        self.c.kubectl("apply", "-n", ns, "-f", os.path.join(ex, "storage.yaml"))
        self.c.kubectl("apply", "-n", ns, "-f", os.path.join(ex, "editjob-aedit.yaml"))
        pods = self.c.wait_for(lambda: len(self.c.pods(ns, "tiny-aedit")) == 4 and self.c.pods(ns, "tiny-aedit"),
                               60, "4 worker pods")
        spec = pods[0]["spec"]
        claims = {v["name"]: v["persistentVolumeClaim"] for v in spec["volumes"] if "persistentVolumeClaim" in v}
        mounts = {m["name"]: m for m in spec["containers"][0]["volumeMounts"]}
        self.assertEqual(claims["edit-data"], {"claimName": "edit-data", "readOnly": True})
        self.assertEqual(claims["edit-checkpoint"], {"claimName": "edit-checkpoints"})
        self.assertEqual(mounts["edit-data"]["mountPath"], "/data")
        self.assertEqual(mounts["edit-checkpoint"]["mountPath"], "/checkpoints")
        cfg = self.c.get("/api/v1/namespaces/%s/configmaps/tiny-aedit-config" % ns)["data"]["config.yaml"]
        for want in ("train: /data/brown/train.bin", "val: /data/brown/val.bin", "dir: /checkpoints/tiny-aedit",
                     "mode: a-edit"):
            self.assertIn(want, cfg)
        self.assertEqual(spec["securityContext"]["seccompProfile"]["type"], "RuntimeDefault")


class PrometheusScrape(Base):
    """A real Prometheus scrapes the operator and the workers every second during a run;
    then every dashboard query (panels and template variables) and every alert rule
    expression is evaluated at a moment of the run through /api/v1/query."""

    STEPS = 600  # long enough that the workers still run when the queries are made

    def setUp(self):
        super().setUp()
        if not os.access(PROMETHEUS, os.X_OK):
            self.skipTest("no prometheus binary")

    def start_prometheus(self):
        d = os.path.join(self.c.tmp, "prom")
        os.makedirs(d)
        self.targets_file = os.path.join(d, "workers.json")
        with open(self.targets_file, "w") as f:
            json.dump([], f)
        host, port = self.c.metrics_addr.rsplit(":", 1)
        cfg = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
            "scrape_configs": [
                # The chart's ServiceMonitor/PodMonitor set honorLabels: the metrics carry
                # their own job (the EDiT job's name) and namespace labels.
                {"job_name": "edit-operator", "honor_labels": True,
                 "static_configs": [{"targets": ["%s:%s" % (host, port)]}]},
                {"job_name": "edit-workers", "honor_labels": True,
                 "file_sd_configs": [{"files": [self.targets_file], "refresh_interval": "1s"}]},
            ],
        }
        cfg_path = os.path.join(d, "prometheus.yml")
        with open(cfg_path, "w") as f:
            json.dump(cfg, f)  # JSON is YAML
        self.prom_port = h.free_port()
        self.prom_log = open(os.path.join(d, "prometheus.log"), "wb")
        self.prom = subprocess.Popen(
            [PROMETHEUS, "--config.file", cfg_path, "--storage.tsdb.path", os.path.join(d, "tsdb"),
             "--web.listen-address", "127.0.0.1:%d" % self.prom_port, "--log.level", "warn"],
            stdout=self.prom_log, stderr=subprocess.STDOUT)

        def stop():
            if self.prom.poll() is None:
                self.prom.send_signal(signal.SIGTERM)
                try:
                    self.prom.wait(20)
                except subprocess.TimeoutExpired:
                    self.prom.kill()
                    self.prom.wait()
            self.prom_log.close()
        self.addCleanup(stop)
        self.c.wait_for(lambda: self.prom_get("/-/ready", raw=True), 30, "prometheus ready")

    def prom_get(self, path, params=None, raw=False):
        url = "http://127.0.0.1:%d%s" % (self.prom_port, path)
        if params:
            url += "?" + urllib.parse.urlencode(params, doseq=True)
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                body = r.read()
        except urllib.error.HTTPError as e:
            body = e.read()
            if raw:
                return None
        except OSError:
            return None
        return body if raw else json.loads(body)

    def test_dashboards_and_alerts_return_data(self):
        # Operator first (its scrape target), then Prometheus, then the job.
        self.start_job(steps=self.STEPS)
        self.start_prometheus()
        t_prom = time.time()
        pods = self.c.running_pods(self.ns, self.name, 4, gen=0)
        targets = [{"targets": ["%s:9400" % p["status"]["podIP"]],
                    "labels": {"pod": p["metadata"]["name"]}} for p in pods]
        with open(self.targets_file + ".tmp", "w") as f:
            json.dump(targets, f)
        os.rename(self.targets_file + ".tmp", self.targets_file)
        t_targets = time.time()
        # The query moment: late in the run (every series exists, rates have >= 10 samples),
        # while the workers still run (after they exit their series go stale).
        # Rates need >= 10 samples (1 s scrapes): wait 15 s after the targets are known, and at
        # least until 3/4 of the run; the run is long enough that the workers still train.
        if time.time() - t_targets < 15:
            time.sleep(15 - (time.time() - t_targets))
        st = self.c.wait_step(self.ns, self.name, int(self.STEPS * 0.75), 300)
        self.assertEqual(st["phase"], "Running", st)
        t_q = time.time()
        up = self.prom_get("/api/v1/query", {"query": "up", "time": t_q})["data"]["result"]
        # Every worker was scraped successfully during the run (a fast one may just be done).
        window = "%ds" % max(10, int(t_q - t_targets))
        ever_up = self.prom_get("/api/v1/query", {"query": 'max_over_time(up{job="edit-workers"}[%s])' % window,
                                                  "time": t_q})["data"]["result"]
        self.c.wait_phase(self.ns, self.name, "Succeeded", 300)
        time.sleep(2)  # the last scrape of the operator's final state

        subs = {
            "$namespace": self.ns, "$job": self.name, "${namespace}": self.ns, "${job}": self.name,
            "$__rate_interval": "10s", "$__interval": "1s",
            "$__range": "%ds" % max(10, int(t_q - t_prom)),
        }

        def concrete(expr):
            for k in sorted(subs, key=len, reverse=True):
                expr = expr.replace(k, subs[k])
            self.assertNotIn("$", expr, "unsubstituted variable in %s" % expr)
            return expr

        def query(expr):
            r = self.prom_get("/api/v1/query", {"query": expr, "time": t_q})
            self.assertIsNotNone(r, expr)
            self.assertEqual(r.get("status"), "success", "%s: %s" % (expr, r))
            return r["data"]["result"]

        empty, checked = [], 0
        for path in sorted(glob.glob(os.path.join(h.ROOT, "dashboards", "*.json"))):
            with open(path) as fh:
                dash = json.load(fh)
            for var in dash.get("templating", {}).get("list", []):
                q = var.get("query")
                q = q.get("query") if isinstance(q, dict) else q
                if var.get("type") != "query" or not q:
                    continue
                m = re.match(r"label_values\((.*),\s*(\w+)\)\s*$", q)
                self.assertTrue(m, "%s: variable %s: unsupported query %r" % (path, var["name"], q))
                sel, label = concrete(m.group(1)), m.group(2)
                r = self.prom_get("/api/v1/label/%s/values" % label,
                                  {"match[]": sel, "start": t_q - 30, "end": t_q})
                self.assertEqual(r.get("status"), "success", r)
                checked += 1
                want = self.ns if label == "namespace" else self.name
                self.assertIn(want, r["data"], "%s: variable %s (%s) lacks %s: %s" % (
                    os.path.basename(path), var["name"], q, want, r["data"]))

            def panels(ps):
                for p in ps:
                    yield p
                    yield from panels(p.get("panels", []))
            for p in panels(dash.get("panels", [])):
                for t in p.get("targets", []):
                    if not t.get("expr"):
                        continue
                    expr = concrete(t["expr"])
                    res = query(expr)
                    checked += 1
                    if not res:
                        where = "%s / %s: %s" % (os.path.basename(path), p.get("title"), expr)
                        empty.append(where)

        rules = h.yaml_exprs(os.path.join(h.ROOT, "deploy", "prometheus", "edit-alerts.rules.yaml"))
        self.assertGreaterEqual(len(rules), 5)
        alert_results = {}
        for name, expr in rules:
            alert_results[name] = len(query(expr))
            checked += 1

        print("evaluated %d queries at t=%.0f; targets up: %s" % (
            checked, t_q, sorted((r["metric"].get("job"), r["metric"].get("instance"), r["value"][1]) for r in up)))
        print("alert expressions (series returned):", alert_results)
        self.assertEqual(empty, [], "dashboard queries without data:\n  " + "\n  ".join(empty))
        worker_up = [r for r in ever_up if r["value"][1] == "1"]
        self.assertEqual(len(worker_up), 4, ever_up)


RUNTIME_IMAGE = os.environ.get("EDIT_RUNTIME_IMAGE", "localhost/edit-runtime:latest")


def local_image_id(ref):
    """The image's ID in Buildah's local storage, None when it is not built."""
    if not shutil.which("buildah"):
        return None
    res = subprocess.run(["buildah", "inspect", "--type", "image", "--format", "{{.FromImageID}}", ref],
                         capture_output=True, text=True)
    return res.stdout.strip() if res.returncode == 0 else None


class ImageRuntime(unittest.TestCase):
    """The job's worker pods run inside the built runtime image (ctest label image): the
    stand-in's kubelet in image mode (--kubelet-images) runs each container's command in
    the image's root filesystem as the image's user, with the job's volumes bind-mounted
    (hostPath: the data read-only at /data, a checkpoint directory at /checkpoints). The
    operator is the host build. Skipped when the image is not built (make images)."""

    def test_job_in_runtime_image(self):
        STEPS = 60
        t0 = time.monotonic()
        if os.geteuid() != 0:
            self.skipTest("the kubelet's image mode needs root")
        image_id = local_image_id(RUNTIME_IMAGE)
        if not image_id:
            self.skipTest("image %s is not built (scripts/build-images.sh, or make images)" % RUNTIME_IMAGE)
        if not h.find_kubectl():
            self.skipTest("no kubectl (.tools/bin/kubectl; run scripts/install-deps.sh)")
        for binary in (h.OPERATOR, h.EDIT_DATA):
            if not os.access(binary, os.X_OK):
                self.skipTest("%s not built" % binary)
        # The host's edit-train must not be what runs: no --path-prepend of the build.
        self.c = h.Cluster(prefix="edit-e2e-img-", images=True)
        self.c.path_prepend = []
        self.addCleanup(self.c.close)
        self.c.start_standin()
        self.c.kubectl("apply", "-f", h.CRD)
        self.c.kubectl("wait", "--for=condition=Established", "crd/editjobs.edit.io", "--timeout=30s")
        ns, name = h.unique("e2e-img"), "tiny"
        self.c.create_namespace(ns)
        self.c.start_operator([ns])
        data, ckpt = os.path.join(self.c.tmp, "data"), os.path.join(self.c.tmp, "ckpt")
        os.makedirs(data)
        os.makedirs(ckpt)
        os.chmod(ckpt, 0o777)                 # the image's user (65532) writes checkpoints
        h.make_data(data)
        job = h.job_manifest(name, ns, "/data", "/checkpoints/" + name, h.free_port(), steps=STEPS, every=20)
        job["spec"]["image"] = RUNTIME_IMAGE
        job["spec"]["volumes"] = [{"name": "data", "hostPath": {"path": data}},
                                  {"name": "ckpt", "hostPath": {"path": ckpt}}]
        job["spec"]["volumeMounts"] = [{"name": "data", "mountPath": "/data", "readOnly": True},
                                       {"name": "ckpt", "mountPath": "/checkpoints"}]
        res = self.c.apply(job)
        self.assertIn("editjob.edit.io/%s created" % name, res.stdout)

        # While it runs: each worker's process has the image as its root and runs the
        # image's edit-train as uid 65532.
        pods = self.c.running_pods(ns, name, 4)
        procs = self.c.get("/standin/processes")
        checked = 0
        for p in pods:
            pid = procs["%s/%s" % (ns, p["metadata"]["name"])]["containers"]["worker"]
            if pid is None:
                continue                      # already finished
            try:
                exe = os.readlink("/proc/%d/exe" % pid)
                with open("/proc/%d/status" % pid) as f:
                    uid = [l.split()[1] for l in f if l.startswith("Uid:")][0]
            except OSError:
                continue                      # exited meanwhile
            # The image's /usr/local/bin/edit-train, seen through the pod's own overlay
            # (readlink shows the mount point as this process sees it).
            self.assertTrue(exe.startswith(os.path.join(self.c.tmp, "kubelet", "pods")) and
                            exe.endswith("/merged/usr/local/bin/edit-train"), exe)
            self.assertEqual(uid, "65532")
            self.assertTrue(os.path.exists("/proc/%d/root/usr/local/bin/edit-prepare-data" % pid))
            checked += 1
        self.assertGreater(checked, 0, "no worker process was still running to look at")

        w = self.c.kubectl("wait", "--for=condition=Succeeded", "ej/" + name, "-n", ns,
                           "--timeout=300s", check=False, timeout=320)
        self.assertEqual(w.returncode, 0, "kubectl wait failed: %s%s\n%s" % (w.stdout, w.stderr, self.c.diagnostics()))
        st = self.c.job(ns, name)["status"]
        self.assertEqual((st["phase"], st["progress"]["step"]), ("Succeeded", STEPS), st)
        for p in self.c.pods(ns, name):
            cs = p["status"]["containerStatuses"][0]
            self.assertEqual(cs["imageID"], image_id, cs)
            self.assertEqual(cs["state"]["terminated"]["exitCode"], 0, cs)
        # kubectl logs: the worker's own output, from inside the image.
        logs = self.c.kubectl("logs", "%s-worker-0" % name, "-n", ns).stdout
        # edit-train started alone (as in a pod) picks OpenBLAS's kernels for this CPU itself.
        sys.path.insert(0, os.path.join(h.ROOT, "tests", "images"))
        from test_images import expected_coretype
        kernels = re.findall(r"OpenBLAS kernels: (\S+)", logs)
        self.assertTrue(kernels, logs[-2000:])
        if expected_coretype():
            self.assertEqual({k.lower() for k in kernels}, {expected_coretype().lower()}, kernels)
        self.assertIn("@edit-summary ", logs)
        rows = [json.loads(l[6:]) for l in logs.splitlines() if l.startswith("@edit ")]
        self.assertEqual(rows[-1]["step"], STEPS, rows[-1:])
        self.assertIn("checkpoint /checkpoints/tiny/step-%08d saved" % STEPS, logs)
        # The checkpoints the image's user wrote through the volume.
        done = h.checkpoints(os.path.join(ckpt, name))
        self.assertEqual([s for s, _ in done][-1:], [STEPS], done)
        self.assertEqual(os.stat(done[-1][1]).st_uid, 65532)
        summary = json.loads([l for l in logs.splitlines() if l.startswith("@edit-summary ")][0][14:])
        print("job in %s succeeded in %.1f s: 4 pods (2x2), %d steps, worker-0 validation loss %.4f, "
              "OpenBLAS kernels %s, checked %d live worker processes" % (
                  RUNTIME_IMAGE, time.monotonic() - t0, STEPS, summary["val_loss"], kernels[0], checked))


if __name__ == "__main__":
    h.main()
