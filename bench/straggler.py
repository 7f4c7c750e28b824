#!/usr/bin/env python3
"""How much of its own speed a mode keeps with a consistent straggler, with repetitions.

One run of each (as in bench/run.py's sweep) is too noisy on a shared 2-core machine to
judge a 90% target: four runs of the same a-edit 2x2 code gave 76%, 94%, 90% and 77%. This
scenario runs R alternating pairs per layout and mode (normal, then with rank 3 sleeping
one local step time per step), takes each pair's ratio of steady tokens/s (after the
synchronous warm-up), and reports the median ratio with its range. Alternating pairs see
the same background load, so the ratio of a pair is steadier than either run.

The step time that sets the delay (and a-edit's window, tau x that time) is the median
local step of a calibration run of edit per layout, as in run.py.

    python3 bench/straggler.py                          # a-edit and ddp, 4x1 and 2x2, 5 pairs
    python3 bench/straggler.py --modes a-edit --reps 3  # quicker

Writes straggler.md and straggler.json into --out (default bench/results/<date>).
"""
import argparse
import atexit
import datetime
import json
import os
import shutil
import statistics
import sys
import tempfile

from common import LAYOUTS, ROOT, TINY, blas_coretype, flops_per_token, log
from workers import analyze, launch, snapshot_binary, stop_live, write_base_config

TARGET = 0.90  # A-EDiT keeps >= 90% of its no-straggler tokens/s


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layouts", default="4x1,2x2")
    p.add_argument("--modes", default="a-edit,ddp", help="comma list (a-edit is the one with a target)")
    p.add_argument("--reps", type=int, default=5, help="alternating pairs per layout and mode")
    p.add_argument("--steps", type=int, default=80)
    p.add_argument("--warmup", type=int, default=8)
    p.add_argument("--tau", type=int, default=8)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--bin-dir", default=os.path.join(ROOT, "build", "runtime"))
    p.add_argument("--openblas-coretype", default="auto")
    p.add_argument("--out", help="results folder (default bench/results/<date>)")
    p.add_argument("--check", action="store_true",
                   help="exit non-zero unless every run succeeded, the job tokens of the fixed-step runs "
                        "are steps x ranks x batch x seq, and straggler.md has its table")
    a = p.parse_args(argv)
    a.quick = False
    a.coretype = blas_coretype(a.openblas_coretype)
    return a


def steady(r):
    return r.get("tps_steady") if r.get("ok") else None


