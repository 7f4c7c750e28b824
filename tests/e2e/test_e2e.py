"""End-to-end tests: real kubectl -> the API stand-in -> edit-operator -> worker pods
(edit-train processes run by the stand-in's kubelet) -> Succeeded; worker errors in the
Failed condition; export; invalid manifests rejected by kubectl apply; spec changes; the
cluster examples. A real Prometheus: test_prometheus.py; the runtime image:
test_image_runtime.py.

Run one case:  PYTHONPATH=tests/pylib python3 tests/e2e/test_e2e.py -v KubectlFlow.test_job_succeeds
(EDIT_BUILD_DIR selects the build; EDIT_KEEP_TMP=1 keeps the temp dirs for a look.)
"""
import glob
import json
import math
import os
import re
import time

import yaml

from e2e_case import HERE, Base
from edit_testing.cluster import unique
from edit_testing.paths import ROOT
from edit_testing.unittest_main import main


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
        # status.link: the sync rounds' cost, from the workers' local-phase reports (13 rounds
        # after the 8-step warm-up at tau 4); LinkBound says whether it is over 20%.
        link = st.get("link")
        self.assertIsNotNone(link, st)
        self.assertIn(link["rank"], range(4), link)
        self.assertGreaterEqual(link["rounds"], 3, link)
        self.assertLessEqual(link["localSteps"], 60 - 8, link)
        blocked = link["roundSeconds"] * link["rounds"]
        self.assertAlmostEqual(blocked / (blocked + link["stepSeconds"] * link["localSteps"]), link["blockedShare"],
                               delta=0.01, msg=link)
        bound = [c for c in st["conditions"] if c["type"] == "LinkBound" and c["status"] == "True"]
        if bound:
            self.assertGreaterEqual(link["blockedShare"], 0.2, (link, bound))
            # The tau it suggests keeps R / (tau c + R) <= 20%: tau >= 4 R / c (status values
            # are rounded to 4 places, so allow one either way).
            m = re.search(r"algorithm\.syncInterval >= (\d+) \(now 4\)", bound[0]["message"])
            self.assertIsNotNone(m, bound[0]["message"])
            self.assertLessEqual(abs(int(m.group(1)) - math.ceil(4 * link["roundSeconds"] / link["stepSeconds"])), 1,
                                 (link, bound[0]["message"]))
        else:
            self.assertLessEqual(link["blockedShare"], 0.2, (link, st["conditions"]))

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
        # edit-train writes its reason to the termination message file (EDIT_TERMINATION_LOG,
        # the container's terminationMessagePath), the kubelet gives it to the operator, and
        # the operator puts edit-train's own words into the Failed condition (exit 2 is
        # permanent: no restart). Not the log's tail, the fallback for a worker that could not.
        self.start_job(steps=20, corrupt_train=True)
        w = self.c.kubectl("wait", "--for=condition=Failed", "ej/" + self.name, "-n", self.ns,
                           "--timeout=120s", check=False, timeout=140)
        self.assertEqual(w.returncode, 0, "kubectl wait failed: %s%s\n%s" % (w.stdout, w.stderr, self.c.diagnostics()))
        st = self.c.job(self.ns, self.name)["status"]
        failed = next(c for c in st["conditions"] if c["type"] == "Failed")
        self.assertIn("train.bin: header says", failed["message"], failed)
        self.assertIn("(truncated?)", failed["message"], failed)
        self.assertIn("exit code 2 (Error): invalid data: ", failed["message"], failed)
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


class DeleteAndApplyAgain(Base):
    """The CRD tells users to delete and recreate a job to change a field. The garbage
    collector removes the old job's children in the background, seconds after kubectl
    delete returned (the stand-in's --gc-delay): the job applied again right away finds
    them all there, and must not take them for its own."""
    standin_args = ("--gc-delay", "5")

    def test_delete_then_apply_at_once_trains_to_succeeded(self):
        # 1 s a step: the first job is still training when it is deleted (unpaced, the 40
        # steps take about a second, and status shows progress at most every 15 s), so
        # the second has steps of its own to run and report.
        self.start_job(steps=40, extra_spec="  debug:\n    injectStepDelay:\n      rank: 0\n      seconds: 1.0\n")
        self.c.wait_step(self.ns, self.name, 5, 180)
        first = self.c.job(self.ns, self.name)["metadata"]["uid"]
        self.c.kubectl("delete", "ej/" + self.name, "-n", self.ns)
        self.c.kubectl("apply", "-f", "-", input=self.manifest)
        job = self.c.job(self.ns, self.name)
        uid = job["metadata"]["uid"]
        self.assertNotEqual(uid, first)
        w = self.c.kubectl("wait", "--for=condition=Succeeded", "ej/" + self.name, "-n", self.ns,
                           "--timeout=240s", check=False, timeout=260)
        self.assertEqual(w.returncode, 0, "kubectl wait failed: %s%s\n%s\n%s" % (
            w.stdout, w.stderr, json.dumps(self.c.job(self.ns, self.name).get("status"), indent=1), self.c.diagnostics()))
        st = self.c.job(self.ns, self.name)["status"]
        self.assertEqual(st.get("progress", {}).get("step"), 40,
                         json.dumps(st, indent=1) + "\n" + self.c.diagnostics())
        # What it ran on is its own: its token's Secret, its config, its pods.
        for path in ("secrets/%s-telemetry" % self.name, "configmaps/%s-config" % self.name):
            refs = self.c.get("/api/v1/namespaces/%s/%s" % (self.ns, path))["metadata"]["ownerReferences"]
            self.assertEqual([r["uid"] for r in refs], [uid], path)
        for p in self.c.pods(self.ns, self.name):
            self.assertEqual([r["uid"] for r in p["metadata"]["ownerReferences"]], [uid])


class InvalidManifests(Base):
    """tests/e2e/invalid/*.yaml: each is rejected by kubectl apply, the error naming the
    field (its first line says what the error must contain). No operator is needed: the
    CRD's schema (served by the stand-in) rejects them."""

    def test_invalid_manifests_rejected(self):
        ns = unique("e2e-bad")
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
    transition rules), naming the field; a replicas change passes the API (server-side dry
    run: scaling itself is the operator's); a runPolicy change and a suspend/resume are
    accepted and acted on, and status.observedGeneration then says so."""

    def test_immutable_fields_rejected_runpolicy_accepted(self):
        ns = unique("e2e-spec")
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
        for path, value in ((("shardsPerReplica",), 2), (("image",), "other:2"), (("model", "preset"), "small"),
                            (("runtime", "bucketMB"), 8),
                            (("args",), ["--set", "training.lr=0.1"]), (("runPolicy", "replicaRecovery"), "GangRestart"),
                            (("podTemplate", "metadata", "labels"), {"team": "ml"})):
            field = "spec." + ".".join(path[:2] if path[0] in ("runPolicy",) else path[:1])
            with self.subTest(field=field):
                res = self.c.kubectl("apply", "-f", "-", input=json.dumps(edited(path, value)), check=False)
                self.assertNotEqual(res.returncode, 0, "%s change accepted:\n%s" % (field, res.stdout))
                self.assertIn('%s: Forbidden: %s cannot change once the job exists' % (field, field), res.stderr)
        self.c.kubectl("apply", "--dry-run=server", "-f", "-", input=json.dumps(edited(("replicas",), 3)))
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
        ns = unique("e2e-ex")
        self.c.create_namespace(ns)
        ex = os.path.join(ROOT, "examples", "cluster")
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


if __name__ == "__main__":
    main()
