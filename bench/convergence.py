#!/usr/bin/env python3
"""Does EDiT learn as well as DDP, and does its penalty protect training?

Two scenarios, each run the way bench/run.py runs its workers (edit-train started by this
driver, 4 workers, the tiny preset on the Brown corpus):

  convergence   ddp, localsgd, diloco (its own defaults: outer momentum 0.9), edit and
                a-edit in the layouts 4x1 and 2x2, long enough for >= 40 sync rounds with
                the anomaly test armed for >= 30 of them (a shorter anomaly warm-up than
                the paper's 120, stated in the table); validation loss of the final model on
                data/brown/val.bin at equal tokens, loss-vs-tokens plots.
  bad-replica   replica 1's pseudo-gradient is multiplied by 10 (debug.corruptReplica,
                kind pseudoGradient) at three sync rounds in a row after the test is
                armed; edit and diloco against their undisturbed convergence runs (4x1),
                with the anomaly counts.

Extras (4x1 unless noted): edit with penalty.weighting=median (both layouts), with uniform
weights, with outer momentum 0.8 (the reference implementation's example); a-edit with
weighting=median; diloco at edit's momentum 0.5. They are labelled as such and are not the
modes' defaults.

Writes convergence.md, convergence.json, loss_tokens_conv_<layout>.png,
val_tokens_conv_<layout>.png and data/ to --out (bench/results/<date>/).

    python3 bench/convergence.py                       # both scenarios (~1.5 h on 2 shared cores)
    python3 bench/convergence.py --quick --check       # smoke test (ctest -L bench)
    python3 bench/convergence.py --scenarios convergence --no-extras --layouts 4x1 --modes ddp \
        --run '4x1:edit m0.5=algorithm.mode=edit;algorithm.outer.momentum=0.5'   # a sweep point
"""
import argparse
import datetime
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

from common import LAYOUTS, MODES, ROOT, blas_coretype, fmt, log, run_cmd
from report import has_cairo
from workers import analyze, launch, snapshot_binary



def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="a few steps per run (smoke test)")
    p.add_argument("--scenarios", default="convergence,bad-replica")
    p.add_argument("--layouts", default="4x1,2x2")
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--no-extras", action="store_true", help="skip the extra runs")
    p.add_argument("--extras", default="edit+median,edit+uniform,edit+momentum0.8,diloco+momentum0.5,a-edit+median",
                   help="which extra runs (comma list)")
    p.add_argument("--run", action="append", default=[], metavar="LAYOUT:LABEL=SET;SET",
                   help="an extra convergence run with these --set overrides, e.g. "
                        "'4x1:edit+lr1=algorithm.mode=edit;algorithm.outer.lr=1.0' (repeatable)")
    p.add_argument("--steps", type=int, help="steps per worker (default 340: 40 rounds of 8 after 20 warm-up)")
    p.add_argument("--warmup", type=int, help="synchronous warm-up steps (default 20)")
    p.add_argument("--tau", type=int, help="syncInterval (default 8)")
    p.add_argument("--anomaly-warmup", type=int, help="penalty.anomalyWarmup (default 8; the runtime default is 10, the reference library's 120)")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, help="sequence length (default 128)")
    p.add_argument("--val-every", type=int, help="steps between validation passes (default 40)")
    p.add_argument("--bin-dir", default=os.path.join(ROOT, "build", "runtime"))
    p.add_argument("--out", help="results folder (default bench/results/<date>)")
    p.add_argument("--openblas-coretype", default="auto")
    p.add_argument("--check", action="store_true", help="exit non-zero unless every run succeeded and the tables exist")
    a = p.parse_args(argv)
    a.argv = argv
    a.runs = []
    for spec in a.run:
        layout, _, rest = spec.partition(":")
        label, _, sets = rest.partition("=")
        sets = [x for x in sets.split(";") if x]
        if layout not in LAYOUTS or not label or not any(x.startswith("algorithm.mode=") for x in sets):
            p.error(f"--run {spec!r}: expected LAYOUT:LABEL=algorithm.mode=M;KEY=VALUE;... "
                    f"with LAYOUT one of {', '.join(LAYOUTS)}")
        a.runs.append((layout, label, sets))
    q = a.quick
    a.steps = a.steps or (28 if q else 340)
    a.warmup = a.warmup if a.warmup is not None else (4 if q else 20)
    a.tau = a.tau or (2 if q else 8)
    a.anomaly_warmup = a.anomaly_warmup if a.anomaly_warmup is not None else (2 if q else 8)
    a.seq = a.seq or (32 if q else 128)
    a.val_every = a.val_every or (8 if q else 40)
    a.coretype = blas_coretype(a.openblas_coretype)
    return a


