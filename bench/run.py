#!/usr/bin/env python3
"""EDiT benchmark driver (issue 6). Python 3 standard library only.

Runs the `tiny` preset on the Brown corpus with 4 workers in two layouts (4 replicas x 1
shard and 2 replicas x 2 shards), every mode (ddp, localsgd, diloco, edit, a-edit) in every
scenario (normal, consistent straggler, random straggler, a 100 Mbit/s and a 20 Mbit/s
link between replicas), plus edit with prefetch off, edit with overlapped rounds on the 100
Mbit/s link, edit with offloadOuterState on, and the
GEMM microbenchmark; writes bench/results/<date>/results.md, results.json and PNG plots.

    bench/run.sh                 # the full sweep (about 30 minutes on 2 cores)
    bench/run.sh --quick         # a few steps per run: a smoke test of the whole pipeline
    bench/run.sh --help          # every option

It launches the edit-train workers itself (not edit-run) so that it can time-stamp their
progress lines, read each worker's peak RSS from wait4(), and start them inside network
namespaces for the limited-link scenarios. See bench/README.md for how to read the output.
"""

import argparse
import atexit
import datetime
import json
import math
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import *  # noqa: E402,F401,F403  (constants and helpers)
from netns import NetNS  # noqa: E402
from report import write_plots, write_report  # noqa: E402


# ----------------------------------------------------------------------------- one run

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
                if line.startswith("@edit "):
                    try:
                        self.progress.append((t, json.loads(line[6:])))
                    except json.JSONDecodeError:
                        pass
                elif line.startswith("@edit-summary "):
                    try:
                        self.summary = json.loads(line[len("@edit-summary "):])
                    except json.JSONDecodeError:
                        pass
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


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
        env = {"RANK": str(r), "WORLD_SIZE": str(W), "MASTER_ADDR": master,
               "MASTER_PORT": str(port), "EDIT_REPLICAS": str(M), "EDIT_SHARDS": str(N),
               "EDIT_BIND_ADDR": NetNS.addr(r // N) if netns else "127.0.0.1",
               "EDIT_LOCAL_WORLD_SIZE": str(W), "EDIT_JOB": run_id}
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
  outer:
    lr: 0.7
    momentum: 0.8
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


# ----------------------------------------------------------------------------- GEMM

def run_gemm(args, tokens, seq):
    if not os.path.exists(args.gemm_bin):
        log(f"GEMM benchmark {args.gemm_bin} not found (ninja -C build edit-gemm-bench): skipped")
        return None
    cmd = [args.gemm_bin, "--tokens", str(tokens), "--seq", str(seq), "--threads", "1,2",
           "--min-seconds", "0.05" if args.quick else "0.5"]
    if args.quick:
        cmd += ["--square", "512"]
    for k in ("dim", "ffn", "vocab", "layers", "heads"):
        cmd += [f"--{k}", str(TINY[k])]
    base_env = {k: v for k, v in os.environ.items() if not k.startswith("OPENBLAS_")}
    env = dict(base_env, **({"OPENBLAS_CORETYPE": args.coretype} if args.coretype else {}))
    r = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, env=env, check=True)
    rows = [json.loads(l) for l in r.stdout.splitlines() if l.startswith("{")]
    g = {"rows": rows, "coretype": args.coretype or "OpenBLAS default"}
    if args.coretype:
        # The same at the model's shapes with OpenBLAS's own core detection, for comparison.
        d = subprocess.run(cmd[:cmd.index("--threads")] + ["--threads", "1", "--square", "0",
                           "--min-seconds", "0.05" if args.quick else "0.3"] + cmd[cmd.index("--dim"):],
                           stdout=subprocess.PIPE, text=True, env=base_env, check=True)
        for l in d.stdout.splitlines():
            if '"kind":"model"' in l:
                g["default_detection_model_1t"] = json.loads(l)["gflops"]
    for row in rows:
        if row["kind"] in ("model", "square"):
            g[f'{row["kind"]}_{row["threads"]}t'] = row["gflops"]
    # The 4 workers run one intra-op thread each on the machine's cores: the machine's
    # rate at the model's shapes is the better of 2 single-thread streams and one 2-thread.
    cores = os.cpu_count() or 1
    g["machine_model_gflops"] = max(g.get("model_2t", 0), min(cores, 2) * g.get("model_1t", 0))
    g["machine_square_gflops"] = max(g.get("square_2t", 0), min(cores, 2) * g.get("square_1t", 0))
    return g


