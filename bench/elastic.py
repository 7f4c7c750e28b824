#!/usr/bin/env python3
"""Elastic replicas (docs/elastic.md): what a scale costs, locally with edit-run --scale-at.

One run grows 2 -> 3 replicas and shrinks back to 2; a second keeps 2 replicas throughout.
Reported: the survivors' seconds inside the two scales (from leaving the round's process
groups to training again), the new replica's start-up (process start to its first step:
rendezvous wait and state copy included), the job's tokens/s in each phase, and the
validation loss of both runs.

    python3 bench/elastic.py                    # writes bench/results/<date>/elastic.md
    python3 bench/elastic.py --shards 2         # replicas of 2 ZeRO-3 shards

On a 2-core machine a third replica adds processes, not cores: the job's tokens/s cannot
grow much; what the table shows is that a scale costs seconds, not a restart.
"""

import argparse
import datetime
import json
import os
import re
import statistics
import sys
import tempfile

from common import ROOT, log
from edit_testing import edit_run, logs


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=240)
    p.add_argument("--grow", type=int, default=80, help="step of the 2 -> 3 point")
    p.add_argument("--shrink", type=int, default=160, help="step of the 3 -> 2 point")
    p.add_argument("--shards", type=int, default=1)
    p.add_argument("--bin-dir", default=os.path.join(ROOT, "build", "runtime"))
    p.add_argument("--out", help="results folder (default bench/results/<date>)")
    return p.parse_args(argv)


def run(a, tmp, tag, scale):
    opts = dict(nproc=2 * a.shards, shards=a.shards, config=os.path.join(ROOT, "examples", "local", "tiny.yaml"),
                sets=[f"training.steps={a.steps}", "training.logEvery=1", "checkpoint.dir="],
                args=["--scale-at", f"{a.grow}:3", "--scale-at", f"{a.shrink}:2"] if scale else [],
                log_dir=os.path.join(tmp, tag), quiet=True, binary=os.path.join(a.bin_dir, "edit-run"))
    log(" ".join(edit_run.command(**opts)[1:]))
    p = edit_run.run(**opts, timeout=3600)
    if p.returncode != 0:
        raise SystemExit(f"{tag}: edit-run exited {p.returncode}\n{p.stderr[-3000:]}")
    # Where each scale really happened: the first sync round at or after its point.
    with open(os.path.join(p.log_dir, "rank-0.log"), errors="replace") as f:
        scaled_at = [int(m) for m in re.findall(r"scaled to \d+ replicas .* at step (\d+)", f.read())]
    return logs.progress_by_rank(p.log_dir), logs.summaries(p.log_dir), scaled_at


def phase_tps(rows, lo, hi):
    """The job's tokens/s over the local steps in (lo, hi]: per step the sum of the tokens/s
    every rank reported for it, the median over the steps."""
    by_step = {}
    for rs in rows.values():
        for r in rs:
            if lo < r["step"] <= hi and r["phase"] != "warmup":
                by_step[r["step"]] = by_step.get(r["step"], 0.0) + r["tps"]
    return statistics.median(by_step.values()) if by_step else 0.0


def main(argv):
    a = parse(argv)
    out = a.out or os.path.join(ROOT, "bench", "results", datetime.date.today().isoformat())
    os.makedirs(out, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="edit-bench-elastic-")
    rows, s, scaled_at = run(a, tmp, "elastic", True)
    frows, fs, _ = run(a, tmp, "fixed", False)
    N = a.shards
    if len(scaled_at) != 2:
        raise SystemExit(f"expected two scales in rank 0's log, found {scaled_at}")
    margin = 2  # steps after each scale left out (the redone step, the new replica's first)
    grew, shrank = scaled_at
    phases = [("2 replicas", 0, grew), ("3 replicas", grew + margin, shrank), ("2 again", shrank + margin, a.steps)]
    new = [r for r in s if s[r].get("joined")]
    res = {
        "args": vars(a), "scaled_at_steps": scaled_at,
        "scale_seconds": max(s[r]["scale_seconds"] for r in range(2 * N)),
        "new_replica_startup_seconds": max(s[r]["startup_seconds"] for r in new) if new else None,
        "phases": {name: phase_tps(rows, lo, hi) for name, lo, hi in phases},
        "fixed_phases": {name: phase_tps(frows, lo, hi) for name, lo, hi in phases},
        "val_loss": s[0]["val_loss"], "fixed_val_loss": fs[0]["val_loss"],
        "wall": s[0]["seconds"], "fixed_wall": fs[0]["seconds"],
    }
    with open(os.path.join(out, "elastic.json"), "w") as f:
        json.dump(res, f, indent=1)
    L = [f"# Elastic replicas: 2 -> 3 -> 2 with edit-run --scale-at ({datetime.datetime.now():%Y-%m-%d %H:%M})", "",
         f"`python3 bench/elastic.py{' --shards ' + str(N) if N > 1 else ''}`: tiny preset (examples/local/tiny.yaml), "
         f"{a.steps} steps, {N} shard(s) per replica, `--scale-at {a.grow}:3 --scale-at {a.shrink}:2` (the scales "
         f"happened at the sync rounds of steps {grew} and {shrank}); a second run keeps 2 replicas. Job tokens/s: per "
         "step the sum over the ranks that reported it, the median over the phase's local steps. Shared 2-core machine.", "",
         "| | elastic run | 2 replicas throughout |", "|---|---:|---:|"]
    for name, _, _ in phases:
        L.append(f"| job tok/s, {name} (steps of that phase) | {res['phases'][name]:,.0f} | {res['fixed_phases'][name]:,.0f} |")
    L += [f"| seconds inside both scales (a survivor: groups left to training again) | {res['scale_seconds']:.1f} | - |",
          f"| new replica: start of training (LibTorch loaded) to its first step, rendezvous wait and state copy included | {res['new_replica_startup_seconds']:.1f} | - |",
          f"| whole run, seconds (rank 0) | {res['wall']:.1f} | {res['fixed_wall']:.1f} |",
          f"| validation loss | {res['val_loss']:.4f} | {res['fixed_val_loss']:.4f} |", ""]
    with open(os.path.join(out, "elastic.md"), "w") as f:
        f.write("\n".join(L) + "\n")
    log(f"wrote {out}/elastic.md")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