def val_curve(tmp, run_id, workers, N):
    """(step, mean over replicas of each replica's validation loss) from the workers'
    `step S replica R val_loss X` lines (data.valEvery; not a-edit, whose replicas step
    apart)."""
    by_step = {}
    for w in workers:
        if w.rank % N:
            continue
        path = os.path.join(tmp, f"{run_id}.rank{w.rank}.err")
        if not os.path.exists(path):
            continue
        for line in open(path, errors="replace"):
            m = re.search(r"step (\d+) replica (\d+) val_loss ([0-9.eE+-]+|nan|inf)", line)
            if m:
                by_step.setdefault(int(m.group(1)), []).append(float(m.group(3)))
    return [(s, statistics.mean(v)) for s, v in sorted(by_step.items())]


def main(argv):
    a = parse_args(argv)
    started = datetime.datetime.now()
    out = a.out or os.path.join(ROOT, "bench", "results", started.strftime("%Y-%m-%d"))
    os.makedirs(out, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="edit-conv-")
    if not os.path.exists(os.path.join(ROOT, "data", "brown", "train.bin")):
        env = dict(os.environ, EDIT_DATA_BIN=os.path.join(a.bin_dir, "edit-data"))
        subprocess.run([os.path.join(ROOT, "scripts", "prepare-data.sh")], check=True, env=env)
    if not snapshot_binary(a, tmp):  # the same build for every run
        return 2

    scenarios = [s for s in a.scenarios.split(",") if s]
    layouts = [l for l in a.layouts.split(",") if l]
    modes = [m for m in a.modes.split(",") if m]
    tps = a.batch * a.seq
    rounds = (a.steps - a.warmup) // a.tau
    base = os.path.join(out, "convergence-config.yaml")
    with open(base, "w") as f:
        f.write(f"""# Base configuration of every run of bench/convergence.py; per-run --set overrides are
# in convergence.json.
model:
  preset: tiny
data:
  train: {os.path.join(ROOT, 'data/brown/train.bin')}
  val: {os.path.join(ROOT, 'data/brown/val.bin')}
  seqLen: {a.seq}
  batchSize: {a.batch}
  valBatches: {4 if a.quick else 16}
  valEvery: {a.val_every}
training:
  steps: {a.steps}
  lr: 3.0e-3
  minLr: 3.0e-4
  lrWarmupSteps: {a.warmup}
  logEvery: 1
algorithm:
  warmupSteps: {a.warmup}
  syncInterval: {a.tau}
  penalty:
    anomalyWarmup: {a.anomaly_warmup}
checkpoint:
  dir: ""
""")
    a.base_config = base
    results = {}

    def do_run(layout, scen, label, sets):
        run_id = f"{layout}-{scen}-{label}"
        log(f"run {run_id}: {' '.join(sets)}")
        workers, wall = launch(a, tmp, run_id, layout, sets, timeout=600 if a.quick else 3600)
        mode = next(s.split("=", 1)[1] for s in sets if s.startswith("algorithm.mode="))
        r = analyze(workers, wall, layout, dict(mode=mode, warmup=a.warmup, tokens_per_step=tps), 0)
        r["sets"] = sets
        M, N = LAYOUTS[layout]
        if r["ok"]:
            heads = [w for w in workers if w.rank % N == 0]
            r["anomalies_by_replica"] = [w.summary.get("anomalies", 0) for w in heads]
            r["anomalies_total"] = sum(r["anomalies_by_replica"])
            r["outer_skips"] = workers[0].summary.get("outer_skips", 0)
            r["val_curve"] = val_curve(tmp, run_id, workers, N)
            log(f"  val {r['val_loss']:.4f}, syncs {r['syncs']}, anomalies {r['anomalies_by_replica']}, "
                f"wall {wall:.0f} s")
        else:
            fail_dir = os.path.join(out, "failed")
            os.makedirs(fail_dir, exist_ok=True)
            for w in workers:
                for ext in ("out", "err"):
                    src = os.path.join(tmp, f"{run_id}.rank{w.rank}.{ext}")
                    if os.path.exists(src):
                        shutil.copy(src, fail_dir)
            log(f"  FAILED (exit codes {r['rc']}); logs in {fail_dir}")
        results[(layout, scen, label)] = r
        return r

    calib = {}
    for layout in layouts:
        if "convergence" not in scenarios and "bad-replica" not in scenarios:
            break
        order = [m for m in MODES if m in modes]
        # edit before a-edit: its local step time sets a-edit's window.
        for mode in order:
            if "convergence" not in scenarios and not (layout == "4x1" and mode in ("edit", "diloco")):
                continue
            sets = [f"algorithm.mode={mode}"]
            if mode == "a-edit":
                step = calib.get(layout) or 0.2
                # A window of about tau local steps, capped at 2 tau when the machine is quiet.
                sets += [f"algorithm.syncSeconds={a.tau * step:.3f}", f"algorithm.maxStepsPerSync={2 * a.tau}"]
            r = do_run(layout, "convergence", mode, sets)
            if mode == "edit" and r.get("ok"):
                calib[layout] = r.get("median_local_step_s") or 0.2
        extras = [] if a.no_extras else a.extras.split(",")
        if "convergence" in scenarios:
            if "edit+median" in extras:
                do_run(layout, "convergence", "edit+median", ["algorithm.mode=edit", "algorithm.penalty.weighting=median"])
            if layout == "4x1" and "edit+uniform" in extras:
                do_run(layout, "convergence", "edit+uniform", ["algorithm.mode=edit", "algorithm.penalty.weighted=false"])
            # Outer momentum: edit at the reference implementation's 0.8 (edit's default is
            # 0.5), and diloco at edit's 0.5 (equal outer settings: what differs is the
            # penalty and the layer-wise schedule).
            if layout == "4x1" and "edit+momentum0.8" in extras:
                do_run(layout, "convergence", "edit+momentum0.8", ["algorithm.mode=edit", "algorithm.outer.momentum=0.8"])
            if layout == "4x1" and "diloco+momentum0.5" in extras:
                do_run(layout, "convergence", "diloco+momentum0.5", ["algorithm.mode=diloco", "algorithm.outer.momentum=0.5"])
            if "a-edit+median" in extras and "a-edit" in modes and layout == "4x1":
                step = calib.get(layout) or 0.2
                do_run(layout, "convergence", "a-edit+median",
                       ["algorithm.mode=a-edit", f"algorithm.syncSeconds={a.tau * step:.3f}",
                        f"algorithm.maxStepsPerSync={2 * a.tau}", "algorithm.penalty.weighting=median"])

    for layout, label, sets in a.runs:
        do_run(layout, "convergence", label, sets)

    bad_at = a.anomaly_warmup + 3  # the test is armed from round anomalyWarmup + 1 on
    if "bad-replica" in scenarios:
        for mode in ("edit", "diloco"):
            do_run("4x1", "bad-replica", mode,
                   [f"algorithm.mode={mode}", "debug.corruptReplica.replica=1",
                    "debug.corruptReplica.kind=pseudoGradient", "debug.corruptReplica.scale=10",
                    f"debug.corruptReplica.atSync={bad_at}", "debug.corruptReplica.rounds=3"])

    finished = datetime.datetime.now()
    md = write_report(out, a, results, rounds, bad_at, started, finished, tps)
    plots = write_plots(out, results, tps)
    with open(os.path.join(out, "convergence.json"), "w") as f:
        json.dump({"config": dict(steps=a.steps, warmup=a.warmup, tau=a.tau, anomaly_warmup=a.anomaly_warmup,
                                  batch=a.batch, seq=a.seq, val_every=a.val_every, bad_at=bad_at),
                   "runs": [dict(layout=k[0], scenario=k[1], label=k[2],
                                 **{kk: vv for kk, vv in v.items() if kk != "series"})
                            for k, v in results.items()]}, f, indent=1)
    log(f"wrote {md} and {len(plots)} plots")
    shutil.rmtree(tmp, ignore_errors=True)
    if a.check:
        text = open(md).read()
        problems = [f"run {' '.join(k)} failed" for k, r in results.items() if not r.get("ok")]
        if "convergence" in scenarios and "| layout | mode |" not in text:
            problems.append("no convergence table")
        if "bad-replica" in scenarios and "| mode | undisturbed |" not in text:
            problems.append("no bad-replica table")
        if problems:
            print("check failed:\n  " + "\n  ".join(problems), file=sys.stderr)
            return 1
        log("check passed")
    return 0


