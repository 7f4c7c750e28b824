#!/usr/bin/env python3
"""Elastic replicas through the operator (docs/elastic.md): `kubectl scale ej/NAME
--replicas=3` on a running job, then back to 2, on the API stand-in with real kubectl, the
built edit-operator and edit-train workers run by the stand-in's kubelet (local processes).

Reported per scale: seconds from `kubectl scale` returning to the new replica's first
training step (its pod created, scheduled, started, LibTorch loaded, the rendezvous and the
state copy included) or, for a scale-down, to the leaver's exit; the operator's own
lastScale.seconds (spec change seen -> rank 0 reports the new size); and the job's tokens/s
(status.progress.tokensPerSecond, median of its samples) before, between and after.

    python3 bench/elastic_k8s.py            # writes bench/results/<date>/elastic-k8s.md

The stand-in is not a cluster: pods start in milliseconds (no image pull, no scheduler
latency), and all workers share this machine's cores, so tokens/s cannot grow with a third
replica here. What the figures show is the operator's and runtime's part of a scale.
"""

import argparse
import datetime
import glob
import json
import os
import statistics
import sys
import time

from common import ROOT
from edit_testing.cluster import Cluster, job_manifest, unique
from edit_testing.data import make_data
from edit_testing.logs import PROGRESS
from edit_testing.net import free_port
from edit_testing.paths import BUILD, CRD, OPERATOR, find_kubectl


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=700)
    p.add_argument("--window", type=float, default=8.0, help="seconds of tokens/s samples per phase")
    p.add_argument("--out", help="results folder (default bench/results/<date>)")
    return p.parse_args(argv)


class Bench:
    def __init__(self, a):
        self.a = a
        self.c = Cluster(prefix="edit-bench-elastic-")
        self.c.start_standin()
        self.c.kubectl("apply", "-f", CRD)
        self.c.kubectl("wait", "--for=condition=Established", "crd/editjobs.edit.io", "--timeout=30s")
        self.ns, self.name = unique("bench"), "el"
        self.c.create_namespace(self.ns)
        self.c.start_operator([self.ns])
        data = os.path.join(self.c.tmp, "data")
        os.makedirs(data)
        make_data(data)
        m = job_manifest(self.name, self.ns, data, os.path.join(self.c.tmp, "ckpt"), free_port(),
                           steps=a.steps, every=100000, replicas=2, shards=1)
        # The tiny preset at its own size (examples/local/tiny.yaml), logging every step.
        m["spec"]["model"] = {"preset": "tiny"}
        m["spec"]["data"].update({"seqLen": 128, "batchSize": 8})
        m["spec"]["algorithm"].update({"warmupSteps": 30, "syncInterval": 16})
        self.c.apply(m)

    def status(self):
        return self.c.job(self.ns, self.name).get("status", {})

    def tps_window(self):
        samples, end = [], time.monotonic() + self.a.window
        while time.monotonic() < end:
            v = (self.status().get("progress") or {}).get("tokensPerSecond")
            if v:
                samples.append(v)
            time.sleep(0.5)
        return statistics.median(samples) if samples else 0.0

    def first_row_time(self, rank, after):
        """Monotonic time at which a pod log of `rank` created after `after` shows a step."""
        def fn():
            for f in glob.glob(os.path.join(self.c.tmp, "kubelet", "pods", "%s_%s-worker-%d_*" % (self.ns, self.name, rank),
                                            "worker.log")):
                if os.path.getmtime(f) < after:
                    continue
                with open(f, errors="replace") as fh:
                    if any(line.startswith(PROGRESS) for line in fh):
                        return time.monotonic()
            return None
        return self.c.wait_for(fn, 180, "rank %d's first step" % rank, interval=0.05)

    def scale(self, m, frm):
        wall = time.time()
        self.c.kubectl("scale", "ej/" + self.name, "-n", self.ns, "--replicas=%d" % m)
        t0 = time.monotonic()
        if m > frm:
            t_new = self.first_row_time(m - 1, wall) - t0
        else:
            def gone():
                ps = [p for p in self.c.pods(self.ns, self.name) if p["metadata"]["name"].endswith("-worker-%d" % (frm - 1))]
                return True if not ps or ps[0].get("status", {}).get("phase") == "Succeeded" else None
            self.c.wait_for(gone, 180, "the leaver's exit", interval=0.05)
            t_new = time.monotonic() - t0

        def done():
            last = self.status().get("lastScale") or {}
            return last if (last.get("from"), last.get("to")) == (frm, m) else None
        last = self.c.wait_for(done, 180, "lastScale %d -> %d" % (frm, m))
        if last["result"] != "Succeeded":
            raise SystemExit("scale %d -> %d: %s" % (frm, m, last))
        return t_new, last["seconds"]

    def run(self):
        self.c.wait_phase(self.ns, self.name, "Running", 120)
        self.c.wait_step(self.ns, self.name, 40, 180)  # past the synchronous warm-up
        res = {"tps_2": self.tps_window()}
        res["up_to_first_step"], res["up_operator"] = self.scale(3, 2)
        res["tps_3"] = self.tps_window()
        res["down_to_exit"], res["down_operator"] = self.scale(2, 3)
        res["tps_2_again"] = self.tps_window()
        st = self.c.wait_phase(self.ns, self.name, ("Succeeded", "Failed"), 600)["status"]
        res.update(phase=st["phase"], restarts=st.get("restarts", 0), recoveries=st.get("replicaRecoveries", 0))
        return res


