#!/usr/bin/env python3
"""int8 and int4 sync compression (algorithm.syncCompression) against fp32, and int8
with the overlapped round (algorithm.overlapSteps): bytes sent per rank in the sync group per
sync round, validation loss at equal tokens, and, as root, the 20 Mbit/s replica link of
bench/run.py (blocked share and steady tokens/s).

    python3 bench/compression.py                       # writes bench/results/<date>/compression.md
    python3 bench/compression.py --steps 40 --no-link  # shorter, without the link scenario
    python3 bench/compression.py --codecs none,int8 --seeds 3 --no-link  # loss over 3 seeds

Runs its workers as run.py does (workers.py) with its network namespaces; same tiny preset and Brown data.
"""

import argparse
import datetime
import json
import os
import sys
import tempfile

from common import ROOT, TINY, blas_coretype, flops_per_token, fmt, log
from netns import NetNS
from workers import analyze, launch


CODECS = ["none", "int8", "int4", "int8+overlap"]  # the last: algorithm.overlapSteps as well


def overlap_steps(tau):
    """algorithm.overlapSteps of the "+overlap" runs: 2 steps at any tau. The staleness
    cost follows d more than d / tau (2026-12-04: +0.2% at tau 8 with d = 2, +3.5% at tau
    16 with d = 4, +5% with a whole round)."""
    return min(2, tau)


def settings(variant, tau):
    """The --set flags of a variant: its codec, and overlapSteps for "+overlap"."""
    codec, _, extra = variant.partition("+")
    return [f"algorithm.syncCompression={codec}"] + (
        [f"algorithm.overlapSteps={overlap_steps(tau)}"] if extra == "overlap" else [])


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=360, help="steps per replica of the loss runs (tau 8: 42 syncs)")
    p.add_argument("--link-rounds", type=int, default=11, help="sync rounds of each 20 Mbit/s run")
    p.add_argument("--link-taus", default="8,16,32",
                   help="syncInterval of the 20 Mbit/s runs (16: the runtime's default); 'auto': the tau "
                        "at which fp32 is blocked --auto-share of a local phase on this machine, from a "
                        "short fp32 calibration run over the same link")
    p.add_argument("--auto-share", type=float, default=0.53,
                   help="fp32's blocked share that --link-taus auto aims at (0.53: where the int8 link targets were set)")
    p.add_argument("--warmup", type=int, default=8)
    p.add_argument("--tau", type=int, default=8)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--layouts", default="4x1,2x2", help="layouts of the bytes/loss runs ('' skips them)")
    p.add_argument("--codecs", default=",".join(CODECS),
                   help="codecs of the bytes/loss runs (none is always run: the differences are to it)")
    p.add_argument("--seeds", type=int, default=1,
                   help="loss runs per codec, with training.seed S..S+N-1 (init and data order): one "
                        "run's difference is within run-to-run noise, the mean over seeds less so")
    p.add_argument("--first-seed", type=int, default=1, help="S of --seeds (to add seeds to an earlier study)")
    p.add_argument("--val-batches", type=int, default=16,
                   help="data.valBatches of every run (batch x seq tokens each; more: a less noisy comparison)")
    p.add_argument("--link-codecs", default=",".join(CODECS),
                   help="codecs of the 20 Mbit/s runs (none is always run: the ratios are to it)")
    p.add_argument("--no-link", action="store_true", help="skip the 20 Mbit/s scenario")
    p.add_argument("--bin-dir", default=os.path.join(ROOT, "build", "runtime"))
    p.add_argument("--out", help="results folder (default bench/results/<date>)")
    a = p.parse_args(argv)
    a.quick = False
    for flag in ("codecs", "link_codecs"):
        codecs = ["none"] + [c for c in getattr(a, flag).split(",") if c and c != "none"]
        unknown = [c for c in codecs if c not in CODECS]
        if unknown:
            p.error(f"--{flag.replace('_', '-')}: unknown {unknown}; choose from {','.join(CODECS)}")
        setattr(a, flag, codecs)
    if a.seeds < 1:
        p.error("--seeds: at least 1")
    a.coretype = blas_coretype("auto")
    return a