# ----------------------------------------------------------------------------- main

def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="a few steps per run (smoke test)")
    p.add_argument("--scenarios", default=",".join(SCENARIOS), help="comma list of " + ",".join(SCENARIOS))
    p.add_argument("--layouts", default=",".join(LAYOUTS), help="comma list of 4x1,2x2")
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--no-extras", action="store_true",
                   help="skip the prefetch-off, overlapped-round and default-OpenBLAS runs")
    p.add_argument("--overlap-steps", default="2,4",
                   help="comma list of algorithm.overlapSteps values for the edit+overlapD runs on the "
                        "100 Mbit/s link (the round's exchange runs behind that many local steps)")
    p.add_argument("--offload-run", action="store_true",
                   help="also run edit with offloadOuterState=true (a no-op on CPU; off by default)")
    p.add_argument("--steps", type=int, help="steps per run (default 40, quick 6)")
    p.add_argument("--warmup", type=int, help="synchronous warm-up steps (default 8, quick 2)")
    p.add_argument("--tau", type=int, help="syncInterval (default 8, quick 2)")
    p.add_argument("--batch", type=int, help="sequences per worker per step (default 4)")
    p.add_argument("--seq", type=int, help="sequence length (default 128, quick 64)")
    p.add_argument("--bin-dir", default=os.path.join(ROOT, "build", "runtime"))
    p.add_argument("--gemm-bin", default=os.path.join(ROOT, "build", "bench", "edit-gemm-bench"))
    p.add_argument("--out", help="results folder (default bench/results/<date>)")
    p.add_argument("--openblas-coretype", default="auto",
                   help="OPENBLAS_CORETYPE for the workers and the GEMM benchmark: auto (from the "
                        "CPU flags: Cooperlake / SkylakeX / Haswell), default (OpenBLAS's own "
                        "detection, which picks the SSE3 Prescott kernels on this CPU), or a name")
    p.add_argument("--check", action="store_true",
                   help="exit non-zero unless every run succeeded and results.md has the table")
    p.add_argument("--cleanup-netns", action="store_true", help="remove leftover namespaces and exit")
    a = p.parse_args(argv)
    a.argv = argv
    q = a.quick
    a.steps = a.steps or (6 if q else 40)
    a.warmup = a.warmup if a.warmup is not None else (2 if q else 8)
    a.tau = a.tau or (2 if q else 8)
    a.batch = a.batch or 4
    a.seq = a.seq or (64 if q else 128)
    a.coretype = blas_coretype(a.openblas_coretype)
    a.overlap_steps = [int(d) for d in a.overlap_steps.split(",") if d.strip()]
    if any(d < 1 for d in a.overlap_steps):
        p.error(f"--overlap-steps: each value must be >= 1 (0 is the plain edit run); got {a.overlap_steps}")
    return a


