#!/usr/bin/env python3
"""Goodput under repeated failures: a soak run on the Kubernetes path.

For each layout (2 replicas x 2 shards, 4 replicas x 1 shard) this runs, on the API
stand-in with its kubelet and the edit-operator (edit_testing.cluster), one after another:

  calibration   a short EDiTJob that measures the step rate, to size the next two jobs
                so that an undisturbed run lasts about --duration seconds
  undisturbed   the job with that many steps and no fault: tokens/s and final val loss
  soak          the same job while every --fault-every seconds (jittered) one fault,
                drawn at random (without replacement from a bag of all kinds, refilled
                when empty), hits it:
                  kill      SIGKILL a random worker
                  stop      SIGSTOP a random worker (a hang; the operator's hang detection
                            must find it, hangTimeoutSeconds 10)
                  delete    `kubectl delete pod` a random worker (SIGTERM, grace period)
                  operator  SIGKILL the operator; the harness starts a new one 1-5 s later,
                            as a Deployment would
                  standin   crash the API stand-in and its kubelet (SIGKILL) and start it
                            again (same port, --state kept): the pods' processes keep
                            running and the new kubelet adopts them, as containers outlive
                            a restart of a real API server or kubelet

The next fault waits until training resumed after the previous one (every rank logged a
step from a process started after it), so faults do not pile up; none is injected in the
synchronous warm-up or the last sync intervals of the job (the final whole-model sync and
evaluation cannot be recovered in place, docs/replica-recovery.md).

Reported per layout (soak.md, soak.json, a step-vs-time plot marking each fault):
goodput = tokens of kept steps / (elapsed x the undisturbed run's tokens/s), with elapsed
from `kubectl apply` to Succeeded in both runs; recoveries in place vs gang restarts;
time from each fault to the next kept training step; steps redone; duplicate pods
(the fault suite's tracker); final validation loss against the undisturbed run.

    python3 bench/soak.py 900                      # 15 minutes per layout, both layouts
    python3 bench/soak.py 300 --layouts 2x2 --seed 7
    python3 bench/soak.py --smoke --check          # the ctest `bench_soak_smoke`

Needs a build (build/runtime/edit-train, build/operator/edit-operator), kubectl, and for
the full run data/brown (scripts/prepare-data.sh); --smoke uses a small model on a
generated corpus. Nothing here asserts a timing except where --check is given, and then
only the outcomes (Succeeded, no duplicate pods), never a duration.
"""
import argparse
import datetime
import glob
import os
import random
import shutil
import signal
import sys
import threading
import time

from common import ROOT
from edit_testing import logs
from edit_testing.cluster import Cluster, Failure, RecoveryTracker, job_manifest, unique
from edit_testing.data import make_data
from edit_testing.net import free_port
from edit_testing.paths import CRD, OPERATOR, RUNTIME_DIR, find_kubectl
from edit_testing.unittest_main import SKIP_EXIT
from soak_report import KINDS, WORKER_FAULTS, analyse, log, steady_rate, write_plot, write_report

LAYOUTS = {"2x2": (2, 2), "4x1": (4, 1)}
HANG_TIMEOUT = 10


# ---------------------------------------------------------------------------- job shapes

def tiny_spec(data_dir, steps):
    """The tiny preset as examples/local/tiny.yaml trains it (d=128, 4 layers, seqLen 128,
    batch 8, tau 16), on the Brown corpus. Checkpoints every 2 sync intervals: cheap at
    this size, and what bounds the steps a gang resume redoes."""
    return {
        "model": {"preset": "tiny"},
        "data": {"train": os.path.join(data_dir, "train.bin"), "val": os.path.join(data_dir, "val.bin"),
                 "seqLen": 128, "batchSize": 8, "valBatches": 16},
        "training": {"steps": steps, "lr": 3e-3, "minLr": 3e-4, "lrWarmupSteps": 30, "logEvery": 1},
        "algorithm": {"mode": "edit", "warmupSteps": 30, "syncInterval": 16,
                      "outer": {"lr": 0.7},
                      "penalty": {"anomaly": True, "anomalyWarmup": 5, "weighted": True, "clip": True,
                                  "clipNorm": 10}},
        "checkpoint_every": 32,
    }


