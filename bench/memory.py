#!/usr/bin/env python3
"""Memory per worker of ZeRO-3 inside a replica (docs/memory.md), against the plan and a peer.

Runs a ~100M-parameter Llama (dim 1024, 8 layers, 16 heads, ffn 2752, byte vocabulary;
batch 1 x seq 128, 3 steps, a sync round every 2) with `edit` on 4 local workers in each
layout (1x4, 2x2, 4x1), the `llama-350m` preset in 1x4 for 2 steps, and the same 100M
model under the plain PyTorch DiLoCo peer (4 processes, unsharded). Reports the largest
worker's peak RSS (getrusage, as the kernel's OOM killer and a pod's memory limit see it)
next to the runtime's own plan of its state and full-size buffers. With --baseline-bin it
also runs the 100M layouts with that build, and the tiny preset's throughput (4x1 and 2x2)
with both builds back to back, so a memory change is measured before and after in one run
and checked not to cost speed.

    python3 bench/memory.py                       # writes bench/results/<date>/memory.md
    python3 bench/memory.py --baseline-bin /path/to/older/build/runtime
    python3 bench/memory.py --quick               # smaller model, 1 step: a smoke test
"""
import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile

from common import ROOT, blas_coretype, log
from edit_testing import edit_run, logs

MODEL_100M = dict(preset="custom", dim=1024, layers=8, heads=16, ffnDim=2752, vocabSize=256)
QUICK_MODEL = dict(preset="custom", dim=256, layers=4, heads=4, ffnDim=688, vocabSize=256)
TARGETS_GB = {"1x4": 1.3, "2x2": 2.0, "4x1": 3.6}


def yaml_config(model, steps, batch, seq):
    lines = ["model:"] + [f"  {k}: {v}" for k, v in model.items()]
    lines += ["data:", "  train: data/brown/train.bin", "  val: data/brown/val.bin",
              f"  seqLen: {seq}", f"  batchSize: {batch}", "  valBatches: 2",
              "training:", f"  steps: {steps}", "  lrWarmupSteps: 1", "  logEvery: 1",
              "algorithm:", "  mode: edit", "  warmupSteps: 0", "  syncInterval: 2"]
    return "\n".join(lines) + "\n"


def run_edit(bin_dir, cfg_text, nproc, shards, sets=(), env=None):
    """One edit-run; returns the workers' summaries (from --log-dir) and the wall time."""
    with tempfile.TemporaryDirectory() as tmp:
        cfg = os.path.join(tmp, "cfg.yaml")
        with open(cfg, "w") as f:
            f.write(cfg_text)
        r = edit_run.run(nproc, sets, shards=shards, config=cfg, quiet=True, log_dir=os.path.join(tmp, "logs"),
                         binary=os.path.join(bin_dir, "edit-run"), cwd=ROOT, env={**os.environ, **(env or {})},
                         timeout=None, merge_output=True)
        summaries = [s for _, s in sorted(logs.summaries(r.log_dir).items())]
        if r.returncode != 0:
            log(f"edit-run exited {r.returncode}:\n{r.stdout[-3000:]}")
        return dict(code=r.returncode, wall=r.wall, summaries=summaries, tail=r.stdout[-2000:])


def run_peer(peer, model, steps, batch, seq, nproc=4):
    """The PyTorch DiLoCo peer under /usr/bin/time: its peak RSS is the largest process's."""
    cmd = ["/usr/bin/time", "-f", "@maxrss_kb %M", "/usr/bin/python3", peer, "--mode", "diloco",
           "--nproc", str(nproc), "--steps", str(steps), "--H", "2", "--batch", str(batch), "--seq", str(seq),
           "--dim", str(model["dim"]), "--layers", str(model["layers"]), "--heads", str(model["heads"]),
           "--ffn", str(model["ffnDim"]), "--val_batches", "2", "--port", str(29700 + os.getpid() % 200),
           "--data", "data/brown/train.bin", "--val_data", "data/brown/val.bin"]
    r = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    rss = None
    for line in r.stderr.splitlines():
        if line.startswith("@maxrss_kb "):
            rss = int(line.split()[1]) * 1024
    return dict(code=r.returncode, peak_rss=rss, tail=r.stderr[-1500:])


