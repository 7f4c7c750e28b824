"""Fault suite, a hung worker: one worker SIGSTOPped; the operator marks the job Hung after
hangTimeoutSeconds and replaces the silent rank in place, or restarts the gang. And its
look-alike: the network between the workers and the operator cut while they train, which is
no hang (fault_case.py has the common checks).

Run one case:  PYTHONPATH=tests/pylib python3 tests/faults/test_hang_faults.py -v HangFaults.test_hung_worker
"""
import time
import urllib.parse

from fault_case import PACED, WORLD, FaultCase
from edit_testing.unittest_main import main


class HangFaults(FaultCase):
    def hung_event(self):
        """The operator's Warning event Hung for the job. The event stays, unlike the Hung
        condition's True state: after a gang restart the condition turns False (Recovered)
        as soon as the new pods run, a fraction of a second later with the stand-in's
        kubelet, which a poll of the status can miss."""
        def hung():
            evs = self.c.get("/api/v1/namespaces/%s/events?fieldSelector=%s" % (
                self.ns, urllib.parse.quote("involvedObject.name=" + self.name)))["items"]
            return [e for e in evs if e["reason"] == "Hung" and e["type"] == "Warning"]
        return self.c.wait_for(hung, 60, "a Hung event")[0]

    def hung_condition_after(self, st):
        """The Hung condition at the end: False, since the job recovered and finished."""
        hung = [c for c in st.get("conditions", []) if c["type"] == "Hung"]
        self.assertEqual(len(hung), 1, st.get("conditions"))
        self.assertEqual(hung[0]["status"], "False", hung)

    def test_hung_worker(self):
        """SIGSTOP one worker: no step advances; after hangTimeoutSeconds the operator marks
        the job Hung, sees that rank 1 alone went silent (the others keep sending heartbeats
        from their collectives), kills it and replaces it in place: no gang restart. PACED."""
        self.start(hang=10, debug=PACED)
        self.wait_checkpoint(16)
        self.wait_step(20)
        self.kill_workers_with(1, sig="STOP")
        ev = self.hung_event()  # WorkerUnresponsive: the message names the silent rank
        self.assertIn("no training progress for hangTimeoutSeconds=10; rank(s) 1 sent nothing", ev["message"])
        st = self.finish(expect_recovered=[1])
        self.assertEqual(self.restarted_metric(), 0)
        self.hung_condition_after(st)

    def test_hung_worker_gang_restart(self):
        """The same hang under runPolicy.replicaRecovery GangRestart: Hung, then a gang
        restart from the checkpoint (the stopped process dies by SIGKILL). PACED."""
        self.start(hang=10, replica_recovery="GangRestart", debug=PACED)
        self.wait_checkpoint(16)
        self.wait_step(20)
        self.kill_workers_with(1, sig="STOP")
        ev = self.hung_event()  # NoProgress: no rank named (a gang restart, not in place)
        self.assertEqual(ev["message"], "no training progress for hangTimeoutSeconds=10", ev)
        st = self.finish(expect_restarts=1)
        self.assertGreaterEqual(self.restarted_metric(), 1)
        self.hung_condition_after(st)


class TelemetryBlackout(FaultCase):
    telemetry_proxy = True

    def test_telemetry_blackout(self):
        """Cut every worker off the operator's telemetry for 3 x hangTimeoutSeconds while
        they train on: the job says TelemetryLost, and nothing restarts: 0 restarts, 0
        in-place recoveries, no pod deleted; once the reports arrive again the condition
        ends (ReportsResumed); Succeeded. Rank 1 sleeps 1 s a step, so the 64 steps
        outlast the cut."""
        hang = 10
        self.start(hang=hang, debug={"injectStepDelay": {"rank": 1, "seconds": 1.0}})
        pods0 = {p["metadata"]["uid"] for p in self.c.running_pods(self.ns, self.name, WORLD)}
        self.wait_step(8)
        self.c.proxy.block()
        t0 = time.monotonic()

        def lost():
            conds = self.c.job(self.ns, self.name).get("status", {}).get("conditions", [])
            return [c for c in conds if c["type"] == "TelemetryLost" and c["status"] == "True"]
        cond = self.c.wait_for(lost, 3 * hang, "the TelemetryLost condition")[0]
        self.assertIn("no telemetry from any of the 4 workers", cond["message"])
        time.sleep(max(0.0, 3 * hang - (time.monotonic() - t0)))
        self.assertEqual(self.c.job(self.ns, self.name)["status"]["phase"], "Running")
        self.c.proxy.unblock()

        def resumed():
            st = self.c.job(self.ns, self.name).get("status", {})
            return [c for c in st.get("conditions", []) if c["type"] == "TelemetryLost" and c["status"] == "False"
                    and c["reason"] == "ReportsResumed" and st.get("phase") == "Running"]
        self.c.wait_for(resumed, 30, "the reports to arrive again while the job runs")
        st = self.finish(expect_restarts=0)
        self.assertEqual(set(self.tracker.uids), pods0, "a pod was deleted or created")
        self.assertEqual(self.restarted_metric(), 0)


if __name__ == "__main__":
    main()
