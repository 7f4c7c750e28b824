"""Elastic replicas through edit-run --scale-at, and checkpoints resumed at another number
of replicas (docs/elastic.md).

A job grows from 2 to 3 replicas and shrinks back to 2 while it trains, in a 4x1-style
layout (1 shard per replica) and a 2x2-style one (2 shards). Checked like a user would:
the run exits 0, nothing is read from a checkpoint, the new replica's ranks join from
their sync-group peers and leave again, the survivors never restart, the replicas end
bit-identical, and the validation loss is close to a run that kept 2 replicas.
"""
import glob
import math
import os
import re
import shutil
import signal
import subprocess
import time
import unittest

import test_edit_run as base  # the mode tests' temp dir, corpus and tiny schedule
from edit_testing import ckpt, edit_run
from edit_testing.edit_run import start_as_pod
from edit_testing.logs import summaries
from edit_testing.net import free_port
from edit_testing.paths import EDIT_TRAIN

GROW_AT, SHRINK_AT = 16, 32  # sync steps of base_sets (warm-up 8, a round every 4 steps)
RESUME_AT = 18               # a step between two of its sync rounds
TOKENS_PER_STEP = 4 * 32     # data.batchSize x data.seqLen of base_sets


def assert_final_replicas_identical(test, ck_dir, world, shards):
    """The newest checkpoint of ck_dir holds bit-identical weights on every replica."""
    final = sorted(glob.glob(os.path.join(ck_dir, "step-*")))[-1]
    files = [ckpt.read(os.path.join(final, f"rank-{r:05d}.ckpt")) for r in range(world)]
    for r in range(shards, world):
        for k, v in files[r].items():
            if k.endswith("/theta") or k.endswith("/outer"):
                test.assertEqual(v, files[r % shards][k], f"rank {r} differs from rank {r % shards} in {k}")
    return final


