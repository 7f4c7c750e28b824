"""The fault suite's common part: a 2 x 2 EDiT job (the e2e tiny job, 64 steps, checkpoint every 8) run by
edit-operator against the API stand-in, with one fault injected mid-run per test.

Every test ends with the job Succeeded and checks: no duplicate pods (never two live
generations, never more than M*N pods, no rank of a generation created twice - except the
replacements of an in-place recovery, pods with EDIT_JOIN=1); the final checkpoint at the
last step with finite outer weights and parameters (read by the independent reader
edit_testing.ckpt); at most one checkpoint interval redone per gang
restart (plus up to one sync interval, see redo_bound), at most one sync interval (+1)
per in-place recovery (every replica continues from the last synchronization); the final
validation loss within LOSS_TOLERANCE of an undisturbed run of the same config (edit-run,
cached).

The kill cases also measure the time from the kill to the first training step of a pod
started after it (the replacement, or the new gang) and the steps redone; they print them
and, when EDIT_FAULTS_REPORT_DIR is set, write them there as <case>.json (bench/ collects them).

The cases, by kind of fault: test_worker_faults.py, test_hang_faults.py,
test_control_plane_faults.py, test_data_faults.py.
"""
import fcntl
import glob
import hashlib
import json
import os
import threading
import time
import unittest

from edit_testing import edit_run, logs
from edit_testing.ckpt import checkpoints, outer_weights_finite
from edit_testing.cluster import Cluster, RecoveryTracker, job_manifest, unique
from edit_testing.data import make_data
from edit_testing.net import free_port
from edit_testing.paths import BUILD, CRD, OPERATOR, find_kubectl

STEPS, EVERY, SYNC = 64, 8, 4
WORLD = 4
# Rank 1 sleeps 0.1 s a step, so a fault injected at reported step 20 lands while the job
# still trains, however fast the runtime is: unpaced, the 64 steps can be over (or in the
# final synchronization, where a lost peer means a gang restart) before the fault arrives.
PACED = {"injectStepDelay": {"rank": 1, "seconds": 0.1}}
# Final validation loss vs the undisturbed run. A resumed run repeats the same data
# order from the checkpoint, so the redone steps are (up to Gloo's reduction order)
# the same computation; the residual differences are float non-associativity and, for the
# NaN case, one eliminated replica update (the outer step of that sync uses one replica's
# pseudo-gradient). The loss falls from ~5.5 to ~1.4 over the run; 0.15 is ~3% of that
# drop, well above run-to-run noise measured here (< 0.01) and well below what a lost or
# poisoned update does (the corrupt-replica test in tests/runtime sees > 1.0).
LOSS_TOLERANCE = 0.15


def config_key(text, tmp):
    return hashlib.sha256(text.replace(tmp, "@TMP@").encode()).hexdigest()[:16]


def strip_section(yaml_text, key):
    """Drops a top-level `key:` block of a block-style YAML document (the ConfigMap's)."""
    out, skipping = [], False
    for line in yaml_text.splitlines():
        if line and not line[0].isspace():
            skipping = line.startswith(key + ":")
        if not skipping:
            out.append(line)
    return "\n".join(out) + "\n"