def main(argv):
    a = parse(argv)
    if not find_kubectl() or not os.access(OPERATOR, os.X_OK):
        raise SystemExit("needs kubectl and a built edit-operator (EDIT_BUILD_DIR=%s)" % BUILD)
    out = a.out or os.path.join(ROOT, "bench", "results", datetime.date.today().isoformat())
    os.makedirs(out, exist_ok=True)
    b = Bench(a)
    try:
        res = b.run()
    finally:
        b.c.close()
    with open(os.path.join(out, "elastic-k8s.json"), "w") as f:
        json.dump(dict(res, args=vars(a)), f, indent=1)
    L = ["# Elastic replicas through the operator: kubectl scale 2 -> 3 -> 2 (%s)" % datetime.datetime.now().strftime("%Y-%m-%d %H:%M"), "",
         "`python3 bench/elastic_k8s.py`: the API stand-in with real kubectl, edit-operator and edit-train "
         "workers (local processes), tiny preset (seqLen 128, batch 8, tau 16), 2 x 1 workers, %d steps. "
         "Job tokens/s: the operator's status.progress.tokensPerSecond, median over %.0f s. Shared 2-core machine; "
         "the stand-in starts pods at once (no image pull, no scheduler)." % (a.steps, a.window), "",
         "| | seconds |", "|---|---:|",
         "| scale-up: `kubectl scale` returned -> the new replica's first step | %.1f |" % res["up_to_first_step"],
         "| scale-up: the operator's lastScale.seconds (change seen -> rank 0 in the larger world) | %.0f |" % res["up_operator"],
         "| scale-down: `kubectl scale` returned -> the leaver exited | %.1f |" % res["down_to_exit"],
         "| scale-down: the operator's lastScale.seconds | %.0f |" % res["down_operator"], "",
         "| job tokens/s | 2 replicas | 3 replicas | 2 again |", "|---|---:|---:|---:|",
         "| status.progress.tokensPerSecond | %s | %s | %s |" % tuple("{:,.0f}".format(res[k]) for k in ("tps_2", "tps_3", "tps_2_again")), "",
         "The job ended %s with %d gang restarts and %d in-place recoveries." % (res["phase"], res["restarts"], res["recoveries"]), ""]
    with open(os.path.join(out, "elastic-k8s.md"), "w") as f:
        f.write("\n".join(L))
    print("\n".join(L))


if __name__ == "__main__":
    main(sys.argv[1:])
