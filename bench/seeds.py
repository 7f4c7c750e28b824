#!/usr/bin/env python3
"""Training quality with statistics: every case over the same seeds (paired), the mean
validation loss with its 95% interval, each case's paired difference to a reference case,
and loss-vs-tokens and loss-vs-wall-time plots (mean over the seeds).

A case is `LAYOUT:LABEL=SET;SET;...` (LAYOUT 4x1 or 2x2: 4 workers as 4 replicas x 1
shard or 2 x 2; the sets are edit-run --set overrides on top of --config). Two special
entries make a case run another build or config, e.g. the code before a change:
`@bin=DIR` (edit-run and edit-train from DIR) and `@config=FILE`. Seed s runs
with training.seed=s for every case, so a difference between two cases is measured on
the same data order and initial weights.

    python3 bench/seeds.py --seeds 5 --case '4x1:ddp=algorithm.mode=ddp' \\
        --case '4x1:edit=algorithm.mode=edit' --reference '4x1:ddp' --out bench/results/<date>/quality
    python3 bench/seeds.py --quick --check      # a smoke test (ctest -L bench)

Writes <out>.md (the tables), <out>.json (every run), and <out>_tokens.png / <out>_time.png.
A run's validation loss is rank 0's `val_loss` in its summary (the outer model, averaged over
every rank's validation batches); its curve is the mean of the replicas' training loss at
each logged step.
"""
import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time

from common import ROOT, log, run_cmd
from report import cpu_model, has_cairo
from edit_testing import edit_run, logs

# Two-sided 95% quantiles of Student's t by degrees of freedom (1..30; 1.96 beyond).
T95 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
       2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
       2.045, 2.042]


def interval(xs):
    """(mean, half-width of the 95% interval); the half-width is nan for one value."""
    m = statistics.fmean(xs)
    if len(xs) < 2:
        return m, float("nan")
    t = T95[len(xs) - 2] if len(xs) - 1 <= len(T95) else 1.96
    return m, t * statistics.stdev(xs) / math.sqrt(len(xs))


def parse_case(spec):
    layout, _, rest = spec.partition(":")
    label, _, sets = rest.partition("=")
    if layout not in ("4x1", "2x2") or not label:
        raise SystemExit(f"--case {spec!r}: expected LAYOUT:LABEL=SET;SET with LAYOUT 4x1 or 2x2")
    entries = [x for x in sets.split(";") if x]
    case = {"key": f"{layout}:{label}", "layout": layout, "label": label, "bin": None, "config": None,
            "sets": [x for x in entries if not x.startswith("@")]}
    for x in entries:
        if x.startswith("@bin="):
            case["bin"] = x[5:]
        elif x.startswith("@config="):
            case["config"] = x[8:]
        elif x.startswith("@"):
            raise SystemExit(f"--case {spec!r}: unknown entry {x!r} (@bin=DIR or @config=FILE)")
    return case


def run_one(a, case, seed, tmp):
    shards = 2 if case["layout"] == "2x2" else 1
    log_dir = os.path.join(tmp, f"{case['layout']}-{case['label']}-s{seed}".replace("/", "_"))
    sets = ["checkpoint.dir=", f"training.seed={seed}"] + a.sets + case["sets"]
    p = edit_run.run(4, sets, shards=shards, log_dir=log_dir, config=case["config"] or a.config, quiet=True,
                     binary=os.path.join(case["bin"] or a.bin_dir, "edit-run"), timeout=a.timeout)
    if p.returncode != 0:
        return {"ok": False, "error": (p.stderr or "")[-1500:]}
    summ = logs.summaries(log_dir)
    curve = {}  # step -> [tokens of the job, elapsed, mean training loss of the replicas]
    for rank, lines in logs.progress_by_rank(log_dir).items():
        if summ[rank]["shard"] != 0:
            continue
        for j in lines:
            c = curve.setdefault(j["step"], [0, 0.0, []])
            c[1] = max(c[1], j.get("elapsed", 0.0))
            if j["loss"] is not None:
                c[2].append(j["loss"])
    world = len(summ)
    points = [(s, s * world * a.tokens_per_step, c[1], statistics.fmean(c[2])) for s, c in sorted(curve.items()) if c[2]]
    r0 = summ[0]
    return {"ok": True, "val": r0["val_loss"], "wall": p.wall, "tokens": sum(s["tokens"] for s in summ.values()),
            "outer": r0.get("outer"), "penalty": r0.get("penalty"), "curve": points}


def tokens_per_step(a):
    """One worker's tokens per step, from the resolved config (batchSize x seqLen)."""
    cmd = [os.path.join(a.bin_dir, "edit-train"), "--print-config"]
    if a.config:
        cmd += ["--config", a.config]
    for s in a.sets:
        cmd += ["--set", s]
    text = run_cmd(cmd).stdout
    b = int(text.split("batchSize:")[1].split()[0])
    t = int(text.split("seqLen:")[1].split()[0])
    return b * t