def base_config(a, path, steps):
    with open(path, "w") as f:
        f.write(f"""model: {{preset: tiny}}
data:
  train: {os.path.join(ROOT, 'data/brown/train.bin')}
  val: {os.path.join(ROOT, 'data/brown/val.bin')}
  seqLen: {a.seq}
  batchSize: {a.batch}
  valBatches: {a.val_batches}
training: {{steps: {steps}, lr: 3.0e-3, minLr: 3.0e-4, lrWarmupSteps: {a.warmup}, logEvery: 1}}
algorithm:
  mode: edit
  warmupSteps: {a.warmup}
  syncInterval: {a.tau}
  penalty: {{anomalyWarmup: 5}}
checkpoint: {{dir: ""}}
""")


def sync_bytes(workers):
    """Per rank: {op: bytes} of the sync group."""
    out = []
    for w in workers:
        d = {}
        for c in w.summary["comm"]:
            if c["group"] == "sync":
                d[c["op"]] = d.get(c["op"], 0) + c["bytes"]
        out.append(d)
    return out


def one(a, tmp, layout, comp, steps, netns=None, tau=None, tag=None, seed=None):
    base = os.path.join(tmp, f"base-{steps}.yaml")
    base_config(a, base, steps)
    a.base_config = base
    run_id = (f"{layout}-{comp.replace('+', '-')}-{tag or ('link20' if netns else 'normal')}"
              + (f"-tau{tau}" if tau else "") + (f"-seed{seed}" if seed else ""))
    sets = (settings(comp, tau or a.tau) + ([f"algorithm.syncInterval={tau}"] if tau else [])
            + ([f"training.seed={seed}"] if seed else []))
    log(f"run {run_id}")
    workers, wall = launch(a, tmp, run_id, layout, sets, netns=netns, timeout=3600)
    cfg = dict(mode="edit", warmup=a.warmup, tokens_per_step=a.batch * a.seq)
    r = analyze(workers, wall, layout, cfg, flops_per_token(TINY, a.seq))
    r.pop("series", None)
    if not r["ok"]:
        raise SystemExit(f"{run_id} failed: exit codes {r['rc']} (logs in {tmp})")
    r["sync_bytes"] = sync_bytes(workers)
    # Blocked after the warm-up: the sync rounds' wait over the steady window, apart from
    # the warm-up's gradient averages (fp32, or compressed with the codec).
    steady_s = (r["t_last"] - r["t_warm"]) if r.get("t_last") and r.get("t_warm") else None
    r["blocked_steady_frac"] = r["sync_wait_s"] / steady_s if steady_s else None
    log(f"  val {r['val_loss']:.4f}, syncs {r['syncs']}, blocked {100 * r['blocked_frac']:.1f}%, "
        f"steady {fmt(r.get('tps_steady'), 0)} tok/s")
    return r


def per_round(runs, warm):
    """Bytes per rank per sync round in the sync group, for each run of {codec: run}. The
    synchronous warm-up's gradient averages also cross it (compressed too when the codec
    is on), so `warm` holds, per codec, a run of the warm-up steps alone with the same
    settings; its bytes are subtracted rank by rank."""
    out = {}
    for name, r in runs.items():
        vals = []
        for rank, b in enumerate(r["sync_bytes"]):
            w = sum(warm[name]["sync_bytes"][rank].values())
            vals.append((sum(b.values()) - w) / r["syncs"])
        out[name] = sum(vals) / len(vals)
    return out


