"""Multi-process tests through edit-run: 4 workers on loopback, real Gloo.

Each test starts `edit-run` the way a user does and checks what a user would check: it
exits 0, loss falls, replicas agree on the weights, A-EDiT tolerates a straggler, the
penalty defeats a corrupted replica, SIGTERM checkpoints and a rerun resumes.
"""
import glob
import math
import os
import re
import signal
import subprocess
import tempfile
import unittest

from edit_testing import ckpt, edit_run
from edit_testing.cpu import openblas_coretype
from edit_testing.data import make_data
from edit_testing.logs import progress, summaries
from edit_testing.net import free_port
from edit_testing.paths import EDIT_TRAIN


def newest_ckpt(d):
    return sorted(glob.glob(os.path.join(d, "ckpt", "step-*")))[-1]


class EditRun(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="edit-run-test-")
        self.d = self.tmp.name
        make_data(self.d)

    def tearDown(self):
        self.tmp.cleanup()

    def run_mode(self, mode, shards, sets=()):
        logs = os.path.join(self.d, f"logs-{mode}-{shards}")
        extra = [f"algorithm.mode={mode}", "checkpoint.keep=100"]
        if mode == "a-edit":
            # The time window decides when the machine is slow; the step cap bounds it when
            # it is fast, so every run makes several sync rounds.
            extra += ["algorithm.syncSeconds=0.3", "algorithm.maxStepsPerSync=4"]
        if mode == "ddp":
            extra.append("checkpoint.everySteps=8")
        args = extra + list(sets)  # the test's own settings win
        p = edit_run.run(4, self.base_sets() + args, shards=shards, log_dir=logs)
        self.assertEqual(p.returncode, 0, p.stdout[-3000:] + p.stderr[-3000:])
        self.assertIn("validation loss", p.stdout)  # the summary table's last line
        return logs

    def base_sets(self):
        d = self.d
        return ["model.preset=tiny", "model.dim=64", "model.heads=4", "model.ffnDim=176",
                "model.layers=2", f"data.train={d}/train.bin", f"data.val={d}/val.bin",
                "data.seqLen=32", "data.batchSize=4", "data.valBatches=4", "training.steps=48",
                "training.lr=3e-3", "training.lrWarmupSteps=5", "training.logEvery=4",
                "algorithm.warmupSteps=8", "algorithm.syncInterval=4",
                "algorithm.penalty.anomalyWarmup=3", f"checkpoint.dir={d}/ckpt"]

    def assert_trains(self, mode, shards, sets=()):
        logs = self.run_mode(mode, shards, sets)
        rows = progress(logs)
        s = summaries(logs)
        self.assertEqual(len(s), 4)
        first = rows[0]["loss"]
        self.assertLess(s[0]["val_loss"], first - 0.5, f"{mode}: loss did not fall ({first} -> {s[0]['val_loss']})")
        self.assertTrue(math.isfinite(s[0]["val_loss"]))
        # After the final sync every replica holds the same weights, bit for bit.
        final = newest_ckpt(self.d)
        files = [ckpt.read(os.path.join(final, f"rank-{r:05d}.ckpt")) for r in range(4)]
        for r in range(4):
            peer = files[r % shards]
            for k, v in files[r].items():
                if k.endswith("/theta") or k.endswith("/outer"):
                    self.assertEqual(v, peer[k], f"{mode}: rank {r} differs from rank {r % shards} in {k}")
        if mode == "ddp":
            # ddp: replicas identical at every checkpoint, not only at the end.
            for step_dir in glob.glob(os.path.join(self.d, "ckpt", "step-*")):
                fs = [ckpt.read(os.path.join(step_dir, f"rank-{r:05d}.ckpt")) for r in range(4)]
                for r in range(shards, 4):
                    for k, v in fs[r].items():
                        if k.endswith("/theta"):
                            self.assertEqual(v, fs[r % shards][k], f"{step_dir} rank {r} {k}")
        else:
            self.assertGreater(s[0]["sync_rounds"], 3)
        return s


def _mode_test(mode, shards):
    def t(self):
        self.assert_trains(mode, shards)
    return t


for _mode in ["ddp", "localsgd", "diloco", "edit", "a-edit"]:
    for _shards in (1, 2):
        setattr(EditRun, f"test_{_mode.replace('-', '_')}_M{4 // _shards}_N{_shards}", _mode_test(_mode, _shards))


