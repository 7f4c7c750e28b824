"""End-to-end: a real Prometheus scrapes the operator and the workers of a running EDiTJob
(real kubectl, the API stand-in, edit-operator, edit-train pods), and every dashboard
query and alert rule expression is evaluated against what it scraped.

Run:  PYTHONPATH=tests/pylib python3 tests/e2e/test_prometheus.py -v
"""
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import time
import urllib.parse
import urllib.request

from e2e_case import Base
from edit_testing.net import free_port
from edit_testing.paths import ROOT
from edit_testing.unittest_main import main

PROMETHEUS = os.environ.get("PROMETHEUS", shutil.which("prometheus") or "/usr/bin/prometheus")


def yaml_exprs(path):
    """(alert or record name, expr) of a Prometheus rules file; a small reader for the
    two forms used there (`expr: one line` and `expr: |` blocks), standard library only."""
    out, name = [], None
    with open(path) as f:
        lines = f.read().splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        s = line.strip()
        if s.startswith("- alert:") or s.startswith("- record:"):
            name = s.split(":", 1)[1].strip()
        elif s.startswith("expr:"):
            rest = s[5:].strip()
            if rest in ("|", ">", "|-", ">-"):
                indent = len(line) - len(line.lstrip())
                block = []
                i += 1
                while i < len(lines) and (not lines[i].strip() or len(lines[i]) - len(lines[i].lstrip()) > indent):
                    block.append(lines[i].strip())
                    i += 1
                out.append((name, " ".join(b for b in block if b)))
                continue
            out.append((name, rest.strip("'\"")))
        i += 1
    return out


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
        self.prom_port = free_port()
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
        for path in sorted(glob.glob(os.path.join(ROOT, "dashboards", "*.json"))):
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

        rules = yaml_exprs(os.path.join(ROOT, "deploy", "prometheus", "edit-alerts.rules.yaml"))
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


if __name__ == "__main__":
    main()
