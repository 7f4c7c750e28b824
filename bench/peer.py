#!/usr/bin/env python3
"""edit-run against plain PyTorch on the same machine, model, data, batch and steps.

The peer (`torch_peer.py`, outside this repository: pass --peer) trains the same Llama shape
(stacked qkv, RMSNorm, rotary, SwiGLU, AdamW, gradient clipping) with DDP or DiLoCo in N
local processes over Gloo, one intra-op thread each. Both get the same OpenBLAS kernels
(OPENBLAS_CORETYPE) and one BLAS thread per process. Runs alternate (ours, peer, ours, ...)
and the median of --reps is reported, so both see the same background load.

Reported per pair: training-loop tokens/s (both exclude start-up and the final
validation), whole-process wall time, and MFU = model FLOP/s / the machine's GEMM rate at
the model's shapes (edit-gemm-bench: the better of 2 single-thread streams and one
2-thread run, as in run.py).

    python3 bench/peer.py --peer ../shared/peers/torch_peer.py      # tiny and small, 4x1
    python3 bench/peer.py --models tiny --reps 1 --steps 30          # quicker
    python3 bench/peer.py --models 100m --steps 2 --batch 1          # start-up of a 100M model: the walls
"""
import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from common import ROOT, blas_coretype, log
from edit_testing import edit_run, logs
from memory import MODEL_100M

MODELS = {  # common/src/worker_config.cpp presets
    "tiny": dict(dim=128, layers=4, heads=4, ffn=352),
    "small": dict(dim=256, layers=6, heads=8, ffn=704),
    # bench/memory.py's ~100M model: with --steps 2 --batch 1 the walls compare start-up.
    "100m": dict(dim=MODEL_100M["dim"], layers=MODEL_100M["layers"], heads=MODEL_100M["heads"],
                 ffn=MODEL_100M["ffnDim"]),
}
VOCAB = 256


def gemm_rate(gemm_bin, m, tokens, seq, env):
    cmd = [gemm_bin, "--tokens", str(tokens), "--seq", str(seq), "--threads", "1,2", "--min-seconds", "0.5",
           "--square", "0", "--dim", str(m["dim"]), "--ffn", str(m["ffn"]), "--vocab", str(VOCAB),
           "--layers", str(m["layers"]), "--heads", str(m["heads"])]
    r = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, env=env, check=True)
    rates = {}
    for line in r.stdout.splitlines():
        if line.startswith("{"):
            row = json.loads(line)
            if row["kind"] == "model":
                rates[row["threads"]] = row["gflops"]
    return max(rates.get(2, 0), min(os.cpu_count() or 1, 2) * rates.get(1, 0))


def run_ours(a, m, mode, env):
    sets = ["model.preset=custom", f"model.dim={m['dim']}", f"model.layers={m['layers']}",
            f"model.heads={m['heads']}", f"model.ffnDim={m['ffn']}", f"model.vocabSize={VOCAB}",
            f"data.batchSize={a.batch}", f"data.seqLen={a.seq}", f"training.steps={a.steps}",
            "training.lr=1e-3", "checkpoint.dir=", "data.valBatches=4", f"algorithm.mode={mode}",
            "algorithm.warmupSteps=0", f"algorithm.syncInterval={a.H}"]
    with tempfile.TemporaryDirectory() as tmp:
        r = edit_run.run(a.nproc, sets, quiet=True, config=os.path.join(ROOT, "examples/local/tiny.yaml"), log_dir=tmp,
                         binary=os.path.join(a.bin_dir, "edit-run"), cwd=ROOT, env=env, timeout=None, merge_output=True)
        sums = list(logs.summaries(tmp).values())
    if r.returncode != 0 or len(sums) != a.nproc:
        raise RuntimeError(f"edit-run {mode} failed ({r.returncode}):\n{r.stdout[-2000:]}")
    return dict(tps=sum(s["train_tps"] for s in sums), wall=r.wall,
                startup=max(s["startup_seconds"] for s in sums),
                rss=max(s.get("peak_rss_bytes", 0) for s in sums),
                flops_per_token=sums[0]["flops_per_token"])  # the runtime's own count (model.cpp)


