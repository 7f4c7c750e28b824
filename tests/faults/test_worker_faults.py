"""Fault suite, worker faults: a worker SIGKILLed (one rank, rank 0 with the store, a whole
replica), its pod deleted, every worker SIGTERMed, or every pod evicted with no time to
checkpoint, with in-place recovery or a gang restart (fault_case.py has the common checks).

Run one case:  PYTHONPATH=tests/pylib python3 tests/faults/test_worker_faults.py -v WorkerFaults.test_kill_worker
"""
import json
import os
import time
import urllib.parse

from fault_case import PACED, STEPS, SYNC, WORLD, FaultCase, RecoveryClock
from edit_testing.ckpt import checkpoints
from edit_testing.unittest_main import main


class WorkerFaults(FaultCase):
    def test_kill_worker(self):
        """SIGKILL rank 1 (replica 0, shard 1) mid-run, after the warm-up: only its pod is
        recreated (EDIT_JOIN=1, same generation) and rejoins; no gang restart. PACED."""
        self.start(debug=PACED)
        self.wait_checkpoint(16)
        self.wait_step(20)
        self.kill_workers(1)
        st = self.finish(expect_recovered=[1])
        self.assertEqual(self.c.metric_value("edit_job_replica_recoveries_total", namespace=self.ns, job=self.name), 1)
        self.assertEqual(self.c.metric_value("edit_job_restarts_total", namespace=self.ns, job=self.name), 0)
        self.assertEqual(self.restarted_metric(), 0)
        # Recovered once the replacement reported a training step (it joined and took its
        # state from its peers); Completed when the operator first saw that only after every
        # worker had finished (a short job, a busy machine).
        rec = [c for c in st.get("conditions", []) if c["type"] == "Recovering"]
        self.assertTrue(rec and rec[0]["status"] == "False" and rec[0]["reason"] in ("Recovered", "Completed"), st)
        if rec[0]["reason"] == "Recovered":
            self.assertIn("reported", rec[0]["message"], rec[0])
            self.assertEqual(self.c.metric_value("edit_operator_replica_recovery_seconds_count"), 1)

    def test_kill_worker_gang_restart(self):
        """The same kill with runPolicy.replicaRecovery GangRestart: one gang restart from
        the checkpoint, counted. PACED."""
        self.start(replica_recovery="GangRestart", debug=PACED)
        self.wait_checkpoint(16)
        self.wait_step(20)
        self.kill_workers(1)
        st = self.finish(expect_restarts=1)
        self.assertGreaterEqual(self.restarted_metric(), 1)
        self.assertEqual(self.c.metric_value("edit_job_restarts_total", namespace=self.ns, job=self.name), 1)
        self.assertGreaterEqual(self.resumed_from(1), 16)
        self.assertTrue(any(c["type"] == "Restarting" for c in st.get("conditions", [])), st)
        # The new gang's telemetry counts (its reports carry the new restart generation):
        # the job's step gauge went on past the furthest step of the killed gang.
        old_gang = max(row["step"] for runs in self.incarnations()[0].values() for rows in runs for row in rows)
        step = self.c.metric_value("edit_job_step", namespace=self.ns, job=self.name)
        if old_gang < STEPS:  # on a loaded machine the killed gang may already have finished
            self.assertGreater(step or 0, old_gang, "edit_job_step after the gang restart")

    def test_kill_rank0(self):
        """Rank 0 hosted the rendezvous store: its replacement (a new pod IP behind the same
        name) hosts a fresh one and the survivors reconnect; replaced in place too. PACED."""
        self.start(debug=PACED)
        self.wait_checkpoint(16)
        self.wait_step(20)
        self.kill_workers(0)
        self.finish(expect_recovered=[0])

    def test_kill_replica(self):
        """Both pods of replica 1 (ranks 2, 3) die at once: both are replaced in place, in
        one recovery, taking the outer state from replica 0. PACED."""
        self.start(debug=PACED)
        self.wait_checkpoint(16)
        self.wait_step(20)
        self.kill_workers(2, 3)
        self.finish(expect_recovered=[2, 3])
        self.assertEqual(self.restarted_metric(), 0)

    def test_delete_pod(self):
        """`kubectl delete pod` of one worker: SIGTERM reaches it alone; it leaves (exit 76)
        once a second control exchange shows the others got none, they wait, and the
        operator replaces the rank in place (EDIT_JOIN=1). Before, every worker checkpointed
        and stopped (143) and the gang restarted, charged to backoffLimit. Paced (rank 0
        sleeps 0.2 s a step; the others wait at each sync) so that the two exchanges happen
        well before the end, however fast the runtime is."""
        self.delete_pod_in_place(2, slow_rank=0)

    def test_delete_rank0(self):
        """`kubectl delete pod` of rank 0, the host of the rendezvous store: it leaves like
        any other rank (exit 76), its replacement hosts a fresh store under the same name,
        and the survivors reconnect to it: replaced in place, no gang restart."""
        self.delete_pod_in_place(0, slow_rank=1)

    def delete_pod_in_place(self, rank, slow_rank):
        """Deletes the pod of `rank`; it alone must be replaced in place. With rank 0 the
        store goes with it: no survivor may be lost on the way (with LibTorch 1.13's
        TCPStore, one that reconnected while rank 0 exited aborted, docs/replica-recovery.md)."""
        self.start(debug={"injectStepDelay": {"rank": slow_rank, "seconds": 0.2}})
        self.wait_checkpoint(16)
        self.wait_step(20)
        self.clock = RecoveryClock(self.c.tmp, self.ns, self.name)
        self.killed = [rank]
        self.c.kubectl("delete", "pod", "-n", self.ns, self.pod(rank), "--wait=false")
        self.finish(expect_recovered=[rank])
        self.assertEqual(self.restarted_metric(), 0)
        log = ""
        for f in self.c.pod_logs(self.ns, self.pod(rank)):  # the deleted pod's and its replacement's
            with open(f, errors="replace") as fh:
                log += fh.read()
        self.assertIn("left the job: SIGTERM reached 1 of 4 workers", log)
        for r, ss in self.c.summaries(self.ns, self.name).items():
            for x in ss:
                self.assertFalse(x["stopped"], "rank %d stopped: the gang was not meant to stop" % r)
                self.assertEqual(x["resumed_from"], -1, "rank %d read a checkpoint" % r)

    def test_sigterm_pods(self):
        """SIGTERM every worker: they checkpoint at the next sync point (well within the
        30 s grace period) and exit 143, which is retryable: the next generation resumes
        from that checkpoint, so (almost) nothing is redone. PACED."""
        self.start(debug=PACED)
        self.wait_step(20)
        t_term = time.time()
        for r in range(WORLD):
            self.c.kill(self.ns, self.pod(r), "TERM")
        self.finish(expect_restarts=1, redo_bound=SYNC)
        gen0 = [s for rank, ss in self.c.summaries(self.ns, self.name).items() for s in ss if s["stopped"]]
        self.assertEqual(len(gen0), WORLD, "every rank stops after its checkpoint")
        saved = gen0[0]["steps"]
        self.assertEqual(self.resumed_from(1), saved)
        manifest = os.path.join(self.ckpt, "step-%08d" % saved, "MANIFEST")
        if os.path.exists(manifest):  # kept (keep=100)
            self.assertLess(os.path.getmtime(manifest) - t_term, 30, "checkpoint not within the grace period")

    def test_drain_shorter_than_a_checkpoint(self):
        """Every pod evicted (a node drain) with a grace period that leaves no time for the
        checkpoint on SIGTERM (spec.terminationGracePeriodSeconds 0: killed at once): the
        gang is created again and resumes from the newest periodic checkpoint, not step 0,
        and a Warning event ResumedFromOlderCheckpoint says how far back. A drain is a
        disruption: no restart and no budget spent. PACED."""
        self.start(debug=PACED, extra_spec={"terminationGracePeriodSeconds": 0})
        pod0 = self.c.running_pods(self.ns, self.name, WORLD)[0]  # start() returns before the pods exist
        self.assertEqual(pod0["spec"]["terminationGracePeriodSeconds"], 0)
        self.wait_checkpoint(16)
        reached = self.wait_step(20)["progress"]["step"]
        for r in range(WORLD):
            code, body = self.c.api("POST", "/api/v1/namespaces/%s/pods/%s/eviction" % (self.ns, self.pod(r)),
                                    {"apiVersion": "policy/v1", "kind": "Eviction",
                                     "metadata": {"name": self.pod(r), "namespace": self.ns}})
            self.assertEqual(code, 201, body)
        job = self.c.wait_phase(self.ns, self.name, ("Succeeded", "Failed"), 300)
        self.tracker.stop()
        st = job["status"]
        self.assertEqual(st["phase"], "Succeeded", "%s\n%s" % (self.c.diagnostics(), json.dumps(st, indent=1)))
        self.assertEqual(st.get("restarts", 0), 0, st)
        # Every rank ran twice: the evicted gang, then the gang that resumed.
        resumed = [s["resumed_from"] for s in self.c.summaries(self.ns, self.name).get(0, []) if s["steps"] == STEPS]
        self.assertTrue(resumed, self.c.summaries(self.ns, self.name))
        self.assertGreaterEqual(resumed[-1], 16, "resumed from step %s, not the periodic checkpoint" % resumed[-1])
        self.assertLess(resumed[-1], reached + 8)
        cks = checkpoints(self.ckpt)
        self.assertEqual(cks[-1][0], STEPS, cks)
        evs = self.c.get("/api/v1/namespaces/%s/events?fieldSelector=%s" % (
            self.ns, urllib.parse.quote("involvedObject.name=" + self.name)))["items"]
        older = [e for e in evs if e["reason"] == "ResumedFromOlderCheckpoint"]
        self.assertEqual(len(older), 1, ("drained at step >= %d, resumed from %d; events: " % (reached, resumed[-1])) +
                         str([(e["reason"], e["message"]) for e in evs]))
        self.assertEqual(older[0]["type"], "Warning")
        self.assertIn("resumed at step %d" % resumed[-1], older[0]["message"])
        print("drained at step >= %d, resumed from %d: %s" % (reached, resumed[-1], older[0]["message"]))


if __name__ == "__main__":
    main()
