"""The soak's analysis and report (bench/soak.py runs the jobs and injects the faults):
per-fault outcome and time to the next kept step, goodput, the step-vs-time plot and
soak.md / soak.json. Reads only what a soak.Job recorded.
"""
import datetime
import json
import os
import shutil
import statistics
import subprocess
import time

# The fault kinds soak.py injects; the first three hit a worker.
KINDS = ["kill", "stop", "delete", "operator", "standin"]
WORKER_FAULTS = ("kill", "stop", "delete")


def log(msg):
    print("[soak %s] %s" % (time.strftime("%H:%M:%S"), msg), flush=True)


def analyse(job, base):
    """Per-fault outcome, time to the next kept step after the interruption, steps redone;
    goodput."""
    kept = sorted((t, s) for s, t in job.kept_times().items())
    resumes = job.resumes()
    faults = job.faults
    bounds = [f["t"] for f in faults] + [job.t_end + 1]
    for i, f in enumerate(faults):
        lo, hi = bounds[i], bounds[i + 1]
        # The interruption a fault causes is the longest pause between two kept steps in
        # its window (processes may log a few steps before they notice, e.g. a SIGTERM is
        # acted on at the next sync, and those steps are kept); training is running again
        # at the kept step that ends it.
        window = [t for t, _ in kept if t < hi]
        prev = [t for t in window if t <= lo]
        after = [t for t in window if t > lo]
        f["next_kept_step_seconds"] = None
        if after:
            ts = prev[-1:] + after
            gaps = [(b - a, b) for a, b in zip(ts, ts[1:])] or [(after[0] - lo, after[0])]
            gap, end = max(gaps)
            f["next_kept_step_seconds"] = round(end - lo, 1)
            f["longest_pause_seconds"] = round(gap, 1)
        redone = [n for (t, rank, n) in resumes if lo <= t < hi]
        f["steps_redone"] = max(redone) if redone else 0
        before = f["status_before"]
        end_status = job.status.at(hi - 0.01)
        d_restarts = end_status.get("restarts", 0) - before.get("restarts", 0)
        d_rec = end_status.get("replicaRecoveries", 0) - before.get("replicaRecoveries", 0)
        text = [l for (t, uid, l) in job.logs.lines if lo <= t < hi]
        if d_restarts > 0:
            f["outcome"] = "gang restart"
        elif d_rec > 0 or any("recovered in place" in l for l in text):
            f["outcome"] = "in place"
        elif any("resumed from" in l for l in text):
            f["outcome"] = "processes restarted in their pods, resumed from a checkpoint"
        else:
            f["outcome"] = "no interruption"
            if after:  # no pause to end: training went on, and its next step is the answer
                f["next_kept_step_seconds"] = round(after[0] - lo, 1)
        # edit-train's last words when it exits 75 (the trainer's own "peer lost: ...;
        # recovering in place" / "...; exiting for a gang restart" lines come before).
        f["exits_75"] = sum(1 for l in text if "peer lost:" in l and "recovering in place" not in l
                            and "exiting for a gang restart" not in l)
        f["in_warmup"] = f["step"] < job.shape.warmup
        f.pop("status_before", None)
    res = job.result()
    res["faults"] = faults
    res["fault_counts"] = {k: sum(1 for f in faults if f["kind"] == k) for k in KINDS}
    res["in_place"] = sum(1 for f in faults if f["outcome"] == "in place")
    res["gang_restarts_after_faults"] = sum(1 for f in faults if f["outcome"] == "gang restart")
    worker = [f for f in faults if f["kind"] in WORKER_FAULTS and not f["in_warmup"]]
    res["worker_faults_in_place"] = "%d of %d" % (sum(1 for f in worker if f["outcome"] == "in place"), len(worker))
    res["steps_redone_total"] = sum(f["steps_redone"] for f in faults)
    if base and base.get("elapsed_seconds") and res["phase"] == "Succeeded":
        tps = base["tokens"] / base["elapsed_seconds"]
        res["undisturbed_tokens_per_second"] = round(tps, 1)
        res["goodput"] = round(res["tokens"] / (res["elapsed_seconds"] * tps), 4)
        if base.get("loop_seconds") and res.get("loop_seconds"):
            res["goodput_training_loop"] = round(base["loop_seconds"] / res["loop_seconds"], 4)
        if base.get("val_loss") and res.get("val_loss"):
            res["val_loss_undisturbed"] = base["val_loss"]
            res["val_loss_rel_diff"] = round((res["val_loss"] - base["val_loss"]) / base["val_loss"], 5)
    # The soak's own step rate outside the faults' windows: if it differs from the
    # undisturbed run's, the shared machine's load changed between the runs.
    res["steady_steps_per_second"] = steady_rate(job)
    return res


