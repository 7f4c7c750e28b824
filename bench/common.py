"""Constants and small helpers shared by the benchmark drivers; every driver imports it
first, which also makes the helpers they share with the tests importable."""

import math
import os
import re
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# edit_testing (tests/pylib): ctest puts it on PYTHONPATH; a driver run by hand
# (python3 bench/X.py, bench/run.sh) finds it here.
sys.path.insert(0, os.path.join(ROOT, "tests", "pylib"))
from edit_testing.cpu import openblas_coretype  # noqa: E402


def mode_table():
    """The mode names of the one mode table (common/src/modes.h, kModeTable), in its order."""
    text = open(os.path.join(ROOT, "common", "src", "modes.h")).read()
    table = text[text.index("kModeTable"):]
    names = re.findall(r'\{Mode::\w+,\s*"([a-z-]+)"', table)
    if not names:
        raise RuntimeError("common/src/modes.h: no rows found in kModeTable")
    return names


# Baselines first (the table lists EDiT first): ddp, localsgd, diloco, then edit, a-edit.
MODES = sorted(mode_table(), key=lambda m: {"ddp": 0, "localsgd": 1, "diloco": 2}.get(m, 3))
SCENARIOS = ["normal", "straggler", "random", "link100", "link20"]
LAYOUTS = {"4x1": (4, 1), "2x2": (2, 2)}
LINK_RATES = {"link100": "100mbit", "link20": "20mbit"}
SCENARIO_TEXT = {
    "normal": "normal",
    "straggler": "consistent straggler (rank 3 sleeps one step time every step)",
    "random": "random straggler (a random rank sleeps one step time each step)",
    "link100": "100 Mbit/s replica-to-replica link (netns + tbf)",
    "link20": "20 Mbit/s replica-to-replica link (netns + tbf)",
}

# Network namespaces of the limited-link scenarios: a private test subnet that exists only
# inside these namespaces, on a bridge this script creates and removes.
NS_PREFIX = "edbench-"
BRIDGE = "edbench0"
SUBNET = "10.77.0"

# Model shape of the tiny preset (common/src/worker_config.cpp presets; edit-train --print-config).
TINY = dict(vocab=256, dim=128, layers=4, heads=4, ffn=352)


# ----------------------------------------------------------------------------- helpers

def log(msg):
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def run_cmd(cmd, check=True, quiet=False):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}): {r.stderr.strip()}")
    return r


def unit_sizes(shape, shards):
    """Parameters per unit, padded to a multiple of shards (runtime/src/model/model.cpp modelLayout)."""
    d, f, v, L = shape["dim"], shape["ffn"], shape["vocab"], shape["layers"]
    units = [v * d] + [2 * d + 4 * d * d + 3 * f * d] * L + [d + v * d]
    return [(n + shards - 1) // shards * shards for n in units]


def param_count(shape):
    return sum(unit_sizes(shape, 1))


def flops_per_token(shape, seq):
    """runtime/src/model/model.cpp flopsPerToken: 6 x matmul params + 3 x causal attention."""
    matmul = param_count(shape) - shape["vocab"] * shape["dim"]
    attn = 2.0 * shape["layers"] * seq * shape["dim"]
    return 6.0 * matmul + 3.0 * attn


def fmt(x, nd=2, unit=""):
    if x is None or (isinstance(x, float) and (math.isnan(x) or math.isinf(x))):
        return "–"
    if isinstance(x, str):
        return x
    if abs(x) >= 1e4:
        return f"{x / 1e3:.1f}k{unit}"
    return f"{x:.{nd}f}{unit}"


def loss_at(series, t):
    pts = [s for s in series if s[0] <= t]
    return pts[-1][2] if pts else None


def blas_env(args, workers):
    """The OpenBLAS environment of a worker: the core type (below) and its thread pool sized
    like the worker's intra-op threads. Without OPENBLAS_NUM_THREADS each worker's OpenBLAS
    keeps a pool of one thread per core (at::set_num_threads does not reach it), which
    spins in sched_yield while 4 workers share 2 cores."""
    if not args.coretype:
        return {}
    return {"OPENBLAS_CORETYPE": args.coretype,
            "OPENBLAS_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // workers))}


def blas_coretype(choice):
    """OPENBLAS_CORETYPE of --openblas-coretype: "auto" names the core from the CPU flags as
    edit-train does (OpenBLAS 0.3.21's DYNAMIC_ARCH detection does not know this CPU's
    model number and falls back to the SSE3 `Prescott` kernels; OPENBLAS_VERBOSE=2 shows
    `Core: Prescott`), "default" leaves it to OpenBLAS, anything else is the name."""
    if choice == "default":
        return None
    if choice != "auto":
        return choice
    return openblas_coretype()

