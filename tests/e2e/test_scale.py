"""Elastic replicas on the stand-in with real kubectl: `kubectl scale ej/NAME
--replicas=M` on a running job grows and shrinks it in place (no worker restarts, no
checkpoint read), a new pod that dies during the join leaves the job at its old size, and
a scale of a suspended job applies when it resumes (from a checkpoint written with the
old size).

Run one case:  PYTHONPATH=tests/pylib python3 tests/e2e/test_scale.py -v Scale.test_up_and_down_in_place
"""
import glob
import json
import os
import time

from e2e_case import Base
from edit_testing.ckpt import checkpoints
from edit_testing.cluster import PodTracker, job_manifest, unique
from edit_testing.data import make_data
from edit_testing.net import free_port
from edit_testing.unittest_main import main

# Long enough that both scales happen mid-run on 2 shared cores; rank 0 is slowed down a
# little (every replica waits for it at the sync rounds) so that the run's length does not
# depend on this machine's speed more than it must.
STEPS = 400
DELAY = {"injectStepDelay": {"rank": 0, "seconds": 0.06}}


class Scale(Base):
    def start(self, steps=STEPS, env=None, every=1000):
        self.ns = unique("scale")
        self.name = "el"
        self.c.create_namespace(self.ns)
        self.c.start_operator([self.ns])
        data = os.path.join(self.c.tmp, "data")
        os.makedirs(data)
        make_data(data)
        self.ckpt = os.path.join(self.c.tmp, "ckpt")
        m = job_manifest(self.name, self.ns, data, self.ckpt, free_port(), steps=steps, every=every,
                           replicas=2, shards=1, debug=DELAY, env=env)
        self.tracker = PodTracker(self.c, self.ns, self.name)
        self.c.apply(m)
        self.c.wait_phase(self.ns, self.name, "Running", 120)
        self.c.wait_step(self.ns, self.name, 12, 120)  # past the synchronous warm-up

    def scale(self, m):
        out = self.c.kubectl("scale", "ej/" + self.name, "-n", self.ns, "--replicas=%d" % m)
        self.assertIn("scaled", out.stdout)

    def status(self):
        return self.c.job(self.ns, self.name).get("status", {})

    def wait_scaled(self, frm, to, result="Succeeded"):
        def done():
            st = self.status()
            last = st.get("lastScale") or {}
            return st if (last.get("from"), last.get("to"), last.get("result")) == (frm, to, result) else None
        return self.c.wait_for(done, 180, "lastScale %d -> %d %s" % (frm, to, result))

    def condition(self, st, type_):
        return next((c for c in st.get("conditions", []) if c["type"] == type_), {})

    def wide_replicas(self):
        wide = self.c.kubectl("get", "ej", self.name, "-n", self.ns, "-o", "wide").stdout.strip().splitlines()
        return dict(zip(wide[0].split(), wide[1].split())).get("REPLICAS")

    def pod_env(self, rank):
        pod = self.c.get("/api/v1/namespaces/%s/pods/%s-worker-%d" % (self.ns, self.name, rank))
        return {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}

    def logs(self, rank):
        out = ""
        for f in glob.glob(os.path.join(self.c.tmp, "kubelet", "pods", "%s_%s-worker-%d_*" % (self.ns, self.name, rank),
                                        "worker.log")):
            with open(f, errors="replace") as fh:
                out += fh.read()
        return out

    def uids(self, rank):
        return sorted(uid for uid, (_, r, _) in self.tracker.uids.items() if r == rank)

    def finish(self):
        job = self.c.wait_phase(self.ns, self.name, ("Succeeded", "Failed"), 300)
        self.tracker.stop()
        st = job["status"]
        self.assertEqual(st["phase"], "Succeeded", "%s\n%s" % (json.dumps(st, indent=1), self.c.diagnostics()))
        self.assertEqual(st.get("restarts", 0), 0, st)
        self.assertEqual(st.get("replicaRecoveries", 0), 0, st)
        return st

    def test_up_and_down_in_place(self):
        self.start()
        first = {r: self.uids(r) for r in (0, 1)}
        self.scale(3)
        st = self.wait_scaled(2, 3)
        self.assertEqual(st["replicas"], 3, st)
        self.assertEqual(self.wide_replicas(), "3")
        cond = self.condition(st, "Scaling")
        self.assertEqual((cond.get("status"), cond.get("reason")), ("False", "Scaled"), cond)
        env = self.pod_env(2)
        self.assertEqual((env.get("EDIT_JOIN"), env.get("EDIT_REPLICAS"), env.get("WORLD_SIZE")), ("scale", "3", "3"))
        scale = json.loads(self.c.kubectl("get", "ej", self.name, "-n", self.ns, "--subresource=scale",
                                          "-o", "json").stdout)
        self.assertEqual((scale["spec"]["replicas"], scale["status"]["replicas"]), (3, 3), scale)
        self.assertEqual(scale["status"]["selector"], "edit.io/job-name=%s,edit.io/rank" % self.name)
        self.assertEqual(self.c.metric_value("edit_job_replicas", namespace=self.ns, job=self.name), 3)
        step_at_up = self.status()["progress"]["step"]

        self.c.wait_step(self.ns, self.name, step_at_up + 12, 120)  # the new replica trains a few rounds
        self.scale(2)
        st = self.wait_scaled(3, 2)
        self.assertEqual(st["replicas"], 2, st)
        self.c.wait_for(lambda: not any(p["metadata"]["name"].endswith("-worker-2")
                                        for p in self.c.pods(self.ns, self.name)), 60, "the leaver's pod deleted")
        self.assertEqual(self.wide_replicas(), "2")
        st = self.finish()
        self.assertEqual(st["message"], "all 2 workers succeeded", st)
        self.assertEqual(st["workers"]["total"], 2, st)

        # No survivor restarted: ranks 0 and 1 ran in one pod each, from start to end.
        self.assertEqual({r: self.uids(r) for r in (0, 1)}, first)
        self.assertEqual(len(self.uids(2)), 1)
        for r in (0, 1, 2):
            self.assertNotIn("resumed from", self.logs(r), "rank %d read a checkpoint" % r)
        self.assertIn("of a new replica", self.logs(2))
        sums = self.c.summaries(self.ns, self.name)
        self.assertTrue(sums[2][-1]["left_at_scale"], sums[2])
        self.assertEqual(sums[0][-1]["steps"], STEPS, sums[0])
        self.assertEqual(sums[0][-1]["scales"], 2, sums[0])
        self.assertLess(sums[0][-1]["val_loss"], 5.0, sums[0])  # learnt (ln 256 = 5.55)
        # Both scales in the events and the metrics.
        events = self.c.kubectl("get", "events", "-n", self.ns, "-o", "json").stdout
        reasons = [e["reason"] for e in json.loads(events)["items"]]
        self.assertEqual(reasons.count("ScalingStarted"), 2, reasons)
        self.assertEqual(reasons.count("Scaled"), 2, reasons)
        self.assertEqual(self.c.metric_value("edit_operator_scales_total", result="Succeeded"), 2)
        self.assertEqual(self.c.metric_value("edit_job_replicas", namespace=self.ns, job=self.name), 2)

    def test_new_pod_dying_in_the_join_leaves_the_old_size(self):
        # The runtime's test hook: a worker started to join a scale-up exits 3 at once.
        self.start(env=[{"name": "EDIT_TEST_SCALE_JOIN_EXIT", "value": "3"}])
        first = {r: self.uids(r) for r in (0, 1)}
        self.scale(3)
        st = self.wait_scaled(2, 3, "Abandoned")
        self.assertEqual(st["replicas"], 2, st)
        cond = self.condition(st, "Scaling")
        self.assertEqual((cond.get("status"), cond.get("reason")), ("False", "ScaleAbandoned"), cond)
        self.assertIn("continues with 2 replicas", cond["message"])
        self.assertIn("-worker-2", cond["message"])
        self.assertEqual(self.wide_replicas(), "2")
        st = self.finish()
        self.assertEqual({r: self.uids(r) for r in (0, 1)}, first)
        self.assertEqual(st["workers"]["total"], 2, st)
        self.assertEqual(self.c.metric_value("edit_operator_scales_total", result="Abandoned"), 1)
        # Workers that were already waiting for the new replica were told to stop waiting
        # (not after runtime.rendezvousTimeoutSeconds, 600 s).
        log0 = self.logs(0)
        if "scaling from 2 to 3" in log0:
            self.assertIn("was called off", log0)
            s0 = self.c.summaries(self.ns, self.name)[0][-1]
            self.assertEqual((s0["scales"], s0["scales_abandoned"]), (0, 1), s0)
            self.assertLess(s0["scale_seconds"], 60, s0)

    def test_suspended_job_takes_the_new_size_on_resume(self):
        self.start(every=10)
        self.c.wait_for(lambda: checkpoints(self.ckpt), 120, "a checkpoint")
        self.c.kubectl("patch", "ej", self.name, "-n", self.ns, "--type=merge", "-p",
                       '{"spec":{"runPolicy":{"suspend":true}}}')
        self.c.wait_phase(self.ns, self.name, "Suspended", 120)
        self.c.wait_for(lambda: not self.c.pods(self.ns, self.name), 60, "the workers gone")
        self.scale(3)
        time.sleep(1)
        st = self.status()
        self.assertEqual((st["phase"], st["replicas"]), ("Suspended", 2), st)  # nothing runs until resumed
        self.assertNotIn("scaling", st)
        self.c.kubectl("patch", "ej", self.name, "-n", self.ns, "--type=merge", "-p",
                       '{"spec":{"runPolicy":{"suspend":false}}}')
        self.c.running_pods(self.ns, self.name, 3)
        st = self.finish()
        self.assertEqual((st["replicas"], st["workers"]["total"]), (3, 3), st)
        self.assertEqual(st["message"], "all 3 workers succeeded", st)
        # Every rank of the resumed gang read the checkpoint written by 2 replicas.
        for r in (0, 1, 2):
            self.assertIn("resumed from", self.logs(r), "rank %d" % r)


if __name__ == "__main__":
    main()
