"""In-place replica recovery through edit-run (docs/replica-recovery.md).

A worker kills itself (SIGKILL, debug.killAtStep) in a local phase; edit-run starts a
replacement with EDIT_JOIN=1; the survivors re-form the process groups with it and every
replica continues from the last sync round, without reading a checkpoint. Checked like a
user would, for rank 0 (the rendezvous store's host) too: the run exits 0, no rank resumed
from disk, at most one sync interval was redone, the replicas end bit-identical, and the
final loss is within noise of an undisturbed run with the same seed. Where in-place
recovery cannot work (the synchronous warmup has no outer state; runtime.recovery=exit;
no replacement comes) the run fails so a launcher restarts the gang from a checkpoint.
"""
import glob
import math
import os
import signal
import subprocess
import time
import unittest

import test_edit_run as base  # the mode tests' temp dir, corpus and tiny schedule
from edit_testing import ckpt, edit_run, logs as edit_logs
from edit_testing.edit_run import start_as_pod
from edit_testing.logs import progress, summaries
from edit_testing.net import free_port
from edit_testing.paths import EDIT_TRAIN

SYNC = 4      # algorithm.syncInterval of EditRun.base_sets
WARMUP = 8    # algorithm.warmupSteps
KILL_AT = 21  # a local step between two sync rounds


