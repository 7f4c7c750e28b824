"""The workers of the benchmark sweep (run.py) and of the drivers that run the same way
(compression.py, convergence.py, straggler.py): edit-train started once per rank by the
driver itself, not by edit-run, so that each progress line is time-stamped as it arrives,
each worker's peak RSS comes from wait4(), and a rank can start inside a network namespace
(netns.py) for the limited-link scenarios; then the per-run metrics from their lines.
"""
import os
import shutil
import statistics
import subprocess
import threading
import time

from common import LAYOUTS, ROOT, blas_env, log, run_cmd
from edit_testing import logs
from edit_testing.edit_run import worker_env
from edit_testing.net import free_port
from netns import NetNS


class Worker:
    def __init__(self, rank, proc, t_launch, raw_out):
        self.rank = rank
        self.proc = proc
        self.t_launch = t_launch
        self.progress = []   # (t since launch, json)
        self.summary = None
        self.rc = None
        self.maxrss_kb = None
        self.raw_out = raw_out
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        with open(self.raw_out, "w") as raw:
            for line in self.proc.stdout:
                t = time.monotonic() - self.t_launch
                raw.write(f"{t:.4f} {line}")
                p = logs.parse(line)
                if p and p[0] == "progress":
                    self.progress.append((t, p[1]))
                elif p:
                    self.summary = p[1]
        # The worker's own rusage (ip netns exec and env exec it in place, same pid).
        _, status, ru = os.wait4(self.proc.pid, 0)
        self.proc.returncode = os.waitstatus_to_exitcode(status)
        self.rc = self.proc.returncode
        self.maxrss_kb = ru.ru_maxrss


NS_PORT = 29500
LIVE = []  # workers of the run in progress, stopped on exit


def stop_live():
    for w in LIVE:
        if w.rc is None:
            try:
                w.proc.kill()
            except OSError:
                pass


