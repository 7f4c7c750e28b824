#!/usr/bin/env python3
"""EDiT benchmark driver (issue 6). Python 3 standard library only.

Runs the `tiny` preset on the Brown corpus with 4 workers in two layouts (4 replicas x 1
shard and 2 replicas x 2 shards), every mode (ddp, localsgd, diloco, edit, a-edit) in every
scenario (normal, consistent straggler, random straggler, a 100 Mbit/s and a 20 Mbit/s
link between replicas), plus edit with prefetch off and with offloadOuterState on, and the
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

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODES = ["ddp", "localsgd", "diloco", "edit", "a-edit"]
SCENARIOS = ["normal", "straggler", "random", "link100", "link20"]
LAYOUTS = {"4x1": (4, 1), "2x2": (2, 2)}
LINK_RATES = {"link100": "100mbit", "link20": "20mbit"}
SCENARIO_TEXT = {
    "normal": "normal",
    "straggler": "consistent straggler (rank 3 sleeps one step time every step)",
    "random": "random straggler (a random rank sleeps one step time each step)",
    "link100": "100 Mbit/s replica-to-replica link (netns + tbf)",
    "link20": "20 Mbit/s replica-to-replica link (netns + tbf)",
}

# Network namespaces of the limited-link scenarios: a private test subnet that exists only
# inside these namespaces, on a bridge this script creates and removes.
NS_PREFIX = "edbench-"
BRIDGE = "edbench0"
SUBNET = "10.77.0"

# Model shape of the tiny preset (runtime/src/config.cpp presets; edit-train --print-config).
TINY = dict(vocab=256, dim=128, layers=4, heads=4, ffn=352)


# ----------------------------------------------------------------------------- helpers

def log(msg):
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def run_cmd(cmd, check=True, quiet=False):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}): {r.stderr.strip()}")
    return r


def unit_sizes(shape, shards):
    """Parameters per unit, padded to a multiple of shards (runtime/src/model.cpp modelLayout)."""
    d, f, v, L = shape["dim"], shape["ffn"], shape["vocab"], shape["layers"]
    units = [v * d] + [2 * d + 4 * d * d + 3 * f * d] * L + [d + v * d]
    return [(n + shards - 1) // shards * shards for n in units]


def param_count(shape):
    return sum(unit_sizes(shape, 1))


def flops_per_token(shape, seq):
    """runtime/src/model.cpp flopsPerToken: 6 x matmul params + 3 x causal attention."""
    matmul = param_count(shape) - shape["vocab"] * shape["dim"]
    attn = 2.0 * shape["layers"] * seq * shape["dim"]
    return 6.0 * matmul + 3.0 * attn


def fmt(x, nd=2, unit=""):
    if x is None or (isinstance(x, float) and (math.isnan(x) or math.isinf(x))):
        return "–"
    if isinstance(x, str):
        return x
    if abs(x) >= 1e4:
        return f"{x / 1e3:.1f}k{unit}"
    return f"{x:.{nd}f}{unit}"


# ----------------------------------------------------------------------------- netns

class NetNS:
    """Replica namespaces joined by veth pairs through a bridge; tbf on each namespace's
    egress. Replica m's workers all live in namespace m (address 10.77.0.(m+1)), so the
    shard group's traffic stays inside the namespace (it is routed over its loopback) and
    only replica-to-replica traffic crosses the shaped veth."""

    def __init__(self):
        self.names = []
        self.active = False

    @staticmethod
    def available():
        if os.geteuid() != 0:
            return False, "not root: the limited-link scenarios need network namespaces (run as root)"
        if shutil.which("ip") is None or shutil.which("tc") is None:
            return False, "ip/tc (iproute2) not found"
        probe = NS_PREFIX + "probe"
        r = run_cmd(["ip", "netns", "add", probe], check=False)
        if r.returncode != 0:
            return False, f"`ip netns add` failed: {r.stderr.strip()}"
        run_cmd(["ip", "netns", "del", probe], check=False)
        return True, ""

    @staticmethod
    def cleanup_all():
        """Removes every namespace and the bridge this script may have left behind."""
        r = run_cmd(["ip", "netns", "list"], check=False)
        for line in r.stdout.splitlines():
            name = line.split()[0] if line.split() else ""
            if name.startswith(NS_PREFIX):
                run_cmd(["ip", "netns", "del", name], check=False)
        if run_cmd(["ip", "link", "show", BRIDGE], check=False).returncode == 0:
            run_cmd(["ip", "link", "del", BRIDGE], check=False)

    def setup(self, replicas, rate):
        self.cleanup_all()
        self.active = True
        burst = "256kb" if rate.startswith("100") else "64kb"
        run_cmd(["ip", "link", "add", BRIDGE, "type", "bridge"])
        run_cmd(["ip", "link", "set", BRIDGE, "up"])
        self.names = []
        for m in range(replicas):
            ns, host, inner = f"{NS_PREFIX}{m}", f"edbh{m}", f"edbn{m}"
            run_cmd(["ip", "netns", "add", ns])
            run_cmd(["ip", "link", "add", host, "type", "veth", "peer", "name", inner])
            run_cmd(["ip", "link", "set", inner, "netns", ns])
            run_cmd(["ip", "link", "set", host, "master", BRIDGE])
            run_cmd(["ip", "link", "set", host, "up"])
            ex = ["ip", "netns", "exec", ns]
            run_cmd(ex + ["ip", "link", "set", "lo", "up"])
            run_cmd(ex + ["ip", "addr", "add", f"{self.addr(m)}/24", "dev", inner])
            run_cmd(ex + ["ip", "link", "set", inner, "up"])
            run_cmd(ex + ["tc", "qdisc", "add", "dev", inner, "root", "tbf", "rate", rate,
                          "burst", burst, "latency", "100ms"])
            self.names.append(ns)

    @staticmethod
    def addr(m):
        return f"{SUBNET}.{m + 1}"

    def measure(self, seconds=2.0):
        """Measured TCP throughput namespace 1 -> namespace 0 (Mbit/s), to show the shaping."""
        server = ("import socket,time,sys\n"
                  "s=socket.socket();s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n"
                  f"s.bind(('{self.addr(0)}',29999));s.listen(1);c,_=s.accept();n=0;t0=None\n"
                  "while True:\n"
                  " b=c.recv(1<<20)\n"
                  " if not b: break\n"
                  " t0=t0 or time.monotonic();n+=len(b)\n"
                  "print(n*8/(time.monotonic()-t0)/1e6)\n")
        client = ("import socket,time\n"
                  "s=socket.socket()\n"
                  "for i in range(50):\n"
                  "  try:\n"
                  f"    s.connect(('{self.addr(0)}',29999));break\n"
                  "  except OSError: time.sleep(0.1)\n"
                  f"b=b'x'*(1<<16);t=time.monotonic()\n"
                  f"while time.monotonic()-t<{seconds}: s.sendall(b)\n"
                  "s.close()\n")
        srv = subprocess.Popen(["ip", "netns", "exec", self.names[0], sys.executable, "-c", server],
                               stdout=subprocess.PIPE, text=True)
        cli = subprocess.run(["ip", "netns", "exec", self.names[1], sys.executable, "-c", client],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=30)
        try:
            out, _ = srv.communicate(timeout=30)
            return float(out.strip()) if cli.returncode == 0 else None
        except (subprocess.TimeoutExpired, ValueError):
            srv.kill()
            srv.wait()
            return None

    def teardown(self):
        if self.active:
            self.cleanup_all()
            self.active = False
            self.names = []


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
    heads = [w for w in workers if w.rank % N == 0]  # one rank per replica
    job_tokens = sum(w.summary["tokens"] for w in heads)
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
        tok = sum(w.progress[-1][1]["tokens"] - warm * cfg["tokens_per_step"] for w in heads)
        res["tps_steady"] = tok / (t_e - t_w) if t_e > t_w else None
    except StopIteration:
        res["tps_steady"] = None
    res["t_last"] = max(w.progress[-1][0] for w in workers) if all(w.progress for w in workers) else None
    # Local (post-warm-up, non-sync) step time: the compute of one step.
    local = [j["step_seconds"] for w in workers for _, j in w.progress if j.get("phase") == "local"]
    allsteps = [j["step_seconds"] for w in workers for _, j in w.progress]
    res["median_local_step_s"] = statistics.median(local) if local else None
    res["median_step_s"] = statistics.median(allsteps) if allsteps else None
    # A merged series over replicas: at each progress line of a replica's first rank, the
    # job's tokens so far (sum over replicas) and the mean over replicas of each one's
    # training loss averaged over its last 5 steps.
    events = sorted((t, w.rank // N, j) for w in heads for t, j in w.progress)
    last_tokens = [0] * M
    recent = [[] for _ in range(M)]
    series = []
    for t, m, j in events:
        last_tokens[m] = j["tokens"]
        recent[m] = (recent[m] + [j["loss"]])[-5:]
        if all(recent):
            series.append((t, sum(last_tokens), statistics.mean(statistics.mean(r) for r in recent)))
    res["series"] = series
    res["gflops"] = fpt * res["tps"] / 1e9
    res["gflops_steady"] = fpt * res["tps_steady"] / 1e9 if res["tps_steady"] else None
    return res


def loss_at(series, t):
    pts = [s for s in series if s[0] <= t]
    return pts[-1][2] if pts else None


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


# ----------------------------------------------------------------------------- report

def ratio(a, b):
    return a / b if a is not None and b else None


def write_report(out, args, cfg_common, results, gemm, links, skipped, started, finished):
    fpt = cfg_common["flops_per_token"]
    lines = []
    A = lines.append
    A(f"# EDiT benchmark results — {started:%Y-%m-%d %H:%M}")
    A("")
    A(f"`bench/run.sh {' '.join(args.argv)}`".replace(" `", "`"))
    A("")
    A(f"Machine: {os.cpu_count()} cores ({cpu_model()}), shared with other work; "
      f"load average at start {cfg_common['load_start']}, at end {os.getloadavg()[0]:.1f}. "
      f"Sweep took {(finished - started).total_seconds() / 60:.1f} min.")
    A("")
    A(f"Setup: `tiny` preset ({param_count(TINY):,} parameters), Brown corpus bytes, 4 workers, "
      f"batch {cfg_common['batch']} x seq {cfg_common['seq']} = {cfg_common['tokens_per_step']} "
      f"tokens per worker per step, {cfg_common['steps']} steps ({cfg_common['steps']} replica-steps "
      f"per replica for a-edit's budget), warm-up {cfg_common['warmup']} steps, "
      f"tau = {cfg_common['tau']}, straggler delay {fmt(cfg_common.get('delay'), 3)} s "
      f"(4x1) / {fmt(cfg_common.get('delay_2x2'), 3)} s (2x2) = the layout's step time (the fastest "
      f"median step time of its normal ddp/localsgd/diloco/edit runs), a-edit syncSeconds = tau x that step time. Model FLOPs per token "
      f"{fpt / 1e6:.2f} M (runtime/src/model.cpp flopsPerToken).")
    A("")
    A("Columns: **tok/s** = job tokens / the slowest worker's run time (setup and final "
      "evaluation included); **steady** = tokens/s after the warm-up (from time-stamped progress "
      "lines; the targets use this); **x ddp** = ratio to ddp in the same scenario and layout; "
      "**B/tok shard, sync** = bytes sent per rank per token in the shard group and the sync "
      "group (ring volumes); **blocked** = time the training thread waited on collectives / run "
      "time; **syncs** = synchronization rounds; **steps/sync** = local steps per sync per "
      "replica; **val loss** = final validation loss of the (synchronized) model at equal tokens; "
      "**loss@T** = training loss (mean over replicas of the last 5 steps) at the wall time T the "
      "fastest mode of that scenario finished; **RSS** = peak RSS of the largest worker; "
      "**MFU** = model FLOP/s (steady) / the machine's GEMM rate at the model's shapes.")
    A("")
    mrate = gemm["machine_model_gflops"] if gemm else None
    for layout in [l for l in LAYOUTS if any(k[0] == l for k in results)]:
        M, N = LAYOUTS[layout]
        A(f"## Layout {layout}: M = {M} replicas x N = {N} shards")
        A("")
        A("| scenario | mode | tok/s | x ddp | steady | x ddp | wall s | B/tok shard | B/tok sync "
          "| blocked | syncs | steps/sync | val loss | vs ddp | loss@T | RSS MB | MFU |")
        A("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|")
        for scen in SCENARIOS:
            rows = {m: results.get((layout, scen, m)) for m in MODES}
            if not any(rows.values()):
                continue
            d = rows.get("ddp") or {}
            ok = [r for r in rows.values() if r and r.get("ok") and r.get("t_last")]
            T = min(r["t_last"] for r in ok) if ok else None
            for m in MODES:
                r = rows.get(m)
                if not r:
                    continue
                if not r.get("ok"):
                    A(f"| {scen} | {m} | failed (exit codes {r.get('rc')}) |" + " |" * 15)
                    continue
                lsp = r.get("local_steps_per_sync")
                lsp_s = "–" if not lsp else (fmt(lsp[0], 1) if max(lsp) - min(lsp) < 0.05
                                             else " / ".join(fmt(x, 1) for x in lsp))
                vd = ratio(r.get("val_loss"), d.get("val_loss") if d.get("ok") else None)
                A(f"| {scen} | {m} | {fmt(r['tps'], 0)} | {fmt(ratio(r['tps'], d.get('tps')))} "
                  f"| {fmt(r.get('tps_steady'), 0)} | {fmt(ratio(r.get('tps_steady'), d.get('tps_steady')))} "
                  f"| {fmt(r['wall_s'], 1)} | {fmt(r['bytes_per_token']['shard'], 0)} "
                  f"| {fmt(r['bytes_per_token']['sync'], 0)} | {fmt(100 * r['blocked_frac'], 1)}% "
                  f"| {r['syncs']} | {lsp_s} | {fmt(r.get('val_loss'), 4)} "
                  f"| {fmt(100 * (vd - 1), 1) + '%' if vd else '–'} "
                  f"| {fmt(loss_at(r['series'], T), 3) if T else '–'} | {fmt(r['peak_rss_mb'], 0)} "
                  f"| {fmt(100 * r['gflops_steady'] / mrate, 1) + '%' if mrate and r.get('gflops_steady') else '–'} |")
        A("")
    # Extras: prefetch and offload.
    A("## Prefetch: how much of the layer-wise sync time it hides (edit)")
    A("")
    A("Blocked sync wait = the training thread's wait on the layer-wise sync (op `sync`), mean "
      "over ranks, whole run. Hidden = 1 - wait(prefetch on) / wait(prefetch off).")
    A("")
    A("| layout | scenario | syncs | sync wait, prefetch on (s) | off (s) | hidden | tok/s on | tok/s off |")
    A("|---|---|---:|---:|---:|---:|---:|---:|")
    prefetch = {}
    for (layout, scen, m), r in sorted(results.items()):
        if m != "edit+noprefetch":
            continue
        on = results.get((layout, scen, "edit"))
        if not (r.get("ok") and on and on.get("ok")):
            continue
        hidden = 1 - on["sync_wait_s"] / r["sync_wait_s"] if r["sync_wait_s"] > 0 else None
        prefetch[(layout, scen)] = hidden
        A(f"| {layout} | {scen} | {on['syncs']} | {fmt(on['sync_wait_s'], 3)} | {fmt(r['sync_wait_s'], 3)} "
          f"| {fmt(100 * hidden, 0) + '%' if hidden is not None else '–'} | {fmt(on['tps'], 0)} | {fmt(r['tps'], 0)} |")
    A("")
    A("## Memory: the outer state")
    A("")
    A("Analytic extra memory of EDiT's outer state (outer weights + outer momentum, fp32, per "
      "worker) = 2 x params/N x 4 bytes; measured = peak RSS of edit minus that of ddp (normal "
      "scenario, largest worker). `offloadOuterState` is a no-op in the CPU build (the state is "
      "already in host memory; docs/design-decisions.md), so on/off cannot differ here (`--offload-run` "
      "adds a run with it on to show that).")
    A("")
    A("| layout | analytic extra (MB) | RSS ddp (MB) | RSS edit (MB) | measured extra (MB) | RSS edit, offload on (MB) |")
    A("|---|---:|---:|---:|---:|---:|")
    for layout, (M, N) in LAYOUTS.items():
        d = results.get((layout, "normal", "ddp"))
        e = results.get((layout, "normal", "edit"))
        o = results.get((layout, "normal", "edit+offload"))
        if not (d and e and d.get("ok") and e.get("ok")):
            continue
        analytic = 2 * sum(unit_sizes(TINY, N)) / N * 4 / 2**20
        A(f"| {layout} | {analytic:.2f} | {fmt(d['peak_rss_mb'], 1)} | {fmt(e['peak_rss_mb'], 1)} "
          f"| {fmt(e['peak_rss_mb'] - d['peak_rss_mb'], 1)} | {fmt(o['peak_rss_mb'], 1) if o and o.get('ok') else '–'} |")
    A("")
    A("## GEMM rate (edit-gemm-bench, LibTorch CPU matmul)")
    A("")
    if gemm:
        A(f"| threads | model shapes, FLOP-weighted (GFLOP/s) | {cfg_common['gemm_square']}^3 (GFLOP/s) |")
        A("|---:|---:|---:|")
        for t in (1, 2):
            A(f"| {t} | {fmt(gemm.get(f'model_{t}t'), 2)} | {fmt(gemm.get(f'square_{t}t'), 2)} |")
        A("")
        A(f"Machine rate used for MFU: {gemm['machine_model_gflops']:.2f} GFLOP/s at the model's "
          f"shapes (max of the 2-thread rate and 2 x the 1-thread rate; the workers run one "
          f"thread each); {gemm['machine_square_gflops']:.2f} GFLOP/s at {cfg_common['gemm_square']}^3. Per-shape "
          "rates are in results.json.")
    else:
        A("GEMM benchmark not run.")
    A("")
    A("## OpenBLAS kernels")
    A("")
    A(f"Workers ran with OPENBLAS_CORETYPE={args.coretype or '(unset)'} and "
      f"OPENBLAS_NUM_THREADS={blas_env(args, 4).get('OPENBLAS_NUM_THREADS', '(unset)')} (the GEMM "
      "benchmark with the same core type and openblas_set_num_threads = its thread count). "
      "Two problems of the runtime as `edit-run` and the operator start it today: OpenBLAS 0.3.21 "
      "(Debian) does not know this CPU's model and its own detection picks the SSE3 `Prescott` "
      "kernels (`OPENBLAS_VERBOSE=2` prints `Core: Prescott`); and `at::set_num_threads(1)` does "
      "not size OpenBLAS's pthread pool, so each worker keeps one BLAS thread per core that spins "
      "in `sched_yield` (perf: ~35% of all samples in those threads and the scheduler with 4 "
      "workers on 2 cores). `ddp+defaultblas` below is ddp with neither fix.")
    A("")
    if gemm and gemm.get("default_detection_model_1t"):
        A(f"- GEMM at the model's shapes, 1 thread: {gemm['default_detection_model_1t']:.2f} GFLOP/s "
          f"with OpenBLAS's detection and pool vs {gemm.get('model_1t', 0):.2f} with {args.coretype}.")
    for layout in LAYOUTS:
        d = results.get((layout, "normal", "ddp"))
        b = results.get((layout, "normal", "ddp+defaultblas"))
        if d and b and d.get("ok") and b.get("ok"):
            A(f"- [{layout}] ddp, normal: steady {fmt(b.get('tps_steady'), 0)} tok/s with OpenBLAS's "
              f"detection and pool vs {fmt(d.get('tps_steady'), 0)} with both fixes "
              f"({fmt(ratio(d.get('tps_steady'), b.get('tps_steady')))}x).")
    A("")
    if links:
        A("## Links")
        A("")
        for k, v in links.items():
            A(f"- {k}: measured TCP throughput between two replica namespaces {fmt(v, 1)} Mbit/s")
        A("")
    if skipped:
        A("## Skipped")
        A("")
        for s in skipped:
            A(f"- {s}")
        A("")
    A("## Targets (issue 6), as measured")
    A("")
    for t in targets(results, gemm, prefetch):
        A(f"- {t}")
    A("")
    A("Plots: `loss_tokens_<layout>.png` (training loss vs job tokens), `loss_time_<layout>.png` "
      "(training loss vs wall time), `tps_<layout>.png` (steady tokens/s per scenario and mode).")
    A("")
    path = os.path.join(out, "results.md")
    with open(path, "w") as f:
        f.write("\n".join(lines))
    return path


def targets(results, gemm, prefetch):
    out = []

    def get(l, s, m, k="tps_steady"):
        r = results.get((l, s, m))
        return r.get(k) if r and r.get("ok") else None

    for l in LAYOUTS:
        if not any(k[0] == l for k in results):
            continue
        a_n, a_s = get(l, "normal", "a-edit"), get(l, "straggler", "a-edit")
        d_n, d_s = get(l, "normal", "ddp"), get(l, "straggler", "ddp")
        if a_n and a_s and d_n and d_s:
            v = a_s / a_n
            out.append(f"[{l}] A-EDiT keeps {100 * v:.0f}% of its normal steady tokens/s with the "
                       f"consistent straggler (target >= 90%: {'met' if v >= 0.9 else f'missed by {100 * (0.9 - v):.0f} points'}); "
                       f"ddp keeps {100 * d_s / d_n:.0f}% (expected ~60%).")
        e, d = get(l, "link100", "edit"), get(l, "link100", "ddp")
        if e and d:
            v = e / d
            out.append(f"[{l}] edit / ddp steady tokens/s across 100 Mbit/s = {v:.2f}x "
                       f"(target >= 3x: {'met' if v >= 3 else f'missed, {v / 3 * 100:.0f}% of it'}); "
                       f"at 20 Mbit/s {fmt(ratio(get(l, 'link20', 'edit'), get(l, 'link20', 'ddp')))}x.")
        ev, dv = get(l, "normal", "edit", "val_loss"), get(l, "normal", "ddp", "val_loss")
        lv, gv = get(l, "normal", "localsgd", "val_loss"), get(l, "normal", "diloco", "val_loss")
        if ev and dv:
            rel = ev / dv - 1
            better = [n for n, v in (("diloco", gv), ("localsgd", lv)) if v is not None and ev < v]
            worse = [n for n, v in (("diloco", gv), ("localsgd", lv)) if v is not None and ev >= v]
            out.append(f"[{l}] edit validation loss {ev:.4f} vs ddp {dv:.4f}: {100 * rel:+.1f}% "
                       f"(target within 2%: {'met' if abs(rel) <= 0.02 else 'missed'}); "
                       f"better than {', '.join(better) or 'neither'}"
                       f"{'; not better than ' + ', '.join(worse) if worse else ''} "
                       f"(diloco {fmt(gv, 4)}, localsgd {fmt(lv, 4)}).")
        for s in ("normal", "link100"):
            h = prefetch.get((l, s))
            if h is not None:
                out.append(f"[{l}, {s}] prefetch hides {100 * h:.0f}% of the blocked layer-wise sync time "
                           f"(target >= 50%: {'met' if h >= 0.5 else 'missed'}).")
        g = get(l, "normal", "ddp", "gflops_steady")
        if g and gemm:
            v = g / gemm["machine_model_gflops"]
            out.append(f"[{l}] ddp reaches {100 * v:.0f}% of the machine's GEMM rate at the model's shapes "
                       f"({g:.2f} of {gemm['machine_model_gflops']:.2f} GFLOP/s; target >= 75%: "
                       f"{'met' if v >= 0.75 else f'missed by {100 * (0.75 - v):.0f} points'}).")
    return out


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


# ----------------------------------------------------------------------------- plots

def write_plots(out, results):
    if shutil.which("gnuplot") is None:
        log("gnuplot not found: plots skipped (apt-get install gnuplot-nox)")
        return []
    data = os.path.join(out, "data")
    os.makedirs(data, exist_ok=True)
    made = []
    for layout in LAYOUTS:
        scens = [s for s in SCENARIOS if any(results.get((layout, s, m), {}).get("ok") for m in MODES)]
        if not scens:
            continue
        for s in scens:
            for m in MODES:
                r = results.get((layout, s, m))
                if r and r.get("ok"):
                    with open(os.path.join(data, f"{layout}_{s}_{m}.dat"), "w") as f:
                        f.write("# seconds job_tokens train_loss\n")
                        for t, tok, loss in r["series"]:
                            f.write(f"{t:.3f} {tok} {loss:.5f}\n")
        with open(os.path.join(data, f"tps_{layout}.dat"), "w") as f:
            f.write("scenario " + " ".join(MODES) + "\n")
            for s in scens:
                vals = []
                for m in MODES:
                    r = results.get((layout, s, m))
                    v = r.get("tps_steady") if r and r.get("ok") else None
                    vals.append(f"{v:.1f}" if v else "0")
                f.write(f"{s} " + " ".join(vals) + "\n")
        cols = min(3, len(scens))
        rows = (len(scens) + cols - 1) // cols
        modes = " ".join(MODES)
        gp = [f"set terminal pngcairo size {420 * cols},{340 * rows} font 'sans,9'" if has_cairo()
              else f"set terminal png size {420 * cols},{340 * rows}",
              f"modes = '{modes}'"]
        for kind, col, xl in (("tokens", 2, "job tokens"), ("time", 1, "wall time (s)")):
            gp += [f"set output '{out}/loss_{kind}_{layout}.png'",
                   f"set multiplot layout {rows},{cols} title 'training loss vs {xl}, layout {layout}'",
                   f"set xlabel '{xl}'", "set ylabel 'train loss (mean of replicas, last 5 steps)'",
                   "set key top right", "set grid"]
            for s in scens:
                files = [m for m in MODES if os.path.exists(os.path.join(data, f"{layout}_{s}_{m}.dat"))]
                plots = ", ".join(f"'{data}/{layout}_{s}_{m}.dat' using {col}:3 with lines lw 1.5 title '{m}'"
                                  for m in files)
                gp += [f"set title '{s}'", f"plot {plots}"]
            gp += ["unset multiplot"]
        gp += ["set terminal png size 900,420" if not has_cairo()
               else "set terminal pngcairo size 900,420 font 'sans,9'", f"set output '{out}/tps_{layout}.png'",
               f"set title 'steady tokens/s (after warm-up), layout {layout}'",
               "set style data histogram", "set style histogram cluster gap 1",
               "set style fill solid 0.8 border -1", "set ylabel 'tokens/s'", "set xlabel ''",
               "set key top right", "set grid ytics", "set yrange [0:*]",
               f"plot for [i=2:{len(MODES) + 1}] '{data}/tps_{layout}.dat' using i:xtic(1) title columnheader(i)"]
        script = os.path.join(data, f"plots_{layout}.gp")
        with open(script, "w") as f:
            f.write("\n".join(gp) + "\n")
        r = run_cmd(["gnuplot", script], check=False)
        if r.returncode != 0:
            log(f"gnuplot failed: {r.stderr.strip()[:500]}")
        made += [f"loss_tokens_{layout}.png", f"loss_time_{layout}.png", f"tps_{layout}.png"]
    return made


_CAIRO = None


def has_cairo():
    global _CAIRO
    if _CAIRO is None:
        r = run_cmd(["gnuplot", "-e", "set terminal"], check=False)
        _CAIRO = "pngcairo" in (r.stdout + r.stderr)
    return _CAIRO


# ----------------------------------------------------------------------------- main

def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="a few steps per run (smoke test)")
    p.add_argument("--scenarios", default=",".join(SCENARIOS), help="comma list of " + ",".join(SCENARIOS))
    p.add_argument("--layouts", default=",".join(LAYOUTS), help="comma list of 4x1,2x2")
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--no-extras", action="store_true", help="skip the prefetch-off and default-OpenBLAS runs")
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
    return a


def blas_env(args, workers):
    """The OpenBLAS environment of a worker: the core type (below) and its thread pool sized
    like the worker's intra-op threads. Without OPENBLAS_NUM_THREADS each worker's OpenBLAS
    keeps a pool of one thread per core (at::set_num_threads does not reach it), which
    spins in sched_yield while 4 workers share 2 cores."""
    if not args.coretype:
        return {}
    return {"OPENBLAS_CORETYPE": args.coretype,
            "OPENBLAS_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // workers))}


def blas_coretype(choice):
    """OpenBLAS 0.3.21's DYNAMIC_ARCH detection does not know this CPU's model number and
    falls back to the SSE3 `Prescott` kernels (OPENBLAS_VERBOSE=2 shows `Core: Prescott`);
    naming the core from the CPU flags gives the AVX-512 kernels."""
    if choice == "default":
        return None
    if choice != "auto":
        return choice
    try:
        flags = set(next(l for l in open("/proc/cpuinfo") if l.startswith("flags")).split())
    except (OSError, StopIteration):
        return None
    if "avx512_bf16" in flags:
        return "Cooperlake"
    if "avx512f" in flags and "avx512bw" in flags:
        return "SkylakeX"
    if "avx2" in flags and "fma" in flags:
        return "Haswell"
    return None


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

    # A private copy of the worker binary: the same build for every run even if the build
    # tree is relinked while the sweep runs (a half-written binary fails to exec).
    snap = os.path.join(tmp, "bin")
    os.makedirs(snap)
    for attempt in range(20):
        try:
            shutil.copy2(os.path.join(args.bin_dir, "edit-train"), snap)
            if run_cmd([os.path.join(snap, "edit-train"), "--print-config"], check=False).returncode == 0:
                break
        except OSError:
            pass
        log("edit-train is being rebuilt? retrying in 5 s")
        time.sleep(5)
    else:
        log("cannot get a working copy of edit-train")
        return 2
    args.bin_dir = snap
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
        if not results:
            problems.append("no runs")
        if problems:
            print("check failed:\n  " + "\n  ".join(problems), file=sys.stderr)
            return 1
        log("check passed: results.md has the table")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
