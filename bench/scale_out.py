#!/usr/bin/env python3
"""Scale-out model on paper: ddp vs edit tokens/s for llama-1b / llama-7b on 8-64 GPU nodes
at 25 / 100 / 400 Gbit/s per node (docs/scale-out.md explains every assumption).

    python3 bench/scale_out.py                          # the projection table (markdown)
    python3 bench/scale_out.py --check bench/results/<date>/results.json
                                                        # + the same model against the measured
                                                        #   limited-link runs of the tiny preset

The model: a step's compute is C = tokens_per_gpu x flops_per_token / (gpu_flops x mfu).
Each step, ddp (HSDP: ZeRO-3 inside a node, all-reduce across nodes) moves
V = 2 (M-1)/M x P x b bytes over each node's NIC (ring all-reduce; the node's 8 GPUs each
reduce 1/8 of the model, together the whole model), overlapped with the backward (2/3 of C).
edit moves the same V once every tau steps (the layer-wise sync is an all-reduce of the
weighted pseudo-gradients), overlapped with the forward of the sync step (1/3 of C), plus one
tiny all-gather of norms per unit. Intra-node ZeRO-3 traffic (NVLink) is the same for both
modes and assumed hidden behind compute.
"""

import argparse
import json
import sys

from common import flops_per_token, param_count  # runtime/src/model/model.cpp's counts, in one place

# (dim, layers, heads, ffn) from common/src/worker_config.cpp presets; vocabulary of a real
# tokenizer (Llama-2's 32000), not the byte-level 256 of the tiny benchmarks.
PRESETS = {"llama-1b": (2048, 24, 16, 5504), "llama-7b": (4096, 32, 32, 11008)}


def shape(dim, layers, ffn, vocab):
    """The model shape as bench/common.py's parameter and FLOP counts take it."""
    return dict(dim=dim, layers=layers, ffn=ffn, vocab=vocab)


def step_times(P, fpt, nodes, gbit, a, mode):
    """Seconds per step (per replica) and its parts."""
    compute = a.tokens_per_gpu * fpt / (a.gpu_tflops * 1e12 * a.mfu)
    M = nodes
    if M == 1:
        return compute, compute, 0.0
    bw = gbit * 1e9 / 8 * a.link_efficiency           # bytes/s per node NIC
    volume = 2.0 * (M - 1) / M * P * a.bytes_per_value  # ring all-reduce, per node
    latency = 2 * (M - 1) * a.latency_us * 1e-6 * a.buckets
    comm = volume / bw + latency
    if mode == "ddp":
        exposed = max(0.0, comm - a.ddp_overlap * compute)
        return compute + exposed, compute, comm
    # edit: one sync every tau steps, overlapped with the forward of that step.
    exposed = max(0.0, comm - a.edit_overlap * compute)
    return compute + exposed / a.tau, compute, comm


def projection(a):
    rows = []
    for name, (dim, layers, heads, ffn) in PRESETS.items():
        P = param_count(shape(dim, layers, ffn, a.vocab))
        fpt = flops_per_token(shape(dim, layers, ffn, a.vocab), a.seq)
        for nodes in a.nodes:
            for gbit in a.gbits:
                t_ddp, c, comm = step_times(P, fpt, nodes, gbit, a, "ddp")
                t_edit, _, _ = step_times(P, fpt, nodes, gbit, a, "edit")
                tokens = nodes * a.gpus_per_node * a.tokens_per_gpu
                rows.append(dict(model=name, params=P, nodes=nodes, gbit=gbit, compute_s=c,
                                 comm_s=comm, ddp_tps=tokens / t_ddp, edit_tps=tokens / t_edit,
                                 ideal_tps=tokens / c))
    return rows


def print_projection(a, out=sys.stdout):
    rows = projection(a)
    print(f"Assumptions: {a.gpus_per_node} GPUs per node at {a.gpu_tflops:g} TFLOP/s x MFU {a.mfu:g}; "
          f"{a.tokens_per_gpu} tokens per GPU per step (seq {a.seq}); {a.bytes_per_value}-byte values on the "
          f"wire; NIC efficiency {a.link_efficiency:g}; {a.latency_us:g} us per ring hop x {a.buckets} buckets; "
          f"ddp overlaps {a.ddp_overlap:g} of compute, edit {a.edit_overlap:g} of one step's compute; "
          f"tau = {a.tau}.", file=out)
    print("", file=out)
    print("| model | params | nodes (GPUs) | link | compute/step | all-reduce/step | ddp tok/s | edit tok/s "
          "| edit / ddp | ddp % of ideal | edit % of ideal |", file=out)
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|", file=out)
    for r in rows:
        print(f"| {r['model']} | {r['params'] / 1e9:.2f} B | {r['nodes']} ({r['nodes'] * a.gpus_per_node}) "
              f"| {r['gbit']} Gbit/s | {r['compute_s'] * 1e3:.0f} ms | {r['comm_s'] * 1e3:.0f} ms "
              f"| {r['ddp_tps'] / 1e6:.2f} M | {r['edit_tps'] / 1e6:.2f} M | {r['edit_tps'] / r['ddp_tps']:.2f}x "
              f"| {100 * r['ddp_tps'] / r['ideal_tps']:.0f}% | {100 * r['edit_tps'] / r['ideal_tps']:.0f}% |",
              file=out)