def launch(args, tmp, run_id, layout, sets, netns=None, timeout=900, blas=True):
    M, N = LAYOUTS[layout]
    W = M * N
    train = os.path.join(args.bin_dir, "edit-train")
    global NS_PORT
    if netns:
        NS_PORT = NS_PORT + 1 if NS_PORT < 29900 else 29500
    port = NS_PORT if netns else free_port()
    master = NetNS.addr(0) if netns else "127.0.0.1"
    workers = []
    t_launch = time.monotonic()
    LIVE.clear()
    for r in range(W):
        env = dict(worker_env(r, M, port, shards=N, master=master,
                              bind=NetNS.addr(r // N) if netns else "127.0.0.1"), EDIT_JOB=run_id)
        if blas:
            env.update(blas_env(args, W))
        cmd = [train, "--config", args.base_config]
        for s in sets:
            cmd += ["--set", s]
        err = open(os.path.join(tmp, f"{run_id}.rank{r}.err"), "w")
        if netns:
            full = ["ip", "netns", "exec", netns.names[r // N], "env"] + \
                   [f"{k}={v}" for k, v in env.items()] + cmd
            p = subprocess.Popen(full, stdout=subprocess.PIPE, stderr=err, text=True, cwd=ROOT)
        else:
            e = {k: v for k, v in os.environ.items() if not k.startswith("OPENBLAS_")}
            e.update(env)
            p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, cwd=ROOT, env=e)
        err.close()
        w = Worker(r, p, t_launch, os.path.join(tmp, f"{run_id}.rank{r}.out"))
        workers.append(w)
        LIVE.append(w)
    deadline = time.monotonic() + timeout
    failed_at = None
    while any(w.thread.is_alive() for w in workers):
        time.sleep(0.2)
        now = time.monotonic()
        bad = [w for w in workers if w.rc not in (None, 0)]
        if bad and failed_at is None:
            failed_at = now
        if now > deadline or (failed_at is not None and now - failed_at > 20):
            stop_live()
            for w in workers:
                w.thread.join(10)
            break
    wall = time.monotonic() - t_launch
    LIVE.clear()
    return workers, wall


def analyze(workers, wall, layout, cfg, fpt):
    """Per-run metrics from the summaries and the time-stamped progress lines."""
    M, N = LAYOUTS[layout]
    res = {"wall_s": wall, "ok": all(w.rc == 0 and w.summary for w in workers),
           "rc": [w.rc for w in workers]}
    if not res["ok"]:
        return res
    S = [w.summary for w in workers]
    # edit-train's own count (model.cpp), to check bench/common.py's copy against (--check).
    res["runtime_flops_per_token"] = S[0].get("flops_per_token")
    heads = [w for w in workers if w.rank % N == 0]  # one rank per replica
    # Every rank trains on batches of its own (a replica's N shards are data parallel
    # inside it), so the job's tokens are the sum over all ranks. (Until 2026-12-07 this
    # summed one rank per replica: a sharded layout's tokens/s and MFU read 1/N too low.)
    job_tokens = sum(w.summary["tokens"] for w in workers)
    train_s = max(s["seconds"] for s in S)
    res.update(job_tokens=job_tokens, train_s=train_s, tps=job_tokens / train_s,
               val_loss=S[0].get("val_loss"), syncs=S[0].get("sync_rounds", 0),
               anomalies=S[0].get("anomalies", 0),
               steps=[w.summary["steps"] for w in heads])
    # Bytes sent per rank per token (each rank's bytes / its own tokens), by group.
    by = {"shard": [], "sync": [], "world": []}
    for s in S:
        g = {"shard": 0, "sync": 0, "world": 0}
        for c in s["comm"]:
            g[c["group"]] = g.get(c["group"], 0) + c["bytes"]
        for k in by:
            by[k].append(g.get(k, 0) / max(1, s["tokens"]))
    res["bytes_per_token"] = {k: statistics.mean(v) for k, v in by.items()}
    res["blocked_frac"] = statistics.mean(s["comm_wait"] / s["seconds"] for s in S)
    sync_wait = [sum(c["wait"] for c in s["comm"] if c["op"] == "sync") for s in S]
    res["sync_wait_s"] = statistics.mean(sync_wait)
    wait_by_op = {}
    for s in S:
        for c in s["comm"]:
            k = f'{c["op"]}/{c["group"]}'
            wait_by_op[k] = wait_by_op.get(k, 0) + c["wait"] / len(S)
    res["wait_by_op_s"] = wait_by_op
    warm = cfg["warmup"]
    if cfg["mode"] != "ddp":
        res["local_steps_per_sync"] = [
            (w.summary["steps"] - warm) / max(1, w.summary.get("sync_rounds", 0)) for w in heads]
    res["peak_rss_mb"] = max(w.maxrss_kb for w in workers) / 1024
    res["mean_rss_mb"] = statistics.mean(w.maxrss_kb for w in workers) / 1024
    # Steady-state tokens/s: from the first progress line at step `warm` (end of the
    # synchronous warm-up) to the last progress line, over all replicas.
    try:
        t_w = max(next(t for t, j in w.progress if j["step"] == warm) for w in workers)
        t_e = max(w.progress[-1][0] for w in workers)
        tok = sum(w.progress[-1][1]["tokens"] - warm * cfg["tokens_per_step"] for w in workers)
        res["tps_steady"] = tok / (t_e - t_w) if t_e > t_w else None
        res["t_warm"] = t_w
    except StopIteration:
        res["tps_steady"] = None
    res["t_last"] = max(w.progress[-1][0] for w in workers) if all(w.progress for w in workers) else None
    # Local (post-warm-up, non-sync) step time: the compute of one step.
    local = [j["step_seconds"] for w in workers for _, j in w.progress if j.get("phase") == "local"]
    allsteps = [j["step_seconds"] for w in workers for _, j in w.progress]
    res["median_local_step_s"] = statistics.median(local) if local else None
    res["median_step_s"] = statistics.median(allsteps) if allsteps else None
    # A merged series over replicas: at each progress line of a replica's first rank, the
    # job's tokens so far (sum over replicas of N x that rank's: a replica's shards step in
    # lockstep) and the mean over replicas of each one's training loss averaged over its
    # last 5 steps.
    events = sorted((t, w.rank // N, j) for w in heads for t, j in w.progress)
    last_tokens = [0] * M
    recent = [[] for _ in range(M)]
    series = []
    for t, m, j in events:
        last_tokens[m] = N * j["tokens"]
        recent[m] = (recent[m] + [j["loss"]])[-5:]
        if all(recent):
            series.append((t, sum(last_tokens), statistics.mean(statistics.mean(r) for r in recent)))
    res["series"] = series
    res["gflops"] = fpt * res["tps"] / 1e9
    res["gflops_steady"] = fpt * res["tps_steady"] / 1e9 if res["tps_steady"] else None
    return res


def write_base_config(args, out):
    """The base configuration of every run (bench-config.yaml in `out`); a run's own
    differences are --set overrides. Sets args.base_config."""
    base = os.path.join(out, "bench-config.yaml")
    with open(base, "w") as f:
        f.write(f"""# Base configuration of every benchmark run (bench/run.py writes it; per-run
# differences are passed as --set overrides and listed in results.json).
model:
  preset: tiny
data:
  train: {os.path.join(ROOT, 'data/brown/train.bin')}
  val: {os.path.join(ROOT, 'data/brown/val.bin')}
  seqLen: {args.seq}
  batchSize: {args.batch}
  valBatches: {4 if args.quick else 16}
training:
  steps: {args.steps}
  lr: 3.0e-3
  minLr: 3.0e-4
  lrWarmupSteps: {max(1, args.warmup)}
  logEvery: 1
algorithm:
  warmupSteps: {args.warmup}
  syncInterval: {args.tau}
  penalty:
    anomalyWarmup: 5
checkpoint:
  dir: ""
""")
    args.base_config = base


def snapshot_binary(args, tmp):
    """A private copy of the worker binary: the same build for every run even if the build
    tree is relinked while the sweep runs (a half-written binary fails to exec). Sets
    args.bin_dir; False if no working copy could be made."""
    snap = os.path.join(tmp, "bin")
    os.makedirs(snap, exist_ok=True)
    for attempt in range(20):
        try:
            shutil.copy2(os.path.join(args.bin_dir, "edit-train"), snap)
            if run_cmd([os.path.join(snap, "edit-train"), "--print-config"], check=False).returncode == 0:
                args.bin_dir = snap
                return True
        except OSError:
            pass
        log("edit-train is being rebuilt? retrying in 5 s")
        time.sleep(5)
    log("cannot get a working copy of edit-train")
    return False