class Elastic(unittest.TestCase):
    setUp = base.EditRun.setUp
    tearDown = base.EditRun.tearDown
    base_sets = base.EditRun.base_sets

    def launch(self, tag, nproc, shards, sets=(), args=(), ck=None):
        logs = os.path.join(self.d, "logs-" + tag)
        sets = self.base_sets() + ["algorithm.mode=edit", f"checkpoint.dir={ck or self.d + '/ck-' + tag}",
                                   "runtime.rendezvousTimeoutSeconds=120"] + list(sets)
        p = edit_run.run(nproc, sets, shards=shards, log_dir=logs, args=args, timeout=900)
        return p, logs

    def grow_and_shrink(self, shards, sets=()):
        n = shards
        fixed, fixed_logs = self.launch("fixed", 2 * n, n, sets)
        self.assertEqual(fixed.returncode, 0, fixed.stdout[-2000:] + fixed.stderr[-2000:])
        p, logs = self.launch("elastic", 2 * n, n, sets,
                              ["--scale-at", f"{GROW_AT}:3", "--scale-at", f"{SHRINK_AT}:2"])
        out = p.stdout[-3000:] + p.stderr[-3000:]
        self.assertEqual(p.returncode, 0, out)
        self.assertIn(f"edit-run: scaling from 2 to 3 replicas: workers {2 * n}..{3 * n - 1} start", p.stderr)
        self.assertIn(f"edit-run: scaling from 3 to 2 replicas: workers {2 * n}..{3 * n - 1} leave", p.stderr)
        s = summaries(logs)
        self.assertEqual(sorted(s), list(range(3 * n)), out)
        for r in range(3 * n):
            self.assertEqual(s[r]["resumed_from"], -1, f"rank {r} read a checkpoint")
            self.assertEqual(s[r]["recoveries"], 0, s[r])
        for r in range(2 * n):
            # The survivors went through both changes without a restart.
            self.assertFalse(s[r]["joined"], s[r])
            self.assertEqual(s[r]["scales"], 2, s[r])
            self.assertFalse(s[r]["left_at_scale"], s[r])
            self.assertEqual(s[r]["steps"], 48, s[r])
        for r in range(2 * n, 3 * n):
            # The new replica joined at the first change and left at the second, counting
            # only the tokens it trained: from the round it joined at to the one it left at.
            self.assertTrue(s[r]["joined"], s[r])
            self.assertTrue(s[r]["left_at_scale"], s[r])
            with open(os.path.join(logs, f"rank-{r}.log")) as f:
                text = f.read()
            m = re.search(r"scaled to 3 replicas .*continuing from sync round \d+ at step (\d+) as a new replica", text)
            self.assertIsNotNone(m, text[-2000:])
            joined_at = int(m.group(1))
            self.assertEqual(joined_at, GROW_AT)
            self.assertEqual(s[r]["steps"], SHRINK_AT + 1, s[r])
            self.assertEqual(s[r]["tokens"], (s[r]["steps"] - joined_at) * TOKENS_PER_STEP, s[r])
            self.assertEqual(s[r]["val_loss"], -1, "a replica that left evaluates nothing")
        # The replicas end bit-identical (the final sync), in the final checkpoint of the
        # 2-replica world.
        final = assert_final_replicas_identical(self, os.path.join(self.d, "ck-elastic"), 2 * n, n)
        self.assertTrue(final.endswith("step-00000048"), final)
        self.assertFalse(os.path.exists(os.path.join(final, f"rank-{2 * n:05d}.ckpt")))
        got = s[0]["val_loss"]
        ref = summaries(fixed_logs)[0]["val_loss"]
        self.assertTrue(math.isfinite(got))
        # A third replica for 16 of 48 steps adds tokens; it must not hurt the model.
        self.assertLess(got, ref * 1.02, f"val loss {got} vs {ref} with 2 replicas throughout")
        print(f"\n{self.id().split('.')[-1]}: val loss {got:.4f} vs {ref:.4f} fixed; "
              f"scale seconds {max(s[r]['scale_seconds'] for r in range(2 * n)):.1f}")

    def test_edit_grows_and_shrinks_N1(self):
        self.grow_and_shrink(1)

    def test_edit_grows_and_shrinks_N2(self):
        self.grow_and_shrink(2)

    def test_int8_sync_grows_and_shrinks(self):
        # The compressed sync's owned parts follow M (their residuals restart at zero).
        self.grow_and_shrink(1, ["algorithm.syncCompression=int8"])

    def test_aedit_with_a_straggler_grows_and_shrinks(self):
        # A-EDiT's replicas reach a round at different steps of their own (rank 1 is slow):
        # the scale points are in the job's agreed progress, so every rank scales at the
        # same round, and the run still ends with identical replicas.
        p, logs = self.launch("aedit", 2, 1, ["algorithm.mode=a-edit", "algorithm.syncSeconds=0.3",
                                               "algorithm.maxStepsPerSync=6", "debug.injectStepDelay.rank=1",
                                               "debug.injectStepDelay.seconds=0.02"],
                              ["--scale-at", f"{GROW_AT}:3", "--scale-at", f"{SHRINK_AT}:2"])
        out = p.stdout[-3000:] + p.stderr[-3000:]
        self.assertEqual(p.returncode, 0, out)
        s = summaries(logs)
        self.assertEqual(sorted(s), [0, 1, 2], out)
        for r in (0, 1):
            self.assertEqual(s[r]["scales"], 2, s[r])
            self.assertEqual(s[r]["recoveries"], 0, s[r])
        self.assertTrue(s[2]["joined"] and s[2]["left_at_scale"], s[2])
        assert_final_replicas_identical(self, os.path.join(self.d, "ck-aedit"), 2, 1)
        self.assertTrue(math.isfinite(s[0]["val_loss"]))

    def test_new_replica_that_dies_before_joining_leaves_the_job_at_its_size(self):
        # The new replica's rank exits before it joins (as a pod that never starts): the
        # others give up on the scale-up at their rendezvous deadline and train on with 2
        # replicas; no gang restart, exit 0, and the job says so.
        os.environ["EDIT_TEST_SCALE_JOIN_EXIT"] = "1"
        try:
            p, logs = self.launch("failed", 2, 1, ["runtime.rendezvousTimeoutSeconds=8"],
                                  ["--scale-at", f"{GROW_AT}:3"])
        finally:
            del os.environ["EDIT_TEST_SCALE_JOIN_EXIT"]
        out = p.stdout[-3000:] + p.stderr[-3000:]
        self.assertEqual(p.returncode, 0, out)
        self.assertIn("edit-run: worker 2 of a new replica exited with code 1 before it joined; "
                      "the job stays at 2 replicas", p.stderr)
        self.assertIn("scale-up to 3 replicas failed", p.stderr)
        s = summaries(logs)
        for r in (0, 1):
            self.assertEqual(s[r]["scales"], 0, s[r])
            self.assertEqual(s[r]["scales_abandoned"], 1, s[r])
            self.assertEqual(s[r]["recoveries"], 0, s[r])
            self.assertEqual(s[r]["steps"], 48, s[r])
        assert_final_replicas_identical(self, os.path.join(self.d, "ck-failed"), 2, 1)

    def stale_replacement_joins(self, lost):
        # On a cluster the operator renders a replacement pod's WORLD_SIZE from
        # status.replicas, which moves only once the scale is confirmed: a worker lost just
        # after the world grew gets a replacement that still says 2 replicas. The workers
        # are started here as the pods would be (edit-train, the pods' environment): ranks 0
        # and 1 of 2 replicas, rank 2 as the new replica's (EDIT_JOIN=scale), the world grows
        # to 3 at step 16, rank `lost` dies at step 22 and its replacement says 2 replicas.
        # It must join the survivors' generation of 3, and the job finish in place.
        port = free_port()
        ck = os.path.join(self.d, "ck-stale")
        sets = self.base_sets() + ["algorithm.mode=edit", f"checkpoint.dir={ck}", "metrics.port=-1",
                                   "runtime.rendezvousTimeoutSeconds=60", f"debug.killAtStep.rank={lost}",
                                   "debug.killAtStep.step=22"]
        args = [EDIT_TRAIN] + sum((["--set", s] for s in sets), [])
        logs = {}

        def start(rank, replicas, join, tag):
            logs[tag] = os.path.join(self.d, f"rank-{tag}.log")
            return start_as_pod(self, args, logs[tag], rank, replicas, port, join, 3,
                                EDIT_SCALE_AT=f"{GROW_AT}:3")

        procs = {"0": start(0, 2, "0", "0"), "1": start(1, 2, "0", "1"), "2": start(2, 3, "scale", "2")}
        self.assertEqual(procs[str(lost)].wait(timeout=300), -signal.SIGKILL)
        procs[f"{lost}-replacement"] = start(lost, 2, "1", f"{lost}-replacement")
        del procs[str(lost)]
        for tag, p in procs.items():
            self.assertEqual(p.wait(timeout=300), 0, tag + ": " + open(logs[tag]).read()[-3000:])
        text = open(logs[f"{lost}-replacement"]).read()
        self.assertIn("the running job has 3 replicas, not the 2 of this worker's environment", text)
        self.assertIn("recovered in place", open(logs["2"]).read())
        assert_final_replicas_identical(self, ck, 3, 1)

    def test_replacement_started_for_the_old_size_joins_at_the_new_one(self):
        self.stale_replacement_joins(1)

    def test_rank0_replacement_started_for_the_old_size_joins_at_the_new_one(self):
        # Rank 0 hosts the job's store: its replacement hosts a fresh one and opens the
        # recovery generation without a size; the survivors, which know it, name it.
        self.stale_replacement_joins(0)

    def test_sigusr1_grows_and_sigusr2_shrinks(self):
        # Asked while the job runs: kill -USR1 edit-run adds a replica at the next sync
        # round, kill -USR2 removes one. Rank 0 is paced so the signals land mid-run.
        logs = os.path.join(self.d, "logs-signals")
        sets = self.base_sets() + ["algorithm.mode=edit", f"checkpoint.dir={self.d}/ck-signals",
                                   "runtime.rendezvousTimeoutSeconds=120", "training.steps=160",
                                   "debug.injectStepDelay.rank=0", "debug.injectStepDelay.seconds=0.03"]
        p = subprocess.Popen(edit_run.command(2, sets, log_dir=logs), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
        rank0 = os.path.join(logs, "rank-0.log")

        def wait_for(pattern, timeout=120):
            end = time.time() + timeout
            while time.time() < end:
                if os.path.exists(rank0):
                    with open(rank0) as f:
                        m = re.search(pattern, f.read())
                    if m:
                        return m
                time.sleep(0.1)
            p.kill()
            self.fail(f"no {pattern!r} in rank 0's log: {p.communicate()[1][-2000:]}")

        wait_for(r'@edit .*"phase":\s*"local"')
        p.send_signal(signal.SIGUSR1)
        grew = int(wait_for(r"scaled to 3 replicas .* at step (\d+)").group(1))
        p.send_signal(signal.SIGUSR2)
        shrank = int(wait_for(r"scaled to 2 replicas .* at step (\d+)").group(1))
        out, err = p.communicate(timeout=600)
        self.assertEqual(p.returncode, 0, out[-2000:] + err[-2000:])
        self.assertIn("edit-run: SIGUSR1: one replica more at the next sync round", err)
        self.assertIn("edit-run: SIGUSR2: one replica fewer at the next sync round", err)
        self.assertLess(grew, shrank)
        s = summaries(logs)
        self.assertEqual(sorted(s), [0, 1, 2], err[-2000:])
        for r in (0, 1):
            self.assertEqual(s[r]["scales"], 2, s[r])
            self.assertEqual(s[r]["steps"], 160, s[r])
        self.assertTrue(s[2]["joined"] and s[2]["left_at_scale"], s[2])
        self.assertEqual(s[2]["steps"], shrank + 1, s[2])
        assert_final_replicas_identical(self, os.path.join(self.d, "ck-signals"), 2, 1)

    def checkpoint_between_rounds(self, tag, replicas, shards):
        """Trains `replicas` x `shards` to RESUME_AT, a step between two sync rounds, and
        returns the checkpoint directory whose newest checkpoint is that step's."""
        ck = os.path.join(self.d, "ck-" + tag)
        p, _ = self.launch(tag, replicas * shards, shards,
                           [f"checkpoint.everySteps={RESUME_AT}", f"training.steps={RESUME_AT + 2}"], ck=ck)
        self.assertEqual(p.returncode, 0, p.stdout[-2000:] + p.stderr[-2000:])
        shutil.rmtree(os.path.join(ck, f"step-{RESUME_AT + 2:08d}"))  # the final one: resume from RESUME_AT
        return ck

    def resume_at(self, tag, ck, old_replicas, replicas, shards):
        """Resumes ck with `replicas` x `shards` to the end (48 steps) and checks it like a
        user would: exit 0, every rank resumed from RESUME_AT, the log says the checkpoint
        had another size, a new replica counts only its own tokens, identical replicas."""
        p, logs = self.launch(tag, replicas * shards, shards, ck=ck)
        out = p.stdout[-3000:] + p.stderr[-3000:]
        self.assertEqual(p.returncode, 0, out)
        s = summaries(logs)
        self.assertEqual(sorted(s), list(range(replicas * shards)), out)
        for r in range(replicas * shards):
            self.assertEqual(s[r]["resumed_from"], RESUME_AT, s[r])
            self.assertEqual(s[r]["steps"], 48, s[r])
            self.assertEqual(s[r]["recoveries"], 0, s[r])
            with open(os.path.join(logs, f"rank-{r}.log")) as f:
                text = f.read()
            self.assertIn(f"step-{RESUME_AT:08d} was written with {old_replicas} replicas; "
                          f"resuming it with {replicas}", text)
            self.assertIn(f"resumed from {ck}/step-{RESUME_AT:08d} at step {RESUME_AT}", text)
            new = r // shards >= old_replicas
            if new:
                self.assertIn(f"this new replica continues from a copy of replica {(r // shards) % old_replicas}",
                              text)
            # A new replica counts only what it trained; the others the whole job's share.
            self.assertEqual(s[r]["tokens"], (48 - RESUME_AT if new else 48) * TOKENS_PER_STEP, s[r])
        final = assert_final_replicas_identical(self, ck, replicas * shards, shards)
        self.assertTrue(final.endswith("step-00000048"), final)
        self.assertTrue(math.isfinite(s[0]["val_loss"]))
        return s

    def test_resume_a_2_replica_checkpoint_with_3_and_with_1(self):
        # What an operator's gang restart after a scale does, or a suspended job resumed at
        # another size: the same checkpoint continues with one replica more, and with one fewer.
        ck = self.checkpoint_between_rounds("two", 2, 1)
        ck1 = ck + "-copy"
        shutil.copytree(ck, ck1)
        self.resume_at("three", ck, 2, 3, 1)
        self.resume_at("one", ck1, 2, 1, 1)

    def test_resume_2x2_with_3x2_and_refuse_4x1(self):
        ck = self.checkpoint_between_rounds("2x2", 2, 2)
        # Other shards per replica: refused (exit 2) before a step, naming both layouts.
        p, _ = self.launch("4x1", 4, 1, ck=ck)
        self.assertEqual(p.returncode, 2, p.stdout[-2000:] + p.stderr[-2000:])
        self.assertIn(f"invalid checkpoint: {ck}/step-{RESUME_AT:08d}: written with 2 replicas x 2 shards, "
                      "this run has 4 replicas x 1 shards", p.stderr)
        self.resume_at("3x2", ck, 2, 3, 2)

    def test_scale_needs_a_local_mode(self):
        p, _ = self.launch("ddp", 2, 1, ["algorithm.mode=ddp"], ["--scale-at", "16:3"])
        self.assertEqual(p.returncode, 2, p.stdout[-2000:] + p.stderr[-2000:])
        self.assertIn("EDIT_SCALE_AT (edit-run --scale-at) needs a local mode", p.stderr)

    def test_malformed_scale_at_is_a_usage_error(self):
        for bad, why in [("16", "is not STEP:REPLICAS"), ("16:0", "must be >= 1"), ("20:3,10:2", "steps must increase")]:
            p = edit_run.run(2, args=["--scale-at", bad], timeout=60)
            self.assertEqual(p.returncode, 2, p.stderr)
            self.assertIn("--scale-at", p.stderr)
            self.assertIn(why, p.stderr)


if __name__ == "__main__":
    unittest.main()