class Recovery(unittest.TestCase):
    setUp = base.EditRun.setUp          # a temp dir with a small generated corpus
    tearDown = base.EditRun.tearDown
    base_sets = base.EditRun.base_sets  # the tiny model and schedule of the mode tests

    def launch(self, tag, shards, sets, args=(), env=None):
        logs = os.path.join(self.d, "logs-" + tag)
        sets = self.base_sets() + [f"checkpoint.dir={self.d}/ck-{tag}", "checkpoint.keep=100",
                                   "runtime.collectiveTimeoutSeconds=60",
                                   "runtime.rendezvousTimeoutSeconds=120"] + sets
        p = edit_run.run(4, sets, shards=shards, log_dir=logs, args=args, env=dict(os.environ, **(env or {})))
        return p, logs

    def recover(self, mode, shards, kill_rank, extra=(), kill_at=KILL_AT, env=None, rolls_back=True):
        extra = [f"algorithm.mode={mode}"] + list(extra)
        base, _ = self.launch("undisturbed", shards, extra)
        self.assertEqual(base.returncode, 0, base.stdout[-2000:] + base.stderr[-2000:])
        p, logs = self.launch("killed", shards, extra + [f"debug.killAtStep.rank={kill_rank}",
                                                         f"debug.killAtStep.step={kill_at}"], env=env)
        out = p.stdout[-3000:] + p.stderr[-3000:]
        self.assertEqual(p.returncode, 0, out)
        self.assertIn(f"worker {kill_rank} exited with code 137; starting a replacement", p.stderr)
        s = summaries(logs)
        self.assertEqual(sorted(s), [0, 1, 2, 3], out)
        self.assertTrue(s[kill_rank]["joined"], s[kill_rank])
        # Tokens of the whole run, as for a rank that never died: steps x tokens per step,
        # not only what the replacement trained itself. Under a-edit a replica makes as many
        # steps as its speed allows, so only the other modes match the undisturbed count.
        base_s = summaries(os.path.join(self.d, "logs-undisturbed"))[kill_rank]
        per_step = base_s["tokens"] // base_s["steps"]
        self.assertEqual(s[kill_rank]["tokens"], s[kill_rank]["steps"] * per_step, s[kill_rank])
        if mode != "a-edit":
            self.assertEqual(s[kill_rank]["tokens"], base_s["tokens"], s[kill_rank])
        for r in range(4):
            self.assertEqual(s[r]["resumed_from"], -1, f"rank {r} read a checkpoint")
            if r != kill_rank:
                self.assertEqual(s[r]["recoveries"], 1, s[r])
                # Every replica goes back to the last sync round: at most one interval
                # (plus the steps a far replica made before it noticed, also < SYNC + 1);
                # none when the round in progress rolls forward.
                self.assertLessEqual(s[r]["steps_rolled_back"], SYNC + 1, s[r])
                if rolls_back:
                    self.assertGreater(s[r]["steps_rolled_back"], 0, s[r])
                else:
                    self.assertEqual(s[r]["steps_rolled_back"], 0, s[r])
        # The replicas end bit-identical (the final sync), the replacement included.
        final = sorted(glob.glob(os.path.join(self.d, "ck-killed", "step-*")))[-1]
        files = [ckpt.read(os.path.join(final, f"rank-{r:05d}.ckpt")) for r in range(4)]
        for r in range(shards, 4):
            for k, v in files[r].items():
                if k.endswith("/theta") or k.endswith("/outer"):
                    self.assertEqual(v, files[r % shards][k], f"rank {r} differs from rank {r % shards} in {k}")
        # The anomaly statistics follow each replica's own norms: the shards of a replica,
        # the replacement included, hold the same ones (it copied them from its shard peer).
        for r in range(4):
            head = (r // shards) * shards
            for k, v in files[r].items():
                if k.endswith("/ewma"):
                    self.assertEqual(v, files[head][k], f"rank {r} differs from its shard peer {head} in {k}")
        undisturbed = summaries(os.path.join(self.d, "logs-undisturbed"))[0]["val_loss"]
        got = s[0]["val_loss"]
        self.assertTrue(math.isfinite(got))
        # Redoing < SYNC of 48 steps from the last sync changes the trajectory only a little.
        self.assertLess(abs(got - undisturbed), 0.1 * undisturbed, f"val loss {got} vs undisturbed {undisturbed}")
        self.logs = logs
        print(f"\n{self.id().split('.')[-1]}: val loss {got:.4f} vs undisturbed {undisturbed:.4f}; "
              f"steps rolled back {max(s[r]['steps_rolled_back'] for r in s if r != kill_rank)}, "
              f"recovery {max(s[r]['recovery_seconds'] for r in s if r != kill_rank):.1f} s")
        return s

    def test_edit_M2_N2_shard_lost(self):
        # Rank 3 = replica 1, shard 1: its shard peer (rank 2) notices at once, replica 0
        # at the next sync round; shard 1's outer state comes from rank 1.
        self.recover("edit", 2, 3)

    def test_edit_M2_N2_lost_during_sync_round(self):
        # Step 24 is a sync step: rank 3 dies after the round's control exchange. Every unit's
        # sync needs rank 3 (its shard group completes the unit's norm, its sync group
        # averages the unit), so no rank applied any of round 4: everyone goes back to
        # round 3.
        kill_at = WARMUP + 4 * SYNC
        self.recover("edit", 2, 3, kill_at=kill_at)
        with open(os.path.join(self.logs, "rank-0.log")) as f:
            text = f.read()
        self.assertIn(f"continuing from sync round 3 at step {kill_at - SYNC}", text)

    def test_diloco_M2_N2_round_in_progress_rolls_forward(self):
        # The same loss under DiLoCo, whose sync groups need no shard-group exchange: shard
        # 0's group (ranks 0 and 2) applies all of round 4 while shard 1's (rank 1 and the
        # dead rank 3) applies none. Nobody keeps a copy of the outer state from before the
        # round: round 4 holds with shard 1's units keeping round 3's state, as if the round
        # had skipped them, the replacement copies from rank 1, and nobody redoes a step.
        kill_at = WARMUP + 4 * SYNC
        self.recover("diloco", 2, 3, kill_at=kill_at, rolls_back=False)
        with open(os.path.join(self.logs, "rank-0.log")) as f:
            text = f.read()
        self.assertIn(f"continuing from sync round 4 at step {kill_at}", text)
        units = 4  # the embedding, base_sets' 2 blocks, the head
        self.assertIn(f"sync round 4 stopped part way: its update holds for the first units of each shard "
                      f"(shard 1 0 of {units}); the other units keep round 3's outer state", text)

    def test_edit_M2_N2_round_lost_part_way_rolls_forward(self):
        # EDiT's layer-wise round, with the penalty's shard-group exchanges: rank 3 dies in
        # the sync step just before its unit 2 syncs (debug.killAtStep.unit). Units 0 and 1
        # of round 4 are applied on every survivor, unit 2 nowhere (its norm needs rank 3).
        # Round 4 holds for units 0 and 1 of both shards; the blocks after keep round 3's
        # state; nobody redoes a step, and the replacement copies the round from rank 1.
        kill_at = WARMUP + 4 * SYNC
        self.recover("edit", 2, 3, ["debug.killAtStep.unit=2"], kill_at=kill_at, rolls_back=False)
        logs = {r: read_file(os.path.join(self.logs, f"rank-{r}.log")) for r in range(4)}
        self.assertIn(f"killing this worker (SIGKILL) at step {kill_at} before unit 2's sync", logs[3])
        for r in range(4):
            self.assertIn(f"continuing from sync round 4 at step {kill_at}", logs[r], f"rank {r}")
            self.assertIn("sync round 4 stopped part way: its update holds for the first units of each shard "
                          "(shard 0 2 of 4, shard 1 2 of 4); the other units keep round 3's outer state",
                          logs[r], f"rank {r}")

    def test_stall_count_is_agreed_with_the_replacement(self):
        # The stalling run of test_edit_run.py (every replica anomalous at every round from
        # round 3 on), with rank 3 lost at step 25, after two skipped rounds. The
        # replacement takes the survivors' count of skipped rounds: round 5 is the third in
        # a row on every rank, and the job fails there as one. With a count of its own from
        # zero it would train on alone while the others stop.
        sets = ["algorithm.mode=edit", "training.lrWarmupSteps=100000", "training.logEvery=1",
                "algorithm.penalty.zThreshold=0.001", "algorithm.penalty.anomalyWarmup=2",
                "algorithm.penalty.maxSkippedRounds=3", "debug.killAtStep.rank=3", "debug.killAtStep.step=25"]
        p, logs = self.launch("stall", 2, sets)
        out = p.stdout[-3000:] + p.stderr[-3000:]
        self.assertEqual(p.returncode, 3, out)
        self.assertIn("worker 3 exited with code 137; starting a replacement", p.stderr)
        with open(os.path.join(logs, "rank-0.log")) as f:
            self.assertIn("skipped in the last 3 sync rounds in a row (up to round 5)", f.read())
        # Each rank reports the round before the stall check: the replacement's last report
        # is round 5's, with the whole count.
        last = progress(logs, 3)[-1]
        self.assertEqual((last["sync_rounds"], last["skip_streak"]), (5, 3), last)

    def test_every_rank_replaced_at_once_falls_back_to_a_gang_restart(self):
        # Every worker of a 2 x 1 job is lost at once in its local phase (a node with all
        # the pods), and each gets a replacement, as the operator makes them. Rank 0's
        # replacement opens the recovery generation on a fresh store without a size; no
        # survivor is left to name it, so it names its own after a grace period, and the
        # replacements find that nobody holds the state: exit 75 (a gang restart from the
        # checkpoint) at once, not at the default 600 s rendezvous deadline.
        port = free_port()
        sets = self.base_sets() + ["algorithm.mode=edit", "training.steps=400", "training.logEvery=1",
                                   "metrics.port=-1", f"checkpoint.dir={self.d}/ck-all"]
        args = [EDIT_TRAIN] + sum((["--set", s] for s in sets), [])

        def start(rank, join):
            return start_as_pod(self, args, os.path.join(self.d, f"all-{rank}-{join}.log"), rank, 2, port, join, 2)

        first = [start(0, "0"), start(1, "0")]
        deadline = time.time() + 120
        log0 = os.path.join(self.d, "all-0-0.log")
        while time.time() < deadline:  # past the warm-up: a local phase
            rows = edit_logs.read(log0)[0]
            if rows and rows[-1]["step"] >= WARMUP + SYNC + 2:
                break
            time.sleep(0.1)
        else:
            self.fail("the job did not reach its local phase:\n" + open(log0).read()[-2000:])
        for p in first:
            p.kill()
            p.wait()
        replacements = [start(0, "1"), start(1, "1")]
        for r, p in enumerate(replacements):
            self.assertEqual(p.wait(timeout=300), 75, open(os.path.join(self.d, f"all-{r}-1.log")).read()[-2000:])
        text = open(os.path.join(self.d, "all-0-1.log")).read()
        self.assertIn("no survivor named the size of generation 1", text)
        self.assertIn("cannot recover in place: no survivor holds an outer state", text)

    def test_removed_snapshot_dir_key_says_what_to_do(self):
        # runtime.recoverySnapshotDir went with the snapshot: a config that still sets it is
        # refused with what to do, not a bare "unknown key".
        p, _ = self.launch("nodir", 2, ["algorithm.mode=edit", f"runtime.recoverySnapshotDir={self.d}"])
        self.assertEqual(p.returncode, 2, p.stdout[-2000:] + p.stderr[-2000:])
        self.assertIn("runtime.recoverySnapshotDir: removed: in-place recovery keeps no copy of the outer state",
                      p.stdout + p.stderr)
        self.assertIn("delete the key", p.stdout + p.stderr)

    def test_edit_M4_N1_replica_lost(self):
        self.recover("edit", 1, 2)

    def test_diloco_M2_N2(self):
        self.recover("diloco", 2, 1)

    def test_aedit_M4_N1(self):
        # Time-based rounds: replicas reach a round at different steps.
        self.recover("a-edit", 1, 3, ["algorithm.syncSeconds=0.3", "algorithm.maxStepsPerSync=4"])

    def test_edit_M2_N2_rank0_lost(self):
        # Rank 0 hosted the rendezvous store: its replacement hosts a fresh one at the same
        # address and the survivors reconnect to it.
        self.recover("edit", 2, 0)
        with open(os.path.join(self.logs, "rank-1.log")) as f:
            self.assertIn("recovered in place (generation 1", f.read())

    def test_aedit_M2_N2_rank0_lost(self):
        # A-EDiT keeps a store connection on each replica's shard rank 0 (rank 2 here) for
        # the rounds' arrivals: when rank 0, the store's host, dies, that connection fails
        # like any peer and rank 2 reconnects to the replacement's fresh store.
        self.recover("a-edit", 2, 0, ["algorithm.syncSeconds=0.3", "algorithm.maxStepsPerSync=4"])
        for r in (1, 2, 3):
            with open(os.path.join(self.logs, f"rank-{r}.log")) as f:
                self.assertIn("recovered in place (generation 1", f.read(), f"rank {r}")

    def test_connection_lost_during_the_state_copy_is_retried(self):
        # A race the soak found: a survivor loses a connection while the replacement arrives and
        # copies its state. Here rank 1, the source of shard 1's outer state for rank 3's
        # replacement, drops its groups in the middle of its first copy (a test hook), as
        # when another rank fails or leaves at that moment. Every rank of that generation
        # goes round again and meets in the next one, instead of exiting 75.
        self.recover("edit", 2, 3, env={"EDIT_TEST_DROP_COPY_RANK": "1"})
        logs = {r: read_file(os.path.join(self.logs, f"rank-{r}.log")) for r in range(4)}
        self.assertIn("recovery attempt 1 in generation 1 failed", logs[1])
        self.assertIn("joining in generation 1 failed", logs[3])
        for r in range(4):
            self.assertIn("recovered in place (generation 2", logs[r], f"rank {r}")

    def expect_gang_restart(self, sets, why, code=75, args=()):
        p, logs = self.launch("fails", 2, ["algorithm.mode=edit"] + sets, args)
        self.assertEqual(p.returncode, code, p.stdout[-2000:] + p.stderr[-2000:])
        self.assertIn(why, p.stderr)
        return p

    def test_no_replacement_stops_the_survivors(self):
        # With no replacement coming (--max-recoveries 0) edit-run stops the others; the
        # survivors waiting in the rendezvous leave at once on its SIGTERM.
        p = self.expect_gang_restart(["debug.killAtStep.rank=2", f"debug.killAtStep.step={KILL_AT}"],
                                     "worker 2 exited with code 137; stopping the other workers", code=137,
                                     args=["--max-recoveries", "0"])
        self.assertIn("stopped by SIGTERM while waiting for peers", p.stderr)

    def test_warmup_has_no_outer_state(self):
        self.expect_gang_restart(["debug.killAtStep.rank=2", "debug.killAtStep.step=3"],
                                 "no outer state yet")

    def test_overlapped_rounds_fall_back_to_a_gang_restart(self):
        self.expect_gang_restart(["algorithm.overlapSteps=4", "debug.killAtStep.rank=2",
                                  f"debug.killAtStep.step={KILL_AT}"], "not supported with algorithm.overlapSteps")

    def test_recovery_exit_policy(self):
        self.expect_gang_restart(["runtime.recovery=exit", "debug.killAtStep.rank=2",
                                  f"debug.killAtStep.step={KILL_AT}"], "runtime.recovery=exit")

    # ---- SIGTERM on one worker (its pod deleted or evicted), not the gang ------------------
    def sigterm_one(self, rank, at_step, sets):
        """Starts edit-run, sends SIGTERM to worker `rank` alone once it logged `at_step`,
        returns (edit-run's exit code, stderr, logs dir)."""
        logs = os.path.join(self.d, "logs-term")
        sets = self.base_sets() + [f"checkpoint.dir={self.d}/ck-term", "checkpoint.keep=100",
                                   "training.logEvery=1", "runtime.collectiveTimeoutSeconds=60",
                                   "runtime.rendezvousTimeoutSeconds=120"] + sets
        p = subprocess.Popen(edit_run.command(4, sets, shards=2, log_dir=logs, quiet=True),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 300
            pid = None
            while pid is None:
                self.assertLess(time.monotonic(), deadline, "worker never reached step %d" % at_step)
                self.assertIsNone(p.poll(), "edit-run ended early")
                time.sleep(0.05)
                steps = logged_steps(logs, rank)
                if steps and steps[-1] >= at_step:
                    pid = worker_pid(p.pid, rank)
            os.kill(pid, signal.SIGTERM)
            out, err = p.communicate(timeout=300)
        finally:
            if p.poll() is None:
                p.kill()
        return p.returncode, err, logs

    def test_sigterm_one_worker_leaves_and_is_replaced_in_place(self):
        # Only rank 1 gets SIGTERM in a local phase: it leaves at the second control exchange
        # after the signal (exit 76: had the whole gang been signalled, every rank would
        # have seen it by then and stopped together), edit-run replaces it, and the others
        # recover in place: no checkpoint read, no worker stopped, exit 0.
        code, err, logs = self.sigterm_one(1, 14, ["algorithm.mode=edit", "training.steps=64"])
        self.assertEqual(code, 0, err[-3000:])
        self.assertIn("worker 1 exited with code 76; starting a replacement", err)
        with open(os.path.join(logs, "rank-1.log")) as f:
            self.assertIn("left the job: SIGTERM reached 1 of 4 workers", f.read())
        s = summaries(logs)
        self.assertEqual(sorted(s), [0, 1, 2, 3])
        self.assertTrue(s[1]["joined"], s[1])
        for r in range(4):
            self.assertFalse(s[r]["stopped"], s[r])
            self.assertEqual(s[r]["resumed_from"], -1, f"rank {r} read a checkpoint")
            self.assertEqual(s[r]["steps"], 64, s[r])
            if r != 1:
                self.assertEqual(s[r]["recoveries"], 1, s[r])
                self.assertLessEqual(s[r]["steps_rolled_back"], SYNC + 1, s[r])

    def test_sigterm_one_worker_in_warmup_stops_the_gang(self):
        # In the synchronous warm-up there is no outer state to recover from: one worker's
        # SIGTERM stops every worker after a checkpoint, as before (exit 143).
        code, err, logs = self.sigterm_one(2, 3, ["algorithm.mode=edit", "algorithm.warmupSteps=40",
                                                  "training.steps=48"])
        self.assertEqual(code, 143, err[-3000:])
        s = summaries(logs)
        self.assertTrue(all(x["stopped"] for x in s.values()), s)
        self.assertTrue(glob.glob(os.path.join(self.d, "ck-term", "step-*", "MANIFEST")), "no checkpoint")


class StoreConnections(unittest.TestCase):
    setUp = base.EditRun.setUp
    tearDown = base.EditRun.tearDown
    base_sets = base.EditRun.base_sets

    def test_only_rank0_is_connected_to_the_store_while_training(self):
        """The ranks other than rank 0 hold no connection to the store while they train
        (docs/replica-recovery.md): rank 0 serves no idle connections, and a rank 0 that
        leaves mid-round touches no one until the next recovery. Rank 0 hosts it."""
        held = self.store_connections_while_training("edit")
        for r in (0, 1, 2, 3):
            self.assertEqual(held[r], 0, f"rank {r} keeps {held[r]} connection(s) to the store: {held}")

    def test_aedit_keeps_one_store_connection_per_replica(self):
        """A-EDiT posts each replica's arrival at a round on the store: the shard rank 0 of
        each replica but rank 0's (rank 2 in 2x2) keeps one connection; the others none."""
        held = self.store_connections_while_training("a-edit", ["algorithm.syncSeconds=0.05"])
        self.assertEqual(held, {0: 0, 1: 0, 2: 1, 3: 0})

    def store_connections_while_training(self, mode, extra=()):
        """{rank: connections to MASTER_PORT} of a 2x2 run well past its warm-up."""
        logs = os.path.join(self.d, "logs")
        sets = self.base_sets() + [f"algorithm.mode={mode}", "training.steps=400", "training.logEvery=1",
                                   f"checkpoint.dir={self.d}/ck"] + list(extra)
        p = subprocess.Popen(edit_run.command(4, sets, shards=2, log_dir=logs, quiet=True),
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 300
            while True:  # every rank past the warm-up: the groups are long formed
                self.assertLess(time.monotonic(), deadline, "the workers never got past the warm-up")
                self.assertIsNone(p.poll(), "edit-run ended early")
                time.sleep(0.1)
                if min(max(logged_steps(logs, r) or [0]) for r in range(4)) > WARMUP + SYNC:
                    break
            pids = [worker_pid(p.pid, r) for r in range(4)]
            env = dict(e.split("=", 1) for e in read_file(f"/proc/{pids[1]}/environ").split("\0") if "=" in e)
            port = int(env["MASTER_PORT"])
            held = {r: store_connections(pid, port) for r, pid in enumerate(pids)}
            served = tcp_sockets(pids[0], port, state="0A", local=True)  # rank 0 listens on MASTER_PORT
        finally:
            p.kill()
            p.communicate()
        # A SIGKILLed edit-run leaves no workers behind: they get SIGTERM and stop.
        deadline = time.monotonic() + 120
        while any(os.path.exists(f"/proc/{pid}") and not zombie(pid) for pid in pids):
            self.assertLess(time.monotonic(), deadline, f"workers {pids} outlived a SIGKILLed edit-run")
            time.sleep(0.2)
        self.assertEqual(served, 1, "rank 0 does not listen on MASTER_PORT")
        return held

def zombie(pid):
    """True when process `pid` has exited and waits to be reaped (state Z)."""
    try:
        return read_file(f"/proc/{pid}/stat").rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def logged_steps(logs, rank):
    """The steps rank `rank` logged so far (empty while its log is missing or half written)."""
    try:
        return [row["step"] for row in edit_logs.read(os.path.join(logs, f"rank-{rank}.log"))[0]]
    except OSError:
        return []


def store_connections(pid, port):
    """Established TCP connections of process `pid` whose remote port is `port`."""
    return tcp_sockets(pid, port, state="01", local=False)


def tcp_sockets(pid, port, state, local):
    """Sockets of process `pid` in TCP state `state` (01 established, 0A listening) whose
    local (or remote) port is `port`."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    n = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in read_file(table).splitlines()[1:]:
            f = line.split()
            if f[3] == state and int(f[1 if local else 2].rsplit(":", 1)[1], 16) == port and f[9] in inodes:
                n += 1
    return n


def read_file(path, mode="r"):
    with open(path, mode) as f:
        return f.read()


def worker_pid(launcher, rank):
    """The pid of edit-run's child with RANK=rank (edit-train re-executes itself in place)."""
    read = read_file
    for child in os.listdir("/proc"):
        try:
            if not child.isdigit() or int(read(f"/proc/{child}/stat").rsplit(")", 1)[1].split()[1]) != launcher:
                continue
            env = read(f"/proc/{child}/environ", "rb").split(b"\0")
        except (OSError, IndexError, ValueError):
            continue
        if f"RANK={rank}".encode() in env:
            return int(child)
    raise AssertionError(f"no worker with RANK={rank} under pid {launcher}")


if __name__ == "__main__":
    from edit_testing.unittest_main import main  # exits 77 (ctest: skipped) when every test skipped
    main()
