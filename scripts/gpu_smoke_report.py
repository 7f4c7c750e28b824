#!/usr/bin/env python3
"""The Python parts of scripts/gpu-smoke.sh (which runs them with tests/pylib on
PYTHONPATH): what the machine is, and the report of its runs.

    gpu_smoke_report.py env ENV_JSON CPU(0|1) CARRY         # the machine (needs torch)
    gpu_smoke_report.py build-info ENV_JSON SECONDS JOBS NO_BUILD(0|1) TORCH_ROUTE
    gpu_smoke_report.py gpus ENV_JSON                       # prints the GPU count
    gpu_smoke_report.py report WORK OUT_MD                  # WORK: runs.tsv, env.json, <run>/rank-*.log
"""
import datetime
import glob
import json
import os
import subprocess
import sys

from edit_testing import logs

# Dense peaks in TFLOPS (vendor data sheets): bf16 tensor cores, and plain fp32 (this
# runtime computes in fp32, and LibTorch leaves TF32 off for matmuls by default).
PEAKS = [("H200 NVL", 835.0, 60.0), ("H200", 989.4, 66.9), ("H100 NVL", 835.0, 60.0),
         ("H100 PCIe", 756.0, 51.2), ("H100", 989.4, 66.9), ("A100", 312.0, 19.5)]


def shell(c):
    try:
        return subprocess.run(c, shell=True, capture_output=True, text=True, timeout=20).stdout.strip()
    except Exception:  # noqa: BLE001 - a tool that is missing or hangs leaves its field empty
        return ""


def probe_env(out, cpu, carry):
    """Writes env.json: versions of PyTorch, CUDA, the tools, the GPU and its driver."""
    import torch
    e = {"when": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
         "torch": f"{torch.__version__} (C++ ABI {'new' if torch._C._GLIBCXX_USE_CXX11_ABI else 'old'})",
         "cuda": str(torch.version.cuda), "cmake": shell("cmake --version | head -1"),
         "cxx": shell("c++ --version | head -1"), "nvcc": shell("nvcc --version | tail -2 | head -1"),
         "carried": " ".join(open(os.path.join(carry, "MANIFEST")).read().split())}
    if not cpu:
        if not torch.cuda.is_available():
            sys.exit("gpu-smoke: torch.cuda.is_available() is False")
        e.update(gpu_name=torch.cuda.get_device_name(0), gpu_count=torch.cuda.device_count(),
                 nccl=".".join(map(str, torch.cuda.nccl.version())),
                 driver=shell("nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1"))
    json.dump(e, open(out, "w"))
    print("gpu-smoke:", ", ".join(f"{k} {v}" for k, v in e.items()))


def add_build_info(env_json, seconds, jobs, no_build, route):
    e = json.load(open(env_json))
    e["build"] = (f"edit-train, edit-run, edit-data in {seconds} s with {jobs} jobs (-DEDIT_MINIMAL=ON; {route})"
                  if not no_build else "existing binaries (--no-build)")
    json.dump(e, open(env_json, "w"))


def gpu_count(env_json):
    return json.load(open(env_json)).get("gpu_count", 1)


def run_logs(d):
    """(every summary, {rank: progress rows}) of one run's --log-dir."""
    out, progress = [], {}
    for f in sorted(glob.glob(os.path.join(d, "rank-*.log"))):
        rows, sums = logs.read(f)
        out += sums
        for j in rows:
            progress.setdefault(j["rank"], []).append(j)
    return out, progress


def human(v, unit=""):
    for s, k in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if v >= k:
            return f"{v / k:.2f}{s}{unit}"
    return f"{v:.0f}{unit}"