def main(argv):
    a = parse_args(argv)
    started = datetime.datetime.now()
    out = a.out or os.path.join(ROOT, "bench", "results", started.strftime("%Y-%m-%d"))
    os.makedirs(out, exist_ok=True)
    if not os.path.exists(os.path.join(ROOT, "data", "brown", "train.bin")):
        log("data/brown missing: run scripts/prepare-data.sh (make data) first")
        return 2
    tmp = tempfile.mkdtemp(prefix="edit-straggler-")
    atexit.register(stop_live)
    write_base_config(a, tmp)
    if not snapshot_binary(a, tmp):
        return 2
    fpt = flops_per_token(TINY, a.seq)
    count = [0]
    problems = []

    def one(layout, mode, sets):
        count[0] += 1
        run_id = f"{layout}-{mode}-{count[0]}"
        workers, wall = launch(a, tmp, run_id, layout, [f"algorithm.mode={mode}"] + sets, timeout=1200)
        r = analyze(workers, wall, layout, dict(mode=mode, warmup=a.warmup, tokens_per_step=a.batch * a.seq), fpt)
        if not r["ok"]:
            raise RuntimeError(f"run {run_id} failed (exit codes {r['rc']}); logs in {tmp}")
        M, N = LAYOUTS[layout]
        want = a.steps * M * N * a.batch * a.seq
        if mode != "a-edit" and r["job_tokens"] != want:
            problems.append(f"{run_id}: {r['job_tokens']} job tokens, expected {want} (every rank's own batches)")
        log(f"  {run_id} {' '.join(sets)}: steady {steady(r):.0f} tok/s, blocked {100 * r['blocked_frac']:.1f}%")
        return r

    rows = []
    for layout in [l for l in a.layouts.split(",") if l]:
        cal = one(layout, "edit", [])
        step = cal["median_local_step_s"]
        log(f"[{layout}] local step {step:.3f} s: straggler delay {step:.3f} s, a-edit window {a.tau * step:.2f} s")
        delay = [f"debug.injectStepDelay.seconds={step:.3f}", "debug.injectStepDelay.rank=3"]
        for mode in [m for m in a.modes.split(",") if m]:
            window = [f"algorithm.syncSeconds={a.tau * step:.3f}"] if mode == "a-edit" else []
            pairs = []
            for _ in range(a.reps):
                n = one(layout, mode, window)
                s = one(layout, mode, window + delay)
                pairs.append(dict(normal=steady(n), straggler=steady(s), ratio=steady(s) / steady(n),
                                  steps_per_sync=s.get("local_steps_per_sync")))
            ratios = [p["ratio"] for p in pairs]
            rows.append(dict(layout=layout, mode=mode, step_s=step, pairs=pairs,
                             median_ratio=statistics.median(ratios), min_ratio=min(ratios), max_ratio=max(ratios),
                             median_normal=statistics.median(p["normal"] for p in pairs),
                             median_straggler=statistics.median(p["straggler"] for p in pairs)))

    finished = datetime.datetime.now()
    cmd = "python3 bench/straggler.py " + " ".join(argv)
    lines = [f"# A consistent straggler, {a.reps} alternating pairs per row — {started:%Y-%m-%d %H:%M}", "",
             f"`{cmd.strip()}`, {(finished - started).total_seconds() / 60:.1f} min, load average at the end "
             f"{os.getloadavg()[0]:.1f}.", "",
             f"`tiny` preset, Brown bytes, 4 workers, batch {a.batch} x seq {a.seq}, {a.steps} steps, synchronous "
             f"warm-up {a.warmup} steps, tau {a.tau}; OPENBLAS_CORETYPE={a.coretype}. The straggler: rank 3 sleeps "
             "one local step time per step (the layout's calibration below); a-edit's window is tau x that time. "
             "**kept** = steady tokens/s with the straggler / without it, in the same pair (steady: after the "
             "warm-up, from time-stamped progress lines).", "",
             "| layout | mode | step time (s) | normal tok/s, median | straggler tok/s, median | kept, median "
             "| kept, range | kept per pair |",
             "|---|---|---:|---:|---:|---:|---|---|"]
    for r in rows:
        per = " ".join(f"{100 * p['ratio']:.0f}%" for p in r["pairs"])
        lines.append(f"| {r['layout']} | {r['mode']} | {r['step_s']:.3f} | {r['median_normal']:.0f} | "
                     f"{r['median_straggler']:.0f} | **{100 * r['median_ratio']:.1f}%** | "
                     f"{100 * r['min_ratio']:.0f}-{100 * r['max_ratio']:.0f}% | {per} |")
    lines += ["", f"Target: a-edit keeps >= {100 * TARGET:.0f}% in 4x1 and 2x2 (median of the pairs)."]
    for r in rows:
        if r["mode"] == "a-edit":
            verdict = "met" if r["median_ratio"] >= TARGET else \
                f"missed by {100 * (TARGET - r['median_ratio']):.1f} points"
            lines.append(f"- {r['layout']}: {100 * r['median_ratio']:.1f}% — {verdict}")
    with open(os.path.join(out, "straggler.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(os.path.join(out, "straggler.json"), "w") as f:
        json.dump(dict(args={k: v for k, v in vars(a).items() if isinstance(v, (int, float, str, bool))},
                       rows=rows), f, indent=1)
    log(f"wrote {out}/straggler.md")
    shutil.rmtree(tmp, ignore_errors=True)
    if a.check:
        if "| layout | mode | step time" not in open(os.path.join(out, "straggler.md")).read():
            problems.append("straggler.md has no table")
        if problems:
            print("check failed:\n  " + "\n  ".join(problems), file=sys.stderr)
            return 1
        log("check passed")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