def baseline_loss(config_text, tmp):
    """Final validation loss of the undisturbed run: the job's own worker config (from its
    ConfigMap, debug section removed) run by edit-run with the same 2 x 2 layout. Cached
    per config in the build dir, under a lock (fault tests may run in parallel)."""
    # runtime.recovery changes nothing in an undisturbed run: one baseline for both policies.
    config_text = strip_section(strip_section(config_text, "debug"), "runtime")
    cache_dir = os.path.join(BUILD, "tests", "faults")
    os.makedirs(cache_dir, exist_ok=True)
    path = os.path.join(cache_dir, "baseline-%s.json" % config_key(config_text, tmp))
    with open(path + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if os.path.exists(path):
            with open(path) as f:
                return json.load(f)["val_loss"]
        d = os.path.join(tmp, "baseline")
        os.makedirs(d)
        cfg = os.path.join(d, "config.yaml")
        with open(cfg, "w") as f:
            f.write(config_text)
        p = edit_run.run(4, ["checkpoint.dir=" + os.path.join(d, "ckpt"), "runtime.threads=1"], shards=2,
                         config=cfg, log_dir=os.path.join(d, "logs"))
        if p.returncode != 0:
            raise AssertionError("baseline edit-run failed:\n" + p.stdout[-2000:] + p.stderr[-2000:])
        s = logs.summaries(p.log_dir)[0]
        with open(path + ".tmp", "w") as f:
            json.dump(s, f)
        os.rename(path + ".tmp", path)
        return s["val_loss"]


class RecoveryClock:
    """Time from a kill to the first training step logged by a pod incarnation that did not
    exist at the kill: the replacement (in place) or the new gang (gang restart)."""

    def __init__(self, tmp, ns, job):
        self.pattern = os.path.join(tmp, "kubelet", "pods", "%s_%s-worker-*" % (ns, job), "worker.log")
        self.before = set(glob.glob(self.pattern))
        self.t_kill = time.monotonic()
        self.t_first = None
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()

    def _watch(self):
        while not self.done.is_set():
            for f in set(glob.glob(self.pattern)) - self.before:
                try:
                    if logs.read(f)[0]:
                        self.t_first = time.monotonic()
                        return
                except OSError:
                    pass
            self.done.wait(0.1)

    def seconds(self):
        self.done.set()
        self.thread.join(5)
        return None if self.t_first is None else self.t_first - self.t_kill


class FaultCase(unittest.TestCase):
    """A stand-in, an operator and a namespace per test; start() applies the job, finish()
    makes the common checks. The cases are in test_*_faults.py."""
    # Workers reach the operator through a relay the test can cut (Cluster.proxy).
    telemetry_proxy = False

    def setUp(self):
        if not find_kubectl():
            self.skipTest("no kubectl")
        if not os.access(OPERATOR, os.X_OK):
            self.skipTest("edit-operator not built: %s" % OPERATOR)
        self.c = Cluster(prefix="edit-fault-", telemetry_proxy=self.telemetry_proxy)
        self.addCleanup(self.c.close)
        self.c.start_standin()
        self.c.kubectl("apply", "-f", CRD)
        self.c.kubectl("wait", "--for=condition=Established", "crd/editjobs.edit.io", "--timeout=30s")
        self.ns = unique("fault")
        self.name = "ft"
        self.c.create_namespace(self.ns)
        self.c.start_operator([self.ns])
        self.data = os.path.join(self.c.tmp, "data")
        os.makedirs(self.data)
        make_data(self.data)
        self.ckpt = os.path.join(self.c.tmp, "ckpt")
        self.t0 = time.monotonic()
        self.clock = None
        self.killed = []

    # ---- helpers --------------------------------------------------------------------
    def start(self, replica_recovery=None, extra_spec=None, **kw):
        kw.setdefault("steps", STEPS)
        kw.setdefault("every", EVERY)
        m = job_manifest(self.name, self.ns, self.data, self.ckpt, free_port(), **kw)
        if replica_recovery:
            m["spec"]["runPolicy"]["replicaRecovery"] = replica_recovery
        m["spec"].update(extra_spec or {})
        self.tracker = RecoveryTracker(self.c, self.ns, self.name)
        self.c.apply(m)
        return m

    def kill_workers(self, *ranks):
        """SIGKILL these ranks' processes at once and start the recovery clock."""
        self.kill_workers_with(*ranks, sig="KILL")

    def kill_workers_with(self, *ranks, sig):
        self.clock = RecoveryClock(self.c.tmp, self.ns, self.name)
        self.killed = list(ranks)
        for r in ranks:
            self.c.kill(self.ns, self.pod(r), sig)

    def pod(self, rank):
        return "%s-worker-%d" % (self.name, rank)

    def wait_step(self, step):
        return self.c.wait_step(self.ns, self.name, step, 180)

    def wait_checkpoint(self, step):
        return self.c.wait_for(lambda: any(s >= step for s, _ in checkpoints(self.ckpt)), 180,
                               "a complete checkpoint at step >= %d" % step, interval=0.1)

    def finish(self, expect_restarts=None, redo_bound=EVERY + SYNC, phase="Succeeded", expect_recovered=None):
        """The common end of every fault test; returns the job's final status.
        expect_recovered: the ranks replaced in place (then no gang restart is expected
        and at most one sync interval is redone: every rank continues from the round the
        survivors agree on; one that had trained past it and logged one more local step
        redoes SYNC + 1, docs/replica-recovery.md)."""
        if expect_recovered is not None:
            expect_restarts, redo_bound = 0, SYNC + 1
        job = self.c.wait_phase(self.ns, self.name, ("Succeeded", "Failed"), 300)
        time.sleep(0.5)
        self.tracker.stop()
        st = job["status"]
        self.assertEqual(st["phase"], phase, "%s\n%s" % (self.c.diagnostics(), json.dumps(st, indent=1)))
        self.assertEqual(self.tracker.problems(WORLD), [])
        gens = self.tracker.generations()
        for g, ranks in gens.items():
            self.assertEqual(ranks, set(range(WORLD)), "generation %d ranks %s" % (g, ranks))
        if expect_restarts is not None:
            self.assertEqual(st.get("restarts", 0), expect_restarts,
                             "ranks replaced in place: %s\n%s\n%s" % (self.tracker.recovered_ranks(), self.c.diagnostics(),
                                                                      json.dumps(st, indent=1)))
            self.assertEqual(sorted(gens), list(range(expect_restarts + 1)), gens)
        recovered = self.tracker.recovered_ranks()
        if expect_restarts is not None:
            self.assertEqual(recovered, sorted(expect_recovered or []),
                             "ranks replaced in place\n%s" % self.c.diagnostics())
            self.assertEqual(st.get("replicaRecoveries", 0), 1 if expect_recovered else 0, st)
        self.assertNotIn("recovery", st, "the recovery record outlived the recovery")
        # Final checkpoint: the last step, outer weights and parameters finite.
        cks = checkpoints(self.ckpt)
        self.assertTrue(cks, "no checkpoint")
        last_step, last_dir = cks[-1]
        self.assertEqual(last_step, STEPS, cks)
        ok, detail = outer_weights_finite(last_dir, WORLD)
        self.assertTrue(ok, detail)
        # Steps redone per restart: the furthest step any rank of the old incarnation
        # logged, minus where the next incarnation resumed.
        self.redone = self.steps_redone()
        for r in self.redone:
            self.assertLessEqual(r, redo_bound, "steps redone per restart: %s" % self.redone)
        # Final loss vs an undisturbed run of the same config.
        sums = self.c.summaries(self.ns, self.name)
        final = [s for s in sums.get(0, []) if s["steps"] == STEPS and not s["stopped"]]
        self.assertTrue(final, sums)
        loss = final[-1]["val_loss"]
        cm = self.c.get("/api/v1/namespaces/%s/configmaps/%s-config" % (self.ns, self.name))["data"]["config.yaml"]
        base = baseline_loss(cm, self.c.tmp)
        case = self.id().split(".")[-1]
        print("%s: %.1fs, restarts %s, in-place recoveries %s, generations %s, steps redone %s, "
              "val_loss %.4f vs undisturbed %.4f" % (
                  case, time.monotonic() - self.t0, st.get("restarts", 0), st.get("replicaRecoveries", 0),
                  sorted(gens), self.redone, loss, base))
        if self.clock:
            self.report_recovery(case, st, recovered, loss, base)
        self.assertLess(abs(loss - base), LOSS_TOLERANCE, "val_loss %.4f vs undisturbed %.4f" % (loss, base))
        return st

    def report_recovery(self, case, st, recovered, loss, base):
        """The issue's measurement: kill -> first training step after recovery, steps lost."""
        seconds = self.clock.seconds()
        rep = {"case": case, "recovery": "in-place" if recovered else "gang-restart",
               "killed_ranks": self.killed, "recovered_ranks": recovered,
               "seconds_kill_to_first_step": None if seconds is None else round(seconds, 2),
               "steps_redone": self.redone, "steps_redone_max": max(self.redone or [0]),
               "restarts": st.get("restarts", 0), "replica_recoveries": st.get("replicaRecoveries", 0),
               "sync_interval": SYNC, "checkpoint_every": EVERY,
               "val_loss": loss, "val_loss_undisturbed": base, "job_seconds": round(time.monotonic() - self.t0, 1)}
        print("%s: recovery %s, kill -> first step %s s, steps redone max %d" % (
            case, rep["recovery"], rep["seconds_kill_to_first_step"], rep["steps_redone_max"]))
        out = os.environ.get("EDIT_FAULTS_REPORT_DIR")
        if out:
            os.makedirs(out, exist_ok=True)
            with open(os.path.join(out, case + ".json"), "w") as f:
                json.dump(rep, f, indent=1)
        self.assertIsNotNone(seconds, "no training step after the kill")

    def incarnations(self):
        """Per pod incarnation (by creation order of generation): rank -> list of
        (generation, rows)."""
        by_gen = {}
        for uid, (name, rank, gen) in self.tracker.uids.items():
            for f in glob.glob(os.path.join(self.c.tmp, "kubelet", "pods", "%s_%s_%s" % (self.ns, name, uid), "worker.log")):
                rows = logs.read(f)[0]
                by_gen.setdefault(gen, {}).setdefault(rank, []).append(rows)
        return by_gen

    def steps_redone(self):
        """Steps redone at each resume: per rank, its rows in generation order (a pod whose
        processes were restarted in place, as after a stand-in restart, logs both runs in
        one file); wherever the step goes back, the rank redoes (last step - resume step)."""
        by_gen = self.incarnations()
        out = []
        for rank in range(WORLD):
            seq = [row for g in sorted(by_gen) for runs in by_gen[g].get(rank, []) for row in runs]
            for a, b in zip(seq, seq[1:]):
                if b["step"] <= a["step"]:
                    out.append(a["step"] - (b["step"] - 1))
        return out

    def resumed_from(self, gen):
        starts = [r[0]["step"] - 1 for runs in self.incarnations().get(gen, {}).values() for r in runs if r]
        return min(starts) if starts else None

    def restarted_metric(self):
        return self.c.metric_value("edit_operator_jobs_restarted_total") or 0