class Shape:
    def __init__(self, name, data_dir):
        self.name, self.data_dir = name, data_dir
        if name == "tiny":
            s = tiny_spec(data_dir, 0)
            self.warmup, self.tau, self.every = 30, 16, s["checkpoint_every"]
            self.tokens_per_rank_step = 128 * 8
        else:  # "small": job_manifest's own job, the fault suite's (dim 64, 2 layers, seqLen 32, batch 4)
            self.warmup, self.tau, self.every = 8, 4, 8
            self.tokens_per_rank_step = 32 * 4

    def manifest(self, name, ns, ckpt, steps, replicas, shards):
        m = job_manifest(name, ns, self.data_dir, ckpt, free_port(), steps=steps, every=self.every,
                           replicas=replicas, shards=shards, backoff=1000, hang=HANG_TIMEOUT)
        spec = m["spec"]
        if self.name == "tiny":
            t = tiny_spec(self.data_dir, steps)
            for k in ("model", "data", "training", "algorithm"):
                spec[k] = t[k]
        spec["checkpoint"]["keep"] = 3
        return m


# ---------------------------------------------------------------------------- watchers

class LogTail:
    """Reads every worker log of a job as it grows and time-stamps each line (the @edit
    rows carry no wall time). Rows: dicts with t (seconds since t0), rank, uid, step."""

    def __init__(self, cluster, ns, job, t0, interval=0.25):
        self.pattern = os.path.join(cluster.tmp, "kubelet", "pods", "%s_%s-worker-*" % (ns, job), "worker.log")
        self.t0, self.interval = t0, interval
        self.offsets, self.partial = {}, {}
        self.rows, self.lines, self.summaries = [], [], []
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self):
        while not self.stopped.is_set():
            self.poll()
            self.stopped.wait(self.interval)

    def poll(self):
        t = time.monotonic() - self.t0
        for f in glob.glob(self.pattern):
            uid = os.path.basename(os.path.dirname(f)).rsplit("_", 1)[-1]
            try:
                with open(f, "rb") as fh:
                    fh.seek(self.offsets.get(f, 0))
                    data = fh.read()
            except OSError:
                continue
            if not data:
                continue
            self.offsets[f] = self.offsets.get(f, 0) + len(data)
            text = self.partial.pop(f, "") + data.decode(errors="replace")
            lines = text.split("\n")
            if lines[-1]:
                self.partial[f] = lines[-1]
            with self.lock:
                for line in lines[:-1]:
                    p = logs.parse(line)
                    if p and p[0] == "progress":
                        j = p[1]
                        self.rows.append({"t": t, "rank": j["rank"], "uid": uid, "step": j["step"],
                                          "phase": j.get("phase", "")})
                    elif p:
                        self.summaries.append(dict(p[1], t=t, uid=uid))
                    elif line.strip() and not line.startswith((logs.PROGRESS, logs.SUMMARY)):  # not one cut short
                        self.lines.append((t, uid, line))

    def snapshot(self):
        with self.lock:
            return list(self.rows)

    def stop(self):
        self.stopped.set()
        self.thread.join(5)
        self.poll()


class StatusPoll:
    """The job's status every 0.5 s (phase, restarts, in-place recoveries, recovery record),
    tolerating the stand-in being down."""

    def __init__(self, cluster, ns, job, t0):
        self.c, self.ns, self.job, self.t0 = cluster, ns, job, t0
        self.history = []
        self.last = {}
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self):
        while not self.stopped.is_set():
            try:
                st = self.c.job(self.ns, self.job).get("status", {})
            except Exception:  # the stand-in may be restarting
                st = None
            if st is not None:
                self.last = st
                self.history.append((time.monotonic() - self.t0, {
                    "phase": st.get("phase"), "restarts": st.get("restarts", 0),
                    "replicaRecoveries": st.get("replicaRecoveries", 0),
                    "disruptions": st.get("disruptions", 0), "recovery": "recovery" in st,
                    "step": (st.get("progress") or {}).get("step", 0)}))
            self.stopped.wait(0.5)

    def at(self, t):
        """The last status seen at or before t (seconds since t0)."""
        out = self.history[0][1] if self.history else {}
        for ts, s in self.history:
            if ts > t:
                break
            out = s
        return out

    def stop(self):
        self.stopped.set()
        self.thread.join(5)