def pct(a, b):
    return None if a is None or b is None else 100.0 * (a - b) / b


def write_report(out, a, results, rounds, bad_at, started, finished, tps):
    L = []
    A = L.append
    A(f"# Convergence and a bad replica — {started:%Y-%m-%d %H:%M}")
    A("")
    A(f"`python3 bench/convergence.py {' '.join(a.argv)}`".replace(" `", "`"))
    A("")
    A(f"Machine: {os.cpu_count()} cores shared with other work (load average at the end "
      f"{os.getloadavg()[0]:.1f}); the runs took {(finished - started).total_seconds() / 60:.0f} min. "
      f"Setup: `tiny` preset, Brown corpus bytes, 4 workers, batch {a.batch} x seq {a.seq} = {tps} tokens per "
      f"worker per step, {a.steps} steps per worker ({4 * a.steps * tps:,} tokens in every run: equal "
      f"tokens; a-edit's budget is the same replica-steps), synchronous warm-up {a.warmup} steps, "
      f"tau = {a.tau}: {rounds} layer-wise or whole-model rounds plus the final one. "
      f"**Anomaly warm-up: {a.anomaly_warmup} rounds** (`penalty.anomalyWarmup`, default 10; the "
      f"reference library's 120 these runs would never reach): the z-test is armed from round "
      f"{a.anomaly_warmup + 1}, i.e. for {max(0, rounds + 1 - a.anomaly_warmup)} of the "
      f"{rounds + 1} rounds. Every mode runs with its own defaults (edit and a-edit: outer lr 0.7, "
      f"momentum 0.5; diloco: 0.7, 0.9; localsgd: plain averaging); the weighting extras change "
      f"only `penalty.weighting` / `penalty.weighted`.")
    A("")
    A("**val loss** = validation loss of the final (synchronized) model on data/brown/val.bin "
      "(16 batches); **vs ddp** = relative difference; **armed** = rounds with the anomaly test "
      "armed; **anomalies** = units flagged, per replica; the plots show the training loss "
      "(mean of the replicas' last 5 steps) and the validation loss of each replica's current model "
      f"every {a.val_every} steps, against the job's tokens.")
    A("")
    conv = {k: v for k, v in results.items() if k[1] == "convergence"}
    if conv:
        A("## Convergence")
        A("")
        A("| layout | mode | syncs | armed | anomalies | outer steps skipped | val loss | vs ddp | wall s |")
        A("|---|---|---|---|---|---|---|---|---|")
        for (layout, _, label), r in conv.items():
            ddp = conv.get((layout, "convergence", "ddp"), {}).get("val_loss")
            if not r.get("ok"):
                A(f"| {layout} | {label} | failed (exit {r['rc']}) | | | | | | |")
                continue
            local = label != "ddp"
            armed = max(0, r["syncs"] - a.anomaly_warmup) if local and not label.startswith(("diloco", "localsgd")) else "–"
            A(f"| {layout} | {label} | {r['syncs'] if local else '–'} | {armed} | "
              f"{' / '.join(str(x) for x in r['anomalies_by_replica']) if local else '–'} | "
              f"{r['outer_skips'] if local else '–'} | {r['val_loss']:.4f} | "
              f"{fmt(pct(r['val_loss'], ddp), 2, '%') if label != 'ddp' else '–'} | {r['wall_s']:.0f} |")
        A("")
        A("Targets: edit within 1% of ddp at equal tokens, and below localsgd and diloco.")
        A("")
        for layout in LAYOUTS:
            g = lambda m: conv.get((layout, "convergence", m), {}).get("val_loss")  # noqa: E731
            e, d = g("edit"), g("ddp")
            if e is None or d is None:
                continue
            gap = pct(e, d)
            A(f"- {layout}: edit {e:.4f} vs ddp {d:.4f}: {gap:+.2f}% — "
              f"{'met' if gap <= 1.0 else f'missed by {gap - 1.0:.2f} points'}; "
              + "; ".join(f"{'below' if e < g(m) else 'NOT below'} {m} ({g(m):.4f})" for m in ("localsgd", "diloco")
                          if g(m) is not None))
        A("")
    bad = {k: v for k, v in results.items() if k[1] == "bad-replica"}
    if bad:
        A("## Bad replica")
        A("")
        A(f"Replica 1's pseudo-gradient x10 (`debug.corruptReplica.kind=pseudoGradient`, scale 10) before "
          f"sync rounds {bad_at}, {bad_at + 1} and {bad_at + 2} (the test is armed from round "
          f"{a.anomaly_warmup + 1}); 4x1. Undisturbed = the same mode's convergence run.")
        A("")
        A("| mode | undisturbed | with the bad replica | change | anomalies per replica |")
        A("|---|---|---|---|---|")
        for (layout, _, mode), r in bad.items():
            u = conv.get((layout, "convergence", mode), {}).get("val_loss")
            if not r.get("ok"):
                A(f"| {mode} | {fmt(u, 4)} | failed (exit {r['rc']}) | | |")
                continue
            A(f"| {mode} | {fmt(u, 4)} | {r['val_loss']:.4f} | {fmt(pct(r['val_loss'], u), 2, '%')} | "
              f"{' / '.join(str(x) for x in r['anomalies_by_replica'])} |")
        A("")
        e = bad.get(("4x1", "bad-replica", "edit"), {})
        eu = conv.get(("4x1", "convergence", "edit"), {}).get("val_loss")
        if e.get("ok") and eu:
            ch = pct(e["val_loss"], eu)
            A(f"Target: edit within 0.5% of its undisturbed run: {ch:+.2f}% — {'met' if abs(ch) <= 0.5 else 'missed'}.")
            A("")
    path = os.path.join(out, "convergence.md")
    with open(path, "w") as f:
        f.write("\n".join(L) + "\n")
    return path