def check(path, a, out=sys.stdout):
    """The same model, fed the tiny preset's measured compute and bytes, against the measured
    limited-link runs (4 CPU workers; one namespace per replica = one 'node')."""
    data = json.load(open(path))
    runs = {(r["layout"], r["scenario"], r["mode"]): r for r in data["runs"]}
    links = data.get("links", {})
    cfg = data["config"]
    print("| layout | link | mode | measured compute/step | sync bytes/node/step | predicted tok/s "
          "| measured steady tok/s | measured / predicted |", file=out)
    print("|---|---|---|---:|---:|---:|---:|---:|", file=out)
    for layout, (M, N) in (("4x1", (4, 1)), ("2x2", (2, 2))):
        normal = runs.get((layout, "normal", "edit"))
        if not normal or not normal.get("ok"):
            continue
        compute = normal["median_local_step_s"]
        for scen in ("link100", "link20"):
            mbit = links.get(f"{layout} {scen}")
            for mode in ("ddp", "edit"):
                r = runs.get((layout, scen, mode))
                if not r or not r.get("ok") or not mbit or not r.get("tps_steady"):
                    continue
                tokens_step = cfg["tokens_per_step"]
                bw = mbit * 1e6 / 8  # the namespace's (node's) measured link, bytes/s
                # Bytes per rank per step as measured; a namespace's N ranks share its link.
                ddp_run = runs.get((layout, scen, "ddp"))
                ddp_step = (ddp_run["bytes_per_token"]["sync"] * tokens_step
                            if ddp_run and ddp_run.get("ok") else 0.0)
                if mode == "ddp":
                    per_step = ddp_step * N
                    comm = per_step / bw
                    t = compute + max(0.0, comm - a.ddp_overlap * compute)
                else:
                    # edit: the warm-up steps move ddp's bytes; each sync round moves the rest.
                    steps, warm = cfg["steps"], cfg["warmup"]
                    total = r["bytes_per_token"]["sync"] * tokens_step * steps
                    per_round = (total - warm * ddp_step) / max(1, r["syncs"]) * N
                    rounds = max(0, r["syncs"] - 1)  # the final sync is after the last step
                    per_step = per_round * rounds / (steps - warm)
                    comm = per_round / bw
                    t = compute + rounds * max(0.0, comm - a.edit_overlap * compute) / (steps - warm)
                pred = M * tokens_step / t
                print(f"| {layout} | {scen} ({mbit:.0f} Mbit/s measured) | {mode} | {compute * 1e3:.0f} ms "
                      f"| {per_step / 1e6:.2f} MB | {pred:.0f} | {r['tps_steady']:.0f} "
                      f"| {r['tps_steady'] / pred:.2f} |", file=out)


def main(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gpu-tflops", type=float, default=989.0, help="dense bf16 peak per GPU (H100 SXM)")
    p.add_argument("--mfu", type=float, default=0.40)
    p.add_argument("--gpus-per-node", type=int, default=8)
    p.add_argument("--tokens-per-gpu", type=int, default=16384, help="tokens per GPU per step")
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--bytes-per-value", type=int, default=4, help="4 = fp32 (as the runtime), 2 = bf16")
    p.add_argument("--link-efficiency", type=float, default=0.8)
    p.add_argument("--latency-us", type=float, default=20.0)
    p.add_argument("--buckets", type=int, default=26, help="collectives per all-reduce (one per unit)")
    p.add_argument("--ddp-overlap", type=float, default=2 / 3, help="share of compute hiding ddp's all-reduce")
    p.add_argument("--edit-overlap", type=float, default=1 / 3, help="share of a step hiding edit's sync")
    p.add_argument("--tau", type=int, default=16)
    p.add_argument("--nodes", default="8,16,32,64")
    p.add_argument("--gbits", default="25,100,400")
    p.add_argument("--check", metavar="RESULTS_JSON")
    a = p.parse_args(argv)
    a.nodes = [int(x) for x in a.nodes.split(",")]
    a.gbits = [int(x) for x in a.gbits.split(",")]
    print_projection(a)
    if a.check:
        print("")
        check(a.check, a)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
