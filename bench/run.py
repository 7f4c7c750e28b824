#!/usr/bin/env python3
"""EDiT benchmark driver. Python 3 standard library only.

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
import subprocess
import sys
import tempfile

from common import LAYOUTS, LINK_RATES, MODES, ROOT, SCENARIOS, TINY, blas_coretype, flops_per_token, fmt, log
from netns import NetNS
from report import write_plots, write_report
from workers import analyze, launch, snapshot_binary, stop_live, write_base_config


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

    results, links, skipped = {}, {}, []
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