def gb(b):
    return f"{b / 1e9:.2f} GB" if b else "–"


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bin-dir", default=os.path.join(ROOT, "build", "runtime"))
    p.add_argument("--baseline-bin", default="",
                   help="another build's runtime dir: the 100M layouts and tiny-preset tokens/s of both")
    p.add_argument("--peer", default=os.path.join(os.path.dirname(ROOT), "shared", "peers", "torch_peer.py"))
    p.add_argument("--out", default=os.path.join(ROOT, "bench", "results", datetime.date.today().isoformat()))
    p.add_argument("--quick", action="store_true")
    p.add_argument("--tps-steps", type=int, default=60)
    a = p.parse_args()
    os.makedirs(a.out, exist_ok=True)
    core = blas_coretype("auto")
    env = {"OPENBLAS_CORETYPE": core} if core else {}

    model = QUICK_MODEL if a.quick else MODEL_100M
    steps = 1 if a.quick else 3
    rows = []
    builds = [("this build", a.bin_dir)] + ([("baseline", a.baseline_bin)] if a.baseline_bin else [])
    for layout, shards in (("1x4", 4), ("2x2", 2), ("4x1", 1)):
        for build, bdir in builds:
            log(f"edit {layout}, {model['dim']}x{model['layers']} model, {build}")
            r = run_edit(bdir, yaml_config(model, steps, 1, 128), 4, shards, env=env)
            ok = r["code"] == 0 and len(r["summaries"]) == 4
            peak = max((s.get("peak_rss_bytes", 0) for s in r["summaries"]), default=0)
            plan = r["summaries"][0]["memory_plan"] if r["summaries"] else {}
            rows.append(dict(layout=layout, model="100M" if not a.quick else "quick", code=r["code"], ok=ok,
                             build=build, peak_rss=peak, plan_state=plan.get("state"),
                             plan_buffers=plan.get("buffers"), plan=plan, wall=r["wall"],
                             target_gb=None if a.quick else TARGETS_GB[layout]))
    if not a.quick:
        log("llama-350m 1x4, 2 steps")
        r = run_edit(a.bin_dir, yaml_config(dict(preset="llama-350m", vocabSize=256), 2, 1, 128), 4, 4, env=env)
        peak = max((s.get("peak_rss_bytes", 0) for s in r["summaries"]), default=0)
        plan = r["summaries"][0]["memory_plan"] if r["summaries"] else {}
        rows.append(dict(layout="1x4", model="llama-350m", code=r["code"], ok=r["code"] == 0, peak_rss=peak, build="this build",
                         plan_state=plan.get("state"), plan_buffers=plan.get("buffers"), plan=plan,
                         wall=r["wall"], target_gb=None))

    peer = None
    if os.path.exists(a.peer):
        log("PyTorch DiLoCo peer, 4 processes, same model (unsharded)")
        peer = run_peer(a.peer, model, steps, 1, 128)
    else:
        log(f"peer not found at {a.peer}: skipped (--peer PATH)")

    tps = []
    if a.baseline_bin:
        for layout, shards in (("4x1", 1), ("2x2", 2)):
            for name, bdir in (("this build", a.bin_dir), ("baseline", a.baseline_bin)):
                log(f"tiny {layout} tokens/s: {name}")
                r = run_edit(bdir, open(os.path.join(ROOT, "examples/local/tiny.yaml")).read(), 4, shards,
                             sets=[f"training.steps={a.tps_steps}", "checkpoint.dir="], env=env)
                t = sum(s["tps"] for s in r["summaries"])
                peak = max((s.get("peak_rss_bytes", 0) for s in r["summaries"]), default=0)
                tps.append(dict(layout=layout, build=name, tps=t, peak_rss=peak, code=r["code"]))

    out = dict(date=datetime.datetime.now().isoformat(timespec="seconds"), model=model, steps=steps,
               rows=rows, peer=peer, tps=tps, openblas_coretype=core)
    with open(os.path.join(a.out, "memory.json"), "w") as f:
        json.dump(out, f, indent=1)

    md = [f"# Memory per worker (ZeRO-3 inside a replica), {out['date']}", "",
          "Largest worker's peak RSS (getrusage) on this 2-core, 24 GiB machine; `edit`, 4 local workers,",
          f"batch 1 x seq 128, {steps} steps; the runtime's plan (docs/memory.md) of its state (slices of",
          "parameters, gradients, AdamW, outer weights + momentum) and full-size buffers.",
          "The rest of the RSS is activations, LibTorch/OpenBLAS/Gloo (about 0.2 GB for a tiny model).", "",
          "| model | layout | build | peak RSS per worker | plan: state | plan: buffers | target | result |",
          "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        verdict = "failed (exit %d)" % r["code"] if not r["ok"] else (
            "met" if r["target_gb"] and r["peak_rss"] <= r["target_gb"] * 1e9 else
            ("missed" if r["target_gb"] else "ran"))
        target = f"<= {r['target_gb']} GB" if r["target_gb"] else "–"
        md.append(f"| {r['model']} | {r['layout']} | {r['build']} | {gb(r['peak_rss'])} | {gb(r['plan_state'])} | "
                  f"{gb(r['plan_buffers'])} | {target} | {verdict} |")
    if peer:
        md += ["", f"PyTorch DiLoCo peer (`torch_peer.py --mode diloco`, 4 processes, the same model, unsharded: "
               f"parameters, gradients, AdamW, outer weights and momentum on every process): largest process "
               f"{gb(peer['peak_rss'])} (exit {peer['code']})."]
        for build, _ in builds:
            four = next((r for r in rows if r["layout"] == "4x1" and r["model"] != "llama-350m"
                         and r["build"] == build), None)
            if four and four["peak_rss"] and peer["peak_rss"]:
                md.append(f"edit 4x1, {build} / peer: {four['peak_rss'] / peer['peak_rss']:.2f}x.")
    if tps:
        md += ["", "Tiny preset tokens/s (examples/local/tiny.yaml, 4 workers), this build and the baseline, "
               "back to back in this run:", "", "| layout | build | tokens/s | peak RSS |", "| --- | --- | --- | --- |"]
        for t in tps:
            md.append(f"| {t['layout']} | {t['build']} | {t['tps']:.0f} | {gb(t['peak_rss'])} |")
        for layout in ("4x1", "2x2"):
            pair = {t["build"]: t["tps"] for t in tps if t["layout"] == layout}
            if len(pair) == 2 and pair["baseline"]:
                md.append(f"\n{layout}: this build / baseline = {pair['this build'] / pair['baseline']:.2f}x")
    with open(os.path.join(a.out, "memory.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    print("\n".join(md))
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