class Robustness(EditRun):
    def test_overlapped_int8_rounds_train_and_end_identical(self):
        # algorithm.overlapSteps with int8: the rounds run during the next round's local
        # steps on their own process groups; the loss falls, the replicas end bit-identical,
        # and the rounds' bytes are counted in the sync group like any round's.
        s = self.assert_trains("edit", 2, ["algorithm.overlapSteps=2", "algorithm.syncCompression=int8"])
        ops = {c["op"] for c in s[0]["comm"] if c["group"] == "sync" and c["bytes"] > 0}
        self.assertTrue({"alltoall", "allgather"} <= ops, ops)

    def test_aedit_with_overlapped_rounds_trains_and_ends_identical(self):
        # A-EDiT's time-based rounds with algorithm.overlapSteps: the round counter the
        # arrivals are keyed by advances at the sync step, not when the round lands, so
        # consecutive rounds never share a key; the run ends with identical replicas.
        self.assert_trains("a-edit", 2, ["algorithm.overlapSteps=2"])

    def test_aedit_arrived_replica_steps_until_all_arrive(self):
        # 2x2, replica 1 (ranks 2 and 3) sleeps 0.4 s a step, far longer than the 0.1 s
        # window: replica 0 arrives first at every round and keeps making local steps until
        # replica 1 has arrived, instead of waiting in the round's collectives. Both ranks of
        # a replica decide alike, and the run still ends with identical replicas.
        s = self.assert_trains("a-edit", 2, ["algorithm.syncSeconds=0.1", "algorithm.maxStepsPerSync=0",
                                             "debug.injectStepDelay.rank=3", "debug.injectStepDelay.seconds=0.4"])
        waited = [s[r]["steps_awaiting_round"] for r in range(4)]
        print("steps made while awaiting the round, per rank:", waited, "rounds:", s[0]["sync_rounds"])
        self.assertEqual(waited[0], waited[1], waited)
        self.assertEqual(waited[2], waited[3], waited)
        self.assertGreaterEqual(waited[0], s[0]["sync_rounds"],
                                f"replica 0 should step at least once a round while it waits: {waited}")
        self.assertLess(waited[2], waited[0], waited)

    def test_aedit_tolerates_consistent_straggler(self):
        # Rank 3 sleeps ~ twice its own step time every step: it makes fewer local steps per
        # sync, the others more, and 20+ syncs complete without deadlock.
        logs = os.path.join(self.d, "logs")
        sets = self.base_sets() + ["algorithm.mode=a-edit", "algorithm.syncSeconds=0.1", "algorithm.maxStepsPerSync=4",
                                   "training.steps=150", "debug.injectStepDelay.rank=3",
                                   "debug.injectStepDelay.seconds=0.1"]
        p = edit_run.run(4, sets, log_dir=logs)
        self.assertEqual(p.returncode, 0, p.stdout[-2000:] + p.stderr[-2000:])
        s = summaries(logs)
        self.assertGreaterEqual(s[0]["sync_rounds"], 20)
        slow = s[3]["steps"] - 8
        for r in range(3):
            self.assertGreater(s[r]["steps"] - 8, slow, f"rank {r} steps {s[r]['steps']} vs slow {s[3]['steps']}")
        self.assertEqual(len({s[r]["sync_rounds"] for r in range(4)}), 1)
        # The learning rate follows the job's progress, not each replica's step count: the
        # slow replica ends near the minimum like the others (with its own count it would
        # still be high), and no fast replica sat at the minimum long before the end.
        lr, min_lr, warm, total = 3e-3, 3e-4, 5, 150
        def own_schedule(t):
            p = min(1.0, (t - warm) / (total - warm))
            return min_lr + 0.5 * (lr - min_lr) * (1 + math.cos(math.pi * p))
        self.assertGreater(own_schedule(s[3]["steps"]), min_lr + 0.1 * (lr - min_lr),
                           "the straggler is not slow enough for this check")
        for r in range(4):
            rows = progress(logs, r)
            self.assertLess(rows[-1]["lr"], min_lr + 0.05 * (lr - min_lr), f"rank {r} ends at lr {rows[-1]['lr']}")
            at_min = [row["step"] for row in rows if row["lr"] <= min_lr * 1.0001]
            self.assertLessEqual(len(at_min), 2, f"rank {r} at the minimum lr from step {at_min[:1]}")

    def test_corrupt_replica_is_eliminated(self):
        def go(anomaly):
            logs = os.path.join(self.d, f"logs-{anomaly}")
            sets = self.base_sets() + ["algorithm.mode=edit", "debug.corruptReplica.replica=1",
                                       "debug.corruptReplica.atSync=8", "debug.corruptReplica.scale=20",
                                       f"algorithm.penalty.anomaly={anomaly}",
                                       "algorithm.penalty.clip=false", "algorithm.penalty.weighted=false",
                                       f"checkpoint.dir={self.d}/ck-{anomaly}"]
            p = edit_run.run(4, sets, log_dir=logs)
            self.assertEqual(p.returncode, 0, p.stdout[-2000:] + p.stderr[-2000:])
            return summaries(logs)
        on, off = go("true"), go("false")
        self.assertGreater(on[1]["anomalies"], 0)          # the corrupted replica is flagged
        self.assertEqual(on[0]["anomalies"], 0)            # the healthy ones are not
        self.assertTrue(math.isfinite(on[0]["val_loss"]))
        self.assertLess(on[0]["val_loss"], off[0]["val_loss"])  # without the penalty the loss jumps

    def test_stalled_training_fails_the_job(self):
        # The learning rate ramps up for the whole run, so every replica's pseudo-gradient
        # norms grow round after round, and with a z threshold of ~0 any norm above its
        # mean is an anomaly: every replica is dropped every round, the outer weights stop
        # moving. The job must fail saying so (exit 3), not finish "successfully".
        logs = os.path.join(self.d, "logs-stall")
        term = os.path.join(self.d, "termination-log")
        open(term, "w").close()  # the kubelet's /dev/termination-log
        sets = self.base_sets() + ["algorithm.mode=edit", "training.lrWarmupSteps=100000", "training.logEvery=1",
                                   "algorithm.penalty.zThreshold=0.001", "algorithm.penalty.anomalyWarmup=2"]
        env = dict(os.environ, EDIT_TERMINATION_LOG=term)
        p = edit_run.run(4, sets, log_dir=logs, env=env)
        out = p.stdout[-3000:] + p.stderr[-3000:]
        self.assertEqual(p.returncode, 3, out)
        self.assertNotIn("starting a replacement", p.stderr)  # a replacement would replay it
        log0 = open(os.path.join(logs, "rank-0.log")).read()
        self.assertRegex(log0, r"training stalled: the outer step of unit \S+ was skipped in the last 3 sync rounds")
        self.assertIn("algorithm.penalty.maxSkippedRounds=3", log0)
        self.assertTrue(open(term).read().startswith("training stalled: "))
        rows = progress(logs)
        self.assertEqual(rows[-1]["skip_streak"], 3)  # the metrics saw it before the exit
        self.assertGreaterEqual(rows[-1]["outer_skips"], 3)

        # maxSkippedRounds=0: the same run finishes, and the skips are counted.
        logs = os.path.join(self.d, "logs-stall-off")
        p = edit_run.run(4, sets + ["algorithm.penalty.maxSkippedRounds=0"], log_dir=logs)
        self.assertEqual(p.returncode, 0, p.stdout[-2000:] + p.stderr[-2000:])
        self.assertGreater(summaries(logs)[0]["outer_skips"], 0)

    def test_stall_count_survives_a_resume(self):
        # The stalling run of the test above, stopped after two skipped rounds (its final
        # checkpoint holds the streak) and resumed with maxSkippedRounds=3: the first round
        # after the resume is the third in a row and fails the job. Counted from zero again
        # at the resume, a job restarted every K-1 rounds would never be caught.
        sets = self.base_sets() + ["algorithm.mode=edit", "training.lrWarmupSteps=100000", "training.logEvery=1",
                                   "algorithm.penalty.zThreshold=0.001", "algorithm.penalty.anomalyWarmup=2"]
        first = os.path.join(self.d, "logs-first")
        p = edit_run.run(4, sets + ["training.steps=24", "algorithm.penalty.maxSkippedRounds=0"], log_dir=first)
        self.assertEqual(p.returncode, 0, p.stdout[-2000:] + p.stderr[-2000:])
        skips = re.findall(r"sync round (\d+): every replica's pseudo-gradient of unit embed was anomalous"
                           r".*\((\d+) round\(s\) in a row\)", open(os.path.join(first, "rank-0.log")).read())
        self.assertTrue(skips, "the first run skipped no round: nothing to carry over")
        last_round, streak = map(int, skips[-1])
        self.assertEqual(last_round, summaries(first)[0]["sync_rounds"], "the streak must reach the final round")
        self.assertEqual(streak, 2, "this check wants a streak of 2 at the checkpoint")

        logs = os.path.join(self.d, "logs-resumed")
        p = edit_run.run(4, sets + ["training.steps=48", "algorithm.penalty.maxSkippedRounds=3"], log_dir=logs)
        self.assertEqual(p.returncode, 3, p.stdout[-3000:] + p.stderr[-3000:])
        log0 = open(os.path.join(logs, "rank-0.log")).read()
        self.assertIn("resumed from ", log0)
        self.assertIn(f"skipped in the last 3 sync rounds in a row (up to round {last_round + 1})", log0)

    def test_continuing_a_finished_run_equals_one_long_run(self):
        # A finished local-mode run ends on a round and saves it. Rerun with more steps, it
        # continues from there like a run that was that long from the start: no second,
        # empty round at the resume (its zero pseudo-gradient would still apply the outer
        # momentum and feed a zero norm to the anomaly statistics). A constant learning
        # rate (minLr = lr) makes the schedule independent of training.steps. With int8 the
        # compression residuals go through the final checkpoint too.
        for codec in ("none", "int8"):
            sets = self.base_sets() + ["algorithm.mode=edit", "training.minLr=3e-3",
                                       f"algorithm.syncCompression={codec}"]

            def run(tag, steps):
                p = edit_run.run(4, sets + [f"training.steps={steps}", f"checkpoint.dir={self.d}/ck-{tag}"],
                                 shards=2, log_dir=os.path.join(self.d, tag))
                self.assertEqual(p.returncode, 0, p.stdout[-2000:] + p.stderr[-2000:])
                return summaries(os.path.join(self.d, tag))

            straight = run(f"straight-{codec}", 48)
            run(f"continued-{codec}", 24)
            continued = run(f"continued-{codec}", 48)
            self.assertEqual(continued[0]["resumed_from"], 24)
            self.assertEqual(continued[0]["sync_rounds"], straight[0]["sync_rounds"], codec)
            for r in range(4):
                a = ckpt.read(os.path.join(self.d, f"ck-straight-{codec}", "step-00000048", f"rank-{r:05d}.ckpt"))
                b = ckpt.read(os.path.join(self.d, f"ck-continued-{codec}", "step-00000048", f"rank-{r:05d}.ckpt"))
                for k in a:
                    if not k.startswith("meta/"):
                        self.assertEqual(a[k], b.get(k), f"{codec}, rank {r}: {k} differs from the straight run's")

    def test_edit_train_picks_fast_blas_kernels(self):
        """edit-train started directly (as in a pod, without edit-run to set
        OPENBLAS_CORETYPE) still gets OpenBLAS kernels for this CPU, not the SSE3 fallback
        Debian's OpenBLAS picks on recent Xeons, and a passive OpenMP wait policy; values
        already set are kept."""
        want = openblas_coretype()
        if want is None:
            self.skipTest("this CPU needs no OPENBLAS_CORETYPE")
        env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_CORETYPE", "OMP_WAIT_POLICY")}
        env.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
                   EDIT_BIND_ADDR="127.0.0.1")
        sets = self.base_sets() + ["training.steps=2", "algorithm.mode=ddp", "metrics.port=-1"]
        for preset, expect in ((None, want), ("Haswell", "Haswell")):
            e = dict(env, **({"OPENBLAS_CORETYPE": preset, "OMP_WAIT_POLICY": "ACTIVE"} if preset else {}))
            p = subprocess.run([EDIT_TRAIN] + sum((["--set", s] for s in sets), []), env=e,
                               capture_output=True, text=True, timeout=300)
            self.assertEqual(p.returncode, 0, p.stderr[-3000:])
            self.assertIn("OpenBLAS kernels: %s\n" % expect, p.stderr)
            # Idle OpenMP threads wait passively (they would spin against OpenBLAS's threads).
            self.assertIn("OpenMP wait policy: %s\n" % ("PASSIVE" if preset is None else "ACTIVE"), p.stderr)

    def test_sigterm_checkpoints_and_rerun_resumes(self):
        sets = self.base_sets() + ["algorithm.mode=edit", "training.steps=400"]
        p = subprocess.Popen(edit_run.command(4, sets), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for line in p.stdout:
            if line.startswith("step") and int(line.split()[1].split("/")[0]) >= 20:
                break
        p.send_signal(signal.SIGTERM)
        out, _ = p.communicate(timeout=300)
        self.assertNotEqual(p.returncode, 0)
        steps = sorted(glob.glob(os.path.join(self.d, "ckpt", "step-*", "MANIFEST")))
        self.assertTrue(steps, "no checkpoint after SIGTERM:\n" + out[-2000:])
        saved = int(os.path.basename(os.path.dirname(steps[-1]))[5:])
        self.assertGreater(saved, 8)
        logs = os.path.join(self.d, "logs")
        p2 = edit_run.run(4, sets + ["training.steps=60"], log_dir=logs)
        self.assertEqual(p2.returncode, 0, p2.stdout[-2000:] + p2.stderr[-2000:])
        s = summaries(logs)
        self.assertEqual(s[0]["resumed_from"], saved)
        self.assertEqual(s[0]["steps"], 60)


if __name__ == "__main__":
    from edit_testing.unittest_main import main  # exits 77 (ctest: skipped) when every test skipped
    main()