def write_plots(out, results, tps):
    if shutil.which("gnuplot") is None:
        log("gnuplot not found: plots skipped")
        return []
    data = os.path.join(out, "data")
    os.makedirs(data, exist_ok=True)
    made = []
    for layout in LAYOUTS:
        runs = {k[2] if k[1] == "convergence" else f"{k[2]} (bad replica)": v for k, v in results.items()
                if k[0] == layout and v.get("ok")}
        if not runs:
            continue
        files = {}
        N = LAYOUTS[layout][1]
        W = LAYOUTS[layout][0] * N
        for label, r in runs.items():
            stem = f"conv_{layout}_{label.replace(' ', '_').replace('(', '').replace(')', '')}"
            with open(os.path.join(data, stem + ".train.dat"), "w") as f:
                f.write("# job_tokens train_loss\n")
                for _, tok, loss in r["series"]:
                    f.write(f"{tok} {loss:.5f}\n")
            with open(os.path.join(data, stem + ".val.dat"), "w") as f:
                f.write("# job_tokens val_loss (mean of replicas); the last point: the final model\n")
                for step, v in r.get("val_curve", []):
                    f.write(f"{step * W * tps} {v:.5f}\n")
                f.write(f"{r['job_tokens']} {r['val_loss']:.5f}\n")
            files[label] = stem
        term = "set terminal pngcairo size 900,560 font 'sans,10'" if has_cairo() else "set terminal png size 900,560"
        gp = [term, "set grid", "set key top right", "set xlabel 'job tokens'"]
        for kind, ylabel, fname in (("train", "training loss (mean of replicas, last 5 steps)", "loss_tokens_conv"),
                                    ("val", "validation loss", "val_tokens_conv")):
            gp += [f"set output '{out}/{fname}_{layout}.png'", f"set ylabel '{ylabel}'",
                   f"set title '{ylabel} vs tokens, layout {layout}'"]
            if kind == "train":
                gp += ["set yrange [*:3.0]"]
            else:
                gp += ["set yrange [*:*]"]
            plots = ", ".join(f"'{data}/{stem}.{kind}.dat' using 1:2 with {'lines' if kind == 'train' else 'linespoints'} "
                              f"lw 1.5 title '{label}'" for label, stem in files.items())
            gp += [f"plot {plots}"]
            made.append(f"{fname}_{layout}.png")
        script = os.path.join(data, f"conv_{layout}.gp")
        with open(script, "w") as f:
            f.write("\n".join(gp) + "\n")
        r = run_cmd(["gnuplot", script], check=False)
        if r.returncode != 0:
            log(f"gnuplot failed: {r.stderr.strip()[:500]}")
    return made


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
