"""Fault suite, the control plane: the operator SIGKILLed and started again, the API stand-in
restarted (its kubelet stops the pods' processes) or crashed (its containers outlive it)
while a job trains (fault_case.py has the common checks).

Run one case:  PYTHONPATH=tests/pylib python3 tests/faults/test_control_plane_faults.py -v ControlPlaneFaults.test_kill_operator
"""
import signal
import time

from fault_case import EVERY, PACED, STEPS, SYNC, WORLD, FaultCase
from edit_testing.unittest_main import main


class ControlPlaneFaults(FaultCase):
    def test_kill_operator(self):
        """SIGKILL the operator mid-run, start a new one: it adopts the running gang (no
        pod recreated, no restart) and the job succeeds. PACED."""
        self.start(debug=PACED)
        pods0 = {p["metadata"]["uid"] for p in self.c.running_pods(self.ns, self.name, WORLD)}
        self.wait_step(20)
        self.c.stop_operator(signal.SIGKILL)
        time.sleep(3)
        self.c.start_operator([self.ns])
        self.finish(expect_restarts=0)
        self.assertEqual(set(self.tracker.uids), pods0)
        # Not asserted (reported): status.progress.step sometimes stays at the step of the
        # operator kill when the job ends before the workers' telemetry reconnects.

    def test_restart_standin(self):
        """Restart the API stand-in (state kept in --state, same port) mid-run. Its watches
        break and old resourceVersions give 410; its kubelet stops the pods' processes
        (SIGTERM, then SIGKILL after 2 s) and restarts the processes of the pods that
        were running when it comes back. The operator re-lists and the job succeeds. PACED."""
        self.start(debug=PACED)
        self.wait_checkpoint(16)
        self.wait_step(20)
        rv_before = self.c.get("/standin/state")
        self.c.stop_standin(signal.SIGTERM)
        # The kubelet stopped the workers; their logs are complete now (a process restarted
        # in the same pod starts a new log file, so read the steps reached here).
        reached = max(row["step"] for rank in range(WORLD) for _, rows in self.c.progress(self.ns, self.name, rank)
                      for row in rows)
        time.sleep(1)
        self.c.start_standin()
        rv_after = self.c.get("/standin/state")
        st = self.finish(redo_bound=EVERY + SYNC)
        self.assertLessEqual(st.get("restarts", 0), 1, st)
        # The processes were stopped with the kubelet and resumed from a checkpoint.
        final = [x for x in self.c.summaries(self.ns, self.name)[0] if x["steps"] == STEPS]
        self.assertGreaterEqual(final[-1]["resumed_from"], 16, final)
        self.redone = [reached - final[-1]["resumed_from"]]
        print("steps redone after the stand-in restart:", self.redone)
        self.assertLessEqual(self.redone[0], EVERY + SYNC)
        log = open(self.c.op_logs[-1]).read()
        self.assertRegex(log, r"watch history expired \(410 Gone\), re-listing|watch broke, re-listing",
                         "the operator did not re-list after the restart")
        print("stand-in state before/after restart:", rv_before, rv_after)

    def test_crash_standin(self):
        """SIGKILL the API stand-in with its kubelet mid-run and start it again: the workers
        never notice (containers outlive a restart of a real API server or kubelet), the
        new kubelet adopts their processes, the operator re-lists, and the job succeeds
        with the same pods, no restart and no checkpoint read. PACED."""
        self.start(debug=PACED)
        pods0 = {p["metadata"]["uid"] for p in self.c.running_pods(self.ns, self.name, WORLD)}
        self.wait_checkpoint(16)
        self.wait_step(20)
        self.c.stop_standin(signal.SIGKILL)
        time.sleep(1)
        self.c.start_standin()
        self.finish(expect_restarts=0)  # also: no rank replaced in place
        self.assertEqual(set(self.tracker.uids), pods0, "a pod was created again")
        for r, ss in self.c.summaries(self.ns, self.name).items():
            self.assertEqual(len(ss), 1, "rank %d ran more than once" % r)
            self.assertEqual(ss[0]["resumed_from"], -1, "rank %d read a checkpoint" % r)
        self.assertIn("adopted 1 running container(s) of %s/%s" % (self.ns, self.pod(0)),
                      open(self.c.standin_logs[-1]).read())


if __name__ == "__main__":
    main()