def steady_rate(job):
    """Median kept-step rate over 10-step windows that contain no fault and no resume."""
    kept = job.kept_times()
    marks = [f["t"] for f in job.faults] + [t for (t, _, _) in job.resumes()]
    rates = []
    steps = sorted(kept)
    for a in range(job.shape.warmup + job.shape.tau, len(steps), 10):
        b = a + 10
        if a not in kept or b not in kept or kept[b] <= kept[a]:
            continue
        if any(kept[a] - 5 <= m <= kept[b] + 5 for m in marks):
            continue
        rates.append(10 / (kept[b] - kept[a]))
    return round(statistics.median(rates), 3) if rates else None


# ---------------------------------------------------------------------------- report

def write_plot(out, layout, soak, base):
    """step vs time: every logged row (dots), the kept steps (line), the undisturbed run
    (dashed), a vertical line per fault labelled with its kind."""
    stem = os.path.join(out, "soak_%s" % layout)
    with open(stem + "_rows.dat", "w") as f:
        for r in sorted(soak.logs.rows, key=lambda r: r["t"]):
            f.write("%.2f %d %d\n" % (r["t"], r["step"], r["rank"]))
    with open(stem + "_kept.dat", "w") as f:
        for s, t in sorted(soak.kept_times().items()):
            f.write("%.2f %d\n" % (t, s))
    with open(stem + "_base.dat", "w") as f:
        for s, t in sorted(base.kept_times().items()):
            f.write("%.2f %d\n" % (t, s))
    colors = {"kill": "#d62728", "stop": "#ff7f0e", "delete": "#9467bd", "operator": "#2ca02c", "standin": "#1f77b4"}
    gp = ["set terminal pngcairo size 1400,650 font ',10'", "set output '%s.png'" % stem,
          "set title 'Soak %s: step vs time, one fault per ~minute (%d faults)'" % (layout, len(soak.faults)),
          "set xlabel 'seconds since kubectl apply'", "set ylabel 'step'", "set key left top", "set grid",
          "set yrange [0:%d]" % int(soak.steps * 1.08)]
    for i, f in enumerate(soak.faults):
        gp.append("set arrow from %.1f, graph 0 to %.1f, graph 1 nohead lc rgb '%s' lw 1.2 dt 2" % (
            f["t"], f["t"], colors[f["kind"]]))
        label = f["kind"] + (" r%d" % f["rank"] if "rank" in f else "")
        gp.append("set label '%s' at %.1f, graph %.2f rotate by 90 tc rgb '%s' font ',8'" % (
            label, f["t"] + 2, 0.62 + 0.1 * (i % 3), colors[f["kind"]]))
    gp.append("plot '%s_rows.dat' using 1:2 with points pt 7 ps 0.2 lc rgb '#bbbbbb' title 'logged steps (all ranks, incl. redone)', "
              "'%s_kept.dat' using 1:2 with lines lw 2 lc rgb 'black' title 'kept steps (soak)', "
              "'%s_base.dat' using 1:2 with lines lw 1.5 dt 3 lc rgb '#555555' title 'undisturbed run'" % (stem, stem, stem))
    with open(stem + ".gp", "w") as f:
        f.write("\n".join(gp) + "\n")
    if shutil.which("gnuplot"):
        r = subprocess.run(["gnuplot", stem + ".gp"], capture_output=True, text=True)
        if r.returncode != 0:
            log("gnuplot failed: %s" % r.stderr.strip()[:400])
    else:
        log("gnuplot not found: plot skipped")


def fmt(v, spec="%.1f"):
    return "-" if v is None else spec % v