def run_peer(a, m, mode, env):
    cmd = ["/usr/bin/time", "-f", "@maxrss_kb %M", "/usr/bin/python3", a.peer, "--mode", mode,
           "--nproc", str(a.nproc), "--threads", "1", "--steps", str(a.steps), "--H", str(a.H),
           "--batch", str(a.batch), "--seq", str(a.seq), "--dim", str(m["dim"]), "--layers", str(m["layers"]),
           "--heads", str(m["heads"]), "--ffn", str(m["ffn"]), "--lr", "1e-3", "--val_batches", "4",
           "--port", str(29800 + os.getpid() % 150), "--data", "data/brown/train.bin",
           "--val_data", "data/brown/val.bin"]
    t0 = time.time()
    r = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    wall = time.time() - t0
    out = [json.loads(l) for l in r.stdout.splitlines() if l.startswith("{")]
    if r.returncode != 0 or not out:
        raise RuntimeError(f"peer {mode} failed ({r.returncode}):\n{r.stderr[-2000:]}")
    rss = next((int(l.split()[1]) * 1024 for l in r.stderr.splitlines() if l.startswith("@maxrss_kb ")), 0)
    return dict(tps=out[0]["tokens_per_s"], wall=wall, rss=rss, version=out[0]["peer"])


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--peer", default=os.path.join(os.path.dirname(ROOT), "shared", "peers", "torch_peer.py"))
    p.add_argument("--bin-dir", default=os.path.join(ROOT, "build", "runtime"))
    p.add_argument("--gemm-bin", default=os.path.join(ROOT, "build", "bench", "edit-gemm-bench"))
    p.add_argument("--models", default="tiny,small")
    p.add_argument("--nproc", type=int, default=4)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--H", type=int, default=16, help="sync interval of edit and diloco")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--kernels-ab", action="store_true",
                   help="also run ours with EDIT_CPU_KERNELS=aten (LibTorch ops instead of the plain-C++ "
                        "CPU kernels: attention, RMSNorm, SwiGLU) in the same alternation: before/after in one run")
    p.add_argument("--out", default=os.path.join(ROOT, "bench", "results", datetime.date.today().isoformat()))
    a = p.parse_args()
    if not os.path.exists(a.peer):
        sys.exit(f"peer script not found: {a.peer} (--peer PATH)")
    core = blas_coretype("auto")
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENBLAS_")}
    if core:
        env["OPENBLAS_CORETYPE"] = core
    peer_env = dict(env, OPENBLAS_NUM_THREADS="1")
    os.makedirs(a.out, exist_ok=True)

    results = []
    for name in a.models.split(","):
        m = MODELS[name]
        rate = gemm_rate(a.gemm_bin, m, a.batch * a.seq, a.seq, env) if os.path.exists(a.gemm_bin) else 0
        for ours_mode, peer_mode in (("ddp", "ddp"), ("edit", "diloco")):
            ours, aten, peer = [], [], []
            for rep in range(a.reps):
                log(f"{name}: edit-run {ours_mode} ({rep + 1}/{a.reps})")
                ours.append(run_ours(a, m, ours_mode, env))
                if a.kernels_ab:
                    log(f"{name}: edit-run {ours_mode}, LibTorch ops instead of the CPU kernels ({rep + 1}/{a.reps})")
                    aten.append(run_ours(a, m, ours_mode, dict(env, EDIT_CPU_KERNELS="aten")))
                log(f"{name}: peer {peer_mode} ({rep + 1}/{a.reps})")
                peer.append(run_peer(a, m, peer_mode, peer_env))
            med = lambda rs, k: statistics.median(r[k] for r in rs)  # noqa: E731
            row = dict(model=name, ours_mode=ours_mode, peer_mode=peer_mode,
                       ours_tps=med(ours, "tps"), peer_tps=med(peer, "tps"),
                       ours_wall=med(ours, "wall"), peer_wall=med(peer, "wall"),
                       ours_startup=med(ours, "startup"), ours_rss=med(ours, "rss"), peer_rss=med(peer, "rss"),
                       gemm_gflops=rate, runs=dict(ours=ours, ours_aten=aten, peer=peer),
                       peer_version=peer[0]["version"])
            row["ratio"] = row["ours_tps"] / row["peer_tps"]
            if aten:
                row["aten_tps"], row["aten_rss"] = med(aten, "tps"), med(aten, "rss")
            fpt = row["flops_per_token"] = ours[0]["flops_per_token"]
            row["ours_mfu"] = fpt * row["ours_tps"] / (rate * 1e9) if rate else None
            row["peer_mfu"] = fpt * row["peer_tps"] / (rate * 1e9) if rate else None
            results.append(row)
            log(f"{name} {ours_mode}: {row['ours_tps']:.0f} vs {row['peer_tps']:.0f} tok/s = {row['ratio']:.2f}x")

    stamp = datetime.datetime.now().isoformat(timespec="seconds")
    with open(os.path.join(a.out, "peer.json"), "w") as f:
        json.dump(dict(date=stamp, args=vars(a), openblas_coretype=core, results=results), f, indent=1)
    md = [f"# edit-run against plain PyTorch, {stamp}", "",
          f"{a.nproc} processes x 1 thread on this 2-core machine, batch {a.batch} x seq {a.seq}, {a.steps} steps, "
          f"sync interval {a.H} (edit: no warm-up, like the peer's DiLoCo), Brown bytes, OPENBLAS_CORETYPE={core}; "
          f"median of {a.reps} alternating runs. Tokens/s of the training loop (start-up and the final "
          "validation excluded on both sides); wall = the whole process. MFU = model FLOP/s / the machine's "
          "GEMM rate at the model's shapes.", "",
          "| model | ours | peer | ours tok/s | peer tok/s | ratio | ours MFU | peer MFU | ours wall | peer wall "
          "| ours start-up | ours RSS | peer RSS |",
          "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    pct = lambda x: f"{100 * x:.0f}%" if x is not None else "–"  # noqa: E731
    for r in results:
        md.append(f"| {r['model']} | {r['ours_mode']} | {r['peer_mode']} | {r['ours_tps']:.0f} | {r['peer_tps']:.0f} "
                  f"| {r['ratio']:.2f}x | {pct(r['ours_mfu'])} | {pct(r['peer_mfu'])} | {r['ours_wall']:.1f} s "
                  f"| {r['peer_wall']:.1f} s | {r['ours_startup']:.1f} s | {r['ours_rss'] / 1e6:.0f} MB "
                  f"| {r['peer_rss'] / 1e6:.0f} MB |")
    if any("aten_tps" in r for r in results):
        md += ["", "The same runs of ours with `EDIT_CPU_KERNELS=aten` (attention, RMSNorm and SwiGLU through "
               "LibTorch ops, as before the plain-C++ CPU kernels), alternating with the runs above:", "",
               "| model | ours | fused tok/s | LibTorch-ops tok/s | fused / ops | its ratio to the peer | fused RSS "
               "| ops RSS |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
        for r in results:
            if "aten_tps" in r:
                md.append(f"| {r['model']} | {r['ours_mode']} | {r['ours_tps']:.0f} | {r['aten_tps']:.0f} "
                          f"| {r['ours_tps'] / r['aten_tps']:.2f}x | {r['aten_tps'] / r['peer_tps']:.2f}x "
                          f"| {r['ours_rss'] / 1e6:.0f} MB | {r['aten_rss'] / 1e6:.0f} MB |")
    md += ["", f"Peer: {results[0]['peer_version'] if results else '?'} (Debian's python3-torch), `{os.path.basename(a.peer)}`."]
    with open(os.path.join(a.out, "peer.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