# ---------------------------------------------------------------------------- one job

class Job:
    def __init__(self, cluster, ns, name, shape, steps, replicas, shards):
        self.c, self.ns, self.name, self.shape = cluster, ns, name, shape
        self.steps, self.replicas, self.shards = steps, replicas, shards
        self.world = replicas * shards
        self.ckpt = os.path.join(cluster.tmp, "ckpt-" + name)
        self.faults = []

    def start(self):
        self.t0 = time.monotonic()
        self.load_start = os.getloadavg()
        self.tracker = RecoveryTracker(self.c, self.ns, self.name)
        self.logs = LogTail(self.c, self.ns, self.name, self.t0)
        self.status = StatusPoll(self.c, self.ns, self.name, self.t0)
        self.c.apply(self.shape.manifest(self.name, self.ns, self.ckpt, self.steps, self.replicas, self.shards))

    def now(self):
        return time.monotonic() - self.t0

    def phase(self):
        return self.status.last.get("phase")

    def finished(self):
        return self.phase() in ("Succeeded", "Failed")

    def max_step(self):
        rows = self.logs.snapshot()
        return max((r["step"] for r in rows), default=0)

    def wait(self, timeout):
        deadline = time.monotonic() + timeout
        while not self.finished():
            if time.monotonic() > deadline:
                raise Failure("job %s did not finish within %d s\n%s" % (self.name, timeout, self.c.diagnostics()))
            time.sleep(0.5)
        self.end()

    def end(self):
        self.t_end = self.now()
        self.load_end = os.getloadavg()
        time.sleep(1.0)
        self.tracker.stop()
        self.logs.stop()
        self.status.stop()

    # ---- analysis -------------------------------------------------------------------
    def kept_times(self):
        """step -> the time the step was last logged by the last rank to log it: the version
        of each step that stays in the model (redone steps are logged again later)."""
        last = {}
        for r in self.logs.rows:
            last[(r["rank"], r["step"])] = r["t"]
        kept = {}
        for (rank, step), t in last.items():
            kept[step] = max(kept.get(step, 0), t)
        return kept

    def resumes(self):
        """(time, rank, steps redone) wherever a rank's step went back: a recovery in place,
        a gang restart or a resume after the kubelet restarted the processes."""
        out = []
        by_rank = {}
        for r in sorted(self.logs.rows, key=lambda r: r["t"]):
            by_rank.setdefault(r["rank"], []).append(r)
        for rank, rows in by_rank.items():
            for a, b in zip(rows, rows[1:]):
                if b["step"] <= a["step"]:
                    out.append((b["t"], rank, a["step"] - (b["step"] - 1)))
        return sorted(out)

    def final_summary(self):
        s = [x for x in self.logs.summaries if x["rank"] == 0 and x["steps"] == self.steps and not x["stopped"]]
        return s[-1] if s else None

    def loop_seconds(self):
        ts = [r["t"] for r in self.logs.rows]
        return (max(ts) - min(ts)) if ts else None

    def step_rate(self, lo, hi):
        """Kept steps per second between two steps (a steady local phase)."""
        kept = self.kept_times()
        if lo not in kept or hi not in kept or kept[hi] <= kept[lo]:
            return None
        return (hi - lo) / (kept[hi] - kept[lo])

    def result(self):
        st = self.status.last
        summ = self.final_summary()
        tokens = self.steps * self.world * self.shape.tokens_per_rank_step
        return {"job": self.name, "phase": st.get("phase"), "steps": self.steps, "world": self.world,
                "tokens": tokens, "elapsed_seconds": round(self.t_end, 1),
                "loop_seconds": round(self.loop_seconds() or 0, 1),
                "restarts": st.get("restarts", 0), "replica_recoveries": st.get("replicaRecoveries", 0),
                "disruptions": st.get("disruptions", 0),
                "val_loss": summ["val_loss"] if summ else None,
                "duplicate_pod_problems": self.tracker.problems(self.world),
                "generations": {str(g): sorted(r) for g, r in self.tracker.generations().items()},
                "recovered_ranks": self.tracker.recovered_ranks(),
                "load_start": [round(x, 2) for x in self.load_start],
                "load_end": [round(x, 2) for x in self.load_end]}