def write_report(out, a, results):
    with open(os.path.join(out, "soak.json"), "w") as f:
        json.dump({"args": vars(a), "layouts": results}, f, indent=1, default=str)
    kinds = "" if a.kinds == KINDS else "Fault kinds drawn: %s only. " % ", ".join(a.kinds)
    L = ["# Soak: goodput under repeated failures (%s)" % datetime.datetime.now().isoformat(timespec="seconds"), "",
         "`python3 bench/soak.py %s` (seed %d): EDiTJob on the API stand-in with its kubelet and the "
         "edit-operator, a fault every ~%d s (+-%d%%) for %d s, drawn at random from: SIGKILL a worker, SIGSTOP a "
         "worker (hang), `kubectl delete pod` a worker, SIGKILL the operator (restarted 1-5 s later), "
         "SIGKILL the stand-in (API server and kubelet; restarted 1 s later, it adopts the running pods' processes). "
         "%s Model: %s. Machine: 2 cores shared with other sessions; load averages are listed: "
         "the goodput compares two runs made one after the other, so a change in the machine's load between them "
         "moves it (the steady step rates show by how much)." % (
             (str(a.duration) if not a.smoke else "--smoke") + (" --kinds " + ",".join(a.kinds) if a.kinds != KINDS else ""),
             a.seed, a.fault_every, int(a.jitter * 100), a.duration, kinds,
             "the `tiny` preset (d=128, 4 layers, seqLen 128, batch 8, tau 16, warm-up 30, checkpoint every 32 steps)"
             if a.model == "tiny" else "the fault suite's small job (dim 64, 2 layers, seqLen 32, batch 4, tau 4)"), ""]
    L += ["| layout | steps | phase | goodput | goodput (training loop) | faults | worker faults in place | gang restarts | "
          "steps redone | duplicate pods | val loss soak / undisturbed (diff) |",
          "|---|---|---|---|---|---|---|---|---|---|---|"]
    for lay, r in results.items():
        s = r["soak"]
        L.append("| %s | %d | %s | %s | %s | %d | %s | %d | %d | %d | %s / %s (%s) |" % (
            lay, s["steps"], s["phase"], fmt(s.get("goodput") and 100 * s["goodput"], "%.1f%%"),
            fmt(s.get("goodput_training_loop") and 100 * s["goodput_training_loop"], "%.1f%%"), len(s["faults"]),
            s["worker_faults_in_place"], s["restarts"], s["steps_redone_total"], len(s["duplicate_pod_problems"]),
            fmt(s.get("val_loss"), "%.4f"), fmt(s.get("val_loss_undisturbed"), "%.4f"),
            fmt(s.get("val_loss_rel_diff") and 100 * s["val_loss_rel_diff"], "%+.2f%%")))
    L += ["", "How to read it:", "",
          "- **goodput**: tokens of the steps kept in the final model / (elapsed x the undisturbed run's tokens/s); "
          "elapsed is `kubectl apply` to Succeeded in both runs, so it equals undisturbed time / soak time. "
          "**(training loop)**: the same from each run's first to its last logged step (pod start-up left out).",
          "- **fault -> training again**: from the fault to the kept step that ends the longest pause between two "
          "kept steps after it (a worker that gets SIGTERM trains until the next control exchange, and those steps "
          "count); after a fault that interrupted nothing, to the next kept step. **longest pause**: that pause. Both are read from time stamps taken every 0.25 s while tailing "
          "the worker logs.",
          "- **outcome**: from the job's status counters and the worker logs between this fault and the next: "
          "`in place` (replicaRecoveries rose, or a worker logged `recovered in place`), `gang restart` (restarts "
          "rose), `processes restarted in their pods` (they resumed from the newest checkpoint in the same pods), "
          "`no interruption`.",
          "- **steps redone**: per fault, the most steps any rank logged twice (its furthest step before the "
          "fault minus the step it resumed at). **exits 75**: workers that gave up waiting (gang restart).",
          "- **duplicate pods**: the fault suite's tracker (never more than M x N pods, never two live generations, "
          "no rank of a generation created twice unless the second is an EDIT_JOIN=1 replacement).", ""]
    for lay, r in results.items():
        s, b = r["soak"], r["undisturbed"]
        L += ["## %s" % lay, "",
              "![step vs time, %s](soak_%s.png)" % (lay, lay), "",
              "- undisturbed: %d steps in %.1f s (apply to Succeeded; training loop %.1f s), %s tokens/s, val loss %s; "
              "steady %s steps/s; load %s -> %s" % (
                  b["steps"], b["elapsed_seconds"], b["loop_seconds"], fmt(b["tokens"] / b["elapsed_seconds"], "%.0f"),
                  fmt(b.get("val_loss"), "%.4f"), fmt(b.get("steady_steps_per_second"), "%.3f"), b["load_start"], b["load_end"]),
              "- soak: %d steps in %.1f s (training loop %.1f s), %s; restarts %d, in-place recoveries %d (operator "
              "count), disruptions %d; steady %s steps/s outside the faults; load %s -> %s" % (
                  s["steps"], s["elapsed_seconds"], s["loop_seconds"], s["phase"], s["restarts"], s["replica_recoveries"],
                  s["disruptions"], fmt(s.get("steady_steps_per_second"), "%.3f"), s["load_start"], s["load_end"]),
              "- duplicate pods: %s" % ("none" if not s["duplicate_pod_problems"] else "; ".join(s["duplicate_pod_problems"][:5])),
              "", "| # | t s | step | fault | target | outcome | fault -> training again s | longest pause s | "
              "steps redone | exits 75 |",
              "|---|---|---|---|---|---|---|---|---|---|"]
        for i, f in enumerate(s["faults"]):
            L.append("| %d | %.0f | %d | %s | %s | %s | %s | %s | %d | %d |" % (
                i + 1, f["t"], f["step"], f["kind"], f.get("pod", "-"),
                f["outcome"] + (" (warm-up)" if f["in_warmup"] else ""), fmt(f["next_kept_step_seconds"]),
                fmt(f.get("longest_pause_seconds")), f["steps_redone"], f["exits_75"]))
        by_kind = {}
        for f in s["faults"]:
            if f["next_kept_step_seconds"] is not None:
                by_kind.setdefault(f["kind"], []).append(f["next_kept_step_seconds"])
        L += ["", "Median fault -> training again by kind: " + ", ".join(
            "%s %.1f s (%d)" % (k, statistics.median(v), len(v)) for k, v in sorted(by_kind.items())), ""]
    with open(os.path.join(out, "soak.md"), "w") as f:
        f.write("\n".join(L) + "\n")