def auto_tau(a, tmp, ns, share):
    """The tau at which fp32's rounds are `share` of a local phase over this link on this
    machine: R / (tau c + R) = share, with R (blocked seconds per round) and c (seconds
    per local step) from a short fp32 run at tau 16. The link scenario then sits where
    the int8 link targets were set, whatever this CPU's speed (docs/algorithm.md,
    "Choosing tau and overlapSteps for a slow link")."""
    r = one(a, tmp, "4x1", "none", a.warmup + 6 * 16, ns, 16, tag="calibration")
    R = r["sync_wait_s"] / max(1, r["syncs"])
    c = r["median_local_step_s"]
    tau = max(2, round((1 / share - 1) * R / c))
    log(f"  calibration: R {R:.2f} s per fp32 round, c {c:.3f} s per local step -> tau {tau}")
    return tau, dict(R=R, c=c, share=share, tau=tau)


def main(argv):
    a = parse(argv)
    out = a.out or os.path.join(ROOT, "bench", "results", datetime.date.today().isoformat())
    os.makedirs(out, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="edit-bench-compression-")
    results = {"args": {k: v for k, v in vars(a).items() if k != "base_config"}, "runs": {}}
    rows = []
    seeds = list(range(a.first_seed, a.first_seed + a.seeds)) if a.seeds > 1 else [None]  # None: the config's seed
    for layout in [l for l in a.layouts.split(",") if l]:
        by_seed = {sd: {c: one(a, tmp, layout, c, a.steps, seed=sd) for c in a.codecs} for sd in seeds}
        warm = {c: one(a, tmp, layout, c, a.warmup, tag="warmup-only") for c in a.codecs}
        br = per_round(by_seed[seeds[0]], warm)  # bytes do not depend on the seed
        results["runs"][f"{layout} normal"] = dict(by_seed[seeds[0]], bytes_per_round=br,
                                                   by_seed={str(sd): r for sd, r in by_seed.items()})
        rows.append((layout, by_seed, br))

    link = None
    if not a.no_link:
        ok, why = NetNS.available()
        if not ok:
            log(f"link20 skipped: {why}")
            link = why
        else:
            ns = NetNS()
            try:
                ns.setup(4, "20mbit")
                mbit = ns.measure(2.0)
                link = {}
                taus = []
                for t in [t for t in a.link_taus.split(",") if t]:
                    if t == "auto":
                        tau, results["auto_tau"] = auto_tau(a, tmp, ns, a.auto_share)
                        taus.append(tau)
                    else:
                        taus.append(int(t))
                for tau in taus:
                    steps = a.warmup + a.link_rounds * tau
                    link[tau] = {c: one(a, tmp, "4x1", c, steps, ns, tau) for c in a.link_codecs}
            finally:
                ns.teardown()
            results["runs"]["4x1 link20"] = {"mbit": mbit, "by_tau": link}
            link = {"mbit": mbit, "by_tau": link}

    with open(os.path.join(out, "compression.json"), "w") as f:
        json.dump(results, f, indent=1, default=str)
    L = ["# int8 and int4 sync compression, and the overlapped round, against fp32", "",
         f"tiny preset, Brown corpus, edit, batch {a.batch} x seq {a.seq} per worker, warm-up {a.warmup}, "
         f"tau {a.tau}, block 256; {'one run' if a.seeds == 1 else f'{a.seeds} seeds'} each on a shared 2-core machine "
         f"({datetime.datetime.now():%Y-%m-%d %H:%M}). `python3 bench/compression.py`.", "",
         "## Bytes per rank per sync round (sync group) and validation loss at equal tokens", "",
         "| layout | steps | syncs | codec | bytes/round | of none | val loss | diff from none |",
         "|---|---|---|---|---|---|---|---|"]
    for layout, by_seed, br in rows:
        for c in a.codecs:
            # One seed: its loss and difference. Several: the mean loss, and the mean
            # difference from none over the seeds (each seed against its own none run) with
            # its range.
            diffs = [(r[c]["val_loss"] - r["none"]["val_loss"]) / r["none"]["val_loss"] for r in by_seed.values()]
            losses = [r[c]["val_loss"] for r in by_seed.values()]
            d = 100 * sum(diffs) / len(diffs)
            spread = ""
            if len(diffs) > 1 and c != "none":
                # The seeds are independent pairs: the mean difference's standard error.
                sd = (sum((x - sum(diffs) / len(diffs)) ** 2 for x in diffs) / (len(diffs) - 1)) ** 0.5
                se = 100 * sd / len(diffs) ** 0.5
                spread = (f" ({100 * min(diffs):+.2f}% to {100 * max(diffs):+.2f}%; "
                          f"95% interval {d - 1.96 * se:+.2f}% to {d + 1.96 * se:+.2f}%)")
            r0 = next(iter(by_seed.values()))[c]
            L.append(f"| {layout} | {a.steps} | {r0['syncs']} | {c} | {br[c]:,.0f} | {100 * br[c] / br['none']:.1f}% | "
                     f"{sum(losses) / len(losses):.4f} | {d:+.2f}%{spread} |")
    if a.seeds > 1:
        L += ["", f"Loss columns over {a.seeds} seeds (training.seed {seeds[0]}..{seeds[-1]}: initial weights and data "
              "order): the mean validation loss, and the mean difference from none, each seed against "
              "its own none run (min to max in brackets, and the normal 95% interval of the mean: "
              "mean +- 1.96 standard errors)."]
    L += ["", "Targets: int8 bytes <= 30% of none; validation loss within 0.5%. "
          f"int8+overlap: int8 with algorithm.overlapSteps = {overlap_steps(a.tau)} (the round's "
          "exchange runs during that many local steps and its outer step lands then).", ""]
    L += ["## 20 Mbit/s replica link (4x1, bench/run.py's netns + tbf)", ""]
    if isinstance(link, dict):
        L += [f"Measured link: {link['mbit']:.1f} Mbit/s. {a.link_rounds} sync rounds per run after the "
              f"{a.warmup}-step warm-up; int8+overlap with overlapSteps 2.", ""]
        if results.get("auto_tau"):
            t = results["auto_tau"]
            L += [f"tau {t['tau']} is `--link-taus auto`: a calibration run of fp32 at tau 16 measured "
                  f"R = {t['R']:.2f} s blocked per round and c = {t['c']:.3f} s per local step, and "
                  f"R / (tau c + R) = {100 * t['share']:.0f}% gives tau = {t['tau']}. That is fp32's "
                  "blocked share where the link targets were set, so the scenario keeps the ratio of "
                  "link time to compute they were set at, on any CPU.", ""]
        L += [
              "| tau | codec | blocked (whole run) | blocked after warm-up | steady tok/s | of none | tok/s (whole run) | val loss | syncs |",
              "|---|---|---|---|---|---|---|---|---|"]
        for tau, runs in link["by_tau"].items():
            n = runs["none"]
            for c, r in runs.items():
                bs = r.get("blocked_steady_frac")
                ratio = r["tps_steady"] / n["tps_steady"] if r.get("tps_steady") and n.get("tps_steady") else None
                L.append(f"| {tau} | {c} | {100 * r['blocked_frac']:.1f}% | {'-' if bs is None else f'{100 * bs:.1f}%'} | "
                         f"{fmt(r.get('tps_steady'), 0)} | {'-' if ratio is None else f'{ratio:.2f}x'} | {r['tps']:.0f} | "
                         f"{r['val_loss']:.4f} | {r['syncs']} |")
        L += ["", "Targets (int8): blocked <= 20%, steady tokens/s >= 1.5x none."]
    else:
        L.append(f"Not run: {link or '--no-link'}.")
    with open(os.path.join(out, "compression.md"), "w") as f:
        f.write("\n".join(L) + "\n")
    log(f"wrote {out}/compression.md")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