# ---------------------------------------------------------------------------- faults

class Injector:
    def __init__(self, cluster, ns, job, rng, kinds):
        self.c, self.ns, self.job, self.rng = cluster, ns, job, rng
        self.kinds = kinds
        self.bag = []

    def draw(self):
        if not self.bag:
            self.bag = list(self.kinds)
            self.rng.shuffle(self.bag)
        return self.bag.pop()

    def live_workers(self):
        pods = [p for p in self.c.pods(self.ns, self.job.name)
                if p.get("status", {}).get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")]
        return sorted(pods, key=lambda p: int(p["metadata"]["labels"]["edit.io/rank"]))

    def inject(self, kind):
        j = self.job
        f = {"kind": kind, "t": j.now(), "step": j.max_step()}
        f["status_before"] = dict(j.status.at(f["t"]))
        if kind in WORKER_FAULTS:
            pods = self.live_workers()
            if len(pods) != j.world:
                return None  # a pod is still starting: try again shortly
            p = self.rng.choice(pods)
            f["rank"] = int(p["metadata"]["labels"]["edit.io/rank"])
            f["pod"], f["uid"] = p["metadata"]["name"], p["metadata"]["uid"]
            f["t"] = j.now()
            if kind == "kill":
                self.c.kill(self.ns, f["pod"], "KILL")
            elif kind == "stop":
                self.c.kill(self.ns, f["pod"], "STOP")
            else:
                self.c.kubectl("delete", "pod", "-n", self.ns, f["pod"], "--wait=false")
        elif kind == "operator":
            self.c.stop_operator(signal.SIGKILL)
            down = self.rng.uniform(1, 5)
            time.sleep(down)
            self.c.start_operator([self.ns])
            f["down_seconds"] = round(down, 1)
        elif kind == "standin":
            self.c.stop_standin(signal.SIGKILL)
            time.sleep(1)
            self.c.start_standin()
            f["back_t"] = j.now()
        log("fault %d at %.0f s (step %d): %s%s" % (len(j.faults) + 1, f["t"], f["step"], kind,
                                                   " rank %d" % f["rank"] if "rank" in f else ""))
        j.faults.append(f)
        return f

    def resumed(self, f):
        """Training runs again after fault f: every rank logged a step after it (the target
        rank from a new pod, after a stand-in restart from the restarted processes), and no
        recovery is pending."""
        j = self.job
        st = j.status.last
        if st.get("phase") != "Running" or "recovery" in st:
            return False
        after = f.get("back_t", f["t"])
        latest = {}
        for r in j.logs.snapshot():
            if r["t"] > after + 1:
                latest.setdefault(r["rank"], set()).add(r["uid"])
        if len(latest) < j.world:
            return False
        if f["kind"] in WORKER_FAULTS and latest[f["rank"]] == {f["uid"]}:
            return False
        return True


def run_soak(job, shape, every, jitter, duration, rng, kinds):
    inj = Injector(job.c, job.ns, job, rng, kinds)
    next_at = every * rng.uniform(1 - jitter, 1 + jitter)
    last = None
    pending_since = None
    kind = None
    limit = duration * 4 + 900  # a soak that never ends is a result too (reported, not waited for)
    while not job.finished():
        time.sleep(0.5)
        t = job.now()
        if t > limit:
            log("the soak job has not finished after %d s; giving up" % limit)
            break
        if t > duration or t < next_at:
            continue
        step = job.max_step()
        if step < shape.warmup + shape.tau or step > job.steps - 3 * shape.tau:
            continue  # the synchronous warm-up, or the final sync and evaluation ahead
        if last is not None and not inj.resumed(last):
            pending_since = pending_since or t
            if t - pending_since > 300:
                log("training has not resumed 300 s after fault %d; injecting the next one anyway" % len(job.faults))
            else:
                continue
        pending_since = None
        kind = kind or inj.draw()
        try:
            f = inj.inject(kind)
        except Exception as e:  # noqa: BLE001 - a failed injection is reported, not fatal
            log("fault injection failed: %s" % e)
            f = None
        if f is None:
            continue  # the same kind again shortly (a pod was still starting)
        last, kind = f, None
        next_at = job.now() + every * rng.uniform(1 - jitter, 1 + jitter)


# ---------------------------------------------------------------------------- main

def run_layout(a, layout, rng, data_dir, out):
    replicas, shards = LAYOUTS[layout]
    shape = Shape(a.model, data_dir)
    c = Cluster(prefix="edit-soak-")
    try:
        c.start_standin()
        c.kubectl("apply", "-f", CRD)
        c.kubectl("wait", "--for=condition=Established", "crd/editjobs.edit.io", "--timeout=30s")
        ns = unique("soak")
        c.create_namespace(ns)
        c.start_operator([ns])
        steps = a.steps
        if not steps:
            # Long enough that the 0.25 s time stamps of the rows do not matter.
            cal_steps = 300 if a.model == "small" else shape.warmup + 6 * shape.tau
            cal = Job(c, ns, "cal-" + layout.replace("x", "by"), shape, cal_steps, replicas, shards)
            log("%s: calibration job, %d steps" % (layout, cal_steps))
            cal.start()
            cal.wait(900)
            rate = cal.step_rate(shape.warmup + shape.tau, cal_steps - 1)
            if not rate:
                raise Failure("calibration: no step rate\n" + c.diagnostics())
            steps = max(shape.warmup + 6 * shape.tau, int(rate * a.duration))
            log("%s: %.2f steps/s -> %d steps for %d s" % (layout, rate, steps, a.duration))
        base = Job(c, ns, "base-" + layout.replace("x", "by"), shape, steps, replicas, shards)
        log("%s: undisturbed job, %d steps" % (layout, steps))
        base.start()
        base.wait(a.duration * 4 + 600)
        b = base.result()
        b["steady_steps_per_second"] = steady_rate(base)
        log("%s: undisturbed %s in %.1f s, val loss %s" % (layout, b["phase"], b["elapsed_seconds"], b["val_loss"]))
        soak = Job(c, ns, "soak-" + layout.replace("x", "by"), shape, steps, replicas, shards)
        log("%s: soak job, %d steps, a fault every ~%d s for %d s" % (layout, steps, a.fault_every, a.duration))
        soak.start()
        run_soak(soak, shape, a.fault_every, a.jitter, a.duration, rng, a.kinds)
        soak.end()
        s = analyse(soak, b)
        log("%s: soak %s in %.1f s, goodput %s, %s worker faults in place, restarts %d, duplicate-pod problems %d, "
            "val loss %s vs %s" % (layout, s["phase"], s["elapsed_seconds"], s.get("goodput"), s["worker_faults_in_place"],
                                   s["restarts"], len(s["duplicate_pod_problems"]), s.get("val_loss"), b.get("val_loss")))
        write_plot(out, layout, soak, base)
        if s["phase"] != "Succeeded" or a.keep_logs:
            keep = os.path.join(out, "logs-%s" % layout)
            shutil.copytree(os.path.join(c.tmp, "kubelet", "pods"), keep, dirs_exist_ok=True,
                            ignore=shutil.ignore_patterns("*.bin"))
            for f in c.op_logs + c.standin_logs:
                shutil.copy(f, keep)
            log("%s: logs kept in %s" % (layout, keep))
        return {"undisturbed": b, "soak": s}
    finally:
        c.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("duration", nargs="?", type=int, default=900, help="seconds of faults per layout (default 900)")
    ap.add_argument("--layouts", default="2x2,4x1")
    ap.add_argument("--fault-every", type=float, default=60)
    ap.add_argument("--jitter", type=float, default=0.25, help="the interval is fault-every x U(1-j, 1+j)")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--kinds", default=",".join(KINDS),
                    help="the fault kinds to draw from, comma-separated (default: all of %s)" % ",".join(KINDS))
    ap.add_argument("--steps", type=int, default=0, help="job steps (default: calibrated to the duration)")
    ap.add_argument("--model", choices=["tiny", "small"], default="tiny")
    ap.add_argument("--data", default=os.path.join(ROOT, "data", "brown"), help="train.bin/val.bin (tiny model)")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", datetime.date.today().isoformat()))
    ap.add_argument("--smoke", action="store_true",
                    help="short run: 2x2, the small model on a generated corpus, 100 s, a fault every 20 s")
    ap.add_argument("--check", action="store_true",
                    help="exit 1 unless every soak ended Succeeded with no duplicate pod and a report")
    ap.add_argument("--keep-logs", action="store_true", help="copy the worker, operator and stand-in logs to --out")
    a = ap.parse_args()
    a.kinds = a.kinds.split(",")
    for k in a.kinds:
        if k not in KINDS:
            ap.error("--kinds: unknown fault kind %r (known: %s)" % (k, ",".join(KINDS)))
    if a.smoke:
        a.model, a.duration, a.fault_every = "small", min(a.duration, 100), min(a.fault_every, 20)
        if a.layouts == "2x2,4x1":
            a.layouts = "2x2"
    if a.seed is None:
        a.seed = random.randrange(1 << 30)
    if not find_kubectl():
        print("soak: no kubectl; skipped")
        sys.exit(SKIP_EXIT)
    for binary in (OPERATOR, os.path.join(RUNTIME_DIR, "edit-train")):
        if not os.access(binary, os.X_OK):
            print("soak: %s not built; skipped" % binary)
            sys.exit(SKIP_EXIT)
    os.makedirs(a.out, exist_ok=True)
    rng = random.Random(a.seed)
    log("seed %d, layouts %s, %d s of faults each, out %s" % (a.seed, a.layouts, a.duration, a.out))
    data_dir = a.data
    tmp_data = None
    if a.model == "small":
        tmp_data = os.path.join(a.out, "smoke-data")
        os.makedirs(tmp_data, exist_ok=True)
        make_data(tmp_data)
        data_dir = tmp_data
    elif not os.path.exists(os.path.join(data_dir, "train.bin")):
        print("soak: %s/train.bin missing (scripts/prepare-data.sh)" % data_dir)
        sys.exit(2)
    results = {}
    try:
        for layout in a.layouts.split(","):
            results[layout] = run_layout(a, layout, rng, data_dir, a.out)
            write_report(a.out, a, results)
    finally:
        if tmp_data:
            shutil.rmtree(tmp_data, ignore_errors=True)
    print(open(os.path.join(a.out, "soak.md")).read())
    if a.check:
        bad = []
        for lay, r in results.items():
            s = r["soak"]
            if s["phase"] != "Succeeded":
                bad.append("%s: the soak job ended %s" % (lay, s["phase"]))
            if s["duplicate_pod_problems"]:
                bad.append("%s: duplicate pods: %s" % (lay, s["duplicate_pod_problems"][:3]))
            if not s["faults"]:
                bad.append("%s: no fault was injected" % lay)
        if bad:
            print("soak check failed:\n  " + "\n  ".join(bad))
            sys.exit(1)


if __name__ == "__main__":
    main()