def write_report(a, cases, results, started):
    out = a.out
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    with open(out + ".json.tmp", "w") as f:  # renamed into place: an interruption never leaves half a file
        json.dump({"argv": a.argv, "cases": cases, "seeds": a.seed_list, "runs": results}, f, indent=1)
    os.replace(out + ".json.tmp", out + ".json")
    def ref_of(c):
        """The reference case of c: --reference, or the case of that label in c's layout."""
        return a.reference if ":" in a.reference else f"{c['layout']}:{a.reference}"
    lines = [f"# Validation loss over {len(a.seed_list)} paired seeds", "",
             f"`python3 bench/seeds.py {' '.join(a.argv)}`", "",
             f"CPU: {cpu_model()}; OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE') or 'auto'}; "
             f"started {started}. Config `{a.config}` with {' '.join('`' + s + '`' for s in a.sets) or 'no extra sets'}; "
             f"seeds {a.seed_list[0]}..{a.seed_list[-1]} (training.seed). Mean and 95% interval (Student's t); the "
             f"difference is paired by seed, in % of the reference case's loss (`{a.reference}`"
             f"{'' if ':' in a.reference else ' of the same layout'}).", "",
             "| case | val loss (mean ± 95%) | sd | vs reference (paired, %) | outer lr / momentum | replica weights | clipped unit-rounds | wall (s) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    summary = {}
    for c in cases:
        ref = ref_of(c)
        refv = {r["seed"]: r["val"] for r in results if r["case"] == ref and r["ok"]}
        rs = [r for r in results if r["case"] == c["key"] and r["ok"]]
        if not rs:
            lines.append(f"| {c['key']} | failed | | | | | | |")
            continue
        vals = [r["val"] for r in rs]
        m, h = interval(vals)
        sd = statistics.stdev(vals) if len(vals) > 1 else float("nan")
        diffs = [100.0 * (r["val"] / refv[r["seed"]] - 1) for r in rs if r["seed"] in refv]
        dm, dh = interval(diffs) if diffs and c["key"] != ref else (float("nan"), float("nan"))
        o = rs[0].get("outer") or {"lr": "-", "momentum": "-"}
        p = rs[0].get("penalty") or {}
        weights = (f"{min(r['penalty']['weight_min'] for r in rs):.3f}-{max(r['penalty']['weight_max'] for r in rs):.3f}"
                   if p.get("on") and p.get("unit_rounds") else "-")
        clipped = (f"{sum(r['penalty']['units_clipped'] for r in rs)} / {sum(r['penalty']['unit_rounds'] for r in rs)}"
                   if p.get("on") and p.get("unit_rounds") else "-")
        diff = "reference" if c["key"] == ref else (f"{dm:+.2f} ± {dh:.2f}" if diffs else "-")
        lines.append(f"| {c['key']} | {m:.4f} ± {h:.4f} | {sd:.4f} | {diff} | {o.get('lr', '-')} / {o.get('momentum', '-')} "
                     f"| {weights} | {clipped} | {statistics.fmean(r['wall'] for r in rs):.0f} |")
        summary[c["key"]] = {"mean": m, "half95": h, "sd": sd, "diff_pct": dm, "diff_half95": dh, "n": len(vals)}
    lines += ["", "Cases:", ""] + [f"- `{c['key']}`: {' '.join('`' + s + '`' for s in c['sets'])}"
                                   + (f" (edit-run from `{c['bin']}`)" if c["bin"] else "")
                                   + (f" (config `{c['config']}`)" if c["config"] else "") for c in cases]
    plots = write_plots(a, cases, results)
    lines += [""] + [f"![{p}]({os.path.basename(p)})" for p in plots]
    with open(out + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    return summary


def write_plots(a, cases, results):
    if not shutil_which("gnuplot"):
        log("gnuplot not found: plots skipped")
        return []
    data = a.out + "_data"
    os.makedirs(data, exist_ok=True)
    files = []
    for c in cases:
        rs = [r for r in results if r["case"] == c["key"] and r["ok"]]
        if not rs:
            continue
        steps = sorted(set.intersection(*[set(p[0] for p in r["curve"]) for r in rs]))
        path = os.path.join(data, c["key"].replace(":", "_").replace("/", "_") + ".dat")
        with open(path, "w") as f:
            f.write("# step job_tokens elapsed mean_train_loss\n")
            for s in steps:
                pts = [next(p for p in r["curve"] if p[0] == s) for r in rs]
                f.write(f"{s} {pts[0][1]} {statistics.fmean(p[2] for p in pts):.3f} "
                        f"{statistics.fmean(p[3] for p in pts):.5f}\n")
        files.append((c["key"], path))
    made = []
    term = "pngcairo size 900,560 font 'sans,9'" if has_cairo() else "png size 900,560"
    for kind, col, xl in (("tokens", 2, "job tokens"), ("time", 3, "wall time (s)")):
        png = f"{a.out}_{kind}.png"
        plot = ", ".join(f"'{p}' using {col}:4 with lines lw 1.5 title '{k}'" for k, p in files)
        script = "\n".join([f"set terminal {term}", f"set output '{png}'", f"set xlabel '{xl}'",
                            "set ylabel 'training loss (mean of replicas and seeds)'", "set grid", "set key top right",
                            "set logscale y", f"set title 'training loss vs {xl}'", f"plot {plot}"])
        r = subprocess.run(["gnuplot"], input=script, text=True, capture_output=True)
        if r.returncode == 0:
            made.append(png)
        else:
            log(f"gnuplot failed: {r.stderr.strip()[:300]}")
    return made


def shutil_which(name):
    import shutil
    return shutil.which(name)


def main(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--case", action="append", default=[], help="LAYOUT:LABEL=SET;SET (repeatable)")
    p.add_argument("--reference", help="the case the differences are relative to (default: the first); a label "
                                       "without a layout (e.g. ddp): that label's case in each case's layout")
    p.add_argument("--from-json", help="rewrite the report of an earlier run from its .json (no training)")
    p.add_argument("--seeds", type=int, default=5, help="seeds 1..N (default 5)")
    p.add_argument("--config", default=os.path.join(ROOT, "examples", "local", "tiny.yaml"))
    p.add_argument("--set", dest="sets", action="append", default=[], help="a --set for every case")
    p.add_argument("--bin-dir", default=os.path.join(ROOT, "build", "runtime"))
    p.add_argument("--out", help="results path without extension (default bench/results/<date>/seeds)")
    p.add_argument("--timeout", type=int, default=1800, help="seconds per run")
    p.add_argument("--quick", action="store_true", help="2 seeds, 2 cases, 24 steps (smoke test)")
    p.add_argument("--check", action="store_true", help="exit non-zero unless every run succeeded")
    p.add_argument("--resume", action="store_true", help="keep the successful runs in <out>.json (an interrupted "
                                                         "run of the same cases) and run only the missing ones")
    a = p.parse_args(argv)
    a.argv = argv
    if a.quick:
        a.seeds = 2
        a.sets = ["training.steps=24", "algorithm.warmupSteps=4", "algorithm.syncInterval=4",
                  "training.lrWarmupSteps=4", "data.valBatches=2", "training.logEvery=4"] + a.sets
        a.case = a.case or ["4x1:ddp=algorithm.mode=ddp", "2x2:edit=algorithm.mode=edit"]
    if not a.case:
        p.error("give at least one --case")
    cases = [parse_case(s) for s in a.case]
    a.reference = a.reference or cases[0]["key"]
    if ":" in a.reference and a.reference not in [c["key"] for c in cases]:
        p.error(f"--reference {a.reference!r} is not a case")
    a.seed_list = list(range(1, a.seeds + 1))
    if not a.out:
        a.out = os.path.join(ROOT, "bench", "results", time.strftime("%Y-%m-%d"), "seeds")
    if a.from_json:
        saved = json.load(open(a.from_json))
        a.seed_list = saved["seeds"]
        write_report(a, saved["cases"], saved["runs"], "(see the first report)")
        return 0
    a.tokens_per_step = tokens_per_step(a)
    started = time.strftime("%Y-%m-%d %H:%M")
    results = []
    if a.resume and os.path.exists(a.out + ".json"):
        keys, seeds = {c["key"] for c in cases}, set(a.seed_list)
        results = [r for r in json.load(open(a.out + ".json"))["runs"]
                   if r["ok"] and r["case"] in keys and r["seed"] in seeds]
        log(f"resuming: {len(results)} runs kept from {a.out}.json")
    done = {(r["case"], r["seed"]) for r in results}
    with tempfile.TemporaryDirectory(prefix="edit-seeds-") as tmp:
        # Seed-major: a machine that gets busier meanwhile slows every case alike.
        for seed in a.seed_list:
            for c in cases:
                if (c["key"], seed) in done:
                    continue
                t0 = time.monotonic()
                r = run_one(a, c, seed, tmp)
                r.update(case=c["key"], seed=seed)
                results.append(r)
                log(f"{c['key']} seed {seed}: " + (f"val {r['val']:.4f}" if r["ok"] else "FAILED") +
                    f" ({time.monotonic() - t0:.0f} s)")
                write_report(a, cases, results, started)  # partial results survive an interruption
    summary = write_report(a, cases, results, started)
    for k, s in summary.items():
        log(f"{k}: {s['mean']:.4f} ± {s['half95']:.4f}" +
            ("" if math.isnan(s["diff_pct"]) else f", {s['diff_pct']:+.2f}% ± {s['diff_half95']:.2f} vs {a.reference}"))
    if a.check and not all(r["ok"] for r in results):
        log("some runs failed")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