def main(argv):
    args = parse_args(argv)
    if args.cleanup_netns:
        if os.geteuid() == 0:
            NetNS.cleanup_all()
        return 0
    started = datetime.datetime.now()
    out = args.out or os.path.join(ROOT, "bench", "results", started.strftime("%Y-%m-%d"))
    os.makedirs(out, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="edit-bench-")
    netns = NetNS()

    def on_signal(sig, _frame):
        stop_live()
        netns.teardown()
        sys.exit(128 + sig)

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    atexit.register(netns.teardown)
    atexit.register(stop_live)

    for b in ("edit-train",):
        if not os.access(os.path.join(args.bin_dir, b), os.X_OK):
            log(f"{args.bin_dir}/{b} not found: ninja -C build edit-train edit-gemm-bench")
            return 2
    train_bin = os.path.join(ROOT, "data", "brown", "train.bin")
    if not os.path.exists(train_bin):
        log("data/brown missing: running scripts/prepare-data.sh")
        env = dict(os.environ, EDIT_DATA_BIN=os.path.join(args.bin_dir, "edit-data"))
        subprocess.run([os.path.join(ROOT, "scripts", "prepare-data.sh")], check=True, env=env)

    scenarios = [s for s in args.scenarios.split(",") if s]
    layouts = [l for l in args.layouts.split(",") if l]
    modes = [m for m in args.modes.split(",") if m]
    for s in scenarios:
        if s not in SCENARIOS:
            log(f"unknown scenario {s}")
            return 2
    for l in layouts:
        if l not in LAYOUTS:
            log(f"unknown layout {l}")
            return 2

    tps_step = args.batch * args.seq
    cfg_common = dict(batch=args.batch, seq=args.seq, tokens_per_step=tps_step, steps=args.steps,
                      warmup=args.warmup, tau=args.tau, flops_per_token=flops_per_token(TINY, args.seq),
                      load_start=f"{os.getloadavg()[0]:.1f}", gemm_square=512 if args.quick else 2048)
    write_base_config(args, out)

    if not snapshot_binary(args, tmp):
        return 2
    log(f"results -> {out}; logs -> {tmp}")
    gemm = run_gemm(args, tps_step, args.seq)
    if gemm:
        log(f"GEMM: model shapes {gemm['machine_model_gflops']:.2f} GFLOP/s, square {gemm['machine_square_gflops']:.2f} GFLOP/s")

    results, links, skipped, runs_meta = {}, {}, [], {}
    ns_ok, why = (NetNS.available() if any(s in LINK_RATES for s in scenarios) else (True, ""))
    if not ns_ok:
        msg = f"limited-link scenarios skipped: {why}"
        log(msg)
        skipped.append(msg)
    calib = {}

    def do_run(layout, scen, label, mode, extra, blas=True):
        cfg = dict(mode=mode, warmup=args.warmup, tokens_per_step=tps_step)
        sets = [f"algorithm.mode={mode}"] + extra
        run_id = f"{layout}-{scen}-{label}"
        log(f"run {run_id}: {' '.join(sets)}")
        workers, wall = launch(args, tmp, run_id, layout, sets,
                               netns=netns if scen in LINK_RATES else None,
                               timeout=300 if args.quick else 1200, blas=blas)
        r = analyze(workers, wall, layout, cfg, cfg_common["flops_per_token"])
        r["sets"] = sets
        if not r["ok"]:
            fail_dir = os.path.join(out, "failed")
            os.makedirs(fail_dir, exist_ok=True)
            for w in workers:
                for ext in ("out", "err"):
                    src = os.path.join(tmp, f"{run_id}.rank{w.rank}.{ext}")
                    if os.path.exists(src):
                        shutil.copy(src, fail_dir)
            log(f"  FAILED (exit codes {r['rc']}); logs in {fail_dir}")
        else:
            log(f"  tok/s {r['tps']:.0f} (steady {fmt(r.get('tps_steady'), 0)}), wall {wall:.1f}s, "
                f"val {r['val_loss']:.4f}, syncs {r['syncs']}, blocked {100 * r['blocked_frac']:.1f}%")
        results[(layout, scen, label)] = r
        return r

    def calibrate(layout):
        """The layout's local step time (straggler delay, a-edit window): from its normal edit run,
        else from a short edit run."""
        if layout in calib:
            return calib[layout]
        # The fastest of the normal runs' median step times (local steps of the local modes,
        # every step of ddp): the machine is shared, one run alone can be slowed by others.
        cands = []
        for m in ("ddp", "localsgd", "diloco", "edit"):
            r = results.get((layout, "normal", m))
            if r and r.get("ok"):
                v = r.get("median_step_s") if m == "ddp" else r.get("median_local_step_s")
                if v:
                    cands.append(v)
        if not cands:
            r = do_run(layout, "calibrate", "edit", "edit", [])
            results.pop((layout, "calibrate", "edit"), None)
            if r.get("ok"):
                cands.append(r.get("median_local_step_s") or r.get("median_step_s"))
        step = min(c for c in cands if c) if any(cands) else 0.3
        calib[layout] = step
        log(f"[{layout}] local step time {step:.3f} s: straggler delay {step:.3f} s, "
            f"a-edit syncSeconds {args.tau * step:.2f} s")
        return step

    try:
        for layout in layouts:
            M, N = LAYOUTS[layout]
            # Normal first: it calibrates the straggler delay and a-edit's window.
            order = sorted(scenarios, key=lambda s: SCENARIOS.index(s))
            for scen in order:
                if scen in LINK_RATES:
                    if not ns_ok:
                        continue
                    try:
                        netns.setup(M, LINK_RATES[scen])
                        links[f"{layout} {scen}"] = netns.measure(1.0 if args.quick else 2.0)
                        log(f"[{layout}] {scen}: measured {fmt(links[f'{layout} {scen}'], 1)} Mbit/s")
                    except (RuntimeError, subprocess.SubprocessError) as e:
                        msg = f"{layout} {scen} skipped: network namespace setup failed: {e}"
                        log(msg)
                        skipped.append(msg)
                        netns.teardown()
                        continue
                mode_order = sorted(modes, key=lambda m: (m == "a-edit", MODES.index(m)))
                for mode in mode_order:
                    extra = []
                    if mode == "a-edit":
                        step = calibrate(layout)
                        extra += [f"algorithm.syncSeconds={args.tau * step:.3f}"]
                    if scen in ("straggler", "random"):
                        step = calibrate(layout)
                        extra += [f"debug.injectStepDelay.seconds={step:.3f}"]
                        extra += ["debug.injectStepDelay.rank=3"] if scen == "straggler" else \
                                 ["debug.injectStepDelay.random=true"]
                    do_run(layout, scen, mode, mode, extra)
                if not args.no_extras and "edit" in modes and scen in ("normal", "link100"):
                    do_run(layout, scen, "edit+noprefetch", "edit", ["algorithm.prefetch=false"])
                # Across 100 Mbit/s one round outlasts a whole step, so layer-wise prefetch
                # cannot hide it; an overlapped round runs behind the next d local steps.
                if not args.no_extras and "edit" in modes and scen == "link100":
                    for d in args.overlap_steps:
                        do_run(layout, scen, f"edit+overlap{d}", "edit", [f"algorithm.overlapSteps={d}"])
                if not args.no_extras and "ddp" in modes and scen == "normal" and args.coretype \
                        and layout == "4x1":
                    do_run(layout, scen, "ddp+defaultblas", "ddp", [], blas=False)
                if args.offload_run and "edit" in modes and scen == "normal" and layout == "2x2":
                    do_run(layout, scen, "edit+offload", "edit", ["algorithm.offloadOuterState=true"])
                if scen in LINK_RATES:
                    netns.teardown()
            if "straggler" in scenarios or "random" in scenarios or "a-edit" in modes:
                cfg_common["delay" if layout == "4x1" else "delay_2x2"] = calib.get(layout)
    finally:
        netns.teardown()

    finished = datetime.datetime.now()
    path = write_report(out, args, cfg_common, results, gemm, links, skipped, started, finished)
    plots = write_plots(out, results)
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump({"config": cfg_common, "gemm": gemm, "links": links, "skipped": skipped,
                   "runs": [dict(layout=k[0], scenario=k[1], mode=k[2],
                                 **{kk: vv for kk, vv in v.items() if kk != "series"})
                            for k, v in results.items()]}, f, indent=1)
    log(f"wrote {path} and {len(plots)} plots")
    shutil.rmtree(tmp, ignore_errors=True)

    if args.check:
        text = open(path).read()
        problems = []
        if "| scenario | mode | tok/s |" not in text:
            problems.append("results.md has no table header")
        for (layout, scen, label), r in results.items():
            if not r.get("ok"):
                problems.append(f"run {layout} {scen} {label} failed")
            if label in MODES and not re.search(rf"^\| {re.escape(scen)} \| {re.escape(label)} \| \d", text, re.M):
                problems.append(f"no table row for {layout} {scen} {label}")
            # A run of a fixed step count (not a-edit, whose replicas step at their own pace):
            # every rank trains steps x batch x seq tokens of its own.
            M, N = LAYOUTS[layout]
            want = args.steps * M * N * tps_step
            if r.get("ok") and r["sets"][0] != "algorithm.mode=a-edit" and r["job_tokens"] != want:
                problems.append(f"run {layout} {scen} {label}: {r['job_tokens']} job tokens, expected {want} "
                                f"({args.steps} steps x {M * N} ranks x {tps_step})")
            runtime_fpt = r.get("runtime_flops_per_token")
            if runtime_fpt is not None and not math.isclose(runtime_fpt, cfg_common["flops_per_token"], rel_tol=1e-9):
                problems.append(f"run {layout} {scen} {label}: edit-train counts {runtime_fpt} FLOPs per token, "
                                f"bench/common.py flops_per_token {cfg_common['flops_per_token']}")
        if not results:
            problems.append("no runs")
        if problems:
            print("check failed:\n  " + "\n  ".join(problems), file=sys.stderr)
            return 1
        log("check passed: results.md has the table")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