def measure(row, s, prog):
    """The figures of one run that ended with a summary from every rank."""
    # Steady state: the progress reports after the first (which includes start-up).
    steady = 0.0
    for rank, ps in prog.items():
        tail = [p["tps"] for p in ps[1:]] or [p["tps"] for p in ps]
        steady += sorted(tail)[len(tail) // 2]
    fpt = s[0]["flops_per_token"]
    gpus = len({x.get("device", "cpu") for x in s}) if s[0].get("device", "cpu") != "cpu" else 0
    row.update(steps=s[0]["steps"], steady=steady, whole=sum(x["tps"] for x in s), params=s[0]["params"],
               flops=steady * fpt, gpus=gpus,
               syncWork=max(x["sync_work_seconds"] / max(1e-9, x["step_seconds_total"]) for x in s),
               syncWait=max(sum(c["wait"] for c in x["comm"] if c["op"] == "sync") / max(1e-9, x["step_seconds_total"])
                            for x in s),
               first=prog.get(0, [{}])[0].get("loss"), loss=s[0]["loss"], val=s[0]["val_loss"],
               alloc=max(x.get("peak_gpu_allocated_bytes", -1) for x in s),
               reserved=max(x.get("peak_gpu_reserved_bytes", -1) for x in s),
               stepT=max(x["step_seconds_total"] for x in s))


def report(work, outmd):
    env = {}
    if os.path.exists(os.path.join(work, "env.json")):
        env = json.load(open(os.path.join(work, "env.json")))
    gpu = env.get("gpu_name", "")
    peak = next(((b, f) for n, b, f in PEAKS if n in gpu), None)

    rows = []
    for line in open(os.path.join(work, "runs.tsv")):
        name, nproc, shards, rc, wall, verdict, note = line.rstrip("\n").split("\t")
        nproc, shards = int(nproc), int(shards)
        s, prog = run_logs(os.path.join(work, name)) if rc != "-" else ([], {})
        r = {"name": name, "layout": f"{nproc // shards}x{shards}", "rc": rc, "wall": wall,
             "verdict": verdict, "note": note}
        if len(s) == nproc:
            measure(r, s, prog)
        rows.append(r)

    L = ["# GPU smoke run (scripts/gpu-smoke.sh)\n"]
    for k, label in (("when", "when"), ("gpu_name", "GPU"), ("gpu_count", "GPUs"), ("driver", "driver"),
                     ("torch", "PyTorch (LibTorch)"), ("cuda", "CUDA (PyTorch's)"), ("nccl", "NCCL"),
                     ("nvcc", "nvcc"), ("cxx", "C++ compiler"), ("cmake", "CMake"), ("build", "build"),
                     ("carried", "carried dependencies")):
        if env.get(k) not in (None, ""):
            L.append(f"- {label}: {env[k]}")
    if peak:
        L.append(f"- MFU against {gpu}'s dense peaks: bf16 {peak[0]:g} TFLOPS, fp32 {peak[1]:g} TFLOPS "
                 "(the runtime computes in fp32; TF32 is off)")
    else:
        L.append("- MFU: no peak known for this device" + (f" ({gpu})" if gpu else ""))
    L.append("")
    L.append("| run | layout | exit | wall s | steps | tok/s steady | tok/s whole run | model TFLOPS | MFU bf16 | MFU fp32 "
             "| sync work / step time | sync wait / step time | peak GPU alloc / reserved | loss first -> last (val) | result |")
    L.append("|" + " --- |" * 15)
    for r in rows:
        if "steady" not in r:
            L.append(f"| {r['name']} | {r['layout']} | {r['rc']} | {r['wall']} | | | | | | | | | | | {r['verdict']}: {r['note']} |")
            continue
        g = max(1, r["gpus"])
        mfu = (lambda p: f"{100 * r['flops'] / (p * 1e12 * g):.1f}%") if peak and r["gpus"] else (lambda p: "n/a")
        mem = f"{human(r['alloc'], 'B')} / {human(r['reserved'], 'B')}" if r["alloc"] >= 0 else "n/a (CPU)"
        loss = f"{r['first']:.3f} -> {r['loss']:.3f} ({r['val']:.3f})" if r["first"] is not None and r["loss"] is not None else ""
        L.append(f"| {r['name']} | {r['layout']} | {r['rc']} | {r['wall']} | {r['steps']} | {human(r['steady'])} | "
                 f"{human(r['whole'])} | {r['flops'] / 1e12:.2f} | {mfu(peak[0] if peak else 1)} | {mfu(peak[1] if peak else 1)} | "
                 f"{100 * r['syncWork']:.1f}% | {100 * r['syncWait']:.1f}% | {mem} | {loss} | {r['verdict']}: {r['note']} |")
    L.append("")
    L.append("- tok/s steady: the median of each rank's progress reports after the first (start-up excluded), summed "
             "over ranks; whole run: tokens / wall time of the worker, start-up and validation included.")
    L.append("- model TFLOPS = steady tok/s x FLOPs per token (6 x matmul parameters + causal attention); "
             "MFU divides by the peak x GPUs used.")
    L.append("- sync work: the layer-wise (EDiT) or whole-model synchronization tasks, timed on the host on the "
             "communication thread (kernels queued on the side stream; norms read back, so mostly complete); "
             "sync wait: what the training thread blocked on them. Both over the sum of step times, largest rank.")
    one = [r for r in rows if r["name"] == "nccl-2-ranks-1-gpu"]
    if one:
        log = open(os.path.join(work, "nccl-2-ranks-1-gpu", "edit-run.out"), errors="replace").read()
        said = next((l.strip() for l in log.splitlines() if "Duplicate GPU" in l or "invalid usage" in l.lower()), "")
        L.append(f"- Several ranks on one GPU: {one[0]['verdict']} (exit {one[0]['rc']})"
                 + (f"; NCCL said: `{said[:200]}`" if said else "") +
                 ". NCCL refuses two ranks of one communicator on the same GPU, so with one GPU the runs above "
                 "are one rank: NCCL's collectives are not exercised (groups of one rank are skipped), the CUDA "
                 "side stream, its events and the pinned outer state are. Several GPUs run the 2x1/2x2 rows.")
    open(outmd, "w").write("\n".join(L) + "\n")
    print("\n".join(L))


def main(argv):
    cmd, args = (argv[0], argv[1:]) if argv else ("", [])
    if cmd == "env" and len(args) == 3:
        probe_env(args[0], args[1] == "1", args[2])
    elif cmd == "build-info" and len(args) == 5:
        add_build_info(args[0], args[1], args[2], args[3] == "1", args[4])
    elif cmd == "gpus" and len(args) == 1:
        print(gpu_count(args[0]))
    elif cmd == "report" and len(args) == 2:
        report(args[0], args[1])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
