"""The benchmark report: results.md (tables, the sweep's targets as measured) and the gnuplot PNGs."""

import os
import shutil

from common import (LAYOUTS, MODES, SCENARIOS, TINY, blas_env, fmt, log, loss_at, param_count, run_cmd,
                    unit_sizes)


# ----------------------------------------------------------------------------- report

def ratio(a, b):
    return a / b if a is not None and b else None


def write_report(out, args, cfg_common, results, gemm, links, skipped, started, finished):
    fpt = cfg_common["flops_per_token"]
    lines = []
    A = lines.append
    A(f"# EDiT benchmark results — {started:%Y-%m-%d %H:%M}")
    A("")
    A(f"`bench/run.sh {' '.join(args.argv)}`".replace(" `", "`"))
    A("")
    A(f"Machine: {os.cpu_count()} cores ({cpu_model()}), shared with other work; "
      f"load average at start {cfg_common['load_start']}, at end {os.getloadavg()[0]:.1f}. "
      f"Sweep took {(finished - started).total_seconds() / 60:.1f} min.")
    A("")
    A(f"Setup: `tiny` preset ({param_count(TINY):,} parameters), Brown corpus bytes, 4 workers, "
      f"batch {cfg_common['batch']} x seq {cfg_common['seq']} = {cfg_common['tokens_per_step']} "
      f"tokens per worker per step, {cfg_common['steps']} steps ({cfg_common['steps']} replica-steps "
      f"per replica for a-edit's budget), warm-up {cfg_common['warmup']} steps, "
      f"tau = {cfg_common['tau']}, straggler delay {fmt(cfg_common.get('delay'), 3)} s "
      f"(4x1) / {fmt(cfg_common.get('delay_2x2'), 3)} s (2x2) = the layout's step time (the fastest "
      f"median step time of its normal ddp/localsgd/diloco/edit runs), a-edit syncSeconds = tau x that step time. Model FLOPs per token "
      f"{fpt / 1e6:.2f} M (runtime/src/model/model.cpp flopsPerToken).")
    A("")
    A("Columns: **tok/s** = job tokens / the slowest worker's run time (setup and final "
      "evaluation included); **steady** = tokens/s after the warm-up (from time-stamped progress "
      "lines; the targets use this); **x ddp** = ratio to ddp in the same scenario and layout; "
      "**B/tok shard, sync** = bytes sent per rank per token in the shard group and the sync "
      "group (ring volumes); **blocked** = time the training thread waited on collectives / run "
      "time; **syncs** = synchronization rounds; **steps/sync** = local steps per sync per "
      "replica; **val loss** = final validation loss of the (synchronized) model at equal tokens; "
      "**loss@T** = training loss (mean over replicas of the last 5 steps) at the wall time T the "
      "fastest mode of that scenario finished; **RSS** = peak RSS of the largest worker; "
      "**MFU** = model FLOP/s (steady) / the machine's GEMM rate at the model's shapes.")
    A("")
    mrate = gemm["machine_model_gflops"] if gemm else None
    for layout in [l for l in LAYOUTS if any(k[0] == l for k in results)]:
        M, N = LAYOUTS[layout]
        A(f"## Layout {layout}: M = {M} replicas x N = {N} shards")
        A("")
        A("| scenario | mode | tok/s | x ddp | steady | x ddp | wall s | B/tok shard | B/tok sync "
          "| blocked | syncs | steps/sync | val loss | vs ddp | loss@T | RSS MB | MFU |")
        A("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|")
        for scen in SCENARIOS:
            rows = {m: results.get((layout, scen, m)) for m in MODES}
            if not any(rows.values()):
                continue
            d = rows.get("ddp") or {}
            ok = [r for r in rows.values() if r and r.get("ok") and r.get("t_last")]
            T = min(r["t_last"] for r in ok) if ok else None
            for m in MODES:
                r = rows.get(m)
                if not r:
                    continue
                if not r.get("ok"):
                    A(f"| {scen} | {m} | failed (exit codes {r.get('rc')}) |" + " |" * 15)
                    continue
                lsp = r.get("local_steps_per_sync")
                lsp_s = "–" if not lsp else (fmt(lsp[0], 1) if max(lsp) - min(lsp) < 0.05
                                             else " / ".join(fmt(x, 1) for x in lsp))
                vd = ratio(r.get("val_loss"), d.get("val_loss") if d.get("ok") else None)
                A(f"| {scen} | {m} | {fmt(r['tps'], 0)} | {fmt(ratio(r['tps'], d.get('tps')))} "
                  f"| {fmt(r.get('tps_steady'), 0)} | {fmt(ratio(r.get('tps_steady'), d.get('tps_steady')))} "
                  f"| {fmt(r['wall_s'], 1)} | {fmt(r['bytes_per_token']['shard'], 0)} "
                  f"| {fmt(r['bytes_per_token']['sync'], 0)} | {fmt(100 * r['blocked_frac'], 1)}% "
                  f"| {r['syncs']} | {lsp_s} | {fmt(r.get('val_loss'), 4)} "
                  f"| {fmt(100 * (vd - 1), 1) + '%' if vd else '–'} "
                  f"| {fmt(loss_at(r['series'], T), 3) if T else '–'} | {fmt(r['peak_rss_mb'], 0)} "
                  f"| {fmt(100 * r['gflops_steady'] / mrate, 1) + '%' if mrate and r.get('gflops_steady') else '–'} |")
        A("")
    # Extras: prefetch and offload.
    A("## Prefetch: how much of the layer-wise sync time it hides (edit)")
    A("")
    A("Blocked sync wait = the training thread's wait on the layer-wise sync (op `sync`), mean "
      "over ranks, whole run. Hidden = 1 - wait(prefetch on) / wait(prefetch off).")
    A("")
    A("| layout | scenario | syncs | sync wait, prefetch on (s) | off (s) | hidden | tok/s on | tok/s off |")
    A("|---|---|---:|---:|---:|---:|---:|---:|")
    prefetch = {}
    for (layout, scen, m), r in sorted(results.items()):
        if m != "edit+noprefetch":
            continue
        on = results.get((layout, scen, "edit"))
        if not (r.get("ok") and on and on.get("ok")):
            continue
        hidden = 1 - on["sync_wait_s"] / r["sync_wait_s"] if r["sync_wait_s"] > 0 else None
        prefetch[(layout, scen)] = hidden
        A(f"| {layout} | {scen} | {on['syncs']} | {fmt(on['sync_wait_s'], 3)} | {fmt(r['sync_wait_s'], 3)} "
          f"| {fmt(100 * hidden, 0) + '%' if hidden is not None else '–'} | {fmt(on['tps'], 0)} | {fmt(r['tps'], 0)} |")
    A("")
    # Across 100 Mbit/s a round outlasts a step: prefetch (layer-wise, within the sync step)
    # cannot hide it, an overlapped round (algorithm.overlapSteps = d) runs behind d steps.
    overlaps = sorted(k for k in results if k[1] == "link100" and k[2].startswith("edit+overlap"))
    if overlaps:
        A("## Overlapped rounds across 100 Mbit/s (edit, algorithm.overlapSteps = d)")
        A("")
        A("Sync wait as above (an overlapped round's remaining exchange is waited for under the same "
          "op); hidden = 1 - wait(variant) / wait(prefetch off); val loss vs plain edit (d = 0) at "
          "equal tokens, since d > 0 applies each outer step d local steps late.")
        A("")
        A("| layout | variant | syncs | sync wait (s) | hidden | steady tok/s | x edit | val loss | vs edit |")
        A("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for layout, scen, m in overlaps:
        r, base = results[(layout, scen, m)], results.get((layout, scen, "edit"))
        off = results.get((layout, scen, "edit+noprefetch"))
        if not (r.get("ok") and base and base.get("ok")):
            continue
        hidden = None
        if off and off.get("ok") and off["sync_wait_s"] > 0:
            hidden = 1 - r["sync_wait_s"] / off["sync_wait_s"]
            prefetch[(layout, scen, m)] = hidden
        loss_diff = r["val_loss"] / base["val_loss"] - 1 if r.get("val_loss") and base.get("val_loss") else None
        A(f"| {layout} | {m} | {r['syncs']} | {fmt(r['sync_wait_s'], 3)} "
          f"| {fmt(100 * hidden, 0) + '%' if hidden is not None else '–'} | {fmt(r.get('tps_steady'), 0)} "
          f"| {fmt(ratio(r.get('tps_steady'), base.get('tps_steady')))} | {fmt(r.get('val_loss'), 4)} "
          f"| {fmt(100 * loss_diff, 2) + '%' if loss_diff is not None else '–'} |")
    if overlaps:
        A("")
    A("## Memory: the outer state")
    A("")
    A("Analytic extra memory of EDiT's outer state (outer weights + outer momentum, fp32, per "
      "worker) = 2 x params/N x 4 bytes (docs/memory.md); measured = peak RSS of edit minus that of ddp (normal "
      "scenario, largest worker). `offloadOuterState` is a no-op in the CPU build (the state is "
      "already in host memory; docs/design-decisions.md), so on/off cannot differ here (`--offload-run` "
      "adds a run with it on to show that).")
    A("")
    A("| layout | analytic extra (MB) | RSS ddp (MB) | RSS edit (MB) | measured extra (MB) | RSS edit, offload on (MB) |")
    A("|---|---:|---:|---:|---:|---:|")
    for layout, (M, N) in LAYOUTS.items():
        d = results.get((layout, "normal", "ddp"))
        e = results.get((layout, "normal", "edit"))
        o = results.get((layout, "normal", "edit+offload"))
        if not (d and e and d.get("ok") and e.get("ok")):
            continue
        analytic = 2 * sum(unit_sizes(TINY, N)) / N * 4 / 2**20
        A(f"| {layout} | {analytic:.2f} | {fmt(d['peak_rss_mb'], 1)} | {fmt(e['peak_rss_mb'], 1)} "
          f"| {fmt(e['peak_rss_mb'] - d['peak_rss_mb'], 1)} | {fmt(o['peak_rss_mb'], 1) if o and o.get('ok') else '–'} |")
    A("")
    A("## GEMM rate (edit-gemm-bench, LibTorch CPU matmul)")
    A("")
    if gemm:
        A(f"| threads | model shapes, FLOP-weighted (GFLOP/s) | {cfg_common['gemm_square']}^3 (GFLOP/s) |")
        A("|---:|---:|---:|")
        for t in (1, 2):
            A(f"| {t} | {fmt(gemm.get(f'model_{t}t'), 2)} | {fmt(gemm.get(f'square_{t}t'), 2)} |")
        A("")
        A(f"Machine rate used for MFU: {gemm['machine_model_gflops']:.2f} GFLOP/s at the model's "
          f"shapes (max of the 2-thread rate and 2 x the 1-thread rate; the workers run one "
          f"thread each); {gemm['machine_square_gflops']:.2f} GFLOP/s at {cfg_common['gemm_square']}^3. Per-shape "
          "rates are in results.json.")
    else:
        A("GEMM benchmark not run.")
    A("")
    A("## OpenBLAS kernels")
    A("")
    A(f"Workers ran with OPENBLAS_CORETYPE={args.coretype or '(unset)'} and "
      f"OPENBLAS_NUM_THREADS={blas_env(args, 4).get('OPENBLAS_NUM_THREADS', '(unset)')} (the GEMM "
      "benchmark with the same core type and openblas_set_num_threads = its thread count). "
      "Two problems of the runtime as `edit-run` and the operator start it today: OpenBLAS 0.3.21 "
      "(Debian) does not know this CPU's model and its own detection picks the SSE3 `Prescott` "
      "kernels (`OPENBLAS_VERBOSE=2` prints `Core: Prescott`); and `at::set_num_threads(1)` does "
      "not size OpenBLAS's pthread pool, so each worker keeps one BLAS thread per core that spins "
      "in `sched_yield` (perf: ~35% of all samples in those threads and the scheduler with 4 "
      "workers on 2 cores). `ddp+defaultblas` below is ddp with neither fix.")
    A("")
    if gemm and gemm.get("default_detection_model_1t"):
        A(f"- GEMM at the model's shapes, 1 thread: {gemm['default_detection_model_1t']:.2f} GFLOP/s "
          f"with OpenBLAS's detection and pool vs {gemm.get('model_1t', 0):.2f} with {args.coretype}.")
    for layout in LAYOUTS:
        d = results.get((layout, "normal", "ddp"))
        b = results.get((layout, "normal", "ddp+defaultblas"))
        if d and b and d.get("ok") and b.get("ok"):
            A(f"- [{layout}] ddp, normal: steady {fmt(b.get('tps_steady'), 0)} tok/s with OpenBLAS's "
              f"detection and pool vs {fmt(d.get('tps_steady'), 0)} with both fixes "
              f"({fmt(ratio(d.get('tps_steady'), b.get('tps_steady')))}x).")
    A("")
    if links:
        A("## Links")
        A("")
        for k, v in links.items():
            A(f"- {k}: measured TCP throughput between two replica namespaces {fmt(v, 1)} Mbit/s")
        A("")
    if skipped:
        A("## Skipped")
        A("")
        for s in skipped:
            A(f"- {s}")
        A("")
    A("## Targets, as measured")
    A("")
    for t in targets(results, gemm, prefetch):
        A(f"- {t}")
    A("")
    A("Plots: `loss_tokens_<layout>.png` (training loss vs job tokens), `loss_time_<layout>.png` "
      "(training loss vs wall time), `tps_<layout>.png` (steady tokens/s per scenario and mode).")
    A("")
    path = os.path.join(out, "results.md")
    with open(path, "w") as f:
        f.write("\n".join(lines))
    return path


def targets(results, gemm, prefetch):
    out = []

    def get(l, s, m, k="tps_steady"):
        r = results.get((l, s, m))
        return r.get(k) if r and r.get("ok") else None

    for l in LAYOUTS:
        if not any(k[0] == l for k in results):
            continue
        a_n, a_s = get(l, "normal", "a-edit"), get(l, "straggler", "a-edit")
        d_n, d_s = get(l, "normal", "ddp"), get(l, "straggler", "ddp")
        if a_n and a_s and d_n and d_s:
            v = a_s / a_n
            out.append(f"[{l}] A-EDiT keeps {100 * v:.0f}% of its normal steady tokens/s with the "
                       f"consistent straggler (target >= 90%: {'met' if v >= 0.9 else f'missed by {100 * (0.9 - v):.0f} points'}); "
                       f"ddp keeps {100 * d_s / d_n:.0f}% (expected ~60%).")
        e, d = get(l, "link100", "edit"), get(l, "link100", "ddp")
        if e and d:
            v = e / d
            out.append(f"[{l}] edit / ddp steady tokens/s across 100 Mbit/s = {v:.2f}x "
                       f"(target >= 3x: {'met' if v >= 3 else f'missed, {v / 3 * 100:.0f}% of it'}); "
                       f"at 20 Mbit/s {fmt(ratio(get(l, 'link20', 'edit'), get(l, 'link20', 'ddp')))}x.")
        ev, dv = get(l, "normal", "edit", "val_loss"), get(l, "normal", "ddp", "val_loss")
        lv, gv = get(l, "normal", "localsgd", "val_loss"), get(l, "normal", "diloco", "val_loss")
        if ev and dv:
            rel = ev / dv - 1
            better = [n for n, v in (("diloco", gv), ("localsgd", lv)) if v is not None and ev < v]
            worse = [n for n, v in (("diloco", gv), ("localsgd", lv)) if v is not None and ev >= v]
            out.append(f"[{l}] edit validation loss {ev:.4f} vs ddp {dv:.4f}: {100 * rel:+.1f}% "
                       f"(target within 2%: {'met' if abs(rel) <= 0.02 else 'missed'}); "
                       f"better than {', '.join(better) or 'neither'}"
                       f"{'; not better than ' + ', '.join(worse) if worse else ''} "
                       f"(diloco {fmt(gv, 4)}, localsgd {fmt(lv, 4)}).")
        for s in ("normal", "link100"):
            h = prefetch.get((l, s))
            if h is not None:
                out.append(f"[{l}, {s}] prefetch hides {100 * h:.0f}% of the blocked layer-wise sync time "
                           f"(target >= 50%: {'met' if h >= 0.5 else 'missed'}).")
        for (pl, ps, *variant), h in sorted(prefetch.items()):
            if pl == l and variant and h is not None:
                lv, bv = get(l, ps, variant[0], "val_loss"), get(l, ps, "edit", "val_loss")
                cost = f", validation loss {100 * (lv / bv - 1):+.2f}% vs d = 0" if lv and bv else ""
                out.append(f"[{l}, {ps}] {variant[0]} hides {100 * h:.0f}% of the sync wait "
                           f"(target >= 50%: {'met' if h >= 0.5 else 'missed'}{cost}).")
        g = get(l, "normal", "ddp", "gflops_steady")
        if g and gemm:
            v = g / gemm["machine_model_gflops"]
            out.append(f"[{l}] ddp reaches {100 * v:.0f}% of the machine's GEMM rate at the model's shapes "
                       f"({g:.2f} of {gemm['machine_model_gflops']:.2f} GFLOP/s; target >= 75%: "
                       f"{'met' if v >= 0.75 else f'missed by {100 * (0.75 - v):.0f} points'}).")
    return out


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


# ----------------------------------------------------------------------------- plots

def write_plots(out, results):
    if shutil.which("gnuplot") is None:
        log("gnuplot not found: plots skipped (apt-get install gnuplot-nox)")
        return []
    data = os.path.join(out, "data")
    os.makedirs(data, exist_ok=True)
    made = []
    for layout in LAYOUTS:
        scens = [s for s in SCENARIOS if any(results.get((layout, s, m), {}).get("ok") for m in MODES)]
        if not scens:
            continue
        for s in scens:
            for m in MODES:
                r = results.get((layout, s, m))
                if r and r.get("ok"):
                    with open(os.path.join(data, f"{layout}_{s}_{m}.dat"), "w") as f:
                        f.write("# seconds job_tokens train_loss\n")
                        for t, tok, loss in r["series"]:
                            f.write(f"{t:.3f} {tok} {loss:.5f}\n")
        with open(os.path.join(data, f"tps_{layout}.dat"), "w") as f:
            f.write("scenario " + " ".join(MODES) + "\n")
            for s in scens:
                vals = []
                for m in MODES:
                    r = results.get((layout, s, m))
                    v = r.get("tps_steady") if r and r.get("ok") else None
                    vals.append(f"{v:.1f}" if v else "0")
                f.write(f"{s} " + " ".join(vals) + "\n")
        cols = min(3, len(scens))
        rows = (len(scens) + cols - 1) // cols
        modes = " ".join(MODES)
        gp = [f"set terminal pngcairo size {420 * cols},{340 * rows} font 'sans,9'" if has_cairo()
              else f"set terminal png size {420 * cols},{340 * rows}",
              f"modes = '{modes}'"]
        for kind, col, xl in (("tokens", 2, "job tokens"), ("time", 1, "wall time (s)")):
            gp += [f"set output '{out}/loss_{kind}_{layout}.png'",
                   f"set multiplot layout {rows},{cols} title 'training loss vs {xl}, layout {layout}'",
                   f"set xlabel '{xl}'", "set ylabel 'train loss (mean of replicas, last 5 steps)'",
                   "set key top right", "set grid"]
            for s in scens:
                files = [m for m in MODES if os.path.exists(os.path.join(data, f"{layout}_{s}_{m}.dat"))]
                plots = ", ".join(f"'{data}/{layout}_{s}_{m}.dat' using {col}:3 with lines lw 1.5 title '{m}'"
                                  for m in files)
                gp += [f"set title '{s}'", f"plot {plots}"]
            gp += ["unset multiplot"]
        gp += ["set terminal png size 900,420" if not has_cairo()
               else "set terminal pngcairo size 900,420 font 'sans,9'", f"set output '{out}/tps_{layout}.png'",
               f"set title 'steady tokens/s (after warm-up), layout {layout}'",
               "set style data histogram", "set style histogram cluster gap 1",
               "set style fill solid 0.8 border -1", "set ylabel 'tokens/s'", "set xlabel ''",
               "set key top right", "set grid ytics", "set yrange [0:*]",
               f"plot for [i=2:{len(MODES) + 1}] '{data}/tps_{layout}.dat' using i:xtic(1) title columnheader(i)"]
        script = os.path.join(data, f"plots_{layout}.gp")
        with open(script, "w") as f:
            f.write("\n".join(gp) + "\n")
        r = run_cmd(["gnuplot", script], check=False)
        if r.returncode != 0:
            log(f"gnuplot failed: {r.stderr.strip()[:500]}")
        made += [f"loss_tokens_{layout}.png", f"loss_time_{layout}.png", f"tps_{layout}.png"]
    return made


_CAIRO = None


def has_cairo():
    global _CAIRO
    if _CAIRO is None:
        r = run_cmd(["gnuplot", "-e", "set terminal"], check=False)
        _CAIRO = "pngcairo" in (r.stdout + r.stderr)
    return _CAIRO

